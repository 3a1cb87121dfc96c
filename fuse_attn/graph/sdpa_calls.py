"""``scaled_dot_product_attention`` calls as attentions the matcher can read.

In the pre-autograd ATen graph an ``F.scaled_dot_product_attention`` call is one
``aten.scaled_dot_product_attention`` node (its flash / efficient / cuDNN variants appear only after dispatch, below
the graphs we rewrite). Before matching, each call is *expanded* next to itself into the math it computes, spelled
with the ops the matcher already reads::

    k, v = repeat_interleave(k, g, -3), repeat_interleave(v, g, -3)    # enable_gqa, H_q = g * H_kv
    s = (q @ k^T) * scale                                              # scale=None: q.size(-1) ** -0.5
    s = masked_fill(s, ~(j <= i), -inf)                                # is_causal (top-left, from aranges)
    s = masked_fill(s, ~attn_mask, -inf)  |  s + attn_mask             # a bool / an additive mask
    p = _safe_softmax(s, -1)                                           # SDPA's: a row with no key gives 0
    p = dropout(p, dropout_p, train=True)                              # dropout_p > 0
    out = p @ v                                                        # laid out in memory as the call's output

so the mask is traced back to how the graph built it (padding vectors, causal and sliding-window bands) exactly as
for an attention the model writes out, and ``_safe_softmax`` makes the spec's ``empty_rows`` "zero". The users of
the call read the expansion while the matcher runs; the call itself stays in the graph, and :func:`settle` keeps
the expansion where the matcher fused it and puts the call back everywhere else, so an SDPA call that is not fused
still runs SDPA's own kernels.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import guard_bool, guard_int

from fuse_attn.graph.nodes import NotFused, aten, erase_dead_nodes, laid_out_as, val

SDPA_OPS = {aten.scaled_dot_product_attention.default}
# SDPA's parameters after q, k, v, with its defaults (torch/nn/functional.py; aten's schema has the same order).
_PARAMETERS = (("attn_mask", None), ("dropout_p", 0.0), ("is_causal", False), ("scale", None), ("enable_gqa", False))


@dataclass
class Expansion:
    call: fx.Node  # the SDPA node, kept in the graph (without users while the expansion stands in for it)
    softmax: fx.Node  # the expansion's _safe_softmax: what the matcher anchors on
    product: fx.Node  # the expansion's P @ V: what a fused attention replaces
    output: fx.Node  # what the call's users read: the product, laid out as the call's output
    nodes: list[fx.Node]  # every node of the expansion, in graph order


def find_calls(graph: fx.Graph) -> list[fx.Node]:
    return [n for n in graph.nodes if n.op == "call_function" and n.target in SDPA_OPS]


def arguments(call: fx.Node) -> dict:
    """The call's arguments by name, defaults filled in."""
    named = dict(zip(("query", "key", "value"), call.args[:3]))
    for (name, default), given in zip(_PARAMETERS, list(call.args[3:]) + [None] * len(_PARAMETERS)):
        named[name] = call.kwargs.get(name, given if given is not None else default)
    return named


def expand(call: fx.Node, emit: Callable[..., fx.Node]) -> Expansion:
    """Insert the expansion of ``call`` (through ``emit(target, *args)``, which inserts before ``call`` and fills
    ``meta['val']``) and point the call's users at it. Raises NotFused, inserting nothing, for an argument the
    expansion cannot carry."""
    a = arguments(call)
    _check(call, a)
    qv = val(a["query"])
    inserted: list[fx.Node] = []

    def op(target, *args, **kwargs):
        node = emit(target, *args, **kwargs)
        node.meta["stack_trace"] = call.meta.get("stack_trace")
        inserted.append(node)
        return node

    try:
        softmax, product = _emit_math(a, qv, op)
        out = laid_out_as(op, product, call)
    except Exception as e:  # a bug of ours must cost the fusion, never the user's model
        for node in reversed(inserted):
            call.graph.erase_node(node)
        raise NotFused(f"{call.name}: internal error while expanding the call: {type(e).__name__}: {e}", call) from e
    call.replace_all_uses_with(out)
    return Expansion(call, softmax, product, out, inserted)


