"""Random attention cases for the property-based tests (tests/kernels/test_fuzz.py): a :class:`Case` describes one
attention -- sizes, dtype, memory layouts of q / k / v, the score modifications, the mask -- and builds its inputs
and spec (for the op) or an eager module spelling the same attention (for ``torch.compile``).

Comparison rule (flash-attention's, as everywhere in tests/): on the elements all three results hold finite,
``max|ours - ref64| <= 2 * max|eager - ref64| + floor`` with ``eager`` the same computation in the input dtype and
``ref64`` in fp64; the non-finite elements (NaN, +-inf) of ours must be exactly eager's: no NaN hidden, none added.
"""

from __future__ import annotations

import importlib
import math
import random
from dataclasses import dataclass
from typing import Optional
from unittest import mock

import torch
from hypothesis import strategies as st

from fuse_attn.kernels import flash_attention, reference_attention

_op_module = importlib.import_module("fuse_attn.kernels.ops")
from fuse_attn.spec import AttentionSpec, CausalMask, dtype_name
from fuse_attn.score_program import ScoreNode, ScoreProgramBuilder, ScoreTensor
from tests.support.numerics import FLOOR  # the 2x rule's floors, here relative to max|ref|

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Lengths: 1, primes, powers of two and their neighbours (tile edges of every block size the kernels use).
LENGTHS = (1, 2, 3, 5, 7, 13, 16, 17, 31, 32, 33, 37, 61, 64, 65, 97)
LONG_LENGTHS = LENGTHS + (127, 128, 129, 191, 251, 256, 257)
HEAD_DIMS = (1, 8, 16, 24, 40, 64, 80)
LONG_HEAD_DIMS = HEAD_DIMS + (96, 128, 160, 256)
LAYOUTS = ("contiguous", "transposed", "sliced", "expanded")
MASK_FILLS = (float("-inf"), "finfo.min", -1e4)
# The ``s + bias`` score program: the scaled score plus the spec's one score tensor (what the Gluon kernels take:
# fuse_attn.kernels.hopper.common.adds_a_bias)
BIAS_PROGRAM = (ScoreNode("score"), ScoreNode("load", value=0), ScoreNode("add", (0, 1)))


def record_templates_backward(monkeypatch) -> list:
    """The generated template's backward (``ops.autograd_backward``) recorded from now on: the returned list gets a 1
    at each call (the Gluon forward's autograd runs it where the Gluon backward does not compute a gradient)."""
    calls, templates_backward = [], _op_module.autograd_backward
    monkeypatch.setattr(_op_module, "autograd_backward", lambda *a: calls.append(1) or templates_backward(*a))
    return calls


@dataclass(frozen=True)
class Case:
    Z: int
    kv_heads: int
    gqa: int
    M: int
    N: int
    D: int
    DV: int
    dtype: str
    layouts: tuple[str, str, str]  # of q, k, v (see :func:`_view`)
    scale_op: Optional[float]  # an extra ``s * scale_op``
    bias: Optional[tuple[bool, bool, bool, bool]]  # broadcast dims of a float bias ``s + bias``
    bias_grad: bool
    alibi: bool  # ``s + slope[h] * (kv_idx - q_idx)``, the slopes a [1, H, 1, 1] tensor
    softcap: Optional[float]  # ``tanh(s / c) * c``
    mask: Optional[tuple[bool, bool, bool, bool]]  # broadcast dims of a bool mask: ``where(mask, s, fill)``
    mask_fill: object  # a float, or "finfo.min" (of the dtype)
    mask_keep: float  # probability that a key is kept; rows left with none are fully masked
    band: Optional[int]  # ``where(kv_idx <= q_idx + band, s, -inf)``: a mask from indices only
    causal: Optional[CausalMask]
    dropout_p: float
    seed: int

    @property
    def H(self) -> int:
        return self.kv_heads * self.gqa

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def fill_value(self) -> float:
        return torch.finfo(self.torch_dtype).min if self.mask_fill == "finfo.min" else self.mask_fill


