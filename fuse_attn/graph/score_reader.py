"""The score program of a matched attention read from the graph: everything between ``q @ k^T`` and the softmax
(the *score path*) as a :mod:`fuse_attn.score_program`.

The path is read by what it computes. Each node on it is normalized to program ops (:func:`pointwise_form`:
``masked_fill`` is a ``where``, ``clamp`` a ``clamp_min`` then a ``clamp_max``, float casts are the identity since
the kernel computes in fp32, ...). The other operands of those ops (*side inputs*) become, in this order of
preference:

1. a constant, when they are a Python number or a one-element tensor computable from constants;
2. an index expression, when they are built from ``arange`` (``arange(N)[None, :] - arange(M)[:, None]``):
   ``q_idx`` / ``kv_idx`` leaves, so a position-dependent bias or mask is computed in the kernel;
3. a gather ``ids[batch_idx, q_idx]`` whose indices are the element's positions (Hugging Face's mask functions read
   document ids and positions so): a load of the gather, which the rewrite passes as a view of ``ids``
   (:class:`Reindexing`), so the gather is never computed;
4. an inlined pointwise subgraph, when it is a dense ``[.., M, N]`` value computed from smaller ones (a
   bias ``slopes[h] * distance``, a mask ``causal & padding``, packed documents ``ids_q == ids_k``): its smaller
   leaves are loaded instead;
5. a loaded tensor (through broadcast strides, never copied densely): a bool mask, a float bias, or an integer
   tensor that is not dense in both the query and the key dim (document ids, positions, chunk ids).

Before that, a masking op whose mask is a compile-time constant (a ``tril`` buffer, an ``arange`` comparison,
a Hugging Face 0 / ``finfo.min`` additive mask) is *evaluated*: if it equals a causal band (optionally a sliding
window) and keys it masks stay masked through the rest of the path, it leaves the program and becomes
``spec.causal``, so the kernels skip masked blocks. Under symbolic lengths no mask can be evaluated; a ``where``
whose condition is a predicate of the key-query distance ``j - i`` alone (read from its index expression) is
checked for a band instead, and so is the top-left corner of a constant (a sliced ``tril`` buffer)
(:func:`symbolic_masking_band`).

Everything here raises :class:`NotFused` (with the node) for a score path the kernels cannot express.
"""

from __future__ import annotations

import collections
import math
import operator
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch
import torch.fx as fx

from fuse_attn.graph.nodes import (CAST_OPS, IDENTITY_OPS, SCALAR_TYPES, MatchContext, NotFused, all_ones, aten,
                                   cast_dtype, is_pure, is_static, op_name, runtime_scalar, same_shape, shape_text,
                                   target_of, val)
from fuse_attn.score_program import (INT_DTYPES, LOAD_KINDS, MASKING_FILL_LIMIT, ScoreNode, ScoreProgramBuilder,
                                     role_of)
from fuse_attn.spec import dtype_name

# Masks are evaluated at compile time only up to this many elements (a 16384 x 16384 causal mask is 2**28; the
# evaluation makes a few temporaries of that size on the host, so bigger ones are loaded as tensors instead).
MAX_EVALUATED_MASK_ELEMENTS = 2**28
# A masked score this negative stays masked after adding any bias short of 1e29 in magnitude (finfo(fp32).min is
# -3.4e38; a bias that large would itself overflow any attention).
HUGE_NEGATIVE = -1e30


# ---- pointwise ops, normalized -----------------------------------------------------------------------------------
def _overloads(packet, *names):
    return {getattr(packet, n) for n in names if hasattr(packet, n)}


_BINARY = {}
for _op, _packet in (
    ("mul", aten.mul), ("maximum", aten.maximum), ("minimum", aten.minimum), ("clamp_min", aten.clamp_min),
    ("clamp_max", aten.clamp_max), ("lt", aten.lt), ("le", aten.le), ("gt", aten.gt), ("ge", aten.ge),
    ("eq", aten.eq), ("ne", aten.ne), ("logical_and", aten.logical_and), ("logical_or", aten.logical_or),
):
    for _overload in _overloads(_packet, "Tensor", "Scalar", "default"):
        _BINARY[_overload] = _op
# torch.max(a, b) / torch.min(a, b) of two tensors (LLaMA's older ``torch.max(scores + mask, finfo.min)``)
_BINARY[aten.max.other] = "maximum"
_BINARY[aten.min.other] = "minimum"
_UNARY = {
    aten.neg.default: "neg", aten.abs.default: "abs", aten.exp.default: "exp", aten.log.default: "log",
    aten.tanh.default: "tanh", aten.sigmoid.default: "sigmoid", aten.sqrt.default: "sqrt",
    aten.logical_not.default: "logical_not",
}
_BOOL_ONLY = {
    aten.bitwise_and.Tensor: "logical_and", aten.bitwise_or.Tensor: "logical_or", aten.bitwise_not.default: "logical_not",
    aten.__and__.Tensor: "logical_and", aten.__or__.Tensor: "logical_or",
}
_WHERE = _overloads(aten.where, "self", "ScalarOther", "ScalarSelf", "Scalar")

PREV = object()  # in a step list: the result of the previous step

Step = tuple[str, list]  # (program op or "identity", operands: fx.Node | number | PREV)


