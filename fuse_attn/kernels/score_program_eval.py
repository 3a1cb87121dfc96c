"""The score program of an AttentionSpec (``spec.score_program``): evaluation and reverse-mode differentiation.

Each op's forward is a method of the same name on an *ops namespace*; each op's derivative is written once, in
:data:`VJP`, in terms of that namespace. These namespaces instantiate them:

* :class:`TorchOps` -- torch tensors: :func:`~fuse_attn.kernels.reference_attention`, the CPU blockwise forward
  and, through :func:`backward`, the CPU blockwise backward (which runs below the Autograd dispatch key, where
  torch.autograd records nothing, so the program is differentiated here);
* ``codegen.TritonOps`` -- Triton source text for the kernels' SCORE_MOD / SCORE_MOD_BWD blocks;
* :class:`BoundOps` -- magnitude bounds, which codegen uses to leave out clamps and guards that cannot trigger;
* :class:`IntervalOps` -- bounds of a predicate of integer vectors over sets of elements, from which the launcher
  classifies a mask's tiles per call (the ops of ``plan.PREDICATE_OPS`` only: a predicate has no derivative).

A namespace provides ``score()``, ``index(op)`` (q_idx, kv_idx, batch_idx, head_idx, q_len, kv_len),
``const(value)``, ``load(tensor)``, one method per op of :mod:`fuse_attn.score_program`'s ``UNARY_OPS`` /
``BINARY_OPS`` / ``TERNARY_OPS``, ``sign(x)`` (used by a derivative) and ``bind(value, name, note)`` (a hook to name
a computed value).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from fuse_attn.score_program import LEAF_OPS, ScoreNode, ScoreTensor, node_kinds

INDEX_OPS = ("q_idx", "kv_idx", "batch_idx", "head_idx", "q_len", "kv_len")
# Largest finite fp32 (torch.finfo(torch.float32).max).
FLT_MAX = 3.4028234663852886e38


def _tie(o, g, a, b, loses: Callable):
    """torch's maximum/minimum gradient for one side: half of it on a tie, none where this side loses."""
    return o.where(o.eq(a, b), o.mul(g, o.const(0.5)), o.where(loses(a, b), o.const(0.0), g))


# op -> per argument: the vector-Jacobian product (o: namespace, g: adjoint of the output, y: the output, then the
# arguments), or None for an argument that carries no gradient. torch's derivative formulas
# (tools/autograd/derivatives.yaml); ops absent here (comparisons, logical ops) carry none.
VJP: dict[str, tuple[Optional[Callable], ...]] = {
    "neg": (lambda o, g, y, a: o.neg(g),),
    "abs": (lambda o, g, y, a: o.mul(g, o.sign(a)),),
    "exp": (lambda o, g, y, a: o.mul(g, y),),
    "log": (lambda o, g, y, a: o.div(g, a),),
    "tanh": (lambda o, g, y, a: o.mul(g, o.sub(o.const(1.0), o.mul(y, y))),),
    "sigmoid": (lambda o, g, y, a: o.mul(g, o.mul(o.sub(o.const(1.0), y), y)),),
    "sqrt": (lambda o, g, y, a: o.div(g, o.mul(o.const(2.0), y)),),
    "to_float": (lambda o, g, y, a: g,),
    "add": (lambda o, g, y, a, b: g, lambda o, g, y, a, b: g),
    "sub": (lambda o, g, y, a, b: g, lambda o, g, y, a, b: o.neg(g)),
    "mul": (lambda o, g, y, a, b: o.mul(g, b), lambda o, g, y, a, b: o.mul(g, a)),
    "div": (lambda o, g, y, a, b: o.div(g, b), lambda o, g, y, a, b: o.neg(o.mul(g, o.div(y, b)))),
    "maximum": (lambda o, g, y, a, b: _tie(o, g, a, b, o.lt), lambda o, g, y, a, b: _tie(o, g, a, b, o.gt)),
    "minimum": (lambda o, g, y, a, b: _tie(o, g, a, b, o.gt), lambda o, g, y, a, b: _tie(o, g, a, b, o.lt)),
    "clamp_min": (lambda o, g, y, a, b: o.where(o.ge(a, b), g, o.const(0.0)),
                  lambda o, g, y, a, b: o.where(o.lt(a, b), g, o.const(0.0))),
    "clamp_max": (lambda o, g, y, a, b: o.where(o.le(a, b), g, o.const(0.0)),
                  lambda o, g, y, a, b: o.where(o.gt(a, b), g, o.const(0.0))),
    "where": (None, lambda o, g, y, c, a, b: o.where(c, g, o.const(0.0)),
              lambda o, g, y, c, a, b: o.where(c, o.const(0.0), g)),
}