def cases(long: bool = False, dtypes=("float32", "float16", "bfloat16"), dropout: bool = True,
          max_elements: Optional[int] = None, compiled: bool = False,
          spec_pool: Optional[int] = None, shard: tuple[int, int] = (0, 1)) -> st.SearchStrategy[Case]:
    """Cases; ``long``: the larger sizes for a GPU. ``max_elements`` bounds Z * H * M * N (interpreter cost).
    ``compiled``: only what the matcher fuses when spelled as a module -- an index band and a causal mask are two
    band masks, which it leaves unfused with a reason ("two causal masks with different bands"), so not both.
    ``spec_pool``: the kernel-defining choices (dtype, head dims, score mods, masks, causal, GQA group, dropout) come
    from one of that many fixed combinations (numbered, each drawn by its own seeded generator), so that a long run
    compiles a bounded number of kernels; sizes, layouts, mask contents and values stay free. ``shard=(i, n)``: only
    the combinations numbered i, i + n, i + 2n, ... (n processes then split the pool, each compiling its part)."""
    lengths = LONG_LENGTHS if long else LENGTHS
    dims = LONG_HEAD_DIMS if long else HEAD_DIMS

    @st.composite
    def build(draw) -> Case:
        if spec_pool is None:
            def pick(options):
                return draw(st.sampled_from(options))
        else:
            rng = random.Random(draw(st.sampled_from(range(shard[0], spec_pool, shard[1]))))

            def pick(options):
                return rng.choice(options)

        def broadcast():
            return None if pick((True, False)) else tuple(pick((True, False)) for _ in range(4))

        gqa = pick((1, 1, 2, 3))
        D = pick(dims)
        DV = pick((D, D, pick(dims)))
        causal = None
        if pick((True, False)):
            window = pick((None, None, 1, 2, 5, 16, 17, 40))
            causal = CausalMask(pick((0, 0, 0, 1, 3, -1, -2)), pick(("top_left", "bottom_right")), window)
        band = pick((None, None, None, 0, 3, -2))
        if compiled and causal is not None:
            band = None
        mask, mask_fill = broadcast(), pick(MASK_FILLS)
        if mask is not None and mask_fill != float("-inf"):
            mask = (*mask[:2], False, False)  # per row and key: see mask_tensor
        structure = dict(
            gqa=gqa, D=D, DV=DV, causal=causal, band=band, mask=mask, mask_fill=mask_fill, dtype=pick(dtypes),
            scale_op=pick((None, None, 0.5, 3.0)), bias=broadcast(), bias_grad=pick((True, False)),
            alibi=pick((True, False)), softcap=pick((None, None, 2.0, 30.0)),
            dropout_p=pick((0.0, 0.0, 0.0, 0.3)) if dropout else 0.0,
        )
        kv_heads = draw(st.sampled_from((1, 2, 3)))
        Z = draw(st.sampled_from((1, 1, 2, 3)))
        M, N = draw(st.sampled_from(lengths)), draw(st.sampled_from(lengths))
        if max_elements is not None:
            while Z * kv_heads * gqa * M * N > max_elements:
                M, N = max(1, M // 2), max(1, N // 2)
        return Case(Z=Z, kv_heads=kv_heads, M=M, N=N, layouts=draw(st.tuples(*[st.sampled_from(LAYOUTS)] * 3)),
                    mask_keep=draw(st.sampled_from((0.9, 0.5, 0.1))), seed=draw(st.integers(0, 2**31 - 1)), **structure)

    return build()


# Gluon cases: what the Gluon kernels take (fuse_attn.kernels.hopper.common.hopper_reasons), at lengths that also give
# several query blocks a head (their CTAs take 128-192 rows) and grids past an H100's / H200's 132 SMs (persistent)
GLUON_LENGTHS = LONG_LENGTHS + (383, 640, 1000, 1025)


def gluon_cases(long: bool = False) -> st.SearchStrategy[Case]:
    """Cases the Gluon kernels compute (:func:`gluon_refusals` empty): fp16 / bf16, head dim 64 or 128 for q, k and
    v, or MLA's 192 for q and k with 128 for v (no bias: the kernels add one at 64 and 128 only), plain scores or ``s + bias`` (any broadcast the kernels take, its gradient or not), causal top-left
    over equal lengths or not, GQA, q / k / v in any layout; ``long``: the longer lengths too."""
    from fuse_attn.kernels.hopper.common import HEAD_DIMS  # ((q / k, v) head dims; Gluon imported on use)

    lengths = GLUON_LENGTHS if long else LENGTHS + (128, 129, 257)

    @st.composite
    def build(draw) -> Case:
        D, DV = draw(st.sampled_from(HEAD_DIMS))
        causal = draw(st.sampled_from((None, CausalMask())))
        M = draw(st.sampled_from(lengths))
        N = M if causal is not None else draw(st.sampled_from(lengths))
        bias = draw(st.sampled_from((None, None, (True, False, False, False), (False, False, False, False),
                                     (True, True, False, False), (False, True, False, False)))) if D == DV else None
        return Case(Z=draw(st.sampled_from((1, 2, 3))), kv_heads=draw(st.sampled_from((1, 2, 3))),
                    gqa=draw(st.sampled_from((1, 1, 2, 4))), M=M, N=N, D=D, DV=DV,
                    dtype=draw(st.sampled_from(("float16", "bfloat16"))),
                    layouts=draw(st.tuples(*[st.sampled_from(LAYOUTS)] * 3)), scale_op=None, bias=bias,
                    bias_grad=draw(st.booleans()), alibi=False, softcap=None, mask=None, mask_fill=float("-inf"),
                    mask_keep=1.0, band=None, causal=causal, dropout_p=0.0, seed=draw(st.integers(0, 2**31 - 1)))

    return build().filter(lambda case: not gluon_refusals(case))


def gluon_refusals(case: Case) -> list[str]:
    """Why the Gluon kernels would not compute ``case`` on an sm90 GPU (:func:`hopper_reasons` of its spec)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fuse_attn.kernels.hopper.common import hopper_reasons

    spec = op_inputs(case).spec
    # (fake tensors on "cuda", the capability an sm90 GPU's, with or without a GPU here)
    with FakeTensorMode(), mock.patch.object(torch.cuda, "get_device_capability", lambda device=None: (9, 0)):
        q = torch.empty(case.Z, case.H, case.M, case.D, dtype=case.torch_dtype, device="cuda")
        k = torch.empty(case.Z, case.kv_heads, case.N, case.D, dtype=case.torch_dtype, device="cuda")
        return hopper_reasons(spec, q, k)


def gluon_op(q, k, v, spec, score_tensors, dropout_seed=None):
    """:func:`flash_attention_hopper` called as :func:`check_op` calls the template's op."""
    from fuse_attn.kernels.hopper.forward import flash_attention_hopper

    return flash_attention_hopper(q, k, v, spec, bias=score_tensors[0] if score_tensors else None)


def index_visibility(case: Case) -> torch.Tensor:
    """[M, N] bool: which keys the causal band and the index band show to each query."""
    M, N = case.M, case.N
    i, j = torch.arange(M)[:, None], torch.arange(N)[None, :]
    visible = torch.ones(M, N, dtype=torch.bool)
    if case.causal is not None:
        offset = case.causal.offset(M, N)
        visible &= j <= i + offset
        if case.causal.window is not None:
            visible &= j > i + offset - case.causal.window
    if case.band is not None:
        visible &= j <= i + case.band
    return visible


def mask_tensor(case: Case, g: torch.Generator) -> torch.Tensor:
    """The case's bool mask (True: kept). With a finite fill, each row keeps its last key that the causal band and
    the index band show: a row whose visible scores are all one large finite fill is the Gluon backward's known limit
    (docs/testing.md: the saved fp32 lse cannot hold fill + log N; the generated kernels' backward recomputes such rows'
    statistics, tests/kernels/test_edge_semantics.py); rows with nothing visible at all are -inf rows, fuzzed."""
    Z, H, M, N = case.Z, case.H, case.M, case.N
    shape = tuple(1 if bc else n for bc, n in zip(case.mask, (Z, H, M, N)))
    keep = torch.rand(shape, generator=g) < case.mask_keep
    if case.fill_value() == float("-inf"):
        return keep
    visible = index_visibility(case)
    last = torch.where(visible, torch.arange(N).expand(M, N), -1).max(1).values  # per row, -1 if none
    rows = torch.nonzero(last >= 0).flatten()
    keep[:, :, rows, last[rows]] = True
    return keep


# ---- the op's inputs ---------------------------------------------------------------------------------------------
def _base_and_view(layout: str, shape: tuple[int, int, int, int], g: torch.Generator, dtype: torch.dtype):
    """A leaf tensor and a function giving the 4-D ``shape`` view of it (or of its fp64 / eager copy):
    contiguous; transposed (a [Z, L, H, E] projection output, ``.transpose(1, 2)``); sliced (every other row of a
    wider tensor, the middle third of its last dim, as q/k/v split from one fused projection); expanded (one batch
    element broadcast over Z with stride 0, or one head over H)."""
    Z, H, L, E = shape
    if layout == "transposed":
        return torch.randn(Z, L, H, E, generator=g).to(dtype), lambda t: t.transpose(1, 2)
    if layout == "sliced":
        return torch.randn(Z, H, 2 * L, 3 * E, generator=g).to(dtype), lambda t: t[:, :, ::2, E:2 * E]
    if layout == "expanded":
        if H > 1 and Z == 1:
            return torch.randn(Z, 1, L, E, generator=g).to(dtype), lambda t: t.expand(Z, H, L, E)
        return torch.randn(1, H, L, E, generator=g).to(dtype), lambda t: t.expand(Z, H, L, E)
    return torch.randn(Z, H, L, E, generator=g).to(dtype), lambda t: t


@dataclass
class OpInputs:
    bases: list  # leaves: q, k, v bases, then the score tensors
    views: list  # per base: the function making the op's operand from it
    grads: list  # per base: whether its gradient is checked
    spec: AttentionSpec
    dropout_seed: Optional[torch.Tensor]


def op_inputs(case: Case) -> OpInputs:
    g = torch.Generator().manual_seed(case.seed)
    dtype = case.torch_dtype
    Z, H, Hk, M, N = case.Z, case.H, case.kv_heads, case.M, case.N
    bases, views = [], []
    for layout, shape in zip(case.layouts, ((Z, H, M, case.D), (Z, Hk, N, case.D), (Z, Hk, N, case.DV))):
        base, view = _base_and_view(layout, shape, g, dtype)
        bases.append(base)
        views.append(view)
    grads = [True, True, True]
    infos = []
    b = ScoreProgramBuilder()
    x = s = b.add("score")

    def add_tensor(role, tensor, broadcast, grad):
        infos.append(ScoreTensor(role, dtype_name(tensor.dtype), broadcast))
        bases.append(tensor)
        views.append(lambda t: t)
        grads.append(grad)
        return b.add("load", value=len(infos) - 1)

    if case.scale_op is not None:
        x = b.add("mul", x, b.const(case.scale_op))
    if case.bias is not None:
        shape = tuple(1 if bc else n for bc, n in zip(case.bias, (Z, H, M, N)))
        x = b.add("add", x, add_tensor("bias", torch.randn(shape, generator=g).to(dtype), case.bias, case.bias_grad))
    if case.alibi:
        slopes = -torch.rand(1, H, 1, 1, generator=g).to(dtype)
        distance = b.add("sub", b.add("kv_idx"), b.add("q_idx"))
        x = b.add("add", x, b.add("mul", add_tensor("bias", slopes, (True, False, True, True), case.bias_grad), distance))
    if case.softcap is not None:
        x = b.add("mul", b.add("tanh", b.add("div", x, b.const(case.softcap))), b.const(case.softcap))
    if case.mask is not None:
        x = b.add("where", add_tensor("mask", mask_tensor(case, g), case.mask, False), x, b.const(float(case.fill_value())))
    if case.band is not None:
        visible = b.add("le", b.add("kv_idx"), b.add("add", b.add("q_idx"), b.const(case.band)))
        x = b.add("where", visible, x, b.const(float("-inf")))
    spec = AttentionSpec(dtype=case.dtype, head_dim=case.D, head_dim_v=case.DV, scale=1 / math.sqrt(case.D),
                         causal=case.causal, score_program=b.program(x), score_tensors=tuple(infos), gqa_group=case.gqa,
                         dropout_p=case.dropout_p)
    seed = torch.tensor(case.seed, dtype=torch.int64) if case.dropout_p else None
    return OpInputs(bases, views, grads, spec, seed)


def check_op(case, device="cpu", op=flash_attention) -> dict[str, torch.Tensor]:
    """The op on ``case``: output and every gradient against eager in the dtype and fp64 (same dropout mask).
    Returns our gradients by name ("dq", "dk", "dv", "d(score tensor i)"; those checked). ``op``: another op of
    flash_attention's signature (:func:`gluon_op`)."""
    inputs = op_inputs(case)
    dtype = case.torch_dtype

    def run(cast):
        leaves = [(b.to(device, cast) if cast is not None and b.is_floating_point() else b.to(device)).detach()
                  .requires_grad_(need) for b, need in zip(inputs.bases, inputs.grads)]
        operands = [view(t) for view, t in zip(inputs.views, leaves)]
        return leaves, operands

    seed = None if inputs.dropout_seed is None else inputs.dropout_seed.to(device)
    ours_leaves, ours = run(None)
    failures_before = set(_op_module._kernel_failures)
    out = op(*ours[:3], inputs.spec, ours[3:], dropout_seed=seed)
    results = {}
    for name, cast in (("ref", torch.float64), ("eager", None)):
        leaves, operands = run(cast)
        results[name] = (leaves, reference_attention(*operands[:3], operands[3:], inputs.spec, seed)[0])
    assert out.dtype == dtype and out.is_contiguous()
    assert_matches_eager("out", out, results["ref"][1], results["eager"][1], dtype)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(case.seed + 2)).to(device, dtype)
    want = [i for i, need in enumerate(inputs.grads) if need]
    names = ["dq", "dk", "dv"] + [f"d(score tensor {i})" for i in range(len(inputs.bases) - 3)]
    grads = {"ours": torch.autograd.grad(out, [ours_leaves[i] for i in want], dout)}
    for name, (leaves, res) in results.items():
        grads[name] = torch.autograd.grad(res, [leaves[i] for i in want], dout.to(res.dtype))
    for i, a, r, e in zip(want, grads["ours"], grads["ref"], grads["eager"]):
        assert a.dtype == inputs.bases[i].dtype
        assert_matches_eager(names[i], a, r, e, dtype)
    # the kernels ran (a kernel failure would have fallen back to the blockwise path, which would pass)
    assert _op_module._kernel_failures == failures_before, f"kernels failed: {_op_module._kernel_failures - failures_before}"
    return {names[i]: a for i, a in zip(want, grads["ours"])}


