"""Find attentions in a pre-autograd ATen graph by what they compute.

Anchor: every softmax over the last dim. From it the matcher walks

* backwards along the *score path* (:mod:`fuse_attn.graph.score_reader`) -- any pointwise ops, casts, batch-only
  reshapes, clones and their in-place forms -- to a batched matrix product (the scores ``q @ k^T``: ``matmul`` /
  ``bmm``, a ``baddbmm`` whose added input becomes a bias, or a two-operand ``einsum``: one in another dim order, or
  with an ellipsis, is first rewritten as the product of permuted operands, permuted back). The ops become the
  spec's score program; constant masks equal to a causal band become ``spec.causal``. Scalar factors applied to
  ``q`` or ``k`` before the product (behind any views) are peeled into the scale.
* forwards through casts, batch-only reshapes, identity ops and dropout (eval mode: the identity; training:
  the spec's ``dropout_p``, applied in the kernel) to the product ``P @ V``.

Repeated kv heads (``repeat_kv``, ``repeat_interleave``, a broadcast single head) are folded into ``gqa_group``.

Attention sinks (gpt-oss): the scores joined to one more column of logits (``cat([s, sink], -1)``, or the column
first), optionally shifted by their row max (a no-op for the softmax, as it is for scores without a sink), the softmax
taken and the column dropped (``p[..., :-1]``, or ``p[..., 1:]``). The
column stays outside the spec: the weights over the keys are the plain softmax's times ``sigmoid(lse - sink)`` (the
sink's share of the denominator), which the rewrite applies to the fused op's output with its lse. The softmax
input's ``logsumexp`` over the keys, read besides the softmax (FlexAttention's form of a sink: ``(softmax(s) @ v) *
sigmoid(logsumexp(s) - sink)``), is served by the fused op's lse too.

Whatever cannot be proven equivalent raises :class:`NotFused` with the reason; the caller records it.
The matcher emits no Triton: its result is an :class:`AttentionMatch` holding an ``AttentionSpec``.
"""

from __future__ import annotations

import operator
import sys
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx as fx

from fuse_attn.graph.nodes import (
    CAST_OPS,
    CONTRACTION_OPS,
    IDENTITY_OPS,
    SCALAR_TYPES,
    SOFTMAX_OPS,
    VIEW_OPS,
    MatchContext,
    NotFused,
    all_ones,
    aten,
    cast_dtype,
    is_static,
    logsumexp_over_keys,
    op_name,
    runtime_scalar,
    same_shape,
    shape_text,
    target_of,
    val,
)
from fuse_attn.graph.score_reader import (
    SCORE,
    ConstantEvaluator,
    PathOp,
    Reindexing,
    SideExpressions,
    build_program,
    masking_band,
    stays_masked,
    symbolic_masking_band,
    walk_score_path,
)
from fuse_attn.score_program import ScoreTensor, UnsupportedSpec, role_of
from fuse_attn.spec import MAX_HEAD_DIM, AttentionSpec, CausalMask, dtype_name


@dataclass
class Operand:
    """``node`` with ``views`` (nodes whose first arg is the previous value) replayed on it, then permuted by
    ``permute`` (an einsum operand), times ``factor``."""

    node: fx.Node
    views: list[fx.Node] = field(default_factory=list)
    factor: float = 1.0
    permute: Optional[list[int]] = None
    # the half-precision dtype of ``node`` when the product read it upcast to fp32 (an exact cast, peeled)
    upcast_from: Optional[torch.dtype] = None


@dataclass
class AttentionMatch:
    softmax: fx.Node
    qk: fx.Node
    pv: fx.Node
    q: Operand  # [*b_qk, M, D]
    k: Operand  # the product's right operand k^T [*b_qk, D, N] -- or, when it has a permute (einsum), k itself
    v: Operand  # [*b_pv, N, DV] (after its permute, for einsum)
    qk_batch: tuple  # batch shape of the scores at the product
    pv_batch: tuple  # batch shape of the output
    batch: tuple  # the batch shape the fused op works in (laid out as [Z, H] = [prod(batch[:-1]), batch[-1]])
    # GQA/MQA: the un-repeated k and v ([Z, H // gqa_group, N, D]) to hand to the kernel instead of k and v
    kv_heads_source: Optional[tuple[fx.Node, fx.Node]]
    tensors: list["ScoreTensorUse"]
    spec: AttentionSpec
    matched_nodes: list[fx.Node]
    # attention sinks: the extra logit column [*qk_batch, M, 1] joined to the scores (see the module docstring)
    sink_column: Optional[fx.Node] = None
    # the scores' logsumexp over the keys, read besides the softmax (the module docstring): served by the op's lse
    scores_logsumexp: Optional[fx.Node] = None