def forward(program: Sequence[ScoreNode], ops) -> list:
    """The value of every node of ``program`` in namespace ``ops`` (the last one is the new score)."""
    vals: list = []
    for i, node in enumerate(program):
        if node.op == "score":
            v = ops.score()
        elif node.op == "const":
            v = ops.const(node.value)
        elif node.op == "load":
            v = ops.load(node.value)
        elif node.op in INDEX_OPS:
            v = ops.index(node.op)
        else:
            v = getattr(ops, node.op)(*(vals[a] for a in node.args))
        vals.append(ops.bind(v, f"sm_{i}", _note(program, i)))
    return vals


def _note(program: Sequence[ScoreNode], i: int) -> str:
    node = program[i]
    if node.op in LEAF_OPS:
        return node.op if node.value is None else f"{node.op} {node.value!r}"
    args = (repr(program[a].value) if program[a].op == "const" else f"sm_{a}" for a in node.args)
    return f"{node.op}({', '.join(args)})"


def _diff_edges(program: Sequence[ScoreNode], kinds: list[str]):
    """(node, argument position, argument node) for every argument that carries a gradient."""
    for i, node in enumerate(program):
        rules = VJP.get(node.op)
        if rules is None:
            continue  # comparisons and logical ops: no gradient
        for pos, a in enumerate(node.args):
            if rules[pos] is not None and kinds[a] == "float":
                yield i, pos, a


def relevant_nodes(program: Sequence[ScoreNode], tensors: Sequence[ScoreTensor], sources: set[int]) -> set[int]:
    """The nodes through which a gradient flows from the last node to one of ``sources``."""
    if not program:
        return set()
    kinds = node_kinds(tuple(program), tuple(tensors))
    edges = list(_diff_edges(program, kinds))
    depends = set(sources)
    for i, _, a in edges:  # edges are in node order, so one pass reaches every dependent node
        if a in depends:
            depends.add(i)
    reaches = {len(program) - 1}
    for i, _, a in reversed(edges):
        if i in reaches:
            reaches.add(a)
    return depends & reaches


def score_sources(program: Sequence[ScoreNode]) -> set[int]:
    return {i for i, n in enumerate(program) if n.op == "score"}


def bias_load_sources(program: Sequence[ScoreNode], tensors: Sequence[ScoreTensor]) -> dict[int, set[int]]:
    """tensor index -> its load nodes, for every bias tensor."""
    out: dict[int, set[int]] = {}
    for i, n in enumerate(program):
        if n.op == "load" and tensors[n.value].role == "bias":
            out.setdefault(n.value, set()).add(i)
    return out


def backward(program: Sequence[ScoreNode], tensors: Sequence[ScoreTensor], vals: list, ops, g_out,
             sources: set[int]) -> dict[int, object]:
    """Reverse mode: the adjoint of each node in ``sources`` (absent if no gradient reaches it), given the
    forward values ``vals`` and the adjoint ``g_out`` of the program's result."""
    relevant = relevant_nodes(program, tensors, sources)
    adj = {len(program) - 1: g_out} if len(program) - 1 in relevant else {}
    for i in reversed(range(len(program))):
        if i not in adj:
            continue
        g = adj[i] = ops.bind(adj[i], f"g_{i}", f"adjoint of sm_{i}")
        node = program[i]
        rules = VJP.get(node.op, ())  # leaves: none
        args = [vals[a] for a in node.args]
        for pos, a in enumerate(node.args):
            if a in relevant and rules[pos] is not None:
                c = rules[pos](ops, g, vals[i], *args)
                adj[a] = ops.add(adj[a], c) if a in adj else c
    return {i: adj[i] for i in sources if i in adj}


