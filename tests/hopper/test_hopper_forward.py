"""The Gluon forward of plain attention on Hopper (fuse_attn/kernels/hopper/forward.py, its shared parts in
common.py).

Which specs it takes (``hopper_reasons``) and the op's wiring run on the CPU: there the op runs the generated forward,
and its autograd formula is the template's backward. The kernel itself needs an sm90 GPU: output, lse and the
gradients of q, k, v (through the template's backward, fed this forward's out and lse) against fp64 under the 2x
rule, at lengths that are no multiple of a tile (1, 17, 97, 1025), head dims 64 and 128, GQA, fp16 and bf16, and
q / k / v as strided views of a [Z, N, H, D] projection. Its compile for sm90 runs without a GPU too, in
test_gpu_compile.py.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import triton
from torch._subclasses.fake_tensor import FakeTensorMode

from fuse_attn.kernels.hopper import common as hopper_common, forward as hopper_forward

from fuse_attn.kernels import reference_attention
from fuse_attn.kernels.hopper.common import hopper_reasons
from fuse_attn.kernels.hopper.forward import flash_attention_hopper
from fuse_attn.spec import AttentionSpec, CausalMask
from fuse_attn.score_program import ScoreNode, ScoreTensor, UnsupportedSpec
from tests.support.fuzz_cases import BIAS_PROGRAM
from tests.support.gluon_op import fake_qk, gluon_compile_trains_as_eager, gluon_op_matches_fp64, hopper
from tests.support.numerics import assert_close_2x

PLAIN = AttentionSpec(dtype="bfloat16", head_dim=128, head_dim_v=128, scale=128 ** -0.5)


# a precomputed ALiBi-style bias [1, H, M, N] added to the scores: what the Gluon kernels load (a [Z, 1, 1, N] one, a
# key padding bias, they take as its vector: test_hopper_key_padding.py)
ALIBI = dict(score_program=BIAS_PROGRAM, score_tensors=(ScoreTensor("bias", "bfloat16", (True, False, False, False)),))


# score programs the Gluon kernels apply to every score (SCORED): a tanh softcap (Gemma-2, Grok) and ALiBi from per-head
# slopes and the indices (BLOOM, MPT)
SOFTCAP = dict(score_program=(ScoreNode("score"), ScoreNode("tanh", (0,)), ScoreNode("const", value=30.0),
                              ScoreNode("mul", (1, 2))))
ALIBI_FROM_SLOPES = dict(score_program=(ScoreNode("score"), ScoreNode("load", value=0), ScoreNode("kv_idx"),
                                        ScoreNode("q_idx"), ScoreNode("sub", (2, 3)), ScoreNode("mul", (1, 4)),
                                        ScoreNode("add", (0, 5))),
                         score_tensors=(ScoreTensor("bias", "float32", (True, False, True, True)),))


@pytest.mark.parametrize("change, qk, reason", [
    ({"dtype": "float32"}, {"dtype": torch.float32}, "fp16/bf16"),
    ({"score_program": (ScoreNode("score"), ScoreNode("exp", (0,)))}, {}, "plain attention, add one bias"),
    ({"score_program": (ScoreNode("score"), ScoreNode("load", value=0), ScoreNode("div", (0, 1))),  # a divisor read
      "score_tensors": (ScoreTensor("bias", "float32", (True, False, True, True)),)}, {}, "plain attention"),
    ({"score_program": (ScoreNode("score"), ScoreNode("const", value=0.0), ScoreNode("div", (0, 1)))}, {},
     "plain attention"),  # (a division by zero)
    ({"score_program": (ScoreNode("score"), ScoreNode("const", value=float("-inf")), ScoreNode("add", (0, 1)))}, {},
     "plain attention"),  # (a constant that hides every key)
    ({"score_program": (ScoreNode("score"), ScoreNode("load", value=0), ScoreNode("mul", (0, 1))),
      "score_tensors": (ScoreTensor("bias", "bfloat16", (True, False, False, False)),)}, {}, "add one bias"),
    ({"score_program": BIAS_PROGRAM, "causal": CausalMask(),  # (a padding bias alone: test_hopper_key_padding.py)
      "score_tensors": (ScoreTensor("bias", "bfloat16", (False, True, True, False)),)}, {}, "skip per call"),
    ({"dropout_p": 0.1}, {}, "no dropout"),
    ({"head_dim": 96, "head_dim_v": 96}, {"head_dim": 96}, "head dims 64/64, 128/128, 192/128, not 96/96"),
    ({"head_dim_v": 64}, {}, "not 128/64"),
    ({"head_dim": 192, "scale": 192 ** -0.5, **ALIBI}, {"head_dim": 192}, "run no score program at head dims 192/128"),
    ({"causal": CausalMask(window=16), **ALIBI}, {}, "sliding window only over the plain scores"),
    ({"causal": CausalMask(diagonal=1)}, {}, "plain diagonal"),
    ({"causal": CausalMask()}, {"q_len": 1}, "equal lengths"),
])
def test_hopper_reasons(change, qk, reason, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert hopper_reasons(PLAIN, *fake_qk()) == []
    assert hopper_reasons(dataclasses.replace(PLAIN, causal=CausalMask(), gqa_group=2), *fake_qk()) == []
    assert hopper_reasons(PLAIN, *fake_qk(q_len=1, kv_len=1000)) == []  # lengths may differ without a mask
    assert hopper_reasons(dataclasses.replace(PLAIN, causal=CausalMask(), **ALIBI), *fake_qk()) == []
    assert hopper_reasons(dataclasses.replace(PLAIN, causal=CausalMask(window=16), gqa_group=2), *fake_qk()) == []
    for program in (SOFTCAP, ALIBI_FROM_SLOPES):
        assert hopper_reasons(dataclasses.replace(PLAIN, causal=CausalMask(window=16), **program), *fake_qk()) == []
    reasons = hopper_reasons(dataclasses.replace(PLAIN, **change), *fake_qk(**qk))
    assert len(reasons) == 1 and reason in reasons[0], reasons


def test_the_kernels_take_mla_head_dims(monkeypatch):
    """DeepSeek-V3's q / k 192 with v 128 (fake_qk gives v q's head dim; hopper_reasons reads the spec's)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    mla = dataclasses.replace(PLAIN, head_dim=192, scale=192 ** -0.5, causal=CausalMask())
    assert hopper_reasons(mla, *fake_qk(head_dim=192)) == []


