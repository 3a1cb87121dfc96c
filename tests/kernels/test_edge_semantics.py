"""Edge cases where the fused result must be eager's, element for element where eager is not finite.

What eager PyTorch does (checked on torch 2.11 and 2.13, CPU fp64/fp32):

* A row whose scores are all -inf (``masked_fill(~mask, -inf)`` with nothing kept, a causal band that shows a
  query no key): ``softmax`` gives NaN for the whole row, so that output row is NaN. Backward: the softmax's
  gradient of that row is NaN everywhere; ``masked_fill``'s backward zeroes it where the fill applied (so dq of
  the row and its share of dk are 0), while ``dV = P^T dO`` is NaN for *every* key of that head (NaN * anything).
  With an additive -inf bias instead of a fill, the NaN passes the addition: dq of the row, all of dk, and the
  bias gradient of the row are NaN too.
* A row masked with ``finfo.min`` (Hugging Face's additive masks) is finite: uniform weights over its keys.
* A NaN in q makes that query's row NaN (output and gradients) and, through dV = P^T dO and dK = dS^T q, all of
  its head's dk and dv; a NaN in k makes NaN every row that sees that key.
* Large logits: fp16 inputs whose scores are tens of thousands (finite in fp16), softmax in fp32 -- eager is
  finite; so are we.
* Zero-size dimensions: an empty batch or query length gives an empty output; zero keys give zeros (softmax over
  nothing times an empty v), and zero gradients.

Checked for the op (Triton kernels in the interpreter, and the CPU blockwise path) and end to end through
``torch.compile``.
"""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch

from tests.support.fuzz_cases import Case, assert_matches_eager, check_op
from fuse_attn.kernels import flash_attention, reference_attention
from fuse_attn.report import collect_reports
from fuse_attn.spec import AttentionSpec, CausalMask, dtype_name
from fuse_attn.score_program import ScoreProgramBuilder, ScoreTensor

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning")
PATHS = ["interpreter", "blockwise"]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    if request.param == "interpreter" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton interpreter must be chosen before triton is imported (TRITON_INTERPRET=1)")
    monkeypatch.setenv("TRITON_INTERPRET", "1" if request.param == "interpreter" else "0")
    return request.param


def masked_spec(fill: float, how: str, dtype="float32", D=16, causal=None, gqa=1):
    """``where(mask, s, fill)`` (a fill) or ``s + bias`` (an additive mask) on a [1, 1, M, N] tensor."""
    b = ScoreProgramBuilder()
    s, t = b.add("score"), b.add("load", value=0)
    if how == "fill":
        x, info = b.add("where", t, s, b.const(fill)), ScoreTensor("mask", "bool", (True, True, False, False))
    else:
        x, info = b.add("add", s, t), ScoreTensor("bias", dtype, (True, True, False, False))
    return AttentionSpec(dtype=dtype, head_dim=D, head_dim_v=D, scale=D ** -0.5, score_program=b.program(x),
                         score_tensors=(info,), causal=causal, gqa_group=gqa)


def check_against_eager(q, k, v, tensors, spec, grad_tensors=False, grad_known_relative_error=0.0):
    """Output and gradients of q, k, v (and of float score tensors when ``grad_tensors``) of ours vs eager (the
    reference in the dtype) and fp64; non-finite elements must be eager's exactly. ``grad_known_relative_error``:
    a documented error source of the gradients (``assert_matches_eager``'s ``known_relative_error``)."""
    dtype = q.dtype

    def leaves(cast):
        xs = [t.detach().to(cast) if cast is not None else t.detach() for t in (q, k, v)]
        ts = [t.detach().to(cast) if cast is not None and t.is_floating_point() else t.detach() for t in tensors]
        for x in xs + [t for t in ts if grad_tensors and t.is_floating_point()]:
            x.requires_grad_(True)
        return xs, ts

    ours_in, eager_in, ref_in = leaves(None), leaves(None), leaves(torch.float64)
    out = flash_attention(*ours_in[0], spec, ours_in[1])
    eager = reference_attention(*eager_in[0], eager_in[1], spec)[0]
    ref = reference_attention(*ref_in[0], ref_in[1], spec)[0]
    assert_matches_eager("out", out, ref, eager, dtype)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(dtype)
    results = []
    for (xs, ts), o in ((ours_in, out), (eager_in, eager), (ref_in, ref)):
        wrt = xs + [t for t in ts if t.requires_grad]
        results.append(torch.autograd.grad(o, wrt, dout.to(o.dtype)))
    for name, a, e, r in zip(["dq", "dk", "dv", "dbias"], *results):
        assert_matches_eager(name, a, r, e, dtype, grad_known_relative_error)
    return out, results[0]


