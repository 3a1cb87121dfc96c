"""The fused attention op against an fp64 reference.

Rule (from flash-attention's tests): ``max|ours - ref64| <= 2 * max|eager_same_dtype - ref64| + floor``, where
eager_same_dtype is the naive reference run in the input dtype. The Triton kernels run through the interpreter
(CPU-only CI); the plain-PyTorch blockwise path is tested with the interpreter switched off for the call.
"""

import dataclasses
import functools
import inspect
import json
import os
import pickle

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere (as conftest.py does)

import tempfile

os.environ.setdefault("FUSE_ATTN_CACHE_DIR", tempfile.mkdtemp(prefix="fuse_attn_test_cache_"))

import math
import re

import pytest
import torch
import triton
import triton.language as tl

from fuse_attn.kernels import plan
from fuse_attn.kernels import flash_attention, generated_source, reference_attention
from fuse_attn.kernels.generated import codegen
from fuse_attn.kernels import philox
from fuse_attn.kernels.reference import blockwise_backward, blockwise_forward
from fuse_attn.spec import AttentionSpec, CausalMask
from fuse_attn.score_program import ScoreProgramBuilder, ScoreTensor, UnsupportedSpec
from tests.support.cases import (DTYPE_NAME, alibi, bias_twice, clamps, index_leaves, make_case, near_diagonal,
                                 run_and_check, seed_tensor, ties, transcendental)
from tests.support.numerics import assert_close_2x, nan_safe_err

# The interpreter evaluates the padding rows of a tail block in numpy too (0/0, log2(0)); those rows are never
# stored, but numpy warns about them.
pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                         "ignore:divide by zero encountered:RuntimeWarning",
                                         "ignore:overflow encountered:RuntimeWarning"),
              # these run the kernels on CPU tensors; a GPU session (TRITON_INTERPRET=0) binds them to the GPU
              pytest.mark.skipif(os.environ["TRITON_INTERPRET"] != "1", reason="needs a TRITON_INTERPRET=1 session")]

