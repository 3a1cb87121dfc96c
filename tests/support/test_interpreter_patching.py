"""tests/support/interpreter_patching.py: with the interpreter's re-patching of triton.language skipped inside a launch (what
conftest.py installs), the kernels compute bit for bit what they compute without it -- output, lse and every
gradient of the op, on specs whose kernels call helpers from their inner loops (a score program with a bias, a
softcap and a mask, causal with GQA, dropout, bf16) -- and triton.language is left as it was after a launch."""

import os

import pytest
import torch
import triton.language as tl

from tests.support import interpreter_patching
from fuse_attn.kernels import flash_attention
from fuse_attn.spec import CausalMask
from tests.support.cases import make_case, seed_tensor

pytestmark = [pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter's patching"),
              pytest.mark.skipif(not interpreter_patching.supported(),
                                 reason="this Triton's interpreter is laid out otherwise: the skip is not installed")]

CASES = {
    "bias, softcap, mask, bf16": dict(M=19, N=23, dtype=torch.bfloat16, bias=(1, 2, 19, 23), softcap=5.0,
                                      mask=(1, 1, 19, 23)),
    "causal, GQA 2, dropout": dict(Z=2, H=4, M=21, N=21, gqa=2, causal=CausalMask(), dropout_p=0.25),
}


def run(case):
    q, k, v, tensors, spec = make_case(**case)
    inputs = [t.detach().requires_grad_() for t in (q, k, v)] + [t.detach().requires_grad_(t.requires_grad)
                                                                   for t in tensors]
    seed = seed_tensor(5) if spec.dropout_p else None
    out = flash_attention(*inputs[:3], spec, inputs[3:], dropout_seed=seed)
    wanted = [t for t in inputs if t.requires_grad]
    grads = torch.autograd.grad(out, wanted, torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
    return [out.detach(), *grads]


@pytest.mark.parametrize("case", list(CASES))
def test_kernels_compute_the_same_bits_without_the_repatching(case):
    from triton.runtime import interpreter

    assert getattr(interpreter._patch_lang, "skips_repatching", False), "conftest.py installs it"

    def language():
        return tl.range, tl.reduce, tl.core.reduce, getattr(tl.tensor, "__bool__", None)

    before = language()
    fast = run(CASES[case])
    assert language() == before  # restored after each launch
    interpreter_patching.undo()
    try:
        slow = run(CASES[case])
    finally:
        interpreter_patching.skip_repatching_inside_a_launch()
    assert len(fast) == len(slow) > 3
    bits = {torch.bfloat16: torch.int16, torch.float32: torch.int32}
    for a, b in zip(fast, slow):  # bit for bit (NaN included)
        assert a.dtype == b.dtype and torch.equal(a.view(bits[a.dtype]), b.view(bits[b.dtype]))
