"""Checks of the Gluon op (tests/hopper) shared by its families: :func:`gluon_compile_trains_as_eager`, its compiled
path where a CPU can run it (the implementation choice forced to it, the rewrite emits
``fuse_attn::flash_attention_hopper``, Inductor calls it as an opaque op, and on CPU tensors the op runs the generated
forward and its autograd the template's backward); :func:`gluon_op_matches_fp64`, the op on an sm90 GPU against
fp64."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.support.numerics import assert_close_2x

GRADIENT_NAMES = ("dq", "dk", "dv", "dbias")  # of the inputs in their order: q, k, v, then a score tensor


def gluon_compile_trains_as_eager(monkeypatch, attention, inputs, *constants, generator: torch.Generator) -> list:
    """Compile ``attention(*inputs, *constants)`` with the implementation choice forced to the Gluon op; one attention
    fused, run by that op; the output and the gradient of each input that requires one as eager's under the 2x rule
    (fp64 reference, fp32). ``constants``: inputs without a gradient (a padding mask, position ids); the output's
    gradient is drawn from ``generator``. Returns the verdicts."""
    from fuse_attn.kernels import dispatch
    from fuse_attn.report import collect_reports

    monkeypatch.setattr(dispatch, "choose_implementation",
                        lambda *args, **kwargs: dispatch.ImplementationChoice(dispatch.GLUON, "forced"))
    ref_in = [t.detach().double().requires_grad_(t.requires_grad) for t in inputs]
    eager_in = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    torch._dynamo.reset()
    with collect_reports() as reports:
        out = torch.compile(attention, backend="fuse_attn")(*inputs, *constants)
    verdicts = [v for r in reports for v in r.verdicts]
    assert [v.fused for v in verdicts] == [True] and verdicts[0].runs == "runs gluon: forced"
    rewritten = "".join(r.after or "" for r in reports)
    assert "fuse_attn.flash_attention_hopper.default" in rewritten and "flash_attention.default" not in rewritten
    ref, eager = attention(*ref_in, *constants), attention(*eager_in, *constants)
    assert_close_2x("out", out, ref, eager, torch.float32)
    dout = torch.randn(out.shape, generator=generator)
    wanted = [i for i, t in enumerate(inputs) if t.requires_grad]
    for i, a, b, c in zip(wanted, torch.autograd.grad(out, [inputs[i] for i in wanted], dout),
                          torch.autograd.grad(ref, [ref_in[i] for i in wanted], dout.double()),
                          torch.autograd.grad(eager, [eager_in[i] for i in wanted], dout)):
        assert_close_2x(GRADIENT_NAMES[i], a, b, c, torch.float32)
    return verdicts


def gluon_op_matches_fp64(spec, q, k, v, vectors=(), generator: torch.Generator = None,
                          dtype: torch.dtype = torch.bfloat16) -> None:
    """(On an sm90 GPU.) The op's out, lse and dq / dk / dv against fp64 and eager ``dtype`` under the 2x rule (NaN
    where eager's are), for ``spec`` and its score tensors ``vectors`` (floats cast to fp64 for the reference); the
    output's gradient drawn from ``generator``."""
    from fuse_attn.kernels import reference_attention
    from fuse_attn.kernels.hopper.forward import flash_attention_hopper

    leaves = lambda cast=None: [t.detach().to(cast or t.dtype).requires_grad_() for t in (q, k, v)]  # noqa: E731
    ours_in, ref_in, eager_in = leaves(), leaves(torch.float64), leaves()
    out, lse = flash_attention_hopper(*ours_in, spec, return_lse=True, vectors=vectors)
    ref, ref_lse = reference_attention(*ref_in, [t.double() if t.is_floating_point() else t for t in vectors], spec)
    eager, _ = reference_attention(*eager_in, vectors, spec)
    assert_close_2x("out", out, ref, eager, dtype)
    # the lse of a row that sees a key; a row a fill hid wholly has one at or below about the fill (-inf: -inf), its
    # log2-units value kept finite as the template keeps it
    seen = ref_lse > -1e30
    torch.testing.assert_close(lse[seen].double(), ref_lse[seen].double(), rtol=0, atol=1e-4)
    assert (lse[~seen] < -1e30).all()
    dout = torch.randn(out.shape, device="cuda", generator=generator, dtype=dtype)
    for name, a, b, c in zip(GRADIENT_NAMES, torch.autograd.grad(out, ours_in, dout),
                             torch.autograd.grad(ref, ref_in, dout.double()), torch.autograd.grad(eager, eager_in, dout)):
        assert_close_2x(name, a, b, c, dtype)


def gluon_op_matches_fp64_on_random_inputs(spec, vectors, batch: int, length: int, seed: int = 0,
                                           heads: int = 4) -> None:
    """:func:`gluon_op_matches_fp64` in bf16 on q, k and v ``[batch, heads, length, head_dim]`` drawn from ``seed``,
    laid out as a model's projections give them (``[batch, length, heads, head_dim]`` transposed)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, length, heads, spec.head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, length, heads // spec.gqa_group, spec.head_dim, device="cuda", generator=g,
                        dtype=torch.bfloat16) for _ in range(2))
    gluon_op_matches_fp64(spec, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), vectors, g)


def fake_qk(q_len=128, kv_len=128, dtype=torch.bfloat16, head_dim=128):
    """Fake CUDA q and k ``[2, 4, len, head_dim]``: what the Gluon kernels' gates (``hopper_reasons``) read."""
    with FakeTensorMode():
        return (torch.empty(2, 4, q_len, head_dim, dtype=dtype, device="cuda"),
                torch.empty(2, 4, kv_len, head_dim, dtype=dtype, device="cuda"))


# The tests that launch the Gluon kernels: they need an sm90 GPU (TMA, wgmma and setmaxnreg are Hopper's)
hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                            reason="needs an sm90 GPU (H100 / H200)")