# ---- torch ----------------------------------------------------------------------------------------------------------
class TorchOps:
    """The program on torch tensors, in dtype ``s.dtype`` (ints int64, bools bool), broadcasting like torch."""

    def __init__(self, s: Tensor, tensors: Sequence[Tensor], indices: dict[str, Tensor]):
        self.s, self.tensors, self.indices, self.ct = s, tensors, indices, s.dtype

    def score(self):
        return self.s

    def index(self, op):
        return self.indices[op]

    def const(self, value):
        dtype = torch.bool if isinstance(value, bool) else torch.int64 if isinstance(value, int) else self.ct
        return torch.tensor(value, dtype=dtype, device=self.s.device)

    def load(self, i):
        t = self.tensors[i]
        if t.is_floating_point():
            return t.to(self.ct)
        return t if t.dtype == torch.bool else t.to(torch.int64)

    def bind(self, value, name, note=""):
        return value

    def _f(self, x):
        return x if x.is_floating_point() else x.to(self.ct)

    def _same(self, *xs):
        """Operands of one kind: float if any is (in the compute dtype), else int64 if any is, else bool."""
        if any(x.is_floating_point() for x in xs):
            return [self._f(x) for x in xs]
        if any(x.dtype != torch.bool for x in xs):
            return [x.to(torch.int64) for x in xs]
        return list(xs)

    def neg(self, a):
        return torch.neg(a)

    def abs(self, a):
        return torch.abs(a)

    def exp(self, a):
        return torch.exp(self._f(a))

    def log(self, a):
        return torch.log(self._f(a))

    def tanh(self, a):
        return torch.tanh(self._f(a))

    def sigmoid(self, a):
        return torch.sigmoid(self._f(a))

    def sqrt(self, a):
        return torch.sqrt(self._f(a))

    def logical_not(self, a):
        return torch.logical_not(a)

    def to_float(self, a):
        return self._f(a)

    def sign(self, a):
        return torch.sgn(a)

    def add(self, a, b):
        return torch.add(*self._same(a, b))

    def sub(self, a, b):
        return torch.sub(*self._same(a, b))

    def mul(self, a, b):
        return torch.mul(*self._same(a, b))

    def div(self, a, b):
        return torch.div(self._f(a), self._f(b))

    def maximum(self, a, b):
        return torch.maximum(*self._same(a, b))

    def minimum(self, a, b):
        return torch.minimum(*self._same(a, b))

    def clamp_min(self, a, b):
        return torch.clamp_min(*self._same(a, b))

    def clamp_max(self, a, b):
        return torch.clamp_max(*self._same(a, b))

    def lt(self, a, b):
        return torch.lt(*self._same(a, b))

    def le(self, a, b):
        return torch.le(*self._same(a, b))

    def gt(self, a, b):
        return torch.gt(*self._same(a, b))

    def ge(self, a, b):
        return torch.ge(*self._same(a, b))

    def eq(self, a, b):
        return torch.eq(*self._same(a, b))

    def ne(self, a, b):
        return torch.ne(*self._same(a, b))

    def logical_and(self, a, b):
        return torch.logical_and(a, b)

    def logical_or(self, a, b):
        return torch.logical_or(a, b)

    def where(self, c, a, b):
        return torch.where(c, *self._same(a, b))


def torch_indices(row0: int, rows: int, Z: int, H: int, M: int, N: int, device) -> dict[str, Tensor]:
    """The index leaves of query rows [row0, row0 + rows) x all N keys, broadcastable to [Z, H, rows, N]."""
    return {
        "q_idx": torch.arange(row0, row0 + rows, device=device)[:, None],
        "kv_idx": torch.arange(N, device=device)[None, :],
        "batch_idx": torch.arange(Z, device=device).view(Z, 1, 1, 1),
        "head_idx": torch.arange(H, device=device).view(1, H, 1, 1),
        "q_len": torch.tensor(M, device=device),
        "kv_len": torch.tensor(N, device=device),
    }


