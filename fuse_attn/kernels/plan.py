"""What the kernels plan for a spec beyond its math: which keys a padding vector lets them skip
(:func:`key_padding`), which mask's tiles they classify per call (:func:`mask_blocks`), and the smaller specs they
run on tiles a mask leaves whole (:func:`unmasked_spec`, :func:`visible_spec`). Pure functions of the spec, memoized:
the launchers ask on every launch."""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Optional

import torch

from fuse_attn.score_program import (COMPARISON_OPS, LEAF_OPS, MASKING_FILL_LIMIT, ScoreNode, ScoreProgramBuilder,
                                     node_kinds, subprogram)
from fuse_attn.spec import AttentionSpec


class KeyPadding(NamedTuple):
    """A key padding vector of a spec (:func:`key_padding`)."""

    tensor: int  # the score tensor holding it
    hidden: str  # the value that hides a key: "false" / "true" (a bool mask), "-inf" or "fill" (a bias)
    kind: str  # "-inf" (hidden scores are -inf, rows of no key give 0) or "masking" (at or below the limit)
    # d of a causal band ``kv_idx <= q_idx + d`` written into the score program that hides the keys past it the same
    # way (Hugging Face's padding + causal masks are one mask), or None
    band: Optional[int] = None


class MaskBlocks(NamedTuple):
    """A mask whose tiles are classified per call (:func:`mask_blocks`)."""

    tensor: Optional[int]  # the score tensor holding it (None: the mask is ``predicate``)
    hidden: str  # where it hides a score: "fill" (a bias at or below the fill limit), "false" / "true" (a bool mask)
    unmasked: int  # the program node that is the result where the mask hides nothing (the score itself for s + mask)
    # the program node of a bool predicate of integer vectors that is the mask (packed documents' ids), or None
    predicate: Optional[int] = None


# The ops a predicate of integer vectors may use (:func:`_is_predicate`): those whose bounds over a granule of keys
# ``score_program_eval.IntervalOps`` computes.
PREDICATE_OPS = COMPARISON_OPS + ("logical_and", "logical_or", "logical_not", "add", "sub", "neg", "maximum",
                                  "minimum", "where")


class _Hidden(NamedTuple):
    """Where keys are hidden: by score tensor ``tensor`` where its value is ``hidden`` (see :class:`KeyPadding`), or
    -- ``tensor`` None -- past the causal band ``kv_idx <= q_idx + band``."""

    tensor: Optional[int]
    hidden: str = ""
    band: int = 0


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


def _masked_when(program: tuple[ScoreNode, ...], index: int, where: _Hidden, fill_limit: float) -> bool:
    """Whether node ``index`` of ``program`` is at or below ``fill_limit`` (-inf: exactly -inf) wherever ``where``
    hides a key (score tensor ``where.tensor`` at its hidden value -- "false" / "true" for a bool mask, "-inf" or
    "fill" for a bias at -inf or at or below the limit -- or the causal band), whatever the finite score: see
    :func:`key_padding`."""
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


