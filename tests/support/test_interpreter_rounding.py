"""tests/support/interpreter_rounding.py: in Triton's interpreter, a kernel's fp32 -> bf16 conversion (a cast, and a store
into a bf16 tensor) rounds to nearest even, bit for bit as torch (and the GPU) does. Without the patch conftest.py
installs, the interpreter truncates: every positive value below its fp32 value."""

import os

import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter's conversion")


@triton.jit
def _cast_and_store(X, Cast, Stored, N: tl.constexpr):
    offsets = tl.arange(0, N)
    x = tl.load(X + offsets)
    tl.store(Cast + offsets, x.to(tl.bfloat16).to(tl.float32))
    tl.store(Stored + offsets, x)  # Stored is bf16: the store converts


def test_fp32_to_bf16_rounds_to_nearest_even_as_torch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, generator=g) * torch.logspace(-30, 30, 1024)
    x[:6] = torch.tensor([float("inf"), -float("inf"), 0.0, -0.0, 1.00390625, 1.01171875])  # the last two are ties
    cast, stored = torch.empty(1024), torch.empty(1024, dtype=torch.bfloat16)
    _cast_and_store[(1,)](x, cast, stored, N=1024)
    expected = x.to(torch.bfloat16)
    assert torch.equal(stored.view(torch.int16), expected.view(torch.int16))
    assert torch.equal(cast, expected.float())
