"""The split-K decode forward (fuse_attn/kernels/decode.py) in Triton's interpreter, against the fp64
reference under the 2x rule of test_kernels; its combine with fully masked splits; the dispatch rule; and the
bad inputs of generation (an empty cache, q_len > k_len with a causal offset, a changing batch size)."""

import os

import dataclasses
import logging
import math

import pytest
import torch

from fuse_attn.kernels import plan
from fuse_attn.kernels.generated import codegen, decode

from fuse_attn.kernels import flash_attention, reference_attention
from fuse_attn.spec import AttentionSpec, CausalMask
from fuse_attn.score_program import ScoreProgramBuilder, ScoreTensor
from tests.support.cases import DTYPE_NAME, alibi, index_leaves, make_case
from tests.support.numerics import assert_close_2x

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning")
BOTTOM_RIGHT = CausalMask(alignment="bottom_right")
# An H100's SM count: under the interpreter the op has no GPU to fill; tests that go through the op's dispatch
# give it this one.
H100_SMS = 132

# (make_case kwargs, number of splits asked for): q_len 1, 2, 5; k_len 1, 17, 97, 300; head dims 16, 80, 128;
# GQA 1 and 4; causal (bottom-right, as a KV cache's), a sliding window, softcap, a bias tensor, a padding mask,
# ALiBi slopes, every index leaf (head, batch, lengths) of the score program.
CASES = {
    "q1_k1": (dict(M=1, N=1, D=16), 2),
    "q1_k17_d80_gqa4": (dict(M=1, N=17, D=80, H=4, gqa=4), 2),
    "q1_k300_d128_gqa4_causal": (dict(M=1, N=300, D=128, H=4, gqa=4, causal=BOTTOM_RIGHT), 5),
    "q2_k97_gqa4_causal_softcap": (dict(M=2, N=97, D=16, H=4, gqa=4, causal=BOTTOM_RIGHT, softcap=20.0), 3),
    "q5_k97_d80_bias": (dict(M=5, N=97, D=80, H=2, bias=(1, 2, 5, 97)), 3),
    "q5_k300_gqa4_padding_mask": (dict(Z=2, M=5, N=300, D=16, H=4, gqa=4, mask=(2, 1, 1, 300)), 4),
    # the window's keys [76, 97): the splits start at key 64 (rounded down to the interpreter's BLOCK_N of 16)
    "q2_k97_d128_window": (dict(M=2, N=97, D=128, H=2, causal=CausalMask(alignment="bottom_right", window=20)), 2),
    "q1_k17_window": (dict(M=1, N=17, D=16, H=2, causal=CausalMask(alignment="bottom_right", window=6)), 2),
    "q1_k97_gqa4_alibi": (dict(M=1, N=97, D=16, H=8, gqa=4, program=alibi, biases=[(1, 8, 1, 1)]), 3),
    "q5_k97_gqa4_index_leaves": (dict(Z=2, M=5, N=97, D=16, H=4, gqa=4, program=index_leaves, mask=(2, 1, 5, 97)), 3),
    "q5_k300_fp16_gqa4_causal_bias": (dict(M=5, N=300, D=80, H=4, gqa=4, causal=BOTTOM_RIGHT, bias=(1, 4, 1, 300),
                                           dtype=torch.float16), 4),
}


def _inputs(kw):
    q, k, v, tensors, spec = make_case(**kw)
    return q, k, v, [t.detach() for t in tensors], spec


def _fp64(tensors):
    return [t.double() if t.is_floating_point() else t for t in tensors]


def assert_lse_close(lse, ref_lse, eager_lse, dtype):
    """The 2x rule on the finite entries; -inf (rows that see no key) exactly where the reference has it."""
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "rows with lse -inf differ"
    finite = ~torch.isneginf(ref_lse)
    assert_close_2x("lse", lse[finite], ref_lse[finite], eager_lse[finite], dtype)


# Kernels on CPU tensors run in Triton's interpreter, which must be chosen before triton is imported (conftest.py
# sets TRITON_INTERPRET=1 unless the session set it; a GPU session with TRITON_INTERPRET=0 runs the cuda tests).
needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="needs a TRITON_INTERPRET=1 session")