def test_hopper_reasons_name_the_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    reasons = hopper_reasons(PLAIN, *fake_qk())
    assert len(reasons) == 1 and "Hopper (sm90)" in reasons[0], reasons
    q, k = (torch.empty(1, 1, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    assert "Hopper (sm90)" in hopper_reasons(PLAIN, q, k)[0]


def test_every_config_has_a_register_split_within_an_sm():
    """setmaxnreg asks for registers a warpgroup at a time: consumers' and producer's budgets must fit what the CTA
    holds -- the 65536 registers of an SM, or its share where CTAs share one (launched with fewer registers a thread:
    256 threads, the producer's warp padded to a warpgroup) -- 128 lanes a warpgroup (a split that does not fit would
    stall the CTA, not fail); and the CTAs an SM must fit its shared memory."""
    configs = [*((d, c) for d, c in hopper_forward._CONFIGS.items()),
               *((d, c) for d, (_, c) in hopper_forward._SHORT_CAUSAL_CONFIGS.items()),
               *((d, c) for d, c in hopper_forward._BIAS_TMA_CONFIGS.items())]
    for head_dim, (block_m, block_n, stages, consumers) in configs:
        consumer_regs, producer_regs = hopper_forward.register_split(head_dim, consumers)
        ctas = hopper_forward.resident_ctas(head_dim, consumers)
        launch = hopper_forward.launch_registers(ctas)
        held = 65536 if launch is None else launch * 128 * (consumers + 1)
        assert (consumers * consumer_regs + producer_regs) * 128 <= held, (head_dim, consumers)
        assert ctas * held <= 65536 and consumer_regs % 8 == 0 and producer_regs >= 24, (head_dim, consumers)
        head_dim_v = dict(hopper_common.HEAD_DIMS)[head_dim]
        tiles = ((consumers * block_m + stages * block_n) * head_dim + stages * block_n * head_dim_v) * 2  # q, and
        # k and v's ring, 2-byte
        assert tiles <= hopper_common.shared_memory_for_tiles(ctas), (head_dim, consumers, ctas)
    assert [hopper_forward.resident_ctas(d, 1) for d in (64, 128)] == [3, 2]  # (what the short configs were timed at)
    assert [hopper_forward.register_split(d, 1) for d in (64, 128)] == [(136, 24), (232, 24)]
    # causal rows below each head dim's crossover take the short config; the rest the head dim's
    for head_dim, (below, config) in hopper_forward._SHORT_CAUSAL_CONFIGS.items():
        assert hopper_forward.forward_config(head_dim, True, below - 1) == config
        assert hopper_forward.forward_config(head_dim, True, below) == hopper_forward._CONFIGS[head_dim]
        assert hopper_forward.forward_config(head_dim, False, 1024) == hopper_forward._CONFIGS[head_dim]
        # a bias by TMA: its configs, but for short causal rows (one consumer's ring fits its tiles already)
        assert hopper_forward.forward_config(head_dim, True, below - 1, bias_by_tma=True) == config
        assert (hopper_forward.forward_config(head_dim, True, below, bias_by_tma=True)
                == hopper_forward.forward_config(head_dim, False, 1024, bias_by_tma=True)
                == hopper_forward._BIAS_TMA_CONFIGS[head_dim])


def test_which_calls_run_a_persistent_grid(monkeypatch):
    """Over fewer than 4096 keys: unmasked plain attention on the two-consumer config (D128) with more query blocks
    than the SMs take at once; causal calls of the configs that pair with more blocks than pairing takes; nothing
    else, and nothing off a GPU."""
    cuda = torch.device("cuda")
    consumers = {d: hopper_forward.forward_config(d, False, 2048)[3] for d in (64, 128)}
    monkeypatch.setattr(hopper_common, "sm_count", lambda device: 132)
    persistent = functools.partial(hopper_forward.runs_persistent, device=cuda)
    assert persistent(False, False, consumers[128], 2048, 16, 128, 2048, 128)
    assert persistent(False, False, consumers[128], 2, 1, 133, 4095, 128)
    assert not persistent(False, False, consumers[128], 1, 1, 133, 4095, 128)  # one row: Triton 3.6 cannot lower it
    assert not persistent(False, False, consumers[128], 2048, 1, 132, 2048, 128)  # a block a CTA: nothing to gain
    assert not persistent(False, False, consumers[128], 4096, 32, 64, 4096, 128)
    assert not persistent(False, True, consumers[128], 2048, 16, 128, 2048, 128)
    assert not persistent(False, False, consumers[64], 2048, 16, 128, 2048, 64)
    # causal: past the waves that pair (8 of 132 SMs, at 1, 2 and 3 CTAs an SM), below 4096 keys
    short = {d: hopper_forward.forward_config(d, True, 1024)[3] for d in (64, 128)}
    assert persistent(True, False, consumers[128], 2048, 16, 128, 2048, 128)
    assert persistent(True, False, consumers[128], 2048, 15, 128, 2048, 128)  # an odd number of blocks too
    assert not persistent(True, False, consumers[128], 2048, 16, 66, 2048, 128)  # 8 waves: paired
    assert not persistent(True, False, consumers[128], 128, 1, 3000, 128, 128)  # one block a head
    assert not persistent(True, True, consumers[128], 2048, 16, 128, 2048, 128)
    assert persistent(True, False, short[128], 1024, 16, 133, 1024, 128)
    assert not persistent(True, False, short[128], 1024, 16, 132, 1024, 128)
    assert persistent(True, False, short[64], 1024, 16, 199, 1024, 64)
    assert not persistent(True, False, short[64], 1024, 16, 198, 1024, 64)
    assert not persistent(True, False, consumers[64], 4096, 22, 256, 4096, 64)  # three consumers never pair
    assert not persistent(True, False, consumers[128], 4096, 32, 128, 4096, 128)
    monkeypatch.setattr(hopper_common, "sm_count", lambda device: None)
    assert not persistent(False, False, consumers[128], 2048, 16, 128, 2048, 128)
    assert not persistent(True, False, consumers[128], 2048, 16, 128, 2048, 128)


def test_a_window_that_spans_every_key_is_none():
    """The kernels' window argument: the spec's, or 0 (no window: the plain causal walk) where it has none or it spans
    every key."""
    windowed = dataclasses.replace(PLAIN, causal=CausalMask(window=1000))
    assert [hopper_common.causal_window(windowed, n) for n in (999, 1000, 4096)] == [0, 0, 1000]
    assert hopper_common.causal_window(windowed) == 1000
    assert hopper_common.causal_window(dataclasses.replace(PLAIN, causal=CausalMask()), 10) == 0
    assert hopper_common.causal_window(PLAIN, 10) == 0


def test_a_windowed_call_takes_one_query_block_or_key_tile_a_cta(monkeypatch):
    """A sliding window's walks are about equal (the window's keys, or rows), so neither kernel pairs a long walk with
    a short one or runs a persistent grid of causal items where the same causal call without a window would."""
    from fuse_attn.kernels.hopper import backward as hopper_backward

    cuda = torch.device("cuda")
    monkeypatch.setattr(hopper_common, "sm_count", lambda device: 132)
    ctas = hopper_common.ctas_at_once(cuda)
    for Z, H, M in ((1, 8, 4096), (4, 16, 2048)):  # pairs; runs persistent
        causal = hopper_forward._launch_plan(Z, H, M, M, 128, True, torch.bfloat16, None, False, cuda, ctas)
        windowed = hopper_forward._launch_plan(Z, H, M, M, 128, True, torch.bfloat16, None, False, cuda, ctas,
                                               windowed=True)
        assert causal[6] or causal[7]  # (paired, persistent)
        assert not (windowed[6] or windowed[7]) and windowed[5] == (triton.cdiv(M, windowed[3] * windowed[0]), Z * H)
    assert hopper_backward.pairs_key_tiles(True, 32, 8, cuda)  # (causal, B1 H8 N4096: four waves of key tiles)
    spec = dataclasses.replace(PLAIN, causal=CausalMask(window=1000))
    q = torch.empty(1, 8, 4096, 128, dtype=torch.bfloat16)
    with monkeypatch.context() as m:
        m.setattr(hopper_backward, "in_place_fields", lambda *a: None)  # (no descriptors off a GPU)
        call = hopper_backward.BackwardCall(spec, q, q, q, None, q, False)
    assert call.window == 1000 and [paired for *_, paired in call.chunks] == [False]


def test_which_biases_come_by_tma_and_in_how_many_ring_stages():
    """A bias TMA can read in place goes into the k / v ring as a view whose broadcast dims have size 1; keys
    broadcast or strided, an odd row length or base leave it to the consumers' loads. The ring keeps the stages that
    fit the shared memory beside the bias tiles (two at least); an fp32 bias at head dim 128 fits too few."""
    by_tma = hopper_common.bias_tma_view
    alibi = torch.randn(1, 4, 64, 64, dtype=torch.bfloat16)
    view = by_tma(alibi.expand(2, 4, 64, 64))
    assert view.shape == (1, 4, 64, 64) and view.data_ptr() == alibi.data_ptr() and view.stride()[2:] == (64, 1)
    assert torch.equal(view, alibi)
    per_batch = torch.randn(2, 1, 64, 64, dtype=torch.bfloat16)
    view = by_tma(per_batch.expand(2, 4, 64, 64))
    assert view.shape == (2, 1, 64, 64) and torch.equal(view, per_batch)
    assert by_tma(torch.randn(2, 4, 1, 64, dtype=torch.bfloat16).expand(2, 4, 64, 64)) is None  # queries broadcast
    assert by_tma(torch.randn(2, 4, 1, 64, dtype=torch.bfloat16)) is None  # (the same, unexpanded)
    assert by_tma(torch.randn(2, 4, 64, 1, dtype=torch.bfloat16)) is None  # keys broadcast
    view = by_tma(alibi)  # unexpanded: its batch dim of size 1 is broadcast
    assert view.shape == (1, 4, 64, 64) and torch.equal(view, alibi)
    assert by_tma(alibi.transpose(2, 3)) is None  # keys strided
    assert by_tma(torch.randn(1, 4, 63, 63, dtype=torch.bfloat16)) is None  # 126-byte rows
    assert by_tma(torch.randn(1, 4, 64, 72, dtype=torch.bfloat16)[..., 1:]) is None  # a base 2 bytes past 16
    stages = {}
    for name, (head_dim, rows) in {"D64": (64, 4096), "D128": (128, 4096), "D128 short causal": (128, 1024)}.items():
        config = hopper_forward.forward_config(head_dim, True, rows, bias_by_tma=True)
        stages[name] = [hopper_forward.bias_ring_stages(*config, head_dim, torch.bfloat16, dtype)
                        for dtype in (torch.bfloat16, torch.float32)]
    assert stages == {"D64": [4, 3], "D128": [4, 3], "D128 short causal": [2, 2]}, stages


def test_the_op_on_cpu_runs_the_generated_forward_and_the_templates_backward():
    """The wiring the compiled graph relies on, where a CPU can check it: out and lse as the fused op gives them,
    and gradients through the autograd formula (the template's backward on this forward's out and lse)."""
    from fuse_attn.kernels import flash_attention

    spec = AttentionSpec(dtype="float32", head_dim=64, head_dim_v=64, scale=0.125, causal=CausalMask(), gqa_group=2)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 33, 64, generator=g, requires_grad=True)
    k, v = (torch.randn(1, 2, 33, 64, generator=g, requires_grad=True) for _ in range(2))
    out, lse = flash_attention_hopper(q, k, v, spec, return_lse=True)
    want_out, want_lse = flash_attention(q, k, v, spec, return_lse=True)
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=0)
    dout = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    want = torch.autograd.grad(want_out, (q, k, v), dout)
    for a, b in zip(grads, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_ops_fake_gives_the_outputs_shapes():
    spec = dataclasses.replace(PLAIN, gqa_group=2).to_json()
    with FakeTensorMode():
        q = torch.empty(2, 8, 77, 128, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(2, 4, 77, 128, dtype=torch.bfloat16, device="cuda")
        out, lse = torch.ops.fuse_attn.flash_attention_hopper(q, k, k, spec)
    assert out.shape == (2, 8, 77, 128) and out.dtype == torch.bfloat16
    assert lse.shape == (2, 8, 77) and lse.dtype == torch.float32
    with FakeTensorMode(), pytest.raises(UnsupportedSpec, match="do not match q"):  # 3 kv heads for GQA 2 of 8
        q = torch.empty(2, 8, 77, 128, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(2, 3, 77, 128, dtype=torch.bfloat16, device="cuda")
        torch.ops.fuse_attn.flash_attention_hopper(q, k, k, spec)


# ---- on an sm90 GPU ----------------------------------------------------------------------------------------------------


@hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dims", [(64, 64), (128, 128), (192, 128)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [1, 17, 97, 1025])
def test_matches_fp64_with_gradients(length, causal, head_dims, dtype):
    group = 2 if causal else 1
    head_dim, head_dim_v = head_dims
    spec = AttentionSpec(dtype=str(dtype).split(".")[1], head_dim=head_dim, head_dim_v=head_dim_v,
                         scale=head_dim ** -0.5, causal=CausalMask() if causal else None, gqa_group=group)
    g = torch.Generator(device="cuda").manual_seed(length)
    # q, k, v as a model's projections give them: [Z, N, H, D] viewed as [Z, H, N, D] (strided, no copy)
    q = torch.randn(2, length, 4, head_dim, device="cuda", generator=g, dtype=dtype).transpose(1, 2)
    k, v = (torch.randn(2, length, 4 // group, dim, device="cuda", generator=g, dtype=dtype).transpose(1, 2)
            for dim in (head_dim, head_dim_v))
    gluon_op_matches_fp64(spec, q, k, v, generator=g, dtype=dtype)


@hopper
@pytest.mark.parametrize("head_dims", [(64, 64), (128, 128), (192, 128)])
@pytest.mark.parametrize("length, window", [(97, 1), (97, 17), (1025, 128), (1025, 1000), (4096, 1000),
                                            (4096, 4096)])
def test_a_sliding_window_matches_fp64_with_gradients(length, window, head_dims):
    """Causal with a sliding window (GQA 2): each query tile's keys from its rows' windows on, a key tile's query
    tiles up to the last row that sees it; windows of one key, within a tile and across several, tiles of one and
    several consumers (1025 rows: one, 4096: two or three), and a window spanning every key (no window)."""
    head_dim, head_dim_v = head_dims
    spec = AttentionSpec(dtype="bfloat16", head_dim=head_dim, head_dim_v=head_dim_v, scale=head_dim ** -0.5,
                         causal=CausalMask(window=window), gqa_group=2)
    g = torch.Generator(device="cuda").manual_seed(length + window)
    q = torch.randn(2, length, 4, head_dim, device="cuda", generator=g, dtype=torch.bfloat16).transpose(1, 2)
    k, v = (torch.randn(2, length, 2, dim, device="cuda", generator=g, dtype=torch.bfloat16).transpose(1, 2)
            for dim in (head_dim, head_dim_v))
    gluon_op_matches_fp64(spec, q, k, v, generator=g)


@hopper
@pytest.mark.parametrize("program", ["softcap", "alibi"])
@pytest.mark.parametrize("head_dim, length, causal", [(64, 97, True), (128, 1025, False), (128, 4096, True),
                                                      (64, 4096, "window")])
def test_a_score_program_on_every_tile_matches_fp64_with_gradients(program, head_dim, length, causal):
    """A softcap or ALiBi from slopes evaluated in every tile (SCORED), unmasked, causal and in a window (GQA 2):
    output and gradients under the 2x rule; slopes that need a gradient take the template's backward (theirs too)."""
    change = SOFTCAP if program == "softcap" else ALIBI_FROM_SLOPES
    spec = AttentionSpec(dtype="bfloat16", head_dim=head_dim, head_dim_v=head_dim, scale=head_dim ** -0.5,
                         causal=CausalMask(window=300) if causal == "window" else CausalMask() if causal else None,
                         gqa_group=2, **change)
    g = torch.Generator(device="cuda").manual_seed(length)
    q = torch.randn(2, 4, length, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, length, head_dim, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    slopes = [2.0 ** (-8 * torch.arange(1, 5, device="cuda", dtype=torch.float32) / 4).reshape(1, 4, 1, 1)]
    slopes = slopes if program == "alibi" else []
    for slopes_grad in ((False, True) if slopes else (False,)):
        leaves = lambda cast=None: [t.detach().to(cast or t.dtype).requires_grad_() for t in (q, k, v)]  # noqa: E731
        ours_in, ref_in, eager_in = leaves(), leaves(torch.float64), leaves()
        tensors = [[t.detach().to(cast).requires_grad_(slopes_grad) for t in slopes]
                   for cast in (torch.float32, torch.float64, torch.float32)]
        out = flash_attention_hopper(*ours_in, spec, vectors=tensors[0])
        ref, _ = reference_attention(*ref_in, tensors[1], spec)
        eager, _ = reference_attention(*eager_in, tensors[2], spec)
        assert_close_2x("out", out, ref, eager, torch.bfloat16)
        dout = torch.randn(out.shape, device="cuda", generator=g, dtype=torch.bfloat16)
        grads = [torch.autograd.grad(o, [*x, *t], d) for o, x, t, d in
                 ((out, ours_in, tensors[0] if slopes_grad else [], dout),
                  (ref, ref_in, tensors[1] if slopes_grad else [], dout.double()),
                  (eager, eager_in, tensors[2] if slopes_grad else [], dout))]
        for name, a, b, c in zip(("dq", "dk", "dv", "dslopes"), *grads):
            assert_close_2x(name, a, b, c, torch.bfloat16)


@hopper
def test_long_rows_and_unequal_lengths():
    """Many key tiles through the ring (N 4096: 32 tiles, each stage reused), and M != N without a mask; at D64 the
    three-consumer config (causal: its first warpgroups release the CTA's last tiles unread); MLA's 192 / 128."""
    for D, DV, M, N, causal in ((64, 64, 4096, 4096, True), (128, 128, 4096, 4096, True), (64, 64, 300, 2049, False),
                                (128, 128, 300, 2049, False), (192, 128, 4096, 4096, True),
                                (192, 128, 300, 2049, False)):
        spec = dataclasses.replace(PLAIN, head_dim=D, head_dim_v=DV, scale=D ** -0.5,
                                   causal=CausalMask() if causal else None)
        g = torch.Generator(device="cuda").manual_seed(M)
        q = torch.randn(1, 2, M, D, device="cuda", generator=g, dtype=torch.bfloat16)
        k, v = (torch.randn(1, 2, N, dim, device="cuda", generator=g, dtype=torch.bfloat16) for dim in (D, DV))
        out = flash_attention_hopper(q, k, v, spec)
        ref, _ = reference_attention(q.double(), k.double(), v.double(), [], spec)
        eager, _ = reference_attention(q, k, v, [], spec)
        assert_close_2x(f"out D{D} M{M} N{N}", out, ref, eager, torch.bfloat16)


@hopper
@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_causal_call_of_many_ctas_over_4096_keys_takes_one_query_block_a_cta(head_dim):
    """The causal calls above pair query blocks in a CTA where their config allows it (their few CTAs:
    hopper_forward._PAIR_UP_TO_WAVES; D64's three-consumer config at 4096 rows never pairs); shorter calls of many
    CTAs run a persistent grid (below); this one has enough CTAs not to pair and too many keys for a persistent grid:
    each CTA takes one block."""
    Z, H, N = 4, 9, 4096
    block_m, _, _, consumers = hopper_forward.forward_config(head_dim, True, N)
    blocks = -(-N // (consumers * block_m))
    assert not hopper_forward.pairs_query_blocks(True, blocks, Z * H, head_dim, consumers, torch.device("cuda"))
    assert not hopper_forward.runs_persistent(True, False, consumers, N, blocks, Z * H, N, head_dim,
                                              torch.device("cuda"))
    spec = dataclasses.replace(PLAIN, head_dim=head_dim, head_dim_v=head_dim, scale=head_dim ** -0.5,
                               causal=CausalMask())
    g = torch.Generator(device="cuda").manual_seed(N)
    q, k, v = (torch.randn(Z, H, N, head_dim, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    out = flash_attention_hopper(q, k, v, spec)
    ref, _ = reference_attention(q.double(), k.double(), v.double(), [], spec)
    eager, _ = reference_attention(q, k, v, [], spec)
    assert_close_2x(f"out D{head_dim}", out, ref, eager, torch.bfloat16)


@hopper
@pytest.mark.parametrize("head_dim, rows, batch, heads, group", [
    (64, 1000, 2, 8, 2),  # 16 blocks a head
    (64, 1050, 3, 5, 1),  # 17 blocks, 15 heads: a middle block alone in the last item
    (128, 1000, 2, 8, 2),
    (128, 2100, 3, 6, 2),  # two consumers, 17 blocks: the middle blocks of two heads an item
])
def test_a_causal_persistent_grid_takes_many_items_of_two_query_blocks_a_cta(head_dim, rows, batch, heads, group,
                                                                           monkeypatch):
    """Causal calls of many CTAs run a persistent grid of items of two query blocks (hopper_forward.runs_persistent,
    causal_items, _block_of). With 8 SMs said, each CTA takes 5-20 items of several heads in turn, each head's last
    block part rows: the one-consumer configs (3 and 2 CTAs an SM) and D128's two-consumer one, even and odd
    numbers of blocks a head; output and lse."""
    monkeypatch.setattr(hopper_common, "sm_count", lambda device: 8)
    block_m, _, _, consumers = hopper_forward.forward_config(head_dim, True, rows)
    blocks = -(-rows // (consumers * block_m))
    assert hopper_forward.runs_persistent(True, False, consumers, rows, blocks, batch * heads, rows, head_dim,
                                          torch.device("cuda"))
    spec = dataclasses.replace(PLAIN, head_dim=head_dim, head_dim_v=head_dim, scale=head_dim ** -0.5,
                               causal=CausalMask(), gqa_group=group)
    g = torch.Generator(device="cuda").manual_seed(rows)
    q = torch.randn(batch, heads, rows, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, heads // group, rows, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
            for _ in range(2))
    out, lse = flash_attention_hopper(q, k, v, spec, return_lse=True)
    ref, ref_lse = reference_attention(q.double(), k.double(), v.double(), [], spec)
    eager, eager_lse = reference_attention(q, k, v, [], spec)
    assert_close_2x("out", out, ref, eager, torch.bfloat16)
    assert_close_2x("lse", lse, ref_lse, eager_lse, torch.bfloat16)


def test_the_items_of_a_causal_persistent_grid_cover_every_block_once_at_equal_work():
    """causal_items and the kernel's walk over them (_block_of's arithmetic, here in Python): every (head, block)
    once; every item two blocks of blocks + 1 key tiles together, but the last where blocks and heads are odd; heads
    2 g and 2 g + 1's items side by side."""
    for blocks, heads in ((16, 16), (17, 15), (17, 18), (3, 5), (2, 3), (1, 5)):
        items = hopper_forward.causal_items(blocks, heads)
        pairs, odd = blocks // 2, blocks % 2
        seen = []
        for t in range(items):
            r = t % (2 * pairs + odd)
            middle, second_head = odd == 1 and r == pairs, int(r >= pairs + odd)
            p = r - second_head * (pairs + odd)
            item = [(2 * (t // (2 * pairs + odd)) + (i if middle else second_head),
                     pairs if middle else (blocks - 1 - p, p)[i]) for i in (0, 1)]
            lone = t == items - 1 and blocks % 2 == 1 and heads % 2 == 1
            item = item[:1] if lone else item
            assert sum(b + 1 for _, b in item) == (blocks + 1) // (2 if lone else 1), (blocks, heads, t)
            assert item[0][0] // 2 == t // (2 * pairs + odd)
            seen += item
        assert sorted(seen) == [(h, b) for h in range(heads) for b in range(blocks)], (blocks, heads)


@hopper
def test_a_persistent_grid_takes_many_query_blocks_a_cta():
    """Unmasked D128 runs a persistent grid (hopper_forward.runs_persistent): here each CTA takes 7-8 query blocks of
    several heads in turn, the ring running on across them; 4100 rows leave each head's last block one warpgroup of
    rows (the other only releases the tiles), keys are fewer than rows, and k / v serve two heads each (GQA)."""
    Z, H, M, N = 2, 8, 4100, 1031
    block_m, _, _, consumers = hopper_forward.forward_config(128, False, M)
    blocks = -(-M // (consumers * block_m))
    assert hopper_forward.runs_persistent(False, False, consumers, M, blocks, Z * H, N, 128, torch.device("cuda"))
    spec = dataclasses.replace(PLAIN, gqa_group=2)
    g = torch.Generator(device="cuda").manual_seed(M)
    q = torch.randn(Z, H, M, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(Z, H // 2, N, 128, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    out, lse = flash_attention_hopper(q, k, v, spec, return_lse=True)
    ref, ref_lse = reference_attention(q.double(), k.double(), v.double(), [], spec)
    eager, eager_lse = reference_attention(q, k, v, [], spec)
    assert_close_2x("out", out, ref, eager, torch.bfloat16)
    assert_close_2x("lse", lse, ref_lse, eager_lse, torch.bfloat16)


@hopper
def test_a_layout_tma_cannot_read_is_copied_first():
    q = torch.randn(1, 2, 64, 129, device="cuda", dtype=torch.bfloat16)[..., :128]  # rows of 258 bytes
    assert hopper_common.tma_ready(q) is not q and hopper_common.tma_ready(q).is_contiguous()
    spec = PLAIN
    out = flash_attention_hopper(q, q, q, spec)
    ref, _ = reference_attention(q.double(), q.double(), q.double(), [], spec)
    eager, _ = reference_attention(q, q, q, [], spec)
    assert_close_2x("out", out, ref, eager, torch.bfloat16)


def _causal_attention(q, k, v):
    k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v


def _biased_causal_attention(q, k, v, bias):  # ALiBi's precomputed [1, H, N, N] buffer, or a learned bias
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + bias
    causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v


def _sink_attention(q, k, v, sinks):  # gpt-oss: a logit a head joined to the scores, the column dropped after softmax
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    joined = torch.cat([scores.masked_fill(~causal, float("-inf")),
                        sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[-2], -1)], dim=-1)
    return torch.softmax(joined - joined.max(-1, keepdim=True).values, dim=-1)[..., :-1] @ v


@pytest.mark.parametrize("attention, bias_grad", [(_causal_attention, None), (_biased_causal_attention, False),
                                                  (_biased_causal_attention, True), (_sink_attention, True)])
def test_a_compiled_graph_that_chose_it_trains_on_cpu(attention, bias_grad, monkeypatch):
    """The compiled path end to end where a CPU can run it (tests/support/gluon_on_cpu.py): the rewrite emits this op,
    Inductor calls it as an opaque op, and AOTAutograd's backward is the template's; output and gradients (of a bias
    that needs one too, of attention sinks through the op's lse) as eager's."""
    g = torch.Generator().manual_seed(0)
    if bias_grad is None:  # GQA 4 / 2 heads
        inputs = [torch.randn(s, generator=g, requires_grad=True) for s in [(2, 4, 40, 64)] + [(2, 2, 40, 64)] * 2]
    else:
        inputs = [torch.randn(2, 4, 40, 64, generator=g, requires_grad=True) for _ in range(3)]
        extra = (4,) if attention is _sink_attention else (1, 4, 40, 40)
        inputs.append(torch.randn(extra, generator=g, requires_grad=bias_grad))
    gluon_compile_trains_as_eager(monkeypatch, attention, inputs, generator=g)


@hopper
def test_a_graph_replayed_as_cuda_graphs_runs_it_below_the_size_that_hides_its_host_cost(monkeypatch):
    """mode="reduce-overhead": a training graph whose step is far under GLUON_MIN_STEP_FLOPS (B2 H4 N300 D64, GQA 2)
    may take the Gluon kernels (the choice sees that its graphs replay as CUDA graphs; here forced to them, whatever
    this GPU times), recorded into CUDA graph trees (none skipped) and replayed on new inputs: output and gradients
    under the 2x rule at every step."""
    from torch._dynamo.utils import counters

    from fuse_attn.kernels import dispatch
    from fuse_attn.report import collect_reports

    replayed = []
    monkeypatch.setattr(dispatch, "choose_implementation", lambda *args, **kwargs: replayed.append(
        dispatch._CUDA_GRAPHS) or dispatch.ImplementationChoice(dispatch.GLUON, "forced"))

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(_causal_attention, backend="fuse_attn", mode="reduce-overhead")
    g = torch.Generator(device="cuda").manual_seed(0)
    with collect_reports() as reports:
        for _ in range(3):  # a warm-up run, the recording, a replay
            inputs = [torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
                      for s in [(2, 4, 300, 64)] + [(2, 2, 300, 64)] * 2]
            torch.compiler.cudagraph_mark_step_begin()
            out = compiled(*inputs)
            ref_in = [t.detach().double().requires_grad_() for t in inputs]
            eager_in = [t.detach().clone().requires_grad_() for t in inputs]
            ref, eager = _causal_attention(*ref_in), _causal_attention(*eager_in)
            assert_close_2x("out", out, ref, eager, torch.bfloat16)
            dout = torch.randn(out.shape, device="cuda", dtype=torch.bfloat16, generator=g)
            for name, ours, exact, same_dtype in zip(("dq", "dk", "dv"), torch.autograd.grad(out, inputs, dout),
                                                     torch.autograd.grad(ref, ref_in, dout.double()),
                                                     torch.autograd.grad(eager, eager_in, dout)):
                assert_close_2x(name, ours, exact, same_dtype, torch.bfloat16)
    assert replayed and all(replayed)
    assert "fuse_attn.flash_attention_hopper.default" in "".join(r.after or "" for r in reports)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])


def test_the_ops_checks_are_remembered_per_signature_and_a_refusal_never_is(monkeypatch):
    """checked_call remembers a signature (spec, shapes, strides, dtypes, devices) it passed with what it prepared for
    it, so a model's later calls skip the checks; one it refused is checked, and refused, on every call; another
    signature is checked anew."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(hopper_common, "_checked", {})
    checks = []
    validate = hopper_common.ops.validate
    monkeypatch.setattr(hopper_common.ops, "validate", lambda *args: checks.append(1) or validate(*args))
    q, k = fake_qk()
    text = PLAIN.to_json()
    prepared = [hopper_common.checked_call("op", q, k, k, text, None, lambda *a: object()) for _ in range(2)]
    assert prepared[0] is prepared[1] and len(checks) == 1
    assert hopper_common.checked_call("op", q, k, k, text, None, hopper_common.parsed_spec) is prepared[0]
    assert hopper_common.checked_call("other op", q, k, k, text, None, hopper_common.parsed_spec) == PLAIN
    q96, k96 = fake_qk(head_dim=96)
    wide = dataclasses.replace(PLAIN, head_dim=96, head_dim_v=96).to_json()
    for _ in range(2):
        with pytest.raises(ValueError, match="head dims"):
            hopper_common.checked_call("op", q96, k96, k96, wide, None, hopper_common.parsed_spec)
    q_long, k_long = fake_qk(q_len=256, kv_len=256)
    hopper_common.checked_call("op", q_long, k_long, k_long, text, None, hopper_common.parsed_spec)
    assert len(checks) == 5


def test_after_autograd_the_graph_calls_the_forward_without_its_autograd_formula():
    """backend.PostGradPass: in a graph AOTAutograd is done with, the op's calls become its twin without an autograd
    formula, which computes the same (its Python wrapper would only cost host time on every call)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fuse_attn.backend import PostGradPass

    spec = dataclasses.replace(PLAIN, dtype="float32", head_dim=16, head_dim_v=16, scale=0.25,
                               causal=CausalMask()).to_json()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 17, 16, generator=g) for _ in range(3))
    gm = make_fx(lambda q, k, v: torch.ops.fuse_attn.flash_attention_hopper(q, k, v, spec))(q, k, v)
    before = gm(q, k, v)
    PostGradPass()(gm.graph)
    gm.recompile()
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "fuse_attn" in str(n.target)]
    assert targets == ["fuse_attn.flash_attention_hopper_no_autograd.default"]
    for ours, theirs in zip(gm(q, k, v), before):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