# ---- bounds ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bound:
    """Every finite value has ``|v| <= mag``; ``nonfinite``: an inf or NaN is possible (all in fp32)."""

    mag: float
    nonfinite: bool
    value: Optional[float] = None  # the number, for a constant


def divides_safely(b: Bound) -> bool:
    """Whether dividing by ``b`` is by a finite nonzero constant (no inf or NaN from a zero denominator)."""
    return b.value is not None and math.isfinite(b.value) and b.value != 0.0


def _bound(mag: float, nonfinite: bool) -> Bound:
    # A finite fp32 result is at most FLT_MAX; a larger bound means the op may overflow to inf.
    return Bound(min(mag, FLT_MAX), nonfinite or mag > FLT_MAX)


def _mul_mag(a: float, b: float) -> float:
    return 0.0 if a == 0.0 or b == 0.0 else a * b


# |natural log| of any finite positive fp32: log(2**-149) = -103.28 (smallest subnormal), log(FLT_MAX) = 88.72.
_LOG_MAG = 149 * math.log(2.0)
# Indices, lengths and loaded integers are int64 at most (they wrap, never become inf).
INT_BOUND = Bound(2.0 ** 63, False)


class BoundOps:
    """Magnitude analysis: each value is a :class:`Bound`; ``score`` and ``load`` leaves get the bound given."""

    def __init__(self, score: Bound, load: Bound):
        self._score, self._load = score, load

    def score(self):
        return self._score

    def index(self, op):
        return INT_BOUND

    def const(self, value):
        v = float(value)
        return Bound(abs(v), False, v) if math.isfinite(v) else Bound(0.0, True, v)

    def load(self, i):
        return self._load

    def bind(self, value, name, note=""):
        return value

    def _join(self, *xs):
        return Bound(max(x.mag for x in xs), any(x.nonfinite for x in xs))

    def neg(self, a):
        return Bound(a.mag, a.nonfinite)

    abs = to_float = neg

    def exp(self, a):
        return _bound(math.exp(a.mag) if a.mag < 710 else math.inf, a.nonfinite)  # exp(710) overflows a double

    def log(self, a):
        return Bound(_LOG_MAG, True)  # log(0) = -inf, log(x < 0) = NaN

    def tanh(self, a):
        return Bound(1.0, a.nonfinite)  # NaN in, NaN out; +-inf in gives +-1

    sigmoid = tanh

    def sqrt(self, a):
        return Bound(math.sqrt(a.mag), True)  # sqrt(x < 0) = NaN

    def sign(self, a):
        return Bound(1.0, False)

    def add(self, a, b):
        return _bound(a.mag + b.mag, a.nonfinite or b.nonfinite)

    sub = add

    def mul(self, a, b):
        return _bound(_mul_mag(a.mag, b.mag), a.nonfinite or b.nonfinite)

    def div(self, a, b):
        if divides_safely(b):
            return _bound(a.mag / abs(b.value), a.nonfinite)
        return Bound(FLT_MAX, True)  # the denominator has no lower bound away from 0

    def maximum(self, a, b):
        return self._join(a, b)

    minimum = clamp_min = clamp_max = maximum

    def where(self, c, a, b):
        return self._join(a, b)

    def _bool(self, *args):
        return Bound(1.0, False)

    lt = le = gt = ge = eq = ne = logical_and = logical_or = logical_not = _bool


# ---- intervals ------------------------------------------------------------------------------------------------------
class Span(NamedTuple):
    """An integer value's bounds over a set of elements: ``lo <= value <= hi`` (int64 tensors, broadcasting)."""

    lo: Tensor
    hi: Tensor


class Truth(NamedTuple):
    """A bool value over a set of elements: whether it may be true somewhere, whether it may be false somewhere."""

    may_be_true: Tensor
    may_be_false: Tensor


