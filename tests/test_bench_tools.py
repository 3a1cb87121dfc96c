"""Smoke test of the model benchmark on a CPU (tools/bench_attention.py needs CUDA and has none)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def table_rows(stdout):
    """The github-format table's rows as dicts keyed by its header."""
    return tables(stdout)[0]


def tables(stdout):
    """Each github-format table's rows (consecutive lines starting with "|") as dicts keyed by its header."""
    blocks, previous = [], False
    for line in stdout.splitlines():
        if line.startswith("|"):
            if not previous:
                blocks.append([])
            blocks[-1].append(line)
        previous = line.startswith("|")

    def cells(line):
        return [cell.strip() for cell in line.strip("|").split("|")]

    return [[dict(zip(cells(b[0]), cells(line))) for line in b[2:]] for b in blocks]


def test_bench_models_tiny_on_cpu_fuses_every_layer(tmp_path):
    # TRITON_INTERPRET=0: the fused op takes its plain-PyTorch CPU path (the interpreter would be far slower)
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, os.path.join(ROOT, "tools", "bench_models.py"), "--device", "cpu", "--tiny",
               "--models", "gpt2", "bert-padded", "--modes", "infer", "--variants", "fuse_attn", "sdpa+fuse_attn",
               "--out", str(tmp_path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = table_rows(done.stdout)
    assert [(row["model"], row["mode"]) for row in rows] == [("gpt2", "infer"), ("bert-padded", "infer")], done.stdout
    for row in rows:  # bert-padded: its padding mask, built in the graph from the attention mask input, fused too
        assert int(row["fused"]) == int(row["sdpa fused"]) == int(row["layers"]) > 0, done.stdout
        assert float(row["fuse_attn tok/s"].replace(",", "")) > 0 and float(row["sdpa+fuse_attn tok/s"].replace(",", "")) > 0
    assert (tmp_path / "bench_models.csv").read_text().count("\n") == 5  # header and the four cells


def test_bench_decode_tiny_on_cpu(tmp_path):
    # The op part (our op and the SDPA backends a CPU runs) and generate with fuse_attn (every attention fused,
    # no graph compiled while timing); plain-PyTorch CPU path as above.
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, os.path.join(ROOT, "tools", "bench_decode.py"), "--device", "cpu", "--tiny",
               "--variants", "fuse_attn", "--out", str(tmp_path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    op_csv = (tmp_path / "bench_decode_op.csv").read_text().splitlines()
    assert op_csv[0].startswith("B,H,H_kv,D,N,kernel") and any(",fuse_attn,op dispatch," in line for line in op_csv)
    op, generate = tables(done.stdout)
    assert len(op) == 1 and float(op[0]["fuse_attn us"]) > 0, done.stdout
    assert len(generate) == 1, done.stdout
    row = generate[0]
    assert row["variant"] == "fuse_attn" and int(row["fused"]) > 0 and float(row["tok/s"]) > 0
    warmup, timed = (int(n) for n in row["graphs compiled (warm-up + timed)"].split("+"))
    assert warmup >= 1 and timed == 0, done.stdout
