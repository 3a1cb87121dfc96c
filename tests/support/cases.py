"""Attention cases for the op-level tests: random q/k/v, score tensors and the spec describing them
(:func:`make_case`), the check of the fused op against the fp64 reference and eager in the input dtype
(:func:`run_and_check`, the 2x rule of ``numerics.py``), the score programs the cases use, and the dropout seed
tensor (:func:`seed_tensor`)."""

from __future__ import annotations

import math

import torch

from fuse_attn.kernels import flash_attention, reference_attention
from fuse_attn.score_program import ScoreProgramBuilder, ScoreTensor
from fuse_attn.spec import AttentionSpec

from tests.support.numerics import assert_close_2x

DTYPE_NAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def seed_tensor(value):
    """A dropout seed as the op takes it: a 0-d int64 tensor."""
    return torch.tensor(value, dtype=torch.int64)


def make_case(Z=1, H=2, M=17, N=17, D=16, DV=None, dtype=torch.float32, causal=None, bias=None, mask=None,
              gqa=1, seed=0, scale_op=None, bias_grad=True, softcap=None, biases=(), program=None,
              dropout_p=0.0):
    """Random q/k/v, score tensors and the spec describing them.

    Tensors, in order: a bias of shape ``bias``, more biases of the shapes in ``biases``, a bool mask of shape
    ``mask``. The score program is ``program(b, s, loads)`` (b a ScoreProgramBuilder, s the score node, loads the
    load nodes of the tensors in order; returns the result node) or, by default, in order: ``s * scale_op``,
    ``+ bias``, a softcap ``tanh(s / c) * c`` (Gemma-2), ``where(mask, s, -1e4)`` (``masked_fill(~mask, -1e4)``).
    ``dropout_p``: the spec's dropout on the probabilities."""
    DV = DV or D
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(Z, H, M, D, generator=g).to(dtype)
    k = torch.randn(Z, H // gqa, N, D, generator=g).to(dtype)
    v = torch.randn(Z, H // gqa, N, DV, generator=g).to(dtype)
    tensors, infos = [], []
    for shape in ([bias] if bias is not None else []) + list(biases):
        infos.append(ScoreTensor("bias", DTYPE_NAME[dtype], tuple(n == 1 for n in shape)))
        tensors.append(torch.randn(*shape, generator=g).to(dtype).requires_grad_(bias_grad))
    if mask is not None:
        infos.append(ScoreTensor("mask", "bool", tuple(n == 1 for n in mask)))
        tensors.append(torch.rand(*mask, generator=g) > 0.25)
    b = ScoreProgramBuilder()
    s = b.add("score")
    loads = [b.add("load", value=i) for i in range(len(tensors))]
    if program is not None:
        x = program(b, s, loads)
    else:
        x = s
        if scale_op is not None:
            x = b.add("mul", x, b.const(scale_op))
        if bias is not None:
            x = b.add("add", x, loads[0])
        if softcap is not None:
            x = b.add("mul", b.add("tanh", b.add("div", x, b.const(softcap))), b.const(softcap))
        if mask is not None:
            x = b.add("where", loads[-1], x, b.const(-1e4))
    spec = AttentionSpec(dtype=DTYPE_NAME[dtype], head_dim=D, head_dim_v=DV, scale=1 / math.sqrt(D), causal=causal,
                         score_program=b.program(x), score_tensors=tuple(infos), gqa_group=gqa, dropout_p=dropout_p)
    return q, k, v, tensors, spec


def run_and_check(q, k, v, tensors, spec, dtype, grads=True, seed=1, dropout_seed=None):
    """Forward (+ grads of q, k, v and the bias) of ours vs the fp64 reference and eager in `dtype` (all three
    with the keep-mask of `dropout_seed` when the spec has dropout)."""
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
    out = flash_attention(*ours_in[:3], spec, ours_in[3:], dropout_seed=dropout_seed)
    ref, _ = reference_attention(*ref_in[:3], ref_in[3:], spec, dropout_seed)
    eag, _ = reference_attention(*eag_in[:3], eag_in[3:], spec, dropout_seed)
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


# ---- score programs (b: ScoreProgramBuilder, s: the score node, t: the load nodes) -------------------------------
def alibi(b, s, t):
    """s + slope[h] * (kv_idx - q_idx), the slopes a [1, H, 1, 1] bias (ALiBi, Bloom)."""
    return b.add("add", s, b.add("mul", t[0], b.add("sub", b.add("kv_idx"), b.add("q_idx"))))


def clamps(b, s, t):
    """clamp_max(clamp_min(s, bias), 1.5): the bias gets the gradient where it wins, s where it is in range."""
    return b.add("clamp_max", b.add("clamp_min", s, t[0]), b.const(1.5))


def near_diagonal(b, s, t):
    """where(kv_idx <= q_idx + 2, s, -inf): a mask from index comparisons only."""
    visible = b.add("le", b.add("kv_idx"), b.add("add", b.add("q_idx"), b.const(2)))
    return b.add("where", visible, s, b.const(float("-inf")))


def bias_twice(b, s, t):
    """s + bias * sigmoid(bias): one bias read twice, its gradient the sum of both paths."""
    return b.add("add", s, b.add("mul", t[0], b.add("sigmoid", t[0])))


def transcendental(b, s, t):
    """s / sqrt(|bias| + 1) + log(exp(bias / 2) + 1): div, sqrt, abs, log and exp, on the score and a bias."""
    denom = b.add("sqrt", b.add("add", b.add("abs", t[0]), b.const(1.0)))
    softplus = b.add("log", b.add("add", b.add("exp", b.add("mul", t[0], b.const(0.5))), b.const(1.0)))
    return b.add("add", b.add("div", s, denom), softplus)


def index_leaves(b, s, t):
    """Every index leaf and logical op: keys in the last 3 of kv_len or on the diagonal stay visible through a
    mask; a per-head and per-batch offset; a bonus for queries in the second half of q_len."""
    last3 = b.add("ge", b.add("kv_idx"), b.add("sub", b.add("kv_len"), b.const(3)))
    diagonal = b.add("eq", b.add("kv_idx"), b.add("q_idx"))
    keep = b.add("logical_or", t[0], b.add("logical_and", b.add("logical_or", last3, diagonal),
                                             b.add("logical_not", b.add("lt", b.add("q_idx"), b.const(1)))))
    x = b.add("add", s, b.add("mul", b.add("to_float", b.add("head_idx")), b.const(0.25)))
    x = b.add("sub", x, b.add("div", b.add("batch_idx"), b.const(2)))
    second_half = b.add("gt", b.add("mul", b.add("q_idx"), b.const(2)), b.add("q_len"))
    x = b.add("add", x, b.add("where", second_half, b.const(0.5), b.const(0.0)))
    return b.add("where", keep, x, b.const(-1e4))


def ties(b, s, t):
    """s + maximum(bias0, bias1) + minimum(s, 0) - a tie's gradient is split in halves (torch)."""
    return b.add("add", b.add("add", s, b.add("maximum", t[0], t[1])), b.add("minimum", s, b.const(0.0)))
