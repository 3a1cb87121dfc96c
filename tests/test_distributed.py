"""examples/train_distributed.py under torchrun with 2 processes on the CPU (gloo): DDP with the GPT-2-shaped model
and FSDP2 with the LLaMA-shaped one (GQA), tiny, fp32, the kernels in the Triton interpreter. The example itself
checks that every attention was fused and that fuse_attn's losses stay within the 2x rule of eager's; its GPU run
(NCCL, bf16, step times) is recorded in BENCHMARKS.md."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("engine, model", [("ddp", "gpt2"), ("fsdp2", "llama")])
def test_train_distributed_on_two_cpu_processes(engine, model, tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", FUSE_ATTN_CACHE_DIR=str(tmp_path))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(ROOT / "examples" / "train_distributed.py"), "--device", "cpu", "--engine", engine, "--model", model,
               "--steps", "4"]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"{model}, {engine} on 2 cpu processes" in run.stdout
    assert "not fused: 0" in run.stdout and "FAILED" not in run.stdout, run.stdout
    assert "loss vs eager: fuse_attn" in run.stdout
