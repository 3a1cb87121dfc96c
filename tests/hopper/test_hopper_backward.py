"""The Gluon backward of plain attention on Hopper (fuse_attn/kernels/hopper/backward.py): the autograd formula of
``fuse_attn::flash_attention_hopper`` on the GPU.

test_hopper_forward.py's GPU test takes gradients through it at odd lengths (1, 17, 97, 1025), head dims 64 and 128,
fp16 / bf16, GQA and strided inputs. Here: what that test does not reach -- many query tiles per key tile (the q / dO
ring and the two dQ buffers reused, each key tile's dQ adds meeting the others'), M != N, the gradient of lse, a
dO that TMA cannot read in place, the CPU side (the op's fake, its refusal off Hopper), and both kernels with an added
bias (``s + bias``). Its compile for sm90 runs
without a GPU in test_gpu_compile.py.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import triton
from torch._subclasses.fake_tensor import FakeTensorMode

from fuse_attn.kernels import reference_attention
from fuse_attn.kernels.hopper.common import dscore_kv_heads
from fuse_attn.kernels.hopper.forward import flash_attention_hopper
from fuse_attn.spec import AttentionSpec, CausalMask
from fuse_attn.score_program import ScoreTensor, UnsupportedSpec
from tests.support.fuzz_cases import BIAS_PROGRAM, record_templates_backward
from tests.support.gluon_op import hopper
from tests.support.numerics import assert_close_2x

PLAIN = AttentionSpec(dtype="bfloat16", head_dim=128, head_dim_v=128, scale=128 ** -0.5)


def test_the_ops_fake_gives_the_gradients_shapes():
    spec = dataclasses.replace(PLAIN, gqa_group=2).to_json()
    with FakeTensorMode():
        q, out = (torch.empty(2, 8, 77, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        k = torch.empty(2, 4, 77, 128, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(2, 8, 77, device="cuda")
        dq, dk, dv, dbias = torch.ops.fuse_attn.flash_attention_hopper_backward(out, q, k, k, out, lse, spec)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape) and dq.dtype == torch.bfloat16
        assert dbias.numel() == 0  # (no bias_grad)
        bias = torch.empty(1, 8, 77, 77, dtype=torch.bfloat16, device="cuda")
        biased = dataclasses.replace(PLAIN, gqa_group=2, score_program=BIAS_PROGRAM, score_tensors=(
            ScoreTensor("bias", "bfloat16", (True, False, False, False)),)).to_json()
        *_, dbias = torch.ops.fuse_attn.flash_attention_hopper_backward(out, q, k, k, out, lse, biased, None, bias,
                                                                        True)
        assert dbias.shape == bias.shape and dbias.dtype == bias.dtype
        with pytest.raises(UnsupportedSpec, match="do not match q"):  # 3 kv heads for GQA 2 of 8
            k3 = torch.empty(2, 3, 77, 128, dtype=torch.bfloat16, device="cuda")
            torch.ops.fuse_attn.flash_attention_hopper_backward(out, q, k3, k3, out, lse, spec)


def test_the_op_refuses_what_it_cannot_compute():
    """Called directly off an sm90 GPU (here: CPU tensors), it names why instead of launching."""
    q = torch.randn(1, 2, 8, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="Hopper"):
        torch.ops.fuse_attn.flash_attention_hopper_backward(q, q, q, q, q, torch.zeros(1, 2, 8), PLAIN.to_json())


def test_the_op_refuses_a_bias_at_mla_head_dims():
    """MLA's q / k 192 with v 128: the op computes its plain gradients (in column parts) but adds no bias there."""
    mla = dataclasses.replace(PLAIN, head_dim=192, scale=192 ** -0.5, score_program=BIAS_PROGRAM,
                              score_tensors=(ScoreTensor("bias", "bfloat16", (False, False, False, False)),)).to_json()
    q = torch.randn(1, 2, 8, 192, dtype=torch.bfloat16)
    v = torch.randn(1, 2, 8, 128, dtype=torch.bfloat16)
    bias = torch.randn(1, 2, 8, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="run no score program at head dims 192/128"):
        torch.ops.fuse_attn.flash_attention_hopper_backward(v, q, q, v, v, torch.zeros(1, 2, 8), mla, None, bias)


