"""ptxas's spills and registers of the Gluon forward's variants this session measures -- persistent grids for
unmasked calls, the output stored from registers (q's tile given back early) -- compiled for sm90a on a machine
without a GPU (tests/test_gpu_compile.py's compile_hopper, then Triton's bundled ptxas -v). Run from the repository
root: env -u TRITON_INTERPRET python benchmarks/2026-11-28-short-unmasked-forward/spills.py"""
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
rule = hf.runs_persistent
for name, sms, bias in [("D64 three consumers", 132, None), ("D128", 132, None),
                        ("D128 causal 2048 rows, two consumers", 132, None), ("D64 causal GQA 2", 132, None),
                        ("D128", 132, "[1,H,M,N] bf16")]:
    for persistent in (False, True):
        for by_tma in (True, False):
            if persistent and "causal" in name:
                continue
            hf.runs_persistent = (lambda *a, p=persistent: p and not a[0])
            hf._STORE_BY_TMA = by_tma
            compiled = t.compile_hopper(name, "forward", sms, bias)
            print("RESULT", name, bias, "persistent" if persistent else "-", "store by TMA" if by_tma else
                  "store from registers", ptxas(compiled), flush=True)