# memoized: the launchers read it for every launch (launch.common_kernel_args, launch.key_range_args)
@functools.lru_cache(maxsize=1024)
def key_padding(spec: AttentionSpec) -> Optional[KeyPadding]:
    """A key padding vector of the spec, or None: score tensor ``tensor``, a bool mask or a bias, holds one row of
    keys per batch (``[Z or 1, 1, 1, N]``) and the program masks every query's score wherever it is ``hidden``
    ("false" / "true" for a bool mask, "-inf" or "fill" -- at or below :data:`MASKING_FILL_LIMIT` -- for a bias). The
    kernels then skip the key blocks outside a per-batch range of keys (``launch.key_range_args``), which changes no
    output or gradient:

    * kind ``"-inf"`` (hidden scores are -inf, ``empty_rows="zero"``): the range is the first..last visible key; the
      keys outside it have probability exactly 0, and a row left with no key is 0 either way. (Under
      ``empty_rows="nan"`` skipping would turn eager's NaN of a fully masked row into 0: such specs get the next kind.)
    * kind ``"masking"`` (hidden scores at or below the limit, -inf too; any ``empty_rows``): a row with no visible
      key is uniform over its hidden keys (finfo.min) or NaN (-inf), so the range leaves every such row all its keys:
      every key for a batch row with none visible, and from key 0 under a causal mask (never with a sliding window,
      where a window past the last visible key sees only padding). The vector must be all that masks the program
      (``_masks_only_by``): another mask could leave a row of a batch with visible keys no visible key of its own.

    Holes inside the range stay masked by the program. Scores are taken to be finite and far above the fill
    (``-inf + s`` counts as -inf). ``band``: d where the program (in a spec without ``causal``) also hides the keys
    past a causal band ``kv_idx <= q_idx + d`` the same way (one mask of padding and causality, as Hugging Face and
    SDPA callers build it); the kernels then also skip the key blocks past the band -- for every query block with
    the "-inf" kind, for the blocks whose every row keeps a visible key with the "masking" kind."""
    if not spec.score_program:
        return None
    program, root = spec.score_program, len(spec.score_program) - 1
    vectors = [i for i, t in enumerate(spec.score_tensors)
               if t.broadcast[1:] == (True, True, False) and t.role != "int"]
    bands = {found[0] for found in (_band_of(program, i) for i in range(len(program))) if found is not None}
    band = next(iter(bands)) if len(bands) == 1 and spec.causal is None else None

    def band_masking(fill_limit: float) -> Optional[int]:
        return band if band is not None and _masked_when(program, root, _Hidden(None, band=band), fill_limit) else None

    if spec.empty_rows == "zero":
        for i in vectors:
            for hidden in (("false", "true") if spec.score_tensors[i].role == "mask" else ("-inf",)):
                if _masked_when(program, root, _Hidden(i, hidden), float("-inf")):
                    return KeyPadding(i, hidden, "-inf", band_masking(float("-inf")))
    if spec.causal is None or spec.causal.window is None:
        masking_band = band_masking(MASKING_FILL_LIMIT)
        for i in vectors:
            if not _masks_only_by(program, root, i, masking_band):
                continue
            for hidden in (("false", "true") if spec.score_tensors[i].role == "mask" else ("fill",)):
                if _masked_when(program, root, _Hidden(i, hidden), MASKING_FILL_LIMIT):
                    return KeyPadding(i, hidden, "masking", masking_band)
    return None


