"""Compiling Triton kernels for an sm90 target on a machine without a GPU, in a process of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sm90():
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", 90, 32)


def compile_for_sm90() -> None:
    """(In a scenario's process.) Triton compiles for sm90 from now on: its driver replaced by the compile-only one."""
    from triton.runtime import driver

    from fuse_attn.kernels.compile_workers import CompileOnlyDriver

    driver.set_active(CompileOnlyDriver(sm90()))


def in_a_fresh_process(module: str, scenario: str, argument: str) -> None:
    """Run ``module.scenario(argument)`` in a new Python without ``TRITON_INTERPRET``: in a process that has run
    kernels in Triton's interpreter, Triton's compiler fails on the library functions the interpreter patched (seen:
    "'block_argument' object has no attribute 'dtype'")."""
    code = f"import {module} as m; m.{scenario}({argument!r})"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "0"},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-6000:]