CASES = {
    # name: make_case kwargs -- odd lengths, M != N, padded head dims, both causal alignments, bias/mask, GQA
    "seq1": dict(M=1, N=1, D=16),
    "m17_n97_d80": dict(M=17, N=97, D=80),
    "m97_n17_causal_tl": dict(M=97, N=17, D=16, causal=CausalMask(0, "top_left")),
    "m17_n97_causal_br": dict(M=17, N=97, D=16, causal=CausalMask(0, "bottom_right")),
    "m130_n130_causal_d128": dict(M=130, N=130, D=128, H=1, causal=CausalMask()),
    "bias_1HMN": dict(M=33, N=47, D=16, bias=(1, 2, 33, 47)),
    "bias_Z11N_causal": dict(Z=2, M=40, N=40, D=16, bias=(2, 1, 1, 40), causal=CausalMask()),
    # a learned bias shared by the batch rows: their programs are launched side by side (BATCH_INNER)
    "bias_1HMN_z3_causal": dict(Z=3, M=50, N=50, D=16, bias=(1, 2, 50, 50), causal=CausalMask()),
    "mask_and_bias_gqa2": dict(H=4, M=29, N=37, D=16, gqa=2, bias=(1, 4, 1, 37), mask=(2, 1, 29, 37), Z=2),
    "gqa2_causal_dv_differs": dict(H=4, M=23, N=31, D=16, DV=32, gqa=2, causal=CausalMask(2, "bottom_right")),
    # head dims in two column parts (launch._head_dim_parts): D 96 = 64 + 32, DV 48 = 32 + 16
    "d96_dv48_gqa2_causal_mask": dict(H=4, M=37, N=45, D=96, DV=48, gqa=2, causal=CausalMask(0, "bottom_right"),
                                      mask=(1, 4, 37, 45)),
    # DeepSeek's MLA in training: D 192 = 128 + 64, DV 128 in one part
    "d192_dv128_causal_bias": dict(M=33, N=40, D=192, DV=128, causal=CausalMask(), bias=(1, 2, 33, 40)),
    # Gemma-4's global layers: head dim 512, GQA
    "d512_gqa2_causal": dict(H=4, M=33, N=40, D=512, gqa=2, causal=CausalMask()),
    "scale_mod_bias_M1": dict(M=19, N=21, D=16, scale_op=0.5, bias=(1, 1, 19, 1)),
    # logit softcap after a bias, causal: cap 50 as Gemma-2 (scores scaled up so tanh is not ~linear), and
    # cap 2 with a broadcast bias so tanh saturates (|s / c| up to ~3).
    "softcap50_bias_causal": dict(M=37, N=45, D=16, scale_op=20.0, bias=(1, 2, 37, 45), softcap=50.0,
                                  causal=CausalMask(0, "bottom_right")),
    "softcap2_bias_causal_mask": dict(Z=2, M=33, N=33, D=16, bias=(2, 1, 1, 33), softcap=2.0, causal=CausalMask(),
                                      mask=(1, 2, 33, 33)),
    # programs beyond the enumerated mods
    "alibi_causal": dict(H=4, M=33, N=47, D=16, biases=((1, 4, 1, 1),), program=alibi,
                         causal=CausalMask(0, "bottom_right")),
    "clamp_bias": dict(M=29, N=37, D=16, biases=((1, 2, 29, 37),), program=clamps),
    "index_band": dict(M=40, N=33, D=16, program=near_diagonal),
    "bias_twice_sigmoid_causal": dict(M=23, N=31, D=16, biases=((1, 2, 1, 31),), program=bias_twice,
                                      causal=CausalMask()),
    "div_sqrt_abs_log_exp": dict(M=19, N=45, D=16, biases=((1, 2, 19, 45),), program=transcendental),
    "index_leaves_logical_mask": dict(Z=2, M=21, N=27, D=16, mask=(2, 1, 21, 27), program=index_leaves),
    # sliding windows; the interpreter's blocks are 32 x 16 (forward, dQ) and 16 x 32 (dK/dV): windows of 1,
    # below one block (5), between the two block sizes (20) and above both (40), both alignments, M != N.
    "window1": dict(M=17, N=17, D=16, causal=CausalMask(window=1)),
    "window5_m97": dict(M=97, N=97, D=16, H=1, causal=CausalMask(window=5)),
    "window20_br_m33_n97": dict(M=33, N=97, D=16, causal=CausalMask(0, "bottom_right", window=20)),
    "window40_tl_diag3_m97_n61": dict(M=97, N=61, D=16, H=1, causal=CausalMask(3, "top_left", window=40)),
    "window9_softcap_bias_gqa2": dict(H=4, gqa=2, M=45, N=45, D=16, causal=CausalMask(window=9), bias=(1, 4, 45, 45),
                                      softcap=5.0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_interpreter_fp32(name):
    run_and_check(*make_case(**CASES[name]), dtype=torch.float32)


@pytest.mark.parametrize("name", ["m17_n97_d80", "mask_and_bias_gqa2", "m97_n17_causal_tl", "softcap50_bias_causal",
                                  "softcap2_bias_causal_mask", "alibi_causal", "div_sqrt_abs_log_exp",
                                  "window20_br_m33_n97", "d96_dv48_gqa2_causal_mask", "d192_dv128_causal_bias",
                                  "d512_gqa2_causal"])
def test_interpreter_fp16(name):
    run_and_check(*make_case(dtype=torch.float16, **CASES[name]), dtype=torch.float16)


# dK and dV in two launches (a config's dkdv_launches=2, the wide heads' candidates): padded and unequal head dims,
# bias gradients (from dS, in the dK launch; with fp32's exact delta in the dQ kernel), GQA, a mask, a window, and
# dropout (both launches draw the same keep-mask).
SPLIT_DKDV_CASES = {"m17_n97_d80": torch.float16, "mask_and_bias_gqa2": torch.float16,
                    "d96_dv48_gqa2_causal_mask": torch.float16, "p10_d80_dv48_causal": torch.float32,
                    "gqa2_causal_dv_differs": torch.float32, "window9_softcap_bias_gqa2": torch.float32,
                    "softcap50_bias_causal": torch.float16, "p10_bias_causal_br": torch.float16,
                    "d512_gqa2_causal": torch.float16}


def _recorded_launches(monkeypatch) -> list:
    """(kernel name, arguments) of every kernel launch from here on; the launches still run."""
    from fuse_attn.kernels.generated import launch

    launched, launch_kernel = [], launch.launch

    def record(kernel, grid, args, cfg=None, warmup=False):
        launched.append((kernel.fn.__name__, args))
        launch_kernel(kernel, grid, args, cfg, warmup)

    monkeypatch.setattr(launch, "launch", record)
    return launched


@pytest.mark.parametrize("name", sorted(SPLIT_DKDV_CASES))
def test_dk_and_dv_in_two_launches(name, monkeypatch):
    from fuse_attn.kernels import tuning

    configs = dict(tuning.INTERPRETER_CONFIGS)
    configs["bwd_dkdv"] = dataclasses.replace(configs["bwd_dkdv"], dkdv_launches=2)
    monkeypatch.setattr(tuning, "INTERPRETER_CONFIGS", configs)
    launched = _recorded_launches(monkeypatch)
    dtype = SPLIT_DKDV_CASES[name]
    case = make_case(dtype=dtype, **{**CASES, **DROPOUT_CASES}[name])
    run_and_check(*case, dtype=dtype, dropout_seed=seed_tensor(11) if name in DROPOUT_CASES else None)
    parts = [(args["COMPUTE_DK"], args["COMPUTE_DV"]) for kernel, args in launched if kernel == "_attn_bwd_dkdv"]
    assert parts == [(False, True), (True, False)]


def test_head_dims_are_split_into_two_parts_where_that_pads_less(monkeypatch):
    from fuse_attn.kernels.generated import launch

    dims = (1, 16, 24, 40, 48, 64, 72, 80, 96, 112, 128, 160, 192, 200, 256, 320, 384, 512)
    assert {d: launch._head_dim_parts(d) for d in dims} == {
        1: (16, 0), 16: (16, 0), 24: (32, 0), 40: (32, 16), 48: (32, 16), 64: (64, 0), 72: (64, 16), 80: (64, 16),
        96: (64, 32), 112: (128, 0), 128: (128, 0), 160: (128, 32), 192: (128, 64), 200: (256, 0), 256: (256, 0),
        320: (256, 64), 384: (256, 128), 512: (512, 0)}
    # every attention kernel gets the parts
    launched = _recorded_launches(monkeypatch)
    run_and_check(*make_case(**CASES["d96_dv48_gqa2_causal_mask"]), dtype=torch.float32)
    parts = {kernel: tuple(args[n] for n in ("BLOCK_D", "BLOCK_D_TAIL", "BLOCK_DV", "BLOCK_DV_TAIL"))
             for kernel, args in launched}
    assert parts == {name: (64, 32, 32, 16) for name in ("_attn_fwd", "_attn_bwd_dq", "_attn_bwd_dkdv")}


@pytest.mark.parametrize("name", ["m17_n97_d80", "mask_and_bias_gqa2", "m130_n130_causal_d128", "bias_Z11N_causal",
                                  "softcap50_bias_causal", "softcap2_bias_causal_mask", "alibi_causal", "clamp_bias",
                                  "bias_twice_sigmoid_causal", "div_sqrt_abs_log_exp", "index_leaves_logical_mask",
                                  "window1", "window20_br_m33_n97", "window40_tl_diag3_m97_n61"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cpu_blockwise(name, dtype, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the op dispatches per call: plain PyTorch path
    run_and_check(*make_case(dtype=dtype, **CASES[name]), dtype=dtype)


@pytest.mark.parametrize("interpret", ["1", "0"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_maximum_minimum_ties(interpret, dtype, monkeypatch):
    # bias1 equals bias0 on ~40% of the elements, and q is 0 on rows 3 and 10 (their scores are exactly 0): the
    # gradient of every tie is split in halves, as torch.maximum / minimum do.
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    q, k, v, ts, spec = make_case(M=21, N=27, D=16, dtype=dtype, biases=((1, 2, 21, 27), (1, 2, 21, 27)), program=ties)
    same = torch.rand(ts[0].shape, generator=torch.Generator().manual_seed(5)) < 0.4
    with torch.no_grad():
        ts[1][same] = ts[0][same]
    q[:, :, [3, 10]] = 0
    run_and_check(q, k, v, ts, spec, dtype)


def test_blockwise_small_blocks_match_reference():
    q, k, v, ts, spec = make_case(M=37, N=29, D=16, causal=CausalMask(), bias=(1, 2, 37, 29))
    out, lse = blockwise_forward(q, k, v, [t.detach() for t in ts], spec, block_m=8)
    ref, ref_lse = reference_attention(q.double(), k.double(), v.double(), [t.detach().double() for t in ts], spec)
    assert (out - ref).abs().max() < 1e-5 and (lse - ref_lse).abs().max() < 1e-5


@pytest.mark.parametrize("window", [None, 6])
def test_blockwise_backward_small_blocks_softcap(window):
    # Several row blocks (the last one a single row) through the program's reverse pass, against autograd of the
    # fp64 reference: a per-row bias (sliced per block) and a key bias (summed over rows), both read by a softcap.
    def program(b, s, t):
        x = b.add("add", b.add("add", s, t[0]), t[1])
        return b.add("mul", b.add("tanh", b.add("div", x, b.const(2.0))), b.const(2.0))

    q, k, v, ts, spec = make_case(M=25, N=29, D=16, causal=CausalMask(window=window), biases=((1, 2, 25, 29), (1, 1, 1, 29)),
                                  program=program)
    ts = [t.detach() for t in ts]
    out, lse = blockwise_forward(q, k, v, ts, spec, block_m=8)
    dout = torch.randn(out.shape)
    dq, dk, dv, (db0, db1) = blockwise_backward(dout, q, k, v, ts, out, lse, spec, [True, True], block_m=8)
    ref_in = [x.double().requires_grad_(True) for x in (q, k, v, *ts)]
    ref, _ = reference_attention(*ref_in[:3], ref_in[3:], spec)
    g_ref = torch.autograd.grad(ref, ref_in, dout.double())
    for name, a, b in zip(["out", "dq", "dk", "dv", "db0", "db1"], [out, dq, dk, dv, db0, db1], [ref, *g_ref]):
        assert a.shape == b.shape and (a.double() - b).abs().max() < 1e-4, name


@pytest.mark.parametrize("interpret, dtype", [("1", torch.float32), ("1", torch.float16), ("0", torch.float32)])
def test_lse_is_differentiable(interpret, dtype, monkeypatch):
    # A loss on out and on lse (context parallelism merges partial outputs by their lse): the gradient of lse
    # (d lse_i / d s_ij = P_ij) goes into every path's delta -- the dQ kernel's rowsum(dO * O) (fp16), its exact delta
    # (fp32), the blockwise path -- with a per-head bias and GQA, causal with a window, against fp64 autograd.
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    q, k, v, ts, spec = make_case(H=4, gqa=2, M=21, N=19, dtype=dtype, causal=CausalMask(window=7),
                                  bias=(1, 4, 1, 1))
    g = torch.Generator().manual_seed(3)
    dout, dlse = torch.randn(1, 4, 21, 16, generator=g).to(dtype), torch.randn(1, 4, 21, generator=g)

    def grads(inputs, compute_dtype):
        inputs = [t.detach().to(compute_dtype).requires_grad_() for t in inputs]
        if compute_dtype is None:
            out, lse = flash_attention(*inputs[:3], spec, inputs[3:], return_lse=True)
        else:
            out, lse = reference_attention(*inputs[:3], inputs[3:], spec)
        loss = (out * dout.to(out.dtype)).sum() + (lse * dlse.to(lse.dtype)).sum()
        return torch.autograd.grad(loss, inputs)

    ours, ref, eager = grads([q, k, v, *ts], None), grads([q, k, v, *ts], torch.float64), grads([q, k, v, *ts], dtype)
    for name, a, b, e in zip(["dq", "dk", "dv", "dbias"], ours, ref, eager):
        assert_close_2x(name, a, b, e, dtype)


@pytest.mark.parametrize("interpret", ["1", "0"])
def test_neg_inf_before_tanh_is_finite(interpret, monkeypatch):
    # masked_fill(-inf) before a softcap: tanh(-inf) = -1, so those keys get weight exp(-c - max) as in eager
    # (not 0); a row masked entirely is uniform, not NaN. The causal mask, after the program, still hides keys.
    monkeypatch.setenv("TRITON_INTERPRET", interpret)

    def program(b, s, t):
        x = b.add("where", t[1], b.add("add", s, t[0]), b.const(float("-inf")))
        return b.add("mul", b.add("tanh", b.add("mul", x, b.const(0.5))), b.const(2.0))

    q, k, v, ts, spec = make_case(M=21, N=19, D=16, biases=((1, 2, 21, 19),), mask=(1, 1, 21, 19), seed=4, program=program,
                                  causal=CausalMask(0, "top_left"))
    ts[1][..., 3, :] = False  # row 3 fully filled with -inf
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


def _fill_where_mask(value, keep_where_true=False):
    """where(mask, value, s) -- masked_fill(mask, value) -- on a bool mask; ``keep_where_true``: where(mask, s, value),
    an SDPA-style mask (True takes part)."""
    b = ScoreProgramBuilder()
    mask, score, fill = b.add("load", value=0), b.add("score"), b.const(value)
    return b.program(b.add("where", mask, score, fill) if keep_where_true else b.add("where", mask, fill, score))


def test_lse_and_fully_masked_rows():
    # Row 0 fully masked with -inf -> NaN like eager; row 1 fully masked with finfo.min -> uniform like eager.
    M, N, D = 3, 20, 16
    for value, expect_nan in ((float("-inf"), True), (torch.finfo(torch.float32).min, False)):
        spec = AttentionSpec(dtype="float32", head_dim=D, head_dim_v=D, scale=0.25, score_program=_fill_where_mask(value),
                             score_tensors=(ScoreTensor("mask", "bool", (True, True, False, False)),))
        q, k, v = torch.randn(1, 1, M, D), torch.randn(1, 1, N, D), torch.randn(1, 1, N, D)
        mask = torch.zeros(1, 1, M, N, dtype=torch.bool)
        mask[..., 0, :] = True
        mask[..., 1, 3:] = True
        out, lse = flash_attention(q, k, v, spec, [mask], return_lse=True)
        ref, ref_lse = reference_attention(q, k, v, [mask], spec)
        assert torch.isnan(out[0, 0, 0]).all() == expect_nan
        assert nan_safe_err(out, ref) < 1e-5
        if not expect_nan:
            assert torch.allclose(out[0, 0, 0], v[0, 0].mean(0), atol=1e-5)
        assert torch.allclose(lse[..., 1:], ref_lse[..., 1:], atol=1e-4)


def _sdpa_empty_rows_case(dtype, gqa):
    """q/k/v, a bool mask with fully masked query rows (rows 0 and 5 of batch 0, all of batch 1's head 1 rows under a
    negative causal diagonal), and the spec of ``F.scaled_dot_product_attention`` on them: empty rows give 0."""
    Z, H, M, N, D = 2, 2 * gqa, 21, 37, 16
    g = torch.Generator().manual_seed(11)
    q, k = torch.randn(Z, H, M, D, generator=g).to(dtype), torch.randn(Z, H // gqa, N, D, generator=g).to(dtype)
    v = torch.randn(Z, H // gqa, N, D, generator=g).to(dtype)
    mask = torch.rand(Z, 1, M, N, generator=g) > 0.3
    mask[0, :, [0, 5]] = False
    spec = AttentionSpec(dtype=DTYPE_NAME[dtype], head_dim=D, head_dim_v=D, scale=D ** -0.5, gqa_group=gqa,
                         causal=CausalMask(diagonal=-3), empty_rows="zero",
                         score_program=_fill_where_mask(float("-inf"), keep_where_true=True),
                         score_tensors=(ScoreTensor("mask", "bool", (False, True, False, False)),))
    return q, k, v, mask, spec


@pytest.mark.parametrize("interpret", ["1", "0"])
@pytest.mark.parametrize("dtype,gqa", [(torch.float32, 1), (torch.float16, 2)])
def test_empty_rows_zero_is_sdpa(interpret, dtype, gqa, monkeypatch):
    # spec.empty_rows="zero" (an SDPA call, a _safe_softmax): rows that see no key give 0 and no gradient, as SDPA
    # does; fp32 takes the kernels' exact delta, fp16 the lse path. Compared with SDPA itself in fp64 (2x rule).
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    q, k, v, mask, spec = _sdpa_empty_rows_case(dtype, gqa)
    M, N = q.shape[2], k.shape[2]
    visible = mask & torch.ones(M, N, dtype=torch.bool).tril(-3)
    assert not visible[0, :, 0].any() and not visible[1, :, :3].any()  # the empty rows

    def sdpa(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=gqa > 1)

    out = _check_against_sdpa(lambda q, k, v: flash_attention(q, k, v, spec, [mask]), sdpa, (q, k, v), dtype)
    assert (out[0, :, [0, 5]] == 0).all() and (out[1, :, :3] == 0).all()


def _check_against_sdpa(ours, sdpa, inputs, dtype, ours_inputs=None):
    """``ours`` and ``sdpa`` (fp64 and in ``dtype``) on ``inputs`` (``ours_inputs`` if given): output and dq/dk/dv
    finite and under the 2x rule. Returns ours' output."""
    ins = [t.clone().requires_grad_() for t in (ours_inputs or inputs)]
    ref_in = [t.double().requires_grad_() for t in inputs]
    eag_in = [t.clone().requires_grad_() for t in inputs]
    out = ours(*ins)
    ref, eag = sdpa(*ref_in), sdpa(*eag_in)
    assert not out.isnan().any()
    assert_close_2x("out", out, ref, eag, dtype)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    for name, a, b, c in zip(("dq", "dk", "dv"), torch.autograd.grad(out, ins, dout),
                             torch.autograd.grad(ref, ref_in, dout.double()), torch.autograd.grad(eag, eag_in, dout)):
        assert not a.isnan().any(), name
        assert_close_2x(name, a, b, c, dtype)
    return out


def test_finfo_min_bias_row_is_uniform():
    # An additive 0 / finfo.min mask (Hugging Face style) with one row entirely finfo.min: eager gives that row
    # uniform weights; the bias is converted to log2 units without overflowing to -inf.
    M, N, D = 5, 19, 16
    q, k, v, ts, spec = make_case(M=M, N=N, D=D, H=1, bias=(1, 1, M, N), bias_grad=False)
    bias = torch.zeros(1, 1, M, N)
    bias[..., 2, :] = torch.finfo(torch.float32).min
    bias[..., 4, ::2] = torch.finfo(torch.float32).min
    out = flash_attention(q, k, v, spec, [bias])
    ref, _ = reference_attention(q.double(), k.double(), v.double(), [bias.double()], spec)
    assert torch.allclose(out[0, 0, 2], v[0, 0].mean(0), atol=1e-5)
    assert (out.double() - ref).abs().max() < 1e-5


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
    with pytest.raises(UnsupportedSpec, match="exceed 512"):
        big = torch.randn(1, 1, 2, 520)
        flash_attention(big, big, big, spec)
    with pytest.raises(UnsupportedSpec):
        AttentionSpec(dtype="float32", head_dim=520, head_dim_v=520, scale=0.1)
    with pytest.raises(UnsupportedSpec, match="score tensors"):
        flash_attention(q, q, q, spec, [torch.zeros(1, 1, 4, 4)])
    spec_b = make_case(D=16, bias=(1, 1, 4, 4))[4]
    with pytest.raises(UnsupportedSpec, match="broadcast"):
        flash_attention(q, q, q, spec_b, [torch.zeros(1, 2, 4, 4)])
    with pytest.raises(UnsupportedSpec, match="gqa"):
        flash_attention(q, q[:, :1], q[:, :1], spec)


@pytest.mark.parametrize("interpret", ["1", "0"])
def test_opcheck(interpret, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    q, k, v, ts, spec = make_case(M=9, N=11, D=16, causal=CausalMask(window=4), bias=(1, 2, 1, 11), mask=(1, 1, 9, 11))
    q.requires_grad_(True)
    text = spec.to_json()
    torch.library.opcheck(torch.ops.fuse_attn.flash_attention.default, (q, k, v, ts, None, text))
    out, lse = torch.ops.fuse_attn.flash_attention(q.detach(), k, v, [t.detach() for t in ts], None, text)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.fuse_attn.flash_attention_backward.default,
                          (dout, q.detach(), k, v, [t.detach() for t in ts], None, out, lse, text, [True, False]))


def _loop_body(src: str, loop: str) -> str:
    """The source of one @triton.jit loop function of a generated module."""
    start = src.index(f"def {loop}(")
    return src[start:src.index("@triton.jit", start)]


def test_generated_source_and_cache():
    q, k, v, ts, spec = make_case(bias=(1, 2, 17, 1), mask=(1, 1, 17, 17), causal=CausalMask())
    src = generated_source(spec)
    assert "{{" not in src and spec.digest in src
    # the row bias is loaded as one column of a query-major tile (forward, dQ) and one row of a key-major tile
    # (dK/dV); either backward kernel can accumulate its gradient (the launcher picks one by NEED_DT0), summed over
    # keys: axis 1 of the query-major tile, axis 0 of the key-major one
    assert "sm_1 = tl.load(T0 + off_z * stride_t0_z + off_h * stride_t0_h + offs_m[:, None] * stride_t0_m, " in src
    assert "sm_1 = tl.load(T0 + off_z * stride_t0_z + off_h * stride_t0_h + offs_m[None, :] * stride_t0_m, " in src
    for loop, axis in (("_dq_loop", 1), ("_dkdv_loop", 0)):
        body = _loop_body(src, loop)
        assert "if NEED_DT0:" in body and "tl.atomic_add(" in body and f"tl.sum(dt0, {axis})" in body
    compile(src, "<generated>", "exec")
    mod = codegen.load_module(spec)
    assert mod.__file__.startswith(str(codegen.kernel_source_dir())) and spec.digest in os.path.basename(mod.__file__)
    assert codegen.load_module(spec) is mod


def test_specs_that_differ_only_in_launch_arguments_share_kernels():
    # a graph compiled with dynamic=True (symbolic head dim: scale 1.0 * D**-0.5) and one compiled per shape (head
    # dim 64, scale 0.125) must run the same kernels, tuned once: head dims and scale are launch arguments
    static = AttentionSpec(dtype="float32", head_dim=64, head_dim_v=64, scale=0.125, causal=CausalMask(), q_len=9,
                           kv_len=9, num_heads=2)
    dynamic = AttentionSpec(dtype="float32", head_dim=None, head_dim_v=None, scale=1.0, causal=CausalMask(),
                            scale_head_dim_power=-0.5)
    assert static.digest == dynamic.digest and codegen.load_module(static) is codegen.load_module(dynamic)
    assert static.digest != AttentionSpec(dtype="float32", head_dim=64, head_dim_v=64, scale=0.125).digest  # causal
    assert static.digest != dataclasses.replace(static, dtype="bfloat16").digest


def test_unspecialized_kernels(monkeypatch):
    # FUSE_ATTN_SPECIALIZE=0 (the long GPU fuzz): the launched kernels of both templates -- and only their
    # decorators -- list every run-time argument as unspecialized; the kernels still compute the same attention.
    q, k, v, ts, spec = make_case(H=4, gqa=2, M=19, N=23, bias=(1, 4, 19, 1), causal=CausalMask(0, "bottom_right"))
    launched = {codegen.TEMPLATE_NAME: ["_attn_fwd", "_attn_bwd_dkdv", "_attn_bwd_dq"],
                codegen.DECODING_TEMPLATE_NAME: ["_decode_split", "_decode_combine"]}
    for template, kernels in launched.items():
        source = codegen._GENERATORS[template](spec)
        generic = codegen.without_specialization(source)
        changed = [(a, b) for a, b in zip(source.splitlines(), generic.splitlines()) if a != b]
        assert len(generic.splitlines()) == len(source.splitlines()) and len(changed) == len(kernels)
        for (before, after), name in zip(changed, kernels):
            assert before.startswith("@triton.jit(do_not_specialize=[") and "do_not_specialize_on_alignment" in after
            params = re.search(rf"def {name}\((.*?)\):", generic, re.S).group(1)
            runtime = [p.strip() for p in params.replace("\n", " ").split(",")
                       if p.strip() and "constexpr" not in p]
            assert after == f"@triton.jit(do_not_specialize={runtime!r}, do_not_specialize_on_alignment={runtime!r})"
    specialized = codegen.load_module(spec)
    monkeypatch.setenv("FUSE_ATTN_SPECIALIZE", "0")
    generic_module = codegen.load_module(spec)
    assert generic_module is not specialized and generic_module.KERNEL_ID != specialized.KERNEL_ID
    run_and_check(q, k, v, ts, spec, dtype=torch.float32)


def test_one_dkdv_binary_serves_every_dq_config():
    # The lse flags' rows per block (the dQ kernel's BLOCK_M) reach the dK/dV kernel as a plain, unspecialized
    # argument, so the tuner compiles the candidates of both kernels in one batch before dQ's is chosen
    # (tuning.compile_together): a constexpr or a specialized value would make each dQ choice another dK/dV binary.
    kernel = codegen.load_module(make_case()[4])._attn_bwd_dkdv
    unspecialized = getattr(kernel, "kwargs", {}).get("do_not_specialize") or kernel.do_not_specialize
    assert inspect.signature(kernel.fn).parameters["flag_rows"].annotation is inspect.Parameter.empty
    assert "flag_rows" in unspecialized


def test_generated_fast_paths():
    # The common programs cost what the enumerated mods did: an empty program adds nothing to the loops; a bias
    # add converts the bias once and nothing else; a softcap and a bool mask convert nothing (the tanh takes its
    # log2-unit argument, its constant factor carries log2(e)); adjoints never leave natural units.
    plain = generated_source(make_case(causal=CausalMask())[4])
    for loop in ("_fwd_loop", "_dkdv_loop", "_dq_loop"):
        assert not re.search(r"\b(sm|g)_\d", _loop_body(plain, loop))  # no program values, no adjoints
    bias = _loop_body(generated_source(make_case(bias=(1, 2, 17, 17))[4]), "_dkdv_loop")
    assert len(re.findall(r"\b_to_log2\(", bias)) == 1 and "LN2" not in bias and "LOG2E" not in bias
    for case in (dict(softcap=30.0), dict(mask=(1, 1, 17, 17))):
        body = _loop_body(generated_source(make_case(**case)[4]), "_dkdv_loop")
        assert not re.search(r"\b_to_log2\(", body) and "LN2" not in body and "LOG2E" not in body, case
    capped = _loop_body(generated_source(make_case(softcap=30.0)[4]), "_dq_loop")
    assert "tl.math.exp2(-2.0 * sm_2)" in capped and "g_2 = g_3 * (1.0 - (sm_3 * sm_3))" in capped
    assert "tl.where(tile_mask, ds, 0.0)" not in capped  # no padding guard: every derivative is finite there
    unread = generated_source(make_case(biases=((1, 2, 17, 17),), program=lambda b, s, t: t[0])[4])
    assert "ds = tl.zeros_like(ds)" in unread


def test_batch_rows_side_by_side_only_for_tensors_the_batch_shares():
    # BATCH_INNER orders the grid so the batch rows' programs read a shared [.., M, N] tile together; a tensor
    # per batch row, or one without a query and a key extent, keeps each head's blocks together
    from fuse_attn.kernels.generated.launch import common_kernel_args
    for shapes, expected in ((((1, 2, 17, 17),), True), (((1, 1, 17, 17),), True), (((3, 2, 17, 17),), False),
                             (((3, 1, 1, 17),), False), (((1, 2, 1, 1), (1, 2, 17, 1)), False), ((), False)):
        q, k, v, _, spec = make_case(Z=3, biases=shapes, program=lambda b, s, t: functools.reduce(
            lambda x, load: b.add("add", x, load), t, s))
        assert common_kernel_args(q, k, v, spec)["BATCH_INNER"] is expected, shapes


@pytest.mark.parametrize("bias", [None, (1, 16, 16, 16)], ids=["plain", "batch-shared bias"])
def test_grids_past_65535_batch_rows_times_heads(bias, monkeypatch):
    # CUDA's second and third grid dimensions stop at 65535: the kernels' grids are one dimension over blocks, batch
    # rows and heads, so 4400 batch rows of 16 heads (70,400 pairs: short sequences served in a large batch) launch
    from fuse_attn.kernels.generated import launch
    Z, H, L = 4400, 16, 16
    # fp16: the backward's delta from rowsum(dO * O) (fp32 takes the exact delta)
    q, k, v, tensors, spec = make_case(Z=Z, H=H, M=L, N=L, D=16, bias=bias, causal=CausalMask(), dtype=torch.float16)
    grids = []
    monkeypatch.setattr(launch, "launch", lambda kernel, grid, args, cfg=None, warmup=False: grids.append(
        (kernel.fn.__name__, grid, args)))
    launch.triton_forward(q, k, v, tensors, spec, None)
    launch.triton_backward(torch.randn_like(q), q, k, v, tensors, torch.empty_like(q), torch.empty(q.shape[:3]), spec,
                           [t.requires_grad for t in tensors], None)
    assert [name for name, _, _ in grids] == ["_attn_fwd", "_attn_bwd_dq", "_attn_bwd_dkdv"]
    for name, grid, args in grids:
        block = args["BLOCK_N"] if name == "_attn_bwd_dkdv" else args["BLOCK_M"]
        assert grid == (math.ceil(L / block) * Z * H,), (name, grid)
        assert args["BATCH_INNER"] is (bias is not None)


# the generated module's _block_batch_head, for _program_order (the interpreter resolves globals at call time)
_block_batch_head = None


@triton.jit
def _program_order(Out, blocks, H, Z, head_group, REVERSED: tl.constexpr, BATCH_INNER: tl.constexpr):
    block, off_z, off_h = _block_batch_head(blocks, H, Z, REVERSED, BATCH_INNER, head_group)
    pid = tl.program_id(0)
    tl.store(Out + pid * 3, block)
    tl.store(Out + pid * 3 + 1, off_z.to(tl.int32))
    tl.store(Out + pid * 3 + 2, off_h.to(tl.int32))


@pytest.mark.parametrize("blocks, Z, H, head_group", [(5, 3, 2, 4), (3, 2, 7, 4), (4, 1, 3, 8), (2, 3, 2, 1), (6, 2, 3, 6)])
@pytest.mark.parametrize("reversed_, batch_inner", [(False, False), (True, False), (False, True)])
def test_program_order_visits_every_block_batch_row_and_head_once(blocks, Z, H, head_group, reversed_, batch_inner,
                                                                  monkeypatch):
    # _block_batch_head maps the one-dimensional grid onto (block, batch row, head): every triple exactly once, for
    # groups of (batch row, head) pairs that do not divide Z * H too; a group's programs run block by block (the
    # heaviest blocks of every pair of the group before the next block), REVERSED flips the block order
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25)
    monkeypatch.setitem(globals(), "_block_batch_head", codegen.load_module(spec)._block_batch_head)
    programs = blocks * Z * H
    out = torch.full((programs, 3), -1, dtype=torch.int32)
    _program_order[(programs,)](out, blocks, H, Z, head_group, reversed_, batch_inner)
    triples = [tuple(row) for row in out.tolist()]
    assert sorted(triples) == [(b, z, h) for b in range(blocks) for z in range(Z) for h in range(H)]
    if not batch_inner:
        pairs = Z * H
        for first in range(0, pairs, head_group):  # each group: its pairs' blocks in order, the pairs side by side
            size = min(head_group, pairs - first)
            group = triples[first * blocks:(first + size) * blocks]
            steps = [b if not reversed_ else blocks - 1 - b for b, _, _ in group]
            assert steps == [i // size for i in range(size * blocks)]
            assert {z * H + h for _, z, h in group} == set(range(first, first + size))


def test_padding_guard_for_unbounded_derivatives():
    # log / sqrt / division by a loaded value: their derivatives are infinite on out-of-bounds elements (loads
    # give 0 there), so masked tiles zero the adjoints outside the tensor before dk / dq / d(bias) sum them.
    src = generated_source(make_case(biases=((1, 2, 17, 17),), program=transcendental)[4])
    for loop in ("_dq_loop", "_dkdv_loop"):
        body = _loop_body(src, loop)
        assert "ds = tl.where(tile_mask, ds, 0.0)" in body and "dt0 = tl.where(tile_mask, dt0, 0.0)" in body


@pytest.mark.parametrize("window", [2, 15, 16, 17, 31, 32, 33, 47, 50])
def test_window_block_edges(window):
    # Windows around multiples of the interpreter's block sizes (16, 32), with offsets 0 and 3: each bound of the
    # forward, dQ and dK/dV kernels' block skipping is hit exactly by one of them (a block one short or one long
    # changes the result; 47 and 50 reach the dK/dV kernel's fully visible rows past its causal diagonal).
    for causal, M, N in ((CausalMask(window=window), 80, 80), (CausalMask(0, "bottom_right", window=window), 77, 80)):
        run_and_check(*make_case(H=1, M=M, N=N, D=16, causal=causal), dtype=torch.float32)


@pytest.mark.parametrize("interpret", ["1", "0"])
def test_symbolic_head_dim_scale(interpret, monkeypatch):
    # A spec with a symbolic head dim (dynamic shapes): one spec, run at two head dims, scale = D ** -0.5 each.
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    spec = AttentionSpec(dtype="float32", head_dim=None, head_dim_v=None, scale=1.0, scale_head_dim_power=-0.5,
                         causal=CausalMask(window=7))
    for D in (16, 80):
        q, k, v, _, fixed = make_case(M=19, N=23, D=D, causal=CausalMask(window=7))
        assert fixed.scale == pytest.approx(spec.scale_for(D))
        run_and_check(q, k, v, [], spec, torch.float32)


# ---- dropout -----------------------------------------------------------------------------------------------------
@triton.jit
def _triton_rand_kernel(Seed, Offsets, Ints, Floats, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    seed = tl.load(Seed)
    offsets = tl.load(Offsets + i)
    tl.store(Ints + i, tl.randint(seed, offsets).to(tl.int32, bitcast=True))
    tl.store(Floats + i, tl.rand(seed, offsets))


@pytest.mark.parametrize("seed", [0, 12345, 2**40 + 7, -3])
def test_philox_matches_triton_rand(seed):
    # Bit for bit against tl.randint / tl.rand with int64 offsets in Triton's interpreter: small counters, counters
    # around and far beyond 2**32 (both counter words in use), and seeds using both key words or negative.
    g = torch.Generator().manual_seed(seed & 0xFFFF)
    offsets = torch.cat([torch.arange(96), torch.tensor([2**32 - 1, 2**32, 2**32 + 1, 2**63 - 1]),
                         torch.randint(0, 2**62, (156,), generator=g)])
    ints, floats = torch.empty(256, dtype=torch.int32), torch.empty(256)
    _triton_rand_kernel[(1,)](torch.tensor(seed), offsets, ints, floats, BLOCK=256)
    seed_t = torch.tensor(seed)
    assert torch.equal(philox.randint(seed_t, offsets), ints.to(torch.int64) & 0xFFFFFFFF)
    assert torch.equal(philox.rand(seed_t, offsets).view(torch.int32), floats.view(torch.int32))


DROPOUT_CASES = {
    "p30": dict(M=17, N=97, D=16, dropout_p=0.3),
    "p10_bias_causal_br": dict(Z=2, M=29, N=37, D=16, bias=(2, 1, 29, 37), causal=CausalMask(0, "bottom_right"),
                               dropout_p=0.1),
    "p10_d80_dv48_causal": dict(M=29, N=37, D=80, DV=48, causal=CausalMask(), dropout_p=0.1),
    "p50_gqa2_causal_dv_differs": dict(H=4, M=23, N=31, D=16, DV=32, gqa=2, causal=CausalMask(), mask=(1, 1, 23, 31),
                                       dropout_p=0.5),
}


@pytest.mark.parametrize("name", sorted(DROPOUT_CASES))
@pytest.mark.parametrize("interpret", ["1", "0"])
def test_dropout_fp32(name, interpret, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    run_and_check(*make_case(**DROPOUT_CASES[name]), dtype=torch.float32, dropout_seed=seed_tensor(2**33 + 5))


@pytest.mark.parametrize("interpret", ["1", "0"])
def test_dropout_fp16_gqa_causal(interpret, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    case = make_case(dtype=torch.float16, **DROPOUT_CASES["p50_gqa2_causal_dv_differs"])
    run_and_check(*case, dtype=torch.float16, dropout_seed=seed_tensor(-7))


def test_dropout_blockwise_small_blocks():
    # Several row blocks (the last a single row): each block draws the mask rows it owns.
    q, k, v, ts, spec = make_case(M=25, N=29, D=16, causal=CausalMask(), bias=(1, 2, 25, 29), dropout_p=0.4)
    ts, seed = [t.detach() for t in ts], seed_tensor(99)
    out, lse = blockwise_forward(q, k, v, ts, spec, block_m=8, dropout_seed=seed)
    dout = torch.randn(out.shape)
    grads = blockwise_backward(dout, q, k, v, ts, out, lse, spec, [True], block_m=8, dropout_seed=seed)
    ref_in = [x.double().requires_grad_(True) for x in (q, k, v, *ts)]
    ref, ref_lse = reference_attention(*ref_in[:3], ref_in[3:], spec, seed)
    g_ref = torch.autograd.grad(ref, ref_in, dout.double())
    for name, a, b in zip(["out", "lse", "dq", "dk", "dv", "dbias"], [out, lse, *grads[:3], *grads[3]],
                          [ref, ref_lse, *g_ref]):
        assert a.shape == b.shape and (a.double() - b.double()).abs().max() < 1e-4, name


@pytest.mark.parametrize("interpret", ["1", "0"])
def test_dropout_keep_fraction_and_seeds(interpret, monkeypatch):
    # q = k = 0 makes P uniform (1/N) and v = 1 makes out[i] = kept_i / (N (1 - p)): the op's own mask, counted.
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    Z, H, M, N, p = 1, 2, 64, 256, 0.2
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, dropout_p=p)
    q, k, v = torch.zeros(Z, H, M, 16), torch.zeros(Z, H, N, 16), torch.ones(Z, H, N, 16)

    def kept(seed):
        out, lse = flash_attention(q, k, v, spec, dropout_seed=seed_tensor(seed), return_lse=True)
        assert torch.allclose(lse, torch.full_like(lse, math.log(N)))  # the lse of the undropped scores
        assert torch.equal(out, out[..., :1].expand_as(out))
        return torch.round(out[..., 0] * N * (1 - p))

    a, b = kept(1), kept(2)
    n = Z * H * M * N
    assert abs(a.sum().item() - n * (1 - p)) <= 5 * math.sqrt(n * p * (1 - p))  # binomial, 5 sigma
    assert not torch.equal(a, b)  # another seed, another mask
    assert torch.equal(kept(1), a)  # the same seed, the same mask
    expect = philox.dropout_keep(seed_tensor(1), p, Z, H, M, N, 0, M).sum(-1)
    assert torch.equal(a, expect.float())


def test_dropout_same_seed_same_output_and_default_seed():
    q, k, v, ts, spec = make_case(M=19, N=23, D=16, causal=CausalMask(), dropout_p=0.25)
    ts = [t.detach() for t in ts]
    one = flash_attention(q, k, v, spec, ts, dropout_seed=seed_tensor(5))
    assert torch.equal(one, flash_attention(q, k, v, spec, ts, dropout_seed=seed_tensor(5)))
    assert not torch.equal(one, flash_attention(q, k, v, spec, ts, dropout_seed=seed_tensor(6)))
    torch.manual_seed(0)
    drawn = flash_attention(q, k, v, spec, ts)  # no seed: one is drawn from torch's generator
    torch.manual_seed(0)
    assert torch.equal(drawn, flash_attention(q, k, v, spec, ts))


def test_a_specs_json_is_made_once_and_describes_its_own_fields():
    """to_json is cached on the (frozen) instance: a spec made from it by dataclasses.replace, a pickled copy and the
    JSON read back each describe their own fields."""
    spec = AttentionSpec(dtype="bfloat16", head_dim=64, head_dim_v=64, scale=0.125)
    text = spec.to_json()
    assert spec.to_json() is text and json.loads(text)["scale"] == 0.125
    wider = dataclasses.replace(spec, scale=0.5, head_dim=128)
    assert json.loads(wider.to_json())["scale"] == 0.5 and json.loads(wider.to_json())["head_dim"] == 128
    assert AttentionSpec.from_json(wider.to_json()) == wider != spec
    copied = pickle.loads(pickle.dumps(spec))
    assert copied == spec and hash(copied) == hash(spec) and copied.to_json() == text


def test_dropout_spec_and_seed_validation():
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, dropout_p=0.1)
    assert "dropout=0.1" in spec.describe()
    no_dropout = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25)
    # the digest (kernel module and autotune key) tells dropout kernels apart
    assert AttentionSpec.from_json(spec.to_json()) == spec and spec.digest != no_dropout.digest
    for p in (1.0, -0.1, float("nan")):
        with pytest.raises(UnsupportedSpec, match="dropout_p"):
            AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, dropout_p=p)
    q = torch.randn(1, 2, 4, 16)
    op = torch.ops.fuse_attn.flash_attention
    with pytest.raises(UnsupportedSpec, match="needs a dropout seed"):
        op(q, q, q, [], None, spec.to_json())
    with pytest.raises(UnsupportedSpec, match="0-dim int64"):
        op(q, q, q, [], torch.tensor([3]), spec.to_json())
    with pytest.raises(UnsupportedSpec, match="dropout_p is 0"):
        op(q, q, q, [], seed_tensor(3), no_dropout.to_json())


@pytest.mark.parametrize("interpret", ["1", "0"])
def test_opcheck_dropout(interpret, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    q, k, v, ts, spec = make_case(M=9, N=11, D=16, causal=CausalMask(), bias=(1, 2, 1, 11), dropout_p=0.3)
    q.requires_grad_(True)
    text, seed = spec.to_json(), seed_tensor(11)
    torch.library.opcheck(torch.ops.fuse_attn.flash_attention.default, (q, k, v, ts, seed, text))
    out, lse = torch.ops.fuse_attn.flash_attention(q.detach(), k, v, [t.detach() for t in ts], seed, text)
    torch.library.opcheck(torch.ops.fuse_attn.flash_attention_backward.default,
                          (torch.randn_like(out), q.detach(), k, v, [t.detach() for t in ts], seed, out, lse, text,
                           [True]))


# ---- key padding vectors: the key blocks outside each batch row's [first, end) are skipped --------------------------
# Each batch row of the [Z, 1, 1, N] padding vector, N = 97: right padding, left padding, ragged lengths 1 and 0 (no
# key: the row gives 0), and holes inside the range (a mask that is not one run: the range is an optimization).
_KEY_ROWS = {
    "right": lambda n: torch.arange(n) < 40,
    "left": lambda n: torch.arange(n) >= 70,
    "one key": lambda n: torch.arange(n) == 50,
    "no key": lambda n: torch.zeros(n, dtype=torch.bool),
    "holes": lambda n: (torch.arange(n) >= 33) & (torch.arange(n) < 90) & (torch.arange(n) % 3 != 0),
}


def _padding_spec(form: str, dtype=torch.float32, **fields) -> AttentionSpec:
    """The padding forms on a [Z, 1, 1, N] vector. SDPA's, rows of no key at 0: "keep" a bool mask, True takes part
    (where(~keep, -inf, s)); "hide" a bool mask, True is padding (where(hide, -inf, s)); "bias" an additive 0 / -inf
    bias (s + bias). Hugging Face's eager attention's, rows of no key uniform: "fill", an additive 0 / finfo.min bias
    (s + bias; the "masking" kind of key padding)."""
    b = ScoreProgramBuilder()
    t, s = b.add("load", value=0), b.add("score")
    root = {"keep": lambda: b.add("where", b.add("logical_not", t), b.const(float("-inf")), s),
            "hide": lambda: b.add("where", t, b.const(float("-inf")), s),
            "bias": lambda: b.add("add", s, t), "fill": lambda: b.add("add", s, t)}[form]()
    vector = (False, True, True, False)
    tensor = ScoreTensor("bias", str(dtype).removeprefix("torch."), vector) if form in ("bias", "fill") else \
        ScoreTensor("mask", "bool", vector)
    return AttentionSpec(dtype=str(dtype).removeprefix("torch."), head_dim=16, head_dim_v=16, scale=0.25,
                         score_program=b.program(root), score_tensors=(tensor,),
                         empty_rows="nan" if form == "fill" else "zero", **fields)


@pytest.mark.parametrize("form", ["keep", "hide", "bias", "fill"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype,gqa", [(torch.float32, 1), (torch.float16, 2)])
def test_key_padding_vector_skips_blocks_outside_its_range(form, causal, dtype, gqa, monkeypatch):
    """The padding forms: the spec names the padding vector; K and V hold NaN in the key blocks the range leaves
    out, which a visited block would spread into the output (0 * NaN) and the gradients -- the result is that of
    SDPA with the same mask (a bool mask, or the additive one), in fp64 (2x rule). SDPA's forms skip the blocks
    wholly outside each batch row's first..last visible key, and a row with no key gives 0; the finfo.min form
    ("masking") skips none of a row with no visible key (its rows are uniform over every key), and under a causal
    mask only the blocks after the last visible key (a query before the first one keeps the padding it sees). The
    kernels only (in the interpreter): the blockwise path computes every key."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    Z, H, M, N, D = len(_KEY_ROWS), 2 * gqa, 61 if causal else 33, 97, 16
    spec = _padding_spec(form, dtype, causal=CausalMask(alignment="bottom_right") if causal else None, gqa_group=gqa)
    masking = form == "fill"
    assert plan.key_padding(spec) == (0, {"keep": "false", "hide": "true", "bias": "-inf", "fill": "fill"}[form],
                                  "masking" if masking else "-inf", None)
    keys = torch.stack([row(N) for row in _KEY_ROWS.values()])  # [Z, N], True: visible
    # "fill": -65504, fp16's finfo.min, the "masking" kind's limit -- a row of finfo(fp32).min added keeps nothing
    # of its scores, and its gradients are made by rounding, differently by SDPA's math and eager's (docs/testing.md)
    fill = float("-inf") if form == "bias" else torch.finfo(torch.float16).min
    vector = {"keep": lambda: keys, "hide": lambda: ~keys,
              "bias": lambda: torch.zeros(Z, N, dtype=dtype).masked_fill(~keys, fill),
              "fill": lambda: torch.zeros(Z, N, dtype=dtype).masked_fill(~keys, fill)}[form]()
    g = torch.Generator().manual_seed(0)
    q = torch.randn(Z, H, M, D, generator=g).to(dtype)
    k, v = (torch.randn(Z, H // gqa, N, D, generator=g).to(dtype) for _ in range(2))
    # blocks of 32 keys (the widest key tile of the interpreter's configs) wholly outside a row's range
    block = 32
    poisoned = torch.zeros(Z, N, dtype=torch.bool)
    for z in range(Z):
        hit = keys[z].nonzero()
        first, end = (int(hit[0]), int(hit[-1]) + 1) if len(hit) else (0, 0)
        if masking:
            first, end = (0 if causal else first, end) if len(hit) else (0, N)
        for start in range(0, N, block):
            if start + block <= first or start >= end:
                poisoned[z, start:start + block] = True
    assert poisoned.any()
    k_nan, v_nan = k.clone(), v.clone()
    k_nan[poisoned[:, None, :, None].expand_as(k)] = float("nan")
    v_nan[poisoned[:, None, :, None].expand_as(v)] = float("nan")
    allowed = torch.ones(M, N, dtype=torch.bool).tril(N - M) if causal else torch.ones(M, N, dtype=torch.bool)

    def sdpa(q, k, v):
        if masking:  # the additive mask itself, in the computation's dtype, and -inf where causal hides a key
            mask = vector[:, None, None, :].to(q.dtype).masked_fill(~allowed, float("-inf"))
        else:
            mask = keys[:, None, None, :].expand(Z, 1, M, N) & allowed
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa > 1)

    out = _check_against_sdpa(lambda q, k, v: flash_attention(q, k, v, spec, [vector[:, None, None, :]]), sdpa,
                              (q, k, v), dtype, ours_inputs=(q, k_nan, v_nan))
    if not masking:
        assert (out[3] == 0).all()


@pytest.mark.parametrize("form", ["keep", "fill"])
@pytest.mark.parametrize("dtype,gqa", [(torch.float32, 1), (torch.float16, 2)])
def test_key_padding_with_a_causal_band_in_the_program_skips_blocks_past_it(form, dtype, gqa, monkeypatch):
    """Padding and causality written into one mask, the band in the score program (no causal mask in the spec): SDPA's
    bool form where(~((kv_idx <= q_idx) & keep), -inf, s), rows of no key 0, and Hugging Face's eager form
    s + where((kv_idx <= q_idx) & keep, 0, fill), rows of no visible key uniform over every key. K and V hold NaN in
    the key blocks that no query block may visit: outside each batch row's visible keys or past the band of the last
    query -- for the fill form only in batch rows whose every query keeps a visible key (key 0 visible: right
    padding); a row with a query before its first visible key visits every key there. Against SDPA with the same
    mask in fp64 (2x rule), output and gradients; the kernels in the interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # besides _KEY_ROWS: every key visible (only the band skips), and a short left padding (the fill form's first
    # query block keeps queries with no visible key, the later ones do not)
    rows = {**_KEY_ROWS, "all": lambda n: torch.ones(n, dtype=torch.bool), "left 10": lambda n: torch.arange(n) >= 10}
    Z, H, M, N, D = len(rows), 2 * gqa, 33, 97, 16
    fill = float("-inf") if form == "keep" else torch.finfo(torch.float16).min  # -65504: see the test above
    b = ScoreProgramBuilder()
    pad, s = b.add("load", value=0), b.add("score")
    visible = b.add("logical_and", b.add("le", b.add("kv_idx"), b.add("q_idx")), pad)
    root = (b.add("where", b.add("logical_not", visible), b.const(fill), s) if form == "keep" else
            b.add("add", s, b.add("where", visible, b.const(0.0), b.const(fill))))
    spec = AttentionSpec(dtype=DTYPE_NAME[dtype], head_dim=D, head_dim_v=D, scale=0.25, score_program=b.program(root),
                         score_tensors=(ScoreTensor("mask", "bool", (False, True, True, False)),), gqa_group=gqa,
                         empty_rows="zero" if form == "keep" else "nan")
    assert plan.key_padding(spec) == (0, "false", "-inf" if form == "keep" else "masking", 0)
    keys = torch.stack([row(N) for row in rows.values()])  # [Z, N], True: visible
    g = torch.Generator().manual_seed(0)
    q = torch.randn(Z, H, M, D, generator=g).to(dtype)
    k, v = (torch.randn(Z, H // gqa, N, D, generator=g).to(dtype) for _ in range(2))
    block = 32  # the widest key tile of the interpreter's configs
    poisoned = torch.zeros(Z, N, dtype=torch.bool)
    for z in range(Z):
        hit = keys[z].nonzero()
        if not len(hit) or (form == "fill" and int(hit[0]) > 0):
            continue
        first, end = int(hit[0]), min(int(hit[-1]) + 1, M)  # the band of the last query (M - 1) ends at key M - 1
        for start in range(0, N, block):
            if start + block <= first or start >= end:
                poisoned[z, start:start + block] = True
    assert poisoned[list(rows).index("all"), 64:].all()  # past the band of every query: skipped
    k_nan, v_nan = k.clone(), v.clone()
    k_nan[poisoned[:, None, :, None].expand_as(k)] = float("nan")
    v_nan[poisoned[:, None, :, None].expand_as(v)] = float("nan")
    allowed = keys[:, None, None, :] & torch.ones(M, N, dtype=torch.bool).tril()

    def sdpa(q, k, v):
        mask = allowed if form == "keep" else torch.zeros(allowed.shape, dtype=q.dtype).masked_fill(~allowed, fill)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa > 1)

    out = _check_against_sdpa(lambda q, k, v: flash_attention(q, k, v, spec, [keys[:, None, None, :]]), sdpa,
                              (q, k, v), dtype, ours_inputs=(q, k_nan, v_nan))
    if form == "keep":
        assert (out[3] == 0).all()


@pytest.mark.parametrize("form", ["keep", "fill"])
def test_key_padding_under_a_causal_mask_where_query_blocks_see_only_padding(form, monkeypatch):
    """Causal (top-left) with left padding past the first query blocks' band: their key range starts past their last
    key, so they visit no block (the -inf form: rows of no key give 0) or every key from 0 (the fill form), and none of
    the proven run's full tiles -- which lie past their band -- may run for them. Against SDPA in fp64 (2x rule)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    Z, H, M, N, D = 2, 2, 97, 97, 16
    spec = _padding_spec(form, causal=CausalMask())
    keys = torch.stack([torch.arange(N) >= 70, torch.arange(N) >= 40])
    fill = torch.finfo(torch.float16).min
    vector = keys if form == "keep" else torch.zeros(Z, N).masked_fill(~keys, fill)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(Z, H, L, D, generator=g) for L in (M, N, N))
    allowed = torch.ones(M, N, dtype=torch.bool).tril()

    def sdpa(q, k, v):
        if form == "fill":
            mask = vector[:, None, None, :].to(q.dtype).masked_fill(~allowed, float("-inf"))
        else:
            mask = keys[:, None, None, :] & allowed
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    _check_against_sdpa(lambda q, k, v: flash_attention(q, k, v, spec, [vector[:, None, None, :]]), sdpa, (q, k, v),
                        torch.float32)


def _hf_padding_causal_spec(dtype=torch.float32, bias=False) -> AttentionSpec:
    """Hugging Face's eager padding + causal mask as one program: s + where(past band | padding, fill, 0) on a bool
    vector, or s + where(past band, fill, 0) + vector on an additive one (bias)."""
    fill = torch.finfo(torch.float16).min  # -65504, the "masking" kind's limit (see the tests above)
    b = ScoreProgramBuilder()
    pad, s = b.add("load", value=0), b.add("score")
    past = b.add("ge", b.add("kv_idx"), b.add("add", b.add("q_idx"), b.const(1)))
    if bias:
        root = b.add("add", b.add("add", s, b.add("where", past, b.const(fill), b.const(0.0))), pad)
        tensor = ScoreTensor("bias", DTYPE_NAME[dtype], (False, True, True, False))
    else:
        root = b.add("add", s, b.add("where", b.add("logical_or", pad, past), b.const(fill), b.const(0.0)))
        tensor = ScoreTensor("mask", "bool", (False, True, True, False))
    return AttentionSpec(dtype=DTYPE_NAME[dtype], head_dim=16, head_dim_v=16, scale=0.25, score_program=b.program(root),
                         score_tensors=(tensor,))


def test_visible_program_of_a_key_padding_vector():
    """spec.visible_spec: the program where the vector and its band keep the key -- the score alone for the padding
    forms above and Hugging Face's -- and None where it still reads a score tensor (a bias beside the padding)."""
    for form in ("keep", "hide", "bias", "fill"):
        assert plan.visible_spec(_padding_spec(form)).score_program == ()
    for bias in (False, True):
        spec = _hf_padding_causal_spec(bias=bias)
        assert plan.key_padding(spec) == (0, "true" if not bias else "fill", "masking", 0)
        assert plan.visible_spec(spec).score_program == () and plan.visible_spec(spec).score_tensors == ()
    b = ScoreProgramBuilder()
    s = b.add("add", b.add("score"), b.add("load", value=1))
    root = b.add("where", b.add("logical_not", b.add("load", value=0)), b.const(float("-inf")), s)
    with_bias = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, score_program=b.program(root),
                              score_tensors=(ScoreTensor("mask", "bool", (False, True, True, False)),
                                             ScoreTensor("bias", "float32", (True, False, False, False))),
                              empty_rows="zero")
    assert plan.key_padding(with_bias) is not None and plan.visible_spec(with_bias) is None
    assert plan.mask_blocks(_padding_spec("keep")) is None and codegen.generate_source(_padding_spec("keep"))


def test_the_proven_run_of_visible_keys():
    """launch.key_range_args' columns 2-3: the first visible key .. one past the last where no key between is
    hidden and a bias is exactly 0 there (what the full-tile program takes it to be); else empty."""
    from fuse_attn.kernels.generated.launch import key_range_args

    N = 97
    keys = torch.stack([row(N) for row in _KEY_ROWS.values()])  # right, left, one key, no key, holes
    proven = [[0, 40], [70, 97], [50, 51], [0, 0], [0, 0]]
    mask_spec, bias_spec = _hf_padding_causal_spec(), _hf_padding_causal_spec(bias=True)
    args = key_range_args(mask_spec, [~keys[:, None, None, :]], len(keys), N, torch.empty(0))
    assert args["KEY_FULL"] and args["KEY_BAND"] == 2 and args["KeyRange"][:, 2:].tolist() == proven
    fill = torch.finfo(torch.float16).min
    zeros = torch.zeros(keys.shape).masked_fill(~keys, fill)
    args = key_range_args(bias_spec, [zeros[:, None, None, :]], len(keys), N, torch.empty(0))
    assert args["KeyRange"][:, 2:].tolist() == proven
    # a visible key whose bias is not 0: the run is not proven (the whole program runs on every tile of the row)
    nonzero = zeros.clone()
    nonzero[0, 5] = 0.5
    args = key_range_args(bias_spec, [nonzero[:, None, None, :]], len(keys), N, torch.empty(0))
    assert args["KeyRange"][:, 2:].tolist() == [[0, 0]] + proven[1:]
    assert not key_range_args(bias_spec, [zeros[:, None, None, :]], len(keys), N, torch.empty(0),
                               full_tiles=False)["KEY_FULL"]


@pytest.mark.parametrize("values", ["zero", "not zero"])
def test_key_padding_bias_with_any_visible_values_gives_eager(values, monkeypatch):
    """Hugging Face's padding + causal mask with the padding as an additive vector, whose visible keys hold 0 (the
    full tiles run the score alone) or other values (no run proven: every tile runs the whole program); both against
    eager's softmax of the same scores in fp64 (2x rule), the vector's gradient too (it needs one here, so the
    kernels run no full-tile program in the backward)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # key 0 visible in every row, so every query keeps a visible key: a query that keeps none adds -65504 to all of
    # its scores, which leaves its gradients to rounding (the tests above compare those against SDPA's own rounding)
    rows = [torch.arange(97) < 40, torch.ones(97, dtype=torch.bool), torch.arange(97) < 1,
            (torch.arange(97) < 90) & (torch.arange(97) % 3 != 1)]
    Z, H, M, N, D = len(rows), 2, 61, 97, 16
    spec = _hf_padding_causal_spec(bias=True)
    keys = torch.stack(rows)
    g = torch.Generator().manual_seed(0)
    visible_values = torch.zeros(Z, N) if values == "zero" else torch.randn(Z, N, generator=g)
    vector = visible_values.masked_fill(~keys, torch.finfo(torch.float16).min)[:, None, None, :]
    q = torch.randn(Z, H, M, D, generator=g)
    k, v = (torch.randn(Z, H, N, D, generator=g) for _ in range(2))
    band = torch.zeros(M, N).masked_fill(~torch.ones(M, N, dtype=torch.bool).tril(), torch.finfo(torch.float16).min)

    def eager(q, k, v, vector):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.25 + band.to(q.dtype) + vector, -1) @ v

    inputs = [q, k, v, vector]
    ours_in = [t.clone().requires_grad_() for t in inputs]
    ref_in = [t.double().requires_grad_() for t in inputs]
    eag_in = [t.clone().requires_grad_() for t in inputs]
    out = flash_attention(*ours_in[:3], spec, [ours_in[3]])
    ref, eag = eager(*ref_in), eager(*eag_in)
    assert_close_2x("out", out, ref, eag, torch.float32)
    dout = torch.randn(out.shape, generator=g)
    for name, a, b, c in zip(("dq", "dk", "dv", "dvector"), torch.autograd.grad(out, ours_in, dout),
                             torch.autograd.grad(ref, ref_in, dout.double()), torch.autograd.grad(eag, eag_in, dout)):
        assert_close_2x(name, a, b, c, torch.float32)


@pytest.mark.parametrize("form, padding, nan_rows_padding", [
    ("where(~pad, -inf, s)", (0, "false", "-inf", None), (0, "false", "masking", None)),
    ("where(pad, -inf, s)", (0, "true", "-inf", None), (0, "true", "masking", None)),
    ("where(pad, s, -inf)", (0, "false", "-inf", None), (0, "false", "masking", None)),
    ("s + where(pad, 0, -inf)", (0, "false", "-inf", None), (0, "false", "masking", None)),
    # another mask could leave a row no visible key of its own: only SDPA's empty rows allow skipping then
    ("where(pad & other, s, -inf)", (0, "false", "-inf", None), None),
    ("where(~(other & pad), -inf, s)", (0, "false", "-inf", None), None),
    ("s + bias", (0, "-inf", "-inf", None), (0, "fill", "masking", None)),
    # finfo.min is not -inf: a row of padding only is uniform in eager -- the "masking" kind, whatever the empty rows
    ("s + where(pad, 0, finfo.min)", (0, "false", "masking", None), (0, "false", "masking", None)),
    # Hugging Face's eager padding + causal written into one mask (a query before the first visible key is uniform
    # over every key in eager: the kernels narrow to the band only query blocks whose rows all keep a visible key),
    # and SDPA's bool form of it; the band's diagonal read from how the comparison is written
    ("s + where((kv_idx <= q_idx) & pad, 0, finfo.min)", (0, "false", "masking", 0), (0, "false", "masking", 0)),
    ("where(~((kv_idx <= q_idx) & pad), -inf, s)", (0, "false", "-inf", 0), (0, "false", "masking", 0)),
    ("where((q_idx + 3 > kv_idx) & pad, s, -inf)", (0, "false", "-inf", 2), (0, "false", "masking", 2)),
    ("where((kv_idx > q_idx) | ~pad, -inf, s)", (0, "false", "-inf", 0), (0, "false", "masking", 0)),
    ("where((kv_idx + 4 <= q_idx + 6) & pad, s, -inf)", (0, "false", "-inf", 2), (0, "false", "masking", 2)),
    # a band that hides keys only with another mask is no band of the padding's
    ("where((kv_idx <= q_idx) | other, s, -inf) + where(pad, 0, -inf)", (0, "false", "-inf", None), None),
    ("where(pad | other, s, -inf)", None, None),
    ("s * bias", None, None),
])
def test_key_padding_is_named_only_where_the_vector_masks_the_score(form, padding, nan_rows_padding):
    b = ScoreProgramBuilder()
    pad, other, s = b.add("load", value=0), b.add("load", value=1), b.add("score")
    neg_inf = b.const(float("-inf"))
    root = {
        "where(~pad, -inf, s)": lambda: b.add("where", b.add("logical_not", pad), neg_inf, s),
        "where(pad, -inf, s)": lambda: b.add("where", pad, neg_inf, s),
        "where(pad, s, -inf)": lambda: b.add("where", pad, s, neg_inf),
        "s + where(pad, 0, -inf)": lambda: b.add("add", s, b.add("where", pad, b.const(0.0), neg_inf)),
        "where(pad & other, s, -inf)": lambda: b.add("where", b.add("logical_and", pad, other), s, neg_inf),
        "where(~(other & pad), -inf, s)": lambda: b.add("where", b.add("logical_not", b.add("logical_and", other, pad)), neg_inf, s),
        "s + bias": lambda: b.add("add", s, pad),
        "s + where(pad, 0, finfo.min)": lambda: b.add("add", s, b.add("where", pad, b.const(0.0), b.const(torch.finfo(torch.float32).min))),
        "s + where((kv_idx <= q_idx) & pad, 0, finfo.min)": lambda: b.add("add", s, b.add(
            "where", b.add("logical_and", b.add("le", b.add("kv_idx"), b.add("q_idx")), pad), b.const(0.0),
            b.const(torch.finfo(torch.float32).min))),
        "where(~((kv_idx <= q_idx) & pad), -inf, s)": lambda: b.add("where", b.add("logical_not", b.add(
            "logical_and", b.add("le", b.add("kv_idx"), b.add("q_idx")), pad)), neg_inf, s),
        "where((q_idx + 3 > kv_idx) & pad, s, -inf)": lambda: b.add("where", b.add("logical_and", b.add(
            "gt", b.add("add", b.add("q_idx"), b.const(3)), b.add("kv_idx")), pad), s, neg_inf),
        "where((kv_idx > q_idx) | ~pad, -inf, s)": lambda: b.add("where", b.add("logical_or", b.add(
            "gt", b.add("kv_idx"), b.add("q_idx")), b.add("logical_not", pad)), neg_inf, s),
        "where((kv_idx + 4 <= q_idx + 6) & pad, s, -inf)": lambda: b.add("where", b.add("logical_and", b.add(
            "le", b.add("add", b.add("kv_idx"), b.const(4)), b.add("add", b.add("q_idx"), b.const(6))), pad), s,
            neg_inf),
        "where((kv_idx <= q_idx) | other, s, -inf) + where(pad, 0, -inf)": lambda: b.add("add", b.add(
            "where", b.add("logical_or", b.add("le", b.add("kv_idx"), b.add("q_idx")), other), s, neg_inf),
            b.add("where", pad, b.const(0.0), neg_inf)),
        "where(pad | other, s, -inf)": lambda: b.add("where", b.add("logical_or", pad, other), s, neg_inf),
        "s * bias": lambda: b.add("mul", s, pad),
    }[form]()
    role = "bias" if "bias" in form else "mask"
    tensors = (ScoreTensor(role, "float32" if role == "bias" else "bool", (False, True, True, False)),
               ScoreTensor("mask", "bool", (True, True, False, False)))
    tensors = tensors if "other" in form else tensors[:1]  # every tensor of a spec is loaded by its program
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, score_program=b.program(root),
                         score_tensors=tensors, empty_rows="zero")
    assert plan.key_padding(spec) == padding
    # rows of no key give NaN in eager's softmax: only the "masking" kind, which leaves such rows all their keys
    assert plan.key_padding(dataclasses.replace(spec, empty_rows="nan")) == nan_rows_padding
    # under a sliding window a row may see only keys past the last visible one: no "masking" range then; a band in the
    # program is read only in a spec without a causal mask of its own
    windowed = plan.key_padding(dataclasses.replace(spec, causal=CausalMask(window=4)))
    assert windowed == ((*padding[:3], None) if padding and padding[2] == "-inf" else None)
    # a [Z, 1, M, N] tensor is no padding vector
    per_query = (dataclasses.replace(tensors[0], broadcast=(False, True, False, False)), *tensors[1:])
    assert plan.key_padding(dataclasses.replace(spec, score_tensors=per_query)) is None


def _document_program(b, s, t):
    """where((ids_q == ids_k) & (kv_idx <= q_idx), s + bias + pos_k * pos_k / 100, -inf): packed documents from
    integer vectors, and integer arithmetic on a key's position in its document that overflows 8 bits (19 * 19)
    unless computed as torch computes it (t: the ids per query row and per key column, the positions, the bias)."""
    same_document = b.add("eq", t[0], t[1])
    causal = b.add("le", b.add("kv_idx"), b.add("q_idx"))
    x = b.add("add", b.add("add", s, t[3]), b.add("div", b.add("mul", t[2], t[2]), b.const(100)))
    return b.add("where", b.add("logical_and", same_document, causal), x, b.const(float("-inf")))


@pytest.mark.parametrize("row_dtype, column_dtype", [(torch.int64, torch.int32), (torch.int16, torch.uint8),
                                                     (torch.int8, torch.int64)])
@pytest.mark.parametrize("interpret", ["1", "0"])
def test_integer_vectors(row_dtype, column_dtype, interpret, monkeypatch):
    """Document ids read per query row and per key column as integer score tensors of any integer dtype, compared and
    computed with in the score program (forward and backward: the ids need no gradient, the bias next to them gets
    one), on the kernels and the blockwise path; unsorted ids and an id that comes back after another."""
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    Z, H, L, D = 2, 2, 37, 16
    g = torch.Generator().manual_seed(5)
    lengths = [[9, 12, 16], [5, 20, 12]]
    documents = torch.tensor([[0] * 9 + [17] * 12 + [1] * 16, [2] * 5 + [0] * 20 + [2] * 12])  # [Z, L]
    positions = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in lengths])
    q, k, v = (torch.randn(Z, H, L, D, generator=g) for _ in range(3))
    bias = torch.randn(1, H, 1, L, generator=g).requires_grad_(True)
    tensors = [documents.to(row_dtype)[:, None, :, None], documents.to(column_dtype)[:, None, None, :],
               positions.to(column_dtype)[:, None, None, :], bias]
    infos = tuple(ScoreTensor(role, str(t.dtype).removeprefix("torch."), tuple(n == 1 for n in t.shape))
                  for role, t in zip(("int", "int", "int", "bias"), tensors))
    b = ScoreProgramBuilder()
    loads = [b.load(0, "int"), b.load(1, "int"), b.load(2, "int"), b.load(3, "float")]
    spec = AttentionSpec(dtype="float32", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                         score_program=b.program(_document_program(b, b.add("score"), loads)), score_tensors=infos)
    run_and_check(q, k, v, tensors, spec, torch.float32)
    one_document = [torch.zeros_like(t) for t in tensors[:2]] + tensors[2:]
    assert not torch.allclose(flash_attention(q, k, v, spec, tensors), flash_attention(q, k, v, spec, one_document))


def test_integer_vectors_are_no_padding_and_need_an_integer_dtype():
    b = ScoreProgramBuilder()
    s = b.add("score")
    program = b.program(b.add("add", s, b.add("to_float", b.load(0, "int"))))
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, score_program=program,
                         score_tensors=(ScoreTensor("int", "int64", (False, True, True, False)),), empty_rows="zero")
    assert plan.key_padding(spec) is None  # an integer is never -inf: keys it is added to are not hidden by it
    with pytest.raises(UnsupportedSpec, match="int tensor of dtype float32"):
        dataclasses.replace(spec, score_tensors=(ScoreTensor("int", "float32", (False, True, True, False)),))