@dataclass
class AttentionSink:
    """``cat([scores, column], -1)`` -> [``- max``] -> softmax -> ``[..., :N]``: the nodes around the softmax."""

    scores: fx.Node  # the scores over the keys (the score path's end)
    column: fx.Node  # the sink logits, [*batch, M, 1]
    cat: fx.Node
    weights: fx.Node  # the slice dropping the column: the weights over the keys
    nodes: list[fx.Node]  # between the scores and the slice: cat, the row-max shift's nodes


# --------------------------------------------------------------------------------------------------------------
def softmax_dim_is_last(node: fx.Node) -> bool:
    x = val(node.args[0])
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    return isinstance(dim, int) and x is not None and dim % x.dim() == x.dim() - 1


def _scalar_factor(node: fx.Node, source: fx.Node) -> Optional[float]:
    """If ``node`` is ``source * c`` / ``c * source`` / ``source / c`` with a Python number c, return the factor."""
    target = target_of(node)
    if target in (aten.mul.Tensor, aten.mul.Scalar):
        a, b = node.args[:2]
        other = b if a is source else a if b is source else None
        if isinstance(other, SCALAR_TYPES) and not isinstance(other, bool):
            return float(other)
    if target in (aten.div.Tensor, aten.div.Scalar) and node.args[0] is source and not node.kwargs.get("rounding_mode"):
        c = node.args[1]
        if isinstance(c, SCALAR_TYPES) and not isinstance(c, bool) and c != 0:
            return 1.0 / float(c)
    return None


def peel_scale(node: fx.Node, upcast: bool = True) -> Operand:
    """Walk back from ``node`` through views/identity ops; fold scalar multiplications into a factor, and peel one
    upcast of a half-precision tensor to fp32 (exact: the kernels multiply half-precision tiles in fp32 anyway).

    Views commute with a scalar multiplication and with a cast, so the unscaled operand is the source of the last
    (most upstream) multiplication or upcast with the views met on the way replayed on it in forward order.
    ``upcast=False``: casts are not peeled.
    """
    views: list[fx.Node] = []
    factor = 1.0
    upcast_from = None
    result = Operand(node)
    current = node
    while isinstance(current, fx.Node) and current.op == "call_function":
        if current.target in VIEW_OPS or current.target in IDENTITY_OPS:
            views.append(current)
            current = current.args[0]
            continue
        if upcast and upcast_from is None and _is_exact_upcast(current):
            current = current.args[0]
            upcast_from = val(current).dtype
            result = Operand(current, list(reversed(views)), factor, upcast_from=upcast_from)
            continue
        source = next((a for a in current.args[:2] if isinstance(a, fx.Node)), None)
        c = _scalar_factor(current, source) if source is not None else None
        if c is None:
            break
        factor *= c
        current = source
        result = Operand(current, list(reversed(views)), factor, upcast_from=upcast_from)
    return result


def _is_exact_upcast(node: fx.Node) -> bool:
    """A cast of an fp16 / bf16 tensor to fp32 (``q.float()``), which changes no value."""
    source = node.args[0] if node.args else None
    return (cast_dtype(node) == torch.float32 and isinstance(source, fx.Node)
            and getattr(val(source), "dtype", None) in (torch.float16, torch.bfloat16))


# --------------------------------------------------------------------------------------------------------------
def einsum_as_matmul(node: fx.Node) -> Optional[tuple[list[int], list[int], list[int]]]:
    """A two-operand ``einsum`` that is a batched matrix product ``[batch, m, c] x [batch, n, c] -> [batch, m, n]``:
    the permutations that bring the left operand to ``[batch, m, c]`` and the right one to ``[batch, c, n]`` and
    to ``[batch, n, c]``. None for any other einsum: an ellipsis or another output order
    (:func:`einsum_as_permuted_matmul`, which the rewrite turns into a product of permuted operands before matching),
    broadcasting letters, several contractions..."""
    permutations = einsum_as_permuted_matmul(node)
    if permutations is None or "..." in node.args[0]:
        return None
    left, right, out = permutations
    if out != sorted(out):
        return None
    return left, right, right[:-2] + [right[-1], right[-2]]


