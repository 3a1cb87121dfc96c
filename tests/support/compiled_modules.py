"""Small modules compiled with the ``fuse_attn`` backend, checked against the module run eagerly in the working
dtype and in fp64 (:func:`compile_and_compare`, the 2x rule of ``numerics.py``); where they run
(:func:`compiled_kernels_or_blockwise`, given the ``target`` fixture of tests/conftest.py); :class:`CausalTril`,
the textbook causal attention several test modules compile; and :func:`packed_position_ids`, the position ids of
packed documents that the Hugging Face models under test take."""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch

from fuse_attn.report import collect_reports

from tests.support.numerics import check_close

INTERPRETER_SESSION = os.environ.get("TRITON_INTERPRET") == "1"  # see conftest.py


class CausalTril(torch.nn.Module):
    """Causal attention as textbooks write it: the scores masked where ``torch.tril`` of ones is 0."""

    def forward(self, q, k, v):
        T = q.shape[-2]
        w = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        w = w.masked_fill(torch.tril(torch.ones(T, T, device=q.device)) == 0, float("-inf"))
        return torch.softmax(w, -1) @ v


def compile_and_compare(model, inputs, *, train: bool, dtype=torch.float32, device="cpu", expect_fused: int = 1):
    """Compile ``model`` with fuse_attn; compare outputs (and grads of params and float inputs) with eager/fp64."""
    torch._dynamo.reset()
    ref_model = copy.deepcopy(model).to(device, torch.float64)
    eager_model = copy.deepcopy(model).to(device, dtype)
    ours_model = copy.deepcopy(model).to(device, dtype)

    def prepared(cast):
        return [cast(x.to(device)).detach().requires_grad_(train and x.is_floating_point()) for x in inputs]

    ref_in = prepared(lambda x: x.double() if x.is_floating_point() else x)
    eager_in = prepared(lambda x: x.to(dtype) if x.is_floating_point() else x)
    ours_in = prepared(lambda x: x.to(dtype) if x.is_floating_point() else x)

    compiled = torch.compile(ours_model, backend="fuse_attn")
    with collect_reports() as reports, torch.set_grad_enabled(train):
        ours = compiled(*ours_in)
    fused = sum(len(r.fused) for r in reports)
    assert fused == expect_fused, "\n".join(v.line() for r in reports for v in r.verdicts)
    with torch.set_grad_enabled(train):
        ref, eager = ref_model(*ref_in), eager_model(*eager_in)
    check_close(ours, eager, ref, dtype, "output")
    if not train:
        return
    grad_out = torch.randn_like(ref)
    ref.backward(grad_out)
    eager.backward(grad_out.to(dtype))
    ours.backward(grad_out.to(dtype))
    pairs = [(o, e, r, f"grad of input {i}") for i, (o, e, r) in enumerate(zip(ours_in, eager_in, ref_in)) if r.requires_grad]
    pairs += [
        (o, e, r, f"grad of {name}")
        for (name, r), o, e in zip(ref_model.named_parameters(), ours_model.parameters(), eager_model.parameters())
    ]
    for o, e, r, what in pairs:
        o, e, r = (x.grad if isinstance(x, torch.Tensor) and x.grad is not None else x for x in (o, e, r))
        check_close(o, e, r.grad if r.grad is not None else r, dtype, what)


def compiled_kernels_or_blockwise(target) -> tuple[str, torch.dtype]:
    """``target`` without the Triton interpreter, for tests of what Dynamo, the rewrite and Inductor do, which is
    the same however the op runs on a CPU (the interpreted kernels at ten run-time lengths:
    tests/graph/test_dynamic.py's test_ten_lengths_one_compile; under the other forms: tests/e2e/test_backend.py)."""
    device, dtype = target
    if device == "cpu" and os.environ["TRITON_INTERPRET"] == "1":
        pytest.skip("tests the compile, not the kernels: the blockwise CPU path and the GPU cover it")
    return device, dtype


def packed_position_ids(documents, batch=1):
    """Position ids of documents packed into one row, as the padding-free collator gives them: restarting at 0 at each
    document (``documents`` holds their lengths), the row repeated ``batch`` times: [batch, sum(documents)]."""
    return torch.cat([torch.arange(n) for n in documents])[None].expand(batch, -1)