def test_the_bias_gradients_ds_chunks_stay_within_the_templates_buffer():
    """The kv heads a launch takes where it stores dS for the bias's gradient: all where the bias has every dim (a bf16
    dS buffer is half the template's fp32 one), equal chunks of heads where it is broadcast over the batch (a
    [1, 8, N, N] bias at batch 4: 3 heads fit beside the dQ accumulator, launches of 3, 3 and 2), none where it is
    broadcast over the heads (its gradient sums every head, in no chunk of them), in another dtype than the inputs',
    or over the queries, where not one head fits, or at head dim 64 (T5's: the template's backward is faster there)."""
    def heads(z, h, h_kv, n, bias_shape, bias_dtype=torch.bfloat16, head_dim=128):
        with FakeTensorMode():
            q = torch.empty(z, h, n, head_dim, dtype=torch.bfloat16, device="cuda")
            k = torch.empty(z, h_kv, n, head_dim, dtype=torch.bfloat16, device="cuda")
            return dscore_kv_heads(q, k, torch.empty(bias_shape, dtype=bias_dtype, device="cuda"))

    assert heads(4, 8, 8, 4096, (4, 8, 4096, 4096)) == 8
    assert heads(4, 8, 8, 4096, (1, 8, 4096, 4096)) == 3
    assert heads(4, 8, 8, 4096, (1, 8, 4096, 4096), head_dim=64) == 0
    assert heads(4, 16, 16, 4096, (1, 16, 4096, 4096)) == 6  # (7 fit: launches of 6, 6 and 4)
    assert heads(8, 32, 8, 2048, (1, 32, 2048, 2048)) == 1  # GQA 4: a kv head a launch, its 4 query heads
    assert heads(2, 4, 4, 520, (1, 4, 520, 520)) == 2  # (3 fit: two launches of 2)
    assert heads(2, 4, 4, 97, (1, 4, 97, 97)) == 0  # (the dQ accumulator is larger than the template's buffer)
    assert heads(2, 4, 4, 520, (2, 1, 520, 520)) == 0
    assert heads(2, 4, 4, 512, (2, 4, 512, 512), torch.float32) == 0
    assert heads(2, 4, 4, 512, (2, 4, 1, 512)) == 0


def test_the_backward_refuses_a_bias_gradient_it_does_not_compute():
    """Asked for the gradient of a bias that dscore_kv_heads does not admit (head dim 64, an fp32 bias), or of none,
    the launcher says so before any launch."""
    from fuse_attn.kernels.hopper.backward import hopper_backward

    q = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)
    plain = dataclasses.replace(PLAIN, head_dim=64, head_dim_v=64, scale=0.125)
    biased = dataclasses.replace(plain, score_program=BIAS_PROGRAM,
                                 score_tensors=(ScoreTensor("bias", "bfloat16", (False, False, False, False)),))
    for spec, bias in ((biased, torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)), (plain, None)):
        with pytest.raises(ValueError, match="dscore_kv_heads"):
            hopper_backward(q, q, q, q, q, torch.zeros(1, 2, 64), spec, bias=bias, bias_grad=True)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the kernel in Triton's interpreter")