def einsum_as_permuted_matmul(node: fx.Node) -> Optional[tuple[list[int], list[int], list[int]]]:
    """A two-operand ``einsum`` that is a batched matrix product with its dims in any order, an ellipsis standing for
    the same leading dims of both operands (LongT5's ``...qhd,...khd->...hqk`` and ``...hqk,...khd->...qhd``): the
    permutations that bring the left operand to ``[batch, m, c]`` and the right one to ``[batch, c, n]``, and the one
    that brings their product ``[batch, m, n]`` to the einsum's output. None for any other einsum (broadcast ellipsis
    dims, letters repeated or summed away, several contractions...)."""
    if node.target != aten.einsum.default or len(node.args[1]) != 2:
        return None
    equation = node.args[0].replace(" ", "")
    if "->" not in equation:
        return None
    inputs, out = equation.split("->")
    x, y = inputs.split(",")
    if "..." in equation:  # the ellipsis as letters of its own, the same leading dims of both operands
        operands = [val(a) for a in node.args[1]]
        if not all(isinstance(t, torch.Tensor) for t in operands) or any(t.count("...") != 1 for t in (x, y, out)):
            return None
        spans = [t.dim() - len(s.replace("...", "")) for t, s in zip(operands, (x, y))]
        if spans[0] != spans[1] or spans[0] < 0 or not all(s.startswith("...") for s in (x, y)):
            return None
        if any(a != b for a, b in zip(operands[0].shape[:spans[0]], operands[1].shape[:spans[0]])):
            return None  # (broadcast ellipsis dims)
        letters = "".join(c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in equation)[:spans[0]]
        x, y, out = (s.replace("...", letters) for s in (x, y, out))
    if any(len(set(t)) != len(t) for t in (x, y, out)) or len(out) < 2 or not set(out) <= set(x) | set(y):
        return None
    contracted = [c for c in x if c in y and c not in out]
    m = [c for c in x if c not in y]
    n = [c for c in y if c not in x]
    if len(contracted) != 1 or len(m) != 1 or len(n) != 1:
        return None
    batch = [c for c in out if c in x and c in y]
    if set(x) != set(batch) | {m[0], contracted[0]} or set(y) != set(batch) | {n[0], contracted[0]}:
        return None
    product = batch + m + n
    if sorted(out) != sorted(product):  # (m or n summed away)
        return None
    return ([x.index(c) for c in batch + m + contracted], [y.index(c) for c in batch + contracted + n],
            [product.index(c) for c in out])


def _is_qk_product(node: fx.Node) -> bool:
    target = target_of(node)
    return target in CONTRACTION_OPS or target == aten.baddbmm.default or einsum_as_matmul(node) is not None


def _walk_to_pv(softmax: fx.Node):
    """From the softmax forward to ``P @ V``. Returns (pv node, chain nodes, the training dropout's p or 0)."""
    chain = [softmax]
    node = softmax
    dropout_p = 0.0
    while True:
        users = list(node.users)
        if len(users) != 1:
            names = ", ".join(u.name for u in users) or "nothing"
            raise NotFused(f"the attention weights {node.name} are used by {names}, not by one P @ V product", node)
        user = users[0]
        if user.op != "call_function":
            raise NotFused(f"the attention weights {node.name} are returned or passed to {user.op} {user.name}", node)
        target = user.target
        if target in CONTRACTION_OPS:
            if user.args[0] is not node or user.args[1] is node:
                raise NotFused(f"{user.name} multiplies the attention weights from the right", user)
            return user, chain, dropout_p
        einsum = einsum_as_matmul(user)
        if einsum is not None:
            left_perm = einsum[0]
            if user.args[1][0] is not node or user.args[1][1] is node or left_perm != sorted(left_perm):
                raise NotFused(f"{user.name}: the einsum does not multiply the weights [.., q, k] from the left", user)
            return user, chain, dropout_p
        if target in IDENTITY_OPS or (target in CAST_OPS and cast_dtype(user) is not None):
            pass
        elif target in (aten.view.default, aten.reshape.default, aten._unsafe_view.default):
            if not same_shape(val(node).shape[-2:], val(user).shape[-2:]):
                raise NotFused(f"{user.name} reshapes the attention weights across their last two dims", user)
        elif target in (aten.dropout.default, aten.native_dropout.default):
            p, train = user.args[1], user.args[2]
            if target == aten.native_dropout.default:
                raise NotFused(f"{user.name}: native_dropout on the attention weights is not folded", user)
            if train and p > 0:
                if dropout_p:
                    raise NotFused(f"{user.name}: a second dropout on the attention weights", user)
                if not isinstance(p, float) or not 0 < p < 1:
                    raise NotFused(f"{user.name}: dropout with p={p}", user)
                dropout_p = p
        else:
            raise NotFused(f"the attention weights {node.name} go through {op_name(target)} ({user.name}) before P @ V", user)
        chain.append(user)
        node = user