def pointwise_form(node: fx.Node) -> Optional[list[Step]]:
    """``node`` as elementwise program steps (with torch broadcasting of its operands), or None."""
    if node.op != "call_function":
        return None
    t = target_of(node)
    a = node.args
    if t in IDENTITY_OPS:
        return [("identity", [a[0]])]
    if t in CAST_OPS:
        dtype, source = cast_dtype(node), val(a[0])
        if dtype is None or not isinstance(source, torch.Tensor):
            return None
        if dtype.is_floating_point:  # fp32 in the kernel: a float->float cast only rounds (eager's error)
            return [("identity" if source.dtype.is_floating_point else "to_float", [a[0]])]
        if dtype == torch.bool:
            return [("identity", [a[0]])] if source.dtype == torch.bool else [("ne", [a[0], 0])]
        if not source.dtype.is_floating_point and source.dtype != torch.bool:
            return [("identity", [a[0]])]  # int -> int (indices are exact in either)
        return None
    if t in (aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Scalar, aten.rsub.Tensor):
        alpha = node.kwargs.get("alpha", 1)
        if not isinstance(alpha, SCALAR_TYPES):
            return None
        x, y = (a[1], a[0]) if t in (aten.rsub.Scalar, aten.rsub.Tensor) else (a[0], a[1])
        op = "add" if t in (aten.add.Tensor, aten.add.Scalar) else "sub"
        if alpha == 1:
            return [(op, [x, y])]
        return [("mul", [y, alpha]), (op, [x, PREV])]
    if t in (aten.div.Tensor, aten.div.Scalar):
        return [("div", [a[0], a[1]])] if node.kwargs.get("rounding_mode") is None else None
    if t in _BINARY:
        return [(_BINARY[t], [a[0], a[1]])]
    if t in _UNARY:
        return [(_UNARY[t], [a[0]])]
    if t in _BOOL_ONLY:
        return [(_BOOL_ONLY[t], list(a[: 1 if t == aten.bitwise_not.default else 2]))] if _all_bool(node) else None
    if t in _WHERE:
        return [("where", [a[0], a[1], a[2]])]
    if t in (aten.masked_fill.Scalar, aten.masked_fill.Tensor):
        return [("where", [a[1], a[2], a[0]])]
    if t in (aten.clamp.default, aten.clamp.Tensor):
        lo = a[1] if len(a) > 1 else node.kwargs.get("min")
        hi = a[2] if len(a) > 2 else node.kwargs.get("max")
        steps: list[Step] = []
        if lo is not None:
            steps.append(("clamp_min", [a[0], lo]))
        if hi is not None:
            steps.append(("clamp_max", [PREV if steps else a[0], hi]))
        return steps or [("identity", [a[0]])]
    return None


def _all_bool(node: fx.Node) -> bool:
    return all(isinstance(val(x), torch.Tensor) and val(x).dtype == torch.bool for x in node.all_input_nodes)


# ---- constants -----------------------------------------------------------------------------------------------------
class ConstantEvaluator:
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
        if node.op == "call_function" and node.target == aten.detach_.default:
            # detaching in place changes autograd tracking, not values: `torch.tensor(0.0)` written in model code
            # traces to lift_fresh_copy + detach_ (transformers' eager_mask fills its mask with it)
            return self(node.args[0])
        if node.op != "call_function" or not is_pure(node):
            raise NotFused(f"{node.name} ({node.target}) is not a pure function of constants", node)
        args = self(node.args)
        kwargs = {k: self(v) for k, v in node.kwargs.items()}
        return node.target(*args, **kwargs)

    def try_scalar(self, x: Any) -> Optional[Union[bool, int, float]]:
        """A Python number for ``x`` if it is one or a one-element tensor computable from constants."""
        if isinstance(x, SCALAR_TYPES):
            return x
        constant = _factory_scalar(x)
        if constant is not None:
            return constant
        fake = val(x) if isinstance(x, fx.Node) else None
        if isinstance(fake, SCALAR_TYPES):
            # a size computation that the shape environment has specialized (its value is guarded): torch 2.11 gives
            # ``sym_size`` of a head dim fixed by a guard as a plain int, so ``D ** -0.5`` is a plain float there
            return fake
        if isinstance(fake, torch.Tensor) and all_ones(fake.shape):
            try:
                return self(x).reshape(()).item()
            except Exception:  # not a constant (NotFused), or an op that cannot run here
                return None
        return None

    def try_tensor(self, x: fx.Node) -> Optional[torch.Tensor]:
        try:
            return self(x)
        except Exception:  # not a constant, or not evaluable on the host: the caller keeps it as a tensor
            return None


_FACTORIES = {aten.new_ones.default: 1, aten.new_zeros.default: 0, aten.ones.default: 1, aten.zeros.default: 0}


def _factory_scalar(x: Any) -> Optional[Union[bool, int, float]]:
    """The value of a one-element ``ones`` / ``zeros`` / ``full`` / ``scalar_tensor``."""
    fake = val(x) if isinstance(x, fx.Node) else None
    if not isinstance(fake, torch.Tensor) or not all_ones(fake.shape):
        return None
    return _factory_fill(x)


def _factory_fill(x: Any) -> Optional[Union[bool, int, float]]:
    """The one value of every element of a ``ones`` / ``zeros`` / ``full`` / ``scalar_tensor`` of any shape (which
    needs no inputs' values, so it is known even when its size arguments are symbolic)."""
    if not isinstance(x, fx.Node) or x.op != "call_function":
        return None
    fake = val(x)
    if not isinstance(fake, torch.Tensor):
        return None
    if x.target in _FACTORIES:
        value = _FACTORIES[x.target]
    elif x.target in (aten.full.default, aten.new_full.default):
        value = x.args[1] if x.target == aten.full.default else x.args[2]
    elif x.target == aten.scalar_tensor.default:
        value = x.args[0]
    else:
        return None
    if not isinstance(value, SCALAR_TYPES):
        return None
    return bool(value) if fake.dtype == torch.bool else float(value) if fake.dtype.is_floating_point else int(value)


# ---- the path from the product to the softmax ----------------------------------------------------------------------
SCORE = object()  # in a path op's operands: the scores flowing along the path


@dataclass
class PathOp:
    node: fx.Node
    steps: list[Step]  # operands: SCORE, PREV, a side fx.Node or a number
    batch: tuple  # batch shape of the node's value (the shape a side tensor broadcasts against is batch + [M, N])