# ---- comparison --------------------------------------------------------------------------------------------------
def assert_matches_eager(name: str, ours: torch.Tensor, ref64: torch.Tensor, eager: torch.Tensor, dtype: torch.dtype,
                         known_relative_error: float = 0.0):
    """Non-finite elements exactly eager's; finite ones within 2x eager's error against fp64 (+ a floor, + a
    documented error source of ours that eager lacks, ``known_relative_error`` x max|ref|).

    Where eager is non-finite and fp64 is not, eager's kernels made it, not the semantics: torch's CPU bf16 matmul
    (AVX512) carries the NaN rows of a P whose rows past N saw no key into other output rows of their block (``p @ v``
    NaN at a row whose own ``p[i] @ v`` is finite). There ours must be finite, as fp64 is, within the rule."""
    assert ours.shape == eager.shape == ref64.shape, f"{name}: shapes {ours.shape} / {eager.shape} / {ref64.shape}"
    ours, ref64, eager = ours.double(), ref64.double(), eager.double()
    eager_artifact = ~torch.isfinite(eager) & torch.isfinite(ref64)
    for what, test in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        differ = (test(ours) != test(eager)) & ~eager_artifact
        assert not differ.any(), (f"{name}: {what} at {differ.sum().item()} elements where eager differs, "
                                  f"first at {tuple(differ.nonzero()[0].tolist())}")
    assert torch.isfinite(ours[eager_artifact]).all(), f"{name}: non-finite where fp64 is finite"
    finite = torch.isfinite(ours) & torch.isfinite(ref64)
    finite_eager = torch.isfinite(eager) & torch.isfinite(ref64)
    if not finite_eager.any():
        return
    err = (ours[finite] - ref64[finite]).abs().max().item()
    err_eager = (eager[finite_eager] - ref64[finite_eager]).abs().max().item()
    floor = FLOOR[dtype] * max(1.0, ref64[finite].abs().max().item())
    floor += known_relative_error * ref64[finite].abs().max().item()
    assert err <= 2 * err_eager + floor, f"{name}: max|ours-ref|={err:.3g} > 2*{err_eager:.3g} + {floor:.3g}"