class IntervalOps:
    """The integer and bool values of a predicate (``plan.PREDICATE_OPS``) over sets of elements -- a query row and
    a granule of keys, in ``launch.mask_granules``, the reference of the generated tile-classes kernel
    (``codegen.TritonIntervalOps`` writes these rules in Triton) -- as :class:`Span` / :class:`Truth` tensors. ``indices`` and
    ``loads`` give the leaves' spans (by index op and by score tensor). A bool is certain (one of its flags False)
    only where its inputs' bounds prove it. The integers are taken to stay far from int64's limits (ids, positions
    and offsets), where sums do not wrap."""

    def __init__(self, indices: dict[str, Span], loads: dict[int, Span], device):
        self.indices, self.loads, self.device = indices, loads, device

    def index(self, op):
        return self.indices[op]

    def load(self, i):
        return self.loads[i]

    def const(self, value):
        if isinstance(value, bool):
            return Truth(torch.tensor(value, device=self.device), torch.tensor(not value, device=self.device))
        number = torch.tensor(value, dtype=torch.int64, device=self.device)
        return Span(number, number)

    def bind(self, value, name, note=""):
        return value

    def neg(self, a):
        a = _span(a)
        return Span(-a.hi, -a.lo)

    def add(self, a, b):
        a, b = _span(a), _span(b)
        return Span(a.lo + b.lo, a.hi + b.hi)

    def sub(self, a, b):
        a, b = _span(a), _span(b)
        return Span(a.lo - b.hi, a.hi - b.lo)

    def maximum(self, a, b):
        a, b = _span(a), _span(b)
        return Span(torch.maximum(a.lo, b.lo), torch.maximum(a.hi, b.hi))

    def minimum(self, a, b):
        a, b = _span(a), _span(b)
        return Span(torch.minimum(a.lo, b.lo), torch.minimum(a.hi, b.hi))

    def lt(self, a, b):
        a, b = _span(a), _span(b)
        return Truth(a.lo < b.hi, a.hi >= b.lo)

    def le(self, a, b):
        a, b = _span(a), _span(b)
        return Truth(a.lo <= b.hi, a.hi > b.lo)

    def gt(self, a, b):
        return self.lt(b, a)

    def ge(self, a, b):
        return self.le(b, a)

    def eq(self, a, b):
        a, b = _span(a), _span(b)
        single = (a.lo == a.hi) & (b.lo == b.hi) & (a.lo == b.lo)  # both one and the same value
        return Truth((a.lo <= b.hi) & (b.lo <= a.hi), ~single)

    def ne(self, a, b):
        return self.logical_not(self.eq(a, b))

    def logical_not(self, a):
        return Truth(a.may_be_false, a.may_be_true)

    def logical_and(self, a, b):
        return Truth(a.may_be_true & b.may_be_true, a.may_be_false | b.may_be_false)

    def logical_or(self, a, b):
        return Truth(a.may_be_true | b.may_be_true, a.may_be_false & b.may_be_false)

    def where(self, c, a, b):
        """``a`` where ``c`` is certainly true, ``b`` where certainly false, else what either may be."""
        if isinstance(a, Truth) and isinstance(b, Truth):
            return Truth((c.may_be_true & a.may_be_true) | (c.may_be_false & b.may_be_true),
                         (c.may_be_true & a.may_be_false) | (c.may_be_false & b.may_be_false))
        a, b, either = _span(a), _span(b), c.may_be_true & c.may_be_false
        return Span(torch.where(either, torch.minimum(a.lo, b.lo), torch.where(c.may_be_true, a.lo, b.lo)),
                    torch.where(either, torch.maximum(a.hi, b.hi), torch.where(c.may_be_true, a.hi, b.hi)))


def _span(x):
    """An integer's bounds; a bool's as the integer it is in arithmetic and comparisons (True 1, False 0)."""
    if isinstance(x, Span):
        return x
    return Span((~x.may_be_false).to(torch.int64), x.may_be_true.to(torch.int64))