def walk_score_path(softmax: fx.Node, is_product, scores: Optional[fx.Node] = None,
                    consumer: Optional[fx.Node] = None,
                    also_read_by: Optional[fx.Node] = None) -> tuple[fx.Node, list[PathOp], list[fx.Node]]:
    """From the softmax input (or ``scores``, read by ``consumer``: the scores joined to a sink column) back to the
    product. ``also_read_by``: a node that reads the softmax input besides the softmax (its logsumexp, which the
    fused op's lse serves). Returns (product, path ops in forward order, path nodes)."""
    ops: list[PathOp] = []
    path_nodes: list[fx.Node] = []
    node = softmax.args[0] if scores is None else scores
    consumer = softmax if consumer is None else consumer
    while True:
        if not isinstance(node, fx.Node):
            raise NotFused("the softmax input is not a tensor node", softmax)
        readers = [u for u in node.users if path_nodes or u is not also_read_by]  # (also_read_by: the input's)
        if len(readers) != 1:
            others = ", ".join(u.name for u in node.users if u is not consumer)
            raise NotFused(f"the scores {node.name} are also used by {others}", node)
        if node.op != "call_function":
            raise NotFused(f"no q @ k^T product before the softmax: the scores come from {node.op} {node.name}", node)
        if is_product(node):
            break
        path_nodes.append(node)
        consumer = node
        if target_of(node) in (aten.view.default, aten.reshape.default, aten._unsafe_view.default):
            before, after = val(node.args[0]).shape, val(node).shape
            if len(after) < 2 or not same_shape(before[-2:], after[-2:]):
                raise NotFused(f"{node.name} reshapes the score matrix itself {shape_text(before)} -> {shape_text(after)}", node)
            node = node.args[0]
            continue
        steps = pointwise_form(node)
        if steps is None and target_of(node) == aten.einsum.default:
            raise NotFused(f"{node.name}: einsum {node.args[0]!r} is not one batched product of equal batch dims "
                           "(one contraction; an ellipsis the same dims on both operands)", node)
        if steps is None:
            raise NotFused(f"{node.name} ({op_name(target_of(node))}) between q @ k^T and the softmax is not a pointwise score change", node)
        if any(step[0] == "to_float" for step in steps) or not torch.is_floating_point(val(node)):
            raise NotFused(f"{node.name} turns the scores into {val(node).dtype}", node)
        score = _score_operand(node, is_product)
        for step in steps:
            for i, x in enumerate(step[1]):
                if x is score:
                    step[1][i] = SCORE
        ops.append(PathOp(node, steps, tuple(val(node).shape[:-2])))
        node = score
    ops.reverse()
    return node, ops, path_nodes


def _score_operand(node: fx.Node, is_product) -> fx.Node:
    """The operand of a pointwise path node that carries the scores: the one used only here, with the node's
    full shape, with a matrix product upstream -- and where two are, the one that product reaches through pointwise
    ops alone (Inkling's position bias, gathered from a product of its own, is the other)."""
    candidates = []
    for x in dict.fromkeys(a for a in node.args if isinstance(a, fx.Node) and isinstance(val(a), torch.Tensor)):
        if len(x.users) == 1 and same_shape(val(x).shape, val(node).shape) and _reaches(x, is_product):
            candidates.append(x)
    if len(candidates) > 1:
        direct = [x for x in candidates if _reaches(x, is_product, val(node).shape[-2:])]
        candidates = direct if len(direct) == 1 else candidates
    if len(candidates) != 1:
        shared = [x for x in node.args if isinstance(x, fx.Node) and len(x.users) > 1 and _reaches(x, is_product)]
        if shared:
            others = ", ".join(u.name for u in shared[0].users if u is not node)
            raise NotFused(f"the scores {shared[0].name} are also used by {others}", node)
        raise NotFused(f"{node.name}: cannot tell the scores from the other operand", node)
    return candidates[0]


def _reaches(node: fx.Node, is_product, matrix: Optional[tuple] = None, budget: int = 64) -> bool:
    """Whether a matrix product lies upstream of ``node`` (a walk of at most ``budget`` nodes, nearest first: a long
    chain behind one operand, such as LongT5's position buckets behind its bias, does not use up the walk before the
    product one node up the other); with ``matrix``, one of those rows and columns, reached through pointwise ops
    (:func:`pointwise_form`) alone."""
    seen, queue = set(), collections.deque([node])
    while queue and budget > 0:
        n = queue.popleft()
        if n in seen or not isinstance(n, fx.Node):
            continue
        seen.add(n)
        budget -= 1
        if n.op == "call_function" and is_product(n):
            if matrix is None or same_shape(val(n).shape[-2:], matrix):
                return True
        elif matrix is None or pointwise_form(n) is not None:
            queue.extend(n.all_input_nodes)
    return False


# ---- constant masks that are causal bands ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Band:
    """Keys ``j`` with ``i + diagonal - window < j <= i + diagonal`` are visible (no lower bound: window None)."""

    diagonal: int
    window: Optional[int]


def band_of(keep: torch.Tensor) -> Optional[Band]:
    """The band an [M, N] visibility matrix is, with every row keeping a key and some key masked; else None."""
    m, n = keep.shape
    if not bool(keep.any(1).all()) or bool(keep.all()):
        return None
    cols = torch.arange(n, device=keep.device)
    last_visible = torch.where(keep[0], cols, -1).max().item()
    first_visible_last_row = torch.where(keep[m - 1], cols, n).min().item()
    diagonal = int(last_visible)
    window = (m - 1) + diagonal + 1 - int(first_visible_last_row)
    ones = torch.ones(m, n, dtype=torch.bool, device=keep.device)
    for w in ([window, None] if first_visible_last_row > 0 else [None]):
        expected = ones.tril(diagonal) if w is None else ones.tril(diagonal) & ~ones.tril(diagonal - w)
        if bool((keep == expected).all()):
            return Band(diagonal, w)
    return None