# ---- an eager module spelling the same attention (for torch.compile) ---------------------------------------------
class GeneratedAttention(torch.nn.Module):
    """The attention of a Case as model code writes it: q/k/v arrive as ``[Z, L, H, E]`` projection outputs (or
    ``[Z, H, L, E]``), GQA by ``repeat_interleave``, the scale as ``* D ** -0.5``, ``+ bias``, ALiBi from ``arange``,
    ``tanh`` softcap, ``masked_fill(~mask, fill)``, causal/window and band masks from ``tril`` / ``arange``
    comparisons, softmax in fp32 for half inputs. Inputs: q, k, v, then the bias and the bool mask if any."""

    def __init__(self, case: Case):
        super().__init__()
        self.case = case
        if case.alibi:
            self.slopes = torch.nn.Parameter(-torch.rand(case.H, generator=torch.Generator().manual_seed(case.seed)))

    def forward(self, q, k, v, *tensors):
        c = self.case
        q, k, v = (t.transpose(1, 2) if layout == "transposed" else t for t, layout in zip((q, k, v), c.layouts))
        if c.gqa > 1:
            k, v = k.repeat_interleave(c.gqa, dim=1), v.repeat_interleave(c.gqa, dim=1)
        s = q @ k.transpose(-1, -2) * c.D ** -0.5
        if c.scale_op is not None:
            s = s * c.scale_op
        rest = list(tensors)
        if c.bias is not None:
            s = s + rest.pop(0)
        M, N = q.shape[-2], k.shape[-2]
        i = torch.arange(M, device=q.device)[:, None]
        j = torch.arange(N, device=q.device)[None, :]
        if c.alibi:
            s = s + self.slopes[:, None, None] * (j - i)
        if c.softcap is not None:
            s = torch.tanh(s / c.softcap) * c.softcap
        if c.mask is not None:
            s = s.masked_fill(~rest.pop(0), c.fill_value())
        if c.band is not None:
            s = s.masked_fill(j > i + c.band, float("-inf"))
        if c.causal is not None:
            offset = c.causal.offset(M, N)
            visible = torch.ones(M, N, dtype=torch.bool, device=q.device).tril(offset)
            if c.causal.window is not None:
                visible = visible & (j > i + offset - c.causal.window)
            s = s.masked_fill(~visible, float("-inf"))
        p = torch.softmax(s.float(), dim=-1).to(q.dtype) if q.dtype != torch.float32 else torch.softmax(s, dim=-1)
        return p @ v


def module_inputs(case: Case) -> list[torch.Tensor]:
    """The inputs of :class:`GeneratedAttention` (in fp32: the caller casts them)."""
    g = torch.Generator().manual_seed(case.seed + 1)
    Z, H, M, N = case.Z, case.H, case.M, case.N
    out = []
    for layout, (heads, length, dim) in zip(case.layouts, ((H, M, case.D), (case.kv_heads, N, case.D), (case.kv_heads, N, case.DV))):
        shape = (Z, length, heads, dim) if layout == "transposed" else (Z, heads, length, dim)
        out.append(torch.randn(shape, generator=g))
    if case.bias is not None:
        out.append(torch.randn(tuple(1 if bc else n for bc, n in zip(case.bias, (Z, H, M, N))), generator=g))
    if case.mask is not None:
        out.append(mask_tensor(case, g))
    return out
