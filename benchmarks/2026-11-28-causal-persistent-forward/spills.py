"""ptxas's spills and registers of the causal Gluon forward, one block a CTA / paired / persistent (items of two
blocks, odd block counts included), compiled for sm90a on a machine without a GPU (tests/test_gpu_compile.py's
compile_hopper, then Triton's bundled ptxas -v). Run from the repository root:
env -u TRITON_INTERPRET python benchmarks/2026-11-28-causal-persistent-forward/spills.py"""
import glob
import os
import subprocess
import sys
import tempfile

import triton

sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "tests")]
import test_gpu_compile as t  # noqa: E402
from fuse_attn.kernels import hopper_forward as hf  # noqa: E402

PTXAS = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas-blackwell"))[0]


def ptxas(compiled) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(compiled.asm["ptx"])
    result = subprocess.run([PTXAS, "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull], capture_output=True, text=True)
    return " | ".join(line.strip() for line in result.stderr.splitlines() if "spill" in line or "registers" in line)


os.environ["TRITON_ALWAYS_COMPILE"] = "1"
for name, rows in [("D64 causal GQA 2", 384), ("D128 causal fp16", 384), ("D128 causal 2048 rows, two consumers", None)]:
    for launch, sms in (("one block a CTA", None), ("paired", 132), ("persistent", 1)):
        compiled = t.compile_hopper(name, "forward", sms, rows=rows)
        print("RESULT", name, launch, ptxas(compiled), flush=True)