@needs_interpreter
@pytest.mark.parametrize("name", CASES)
def test_split_k_matches_reference(name):
    kw, splits = CASES[name]
    dtype = kw.get("dtype", torch.float32)
    q, k, v, tensors, spec = _inputs(kw)
    out, lse = decode.triton_forward(q, k, v, tensors, spec, splits)
    ref, ref_lse = reference_attention(q.double(), k.double(), v.double(), _fp64(tensors), spec)
    eager, eager_lse = reference_attention(q, k, v, tensors, spec)
    assert out.shape == ref.shape and out.dtype == dtype and lse.dtype == torch.float32
    assert_close_2x("out", out, ref, eager, dtype)
    assert_lse_close(lse, ref_lse, eager_lse, dtype)


@needs_interpreter
def test_q_len_above_k_len_with_causal_offset():
    # bottom-right causal with M > N: the first M - N rows see no key (out NaN, lse -inf, as eager and the
    # forward kernel give); a negative diagonal on top leaves every row of the last split empty.
    for causal in (BOTTOM_RIGHT, CausalMask(diagonal=-2, alignment="bottom_right")):
        q, k, v, tensors, spec = _inputs(dict(M=5, N=3, D=16, H=4, gqa=4, causal=causal))
        out, lse = decode.triton_forward(q, k, v, tensors, spec, 2)
        ref, ref_lse = reference_attention(q.double(), k.double(), v.double(), [], spec)
        eager, eager_lse = reference_attention(q, k, v, [], spec)
        assert torch.isnan(out[:, :, :2]).all()
        assert_close_2x("out", out, ref, eager, torch.float32)
        assert_lse_close(lse, ref_lse, eager_lse, torch.float32)
        # the same rows of an SDPA call (spec.empty_rows "zero") are 0, as SDPA gives
        zero_rows = dataclasses.replace(spec, empty_rows="zero")
        out, lse = decode.triton_forward(q, k, v, tensors, zero_rows, 2)
        ref, ref_lse = reference_attention(q.double(), k.double(), v.double(), [], zero_rows)
        eager, eager_lse = reference_attention(q, k, v, [], zero_rows)
        assert (out[:, :, :2] == 0).all() and (ref[:, :, :2] == 0).all()
        assert_close_2x("out", out, ref, eager, torch.float32)
        assert_lse_close(lse, ref_lse, eager_lse, torch.float32)


@needs_interpreter
def test_combine_with_fully_masked_splits():
    # The combine kernel on hand-made partials: split 1 of every row is empty (lse -inf, out 0), row 2 has only
    # empty splits (out NaN, lse -inf), 40 splits cross the combine's 16-split steps.
    Z, H, M, S, DV = 1, 2, 3, 40, 24
    g = torch.Generator().manual_seed(0)
    out_part = torch.randn(Z * H * M, S, DV, generator=g)
    lse_part = torch.randn(Z * H * M, S, generator=g) * 5
    out_part[:, 1], lse_part[:, 1] = 0.0, float("-inf")
    out_part[2], lse_part[2] = 0.0, float("-inf")
    out = torch.empty(Z, H, M, DV)
    lse = torch.empty(Z, H, M)
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=DV, scale=0.25)
    decode.combine(codegen.load_module(spec, codegen.DECODING_TEMPLATE_NAME), out_part, lse_part, out, lse)
    want, want_lse = decode.combine_reference(out_part.double(), lse_part.double())
    assert torch.isnan(out.reshape(-1, DV)[2]).all() and torch.isneginf(lse.reshape(-1)[2])
    ok = torch.arange(Z * H * M) != 2
    assert torch.allclose(out.reshape(-1, DV)[ok].double(), want[ok], atol=1e-5)
    assert torch.allclose(lse.reshape(-1)[ok].double(), want_lse[ok], atol=1e-5)
    # the same weights by hand for one row
    w = torch.softmax(lse_part[0].double(), 0)
    assert torch.allclose(out.reshape(-1, DV)[0].double(), (w[:, None] * out_part[0].double()).sum(0), atol=1e-5)


