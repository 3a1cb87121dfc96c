"""Find attentions in a pre-autograd ATen graph by what they compute.

Anchor: every softmax over the last dim. From it the matcher walks

* backwards through the *score chain* -- casts, batch-only reshapes, clones, scalar multiplications and
  divisions, additive tensors, ``masked_fill`` / ``where`` with a boolean tensor, ``tanh`` (softcaps), and the
  in-place forms of these -- to a batched matrix product (the scores ``q @ k^T``: ``matmul`` / ``bmm``, a
  ``baddbmm`` whose added input becomes a bias, or a two-operand ``einsum``). Scalar factors applied to ``q`` or
  ``k`` before the product (behind any views) are peeled into the scale.
* forwards through casts, batch-only reshapes, identity ops and eval-mode dropout to the product ``P @ V``.

Repeated kv heads (``repeat_kv``, ``repeat_interleave``, a broadcast single head) are folded into ``gqa_group``.

Masks and biases that are computed from constants only (``tril``/``triu``, ``arange`` comparisons, a sliced
registered buffer) are *evaluated* at compile time; one equal to a causal pattern (as fill or as an additive
0/-inf tensor) becomes ``spec.causal``, so the kernel skips masked blocks instead of loading a tensor.

Whatever cannot be proven equivalent raises :class:`NotFused` with the reason; the caller records it.
The matcher emits no Triton: its result is an :class:`AttentionMatch` holding an ``AttentionSpec``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.fx as fx

from .graph_utils import (
    CAST_OPS,
    CONTRACTION_OPS,
    IDENTITY_OPS,
    SOFTMAX_OPS,
    VIEW_OPS,
    all_ones,
    aten,
    cast_dtype,
    is_pure,
    is_static,
    same_shape,
    shape_text,
    val,
)
from .spec import MAX_HEAD_DIM, AddTensor, AttentionSpec, CausalMask, FillWhere, ScaleScores, ScoreTensor, Tanh, UnsupportedSpec

# A fill value at or below this masks a key exactly like -inf would for any row that keeps one key whose score is
# above it: it is float16's most negative finite value, the smallest fill Hugging Face style masks use
# (torch.finfo(dtype).min), and exp(fill - rowmax) underflows to 0 in fp32 once the gap exceeds ~104.
MASKING_FILL_LIMIT = -65504.0
# Masks are evaluated at compile time only up to this many elements (a 16384 x 16384 causal mask is 2**28; the
# evaluation makes a few temporaries of that size on the host, so bigger ones are loaded as tensors instead).
MAX_EVALUATED_MASK_ELEMENTS = 2**28
# A masked score this negative stays masked after adding any bias short of 1e29 in magnitude (finfo(fp32).min is
# -3.4e38; a bias that large would itself overflow any attention).
HUGE_NEGATIVE = -1e30

_SCALAR_TYPES = (int, float)


class NotFused(Exception):
    """A softmax that is not rewritten, with the reason and the node it is about."""

    def __init__(self, reason: str, node: Optional[fx.Node] = None):
        super().__init__(reason)
        self.reason = reason
        self.node = node


@dataclass
class MatchContext:
    """What the matcher may know beyond the graph: real values of constant inputs (registered buffers)."""

    constant_inputs: dict[fx.Node, torch.Tensor] = field(default_factory=dict)
    gm: Optional[fx.GraphModule] = None


@dataclass
class Operand:
    """``node`` with ``views`` (nodes whose first arg is the previous value) replayed on it, then permuted by
    ``permute`` (an einsum operand), times ``factor``."""

    node: fx.Node
    views: list[fx.Node] = field(default_factory=list)
    factor: float = 1.0
    permute: Optional[list[int]] = None


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


# --------------------------------------------------------------------------------------------------------------
def softmax_dim_is_last(node: fx.Node) -> bool:
    x = val(node.args[0])
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    return isinstance(dim, int) and x is not None and dim % x.dim() == x.dim() - 1


# In-place pointwise ops on the scores (pre-autograd graphs keep them) read as their functional forms: the walk
# only accepts a chain where each value has one user, so the mutation is seen by nothing else.
FUNCTIONAL_FORM = {
    aten.mul_.Tensor: aten.mul.Tensor,
    aten.mul_.Scalar: aten.mul.Scalar,
    aten.div_.Tensor: aten.div.Tensor,
    aten.div_.Scalar: aten.div.Scalar,
    aten.add_.Tensor: aten.add.Tensor,
    aten.masked_fill_.Scalar: aten.masked_fill.Scalar,
    aten.masked_fill_.Tensor: aten.masked_fill.Tensor,
    aten.tanh_.default: aten.tanh.default,
}


def _target(node: fx.Node):
    return FUNCTIONAL_FORM.get(node.target, node.target)


def _scalar_factor(node: fx.Node, source: fx.Node) -> Optional[float]:
    """If ``node`` is ``source * c`` / ``c * source`` / ``source / c`` with a Python number c, return the factor."""
    target = _target(node)
    if target in (aten.mul.Tensor, aten.mul.Scalar):
        a, b = node.args[:2]
        other = b if a is source else a if b is source else None
        if isinstance(other, _SCALAR_TYPES) and not isinstance(other, bool):
            return float(other)
    if target in (aten.div.Tensor, aten.div.Scalar) and node.args[0] is source and not node.kwargs.get("rounding_mode"):
        c = node.args[1]
        if isinstance(c, _SCALAR_TYPES) and not isinstance(c, bool) and c != 0:
            return 1.0 / float(c)
    return None


def peel_scale(node: fx.Node) -> Operand:
    """Walk back from ``node`` through views/identity ops; fold scalar multiplications into a factor.

    Views commute with a scalar multiplication, so the unscaled operand is the source of the last (most
    upstream) multiplication with the views met on the way replayed on it in forward order.
    """
    views: list[fx.Node] = []
    factor = 1.0
    result = Operand(node)
    current = node
    while isinstance(current, fx.Node) and current.op == "call_function":
        if current.target in VIEW_OPS or current.target in IDENTITY_OPS:
            views.append(current)
            current = current.args[0]
            continue
        source = next((a for a in current.args[:2] if isinstance(a, fx.Node)), None)
        c = _scalar_factor(current, source) if source is not None else None
        if c is None:
            break
        factor *= c
        current = source
        result = Operand(current, list(reversed(views)), factor)
    return result


# --------------------------------------------------------------------------------------------------------------
class _ConstantEvaluator:
    """Evaluates a node whose value follows from constants alone (no graph input but registered buffers)."""

    def __init__(self, ctx: MatchContext):
        self.ctx = ctx
        self.memo: dict[fx.Node, Any] = {}

    def __call__(self, node: Any) -> Any:
        if not isinstance(node, fx.Node):
            if isinstance(node, (list, tuple)):
                return type(node)(self(a) for a in node)
            return node
        if node in self.memo:
            return self.memo[node]
        result = self._evaluate(node)
        self.memo[node] = result
        return result

    def _evaluate(self, node: fx.Node) -> Any:
        fake = val(node)
        if isinstance(fake, torch.Tensor):
            if not is_static(fake.shape):
                raise NotFused(f"{node.name} has a symbolic shape {shape_text(fake.shape)}", node)
            if fake.numel() > MAX_EVALUATED_MASK_ELEMENTS:
                raise NotFused(f"{node.name} is too large to evaluate at compile time", node)
        if node.op == "placeholder":
            if node in self.ctx.constant_inputs:
                return self.ctx.constant_inputs[node]
            raise NotFused(f"{node.name} is a graph input, not a constant", node)
        if node.op == "get_attr" and self.ctx.gm is not None:
            return getattr(self.ctx.gm, node.target)
        if node.op != "call_function" or not is_pure(node):
            raise NotFused(f"{node.name} ({node.target}) is not a pure function of constants", node)
        args = self(node.args)
        kwargs = {k: self(v) for k, v in node.kwargs.items()}
        return node.target(*args, **kwargs)


def _as_keep_matrix(keep: torch.Tensor, m: int, n: int) -> Optional[torch.Tensor]:
    """The [m, n] visibility matrix if ``keep`` is the same for every batch entry, else None."""
    keep = keep.to(torch.bool)
    while keep.dim() < 2:
        keep = keep.unsqueeze(0)
    batch = keep.reshape(-1, keep.shape[-2], keep.shape[-1])
    if not bool((batch == batch[:1]).all()):
        return None
    return batch[0].expand(m, n)


def causal_diagonal(keep: torch.Tensor) -> Optional[int]:
    """``d`` such that ``keep == tril(ones, d)`` with every row keeping at least one key; None otherwise."""
    m, n = keep.shape
    d = int(keep[0].sum()) - 1
    if d < 0:
        return None
    expected = torch.ones(m, n, dtype=torch.bool, device=keep.device).tril(d)
    return d if bool((keep == expected).all()) else None


# --------------------------------------------------------------------------------------------------------------
@dataclass
class _ScoreOp:
    kind: str  # "scale" | "add" | "fill"
    node: fx.Node
    batch: tuple
    factor: float = 1.0
    tensor: Optional[fx.Node] = None
    value: float = 0.0
    fill_when: bool = True


def _fill_value(arg: Any, evaluate: _ConstantEvaluator, node: fx.Node) -> float:
    if isinstance(arg, _SCALAR_TYPES) and not isinstance(arg, bool):
        return float(arg)
    if isinstance(arg, fx.Node):
        fake = val(arg)
        if isinstance(fake, torch.Tensor) and all_ones(fake.shape):
            return float(evaluate(arg).reshape(()).item())
    raise NotFused(f"{node.name}: the fill value is not a constant scalar", node)


def _batch_of(node: fx.Node) -> tuple:
    return tuple(val(node).shape[:-2])


def einsum_as_matmul(node: fx.Node) -> Optional[tuple[list[int], list[int], list[int]]]:
    """A two-operand ``einsum`` that is a batched matrix product ``[batch, m, c] x [batch, n, c] -> [batch, m, n]``:
    the permutations that bring the left operand to ``[batch, m, c]`` and the right one to ``[batch, c, n]`` and
    to ``[batch, n, c]``. None for any other einsum (ellipsis, broadcasting letters, several contractions...)."""
    if node.target != aten.einsum.default or len(node.args[1]) != 2:
        return None
    equation = node.args[0].replace(" ", "")
    if "..." in equation or "->" not in equation:
        return None
    inputs, out = equation.split("->")
    x, y = inputs.split(",")
    if any(len(set(t)) != len(t) for t in (x, y, out)) or len(out) < 2:
        return None
    batch, m, n = out[:-2], out[-2], out[-1]
    contracted = [c for c in x if c in y and c not in out]
    if len(contracted) != 1 or m not in x or m in y or n not in y or n in x:
        return None
    c = contracted[0]
    if set(x) != set(batch) | {m, c} or set(y) != set(batch) | {n, c}:
        return None
    return ([x.index(l) for l in batch + m + c], [y.index(l) for l in batch + c + n], [y.index(l) for l in batch + n + c])


def _is_qk_product(node: fx.Node) -> bool:
    target = _target(node)
    return target in CONTRACTION_OPS or target == aten.baddbmm.default or einsum_as_matmul(node) is not None


def _walk_score_chain(softmax: fx.Node, evaluate: _ConstantEvaluator):
    """From the softmax input back to the QK product. Returns (product node, ops in forward order, chain nodes)."""
    ops: list[_ScoreOp] = []
    chain: list[fx.Node] = []
    node = softmax.args[0]
    consumer = softmax
    while True:
        if not isinstance(node, fx.Node):
            raise NotFused("the softmax input is not a tensor node", softmax)
        if len(node.users) != 1:
            others = ", ".join(u.name for u in node.users if u is not consumer)
            raise NotFused(f"the scores {node.name} are also used by {others}", node)
        if node.op != "call_function":
            raise NotFused(f"no q @ k^T product before the softmax: the scores come from {node.op} {node.name}", node)
        target = _target(node)
        chain.append(node)
        if _is_qk_product(node):
            chain.pop()
            break
        consumer = node
        if target in IDENTITY_OPS:
            node = node.args[0]
            continue
        if target in CAST_OPS:
            if cast_dtype(node) not in (torch.float16, torch.bfloat16, torch.float32):
                raise NotFused(f"{node.name} casts the scores to {val(node).dtype}", node)
            node = node.args[0]
            continue
        if target in (aten.view.default, aten.reshape.default, aten._unsafe_view.default):
            before, after = val(node.args[0]).shape, val(node).shape
            if len(after) < 2 or not same_shape(before[-2:], after[-2:]):
                raise NotFused(f"{node.name} reshapes the score matrix itself {shape_text(before)} -> {shape_text(after)}", node)
            node = node.args[0]
            continue
        factor = None
        for position in (0, 1):
            if len(node.args) > position and isinstance(node.args[position], fx.Node):
                factor = _scalar_factor(node, node.args[position])
                if factor is not None:
                    source = node.args[position]
                    break
        if factor is not None:
            ops.append(_ScoreOp("scale", node, _batch_of(node), factor=factor))
            node = source
            continue
        if target == aten.tanh.default:
            ops.append(_ScoreOp("tanh", node, _batch_of(node)))
            node = node.args[0]
            continue
        if target == aten.add.Tensor and "alpha" not in node.kwargs and len(node.args) == 2:
            a, b = node.args
            if not all(isinstance(x, fx.Node) for x in (a, b)):
                raise NotFused(f"{node.name} adds a scalar to the scores", node)
            score, bias = _split_scores(node, a, b)
            if not torch.is_floating_point(val(bias)):
                raise NotFused(f"{node.name} adds a {val(bias).dtype} tensor to the scores", node)
            ops.append(_ScoreOp("add", node, _batch_of(node), tensor=bias))
            node = score
            continue
        if target == aten.masked_fill.Scalar:
            score, mask, value = node.args[:3]
            ops.append(_ScoreOp("fill", node, _batch_of(node), tensor=mask, value=_fill_value(value, evaluate, node), fill_when=True))
            node = score
            continue
        if target in (aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf, aten.masked_fill.Tensor):
            if target == aten.masked_fill.Tensor:
                score, mask, other = node.args[:3]
                fill_when = True
            else:
                mask, a, b = node.args[:3]
                if isinstance(a, fx.Node) and (not isinstance(b, fx.Node) or _split_scores(node, a, b)[0] is a):
                    score, other, fill_when = a, b, False
                else:
                    score, other, fill_when = b, a, True
            if val(mask).dtype != torch.bool:
                raise NotFused(f"{node.name} selects by a {val(mask).dtype} tensor", node)
            ops.append(_ScoreOp("fill", node, _batch_of(node), tensor=mask, value=_fill_value(other, evaluate, node), fill_when=fill_when))
            node = score
            continue
        if target in (aten.mul.Tensor, aten.div.Tensor) and any(isinstance(val(x), (torch.SymInt, torch.SymFloat)) for x in node.args[:2]):
            raise NotFused(f"{node.name} scales the scores by a symbolic value (symbolic scales are not folded yet)", node)
        raise NotFused(f"{node.name} ({_op_name(target)}) between q @ k^T and the softmax is not a supported score change", node)
    if node.target == aten.baddbmm.default:
        # baddbmm(input, q, k^T, beta, alpha) = beta * input + alpha * (q @ k^T)
        beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
        if beta not in (0, 1) or not isinstance(alpha, _SCALAR_TYPES):
            raise NotFused(f"{node.name}: baddbmm with beta={beta}, alpha={alpha} is not folded", node)
        if beta == 1:
            ops.append(_ScoreOp("add", node, _batch_of(node), tensor=node.args[0]))
        ops.append(_ScoreOp("scale", node, _batch_of(node), factor=float(alpha)))
    ops.reverse()
    return node, ops, chain


def _split_scores(node: fx.Node, a: fx.Node, b: fx.Node) -> tuple[fx.Node, fx.Node]:
    """Tell the scores operand of a binary op from the bias/fill operand: (scores, other).

    The scores are used only here, have the op's full shape and come from a matrix product upstream.
    """

    def looks_like_scores(x: fx.Node) -> bool:
        return len(x.users) == 1 and same_shape(val(x).shape, val(node).shape) and _reaches_contraction(x)

    a_ok, b_ok = looks_like_scores(a), looks_like_scores(b)
    if a_ok == b_ok:
        raise NotFused(f"{node.name}: cannot tell the scores from the other operand", node)
    return (a, b) if a_ok else (b, a)


def _reaches_contraction(node: fx.Node, budget: int = 64) -> bool:
    """Whether a matrix product lies upstream of ``node`` (a bounded walk)."""
    seen, stack = set(), [node]
    while stack and budget > 0:
        n = stack.pop()
        if n in seen or not isinstance(n, fx.Node):
            continue
        seen.add(n)
        budget -= 1
        if n.op == "call_function" and _is_qk_product(n):
            return True
        stack.extend(n.all_input_nodes)
    return False


def _op_name(target: Any) -> str:
    return str(target).replace("aten.", "")


def _walk_to_pv(softmax: fx.Node):
    """From the softmax forward to ``P @ V``. Returns (pv node, chain nodes)."""
    chain = [softmax]
    node = softmax
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
            return user, chain
        einsum = einsum_as_matmul(user)
        if einsum is not None:
            left_perm = einsum[0]
            if user.args[1][0] is not node or user.args[1][1] is node or left_perm != sorted(left_perm):
                raise NotFused(f"{user.name}: the einsum does not multiply the weights [.., q, k] from the left", user)
            return user, chain
        if target in IDENTITY_OPS or (target in CAST_OPS and cast_dtype(user) is not None):
            pass
        elif target in (aten.view.default, aten.reshape.default, aten._unsafe_view.default):
            if not same_shape(val(node).shape[-2:], val(user).shape[-2:]):
                raise NotFused(f"{user.name} reshapes the attention weights across their last two dims", user)
        elif target in (aten.dropout.default, aten.native_dropout.default):
            p, train = user.args[1], user.args[2]
            if train and p > 0:
                raise NotFused(f"{user.name}: dropout (p={p}) on the attention weights is not fused yet", user)
            if target == aten.native_dropout.default:
                raise NotFused(f"{user.name}: native_dropout in eval mode is not folded", user)
        else:
            raise NotFused(f"the attention weights {node.name} go through {_op_name(target)} ({user.name}) before P @ V", user)
        chain.append(user)
        node = user


# --------------------------------------------------------------------------------------------------------------
def _prove_causal(op: _ScoreOp, evaluate: _ConstantEvaluator, m: int, n: int):
    """For a fill or add op whose tensor is a constant: ("causal", diagonal, masked value), ("noop", None, None)
    when it masks nothing, or None."""
    try:
        tensor = evaluate(op.tensor)
    except Exception:  # not a constant (NotFused), or an op that cannot run here: keep it as a tensor
        return None
    if op.kind == "fill":
        value = op.value
        keep = tensor != op.fill_when
    else:
        nonzero = tensor[tensor != 0].unique()
        if nonzero.numel() > 1:
            return None
        value = float(nonzero[0]) if nonzero.numel() else -math.inf
        keep = tensor == 0
    if not (value == -math.inf or value <= MASKING_FILL_LIMIT):
        return None
    keep = _as_keep_matrix(keep, m, n)
    if keep is None:
        return None
    if bool(keep.all()):
        return ("noop", None, None)
    d = causal_diagonal(keep)
    return ("causal", d, value) if d is not None else None


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


def match_attention(softmax: fx.Node, ctx: MatchContext) -> AttentionMatch:
    if not softmax_dim_is_last(softmax):
        raise NotFused("the softmax is not over the last dim", softmax)
    evaluate = _ConstantEvaluator(ctx)
    qk, raw_ops, score_chain = _walk_score_chain(softmax, evaluate)
    pv, weight_chain = _walk_to_pv(softmax)

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

    q_dtype = a_val.dtype
    for name, t in (("k", b_val), ("v", v_val)):
        if t.dtype != q_dtype:
            raise NotFused(f"q is {q_dtype} but {name} is {t.dtype}", qk)
        if t.device != a_val.device:
            raise NotFused(f"q is on {a_val.device} but {name} is on {t.device}", qk)
    for name, dim in (("head dim", d), ("value head dim", dv)):
        if not isinstance(dim, int):
            raise NotFused(f"the {name} is symbolic ({dim})", qk)
        if dim > MAX_HEAD_DIM:
            raise NotFused(f"the {name} {dim} is over {MAX_HEAD_DIM}", qk)
    for name, length in (("query", m), ("key", n)):
        if isinstance(length, int) and length == 0:
            raise NotFused(f"the {name} length is 0", qk)

    # Score ops: constant masks that are causal (and stay masking through the ops after them) become the causal
    # flag; leading scales fold into the scale; the rest becomes the spec's score mods.
    causal_diag: Optional[int] = None
    kept: list[_ScoreOp] = []
    for position, op in enumerate(raw_ops):
        if op.kind in ("add", "fill") and isinstance(m, int) and isinstance(n, int):
            proof = _prove_causal(op, evaluate, m, n)
            if proof is not None and (proof[0] == "noop" or _stays_masked(proof[2], raw_ops[position + 1 :])):
                kind, diag, _ = proof
                if kind == "causal":
                    if causal_diag is not None and causal_diag != diag:
                        raise NotFused(f"{op.node.name}: two causal masks with different diagonals", op.node)
                    causal_diag = diag
                continue
        kept.append(op)

    pv_batch = tuple(out_val.shape[:-2])
    # All batch shapes along the attention are row-major reshapes of one another. Work in the longest one at which
    # a mask/bias applies (so that none of them needs a reshape, which would copy a broadcast tensor densely).
    batch = max([pv_batch] + [op.batch for op in kept if op.tensor is not None], key=len)
    tensors: list[ScoreTensorUse] = []
    score_tensors: list[ScoreTensor] = []
    mods = []
    q_operand, k_operand = peel_scale(a), peel_scale(b)
    scale = q_operand.factor * k_operand.factor
    if qk_einsum is not None:  # einsum operands: permute q to [batch, m, d] and k to [batch, n, d]
        q_operand.permute, k_operand.permute = qk_einsum[0], qk_einsum[2]
        gqa_group, k_source, v_source = 1, None, None
    else:
        gqa_group, k_source, v_source = _fold_kv_heads(k_operand, b, v_node, batch, tuple(s_val.shape[:-2]), pv_batch)
    for op in kept:
        if op.kind == "scale":
            if mods:
                mods.append(ScaleScores(op.factor))
            else:
                scale *= op.factor
            continue
        if op.kind == "tanh":
            mods.append(Tanh())
            continue
        use = _place_tensor(op, batch, a_val.device)
        index = len(tensors)
        tensors.append(use)
        dtype = str(val(op.tensor).dtype).replace("torch.", "")
        score_tensors.append(ScoreTensor("bias" if op.kind == "add" else "mask", dtype, use.broadcast))
        mods.append(AddTensor(index) if op.kind == "add" else FillWhere(index, op.value, op.fill_when))

    try:
        spec = AttentionSpec(
            dtype=str(q_dtype).replace("torch.", ""),
            head_dim=d,
            head_dim_v=dv,
            scale=scale,
            causal=CausalMask(causal_diag) if causal_diag is not None else None,
            score_mods=tuple(mods),
            score_tensors=tuple(score_tensors),
            gqa_group=gqa_group,
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
        matched_nodes=[qk, *score_chain, *weight_chain, pv],
    )


def _stays_masked(value: float, later: list[_ScoreOp]) -> bool:
    """Whether keys masked to ``value`` still get exactly zero weight after the ops that follow the mask.

    Only then may the mask move to the end of the score chain as ``causal`` (the kernel applies it last and skips
    masked blocks). Positive scales keep -inf and keep a huge negative fill huge; adding a bias keeps it huge when
    it is -inf or beyond 1e30 (a bias would have to be as large to matter); tanh, a negative scale or a fill with a
    value that does not mask can make a masked key visible again.
    """
    for nxt in later:
        if nxt.kind == "scale":
            if nxt.factor <= 0:
                return False
            value *= nxt.factor
        elif nxt.kind == "add":
            if value != -math.inf and value > HUGE_NEGATIVE:
                return False
        elif nxt.kind == "fill":
            if not (nxt.value == -math.inf or nxt.value <= MASKING_FILL_LIMIT):
                return False
        else:
            return False
    return value == -math.inf or value <= MASKING_FILL_LIMIT


@dataclass
class ScoreTensorUse:
    """A mask/bias node as the fused op receives it: ``node`` (at ``tensor_batch``), reshaped to the attention's
    batch when ``rebatch``, then laid out 4-D; ``broadcast`` is its (Z, H, M, N) broadcast pattern there."""

    node: fx.Node
    tensor_batch: tuple
    rebatch: bool
    broadcast: tuple[bool, bool, bool, bool]


def _place_tensor(op: _ScoreOp, batch: tuple, device) -> ScoreTensorUse:
    fake = val(op.tensor)
    rank = len(op.batch) + 2
    if fake.dim() > rank:
        raise NotFused(f"{op.node.name}: the mask/bias {shape_text(fake.shape)} has more dims than the scores", op.node)
    if fake.device != device:
        raise NotFused(f"{op.node.name}: the mask/bias is on {fake.device}, q on {device}", op.node)
    shape = (1,) * (rank - fake.dim()) + tuple(fake.shape)
    own_batch, tail = shape[:-2], shape[-2:]
    rebatch = False
    if all_ones(own_batch):
        batch_part = ()
    elif same_shape(op.batch, batch):
        batch_part = own_batch
    elif is_static(own_batch) and same_shape(own_batch, op.batch) and is_static(batch):
        batch_part, rebatch = batch, True  # a view: the tensor is not broadcast over its batch dims
    else:
        raise NotFused(
            f"{op.node.name}: a mask/bias broadcast over part of batch {shape_text(op.batch)} while the attention "
            f"works in batch {shape_text(batch)}",
            op.node,
        )
    broadcast = (all_ones(batch_part[:-1]), all_ones(batch_part[-1:]), all_ones(tail[:1]), all_ones(tail[1:]))
    return ScoreTensorUse(op.tensor, op.batch, rebatch, broadcast)


def find_softmaxes(graph: fx.Graph) -> list[fx.Node]:
    return [n for n in graph.nodes if n.op == "call_function" and n.target in SOFTMAX_OPS]
