"""ptxas's spills of the Gluon backward with a [1, H, M, N] bf16 bias over 4096 rows, without and with the bias's
gradient (dS stores, at head dim 128: hopper_backward._DS_MIN_HEAD_DIM), compiled for sm90a on a machine without a GPU (tests/test_gpu_compile.py's compile_hopper, then
Triton's bundled ptxas -v). Run from the repository root: python benchmarks/2026-11-28-gluon-bias-gradient/spills.py"""
import glob
import os
import subprocess
import sys
import tempfile

import torch
import triton

sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "tests")]
import test_gpu_compile as t  # noqa: E402

PTXAS = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas-blackwell"))[0]


def spills(compiled) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(compiled.asm["ptx"])
    result = subprocess.run([PTXAS, "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull], capture_output=True, text=True)
    return " | ".join(line.strip() for line in result.stderr.splitlines() if "spill" in line)


t.HOPPER_CASES["D64"] = (64, False, 1, torch.bfloat16, 300)
for name, sms in [("D64", None), ("D64 causal GQA 2", None), ("D128", None), ("D128 causal 2048 rows, two consumers", 132)]:
    for grad in (False, True) if name.startswith("D128") else (False, ):  # (dS stores: _DS_MIN_HEAD_DIM)
        compiled = t.compile_hopper(name, "backward", sms, "[1,H,M,N] bf16", 4096, bias_grad=grad)
        print("RESULT", name, "dS stores" if grad else "no dS", spills(compiled), flush=True)
