"""The one object matching and code generation share: a frozen description of one matched attention.

The matcher (``fuse_attn.graph.matching``) builds an :class:`AttentionSpec` from FX nodes; the kernels
(``fuse_attn.kernels``) receive it -- as the JSON string argument of the fused op -- and never see a node.

Semantics, for q ``[Z, H, M, D]``, k ``[Z, H // gqa_group, N, D]``, v ``[Z, H // gqa_group, N, DV]`` and the
score tensors ``T[i]`` (4-D, broadcastable to ``[Z, H, M, N]``)::

    s = (q @ k^T) * scale                      # fp32, natural-log units
    s = score_mod(s, z, h, i, j, T[.][z, h, i, j])   # a pointwise program (ScoreNode list), computed in fp32
    if causal: s = where(causal.visible(i, j), s, -inf)
    out = softmax(s, dim=-1) @ v               # out in q's dtype; lse = logsumexp(s, -1) in fp32

A row whose every score is -inf (an "empty" row: every key masked) is NaN in ``softmax``; with
``empty_rows="zero"`` its output and gradients are 0 instead, as ``aten._safe_softmax`` and
``scaled_dot_product_attention`` give. Its lse is -inf either way.

With ``dropout_p > 0`` each probability is kept with probability ``1 - dropout_p`` and scaled by
``1 / (1 - dropout_p)``, else zeroed, before the product with v (``dropout(softmax(s), p, training=True) @ v``);
lse stays that of the undropped scores. The keep-mask is Philox noise from an int64 seed tensor the op receives
(``fuse_attn.kernels.philox``).

Lengths M and N are run-time values (a spec may record them for display when they are static).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Literal, NamedTuple, Optional, Union

SUPPORTED_DTYPES = ("float16", "bfloat16", "float32")
# Largest head dim the kernels take: a 256-wide fp32 accumulator tile is the most the register file of an
# SM (64K 32-bit registers) holds next to the score tile at the smallest block sizes (FA2/FA3 have the same cap).
MAX_HEAD_DIM = 256


# ---- the score modification: a small pointwise program ---------------------------------------------------------
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
COMPARISON_OPS = ("lt", "le", "gt", "ge", "eq", "ne")
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==",
          "ne": "!=", "logical_and": "&", "logical_or": "|"}


# A fill value at or below this masks a key exactly like -inf would for any row that keeps one key whose score is
# above it: it is float16's most negative finite value, the smallest fill Hugging Face style masks use
# (torch.finfo(dtype).min), and exp(fill - rowmax) underflows to 0 in fp32 once the gap exceeds ~104.
MASKING_FILL_LIMIT = -65504.0


class KeyPadding(NamedTuple):
    """A key padding vector of a spec (:meth:`AttentionSpec.key_padding`)."""

    tensor: int  # the score tensor holding it
    hidden: str  # the value that hides a key: "false" / "true" (a bool mask), "-inf" or "fill" (a bias)
    kind: str  # "-inf" (hidden scores are -inf, rows of no key give 0) or "masking" (at or below the limit)
    # d of a causal band ``kv_idx <= q_idx + d`` written into the score program that hides the keys past it the same
    # way (Hugging Face's padding + causal masks are one mask), or None
    band: Optional[int] = None


class MaskBlocks(NamedTuple):
    """A mask whose tiles are classified per call (:meth:`AttentionSpec.mask_blocks`)."""

    tensor: int  # the score tensor holding it
    hidden: str  # where it hides a score: "fill" (a bias at or below the fill limit), "false" / "true" (a bool mask)
    unmasked: int  # the program node that is the result where the mask hides nothing (the score itself for s + mask)


class _Hidden(NamedTuple):
    """Where keys are hidden: by score tensor ``tensor`` where its value is ``hidden`` (see :class:`KeyPadding`), or
    -- ``tensor`` None -- past the causal band ``kv_idx <= q_idx + band``."""

    tensor: Optional[int]
    hidden: str = ""
    band: int = 0


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
    a const by its Python type, a load by its tensor's role); raises UnsupportedSpec for an ill-formed program."""
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
            kind = "bool" if tensors[node.value].role == "mask" else "float"
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

    def add(self, op: str, *args: int, value: Union[float, int, bool, None] = None) -> int:
        node = ScoreNode(op, tuple(args), value)
        key = (node, type(value))  # True, 1 and 1.0 are equal in Python but not one constant of a program
        if key not in self._index:
            self._index[key] = len(self.nodes)
            self.nodes.append(node)
        return self._index[key]

    def const(self, value: Union[float, int, bool]) -> int:
        return self.add("const", value=value)

    def add_folded(self, op: str, *args: int) -> int:
        """``add(op, *args)``, folding what is known: ``x + 0``, ``x & True``, ``q_idx >= 0`` (indices are never
        negative) and ops on constants only (what Hugging Face's mask builders leave once inlined)."""
        nodes = self.nodes
        consts = [nodes[a].value if nodes[a].op == "const" else None for a in args]
        if op in _NEUTRAL and consts[1] is not None and consts[1] == _NEUTRAL[op] and not isinstance(consts[1], bool):
            if isinstance(consts[1], int) or _is_float(nodes, args[0]):
                return args[0]
        if op in ("add", "mul") and consts[0] is not None and consts[0] == _NEUTRAL[op] and not isinstance(consts[0], bool):
            if isinstance(consts[0], int) or _is_float(nodes, args[1]):
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