def _keep_matrix(keep: torch.Tensor, m: int, n: int) -> Optional[torch.Tensor]:
    """The [m, n] visibility matrix if ``keep`` is the same for every batch entry, else None."""
    keep = keep.to(torch.bool)
    while keep.dim() < 2:
        keep = keep.unsqueeze(0)
    batch = keep.reshape(-1, keep.shape[-2], keep.shape[-1])
    if not bool((batch == batch[:1]).all()):
        return None
    return batch[0].expand(m, n)


def masking_band(op: PathOp, evaluate: ConstantEvaluator, m: int, n: int):
    """For a one-step masking op with a constant mask -- ``where`` with a constant condition and a masking fill,
    or the addition of a constant 0 / masking-value tensor --: ("band", Band, masked value), ("noop", None,
    None) when it masks nothing, or None."""
    if len(op.steps) != 1:
        return None
    kind, operands = op.steps[0]
    if kind == "where":
        cond, a, b = operands
        if (a is SCORE) == (b is SCORE) or not isinstance(cond, fx.Node):
            return None
        fill = evaluate.try_scalar(b if a is SCORE else a)
        if fill is None or isinstance(fill, bool):
            return None
        mask = evaluate.try_tensor(cond)
        if mask is None or mask.dtype != torch.bool:
            return None
        value, keep = float(fill), mask if a is SCORE else ~mask
    elif kind == "add":
        other = operands[1] if operands[0] is SCORE else operands[0]
        if not isinstance(other, fx.Node) or SCORE not in operands:
            return None
        tensor = evaluate.try_tensor(other)
        if tensor is None or not tensor.is_floating_point():
            return None
        nonzero = tensor[tensor != 0].unique()
        if nonzero.numel() > 1:
            return None
        value = float(nonzero[0]) if nonzero.numel() else -math.inf
        keep = tensor == 0
    else:
        return None
    if not (value == -math.inf or value <= MASKING_FILL_LIMIT):
        return None
    keep = _keep_matrix(keep, m, n)
    if keep is None:
        return None
    if bool(keep.all()):
        return ("noop", None, None)
    band = band_of(keep)
    return ("band", band, value) if band is not None else None