@needs_interpreter
def test_padding_mask_empties_whole_splits():
    # Batch 0's first 64 keys are padding (masked with -inf): 4 splits of 97 keys in tiles of 16 (the interpreter's
    # BLOCK_N) are [0, 32), [32, 64), [64, 96), [96, 97), so its first two splits see no key at all; the kernel and
    # the plain-PyTorch split-K both combine them away.
    def padding(b, s, t):
        return b.add("where", t[0], s, b.const(float("-inf")))

    q, k, v, _, spec = _inputs(dict(Z=2, M=1, N=97, D=16, H=4, gqa=4, mask=(2, 1, 1, 97), program=padding))
    mask = torch.ones(2, 1, 1, 97, dtype=torch.bool)
    mask[0, ..., :64] = False
    out, lse = decode.triton_forward(q, k, v, [mask], spec, 4)
    ref, ref_lse = reference_attention(q.double(), k.double(), v.double(), [mask], spec)
    eager, eager_lse = reference_attention(q, k, v, [mask], spec)
    assert_close_2x("out", out, ref, eager, torch.float32)
    assert_lse_close(lse, ref_lse, eager_lse, torch.float32)
    bounds = [0, 32, 64, 96, 97]
    split_out, split_lse, _, lse_part = decode.split_reference(q.double(), k.double(), v.double(), [mask], spec, bounds)
    assert torch.isneginf(lse_part[0, :, :, :2]).all() and not torch.isneginf(lse_part[1]).any()
    assert torch.allclose(split_out, ref) and torch.allclose(split_lse, ref_lse.double())


@needs_interpreter
@pytest.mark.parametrize("form", ["keep", "band + fill"])
@pytest.mark.parametrize("M", [1, 2])
def test_left_padded_cache_is_not_read(form, M):
    """A KV cache of 97 keys whose batch rows are left-padded by 70, 40 and 0 keys, or hold one key (or none, for
    SDPA's form): SDPA's bool padding (rows of no key give 0), or Hugging Face's eager padding + causal mask, the band
    in the program at a finfo.min-style fill (-65504). K and V hold NaN in the 16-key blocks (the interpreter's BLOCK_N) before each
    row's first visible key -- for the fill form only in rows whose queries all keep a visible key -- which a read
    block would spread into the output: the result must be the fp64 reference's, output and lse (2x rule)."""
    H, N, D, gqa = 4, 97, 16, 2
    rows = [torch.arange(N) >= 70, torch.arange(N) >= 40, torch.ones(N, dtype=torch.bool), torch.arange(N) == 50]
    if form == "keep":  # (the fill form's row of no key is uniform over -65504 + s, its result made by rounding)
        rows.append(torch.zeros(N, dtype=torch.bool))
    keys = torch.stack(rows)
    Z = len(keys)
    fill = torch.finfo(torch.float16).min
    b = ScoreProgramBuilder()
    pad, s = b.add("load", value=0), b.add("score")
    if form == "keep":
        root = b.add("where", pad, s, b.const(float("-inf")))
    else:  # the last query sees every key: the band kv_idx <= q_idx + N - M
        band = b.add("le", b.add("kv_idx"), b.add("add", b.add("q_idx"), b.const(N - M)))
        root = b.add("add", s, b.add("where", b.add("logical_and", band, pad), b.const(0.0), b.const(fill)))
    spec = AttentionSpec(dtype="float32", head_dim=D, head_dim_v=D, scale=0.25, score_program=b.program(root),
                         score_tensors=(ScoreTensor("mask", "bool", (False, True, True, False)),), gqa_group=gqa,
                         empty_rows="zero" if form == "keep" else "nan")
    assert plan.key_padding(spec) is not None
    g = torch.Generator().manual_seed(0)
    q = torch.randn(Z, H, M, D, generator=g)
    k, v = (torch.randn(Z, H // gqa, N, D, generator=g) for _ in range(2))
    k_nan, v_nan = k.clone(), v.clone()
    for z in range(Z):
        hit = keys[z].nonzero()
        if len(hit):  # every row keeps a visible key (the fill form's band reaches the first one from query 0)
            unread = int(hit[0]) // 16 * 16
            k_nan[z, :, :unread] = float("nan")
            v_nan[z, :, :unread] = float("nan")
    assert k_nan.isnan().any()
    mask = keys[:, None, None, :]
    out, lse = decode.triton_forward(q, k_nan, v_nan, [mask], spec, 4)
    ref, ref_lse = reference_attention(q.double(), k.double(), v.double(), [mask], spec)
    eager, eager_lse = reference_attention(q, k, v, [mask], spec)
    assert not out.isnan().any()
    assert_close_2x("out", out, ref, eager, torch.float32)
    assert_lse_close(lse, ref_lse, eager_lse, torch.float32)


# ---- the dispatch rule ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rows, n_keys, batch_kv_heads, sms, want", [
    (4, 4096, 8, H100_SMS, 16),  # LLaMA-8B-like decode: 8 kv heads fill 8 of 132 SMs; 16 splits of 256 keys
    (1, 4096, 32, H100_SMS, 4),  # MHA 32 heads: 4 splits make 128 programs (0.97 of one wave)
    (4, 128, 8, H100_SMS, 1),  # one MIN_KEYS_PER_SPLIT of keys: nothing to split
    (4, 0, 8, H100_SMS, 1),  # no visible key (q_len > k_len under a causal offset)
    (4, 300, 2, H100_SMS, 3),  # three 128-key blocks, one split each
    (4, 1 << 20, 1, H100_SMS, 110),  # up to MAX_SPLITS: 128 (0.97 of a wave) is best, 110 the first within 0.85 of it
    (4, 1 << 20, 1, 16, 14),  # up to one split per SM: 14 of 16 SMs is within 0.85 of a full wave
    (4, 4096, 106, H100_SMS, 1),  # 106 >= 0.8 * 132 programs already fill the GPU
    (65, 4096, 8, H100_SMS, 1),  # more packed rows than MAX_ROWS: the forward kernel's query blocks
    (64, 4096, 8, H100_SMS, 16),
    (4, 4096, 8, None, 1),  # no GPU (the interpreter): never by itself
])
def test_num_splits(rows, n_keys, batch_kv_heads, sms, want):
    assert decode.num_splits(rows, n_keys, batch_kv_heads, sms) == want