@functools.lru_cache(maxsize=1024)
def mask_blocks(spec: AttentionSpec) -> Optional[MaskBlocks]:
    """The mask whose values decide, per call, which tiles the kernels skip or visit without the score program,
    or None. It is a mask over query and key positions shared by the heads (``[Z or 1, 1, M, N]``) that ends the
    program -- ``g(s) + mask`` (a bias; it hides at or below :data:`MASKING_FILL_LIMIT`, -inf included; also
    floored, ``maximum(g(s) + mask, c)`` with ``c`` at or below the limit),
    ``where(mask, g(s), fill)`` or ``where(mask, fill, g(s))`` (a bool mask; ``fill`` at or below the limit),
    ``g`` the score or arithmetic that hides nothing itself (``_cannot_mask``: Gemma-2's softcap) -- and nothing
    else masks (no ``causal``). Such a mask arrives as a graph input of unknown values -- built before a
    graph break, e.g. at the blocks that FSDP2's hooks or DDP's buckets cut into graphs of their own -- so
    nothing at compile time says where it hides keys. The launcher summarizes it on the device, once per op
    call (``launch.mask_granules``), and classifies each kernel's tiles from that (``launch.mask_block_args``): "full" where it hides nothing and the program is
    ``g(s)`` (a bias of 0 everywhere, a bool mask all visible), "empty" where it hides every entry and every query
    row of the tile keeps a visible key somewhere (a hidden key's probability is then exactly 0, as for
    :func:`key_padding`'s "masking" kind; scores are taken to be finite and far above the fill), partial
    otherwise. Empty tiles are skipped, full ones run ``g`` alone (:func:`unmasked_spec`); the results are those of
    the whole computation. The backward uses it only where the mask needs no gradient (a full tile still has
    one).

    The mask may also be a ``predicate`` of integer vectors (:func:`_is_predicate`; ``tensor`` None): packed
    documents' ``ids_q == ids_k`` and ``pos_k <= pos_q``, in ``where(predicate, g(s), fill)``, ``where(predicate,
    fill, g(s))`` or ``g(s) + where(predicate, 0, fill)``. No N x N tensor exists then: one generated kernel
    (``launch.predicate_block_args``) bounds the predicate over each tile from the vectors' values at its query rows
    and their ranges over its keys: a tile is full or empty where those bounds prove it, partial otherwise."""
    program = spec.score_program
    if spec.causal is not None or not program:
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
            # ``g(s) + where(predicate, 0, fill)``: Hugging Face's eager form of a mask of packed documents
            fills = [(a, _chosen_fill(program, a, 0.0)) for a in root.args if program[a].op == "where"]
            chosen = [(a, fill) for a, fill in fills if fill is not None]
            if len(chosen) != 1:
                return None
            (masking, (hidden, _)), = chosen
            unmasked = next(a for a in root.args if a != masking)
            return _predicate_blocks(spec, program[masking].args[0], hidden, unmasked)
        index, role, hidden = program[loads[0]].value, "bias", "fill"
        unmasked = next(a for a in root.args if a != loads[0])
    elif root.op == "where" and (chosen := _chosen_fill(program, len(program) - 1)) is not None:
        hidden, unmasked = chosen
        cond = root.args[0]
        if program[cond].op != "load":
            return _predicate_blocks(spec, cond, hidden, unmasked)
        index, role = program[cond].value, "mask"
    else:
        return None
    t = spec.score_tensors[index]
    if t.role != role or t.broadcast[1:] != (True, False, False) or not _cannot_mask(program, unmasked):
        return None
    return MaskBlocks(index, hidden, unmasked)


def _chosen_fill(program: tuple[ScoreNode, ...], index: int, other: Optional[float] = None) -> Optional[tuple[str, int]]:
    """For ``where(c, a, b)`` with one branch a constant at or below :data:`MASKING_FILL_LIMIT`: ("false", a) when
    b is that fill (c false hides), ("true", b) when a is; the other branch must be the constant ``other`` where
    given. None otherwise."""
    _, keep, drop = program[index].args

    def number(i):
        return program[i].value if program[i].op == "const" and not isinstance(program[i].value, bool) else None

    def is_fill(i):
        return number(i) is not None and number(i) <= MASKING_FILL_LIMIT

    def is_other(i):
        return other is None or number(i) == other

    if is_fill(drop) and is_other(keep):
        return "false", keep
    if is_fill(keep) and is_other(drop):
        return "true", drop
    return None


def _predicate_blocks(spec: AttentionSpec, predicate: int, hidden: str, unmasked: int) -> Optional[MaskBlocks]:
    """The mask blocks of a predicate masking ``unmasked`` (``hidden`` as :class:`MaskBlocks` says), if it is one."""
    program = spec.score_program
    if not _is_predicate(program, predicate, spec.score_tensors) or not _cannot_mask(program, unmasked):
        return None
    return MaskBlocks(None, hidden, unmasked, predicate)


def _is_predicate(program: tuple[ScoreNode, ...], index: int, tensors) -> bool:
    """Whether bool node ``index`` is computed from integer vectors the heads share (each read per query row, per key
    column or once), the query and key indices and constants alone, through :data:`PREDICATE_OPS`, reading at least
    one vector: a mask the launcher classifies per call from the vectors' bounds over each granule of keys
    (``launch.predicate_block_args``), never reading an N x N tensor."""
    nodes = subprogram(program, index)
    kinds = node_kinds(nodes, tuple(tensors))
    if kinds[-1] != "bool" or "float" in kinds:
        return False
    loads = [tensors[node.value] for node in nodes if node.op == "load"]
    if not loads or any(t.role != "int" or not t.broadcast[1] or not (t.broadcast[2] or t.broadcast[3]) for t in loads):
        return False
    return all(node.op in PREDICATE_OPS or node.op in ("const", "load", "q_idx", "kv_idx") for node in nodes)