# --------------------------------------------------------------------------------------------------------------
def _skip_noop_slices(node: fx.Node) -> fx.Node:
    """Through ``x[:, :, ...]``-style slices that keep every element."""
    while (
        isinstance(node, fx.Node)
        and node.target == aten.slice.Tensor
        and same_shape(val(node).shape, val(node.args[0]).shape)
        and (len(node.args) < 5 or node.args[4] == 1)
    ):
        node = node.args[0]
    return node


def _repeated_heads(node: fx.Node) -> Optional[tuple[fx.Node, int]]:
    """``(x, g)`` when ``node`` [Z, H*g, N, D] repeats each head of ``x`` [Z, H, N, D] g times in place
    (head h of node is head h // g of x): Hugging Face's ``repeat_kv`` (``x[:, :, None].expand(...).reshape``)
    or ``repeat_interleave(x, g, dim=1)``."""
    if node.target == aten.repeat_interleave.self_int:
        x, repeats = node.args[:2]
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim")
        if isinstance(repeats, int) and val(x).dim() == 4 and dim is not None and dim % 4 == 1:
            return x, repeats
        return None
    if node.target not in (aten.reshape.default, aten.view.default, aten._unsafe_view.default):
        return None
    expanded = node.args[0]
    while expanded.target in IDENTITY_OPS:
        expanded = expanded.args[0]
    if expanded.target != aten.expand.default:
        return None
    unsqueezed = _skip_noop_slices(expanded.args[0])
    if unsqueezed.target != aten.unsqueeze.default or unsqueezed.args[1] % 5 != 2:
        return None
    x = _skip_noop_slices(unsqueezed.args[0])
    source, repeated, out = val(x).shape, val(expanded).shape, val(node).shape
    if len(source) != 4 or len(repeated) != 5 or not isinstance(repeated[2], int):
        return None
    g = repeated[2]
    expected = (source[0], source[1] * g, source[2], source[3])
    if not same_shape(repeated[:2], source[:2]) or not same_shape(repeated[3:], source[2:]) or not same_shape(out, expected):
        return None
    return x, g


def _fold_kv_heads(k_operand: Operand, b: fx.Node, v: fx.Node, batch: tuple, qk_batch: tuple, pv_batch: tuple):
    """GQA / MQA: ``(group, k source, v source)`` when k and v repeat (or broadcast) kv heads over the q heads;
    the kernel then indexes the shared head instead of reading copies. ``(1, None, None)`` otherwise."""
    if len(batch) != 2 or not same_shape(qk_batch, batch) or not same_shape(pv_batch, batch) or k_operand.node is not b:
        return 1, None, None
    if b.target != aten.transpose.int or {d % 4 for d in b.args[1:3]} != {2, 3}:
        return 1, None, None
    k = b.args[0]
    k_rep, v_rep = _repeated_heads(k), _repeated_heads(v)
    if k_rep and v_rep and k_rep[1] == v_rep[1] > 1:
        return k_rep[1], k_rep[0], v_rep[0]
    heads = batch[1]
    k_heads, v_heads = val(k).shape[1], val(v).shape[1]
    if isinstance(heads, int) and heads > 1 and all_ones((k_heads, v_heads)) and same_shape(val(k).shape[:1], batch[:1]):
        return heads, k, v  # one kv head broadcast over every q head (MQA written with broadcasting)
    return 1, None, None