def test_num_splits_wave_efficiency():
    # Each choice is within EFFICIENCY_SLACK of the best wave efficiency of the split counts that change the keys
    # per split, and no smaller such count is; there is at most one split per MIN_KEYS_PER_SPLIT keys.
    for bkv in (1, 3, 8, 20, 64, 100):
        for n in (200, 1000, 4096, 32768):
            s = decode.num_splits(4, n, bkv, H100_SMS)
            blocks = math.ceil(n / 128)
            counts = [c for c in range(1, min(128, blocks) + 1) if c == 1 or -(-blocks // c) != -(-blocks // (c - 1))]
            eff = {c: bkv * c / H100_SMS / math.ceil(bkv * c / H100_SMS) for c in counts}
            good = [c for c in counts if eff[c] >= decode.EFFICIENCY_SLACK * max(eff.values())]
            assert s == (good[0] if bkv < 0.8 * H100_SMS else 1), (bkv, n, s)
            assert s <= blocks


def test_visible_key_range():
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=1.0,
                         causal=CausalMask(alignment="bottom_right", window=100))
    assert decode.visible_key_range(spec, 1, 1000) == (900, 1000)  # a window: only its keys are split
    assert decode.visible_key_range(spec, 4, 50) == (0, 50)
    top_left = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=1.0, causal=CausalMask())
    assert decode.visible_key_range(top_left, 2, 1000) == (0, 2)
    empty = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=1.0, causal=CausalMask(diagonal=-5))
    assert decode.visible_key_range(empty, 2, 10) == (0, 0)


@pytest.fixture
def gpu_sized(monkeypatch):
    """The op's dispatch as on an H100, and a record of the split counts it launched."""
    monkeypatch.setattr(decode, "sm_count", lambda device: H100_SMS)
    launched = []
    real = decode.triton_forward

    def spy(q, k, v, tensors, spec, splits):
        launched.append(splits)
        return real(q, k, v, tensors, spec, splits)

    monkeypatch.setattr(decode, "triton_forward", spy)
    return launched