def vector_axis(tensor) -> Optional[str]:
    """The axis along which a predicate's integer vector (a :class:`ScoreTensor` of :func:`predicate_loads`, never
    along both) holds its values: "m" (a value per query row), "n" (per key), or None (one value a batch row)."""
    return "m" if not tensor.broadcast[2] else "n" if not tensor.broadcast[3] else None


# memoized: the launchers read it for every launch of a predicate's tile classes (launch.predicate_block_args)
@functools.lru_cache(maxsize=1024)
def predicate_loads(spec: AttentionSpec) -> tuple[int, ...]:
    """The score tensors :func:`mask_blocks`' predicate reads, ascending (a spec with a predicate of integer vectors)."""
    return tuple(sorted({node.value for node in subprogram(spec.score_program, mask_blocks(spec).predicate)
                         if node.op == "load"}))


def unmasked_spec(spec: AttentionSpec) -> Optional[AttentionSpec]:
    """With :func:`mask_blocks`: this spec with the score program where the mask hides nothing (the subprogram of
    its ``unmasked`` node, no score tensors) -- what a full tile computes. None otherwise."""
    summarized = mask_blocks(spec)
    if summarized is None:
        return None
    return dataclasses.replace(spec, score_program=subprogram(spec.score_program, summarized.unmasked), score_tensors=())


# memoized: the launchers read it for every launch (launch.key_range_args)
@functools.lru_cache(maxsize=1024)
def visible_spec(spec: AttentionSpec) -> Optional[AttentionSpec]:
    """With :func:`key_padding` (and no :func:`mask_blocks`): this spec with the score program where the padding
    vector keeps the key -- a bool vector at its visible value, a bias at exactly 0 -- and, with a band, where the
    band keeps it: what a tile computes that lies wholly inside both (``s`` itself for Hugging Face's
    ``s + where(mask | past the band, fill, 0)``), if that reads no score tensor; None otherwise. The kernels run
    it, without loading the vector, on the tiles inside the band and inside the run of visible keys that the
    launcher proves per call (``launch.key_range_args``: no hole in it, a bias exactly 0 there)."""
    padding = key_padding(spec)
    if padding is None or mask_blocks(spec) is not None:
        return None
    program = spec.score_program
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
    return dataclasses.replace(spec, score_program=folded, score_tensors=())


def size_hint(x) -> int:
    """An int for a size that may be symbolic: its hint (the example value Dynamo traced with), adding no guard --
    for choices that change speed, never results (launch configs, split counts, a layout copy)."""
    if isinstance(x, torch.SymInt):
        from torch.fx.experimental import symbolic_shapes

        # torch 2.13 names it optimization_hint, torch 2.11 hint_int (neither adds a guard)
        no_guard_hint = getattr(symbolic_shapes, "optimization_hint", None) or symbolic_shapes.hint_int
        return no_guard_hint(x)
    return int(x)


def describe(spec: AttentionSpec) -> str:
    """:meth:`AttentionSpec.describe` and what the kernels plan for it (skipped padded keys, tiles classified per
    call): the line for logs and dump_graph."""
    parts = [spec.describe()]
    padding = key_padding(spec)
    if padding is not None:
        band = "" if padding.band is None else " and past the causal band"
        parts.append(f"padded keys{band} skipped ({spec.score_tensors[padding.tensor].role}{padding.tensor})")
    summarized = mask_blocks(spec)
    if summarized is not None:
        read = [summarized.tensor] if summarized.predicate is None else predicate_loads(spec)
        parts.append(f"tiles classified per call ({', '.join(f'{spec.score_tensors[i].role}{i}' for i in read)})")
    return " ".join(parts)