def row_max_shift(x: fx.Node) -> Optional[tuple[fx.Node, list[fx.Node]]]:
    """``(c, nodes)`` when ``x`` is ``c - max(c, -1, keepdim=True)`` (``.max(...).values`` or ``amax``) and nothing
    else reads ``c`` or its max: a shift the softmax does not see."""
    if target_of(x) != aten.sub.Tensor or len(x.args) < 2 or x.kwargs.get("alpha", 1) != 1:
        return None
    c, row_max = x.args[:2]
    if not isinstance(c, fx.Node) or not isinstance(row_max, fx.Node) or val(c) is None:
        return None
    rank = val(c).dim()
    if row_max.target == operator.getitem and row_max.args[1] == 0:
        reduction = row_max.args[0]
        if target_of(reduction) != aten.max.dim or len(reduction.users) != 1:
            return None
        dim, keepdim = reduction.args[1], reduction.args[2] if len(reduction.args) > 2 else False
        nodes = [reduction, row_max]
    elif target_of(row_max) == aten.amax.default:
        reduction, dims = row_max, list(row_max.args[1])
        dim = dims[0] if len(dims) == 1 else None
        keepdim = row_max.args[2] if len(row_max.args) > 2 else False
        nodes = [row_max]
    else:
        return None
    if reduction.args[0] is not c or dim is None or dim % rank != rank - 1 or not keepdim or len(row_max.users) != 1:
        return None
    if set(c.users) != {x, reduction}:
        return None
    return c, nodes + [x]


def attention_sink(softmax: fx.Node) -> Optional[AttentionSink]:
    """The sink structure around ``softmax`` (gpt-oss's spelling, the module docstring), or None where there is
    none. Raises :class:`NotFused` where the scores are joined to a column but not as a sink."""
    x = softmax.args[0]
    if not isinstance(x, fx.Node):
        return None
    shift = row_max_shift(x)
    c, nodes = shift if shift is not None else (x, [])
    if target_of(c) != aten.cat.default or val(c) is None:
        return None
    parts = c.args[0]
    dim = c.args[1] if len(c.args) > 1 else c.kwargs.get("dim", 0)
    rank = val(c).dim()
    if len(parts) != 2 or dim % rank != rank - 1 or not all(isinstance(p, fx.Node) for p in parts):
        return None
    # the column after the scores (gpt-oss's), or before them (where the scores are no single column too)
    first = val(parts[1]).shape[-1] != 1 and val(parts[0]).shape[-1] == 1
    column, scores = parts if first else parts[::-1]
    n = val(scores).shape[-1]
    if val(column).shape[-1] != 1 or val(column).dim() != rank or len(c.users) != (2 if shift else 1):
        return None
    users = list(softmax.users)
    sliced = users[0] if len(users) == 1 else None
    if sliced is None or target_of(sliced) != aten.slice.Tensor:
        raise NotFused(f"the scores {scores.name} are joined to a column before the softmax, whose weights are not "
                       "then cut back to the keys (an attention sink's form)", softmax)
    s_dim, start, end, step = (list(sliced.args[1:]) + [0, None, None, 1][len(sliced.args) - 1:])[:4]
    if first:  # [..., 1:]: from the column past the sink's to the end
        kept = start == 1 and (end is None or isinstance(end, int) and (end == sys.maxsize
                                                                         or same_shape((end - 1,), (n,))))
    else:  # [..., :-1] or [..., :n]
        kept = start in (0, None) and (end == -1 or (isinstance(end, int) and same_shape((end,), (n,))))
    if s_dim % rank != rank - 1 or step != 1 or not kept:
        raise NotFused(f"{sliced.name} keeps other columns of the weights than the keys the scores were joined "
                       "from", sliced)
    return AttentionSink(scores, column, c, sliced, [c, *nodes])


def _logsumexp_beside(softmax: fx.Node) -> Optional[fx.Node]:
    """The softmax input's ``logsumexp`` over the keys (kept) where it is the input's one other reader, else None."""
    x = softmax.args[0]
    others = [u for u in x.users if u is not softmax] if isinstance(x, fx.Node) else []
    return others[0] if len(others) == 1 and logsumexp_over_keys(others[0]) is x else None