def symbolic_masking_band(op: PathOp, side: "SideExpressions", m: Any, n: Any):
    """For symbolic lengths, where no mask can be evaluated: ("band", Band, masked value) for a one-step ``where``
    with a masking fill whose condition keeps a band ``diagonal - window < j - i <= diagonal`` for every length;
    else None. The condition is read as

    - a predicate of the key-query distance ``j - i`` alone: comparisons of integer linear forms of the indices
      from ``arange`` (``j > i``, ``j - i > 0``, ``i < j - 3``) combined with and / or / not; or
    - the top-left corner ``F[..., :M, :N]`` of a constant ``F`` (nanoGPT's ``bias[:, :, :T, :T] == 0``): F is
      evaluated at its full size, and a band there is the same band in every top-left corner.

    Every query row must keep a key whatever the lengths (the kernels' band is only equivalent to eager's masking
    then): ``diagonal >= 0`` keeps key 0 for every row; a window also needs ``window > diagonal`` (row ``i`` keeps
    key ``i``) and no more queries than keys for every value of the symbols."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if len(op.steps) != 1 or op.steps[0][0] != "where":
        return None
    cond, a, b = op.steps[0][1]
    if (a is SCORE) == (b is SCORE) or not isinstance(cond, fx.Node):
        return None
    fill = side.evaluate.try_scalar(b if a is SCORE else a)
    if fill is None or isinstance(fill, bool) or not (fill == -math.inf or fill <= MASKING_FILL_LIMIT):
        return None
    # ``where(cond, s, fill)`` keeps the keys where cond holds, ``where(cond, fill, s)`` the others.
    band = _distance_band(cond, a is SCORE, side) or _corner_band(cond, a is SCORE, side.evaluate)
    if band is None or band.diagonal < 0:
        return None
    if band.window is not None and not (band.window > band.diagonal and statically_known_true(m <= n)):
        return None
    return ("band", band, float(fill))


def _distance_band(cond: fx.Node, keep_where_true: bool, side: "SideExpressions") -> Optional[Band]:
    try:
        predicate = _distance_predicate(side.expression(cond))
    except _CannotExpress:
        return None
    if predicate is None:
        return None
    holds, changes = predicate
    # The predicate is constant below min(changes) and above max(changes): reading one distance past each end
    # reads it everywhere.
    distances = range(min(changes, default=0) - 1, max(changes, default=0) + 2)
    keep = [d for d in distances if holds(d) == keep_where_true]
    if not keep or keep[-1] == distances[-1] or keep != list(range(keep[0], keep[-1] + 1)):
        return None  # no key kept, keys kept beyond the diagonal forever, or a gap: not a band
    diagonal = keep[-1]
    return Band(diagonal, None if keep[0] == distances[0] else diagonal - keep[0] + 1)


def _corner_band(cond: fx.Node, keep_where_true: bool, evaluate: ConstantEvaluator) -> Optional[Band]:
    full = _full_of_corner(cond, evaluate)
    if full is None or full.dtype != torch.bool:
        return None
    keep = _keep_matrix(full if keep_where_true else ~full, *full.shape[-2:])
    return band_of(keep) if keep is not None else None


def _full_of_corner(node: Any, evaluate: ConstantEvaluator) -> Optional[torch.Tensor]:
    """The constant ``F`` whose top-left corner ``F[..., :M, :N]`` is ``node`` (symbolic in its last two dims
    only): constants sliced from 0 in those dims, changed pointwise by one-element constants; else None."""
    fake = val(node)
    if not isinstance(node, fx.Node) or not isinstance(fake, torch.Tensor) or fake.dim() < 2:
        return None
    if is_static(fake.shape):
        return evaluate.try_tensor(node)
    if not is_static(fake.shape[:-2]) or node.op != "call_function" or not is_pure(node):
        return None
    if target_of(node) == aten.slice.Tensor:
        dim = node.args[1] if len(node.args) > 1 else 0
        start = node.args[2] if len(node.args) > 2 else 0
        step = node.args[4] if len(node.args) > 4 else 1
        if start not in (0, None) or step != 1 or dim % fake.dim() < fake.dim() - 2:
            return None
        return _full_of_corner(node.args[0], evaluate)
    if pointwise_form(node) is None:
        return None
    full_args = []
    for x in node.args:
        if isinstance(x, fx.Node) and not all_ones(val(x).shape):
            x = _full_of_corner(x, evaluate)  # another corner (a one-element operand broadcasts as it is)
        elif isinstance(x, fx.Node):
            x = evaluate.try_tensor(x)
        if x is None:
            return None
        full_args.append(x)
    corners = [x for x in full_args if isinstance(x, torch.Tensor) and x.dim() >= 2 and not all_ones(x.shape)]
    if any(c.shape != corners[0].shape for c in corners):
        return None  # corners of different constants: the pointwise op would not be applied element by element
    return node.target(*full_args, **node.kwargs)


_COMPARISONS = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge, "eq": operator.eq,
                "ne": operator.ne}


def _linear(expr: Expr) -> Optional[tuple[int, int, int]]:
    """``expr`` as ``(a, b, c)`` with ``expr == a * q_idx + b * kv_idx + c`` in integers, or None."""
    kind = expr[0]
    if kind == "const":
        return (0, 0, expr[1]) if type(expr[1]) is int else None
    if kind == "index":
        return (1, 0, 0) if expr[1] == "q_idx" else (0, 1, 0)
    if kind == "load":
        return None  # values known only at run time
    parts = [_linear(child) for child in expr[1:]]
    if any(p is None for p in parts):
        return None
    if kind == "neg":
        return tuple(-x for x in parts[0])
    if kind in ("add", "sub"):
        sign = 1 if kind == "add" else -1
        return tuple(x + sign * y for x, y in zip(*parts))
    if kind == "mul":
        constants = [p[2] for p in parts if p[:2] == (0, 0)]
        if not constants:
            return None  # a product of indices
        other = parts[1] if parts[0][:2] == (0, 0) else parts[0]
        return tuple(constants[0] * x for x in other)
    return None


def _distance_predicate(expr: Expr):
    """``expr`` as a function of the distance ``d = kv_idx - q_idx`` alone, with the distances where it may change
    value; None if it is not one."""
    kind = expr[0]
    if kind in _COMPARISONS:
        chosen = _chosen_constant_comparison(kind, expr[1], expr[2])
        if chosen is not None:  # where(p, a, b) == c and the like: a constant chosen by a distance predicate
            return chosen
        sides = _linear(expr[1]), _linear(expr[2])
        if None in sides:
            return None
        a, b, c = (x - y for x, y in zip(*sides))  # compares a * i + b * j + c with 0
        if a != -b:
            return None  # depends on more than j - i
        compare = _COMPARISONS[kind]
        changes = [] if b == 0 else [-c // b - 1, -c // b, -c // b + 1]
        return (lambda d: compare(b * d + c, 0)), changes
    if kind == "logical_not":
        inner = _distance_predicate(expr[1])
        return None if inner is None else ((lambda d: not inner[0](d)), inner[1])
    if kind in ("logical_and", "logical_or"):
        parts = [_distance_predicate(child) for child in expr[1:]]
        if None in parts:
            return None
        combine = all if kind == "logical_and" else any
        return (lambda d: combine(p[0](d) for p in parts)), [t for p in parts for t in p[1]]
    return None


def _chosen_constant_comparison(kind: str, left: Expr, right: Expr):
    """``left <kind> right`` as a distance predicate (as :func:`_distance_predicate` gives it) where one side is
    ``where(p, a, b)`` (a, b constants, p a distance predicate) and the other a constant (``tril(ones(T, T)) == 0``
    under symbolic lengths); else None."""
    compare = _COMPARISONS[kind]
    for chooser, constant, chooser_left in ((left, right, True), (right, left, False)):
        if chooser[0] == "where" and constant[0] == "const" and chooser[2][0] == "const" and chooser[3][0] == "const":
            predicate = _distance_predicate(chooser[1])
            if predicate is None:
                return None
            (holds, changes), a, b, c = predicate, chooser[2][1], chooser[3][1], constant[1]
            if chooser_left:
                return (lambda d: compare(a if holds(d) else b, c)), changes
            return (lambda d: compare(c, a if holds(d) else b)), changes
    return None


def stays_masked(value: float, later: list[PathOp], evaluate: ConstantEvaluator) -> bool:
    """Whether keys masked to ``value`` still get exactly zero weight after the path ops that follow the mask.

    Only then may the mask move to the end of the path as ``causal`` (the kernel applies it last and skips masked
    blocks). Positive scales keep -inf and keep a huge negative fill huge; adding a bias keeps it huge when it is
    -inf or beyond 1e30 (a bias would have to be as large to matter); casts change nothing; a ``where`` whose
    other branch is a masking constant keeps it masked; anything else (tanh, a negative scale, ...) may not.
    """
    for op in later:
        for kind, operands in op.steps:
            others = [x for x in operands if x is not SCORE and x is not PREV]
            if kind == "identity":
                continue
            if kind in ("mul", "div") and len(others) == 1:
                c = evaluate.try_scalar(others[0])
                if c is None or isinstance(c, bool) or c <= 0:
                    return False
                value = value * c if kind == "mul" else value / c
            elif kind == "add" and len(others) == 1:
                if value != -math.inf and value > HUGE_NEGATIVE:
                    return False
            elif kind == "where" and operands[0] is not SCORE and len(others) == 2:
                fill = evaluate.try_scalar(others[1])
                if fill is None or not (fill == -math.inf or fill <= MASKING_FILL_LIMIT):
                    return False
            else:
                return False
    return value == -math.inf or value <= MASKING_FILL_LIMIT


# ---- side inputs as program expressions ------------------------------------------------------------------------------
Expr = tuple  # ("const", v) | ("index", "q_idx" | "kv_idx") | ("load", node) | (op, *child exprs)


class _CannotExpress(Exception):
    pass


@dataclass(frozen=True)
class Reindexing:
    """A gather ``x = source[i_0, i_1, ...]`` that is a view of ``source``: ``x[p] = source[starts[0] + p[dims[0]],
    starts[1] + p[dims[1]], ...]``, where a dim ``k`` with ``dims[k]`` None is read at ``starts[k]`` alone. Source dim
    k becomes dim ``dims[k]`` of ``x``, sliced from ``starts[k]`` to its length there; ``x``'s other dims have size
    1."""

    source: fx.Node
    dims: tuple[Optional[int], ...]
    starts: tuple[int, ...]


@dataclass
class SideExpressions:
    """Turns the side operands of path ops into program expressions (see the module docstring for the order)."""

    evaluate: ConstantEvaluator
    q_len: Any
    kv_len: Any
    # each gather loaded as a view of its source (:meth:`_gather`), for the rewrite to read through that view
    reindexed: dict[fx.Node, Reindexing] = field(default_factory=dict)

    def expression(self, x: Any) -> Expr:
        scalar = self.evaluate.try_scalar(x)
        if scalar is not None:
            return ("const", scalar)
        if runtime_scalar(x) is not None:
            return ("load", x)  # the kernels read it as a one-element tensor (matching.ScoreTensorUse.scalar)
        if not isinstance(x, fx.Node) or not isinstance(val(x), torch.Tensor):
            raise _CannotExpress(f"{x} is not a tensor or a constant")
        if target_of(x) == aten.expand.default or _keeps_alignment(x):
            return self.expression(x.args[0])  # a broadcast, or a view adding leading 1s: broadcasting does that
        fill = _factory_fill(x)
        if fill is not None:
            return ("const", fill)  # a tensor of one value broadcasts as that value
        triangle = self._triangle(x)
        if triangle is not None:
            return triangle
        index = self._index(x)
        if index is not None:
            return index
        gathered = self._gather(x)
        if gathered is not None:
            return gathered
        inlined = self._inline(x)
        if inlined is not None:
            return inlined
        if _loadable(x):
            return ("load", x)
        raise _CannotExpress(f"{x.name} is a {val(x).dtype} tensor {shape_text(val(x).shape)} (the kernels read bool "
                             "masks, float biases and integer vectors)")

    def _gather(self, x: fx.Node) -> Optional[Expr]:
        """``source[i_0, i_1, ...]`` (``aten.index``) whose every index is the element's position along one dim of
        ``x`` plus a constant, or one constant: a load of ``x`` that the rewrite reads as a view of ``source``
        (:class:`Reindexing`; Hugging Face's mask functions read document ids and positions so:
        ``ids[batch_idx, q_idx] == ids[batch_idx, kv_idx]``), so the gather is never computed."""
        if target_of(x) != aten.index.Tensor or not _loadable(x):
            return None
        source, indices = x.args[:2]
        lengths, shape = val(source).shape, val(x).shape
        if len(indices) != len(lengths):
            return None  # a partial index (trailing dims kept whole), not read here
        dims: list[Optional[int]] = []
        starts: list[int] = []
        for length, index in zip(lengths, indices):
            if not isinstance(index, fx.Node) or getattr(val(index), "dtype", None) not in (torch.int64, torch.int32):
                return None  # a None (a whole dim) or a bool index (a selection)
            index_shape = val(index).shape
            varying = [p for p, size in enumerate(index_shape) if not (isinstance(size, int) and size == 1)]
            if not varying:
                constant = self.evaluate.try_scalar(index)
                if type(constant) is not int or not isinstance(length, int) or not 0 <= constant < length:
                    return None  # (a negative index counts from the end)
                dims.append(None)
                starts.append(constant)
                continue
            # the index's values along its one varying dim, as a linear form of the position there (named q_idx)
            position = _position_expression(index, ("index", "q_idx")) if len(varying) == 1 else None
            linear = _linear(position) if position is not None else None
            if linear is None or linear[:2] != (1, 0):
                return None  # not the position itself plus a constant
            dim, start = len(shape) - len(index_shape) + varying[0], linear[2]
            whole = start == 0 and same_shape((shape[dim],), (length,))
            if not (whole or (is_static((shape[dim], length)) and 0 <= start and start + shape[dim] <= length)):
                return None
            dims.append(dim)
            starts.append(start)
        placed = [d for d in dims if d is not None]
        if len(set(placed)) != len(placed):
            return None  # two source dims read along one position (a diagonal): no view
        self.reindexed[x] = Reindexing(source, tuple(dims), tuple(starts))
        return ("load", x)

    def _inline(self, x: fx.Node) -> Optional[Expr]:
        """``x`` computed in the kernel from its inputs, when that reads less than loading ``x``: x is dense in
        both the query and the key dim and no input is (an ``[M, N]`` mask built from ``arange`` comparisons
        and a ``[B, 1, 1, N]`` padding mask, a bias ``slopes * distance``)."""
        if not _is_dense_mn(x):
            return None
        steps = pointwise_form(x)
        if steps is None:
            return None
        try:
            expr = self._steps_expression(steps, {})
        except _CannotExpress:
            return None
        if any(_is_dense_mn(leaf) for leaf in _loads(expr)):
            return None
        return expr

    def _steps_expression(self, steps: list[Step], score: dict) -> Expr:
        result = None
        for kind, operands in steps:
            children = []
            for x in operands:
                if x is PREV:
                    children.append(result)
                elif x is SCORE:
                    children.append(score["expr"])
                else:
                    children.append(self.expression(x))
            result = children[0] if kind == "identity" else (kind, *children)
        return result

    def _triangle(self, x: fx.Node) -> Optional[Expr]:
        """``triu(F, d)`` / ``tril(F, d)`` of a tensor whose last two dims are the scores' (queries, keys): ``F``
        where ``kv_idx >= q_idx + d`` (triu) or ``kv_idx <= q_idx + d`` (tril), else 0 -- the causal mask
        ``triu(full((N, N), finfo.min), 1)`` of Hugging Face's ``AttentionMaskConverter``."""
        t = target_of(x)
        if t not in (aten.triu.default, aten.tril.default):
            return None
        fake = val(x)
        diagonal = x.args[1] if len(x.args) > 1 else x.kwargs.get("diagonal", 0)
        if type(diagonal) is not int or fake.dim() < 2 or not same_shape(tuple(fake.shape[-2:]), (self.q_len, self.kv_len)):
            return None
        zero = False if fake.dtype == torch.bool else 0.0 if fake.dtype.is_floating_point else 0
        query = ("index", "q_idx") if diagonal == 0 else ("add", ("index", "q_idx"), ("const", diagonal))
        kept = ("ge" if t == aten.triu.default else "le", ("index", "kv_idx"), query)
        return ("where", kept, self.expression(x.args[0]), ("const", zero))

    def _index(self, x: fx.Node) -> Optional[Expr]:
        """``x`` as a function of the query or key position, if it has one non-1 dim (the last: keys, the one
        before: queries) and comes from ``arange`` through views, slices and scalar arithmetic."""
        shape = val(x).shape
        non_one = [i for i, s in enumerate(shape) if not (isinstance(s, int) and s == 1)]
        if len(non_one) != 1 or len(shape) - non_one[0] not in (1, 2):
            return None
        axis, length = ("kv_idx", self.kv_len) if len(shape) - non_one[0] == 1 else ("q_idx", self.q_len)
        if not same_shape((shape[non_one[0]],), (length,)):
            return None
        return _position_expression(x, ("index", axis))