@needs_interpreter
def test_op_dispatches_decode_shapes_and_changing_batch(gpu_sized):
    # Through the op, as a compiled model calls it: a decode step (q_len 1, GQA 4) takes split-K, with the batch
    # changing between calls of one spec; a long query takes the forward kernel.
    for Z in (1, 3, 2):
        q, k, v, tensors, spec = _inputs(dict(Z=Z, M=1, N=300, D=16, H=4, gqa=4, causal=BOTTOM_RIGHT, seed=Z))
        out, lse = flash_attention(q, k, v, spec, return_lse=True)
        ref, ref_lse = reference_attention(q.double(), k.double(), v.double(), [], spec)
        eager, eager_lse = reference_attention(q, k, v, [], spec)
        assert_close_2x("out", out, ref, eager, torch.float32)
        assert_lse_close(lse, ref_lse, eager_lse, torch.float32)
    assert gpu_sized == [3, 3, 3]
    q, k, v, _, spec = _inputs(dict(M=65, N=300, D=16, H=2))
    flash_attention(q, k, v, spec)
    assert gpu_sized == [3, 3, 3]


@needs_interpreter
def test_op_empty_kv_cache(gpu_sized):
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, gqa_group=2, causal=BOTTOM_RIGHT)
    q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 0, 16), torch.randn(2, 2, 0, 16)
    out, lse = flash_attention(q, k, v, spec, return_lse=True)
    assert torch.equal(out, torch.zeros(2, 4, 1, 16)) and torch.isneginf(lse).all()
    assert gpu_sized == []


@needs_interpreter
def test_dropout_falls_back_with_a_logged_reason(gpu_sized, caplog):
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, dropout_p=0.1)
    q, k = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 1000, 16)
    with caplog.at_level(logging.INFO, logger="fuse_attn.kernels.generated.decode"):
        decode._logged.clear()
        assert decode.dispatch_splits(q, k, spec) == 1
        assert decode.dispatch_splits(q, k, spec) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "split-K decode not used: dropout_p 0.1 (the split kernel draws no dropout mask); running the ordinary "
        "forward kernel"]
    assert decode.dispatch_splits(q, k, dataclasses.replace(spec, dropout_p=0.0)) == 8


def test_generated_source_shares_the_forward_score_program():
    _, _, _, _, spec = make_case(M=1, N=17, D=16, H=4, gqa=4, softcap=30.0, bias=(1, 4, 1, 17))
    source = codegen.generate_decoding_source(spec)
    forward = codegen.generate_source(spec)
    program = [line.strip() for line in source.splitlines() if line.strip().startswith("sm_")]
    assert program and all(line in forward for line in program)
    assert "{{" not in source
    assert source.count("def _dot(") == 1 and source.count("def _mask_tile(") == 1
    assert DTYPE_NAME[torch.float32] in source  # the spec's description heads the file


# ---- on a GPU: TRITON_INTERPRET=0 python -m pytest -q tests/kernels/test_decode.py -k cuda -------------------------
# Absolute floor of the 2x rule in bf16 (as tests/support/numerics.py's FLOOR): about one unit in the last place of ~1.
BF16_FLOOR = 8e-3
CUDA_CASES = {
    # LLaMA-3-8B-like decode (32 query heads of 128, GQA 4) and a Mistral-like window, a Gemma-2-like softcap with a
    # padding mask (batch 4), speculative decoding (q_len 4, GQA 8 -> 32 packed rows), MHA at 16k.
    "llama_q1_k4097": dict(Z=1, M=1, N=4097, D=128, H=32, gqa=4, causal=BOTTOM_RIGHT),
    "mistral_window_q1_k8192": dict(Z=2, M=1, N=8192, D=128, H=32, gqa=4,
                                    causal=CausalMask(alignment="bottom_right", window=4096)),
    "gemma_softcap_padding_q1_k1000": dict(Z=4, M=1, N=1000, D=256, H=8, gqa=2, softcap=50.0, mask=(4, 1, 1, 1000)),
    "speculative_q4_k2048_gqa8": dict(Z=1, M=4, N=2048, D=128, H=32, gqa=8, causal=BOTTOM_RIGHT),
    "mha_q1_k16384_d64": dict(Z=1, M=1, N=16384, D=64, H=16, gqa=1, causal=BOTTOM_RIGHT),
}