def _is_float(nodes, i: int) -> bool:
    return nodes[i].op in ("score", "load") or (nodes[i].op == "const" and isinstance(nodes[i].value, float))


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
    """A tensor read by the score mods. ``broadcast`` says, for (Z, H, M, N), which dims have size 1."""

    role: Literal["bias", "mask"]
    dtype: str
    broadcast: tuple[bool, bool, bool, bool]


@dataclass(frozen=True)
class CausalMask:
    """Key ``j`` is visible to query ``i`` iff ``j <= i + offset`` -- and, with a sliding ``window``, also
    ``j > i + offset - window`` (the ``window`` most recent keys, Mistral style).

    ``offset = diagonal`` for ``top_left`` alignment (``tril(ones(M, N), diagonal)``) and
    ``diagonal + N - M`` for ``bottom_right`` (the query block is the last M positions of the N keys).
    Both bounds are index-only: the kernels skip blocks outside them and never load a mask tensor.
    """

    diagonal: int = 0
    alignment: Literal["top_left", "bottom_right"] = "top_left"
    window: Optional[int] = None

    def offset(self, q_len: int, kv_len: int) -> int:
        return self.diagonal + (kv_len - q_len if self.alignment == "bottom_right" else 0)


@dataclass(frozen=True)
class AttentionSpec:
    dtype: str
    head_dim: Optional[int]  # None: symbolic, taken from q at run time (the kernels are specialized per head dim)
    head_dim_v: Optional[int]
    scale: float  # the scores are (q @ k^T) * scale * head_dim ** scale_head_dim_power
    causal: Optional[CausalMask] = None
    # The scores after ``scale``, as a pointwise program (empty: unchanged); its last node is the new score.
    score_mod: tuple[ScoreNode, ...] = ()
    score_tensors: tuple[ScoreTensor, ...] = ()
    gqa_group: int = 1
    dropout_p: float = 0.0
    # What a row with every score at -inf gives: NaN (``softmax``) or 0 (``_safe_softmax``, SDPA).
    empty_rows: Literal["nan", "zero"] = "nan"
    # Nonzero for a scale written in terms of a symbolic head dim (``q.size(-1) ** -0.5`` under dynamic shapes).
    scale_head_dim_power: float = 0.0
    # Display only (None when symbolic); not part of the kernel key.
    q_len: Optional[int] = None
    kv_len: Optional[int] = None
    num_heads: Optional[int] = None

    def __post_init__(self):
        problems = self.unsupported_reasons()
        if problems:
            raise UnsupportedSpec("; ".join(problems))

    def unsupported_reasons(self) -> list[str]:
        reasons = []
        if self.dtype not in SUPPORTED_DTYPES:
            reasons.append(f"dtype {self.dtype} is not supported (fp16, bf16, fp32 are)")
        for name, dim in (("head dim", self.head_dim), ("value head dim", self.head_dim_v)):
            if dim is not None and not 1 <= dim <= MAX_HEAD_DIM:
                reasons.append(f"{name} {dim} is outside 1..{MAX_HEAD_DIM}")
        if not math.isfinite(self.scale):
            reasons.append(f"scale {self.scale} is not finite")
        if self.gqa_group < 1:
            reasons.append(f"gqa_group {self.gqa_group} < 1")
        if not 0.0 <= self.dropout_p < 1.0:
            reasons.append(f"dropout_p {self.dropout_p} is outside [0, 1)")
        if self.empty_rows not in ("nan", "zero"):
            reasons.append(f"empty_rows {self.empty_rows!r} is neither 'nan' nor 'zero'")
        if self.causal is not None and self.causal.window is not None and self.causal.window < 1:
            reasons.append(f"sliding window {self.causal.window} < 1")
        if self.score_mod:
            try:
                kinds = node_kinds(self.score_mod, self.score_tensors)
            except UnsupportedSpec as e:
                reasons.append(str(e))
            else:
                if kinds[-1] != "float":
                    reasons.append(f"the score program ends in a {kinds[-1]}, not a float score")
        loaded = {n.value for n in self.score_mod if n.op == "load"}
        if loaded != set(range(len(self.score_tensors))):
            reasons.append(f"score tensors {sorted(set(range(len(self.score_tensors))) - loaded)} are not loaded by the program")
        return reasons

    # memoized: the launchers read it for every launch (launch._common, launch._key_range_args)
    @functools.lru_cache(maxsize=1024)
    def key_padding(self) -> Optional[KeyPadding]:
        """A key padding vector of the spec, or None: score tensor ``tensor`` has one row of keys per batch
        (``[Z or 1, 1, 1, N]``) and the score program masks every query's score wherever the tensor's value is
        ``hidden`` ("false" / "true" for a bool mask, "-inf" or "fill" -- at or below the limit -- for a bias). The
        kernels then skip the key blocks outside a per-batch range of keys (``launch._key_range_args``) that never
        changes a row's output or any gradient. Two kinds:

        * kind ``"-inf"``: the score is -inf there, in a spec whose rows with no visible key give 0
          (``empty_rows="zero"``, SDPA's semantics). The range is the first..last visible key: the keys outside have
          probability exactly 0, and a row left with no key is 0 either way. With ``"nan"`` rows, skipping would turn
          eager's NaN of a fully masked row into 0: such specs get the next kind.
        * kind ``"masking"``: the score is at or below :data:`MASKING_FILL_LIMIT` there (an additive ``finfo.min``
          mask, as Hugging Face's eager attention builds it; -inf too), any ``empty_rows``. A hidden key's
          probability is exactly 0 in every row that keeps one visible key, but a row with none is uniform over its
          hidden keys (finfo.min) or NaN (-inf) -- so the range must leave every row that has no visible key all of
          its keys: a batch row with no visible key gets every key; with a causal mask the range starts at key 0 (a
          query before the first visible key keeps the padding it sees) and only the keys after the last visible one
          are skipped; with a sliding window none (a window past the last visible key sees only padding). The
          vector must be all that masks the program (``_masks_only_by``): another mask, or a causal band written
          into the program, could leave a row of a batch with visible keys no visible key of its own.

        A vector with holes keeps them masked inside the range (the range is an optimization, exact for any
        values). Scores are taken to be finite and far above the fill (``-inf + s`` counts as -inf).

        ``band``: where the program (in a spec without ``causal``) also hides every key past a causal band
        ``kv_idx <= q_idx + d`` the same way -- one mask of padding and causality, as Hugging Face and SDPA callers
        build it -- the kernels also skip the key blocks past the band: for every query block with the "-inf" kind;
        with the "masking" kind for the query blocks whose every row keeps a visible key (``first visible key <=
        start + d``; a row with none is uniform over every key, the keys past the band included)."""
        if not self.score_mod:
            return None
        program, root = self.score_mod, len(self.score_mod) - 1
        vectors = [i for i, t in enumerate(self.score_tensors) if t.broadcast[1:] == (True, True, False)]
        bands = {found[0] for found in (_band_of(program, i) for i in range(len(program))) if found is not None}
        band = next(iter(bands)) if len(bands) == 1 and self.causal is None else None

        def band_masking(fill_limit: float) -> Optional[int]:
            return band if band is not None and _masked_when(program, root, _Hidden(None, band=band), fill_limit) else None

        if self.empty_rows == "zero":
            for i in vectors:
                for hidden in (("false", "true") if self.score_tensors[i].role == "mask" else ("-inf",)):
                    if _masked_when(program, root, _Hidden(i, hidden), float("-inf")):
                        return KeyPadding(i, hidden, "-inf", band_masking(float("-inf")))
        if self.causal is None or self.causal.window is None:
            masking_band = band_masking(MASKING_FILL_LIMIT)
            for i in vectors:
                if not _masks_only_by(program, root, i, masking_band):
                    continue
                for hidden in (("false", "true") if self.score_tensors[i].role == "mask" else ("fill",)):
                    if _masked_when(program, root, _Hidden(i, hidden), MASKING_FILL_LIMIT):
                        return KeyPadding(i, hidden, "masking", masking_band)
        return None

    @functools.lru_cache(maxsize=1024)
    def mask_blocks(self) -> Optional[MaskBlocks]:
        """The mask whose values decide, per call, which tiles the kernels skip or visit without the score program,
        or None. It is a mask over query and key positions shared by the heads (``[Z or 1, 1, M, N]``) that ends the
        program -- ``g(s) + mask`` (a bias; it hides at or below :data:`MASKING_FILL_LIMIT`, -inf included; also
        floored, ``maximum(g(s) + mask, c)`` with ``c`` at or below the limit),
        ``where(mask, g(s), fill)`` or ``where(mask, fill, g(s))`` (a bool mask; ``fill`` at or below the limit),
        ``g`` the score or arithmetic that hides nothing itself (``_cannot_mask``: Gemma-2's softcap) -- and nothing
        else masks (no ``causal``). Such a mask arrives as a graph input of unknown values -- built before a
        graph break, e.g. at the blocks that FSDP2's hooks or DDP's buckets cut into graphs of their own -- so
        nothing at compile time says where it hides keys. The launcher summarizes it on the device, once per op
        call (``launch._mask_granules``), and classifies each kernel's tiles from that (``launch._mask_block_args``): "full" where it hides nothing and the program is
        ``g(s)`` (a bias of 0 everywhere, a bool mask all visible), "empty" where it hides every entry and every query
        row of the tile keeps a visible key somewhere (a hidden key's probability is then exactly 0, as for
        :meth:`key_padding`'s "masking" kind; scores are taken to be finite and far above the fill), partial
        otherwise. Empty tiles are skipped, full ones run ``g`` alone (:meth:`unmasked_spec`); the results are those of
        the whole computation. The backward uses it only where the mask needs no gradient (a full tile still has
        one)."""
        program = self.score_mod
        if self.causal is not None or not program:
            return None
        root = program[-1]
        if root.op in ("maximum", "clamp_min"):
            # a floor at or below the limit after the mask, ``maximum(g(s) + mask, finfo.min)`` (as fsmt and
            # grounding-dino clamp): where the mask is 0 it leaves g(s), and what the mask hides stays hidden
            floors = [a for a in root.args if program[a].op == "const" and program[a].value <= MASKING_FILL_LIMIT]
            rest = [a for a in root.args if a not in floors]
            if len(floors) != 1 or len(rest) != 1 or program[rest[0]].op != "add":
                return None
            root = program[rest[0]]
        if root.op == "add":
            loads = [a for a in root.args if program[a].op == "load"]
            if len(loads) != 1:
                return None
            index, role, hidden = program[loads[0]].value, "bias", "fill"
            unmasked = next(a for a in root.args if a != loads[0])
        elif root.op == "where" and program[root.args[0]].op == "load":
            index, role = program[root.args[0]].value, "mask"
            keep, drop = root.args[1:]
            if program[drop].op == "const" and program[drop].value <= MASKING_FILL_LIMIT:
                hidden, unmasked = "false", keep
            elif program[keep].op == "const" and program[keep].value <= MASKING_FILL_LIMIT:
                hidden, unmasked = "true", drop
            else:
                return None
        else:
            return None
        t = self.score_tensors[index]
        if t.role != role or t.broadcast[1:] != (True, False, False) or not _cannot_mask(program, unmasked):
            return None
        return MaskBlocks(index, hidden, unmasked)

    def unmasked_spec(self) -> Optional["AttentionSpec"]:
        """With :meth:`mask_blocks`: this spec with the score program where the mask hides nothing (the subprogram of
        its ``unmasked`` node, no score tensors) -- what a full tile computes. None otherwise."""
        summarized = self.mask_blocks()
        if summarized is None:
            return None
        return dataclasses.replace(self, score_mod=subprogram(self.score_mod, summarized.unmasked), score_tensors=())

    # memoized: the launchers read it for every launch (launch._key_range_args)
    @functools.lru_cache(maxsize=1024)
    def visible_spec(self) -> Optional["AttentionSpec"]:
        """With :meth:`key_padding` (and no :meth:`mask_blocks`): this spec with the score program where the padding
        vector keeps the key -- a bool vector at its visible value, a bias at exactly 0 -- and, with a band, where the
        band keeps it: what a tile computes that lies wholly inside both (``s`` itself for Hugging Face's
        ``s + where(mask | past the band, fill, 0)``), if that reads no score tensor; None otherwise. The kernels run
        it, without loading the vector, on the tiles inside the band and inside the run of visible keys that the
        launcher proves per call (``launch._key_range_args``: no hole in it, a bias exactly 0 there)."""
        padding = self.key_padding()
        if padding is None or self.mask_blocks() is not None:
            return None
        program = self.score_mod
        visible = {"false": True, "true": False}.get(padding.hidden, 0.0)  # a bool mask's keeping value, a bias's 0
        b = ScoreProgramBuilder()
        new: list[int] = []
        for i, node in enumerate(program):
            band = _band_of(program, i) if padding.band is not None else None
            if node.op == "load" and node.value == padding.tensor:
                new.append(b.const(visible))
            elif band is not None and band[0] == padding.band:
                new.append(b.const(band[1]))  # the comparison's value inside the band
            elif node.op == "where" and b.nodes[new[node.args[0]]].op == "const":
                new.append(new[node.args[1]] if b.nodes[new[node.args[0]]].value else new[node.args[2]])
            elif node.op in LEAF_OPS:
                new.append(b.add(node.op, value=node.value))
            else:
                new.append(b.add_folded(node.op, *(new[a] for a in node.args)))
        folded = b.program(new[-1])
        if any(node.op == "load" for node in folded):
            return None
        return dataclasses.replace(self, score_mod=folded, score_tensors=())

    def scale_for(self, head_dim: int) -> float:
        """The score scale for q's actual head dim."""
        return self.scale * head_dim**self.scale_head_dim_power if self.scale_head_dim_power else self.scale

    # ---- keys and serialization -------------------------------------------------------------------------
    def kernel_key(self) -> "AttentionSpec":
        """The spec without the fields its kernels take as launch arguments (head dims, scale) or not at all (the
        display-only lengths and heads): two specs with the same kernel key share kernels and tuned configs. So the
        graph compiled with ``dynamic=True`` (symbolic head dim, scale ``D ** -0.5``) and the one compiled per shape
        (head dim 64, scale 0.125) run the same kernels with the same configs."""
        return dataclasses.replace(self, head_dim=None, head_dim_v=None, scale=1.0, scale_head_dim_power=0.0,
                                   q_len=None, kv_len=None, num_heads=None)

    def to_json(self) -> str:
        """The spec as the ops take it. Made once an instance (the instance is frozen): ``dataclasses.asdict`` copies
        every field, ~60 us a call on a CPU, which an eager call of an op paid each time."""
        text = self.__dict__.get("_json")
        if text is None:
            text = json.dumps(dataclasses.asdict(self), sort_keys=True)
            object.__setattr__(self, "_json", text)
        return text

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.kernel_key().to_json().encode()).hexdigest()[:16]

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def from_json(text: str) -> "AttentionSpec":
        raw = json.loads(text)
        raw["causal"] = CausalMask(**raw["causal"]) if raw["causal"] else None
        raw["score_mod"] = tuple(ScoreNode(n["op"], tuple(n["args"]), n["value"]) for n in raw["score_mod"])
        raw["score_tensors"] = tuple(
            ScoreTensor(role=t["role"], dtype=t["dtype"], broadcast=tuple(t["broadcast"])) for t in raw["score_tensors"]
        )
        return AttentionSpec(**raw)

    def describe(self) -> str:
        """One line for logs and dump_graph."""
        dims = [("?" if d is None else str(d)) for d in (self.head_dim, self.head_dim_v)]
        parts = [f"{self.dtype}", f"D={dims[0]}" + (f"/Dv={dims[1]}" if dims[1] != dims[0] else "")]
        if self.q_len is not None or self.kv_len is not None:
            parts.append(f"M={self.q_len if self.q_len is not None else '?'} N={self.kv_len if self.kv_len is not None else '?'}")
        power = f"*D^{self.scale_head_dim_power:.6g}" if self.scale_head_dim_power else ""
        parts.append(f"scale={self.scale:.6g}{power}")
        if self.causal:
            window = f", window={self.causal.window}" if self.causal.window is not None else ""
            parts.append(f"causal({self.causal.alignment}, diagonal={self.causal.diagonal}{window})")
        if self.score_mod:
            parts.append(f"s -> {program_text(self.score_mod, self.score_tensors)}")
        if self.gqa_group > 1:
            parts.append(f"gqa={self.gqa_group}")
        if self.dropout_p:
            parts.append(f"dropout={self.dropout_p:.6g}")
        if self.empty_rows == "zero":
            parts.append("empty rows 0")
        padding = self.key_padding()
        if padding is not None:
            band = "" if padding.band is None else " and past the causal band"
            parts.append(f"padded keys{band} skipped ({self.score_tensors[padding.tensor].role}{padding.tensor})")
        summarized = self.mask_blocks()
        if summarized is not None:
            parts.append(f"tiles classified per call ({self.score_tensors[summarized.tensor].role}{summarized.tensor})")
        return " ".join(parts)


