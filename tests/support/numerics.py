"""The 2x rule every numerical test holds (from flash-attention's tests):
``max|ours - ref64| <= 2 * max|eager_same_dtype - ref64| + floor``, where ``ref64`` is the computation in fp64 and
``eager_same_dtype`` the naive reference (or the eager module) run in the input dtype.

:func:`assert_close_2x` is the op-level form (NaN positions must agree; the floor scales with the largest reference
value); :func:`check_close` the module-level form (outputs and gradients of a compiled module, an absolute floor).
"""

from __future__ import annotations

import os

import pytest
import torch

# A test of the compiled kernels on the GPU: skipped without one, or where Triton's interpreter was chosen
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="needs a GPU and TRITON_INTERPRET=0")
# The bf16 run of a numerics test on the GPU, beside its CPU runs (fp32 there would compare tf32 matmuls with fp32)
CUDA_BF16 = pytest.param("cuda", torch.bfloat16, marks=needs_cuda, id="cuda-bf16")

# Absolute floors of the 2x rule: about one unit in the last place of values of size ~1 in each dtype.
FLOOR = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def nan_safe_err(a, b):
    """max|a - b| over the positions that are not NaN (in fp64); the NaN positions must be the same."""
    a, b = a.double(), b.double()
    assert torch.equal(torch.isnan(a), torch.isnan(b)), "NaN positions differ"
    ok = ~torch.isnan(a)
    return (a[ok] - b[ok]).abs().max().item() if ok.any() else 0.0


def assert_close_2x(name, ours, ref64, eager, dtype):
    err = nan_safe_err(ours, ref64)
    err_eager = nan_safe_err(eager, ref64)
    known = ref64[~torch.isnan(ref64)]  # (empty where every value is NaN: a row of NaN reaches all of dk and dv)
    floor = FLOOR[dtype] * max(1.0, known.abs().max().item() if known.numel() else 1.0)
    assert err <= 2 * err_eager + floor, f"{name}: max|ours-ref|={err:.3g} > 2*{err_eager:.3g} + {floor:.3g}"


def max_error(a, b):
    return (a.double() - b.double()).abs().max().item()


def check_close(ours, eager, ref, dtype, what):
    allowed = 2 * max_error(eager, ref) + FLOOR[dtype]
    err = max_error(ours, ref)
    assert err <= allowed, f"{what}: error {err:.3g} > allowed {allowed:.3g} (eager's {max_error(eager, ref):.3g})"
