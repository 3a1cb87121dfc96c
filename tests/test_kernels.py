"""The fused attention op against an fp64 reference.

Rule (from flash-attention's tests): ``max|ours - ref64| <= 2 * max|eager_same_dtype - ref64| + floor``, where
eager_same_dtype is the naive reference run in the input dtype. The Triton kernels run through the interpreter
(CPU-only CI); the plain-PyTorch blockwise path is tested with the interpreter switched off for the call.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import tempfile

os.environ.setdefault("FUSE_ATTN_CACHE_DIR", tempfile.mkdtemp(prefix="fuse_attn_test_cache_"))

import math

import pytest
import torch

from fuse_attn.kernels import flash_attention, generated_source, reference_attention
from fuse_attn.kernels import codegen
from fuse_attn.kernels.flash_attention import blockwise_backward, blockwise_forward
from fuse_attn.spec import (AddTensor, AttentionSpec, CausalMask, FillWhere, ScaleScores, ScoreTensor, Tanh,
                            UnsupportedSpec)

# The interpreter evaluates the padding rows of a tail block in numpy too (0/0, log2(0)); those rows are never
# stored, but numpy warns about them.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning")

FLOOR = {torch.float32: 1e-5, torch.float16: 1e-3}
DTYPE_NAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def make_case(Z=1, H=2, M=17, N=17, D=16, DV=None, dtype=torch.float32, causal=None, bias=None, mask=None,
              gqa=1, seed=0, scale_op=None, bias_grad=True, softcap=None):
    """Random q/k/v (+ a bias of shape `bias`, a bool mask of shape `mask`) and the spec describing them.
    Score mods in order: ScaleScores(scale_op), bias, softcap (``tanh(s / c) * c`` as Gemma-2), mask."""
    DV = DV or D
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(Z, H, M, D, generator=g).to(dtype)
    k = torch.randn(Z, H // gqa, N, D, generator=g).to(dtype)
    v = torch.randn(Z, H // gqa, N, DV, generator=g).to(dtype)
    mods, tensors, infos = [], [], []
    if scale_op is not None:
        mods.append(ScaleScores(scale_op))
    if bias is not None:
        t = torch.randn(*bias, generator=g).to(dtype)
        infos.append(ScoreTensor("bias", DTYPE_NAME[dtype], tuple(s == 1 for s in bias)))
        mods.append(AddTensor(len(tensors)))
        tensors.append(t.requires_grad_(bias_grad))
    if softcap is not None:
        mods += [ScaleScores(1 / softcap), Tanh(), ScaleScores(softcap)]
    if mask is not None:
        t = torch.rand(*mask, generator=g) > 0.25
        infos.append(ScoreTensor("mask", "bool", tuple(s == 1 for s in mask)))
        mods.append(FillWhere(len(tensors), -1e4, False))
        tensors.append(t)
    spec = AttentionSpec(dtype=DTYPE_NAME[dtype], head_dim=D, head_dim_v=DV, scale=1 / math.sqrt(D), causal=causal,
                         score_mods=tuple(mods), score_tensors=tuple(infos), gqa_group=gqa)
    return q, k, v, tensors, spec


def _nan_safe_err(a, b):
    a, b = a.double(), b.double()
    assert torch.equal(torch.isnan(a), torch.isnan(b)), "NaN positions differ"
    ok = ~torch.isnan(a)
    return (a[ok] - b[ok]).abs().max().item() if ok.any() else 0.0


def assert_close_2x(name, ours, ref64, eager, dtype):
    err = _nan_safe_err(ours, ref64)
    err_eager = _nan_safe_err(eager, ref64)
    floor = FLOOR[dtype] * max(1.0, ref64[~torch.isnan(ref64)].abs().max().item() if ref64.numel() else 1.0)
    assert err <= 2 * err_eager + floor, f"{name}: max|ours-ref|={err:.3g} > 2*{err_eager:.3g} + {floor:.3g}"


def run_and_check(q, k, v, tensors, spec, dtype, grads=True, seed=1):
    """Forward (+ grads of q, k, v and the bias) of ours vs the fp64 reference and eager in `dtype`."""
    def leaves(ts, cast=None):
        out = []
        for t in ts:
            x = t.detach()
            if cast is not None and x.is_floating_point():
                x = x.to(cast)
            out.append(x.requires_grad_(grads and t.is_floating_point() and t.requires_grad))
        return out

    ours_in = leaves([q, k, v], None) + leaves(tensors, None)
    ref_in = leaves([q, k, v], torch.float64) + leaves(tensors, torch.float64)
    eag_in = leaves([q, k, v], None) + leaves(tensors, None)
    for x in (ours_in, ref_in, eag_in):
        for t in x[:3]:
            t.requires_grad_(grads)
    out = flash_attention(*ours_in[:3], spec, ours_in[3:])
    ref, _ = reference_attention(*ref_in[:3], ref_in[3:], spec)
    eag, _ = reference_attention(*eag_in[:3], eag_in[3:], spec)
    assert out.shape == ref.shape and out.dtype == q.dtype and out.is_contiguous()
    assert_close_2x("out", out, ref, eag, dtype)
    if not grads:
        return
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
    want = [i for i, t in enumerate(ours_in) if t.requires_grad]
    g_ours = torch.autograd.grad(out, [ours_in[i] for i in want], dout)
    g_ref = torch.autograd.grad(ref, [ref_in[i] for i in want], dout.double())
    g_eag = torch.autograd.grad(eag, [eag_in[i] for i in want], dout)
    names = ["dq", "dk", "dv"] + [f"dscore{i}" for i in range(len(tensors))]
    for i, a, b, c in zip(want, g_ours, g_ref, g_eag):
        assert a.shape == ours_in[i].shape and a.dtype == ours_in[i].dtype
        assert_close_2x(names[i], a, b, c, dtype)


CASES = {
    # name: make_case kwargs -- odd lengths, M != N, padded head dims, both causal alignments, bias/mask, GQA
    "seq1": dict(M=1, N=1, D=16),
    "m17_n97_d80": dict(M=17, N=97, D=80),
    "m97_n17_causal_tl": dict(M=97, N=17, D=16, causal=CausalMask(0, "top_left")),
    "m17_n97_causal_br": dict(M=17, N=97, D=16, causal=CausalMask(0, "bottom_right")),
    "m130_n130_causal_d128": dict(M=130, N=130, D=128, H=1, causal=CausalMask()),
    "bias_1HMN": dict(M=33, N=47, D=16, bias=(1, 2, 33, 47)),
    "bias_Z11N_causal": dict(Z=2, M=40, N=40, D=16, bias=(2, 1, 1, 40), causal=CausalMask()),
    "mask_and_bias_gqa2": dict(H=4, M=29, N=37, D=16, gqa=2, bias=(1, 4, 1, 37), mask=(2, 1, 29, 37), Z=2),
    "gqa2_causal_dv_differs": dict(H=4, M=23, N=31, D=16, DV=32, gqa=2, causal=CausalMask(2, "bottom_right")),
    "scale_mod_bias_M1": dict(M=19, N=21, D=16, scale_op=0.5, bias=(1, 1, 19, 1)),
    # logit softcap after a bias, causal: cap 50 as Gemma-2 (scores scaled up so tanh is not ~linear), and
    # cap 2 with a broadcast bias so tanh saturates (|s / c| up to ~3).
    "softcap50_bias_causal": dict(M=37, N=45, D=16, scale_op=20.0, bias=(1, 2, 37, 45), softcap=50.0,
                                  causal=CausalMask(0, "bottom_right")),
    "softcap2_bias_causal_mask": dict(Z=2, M=33, N=33, D=16, bias=(2, 1, 1, 33), softcap=2.0, causal=CausalMask(),
                                      mask=(1, 2, 33, 33)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_interpreter_fp32(name):
    run_and_check(*make_case(**CASES[name]), dtype=torch.float32)


@pytest.mark.parametrize("name", ["m17_n97_d80", "mask_and_bias_gqa2", "m97_n17_causal_tl", "softcap50_bias_causal",
                                  "softcap2_bias_causal_mask"])
def test_interpreter_fp16(name):
    run_and_check(*make_case(dtype=torch.float16, **CASES[name]), dtype=torch.float16)


@pytest.mark.parametrize("name", ["m17_n97_d80", "mask_and_bias_gqa2", "m130_n130_causal_d128", "bias_Z11N_causal",
                                  "softcap50_bias_causal", "softcap2_bias_causal_mask"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cpu_blockwise(name, dtype, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the op dispatches per call: plain PyTorch path
    run_and_check(*make_case(dtype=dtype, **CASES[name]), dtype=dtype)


def test_blockwise_small_blocks_match_reference():
    q, k, v, ts, spec = make_case(M=37, N=29, D=16, causal=CausalMask(), bias=(1, 2, 37, 29))
    out, lse = blockwise_forward(q, k, v, [t.detach() for t in ts], spec, block_m=8)
    ref, ref_lse = reference_attention(q.double(), k.double(), v.double(), [t.detach().double() for t in ts], spec)
    assert (out - ref).abs().max() < 1e-5 and (lse - ref_lse).abs().max() < 1e-5


def test_blockwise_backward_small_blocks_softcap():
    # Several row blocks (the last one a single row) through the autograd-based score-mod backward, against
    # autograd of the fp64 reference: a per-row bias (sliced per block) and a key bias (summed over rows).
    q, k, v, ts, spec = make_case(M=25, N=29, D=16, causal=CausalMask(), bias=(1, 2, 25, 29), softcap=2.0)
    spec_b = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=spec.scale, causal=spec.causal,
                           score_mods=spec.score_mods[:1] + (AddTensor(1),) + spec.score_mods[1:],
                           score_tensors=spec.score_tensors + (ScoreTensor("bias", "float32", (True, True, True, False)),))
    ts = [ts[0].detach(), torch.randn(1, 1, 1, 29)]
    out, lse = blockwise_forward(q, k, v, ts, spec_b, block_m=8)
    dout = torch.randn(out.shape)
    dq, dk, dv, (db0, db1) = blockwise_backward(dout, q, k, v, ts, out, lse, spec_b, [True, True], block_m=8)
    ref_in = [x.double().requires_grad_(True) for x in (q, k, v, *ts)]
    ref, _ = reference_attention(*ref_in[:3], ref_in[3:], spec_b)
    g_ref = torch.autograd.grad(ref, ref_in, dout.double())
    for name, a, b in zip(["out", "dq", "dk", "dv", "db0", "db1"], [out, dq, dk, dv, db0, db1], [ref, *g_ref]):
        assert a.shape == b.shape and (a.double() - b).abs().max() < 1e-4, name


@pytest.mark.parametrize("interpret", ["1", "0"])
def test_neg_inf_before_tanh_is_finite(interpret, monkeypatch):
    # masked_fill(-inf) before a softcap: tanh(-inf) = -1, so those keys get weight exp(-c - max) as in eager
    # (not 0); a row masked entirely is uniform, not NaN. The causal mask, after the score mods, still hides keys.
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    q, k, v, ts, _ = make_case(M=21, N=19, D=16, bias=(1, 2, 21, 19), mask=(1, 1, 21, 19), seed=4)
    ts[1][..., 3, :] = False  # row 3 fully filled with -inf
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, causal=CausalMask(0, "top_left"),
                         score_mods=(AddTensor(0), FillWhere(1, float("-inf"), False), ScaleScores(0.5), Tanh(),
                                     ScaleScores(2.0)),
                         score_tensors=(ScoreTensor("bias", "float32", (True, False, False, False)),
                                        ScoreTensor("mask", "bool", (True, True, False, False))))
    run_and_check(q, k, v, ts, spec, torch.float32)
    out = flash_attention(q, k, v, spec, [t.detach() for t in ts])
    assert not torch.isnan(out).any()


def test_strided_inputs():
    # q, k, v as transposed views of [Z, L, H, D] (the layout after a linear projection): no copies expected.
    Z, H, M, N, D = 1, 2, 21, 35, 16
    spec = AttentionSpec(dtype="float32", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask())
    g = torch.Generator().manual_seed(3)
    q = torch.randn(Z, M, H, D, generator=g).transpose(1, 2)
    k = torch.randn(Z, N, H, D, generator=g).transpose(1, 2)
    v = torch.randn(Z, D, N, H, generator=g).permute(0, 3, 2, 1)
    assert not q.is_contiguous() and not v.is_contiguous()
    run_and_check(q, k, v, [], spec, torch.float32)


def test_lse_and_fully_masked_rows():
    # Row 0 fully masked with -inf -> NaN like eager; row 1 fully masked with finfo.min -> uniform like eager.
    M, N, D = 3, 20, 16
    for value, expect_nan in ((float("-inf"), True), (torch.finfo(torch.float32).min, False)):
        spec = AttentionSpec(dtype="float32", head_dim=D, head_dim_v=D, scale=0.25, score_mods=(FillWhere(0, value, True),),
                             score_tensors=(ScoreTensor("mask", "bool", (True, True, False, False)),))
        q, k, v = torch.randn(1, 1, M, D), torch.randn(1, 1, N, D), torch.randn(1, 1, N, D)
        mask = torch.zeros(1, 1, M, N, dtype=torch.bool)
        mask[..., 0, :] = True
        mask[..., 1, 3:] = True
        out, lse = flash_attention(q, k, v, spec, [mask], return_lse=True)
        ref, ref_lse = reference_attention(q, k, v, [mask], spec)
        assert torch.isnan(out[0, 0, 0]).all() == expect_nan
        assert _nan_safe_err(out, ref) < 1e-5
        if not expect_nan:
            assert torch.allclose(out[0, 0, 0], v[0, 0].mean(0), atol=1e-5)
        assert torch.allclose(lse[..., 1:], ref_lse[..., 1:], atol=1e-4)


def test_zero_lengths():
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25)
    q, k = torch.randn(1, 2, 0, 16, requires_grad=True), torch.randn(1, 2, 5, 16, requires_grad=True)
    v = torch.randn(1, 2, 5, 16, requires_grad=True)
    out = flash_attention(q, k, v, spec)
    assert out.shape == (1, 2, 0, 16)
    out.sum().backward()
    assert torch.equal(k.grad, torch.zeros_like(k))
    q = torch.randn(1, 2, 4, 16)
    k0, v0 = torch.randn(1, 2, 0, 16), torch.randn(1, 2, 0, 16)
    out, lse = flash_attention(q, k0, v0, spec, return_lse=True)
    eager = torch.softmax(q @ k0.transpose(-2, -1), -1) @ v0
    assert torch.equal(out, eager) and torch.isneginf(lse).all()


def test_unsupported_inputs():
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25)
    q = torch.randn(1, 2, 4, 16)
    with pytest.raises(UnsupportedSpec, match="dtype"):
        flash_attention(q.double(), q.double(), q.double(), spec)
    with pytest.raises(UnsupportedSpec, match="spec dtype"):
        flash_attention(q.half(), q.half(), q.half(), spec)
    with pytest.raises(UnsupportedSpec, match="head dim"):
        flash_attention(torch.randn(1, 2, 4, 32), torch.randn(1, 2, 4, 32), torch.randn(1, 2, 4, 32), spec)
    with pytest.raises(UnsupportedSpec, match="256"):
        big = torch.randn(1, 1, 2, 300)
        flash_attention(big, big, big, spec)
    with pytest.raises(UnsupportedSpec):
        AttentionSpec(dtype="float32", head_dim=300, head_dim_v=300, scale=0.1)
    with pytest.raises(UnsupportedSpec, match="score tensors"):
        flash_attention(q, q, q, spec, [torch.zeros(1, 1, 4, 4)])
    spec_b = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, score_mods=(AddTensor(0),),
                           score_tensors=(ScoreTensor("bias", "float32", (True, True, False, False)),))
    with pytest.raises(UnsupportedSpec, match="broadcast"):
        flash_attention(q, q, q, spec_b, [torch.zeros(1, 2, 4, 4)])
    with pytest.raises(UnsupportedSpec, match="gqa"):
        flash_attention(q, q[:, :1], q[:, :1], spec)


@pytest.mark.parametrize("interpret", ["1", "0"])
def test_opcheck(interpret, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    q, k, v, ts, spec = make_case(M=9, N=11, D=16, causal=CausalMask(), bias=(1, 2, 1, 11), mask=(1, 1, 9, 11))
    q.requires_grad_(True)
    text = spec.to_json()
    torch.library.opcheck(torch.ops.fuse_attn.flash_attention.default, (q, k, v, ts, text))
    out, lse = torch.ops.fuse_attn.flash_attention(q.detach(), k, v, [t.detach() for t in ts], text)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.fuse_attn.flash_attention_backward.default,
                          (dout, q.detach(), k, v, [t.detach() for t in ts], out, lse, text, [True, False]))


def test_generated_source_and_cache():
    q, k, v, ts, spec = make_case(bias=(1, 2, 17, 1), mask=(1, 1, 17, 17), causal=CausalMask())
    src = generated_source(spec)
    assert "{{" not in src and spec.digest in src
    assert "bias_0 = tl.load(" in src and "fill_1" in src and "tl.atomic_add" in src
    compile(src, "<generated>", "exec")
    capped = generated_source(make_case(softcap=30.0)[4])
    assert "tanh_1 = " in capped and "ds = ds * (1.0 - tanh_1 * tanh_1)" in capped
    mod = codegen.load_module(spec)
    assert mod.__file__.startswith(str(codegen.cache_dir())) and spec.digest in os.path.basename(mod.__file__)
    assert codegen.load_module(spec) is mod
