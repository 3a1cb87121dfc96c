"""Distributed runs under torchrun with 2 processes on the CPU (gloo), the kernels in the Triton interpreter:
examples/train_distributed.py -- DDP with the GPT-2-shaped model, FSDP2 and tensor parallel with the LLaMA-shaped one
(GQA), tiny, fp32; the example checks that every attention was fused and that fuse_attn's losses stay within the 2x
rule of eager's -- tests/e2e/distributed_sharding.py, the fused op on DTensors sharded on heads or batch
(fuse_attn/kernels/sharding.py) and a tensor-parallel Hugging Face LLaMA compiled with the backend -- and
tests/e2e/distributed_context_parallel.py, the sequence sharded over the ranks (fuse_attn/context_parallel.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]


def torchrun(script: Path, *arguments: str, cache: Path, interpret: str = "1") -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET=interpret, FUSE_ATTN_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))  # tests.support, examples
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
               *arguments]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def run_outputs(run: subprocess.CompletedProcess, runs: list) -> list:
    """Each run's output of one torchrun of tests/e2e/distributed_examples.py over ``runs``, after checking that each
    ran under its header and exited 0."""
    sections = run.stdout.split("=== run ")[1:]
    assert len(sections) == 2 * len(runs), run.stdout
    for i, argument in enumerate(runs):
        assert sections[2 * i].partition("\n")[0] == f"{i}: {argument}", run.stdout
        assert sections[2 * i + 1].startswith(f"{i} exit 0"), run.stdout
    return sections[::2]


ENGINES = [("ddp", "gpt2"), ("fsdp2", "llama"), ("tp", "llama")]


def test_train_distributed_on_two_cpu_processes(tmp_path):
    """The three engines' runs of the example in one torchrun (tests/e2e/distributed_examples.py), each checked as its own
    torchrun's output was: every attention fused, the losses within the 2x rule of eager's."""
    runs = [f"train_distributed --device cpu --engine {engine} --model {model} --steps 4"
            + (" --profile" if engine == "fsdp2" else "") for engine, model in ENGINES]
    run = torchrun(ROOT / "tests" / "e2e" / "distributed_examples.py", *runs, cache=tmp_path)
    for (engine, model), out in zip(ENGINES, run_outputs(run, runs)):
        assert f"{model}, {engine} on 2 cpu processes" in out, out
        assert "not fused: 0" in out and "FAILED" not in out, out
        assert "loss vs eager: fuse_attn" in out, out
        if engine == "fsdp2":  # --profile; the causal mask reaches each block's graph as an input: its tiles classified
            assert "profile of fuse_attn" in out and "profile of sdpa+torch.compile" in out, out
            assert "s + bias0[Z,1,M,N]" in out and "tiles classified per call (bias0)" in out, out


def test_fused_op_on_dtensors_sharded_on_heads_or_batch(tmp_path):
    run = torchrun(ROOT / "tests" / "e2e" / "distributed_sharding.py", cache=tmp_path)
    lines = [line for line in run.stdout.splitlines() if " heads " in line]
    assert len(lines) == 8 and not any("FAILED" in line for line in lines), run.stdout
    assert "tensor parallel llama (heads over 2 ranks), compiled: fused 2 of 2 attentions" in run.stdout, run.stdout
    assert "softmax on DTensors, compiled: " in run.stdout, run.stdout
    assert "FAILED" not in run.stdout, run.stdout


def test_context_parallel_and_its_example_on_two_cpu_processes(tmp_path):
    """tests/e2e/distributed_context_parallel.py's cases, then examples/train_context_parallel.py's training, in one
    torchrun (tests/e2e/distributed_examples.py), each run's output checked on its own."""
    # The ring's pairs each get their own spec (so their own kernels): the interpreter would compile a dozen kernels
    # per case; the op runs its blockwise path here (the lse gradient of every path: test_kernels.py).
    runs = ["tests.e2e.distributed_context_parallel", "train_context_parallel --device cpu --steps 3"]
    run = torchrun(ROOT / "tests" / "e2e" / "distributed_examples.py", *runs, cache=tmp_path, interpret="0")
    cases, example = run_outputs(run, runs)
    lines = [line for line in cases.splitlines() if line.startswith(("op ", "compiled ", "llama ", "uneven "))]
    assert len(lines) == 16 and not any("FAILED" in line for line in lines), cases
    assert "context parallel over 2 cpu processes" in example and "FAILED" not in example, example
    assert "attentions fused as rings: 2 of 2" in example and "loss distance" in example, example