def _emit_math(a: dict, qv, op) -> tuple[fx.Node, fx.Node]:
    """The expansion's nodes (see the module doc); returns its softmax and its output."""
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    rank = qv.dim()
    if a["gqa_group"] > 1:
        k = op(aten.repeat_interleave.self_int, k, a["gqa_group"], -3)
        v = op(aten.repeat_interleave.self_int, v, a["gqa_group"], -3)
    s = op(aten.matmul.default, q, op(aten.transpose.int, k, -2, -1))
    if a["scale"] is None:
        head_dim = qv.shape[-1]
        if isinstance(head_dim, int):
            s = op(aten.mul.Tensor, s, head_dim ** -0.5)
        else:
            s = op(aten.mul.Tensor, s, op(operator.pow, op(aten.sym_size.int, q, rank - 1), -0.5))
    else:
        s = op(aten.mul.Tensor, s, float(a["scale"]))
    if a["is_causal"]:
        def length(node, dim):  # a static length as it is, a symbolic one read off its tensor in the graph
            size = val(node).shape[dim]
            return size if isinstance(size, int) else op(aten.sym_size.int, node, dim)

        rows = op(aten.unsqueeze.default, op(aten.arange.default, length(q, rank - 2), device=qv.device), -1)
        cols = op(aten.arange.default, length(k, val(k).dim() - 2), device=qv.device)
        s = op(aten.masked_fill.Scalar, s, op(aten.logical_not.default, op(aten.le.Tensor, cols, rows)), -math.inf)
    if mask is not None:
        if val(mask).dtype == torch.bool:
            s = op(aten.masked_fill.Scalar, s, op(aten.logical_not.default, mask), -math.inf)
        else:
            s = op(aten.add.Tensor, s, mask)
    softmax = op(aten._safe_softmax.default, s, -1)
    p = softmax
    if a["dropout_p"] > 0:
        p = op(aten.dropout.default, p, float(a["dropout_p"]), True)
    return softmax, op(aten.matmul.default, p, v)


def _check(call: fx.Node, a: dict) -> None:
    """NotFused for a call the expansion would not compute exactly (SDPA validates the rest when it runs); sets
    ``a["gqa_group"]``, the query heads per key head."""
    name = call.name
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    fakes = [val(x) for x in (q, k, v)]
    if not all(isinstance(t, torch.Tensor) for t in fakes):
        raise NotFused(f"{name}: q, k or v is not a tensor", call)
    if any(t.is_nested or t.layout != torch.strided for t in fakes):
        raise NotFused(f"{name}: q, k or v is a nested or non-strided tensor", call)
    if any(t.dim() < 2 for t in fakes):
        raise NotFused(f"{name}: q, k or v has fewer than 2 dims", call)
    if len({t.dtype for t in fakes}) != 1:
        raise NotFused(f"{name}: q, k and v have different dtypes", call)
    scale = a["scale"]
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise NotFused(f"{name}: scale {scale!r} is not a Python number", call)
    p = a["dropout_p"]
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
        raise NotFused(f"{name}: dropout_p {p!r} is not a Python number in [0, 1)", call)
    if not isinstance(a["is_causal"], bool) or not isinstance(a["enable_gqa"], bool):
        raise NotFused(f"{name}: is_causal or enable_gqa is not a Python bool", call)
    if a["is_causal"] and mask is not None:
        raise NotFused(f"{name}: both attn_mask and is_causal are set (SDPA rejects that)", call)
    a["gqa_group"] = 1
    if a["enable_gqa"] and fakes[0].dim() >= 3 and fakes[1].dim() >= 3:
        # The group is a kernel constant: symbolic head counts (dynamic=True) are specialized to this call's ratio
        # by a guard, so another ratio recompiles (SDPA itself raises for heads that are not a multiple).
        hq, hkv = fakes[0].shape[-3], fakes[1].shape[-3]
        if not guard_bool(hq % hkv == 0):
            raise NotFused(f"{name}: enable_gqa with {hq} query heads, not a multiple of the {hkv} key heads", call)
        a["gqa_group"] = guard_int(hq // hkv)
    if mask is not None:
        m = val(mask)
        if not isinstance(m, torch.Tensor):
            raise NotFused(f"{name}: attn_mask is not a tensor", call)
        if m.dtype != torch.bool and m.dtype != fakes[0].dtype:
            raise NotFused(f"{name}: attn_mask of dtype {m.dtype} with q of {fakes[0].dtype} (SDPA takes bool or q's dtype)", call)


def settle(expansion: Expansion, fused: bool, graph: fx.Graph) -> None:
    """After matching: the call's users keep the fused expansion (and the call goes, with what only it read: a mask
    the fused program computes from smaller tensors), or get the call back (and the expansion goes)."""
    if fused:
        inputs = expansion.call.all_input_nodes
        graph.erase_node(expansion.call)
        erase_dead_nodes(graph, inputs)
        return
    if not getattr(expansion.output, "_erased", False):
        expansion.output.replace_all_uses_with(expansion.call)
    for node in reversed(expansion.nodes):
        if not getattr(node, "_erased", False) and not node.users:
            graph.erase_node(node)