def match_attention(softmax: fx.Node, ctx: MatchContext) -> AttentionMatch:
    if not softmax_dim_is_last(softmax):
        raise NotFused("the softmax is not over the last dim", softmax)
    evaluate = ConstantEvaluator(ctx)
    sink = attention_sink(softmax)
    scores_logsumexp = None
    shift = row_max_shift(softmax.args[0]) if isinstance(softmax.args[0], fx.Node) else None
    if sink is None and shift is not None:
        # the scores less their row max (MiMo-V2's layers without a sink): a shift the softmax does not see; the walk
        # starts at the scores, which the max reads besides the shift
        scores, (reduction, *_) = shift
        qk, path, path_nodes = walk_score_path(softmax, _is_qk_product, scores, softmax.args[0], also_read_by=reduction)
        pv, weight_chain, dropout_p = _walk_to_pv(softmax)
    elif sink is None:
        scores_logsumexp = _logsumexp_beside(softmax)
        qk, path, path_nodes = walk_score_path(softmax, _is_qk_product, also_read_by=scores_logsumexp)
        pv, weight_chain, dropout_p = _walk_to_pv(softmax)
    else:
        # (a column computed from the scores makes them used twice, which the walk refuses)
        qk, path, path_nodes = walk_score_path(softmax, _is_qk_product, sink.scores, sink.cat)
        pv, weight_chain, dropout_p = _walk_to_pv(sink.weights)
        weight_chain = [softmax, *sink.nodes, *weight_chain]  # (the chain starts at the slice)

    qk_einsum, pv_einsum = einsum_as_matmul(qk), einsum_as_matmul(pv)
    if qk_einsum is not None:
        a, b = qk.args[1]
    else:
        a, b = qk.args[1:3] if qk.target == aten.baddbmm.default else qk.args[:2]
    v_node = pv.args[1][1] if pv_einsum is not None else pv.args[1]
    a_val, b_val, v_val, s_val, out_val = val(a), val(b), val(v_node), val(qk), val(pv)
    if any(t is None or t.dim() < 2 for t in (a_val, b_val, v_val)):
        raise NotFused(f"{qk.name}: operands are not batched matrices", qk)
    m, n = s_val.shape[-2:]
    d = a_val.shape[qk_einsum[0][-1]] if qk_einsum else a_val.shape[-1]
    dv = v_val.shape[pv_einsum[1][-1]] if pv_einsum else v_val.shape[-1]

    q_operand, k_operand = peel_scale(a), peel_scale(b)
    q_dtype, k_dtype = a_val.dtype, b_val.dtype
    if q_operand.upcast_from is not None and q_operand.upcast_from == k_operand.upcast_from == v_val.dtype:
        # q and k upcast from v's half precision for the scores (softmax in fp32, the weights cast back for P @ V):
        # the kernels' own arithmetic in that dtype
        q_dtype = k_dtype = v_val.dtype
    else:
        q_operand, k_operand = peel_scale(a, upcast=False), peel_scale(b, upcast=False)
    for name, dtype in (("k", k_dtype), ("v", v_val.dtype)):
        if dtype != q_dtype:
            raise NotFused(f"q is {q_dtype} but {name} is {dtype}", qk)
    for name, t in (("k", b_val), ("v", v_val)):
        if t.device != a_val.device:
            raise NotFused(f"q is on {a_val.device} but {name} is on {t.device}", qk)
    for name, dim in (("head dim", d), ("value head dim", dv)):
        if isinstance(dim, int) and dim > MAX_HEAD_DIM:
            raise NotFused(f"the {name} {dim} is over {MAX_HEAD_DIM}", qk)
    for name, length in (("query", m), ("key", n)):
        if isinstance(length, int) and length == 0:
            raise NotFused(f"the {name} length is 0", qk)

    if qk.target == aten.baddbmm.default:
        # baddbmm(input, q, k^T, beta, alpha) = beta * input + alpha * (q @ k^T)
        beta, alpha = qk.kwargs.get("beta", 1), qk.kwargs.get("alpha", 1)
        if beta not in (0, 1) or not isinstance(alpha, (int, float)):
            raise NotFused(f"{qk.name}: baddbmm with beta={beta}, alpha={alpha} is not folded", qk)
        steps = [("mul", [SCORE, alpha])] + ([("add", [SCORE, qk.args[0]])] if beta == 1 else [])
        path.insert(0, PathOp(qk, steps, tuple(s_val.shape[:-2])))

    # Constant masks that are a causal band (and stay masking through the ops after them) leave the program.
    band = None
    original_path = list(path)  # "what follows a mask" is read here, unchanged by the removals below
    static = isinstance(m, int) and isinstance(n, int)
    for position, op in enumerate(original_path):
        proof = masking_band(op, evaluate, m, n) if static else symbolic_masking_band(op, SideExpressions(evaluate, m, n), m, n)
        if proof is None or (proof[0] == "band" and not stays_masked(proof[2], original_path[position + 1 :], evaluate)):
            continue
        if proof[0] == "band":
            if band is not None and band != proof[1]:
                raise NotFused(f"{op.node.name}: two causal masks with different bands", op.node)
            band = proof[1]
        path.remove(op)

    sides = SideExpressions(evaluate, m, n)
    program = build_program(path, sides, d)
    pv_batch = tuple(out_val.shape[:-2])
    # All batch shapes along the attention are row-major reshapes of one another. Work in the longest one at which
    # a mask/bias applies (so that none of them needs a reshape, which would copy a broadcast tensor densely).
    batch = max([pv_batch] + [op.batch for _, op in program.loads], key=len)
    tensors = [_place_tensor(node, op, batch, a_val.device, sides.reindexed.get(node)) for node, op in program.loads]
    score_tensors = [
        ScoreTensor("bias", "float32", use.broadcast) if use.scalar else
        ScoreTensor(role_of(dtype_name(val(node).dtype)), dtype_name(val(node).dtype), use.broadcast)
        for (node, _), use in zip(program.loads, tensors)
    ]
    scale = q_operand.factor * k_operand.factor * program.scale_factor
    if qk_einsum is not None:  # einsum operands: permute q to [batch, m, d] and k to [batch, n, d]
        q_operand.permute, k_operand.permute = qk_einsum[0], qk_einsum[2]
        gqa_group, k_source, v_source = 1, None, None
    else:
        gqa_group, k_source, v_source = _fold_kv_heads(k_operand, b, v_node, batch, tuple(s_val.shape[:-2]), pv_batch)

    try:
        spec = AttentionSpec(
            dtype=dtype_name(q_dtype),
            head_dim=d if isinstance(d, int) else None,
            head_dim_v=dv if isinstance(dv, int) else None,
            scale=scale,
            scale_head_dim_power=program.head_dim_power,
            causal=CausalMask(band.diagonal, window=band.window) if band is not None else None,
            score_program=program.nodes,
            score_tensors=tuple(score_tensors),
            gqa_group=gqa_group,
            dropout_p=dropout_p,
            # (with a sink, a row whose keys are all masked puts its weight on the sink: eager's output there is 0)
            empty_rows="zero" if softmax.target == aten._safe_softmax.default or sink is not None else "nan",
            q_len=m if isinstance(m, int) else None,
            kv_len=n if isinstance(n, int) else None,
            num_heads=int(out_val.shape[-3]) if out_val.dim() >= 3 and isinstance(out_val.shape[-3], int) else None,
        )
    except UnsupportedSpec as e:
        raise NotFused(str(e), softmax) from None

    return AttentionMatch(
        softmax=softmax,
        qk=qk,
        pv=pv,
        q=q_operand,
        k=k_operand,
        v=Operand(v_node, permute=pv_einsum[1] if pv_einsum else None),
        qk_batch=tuple(s_val.shape[:-2]),
        pv_batch=pv_batch,
        batch=batch,
        kv_heads_source=(k_source, v_source) if k_source is not None else None,
        tensors=tensors,
        spec=spec,
        matched_nodes=[qk, *path_nodes, *weight_chain, pv],
        sink_column=sink.column if sink is not None else None,
        scores_logsumexp=scores_logsumexp,
    )