def _position_expression(x: Any, position: Expr) -> Optional[Expr]:
    """The values of a tensor with one non-1 dim as an expression of the element's ``position`` along it."""
    if isinstance(x, SCALAR_TYPES):
        return ("const", x)
    if not isinstance(x, fx.Node) or x.op != "call_function":
        return None
    constant = _factory_scalar(x)
    if constant is not None:
        return ("const", constant)
    t = target_of(x)
    if t in (aten.arange.default, aten.arange.start, aten.arange.start_step):
        args = list(x.args)
        start, step = (0, 1) if t == aten.arange.default else (args[0], args[2] if len(args) > 2 else 1)
        if not all(isinstance(c, int) for c in (start, step)):
            return None  # float or symbolic starts: keep it a tensor
        expr = position if step == 1 else ("mul", position, ("const", step))
        return expr if start == 0 else ("add", expr, ("const", start))
    if t in (aten.unsqueeze.default, aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.squeeze.dim):
        inner = val(x.args[0]).shape
        if sum(1 for s in inner if not (isinstance(s, int) and s == 1)) != 1:
            return None
        return _position_expression(x.args[0], position)
    if t == aten.slice.Tensor:
        inner = val(x.args[0]).shape
        dim = x.args[1] if len(x.args) > 1 else 0
        start = x.args[2] if len(x.args) > 2 else 0
        step = x.args[4] if len(x.args) > 4 else 1
        if not (isinstance(start, int) and start >= 0 and step == 1):
            return None
        if inner[dim % len(inner)] == 1:
            return _position_expression(x.args[0], position)
        if sum(1 for s in inner if not (isinstance(s, int) and s == 1)) != 1:
            return None
        return _position_expression(x.args[0], position if start == 0 else ("add", position, ("const", start)))
    steps = pointwise_form(x)
    if steps is None:
        return None
    result = None
    for kind, operands in steps:  # elementwise ops of position functions and constants are position functions
        children = []
        for operand in operands:
            child = result if operand is PREV else _position_expression(operand, position)
            if child is None:
                return None
            children.append(child)
        result = children[0] if kind == "identity" else (kind, *children)
    return result


