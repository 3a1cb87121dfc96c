"""The score program: the pointwise function of the score a spec carries (``AttentionSpec.score_program``).

It is what the model does to ``s = (q @ k^T) * scale`` before the softmax -- masks, biases, softcaps, ALiBi, any
pointwise change -- as a small list of :class:`ScoreNode` instructions over the score, the element's indices
(batch, head, query, key), the run-time lengths, constants and elements of score tensors (``load``). The graph side
reads it from FX nodes (:mod:`fuse_attn.graph.score_reader`); the kernels evaluate and differentiate it
(:mod:`fuse_attn.kernels.score_program_eval`) and write it into the generated kernels.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, Optional, Union

# ---- the instructions ------------------------------------------------------------------------------------------------
# Leaves (no args): the score, the element's indices, the run-time lengths, a constant, a score-tensor element.
LEAF_OPS = ("score", "q_idx", "kv_idx", "batch_idx", "head_idx", "q_len", "kv_len", "const", "load")
UNARY_OPS = ("neg", "abs", "exp", "log", "tanh", "sigmoid", "sqrt", "logical_not", "to_float")
BINARY_OPS = (
    "add", "sub", "mul", "div", "maximum", "minimum", "clamp_min", "clamp_max",
    "lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or",
)
TERNARY_OPS = ("where",)  # where(cond, a, b)
SCORE_OP_ARITY = {**{op: 0 for op in LEAF_OPS}, **{op: 1 for op in UNARY_OPS}, **{op: 2 for op in BINARY_OPS},
                  **{op: 3 for op in TERNARY_OPS}}
ORDER_COMPARISONS = ("lt", "le", "gt", "ge")
COMPARISON_OPS = ORDER_COMPARISONS + ("eq", "ne")
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==",
          "ne": "!=", "logical_and": "&", "logical_or": "|"}


# A fill value at or below this masks a key exactly like -inf would for any row that keeps one key whose score is
# above it: it is float16's most negative finite value, the smallest fill Hugging Face style masks use
# (torch.finfo(dtype).min), and exp(fill - rowmax) underflows to 0 in fp32 once the gap exceeds ~104.
MASKING_FILL_LIMIT = -65504.0


@dataclass(frozen=True)
class ScoreNode:
    """One instruction of a score program. ``args`` index earlier nodes of the program; ``value`` is the number
    of a ``const`` and the score-tensor index of a ``load``. Every op has torch's semantics (``maximum`` /
    ``minimum`` split the gradient of a tie in halves, ``clamp_min`` / ``clamp_max`` pass it, as torch does)."""

    op: str
    args: tuple[int, ...] = ()
    value: Union[float, int, bool, None] = None


def node_kinds(program: tuple[ScoreNode, ...], tensors: tuple["ScoreTensor", ...]) -> list[str]:
    """The value kind -- "float", "int" or "bool" -- of each node (leaves: score float, indices and lengths int,
    a const by its Python type, a load by its tensor's role: ``LOAD_KINDS``); raises UnsupportedSpec for an ill-formed
    program."""
    kinds: list[str] = []
    for i, node in enumerate(program):
        if node.op not in SCORE_OP_ARITY:
            raise UnsupportedSpec(f"score program node {i}: unknown op {node.op!r}")
        if len(node.args) != SCORE_OP_ARITY[node.op] or any(not 0 <= a < i for a in node.args):
            raise UnsupportedSpec(f"score program node {i} ({node.op}) has bad args {node.args}")
        a = [kinds[j] for j in node.args]
        if node.op == "score":
            kind = "float"
        elif node.op in ("q_idx", "kv_idx", "batch_idx", "head_idx", "q_len", "kv_len"):
            kind = "int"
        elif node.op == "const":
            kind = "bool" if isinstance(node.value, bool) else "int" if isinstance(node.value, int) else "float"
            if not isinstance(node.value, (bool, int, float)):
                raise UnsupportedSpec(f"score program node {i}: const {node.value!r} is not a number")
        elif node.op == "load":
            if not isinstance(node.value, int) or not 0 <= node.value < len(tensors):
                raise UnsupportedSpec(f"score program node {i} loads a missing tensor {node.value!r}")
            role = tensors[node.value].role
            if role not in LOAD_KINDS:
                raise UnsupportedSpec(f"score program node {i} loads a tensor of unknown role {role!r}")
            kind = LOAD_KINDS[role]
        elif node.op in ("logical_not", "logical_and", "logical_or"):
            if any(k != "bool" for k in a):
                raise UnsupportedSpec(f"score program node {i}: {node.op} of {a}")
            kind = "bool"
        elif node.op in COMPARISON_OPS:
            kind = "bool"
        elif node.op == "to_float":
            kind = "float"
        elif node.op == "where":
            if a[0] != "bool":
                raise UnsupportedSpec(f"score program node {i}: where on a {a[0]} condition")
            kind = "float" if "float" in a[1:] else "int" if "int" in a[1:] else "bool"
        elif node.op in ("exp", "log", "tanh", "sigmoid", "sqrt", "div"):
            kind = "float"  # true division and transcendental functions promote to float, as in torch
        else:
            if "bool" in a:
                raise UnsupportedSpec(f"score program node {i}: arithmetic {node.op} on a bool")
            kind = "float" if "float" in a else "int"
        kinds.append(kind)
    return kinds


class ScoreProgramBuilder:
    """Builds a score program node by node; identical nodes are shared (so each is computed once)."""

    def __init__(self):
        self.nodes: list[ScoreNode] = []
        self._index: dict[tuple[ScoreNode, type], int] = {}
        # score tensor -> the value kind of its loads, where :meth:`load` named it (a load added otherwise is a float)
        self._load_kinds: dict[int, str] = {}

    def add(self, op: str, *args: int, value: Union[float, int, bool, None] = None) -> int:
        node = ScoreNode(op, tuple(args), value)
        key = (node, type(value))  # True, 1 and 1.0 are equal in Python but not one constant of a program
        if key not in self._index:
            self._index[key] = len(self.nodes)
            self.nodes.append(node)
        return self._index[key]

    def const(self, value: Union[float, int, bool]) -> int:
        return self.add("const", value=value)

    def load(self, tensor: int, kind: str) -> int:
        """A load of score tensor ``tensor``, whose values are of ``kind`` ("float", "int" or "bool"): folding
        ``x + 0`` keeps the kind of the result, so it folds only a float load with a float 0."""
        self._load_kinds[tensor] = kind
        return self.add("load", value=tensor)

    def add_folded(self, op: str, *args: int) -> int:
        """``add(op, *args)``, folding what is known: ``x + 0``, ``x & True``, ``q_idx >= 0`` (indices are never
        negative) and ops on constants only (what Hugging Face's mask builders leave once inlined)."""
        nodes = self.nodes
        consts = [nodes[a].value if nodes[a].op == "const" else None for a in args]
        if op in _NEUTRAL and consts[1] is not None and consts[1] == _NEUTRAL[op] and not isinstance(consts[1], bool):
            if isinstance(consts[1], int) or self._is_float(args[0]):
                return args[0]
        if op in ("add", "mul") and consts[0] is not None and consts[0] == _NEUTRAL[op] and not isinstance(consts[0], bool):
            if isinstance(consts[0], int) or self._is_float(args[1]):
                return args[1]
        if op in ("logical_and", "logical_or"):
            absorbing = op == "logical_or"  # x & False == False, x | True == True
            for i, c in enumerate(consts):
                if c is not None:
                    return args[i] if c == absorbing else args[1 - i]
        if op in ("ge", "lt") and consts[1] is not None and not isinstance(consts[1], bool) and consts[1] <= 0 \
                and nodes[args[0]].op in _INDEX_LEAVES:
            return self.const(op == "ge")
        if op == "where" and all(isinstance(c, bool) for c in consts[1:]) and consts[1] != consts[2]:
            # where(c, True, False) is c (a bool triangle, ``tril(full(True))``); where(c, False, True) is not c
            return args[0] if consts[1] else self.add("logical_not", args[0])
        if op not in ("where",) and all(c is not None for c in consts):
            folded = _fold(op, consts)
            if folded is not None:
                return self.const(folded)
        return self.add(op, *args)

    def _is_float(self, i: int) -> bool:
        node = self.nodes[i]
        if node.op == "load":
            return self._load_kinds.get(node.value, "float") == "float"
        return node.op == "score" or (node.op == "const" and isinstance(node.value, float))

    def program(self, result: int) -> tuple[ScoreNode, ...]:
        """The nodes ``result`` depends on, renumbered, ending in ``result``; () if that is the bare score."""
        if self.nodes[result].op == "score":
            return ()
        needed, stack = set(), [result]
        while stack:
            i = stack.pop()
            if i not in needed:
                needed.add(i)
                stack.extend(self.nodes[i].args)
        order = sorted(needed - {result}) + [result]
        renumber = {old: new for new, old in enumerate(order)}
        return tuple(ScoreNode(self.nodes[i].op, tuple(renumber[a] for a in self.nodes[i].args), self.nodes[i].value)
                     for i in order)


_NEUTRAL = {"add": 0, "sub": 0, "mul": 1, "div": 1}  # x op c == x (for the right operand c)


_INDEX_LEAVES = ("q_idx", "kv_idx", "batch_idx", "head_idx")


def _fold(op: str, values: list) -> Optional[Union[bool, int, float]]:
    """An op on Python numbers with torch's result (scalar tensors carry its type promotion)."""
    import torch

    try:
        tensors = [torch.tensor(v) for v in values]
        result = {
            "neg": lambda a: -a, "abs": torch.abs, "logical_not": torch.logical_not, "add": torch.add, "sub": torch.sub,
            "mul": torch.mul, "div": torch.div, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
            "eq": torch.eq, "ne": torch.ne, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
            "maximum": torch.maximum, "minimum": torch.minimum, "to_float": lambda a: a.float(),
        }[op](*tensors)
    except (KeyError, RuntimeError):
        return None  # not worth folding (exp, log, ... of a constant stay in the program)
    return result.item()


def program_text(program: tuple[ScoreNode, ...], tensors: tuple["ScoreTensor", ...] = ()) -> str:
    """The program as one expression (shared subexpressions repeated), e.g. ``tanh(s * 0.02) * 50``."""
    texts: list[str] = []
    for node in program:
        a = [texts[j] for j in node.args]
        if node.op == "score":
            t = "s"
        elif node.op == "const":
            t = f"{node.value:.6g}" if isinstance(node.value, float) else repr(node.value)
        elif node.op == "load":
            kind = tensors[node.value].role if node.value < len(tensors) else "t"
            bc = f"[{_broadcast_text(tensors[node.value].broadcast)}]" if node.value < len(tensors) else ""
            t = f"{kind}{node.value}{bc}"
        elif node.op in LEAF_OPS:
            t = node.op
        elif node.op in ("add", "sub") and _negative_constant(program[node.args[1]]):
            # x + -2 reads x - 2, x - -2 reads x + 2
            t = f"({a[0]} {'-' if node.op == 'add' else '+'} {a[1][1:]})"
        elif node.op in _INFIX:
            t = f"({a[0]} {_INFIX[node.op]} {a[1]})"
        else:
            t = f"{node.op}({', '.join(_unwrapped(x) for x in a)})"
        texts.append(t)
    return _unwrapped(texts[-1]) if texts else "s"


def _negative_constant(node: ScoreNode) -> bool:
    return node.op == "const" and not isinstance(node.value, bool) and node.value < 0 and not math.isinf(node.value)


def _unwrapped(text: str) -> str:
    """An infix expression without its outer parentheses (each infix text is wrapped in exactly one pair)."""
    return text[1:-1] if text.startswith("(") and text.endswith(")") else text


@dataclass(frozen=True)
class ScoreTensor:
    """A tensor the score program reads (``load``). ``role`` (:func:`role_of` its dtype): "bias" a float tensor (it
    may get a gradient), "mask" a bool tensor, "int" an integer tensor the program compares or computes with
    (document ids, positions, chunk ids: the matcher loads them as vectors per query row or key column).
    ``broadcast`` says, for (Z, H, M, N), which dims have size 1."""

    role: Literal["bias", "mask", "int"]
    dtype: str
    broadcast: tuple[bool, bool, bool, bool]


# The value kind of a load of a score tensor of each role (:func:`node_kinds`).
LOAD_KINDS = {"bias": "float", "mask": "bool", "int": "int"}
# The dtypes an "int" score tensor may have: torch's signed integers and uint8, which the kernels load (int64 as it
# is, the others widened to int32).
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8")


def role_of(dtype: str) -> str:
    """The role of a score tensor of ``dtype`` (a name, as :attr:`ScoreTensor.dtype` holds it)."""
    if dtype == "bool":
        return "mask"
    return "bias" if dtype.startswith(("float", "bfloat")) else "int"


def subprogram(program: tuple[ScoreNode, ...], index: int) -> tuple[ScoreNode, ...]:
    """The nodes that node ``index`` depends on, ``index`` last (its result), renumbered in the post-order of a walk
    from it, arguments left to right: one expression gets one node order whatever order a builder made its nodes in
    (so equal programs compare equal and share a spec)."""
    position: dict[int, int] = {}
    order: list[int] = []

    def visit(i: int) -> None:
        if i not in position:
            for a in program[i].args:
                visit(a)
            position[i] = len(order)
            order.append(i)

    visit(index)
    return tuple(dataclasses.replace(program[i], args=tuple(position[a] for a in program[i].args)) for i in order)


def _broadcast_text(broadcast: tuple[bool, bool, bool, bool]) -> str:
    return ",".join("1" if b else name for b, name in zip(broadcast, "ZHMN"))


class UnsupportedSpec(ValueError):
    """Raised for a spec or inputs the kernels cannot run; raised while matching, its message is the reason of a
    not-fused verdict."""