def qkv(Z=1, H=2, M=11, N=13, D=16, dtype=torch.float32, Hk=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    Hk = Hk or H
    return (torch.randn(Z, H, M, D, generator=g).to(dtype), torch.randn(Z, Hk, N, D, generator=g).to(dtype),
            torch.randn(Z, Hk, N, D, generator=g).to(dtype))


# ---- fully masked rows ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["fill", "additive"])
def test_rows_masked_with_neg_inf_are_nan_as_in_eager(path, how):
    q, k, v = qkv(M=11, N=37)
    keep = torch.rand(1, 1, 11, 37, generator=torch.Generator().manual_seed(1)) < 0.5
    keep[..., 4, :] = False  # row 4 sees nothing
    tensor = keep if how == "fill" else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    out, (dq, dk, dv, *dbias) = check_against_eager(q, k, v, [tensor], masked_spec(float("-inf"), how),
                                                     grad_tensors=how == "additive")
    assert torch.isnan(out[..., 4, :]).all() and not torch.isnan(out[..., :4, :]).any()
    assert torch.isnan(dv).all()  # every key of the head: P^T dO with a NaN row of P
    if how == "fill":
        assert torch.equal(dq[..., 4, :], torch.zeros_like(dq[..., 4, :])) and not torch.isnan(dk).any()
    else:
        assert torch.isnan(dq[..., 4, :]).all() and torch.isnan(dk).all() and torch.isnan(dbias[0][..., 4, :]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fill", ["finfo.min", -1e10, -1e4])
def test_rows_masked_with_a_large_fill_are_uniform_as_in_eager(path, dtype, fill):
    # The saved fp32 lse of such a row, fill + log(N), rounds to the fill where log(N) is below its ulp (~2e31 at
    # finfo.min, 1024 at LongT5's -1e10): P recomputed from it would be 1 instead of 1/N. The fp32 kernels'
    # backward recomputes each row's max and sum itself (EXACT_DELTA); the bf16 kernels' recompute those of the
    # rows whose lse is that large (IMPRECISE_LSE), and take the saved lse elsewhere.
    if fill == "finfo.min":
        fill = torch.finfo(dtype).min
    q, k, v = qkv(M=11, N=37, dtype=dtype)
    keep = torch.ones(1, 1, 11, 37, dtype=torch.bool)
    keep[..., 2, :] = False
    spec = masked_spec(fill, "fill", dtype=dtype_name(dtype))
    out, grads = check_against_eager(q, k, v, [keep], spec)
    torch.testing.assert_close(out[0, :, 2], v[0].mean(1), **({} if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)))
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("gqa, causal", [(1, None), (2, None), (2, CausalMask(25, "top_left", window=60))],
                         ids=["mha", "gqa", "gqa-window"])
def test_rows_a_large_bias_hides_among_other_rows_of_their_blocks(path, gqa, causal):
    # LongT5's padded query rows: a learned position bias plus -1e10 on every key, in query blocks that also hold
    # ordinary rows, at both ends of M and GQA's shared kv heads; the bias's gradient too; a sliding window (its
    # masked key blocks on both sides of the full ones). bf16 takes the saved lse for the ordinary rows and the rows'
    # own statistics for the hidden ones.
    q, k, v = qkv(H=4, M=70, N=45, dtype=torch.bfloat16, Hk=4 // gqa)
    bias = torch.randn(1, 1, 70, 45, generator=torch.Generator().manual_seed(2))
    bias[..., [0, 33, 34, 69], :] -= 1e10
    spec = masked_spec(0.0, "additive", dtype="bfloat16", gqa=gqa, causal=causal)
    out, grads = check_against_eager(q, k, v, [bias.to(torch.bfloat16)], spec, grad_tensors=True)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("causal", [CausalMask(0, "bottom_right"), CausalMask(-3, "top_left"),
                                    CausalMask(0, "top_left", window=4)], ids=["br_m_gt_n", "diag-3", "window4_m_gt_n"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_rows_the_causal_band_hides_everything(path, causal, dtype):
    # bottom-right with M > N: the first M - N queries see no key; diagonal -3: the first three; a top-left window
    # of 4 with M > N + 4: the last queries. Their outputs are NaN, dq 0, dv NaN (GQA: every kv head with such a
    # row) -- including keys in blocks the kernels skip. (The dQ kernel flags such rows for the dK/dV kernel, from
    # its exact delta in fp32 and from rowsum(dO * O) in fp16.)
    spec = AttentionSpec(dtype=dtype_name(dtype), head_dim=16, head_dim_v=16, scale=0.25, causal=causal, gqa_group=2)
    out, (dq, dk, dv) = check_against_eager(*qkv(H=4, Hk=2, M=45, N=37, dtype=dtype), [], spec)
    assert torch.isnan(out).any() and torch.isnan(dv).all() and not torch.isnan(dq).any()


# ---- NaN and inf in the inputs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_inputs_propagate_as_in_eager(path, where, value):
    q, k, v = qkv(M=21, N=37)
    {"q": q, "k": k, "v": v}[where][0, 1, 5, 3] = value
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25)
    check_against_eager(q, k, v, [], spec)


@pytest.mark.parametrize("where", ["q", "k"])
def test_non_finite_q_or_k_under_a_causal_mask(path, where):
    # The output is eager's exactly: a NaN query row / key makes NaN only the rows that see it (masked_fill
    # replaces the hidden scores). Gradients: eager's also carry 0 * NaN into elements the band hides (dk of keys
    # a NaN query cannot see, through dS^T q with dS = 0 there); the kernels skip the blocks the band hides, so
    # there they may stay finite -- as in SDPA's flash and cuDNN kernels. Every NaN of ours is one of eager's, and
    # the rest holds the 2x rule.
    q, k, v = qkv(M=40, N=40)
    {"q": q, "k": k}[where][0, 0, 20, 3] = float("nan")
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, causal=CausalMask())
    ins = [[x.detach().to(d).requires_grad_(True) for x in (q, k, v)] for d in (torch.float32, torch.float32, torch.float64)]
    outs = [flash_attention(*ins[0], spec)] + [reference_attention(*x, [], spec)[0] for x in ins[1:]]
    assert_matches_eager("out", *outs[:1], outs[2], outs[1], torch.float32)
    assert torch.isnan(outs[0][0, 0, 20]).all() and not torch.isnan(outs[0][0, 0, :20]).any()
    dout = torch.randn(outs[0].shape, generator=torch.Generator().manual_seed(7))
    grads = [torch.autograd.grad(o, x, dout.to(o.dtype)) for o, x in zip(outs, ins)]
    for name, ours, eager, ref in zip(["dq", "dk", "dv"], *grads):
        assert not (torch.isnan(ours) & ~torch.isnan(eager)).any(), f"{name}: a NaN eager does not have"
        both = ~torch.isnan(ours) & ~torch.isnan(eager)
        assert_matches_eager(name, ours[both], ref[both], eager[both], torch.float32)


# ---- large logits, zero sizes -------------------------------------------------------------------------------------
def test_large_fp16_logits_stay_finite(path):
    # scores up to ~4e4 (fp16 holds 65504): eager's softmax (fp32 inside) is finite and so are we
    q, k, v = qkv(M=19, N=23, dtype=torch.float16)
    q, k = q * 40, k * 40
    spec = AttentionSpec(dtype="float16", head_dim=16, head_dim_v=16, scale=1.0)
    s = (q @ k.transpose(-1, -2)).float()
    assert s.abs().max() > 2e4 and torch.isfinite(s).all()
    # The backward recomputes P = exp2(s * log2(e) - lse * log2(e)) from the fp32 lse the forward saved in natural
    # units (as FlashAttention does): lse ~ max|s| is rounded when saved and again when converted, each time by up
    # to half an fp32 ulp of max|s| * log2(e), so P carries a relative error up to ln(2) * ulp that eager's
    # exp(s - max) does not (docs/testing.md, known differences). The gradients' bound adds that term.
    lse_ulp = torch.finfo(torch.float32).eps * 2.0 ** math.floor(math.log2(float(s.abs().max()) * math.log2(math.e)))
    out, grads = check_against_eager(q, k, v, [], spec, grad_known_relative_error=math.log(2) * lse_ulp)
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)


def test_fp16_peaked_softmax_gradient_limit(path, request):
    # Found by the fuzz (tests/kernels/test_fuzz.py). Scores 3x the usual scale over a head dim of 1 make each softmax row
    # nearly one-hot; eager's dS = P (dP - rowsum(P dP)) then cancels almost exactly, while the kernels take
    # rowsum(P dP) as rowsum(dO * O) with O rounded to fp16, an error of one fp16 ulp of |dO| |O| that does not
    # cancel: dq comes out ~4x eager's error. The blockwise path computes rowsum(P dP) from P and passes.
    if path == "interpreter":
        request.applymarker(pytest.mark.xfail(strict=True, reason="kernels: delta = rowsum(dO * O) from O rounded to "
                                              "fp16 (docs/testing.md, known differences)"))
    case = Case(Z=1, kv_heads=1, gqa=1, M=13, N=16, D=1, DV=1, dtype="float16", layouts=("contiguous",) * 3,
                scale_op=3.0, bias=None, bias_grad=False, alibi=False, softcap=None, mask=None, mask_fill=float("-inf"),
                mask_keep=0.9, band=0, causal=None, dropout_p=0.0, seed=0)
    check_op(case)


def test_exact_delta_option_fixes_the_peaked_softmax_gradient(monkeypatch):
    # FUSE_ATTN_EXACT_DELTA=1: fp16 / bf16 take rowsum(P dP) from P and dP as fp32 does, and the case above passes
    # through the kernels; and a one-key row under dropout, where O = V_j / (1 - p) is not exact in fp16, so
    # rowsum(dO * O) is not dP_j (found by the long GPU fuzz).
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton interpreter must be chosen before triton is imported (TRITON_INTERPRET=1)")
    monkeypatch.setenv("FUSE_ATTN_EXACT_DELTA", "1")
    common = dict(kv_heads=1, gqa=1, layouts=("contiguous",) * 3, bias=None, bias_grad=False, alibi=False,
                  softcap=None, mask=None, mask_fill=float("-inf"), mask_keep=0.9, band=None, seed=0)
    check_op(Case(Z=1, M=13, N=16, D=1, DV=1, dtype="float16", scale_op=3.0, causal=None, dropout_p=0.0,
                  **{**common, "band": 0}))
    check_op(Case(Z=2, M=7, N=1, D=16, DV=16, dtype="bfloat16", scale_op=None, causal=None, dropout_p=0.3, **common))


@pytest.mark.parametrize("Z, M, N, D, layouts, causal, seed", [
    (2, 5, 1, 64, ("contiguous",) * 3, CausalMask(), 0),
    (1, 16, 2, 24, ("contiguous", "sliced", "contiguous"), None, 1),
], ids=["one-key", "two-keys"])
def test_one_hot_rows_gradient_noise(path, Z, M, N, D, layouts, causal, seed):
    # Found by the fuzz: one key per row (N = 1) makes P one-hot, so eager's dS = P (dP - rowsum(P dP)) is exactly
    # 0 and so are the ALiBi slopes' gradients; with two keys per row the slopes' gradient weighs each row's sum of
    # dS (0 up to rounding) by the row index. The kernels used to take rowsum(P dP) as rowsum(dO * O), which sums
    # other products: their dS rows summed to fp32 noise, 1.3e-5 and 2.8e-5 in the slopes' gradient against the
    # rule's floor of 1e-5. For fp32 the dQ kernel now computes rowsum(P dP) from its own P and dP (EXACT_DELTA).
    check_op(Case(Z=Z, kv_heads=1, gqa=1, M=M, N=N, D=D, DV=D, dtype="float32", layouts=layouts,
                  scale_op=None, bias=None, bias_grad=True, alibi=True, softcap=None, mask=None, mask_fill=float("-inf"),
                  mask_keep=0.9, band=None, causal=causal, dropout_p=0.0, seed=seed))


ONE_KEY_ROWS = {
    # 37 rows that each see the one key (found by the long GPU fuzz: 3.6e-5 in the slopes' gradient, against the
    # rule's floor of 1e-5, before the fix)
    "N1-alibi": Case(Z=1, kv_heads=1, gqa=1, M=37, N=1, D=16, DV=16, dtype="float32", layouts=("contiguous",) * 3,
                     scale_op=None, bias=None, bias_grad=True, alibi=True, softcap=None, mask=None,
                     mask_fill=float("-inf"), mask_keep=0.9, band=None, causal=None, dropout_p=0.0, seed=0),
    # a causal window of 1 (each row sees its diagonal key) under dropout, with a per-head bias, ALiBi and a softcap
    # (the combination of the long fuzz's unexplained fp16 failures), in fp32
    "window1": Case(Z=2, kv_heads=1, gqa=2, M=41, N=23, D=16, DV=24, dtype="float32",
                    layouts=("sliced", "transposed", "contiguous"), scale_op=0.5, bias=(True, False, True, True),
                    bias_grad=True, alibi=True, softcap=30.0, mask=None, mask_fill=float("-inf"), mask_keep=0.5,
                    band=None, causal=CausalMask(-2, "bottom_right", window=1), dropout_p=0.3, seed=5),
}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", sorted(ONE_KEY_ROWS))
def test_one_key_rows_have_exactly_zero_score_gradients(path, name, dtype, monkeypatch):
    # A row that sees one key has P = 1 and dS = P (dP - rowsum(P dP)) = 0 exactly in eager, so dq and the score
    # tensors' gradients are exactly 0 (the ALiBi slope's gradient sums dS_i times a distance). The fp32 kernels'
    # backward recomputes the row's max and sum from its own scores (P = exp2(s - max) / 1 = 1 exactly, delta = dP
    # exactly) and accumulates the score tensors' gradients in the dQ kernel, from that same P and dP. Before, dS
    # came from P = exp(s - lse) with the forward's rounded lse and a dK/dV kernel that recomputes dP in another
    # order: ~1e-7 |dP| per row, weighed by distances up to 36. fp16 takes that backward under
    # FUSE_ATTN_EXACT_DELTA=1 (its default one, FlashAttention's, is a known difference).
    monkeypatch.setenv("FUSE_ATTN_EXACT_DELTA", "1" if dtype == "float16" else "0")
    case = dataclasses.replace(ONE_KEY_ROWS[name], dtype=dtype)
    grads = check_op(case)
    zero = {name: g for name, g in grads.items() if name == "dq" or name.startswith("d(score tensor")}
    assert len(zero) > 1  # dq and the score tensors' (ALiBi slopes, bias)
    for name, g in zero.items():
        assert torch.count_nonzero(g) == 0, name


@pytest.mark.parametrize("shape", [(0, 2, 5, 7), (2, 0, 5, 7), (2, 2, 0, 7), (2, 2, 5, 0)], ids=["Z0", "H0", "M0", "N0"])
def test_zero_sizes(path, shape):
    Z, H, M, N = shape
    q, k, v = (torch.randn(Z, H, L, 16, requires_grad=True) for L in (M, N, N))
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, causal=CausalMask(0, "bottom_right"))
    out = flash_attention(q, k, v, spec)
    eager = reference_attention(q, k, v, [], spec)[0]
    assert out.shape == eager.shape == (Z, H, M, 16) and torch.equal(out, eager)  # empty, or zeros for N = 0
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    expected = torch.autograd.grad(eager, (q, k, v), torch.ones_like(eager))
    for a, e in zip(grads, expected):
        assert a.shape == e.shape and torch.equal(a, e)