def _keeps_alignment(x: fx.Node) -> bool:
    """A view whose non-1 dims (sizes and places counted from the right) are those of its input."""
    if target_of(x) not in (aten.unsqueeze.default, aten.view.default, aten.reshape.default, aten._unsafe_view.default,
                            aten.squeeze.dim, aten.squeeze.default, aten.squeeze.dims):
        return False

    def non_one(shape):
        return [(len(shape) - i, s) for i, s in enumerate(shape) if not (isinstance(s, int) and s == 1)]

    before, after = non_one(val(x.args[0]).shape), non_one(val(x).shape)
    return len(before) == len(after) and all(p == q and same_shape((a,), (b,)) for (p, a), (q, b) in zip(before, after))


def _loadable(x: fx.Node) -> bool:
    """Whether the kernels read ``x`` as a score tensor: a bool mask, a float bias, or an integer tensor that is not
    dense in both the query and the key dim (document ids, positions, lengths: a vector per query row or key
    column, where an N x N one would cost the kernels as much as the mask it makes)."""
    dtype = val(x).dtype
    if dtype == torch.bool or dtype.is_floating_point:
        return True
    return dtype_name(dtype) in INT_DTYPES and not _is_dense_mn(x)


def _is_dense_mn(x: fx.Node) -> bool:
    if not isinstance(val(x), torch.Tensor):
        return False
    shape = val(x).shape
    return len(shape) >= 2 and not all_ones(shape[-2:-1]) and not all_ones(shape[-1:])