def _cannot_mask(program: tuple[ScoreNode, ...], index: int) -> bool:
    """Whether node ``index`` is arithmetic of the score, indices and constants above the fill limit: it reads no
    tensor and holds no comparison, ``where`` or masking constant, so (scores being finite and far above the fill) it
    hides no key itself -- the mask added to it, or choosing it, does all the hiding."""
    node = program[index]
    if node.op in ("load", "where", "logical_not", "logical_and", "logical_or") or node.op in COMPARISON_OPS:
        return False
    if node.op == "const":
        number = isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
        return number and node.value > MASKING_FILL_LIMIT
    return all(_cannot_mask(program, a) for a in node.args)


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


def _masked_when(program: tuple[ScoreNode, ...], index: int, where: _Hidden, fill_limit: float) -> bool:
    """Whether node ``index`` of ``program`` is at or below ``fill_limit`` (-inf: exactly -inf) wherever ``where``
    hides a key (score tensor ``where.tensor`` at its hidden value -- "false" / "true" for a bool mask, "-inf" or
    "fill" for a bias at -inf or at or below the limit -- or the causal band), whatever the finite score: see
    :meth:`AttentionSpec.key_padding`."""
    node = program[index]
    if node.op == "const":
        return node.value <= fill_limit
    if node.op == "load":
        return where.tensor is not None and node.value == where.tensor and where.hidden in ("-inf", "fill")
    if node.op == "to_float":
        return _masked_when(program, node.args[0], where, fill_limit)
    if node.op == "where":
        cond, a, b = node.args
        if _bool_when(program, cond, where, True):
            return _masked_when(program, a, where, fill_limit)
        if _bool_when(program, cond, where, False):
            return _masked_when(program, b, where, fill_limit)
        return all(_masked_when(program, x, where, fill_limit) for x in (a, b))
    if node.op in ("add", "minimum"):
        return any(_masked_when(program, a, where, fill_limit) for a in node.args)
    if node.op == "sub":
        return _masked_when(program, node.args[0], where, fill_limit)
    return False