# ---- end to end ---------------------------------------------------------------------------------------------------
class PaddedQueries(torch.nn.Module):
    """A key padding mask applied with -inf to queries too (a row of a padded query sees nothing): NaN rows,
    as eager; or with finfo.min: uniform rows."""

    def __init__(self, fill):
        super().__init__()
        self.fill = fill

    def forward(self, q, k, v, keep):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        s = s.masked_fill(~keep, self.fill)
        return torch.softmax(s, dim=-1) @ v


@pytest.mark.parametrize("fill, inputs", [(float("-inf"), "masked_rows"), ("finfo.min", "masked_rows"),
                                          (float("-inf"), "nan_query"), (float("-inf"), "zero_batch")])
def test_compiled_edge_cases_match_eager(path, fill, inputs, request):
    q, k, v = qkv(Z=2, M=9, N=13)
    keep = torch.rand(2, 1, 9, 13, generator=torch.Generator().manual_seed(3)) < 0.6
    keep[1, :, 4] = False
    if inputs == "nan_query":
        q[0, 1, 2, 0] = float("nan")
    if inputs == "zero_batch":
        q, k, v, keep = q[:0], k[:0], v[:0], keep[:0]
    model = PaddedQueries(torch.finfo(torch.float32).min if fill == "finfo.min" else fill)
    leaves = {name: [x.detach().to(d).requires_grad_(True) for x in (q, k, v)] for name, d in
              (("ours", torch.float32), ("eager", torch.float32), ("ref", torch.float64))}
    torch._dynamo.reset()
    with collect_reports() as reports:
        out = torch.compile(model, backend="fuse_attn")(*leaves["ours"], keep)
    assert [vd.fused for r in reports for vd in r.verdicts] == [True]
    eager, ref = model(*leaves["eager"], keep), model(*leaves["ref"], keep)
    assert_matches_eager("out", out, ref, eager, torch.float32)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
    grads = [torch.autograd.grad(o, leaves[n], dout.to(o.dtype)) for n, o in (("ours", out), ("eager", eager), ("ref", ref))]
    for name, a, e, r in zip(["dq", "dk", "dv"], *grads):
        assert_matches_eager(name, a, r, e, torch.float32)


def test_a_row_whose_lse_rounded_below_its_scores_keeps_the_gradients_finite(path):
    # At scores near -1e10 (LongT5's fill of -1e10 on every key of its padded query rows) fp32 holds s and the lse
    # to +-1024 only, and the backward's recomputed s can sit that far above the forward's lse: exp2 of the
    # difference overflowed to inf, and inf * 0 made dV and dS NaN on a GPU. The row's lse is lowered here by that
    # much (its dO is 0, as for a padded row whose output is dropped): P = exp2(s - lse) stays at most 1.
    if path != "interpreter":
        pytest.skip("the generated kernels' backward (the blockwise path recomputes the softmax)")
    from fuse_attn.kernels.generated import launch

    q, k, v = qkv(M=11, N=13, dtype=torch.bfloat16)  # (fp32 recomputes each row's max: EXACT_DELTA)
    spec = AttentionSpec(dtype="bfloat16", head_dim=16, head_dim_v=16, scale=0.25)
    out, lse = launch.triton_forward(q, k, v, [], spec)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    dout[..., 4, :] = 0
    lse[..., 4] -= 1024.0
    dq, dk, dv, _ = launch.triton_backward(dout, q, k, v, [], out, lse, spec, [])
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