def _loads(expr: Expr) -> list[fx.Node]:
    if expr[0] == "load":
        return [expr[1]]
    if expr[0] in ("const", "index"):
        return []
    return [leaf for child in expr[1:] for leaf in _loads(child)]


# ---- the program ---------------------------------------------------------------------------------------------------
@dataclass
class ScoreProgram:
    """A score path read as a program: its nodes (``spec.score_program``), the graph nodes it loads (the spec's score
    tensors, in order) and the leading scale taken out of it (into ``spec.scale``)."""

    scale_factor: float  # leading scalar multiplications, folded into spec.scale ...
    head_dim_power: float  # ... times head_dim ** head_dim_power (a symbolic head dim's ``D ** -0.5``)
    nodes: tuple[ScoreNode, ...]
    loads: list[tuple[fx.Node, PathOp]]  # tensor i of the program: (node, the path op it is used at)


def _symbolic(x: Any):
    v = val(x) if isinstance(x, fx.Node) else x
    return v if isinstance(v, (torch.SymInt, torch.SymFloat)) else None


# Head dims at which a symbolic scale is probed: any three distinct sizes > 1 work (see _power_of_head_dim).
_PROBE_HEAD_DIMS = (16, 64, 256)


def _power_of_head_dim(value, head_dim) -> Optional[tuple[float, float]]:
    """``(c, p)`` with ``value == c * head_dim ** p``, for a symbolic scale of the symbolic head dim only.

    The expression is evaluated at three head dims: two fix c and p, the third must agree (to 1e-12 relative).
    Scales are built from ``**``, ``sqrt``, ``*`` and ``/`` of the head dim, which are exactly such monomials; a
    sum like ``1 / sqrt(D + 1)`` fails the third point.
    """
    import sympy

    dim = _symbolic(head_dim)
    expr = value.node.expr
    if dim is None or expr.free_symbols != {dim.node.expr} or not isinstance(dim.node.expr, sympy.Symbol):
        return None
    try:
        f = [float(expr.xreplace({dim.node.expr: sympy.Integer(d)})) for d in _PROBE_HEAD_DIMS]
    except (TypeError, ValueError):
        return None
    if not all(math.isfinite(x) and x > 0 for x in f):
        return None
    (d0, d1, d2), (f0, f1, f2) = _PROBE_HEAD_DIMS, f
    p = math.log(f1 / f0) / math.log(d1 / d0)
    c = f0 / d0**p
    if not math.isclose(c * d2**p, f2, rel_tol=1e-12):
        return None
    return c, p


def build_program(ops: list[PathOp], sides: SideExpressions, head_dim: Any) -> ScoreProgram:
    """The path ops as one program (side operands as expressions). Leading scalar scales fold into a factor (and
    a power of the head dim, for a scale of a symbolic head dim)."""
    builder = ScoreProgramBuilder()
    score = builder.add("score")
    factor, power = 1.0, 0.0
    loads: list[tuple[fx.Node, PathOp]] = []
    load_index: dict[fx.Node, int] = {}
    leading = True
    for op in ops:
        for kind, operands in op.steps:
            if leading and kind in ("mul", "div") and sum(x is SCORE or x is PREV for x in operands) == 1:
                other = next(x for x in operands if x is not SCORE and x is not PREV)
                symbolic = _symbolic(other)
                if symbolic is not None and runtime_scalar(other) is None:
                    monomial = _power_of_head_dim(symbolic, head_dim)
                    if monomial is None or (kind == "div" and operands[0] is other):
                        raise NotFused(f"{op.node.name} scales the scores by {symbolic}, not a power of the head dim", op.node)
                    sign = 1 if kind == "mul" else -1
                    factor, power = factor * monomial[0] ** sign, power + sign * monomial[1]
                    continue
                c = sides.evaluate.try_scalar(other)
                if c is not None and not isinstance(c, bool) and c != 0 and (kind == "mul" or operands[0] is not other):
                    factor = factor * c if kind == "mul" else factor / c
                    continue
            if kind == "identity":
                continue
            leading = False
            args = []
            for x in operands:
                if x is SCORE or x is PREV:
                    args.append(score)
                    continue
                if _symbolic(x) is not None and runtime_scalar(x) is None:
                    raise NotFused(f"{op.node.name} changes the scores by a symbolic value ({_symbolic(x)}): not folded", op.node)
                try:
                    expr = sides.expression(x)
                except _CannotExpress as e:
                    raise NotFused(f"{op.node.name}: {e}", op.node) from None
                args.append(_emit(builder, expr, loads, load_index, op))
            score = builder.add(kind, *args)
    return ScoreProgram(factor, power, builder.program(score), loads)


def _load_kind(node: fx.Node) -> str:
    """The value kind of a loaded node in the program (a float read at run time is a float tensor)."""
    if runtime_scalar(node) is not None:
        return "float"
    return LOAD_KINDS[role_of(dtype_name(val(node).dtype))]


def _emit(builder: ScoreProgramBuilder, expr: Expr, loads: list, load_index: dict, op: PathOp) -> int:
    kind = expr[0]
    if kind == "const":
        return builder.const(expr[1])
    if kind == "index":
        return builder.add(expr[1])
    if kind == "load":
        node = expr[1]
        if node not in load_index:
            load_index[node] = len(loads)
            loads.append((node, op))
        return builder.load(load_index[node], _load_kind(node))
    args = [_emit(builder, child, loads, load_index, op) for child in expr[1:]]
    return builder.add_folded(kind, *args)
