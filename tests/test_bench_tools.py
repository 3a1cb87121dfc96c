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
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))) for line in lines[2:]]


def test_bench_models_tiny_on_cpu_fuses_every_layer(tmp_path):
    # TRITON_INTERPRET=0: the fused op takes its plain-PyTorch CPU path (the interpreter would be far slower)
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, os.path.join(ROOT, "tools", "bench_models.py"), "--device", "cpu", "--tiny",
               "--models", "gpt2", "--modes", "infer", "--variants", "fuse_attn", "--out", str(tmp_path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = table_rows(done.stdout)
    assert len(rows) == 1, done.stdout
    row = rows[0]
    assert (row["model"], row["mode"]) == ("gpt2", "infer")
    assert int(row["fused"]) == int(row["layers"]) > 0, done.stdout
    assert float(row["fuse_attn tok/s"].replace(",", "")) > 0
    assert (tmp_path / "bench_models.csv").read_text().count("\n") == 2  # header and the one cell