def _masks_only_by(program: tuple[ScoreNode, ...], index: int, tensor: int, band: Optional[int] = None) -> bool:
    """Whether node ``index`` of ``program`` can be masked (at or below MASKING_FILL_LIMIT) only through score tensor
    ``tensor`` (and the causal band of diagonal ``band``, if given): it reads no other tensor and no other query or key
    index, and a masking constant appears only as a branch of a ``where`` (whose condition then reads those alone)."""
    node = program[index]
    if node.op == "score":
        return True
    if node.op == "load":
        return node.value == tensor
    if node.op == "const":
        return node.value > MASKING_FILL_LIMIT
    if node.op in ("lt", "le", "gt", "ge"):
        found = _band_of(program, index)
        return band is not None and found is not None and found[0] == band
    if node.op in ("to_float", "logical_not", "add", "logical_and", "logical_or"):
        return all(_masks_only_by(program, a, tensor, band) for a in node.args)
    if node.op == "where":
        cond, a, b = node.args
        return _masks_only_by(program, cond, tensor, band) and all(
            program[x].op == "const" or _masks_only_by(program, x, tensor, band) for x in (a, b))
    return False


def _bool_when(program: tuple[ScoreNode, ...], index: int, where: _Hidden, result: bool) -> bool:
    """Whether bool node ``index`` is ``result`` wherever ``where`` hides a key (a bool mask's hidden value, or the
    keys past the causal band)."""
    node = program[index]
    if node.op == "load":
        return where.tensor is not None and node.value == where.tensor and where.hidden == ("true" if result else "false")
    if node.op == "logical_not":
        return _bool_when(program, node.args[0], where, not result)
    if node.op in ("logical_and", "logical_or"):
        # and: False if any operand is, True if all are; or: the other way round
        decides = (node.op == "logical_and") != result
        operands = (_bool_when(program, a, where, result) for a in node.args)
        return any(operands) if decides else all(operands)
    if where.tensor is None and node.op in ("lt", "le", "gt", "ge"):
        found = _band_of(program, index)
        return found is not None and found[0] == where.band and found[1] != result
    return False