@dataclass
class ScoreTensorUse:
    """A mask/bias node as the fused op receives it: ``node`` (at ``tensor_batch``), reshaped to the attention's
    batch when ``rebatch``, then laid out 4-D; ``broadcast`` is its (Z, H, M, N) broadcast pattern there.

    With ``scalar``, ``node`` is a float read at run time (:func:`fuse_attn.graph.nodes.runtime_scalar`: a scale or a
    softcap Dynamo lifted to an input), which the op receives as a one-element fp32 tensor on q's device -- a
    run-time argument of the kernels, so one compiled graph serves every value. With ``reindexed``, ``node`` is a
    gather that the op receives as that view of its source (the gather itself is never computed)."""

    node: fx.Node
    tensor_batch: tuple
    rebatch: bool
    broadcast: tuple[bool, bool, bool, bool]
    scalar: bool = False
    reindexed: Optional[Reindexing] = None
    # the batch ``node`` is expanded to first, where it is broadcast over some of the dims that make the attention's
    # Z but not all (a mask a window, the same for every image: [1, windows, 1, M, N] in batch [B, windows, H])
    expanded_batch: Optional[tuple] = None


def _place_tensor(tensor: fx.Node, op: PathOp, batch: tuple, device,
                  reindexed: Optional[Reindexing] = None) -> ScoreTensorUse:
    """How the fused op receives ``tensor``, a side input of path op ``op`` broadcast against its value (or a float
    read at run time, :attr:`ScoreTensorUse.scalar`; or a gather read as a view of its source, ``reindexed``)."""
    if runtime_scalar(tensor) is not None:
        return ScoreTensorUse(tensor, (), False, (True, True, True, True), scalar=True)
    fake = val(tensor)
    rank = len(op.batch) + 2
    if fake.dim() > rank:
        raise NotFused(f"{op.node.name}: the mask/bias {shape_text(fake.shape)} has more dims than the scores", op.node)
    if fake.device != device:
        raise NotFused(f"{op.node.name}: the mask/bias is on {fake.device}, q on {device}", op.node)
    shape = (1,) * (rank - fake.dim()) + tuple(fake.shape)
    own_batch, tail = shape[:-2], shape[-2:]
    rebatch, expanded_batch = False, None
    if all_ones(own_batch):
        batch_part = ()
    elif same_shape(op.batch, batch):
        batch_part = own_batch
        if not all_ones(own_batch[:-1]) and not same_shape(own_batch[:-1], batch[:-1]):
            if not is_static(batch):
                raise NotFused(f"{op.node.name}: a mask/bias broadcast over part of the batch rows "
                               f"{shape_text(op.batch)} with symbolic sizes", op.node)
            batch_part = expanded_batch = (*batch[:-1], own_batch[-1])
    elif is_static(own_batch) and same_shape(own_batch, op.batch) and is_static(batch):
        batch_part, rebatch = batch, True  # a view: the tensor is not broadcast over its batch dims
    elif all_ones(own_batch[:-1]) and same_shape(op.batch[-1:], batch[-1:]):
        # a tensor a head, broadcast over the batch rows that a view regroups while it keeps the heads (Swin-v2's
        # logit scale, before the scores' batch is split into windows for the mask)
        batch_part = (1,) * (len(batch) - 1) + own_batch[-1:]
    else:
        raise NotFused(
            f"{op.node.name}: a mask/bias broadcast over part of batch {shape_text(op.batch)} while the attention "
            f"works in batch {shape_text(batch)}",
            op.node,
        )
    broadcast = (all_ones(batch_part[:-1]), all_ones(batch_part[-1:]), all_ones(tail[:1]), all_ones(tail[1:]))
    return ScoreTensorUse(tensor, op.batch, rebatch, broadcast, reindexed=reindexed, expanded_batch=expanded_batch)