@pytest.mark.parametrize("dlse", [False, True])
@pytest.mark.parametrize("D, DV, part_d", [(16, 16, 16), (48, 32, 16)])
def test_the_delta_kernel_zeroes_the_dq_accumulator(dlse, D, DV, part_d):
    """The small Triton kernel before the Gluon one (run here in the interpreter): delta = rowsum(dO * O) - dlse, and
    the fp32 dQ accumulator's rows zeroed for the backward's reduce-adds (it comes from torch.empty), in column parts
    where q's head dim is not v's (MLA's 192 = 3 x 64 beside 128, here 48 = 3 x 16 beside 32), rows past M of the
    last program untouched; M not a multiple of its rows."""
    from fuse_attn.kernels.hopper import backward

    Z, H, M = 2, 3, 70
    out, dout = torch.randn(Z, H, M, DV), torch.randn(Z, H, M, DV)
    lse, dlse_t = torch.randn(Z, H, M), torch.randn(Z, H, M)
    delta = torch.full((Z, H, M), float("nan"))
    buffer = torch.full((Z * H * M * D + D,), float("nan"))  # (a row past the accumulator's: must stay as it was)
    dq_acc, past = buffer[:-D], buffer[-D:]
    grid = (triton.cdiv(M, backward._PRE_ROWS), Z * H)
    backward._delta_kernel[grid](out, dout, dlse_t if dlse else lse, delta, lse, lse, dq_acc, H, M, *out.stride()[:3],
                                 *dout.stride()[:3], dlse, backward._PRE_ROWS, DV, D, part_d, False, False)
    expected = (out.double() * dout.double()).sum(-1) - (dlse_t.double() if dlse else 0)
    torch.testing.assert_close(delta.double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(dq_acc, torch.zeros_like(dq_acc))
    assert past.isnan().all()


def test_each_kernel_has_a_config_for_every_head_dim_it_takes():
    """``hopper_reasons`` admits common.HEAD_DIMS for both kernels: each needs a config for each."""
    from fuse_attn.kernels.hopper import backward as hopper_backward, common as hopper_common, forward as hopper_forward

    assert set(hopper_forward._CONFIGS) == set(hopper_backward._CONFIGS) == {d for d, _ in hopper_common.HEAD_DIMS}


def test_a_bias_ring_keeps_one_dq_buffer_at_head_dim_128_and_none_fits_at_64():
    """The bias tiles' room in the q / dO ring: at head dim 128 in place of the second dQ buffer (a bf16 bias; an fp32
    one does not fit), at 64 not at all (its 128-row tiles): the compute warpgroups load those."""
    from fuse_attn.kernels.hopper import backward as hopper_backward

    buffers = {(head_dim, str(dtype)): hopper_backward.bias_ring_dq_buffers(*hopper_backward._CONFIGS[head_dim],
                                                                            head_dim, torch.bfloat16, dtype)
               for head_dim in (64, 128) for dtype in (torch.bfloat16, torch.float32)}
    assert buffers == {(64, "torch.bfloat16"): 0, (64, "torch.float32"): 0, (128, "torch.bfloat16"): 1,
                       (128, "torch.float32"): 0}, buffers


# ---- on an sm90 GPU ----------------------------------------------------------------------------------------------------


def _check_gradients(what, q, k, v, spec, dout_of=lambda dout: dout, dlse_weight=0.0):
    """dq, dk, dv for gradients ``dout`` of out (random, laid out by ``dout_of``: the op receives that view) and
    ``dlse_weight`` of every lse, against fp64 under the 2x rule."""
    dtype = q.dtype
    g = torch.Generator(device=q.device).manual_seed(7)
    leaves = lambda cast=None: [t.detach().to(cast or t.dtype).requires_grad_() for t in (q, k, v)]  # noqa: E731
    ours_in, ref_in, eager_in = leaves(), leaves(torch.float64), leaves()
    dout = dout_of(torch.randn(q.shape[:3] + v.shape[3:], device=q.device, generator=g, dtype=dtype))
    grads = []
    for (out, lse), inputs in ((flash_attention_hopper(*ours_in, spec, return_lse=True), ours_in),
                               (reference_attention(*ref_in, [], spec), ref_in),
                               (reference_attention(*eager_in, [], spec), eager_in)):
        outputs, grad_outputs = [out], [dout.to(out.dtype)]
        if dlse_weight:
            outputs.append(lse)
            grad_outputs.append(torch.full_like(lse, dlse_weight))
        grads.append(torch.autograd.grad(outputs, inputs, grad_outputs))
    for name, a, b, c in zip(("dq", "dk", "dv"), *grads):
        assert_close_2x(f"{what} {name}", a, b, c, dtype)


@hopper
@pytest.mark.parametrize("head_dim, head_dim_v", [(64, 64), (128, 128), (192, 128)])
def test_many_query_tiles_per_key_tile(head_dim, head_dim_v):
    """N 4096, causal, GQA 4: each key tile walks up to 4 x 64 query tiles through the ring and its dQ buffers (two
    key tiles a CTA: few CTAs); MLA's dims in column parts."""
    spec = AttentionSpec(dtype="bfloat16", head_dim=head_dim, head_dim_v=head_dim_v, scale=head_dim ** -0.5,
                         causal=CausalMask(), gqa_group=4)
    g = torch.Generator(device="cuda").manual_seed(head_dim)
    q = torch.randn(1, 8, 4096, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(1, 2, 4096, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(1, 2, 4096, head_dim_v, device="cuda", generator=g, dtype=torch.bfloat16)
    _check_gradients(f"N4096 D{head_dim}/{head_dim_v}", q, k, v, spec)


@hopper
def test_a_causal_call_of_many_ctas_takes_one_key_tile_a_cta():
    """The test above pairs key tiles in a CTA (its few CTAs: hopper_backward._PAIR_UP_TO_WAVES); this call has
    enough CTAs that each takes one."""
    from fuse_attn.kernels.hopper import backward as hopper_backward

    Z, H, N, D = 8, 8, 2048, 64
    assert not hopper_backward.pairs_key_tiles(True, -(-N // hopper_backward._CONFIGS[D][1]), Z * H,
                                               torch.device("cuda"))
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask())
    g = torch.Generator(device="cuda").manual_seed(N)
    q, k, v = (torch.randn(Z, H, N, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    _check_gradients(f"Z{Z} H{H} N{N} D{D}", q, k, v, spec)


@hopper
@pytest.mark.parametrize("head_dim, head_dim_v", [(128, 128), (192, 128)])
def test_unequal_lengths(head_dim, head_dim_v):
    spec = dataclasses.replace(PLAIN, head_dim=head_dim, head_dim_v=head_dim_v, scale=head_dim ** -0.5)
    for M, N in ((300, 2049), (2049, 300)):
        g = torch.Generator(device="cuda").manual_seed(M)
        q = torch.randn(2, 2, M, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
        k = torch.randn(2, 2, N, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
        v = torch.randn(2, 2, N, head_dim_v, device="cuda", generator=g, dtype=torch.bfloat16)
        _check_gradients(f"M{M} N{N} D{head_dim}/{head_dim_v}", q, k, v, spec)


@hopper
def test_the_gradient_of_lse():
    """lse used downstream (as context parallelism's merge uses it): its gradient comes off delta."""
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(2, 4, 333, 64, device="cuda", generator=g, dtype=torch.float16) for _ in range(3))
    spec = AttentionSpec(dtype="float16", head_dim=64, head_dim_v=64, scale=0.125, causal=CausalMask())
    _check_gradients("with lse", q, k, v, spec, dlse_weight=0.5)


@hopper
def test_a_dout_tma_cannot_read_in_place():
    """dO as a broadcast (stride 0, as ``out.sum().backward()`` gives it) and as a transposed view."""
    g = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = (torch.randn(2, 4, 100, 128, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    _check_gradients("broadcast dO", q, k, v, PLAIN, dout_of=lambda d: d[:1, :1, :1, :].expand(d.shape))
    _check_gradients("transposed dO", q, k, v, PLAIN, dout_of=lambda d: d.transpose(1, 2).contiguous().transpose(1, 2))


# ---- s + bias: the bias loaded in both kernels ------------------------------------------------------------------------


@hopper
@pytest.mark.parametrize("head_dim, causal, N, sizes, bias_dtype, empty_rows, bias_grad", [
    (128, True, 1025, (1, 4, "N", "N"), torch.bfloat16, "nan", False),  # ALiBi's form: broadcast over the batch
    (64, False, 97, (2, 4, "N", "N"), torch.float32, "nan", False),
    (128, False, 1025, (2, 4, "N", "N"), torch.bfloat16, "zero", False),
    (64, True, 300, (2, 1, "N", "N"), torch.bfloat16, "zero", False),
    # the bias's gradient (test_the_bias_gradients_ds_chunks_stay_within_the_templates_buffer: which backward):
    # Gluon's dS stores, every dim, causal (zeros past the diagonal), rows of 300 keys padded for TMA
    (128, True, 300, (2, 4, "N", "N"), torch.bfloat16, "nan", True),
    # broadcast over the batch as T5's: two launches of 2 heads (520 keys, rows padded to 528), unmasked
    (128, False, 520, (1, 4, "N", "N"), torch.bfloat16, "nan", True),
    # the ALiBi form, bias tiles by TMA, empty rows 0, two launches of 2 heads
    (128, True, 1024, (1, 4, "N", "N"), torch.bfloat16, "zero", True),
    # the template's backward computes these (head dim 64: common._DS_MIN_HEAD_DIM): a bias broadcast over the heads,
    # an fp32 bias, a bias of T5's form
    (64, True, 300, (2, 1, "N", "N"), torch.bfloat16, "zero", True),
    (64, False, 97, (2, 4, "N", "N"), torch.float32, "nan", True),
    (64, False, 97, (1, 4, "N", "N"), torch.bfloat16, "nan", True),
    # rows of 16-byte multiples: the forward's bias tiles come by TMA in the k / v ring (common.bias_tma_view),
    # in each config (one consumer, two CTAs an SM; two; three), keys and rows past the lengths in the last tiles
    (128, True, 1024, (1, 4, "N", "N"), torch.bfloat16, "nan", False),
    (128, True, 1024, (2, 4, "N", "N"), torch.float32, "zero", False),
    (128, True, 2056, (1, 4, "N", "N"), torch.bfloat16, "nan", False),
    (128, True, 2056, (2, 1, "N", "N"), torch.float32, "zero", False),  # (two consumers: 3 stages of an fp32 bias)
    # (per head: unmasked, a [Z,1,M,N] bias is a mask whose tiles the template classifies per call, spec.mask_blocks)
    (64, False, 520, (2, 4, "N", "N"), torch.bfloat16, "zero", False),
])
def test_an_added_bias(head_dim, causal, N, sizes, bias_dtype, empty_rows, bias_grad):
    """``s + bias``: the forward and backward against fp64 under the 2x rule, the gradient of the bias too where it
    needs one (the Gluon backward, or the generated template's on this forward's out and lse where
    :func:`~fuse_attn.kernels.hopper.common.dscore_kv_heads` says so: which one ran is checked). Row 5
    of every (batch, head) is -inf everywhere, row 7 in its first half (its first tiles see no key); the other rows a
    random bias. ``empty_rows="nan"`` (softmax): row 5 is NaN, and with it dq's row 5, dk where row 5 sees a key and
    all of dv, as in eager; the reference is eager attention. ``"zero"`` (SDPA's ``_safe_softmax``): row 5 is 0 with no
    gradient, nothing NaN; the reference is SDPA's math kernel with the bias (and the causal mask) as its float mask,
    which gives that (eager's masked softmax gives NaN gradients there)."""
    spec = AttentionSpec(dtype="bfloat16", head_dim=head_dim, head_dim_v=head_dim, scale=head_dim ** -0.5,
                         causal=CausalMask() if causal else None, score_program=BIAS_PROGRAM, empty_rows=empty_rows,
                         score_tensors=(ScoreTensor("bias", str(bias_dtype).split(".")[1],
                                                    tuple(n == 1 for n in sizes)),))
    g = torch.Generator(device="cuda").manual_seed(N)
    q, k, v = (torch.randn(2, 4, N, head_dim, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    bias = 2 * torch.randn(*(N if n == "N" else n for n in sizes), device="cuda", generator=g).to(bias_dtype)
    bias[:, :, 5] = float("-inf")
    bias[:, :, 7, : N // 2] = float("-inf")
    leaves = lambda cast=None: [t.detach().to(cast or t.dtype).requires_grad_(t is not bias or bias_grad)  # noqa: E731
                                for t in (q, k, v, bias)]
    ours_in, ref_in, eager_in = leaves(), leaves(torch.float64), leaves()

    def sdpa_math(q, k, v, bias):
        if causal:
            bias = bias.masked_fill(~torch.ones(N, N, dtype=torch.bool, device="cuda").tril(), float("-inf"))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype),
                                                                    scale=spec.scale)

    reference = sdpa_math if empty_rows == "zero" else lambda *t: reference_attention(*t[:3], t[3:], spec)[0]
    dout = torch.randn(q.shape, device="cuda", generator=g, dtype=torch.bfloat16)
    results = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        templates_backward = record_templates_backward(monkeypatch)
        for out, inputs in ((flash_attention_hopper(*ours_in[:3], spec, bias=ours_in[3]), ours_in),
                            (reference(*ref_in), ref_in), (reference(*eager_in), eager_in)):
            wanted = inputs if bias_grad else inputs[:3]
            results.append((out, *torch.autograd.grad(out, wanted, dout.to(out.dtype))))
    by_gluon = not bias_grad or bool(dscore_kv_heads(q, k, bias))
    assert templates_backward == ([] if by_gluon else [1]), templates_backward
    for name, ours, ref64, eager in zip(("out", "dq", "dk", "dv", "dbias"), *results):
        if empty_rows == "zero":
            assert not ours.isnan().any(), name
        assert_close_2x(f"{name}", ours, ref64, eager, torch.bfloat16)