def _assert_close_2x_bf16(name, ours, ref, eager):
    from tests.support.numerics import nan_safe_err

    err, err_eager = nan_safe_err(ours, ref), nan_safe_err(eager, ref)
    assert err <= 2 * err_eager + BF16_FLOOR, f"{name}: max|ours-ref|={err:.3g} > 2*{err_eager:.3g} + {BF16_FLOOR}"


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="needs a CUDA GPU and a TRITON_INTERPRET=0 session")
@pytest.mark.parametrize("name", CUDA_CASES)
def test_cuda_decode_bf16_takes_split_k(name, monkeypatch):
    from fuse_attn.kernels.generated.launch import triton_forward as forward_kernel

    launched = []
    real = decode.triton_forward
    monkeypatch.setattr(decode, "triton_forward", lambda *a: launched.append(a[-1]) or real(*a))
    q, k, v, tensors, spec = _inputs(CUDA_CASES[name])
    spec = dataclasses.replace(spec, dtype="bfloat16")
    q, k, v = (t.cuda().bfloat16() for t in (q, k, v))
    tensors = [t.cuda() for t in tensors]
    out, lse = flash_attention(q, k, v, spec, tensors, return_lse=True)
    assert launched and launched[0] > 1, "the op did not take split-K"
    ref, ref_lse = reference_attention(q.double(), k.double(), v.double(), _fp64(tensors), spec)
    eager, eager_lse = reference_attention(q, k, v, tensors, spec)
    _assert_close_2x_bf16("out", out, ref, eager)
    _assert_close_2x_bf16("lse", lse, ref_lse, eager_lse)
    # the same fp32 arithmetic as the forward kernel on the same bf16 inputs, in another order of the keys
    forward_out, forward_lse = forward_kernel(q, k, v, tensors, spec)
    assert torch.allclose(lse, forward_lse, atol=1e-4, rtol=1e-5)
    _assert_close_2x_bf16("out vs the forward kernel", out, ref, forward_out)


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="needs a CUDA GPU and a TRITON_INTERPRET=0 session (the interpreter takes minutes here)")
def test_cuda_generate_with_a_kv_cache_takes_split_k(monkeypatch):
    # Hugging Face generate on a small LLaMA (GQA 2) in fp32 with its dynamic KV cache, model.forward compiled
    # with fuse_attn: the decode steps (q_len 1, k_len growing past 300) take split-K, and the greedy tokens and the
    # last logits equal eager attention's -- for a batch of 1 and then of 3 through the same compiled forward.
    T = pytest.importorskip("transformers")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    launched = []
    real = decode.triton_forward
    monkeypatch.setattr(decode, "triton_forward", lambda *a: launched.append(a[-1]) or real(*a))
    config = T.LlamaConfig(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                           num_hidden_layers=2, vocab_size=128, max_position_embeddings=512,
                           attn_implementation="eager")
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(config).cuda().eval()
    eager_forward = model.forward
    compiled_forward = torch.compile(model.forward, backend="fuse_attn")
    torch._dynamo.reset()
    for batch in (1, 3):
        ids = torch.randint(0, 128, (batch, 300), generator=torch.Generator().manual_seed(batch)).cuda()
        runs = {}
        for name, forward in (("eager", eager_forward), ("fused", compiled_forward)):
            model.forward = forward
            with torch.no_grad():
                runs[name] = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                                            min_new_tokens=8, do_sample=False, pad_token_id=0,
                                            output_logits=True, return_dict_in_generate=True)
        assert torch.equal(runs["fused"].sequences, runs["eager"].sequences)
        assert torch.allclose(runs["fused"].logits[-1], runs["eager"].logits[-1], atol=1e-4)
    model.forward = eager_forward
    # 2 layers x 7 decode steps per generate (the prefill has q_len 300: the forward kernel)
    assert len(launched) == 28 and all(s > 1 for s in launched), launched