def find_softmaxes(graph: fx.Graph) -> list[fx.Node]:
    return [n for n in graph.nodes if n.op == "call_function" and n.target in SOFTMAX_OPS]


_PRODUCTS = CONTRACTION_OPS | {aten.einsum.default, aten.baddbmm.default}


def weights_meet_a_product(softmax: fx.Node, budget: int = 64) -> bool:
    """Whether ``softmax`` is an attention's, fused or not: its weights reach a matrix product (``P @ V``) through
    ops that keep their last two dims (views, casts, dropout, a head mask, ...). A softmax whose weights meet no
    product -- a classifier's probabilities, a router's gates -- is no attention, and the report does not warn
    that it is left unfused."""
    weights = val(softmax)
    if not isinstance(weights, torch.Tensor):
        return True  # nothing to tell it by: counted as an attention
    seen, pending = set(), [softmax]
    while pending and budget > 0:
        node = pending.pop()
        for user in node.users:
            if user in seen or user.op != "call_function":
                continue
            seen.add(user)
            budget -= 1
            if user.target in _PRODUCTS:
                return True
            value = val(user)
            if isinstance(value, (tuple, list)) or (isinstance(value, torch.Tensor) and value.dim() >= 2
                                                    and same_shape(value.shape[-2:], weights.shape[-2:])):
                pending.append(user)
    return False