def _band_of(program: tuple[ScoreNode, ...], index: int) -> Optional[tuple[int, bool]]:
    """(d, visible) for a comparison node of the key and query indices that is ``visible`` exactly inside the causal
    band ``kv_idx <= q_idx + d`` (``kv_idx <= q_idx``, ``q_idx + 1 > kv_idx``, ``kv_idx > q_idx`` -- outside --,
    ``kv_idx + a <= q_idx + b`` as context parallelism's global positions write it, ...); None for any other node."""
    node = program[index]
    if node.op not in ("lt", "le", "gt", "ge"):
        return None
    left, right = node.args
    op = node.op
    if _index_offset(program, right, "kv_idx") is not None:  # written key-last: mirror it to key-first
        left, right = right, left
        op = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}[op]
    key, query = _index_offset(program, left, "kv_idx"), _index_offset(program, right, "q_idx")
    if key is None or query is None:
        return None
    offset = query - key
    # kv <= q + c and kv < q + c + 1 are the band d = c; kv > q + c and kv >= q + c + 1 are its outside
    return {"le": (offset, True), "lt": (offset - 1, True), "gt": (offset, False), "ge": (offset - 1, False)}[op]


def _index_offset(program: tuple[ScoreNode, ...], index: int, leaf: str) -> Optional[int]:
    """c for a node that is ``leaf + c`` (``leaf``, ``leaf + c``, ``c + leaf``, ``leaf - c``; leaf ``q_idx`` or
    ``kv_idx``) with an int c."""
    node = program[index]
    if node.op == leaf:
        return 0
    if node.op in ("add", "sub") and len(node.args) == 2:
        a, b = (program[i] for i in node.args)
        if node.op == "add" and b.op == leaf:
            a, b = b, a
        if a.op == leaf and b.op == "const" and type(b.value) is int:
            return b.value if node.op == "add" else -b.value
    return None


def _broadcast_text(broadcast: tuple[bool, bool, bool, bool]) -> str:
    return ",".join("1" if b else name for b, name in zip(broadcast, "ZHMN"))


def dtype_name(dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: how specs and reports name a dtype."""
    return str(dtype).replace("torch.", "")


class UnsupportedSpec(ValueError):
    """Raised for a spec or inputs the kernels cannot run; the backend turns it into 'not rewritten: ...'."""
