"""Softmaxes spelled out, rewritten into the softmax the matcher reads before it runs. In the pre-autograd ATen graph,
over the last dim (reductions kept as ``[..., M, 1]``):

* ``exp(s - max(s)) / sum(exp(s - max(s)))``, or without the shift (``max``: ``amax`` or ``.max(...).values``):
  the softmax of ``s``;
* ``exp(s - m) / (sum(exp(s - m)) + exp(sink - m))``, ``m`` any column (the row max, or its max with the sink) or
  none, ``sink`` a column of logits: an attention sink joined to the denominator (the value is the same for every
  ``m``: exp(s) / (sum(exp(s)) + exp(sink)));
* ``exp(s - L)`` with ``L = logsumexp(s)``, and ``exp(log_softmax(s))``: the softmax of ``s``;
* ``exp(s - L)`` with ``L = logsumexp(cat([s, sink], -1))`` or ``L = logaddexp(logsumexp(s), sink)``, ``sink`` a
  column of logits (``[..., M, 1]`` after broadcasting): an attention sink, the weights over the keys of the softmax
  over the keys and the sink -- rewritten as gpt-oss spells it, ``softmax(cat([s, sink], -1))[..., :-1]``, which
  :func:`fuse_attn.graph.matching.attention_sink` reads.

The values are the softmax's by its definition, but where a spelling over- or underflows and the softmax does not
(``exp(s) / sum(exp(s))`` without the shift: inf / inf where a score passes ~88 in fp32), and where a score is
``+inf``: there the softmax's row is NaN, where ``exp(s - L)`` is NaN at that key and 0 at the others -- and
``P @ V`` makes that output row NaN either way. Only spellings whose weights reach a matrix product (``P @ V``:
:func:`fuse_attn.graph.matching.weights_meet_a_product`) are rewritten; the rewrite keeps the weights' source line
for the verdict. A sink joined by ``logaddexp`` to scores of symbolic sizes is broadcast to their rows with the sizes
of their product's query operand, and left as written where that operand does not have them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.fx as fx

from fuse_attn.graph.matching import row_max_shift, weights_meet_a_product
from fuse_attn.graph.nodes import (CONTRACTION_OPS, aten, erase_dead_nodes, logsumexp_over_keys, same_shape,
                                  target_of, val)


@dataclass
class Spelling:
    weights: fx.Node  # exp(s - L) or exp(s) / sum(exp(s)): what the softmax replaces
    scores: fx.Node  # s
    sink: Optional[fx.Node]  # the sink column, [..., M, 1] (None: a plain softmax)
    joined: Optional[fx.Node]  # cat([s, sink], -1) where the graph joins them itself
    # where the column is joined here: a tensor of the scores' sizes but the last, none of the scores (their
    # product's query operand), whose symbolic sizes the column's broadcast reads (a size read from the scores would
    # be one more use of them, which the matcher refuses)
    rows: Optional[fx.Node] = None


def _query_operand(scores: fx.Node, budget: int = 32) -> Optional[fx.Node]:
    """The first operand of the matrix product the scores come from, through ops that keep their shape (a scale, a
    mask added), where its sizes but the last are the scores' (so ``q`` of ``q @ k^T``); else None."""
    node = scores
    while budget > 0:
        budget -= 1
        if target_of(node) in CONTRACTION_OPS:
            q = node.args[0]
            ok = isinstance(q, fx.Node) and val(q) is not None and same_shape(val(q).shape[:-1], val(scores).shape[:-1])
            return q if ok else None
        carried = [a for a in node.args if isinstance(a, fx.Node) and isinstance(val(a), torch.Tensor)
                   and same_shape(val(a).shape, val(node).shape)]
        if len(carried) != 1:
            return None
        node = carried[0]
    return None


def _logsumexp_input(node) -> Optional[fx.Node]:
    """``y`` where ``node`` is ``logsumexp(y, [-1], keepdim=True)`` used once, else None."""
    return logsumexp_over_keys(node) if isinstance(node, fx.Node) and len(node.users) == 1 else None


def _column(node, like) -> bool:
    """Whether ``node`` is a tensor of logits that broadcasts to ``like``'s ``[..., M, 1]`` without widening it."""
    t, target = val(node), val(like)
    if not isinstance(node, fx.Node) or t is None or not t.is_floating_point() or t.dim() > target.dim():
        return False
    return t.dim() == 0 or (t.shape[-1] == 1 and all(
        a == 1 or a == b for a, b in zip(reversed(t.shape), reversed(target.shape))))


def _log_softmax_input(node) -> Optional[fx.Node]:
    """``x`` where ``node`` is ``log_softmax(x)`` over the last dim (in ``x``'s dtype) read once, else None."""
    if not isinstance(node, fx.Node) or len(node.users) != 1:
        return None
    if target_of(node) == aten._log_softmax.default:
        x, dim, half_to_float = node.args[:3]
        widened = half_to_float
    elif target_of(node) == aten.log_softmax.int:
        x, dim = node.args[:2]
        dtype = node.kwargs.get("dtype", node.args[2] if len(node.args) > 2 else None)
        widened = dtype is not None and isinstance(x, fx.Node) and val(x) is not None and dtype != val(x).dtype
    else:
        return None
    rank = val(x).dim() if isinstance(x, fx.Node) and val(x) is not None else None
    return x if rank is not None and not widened and dim % rank == rank - 1 else None


def _denominator_sink(e: fx.Node, summed, extra) -> Optional[tuple[fx.Node, fx.Node]]:
    """``(s, sink)`` where ``e`` is ``exp(s - m)`` and ``extra`` is ``exp(sink - m)`` (both shifted by one column
    ``m``), or ``e`` is ``exp(s)`` and ``extra`` ``exp(sink)``, the sink a column of logits as wide as ``summed``
    (``sum(e)``); else None."""
    if not isinstance(extra, fx.Node) or target_of(extra) != aten.exp.default or len(extra.users) != 1:
        return None
    x, y = e.args[0], extra.args[0]
    if not isinstance(x, fx.Node) or not isinstance(y, fx.Node):
        return None
    shifted = [target_of(n) == aten.sub.Tensor and len(n.args) == 2 and n.kwargs.get("alpha", 1) == 1
               and len(n.users) == 1 for n in (x, y)]
    if all(shifted) and x.args[1] is y.args[1] and _column(x.args[1], summed):
        x, y = x.args[0], y.args[0]
    if not isinstance(x, fx.Node) or val(x) is None or not _column(y, summed):
        return None
    return x, y


def _quotient(div: fx.Node) -> Optional[Spelling]:
    """``exp(x) / sum(exp(x), -1, keepdim=True)``, ``x`` the scores or their row max subtracted from them; or with a
    sink's ``exp`` added to the sum (:func:`_denominator_sink`)."""
    if target_of(div) != aten.div.Tensor or len(div.args) != 2 or div.kwargs:
        return None
    e, total = div.args
    if not isinstance(e, fx.Node) or target_of(e) != aten.exp.default or not isinstance(total, fx.Node):
        return None
    joined = None  # (s, sink) of a sink added to the denominator
    if (target_of(total) == aten.add.Tensor and len(total.args) == 2 and total.kwargs.get("alpha", 1) == 1
            and len(total.users) == 1):
        for summed, extra in (total.args, total.args[::-1]):
            if isinstance(summed, fx.Node) and target_of(summed) == aten.sum.dim_IntList and summed.args[0] is e:
                joined = _denominator_sink(e, summed, extra)
                total = summed
                break
        if joined is None:
            return None
    if (target_of(total) != aten.sum.dim_IntList or total.args[0] is not e or total.kwargs.get("dtype") is not None
            or len(total.users) != 1 or set(e.users) != {div, total}):
        return None
    dims, keepdim = total.args[1], total.args[2] if len(total.args) > 2 else total.kwargs.get("keepdim", False)
    rank = val(e).dim()
    if dims is None or len(dims) != 1 or dims[0] % rank != rank - 1 or not keepdim:
        return None
    if joined is not None:
        return _sink_spelling(div, *joined)
    x = e.args[0]
    shift = row_max_shift(x) if isinstance(x, fx.Node) else None
    scores = shift[0] if shift is not None else x
    return Spelling(div, scores, None, None) if isinstance(scores, fx.Node) and val(scores) is not None else None


def _exponential(exp: fx.Node) -> Optional[Spelling]:
    """``exp(log_softmax(s))``, or ``exp(s - L)`` with ``L`` a logsumexp over the keys (of ``s``, of ``s`` joined to a
    sink column, or ``logaddexp`` of it and a sink)."""
    if target_of(exp) != aten.exp.default:
        return None
    x = _log_softmax_input(exp.args[0])
    if x is not None:
        return Spelling(exp, x, None, None)
    sub = exp.args[0]
    if (not isinstance(sub, fx.Node) or target_of(sub) != aten.sub.Tensor or len(sub.users) != 1
            or sub.kwargs.get("alpha", 1) != 1 or len(sub.args) != 2):
        return None
    scores, lse = sub.args
    if not isinstance(scores, fx.Node) or val(scores) is None or not isinstance(lse, fx.Node):
        return None
    y = _logsumexp_input(lse)
    if y is scores:
        return Spelling(exp, scores, None, None)
    if y is not None and target_of(y) == aten.cat.default and len(y.users) == 1:
        parts = y.args[0]
        dim = y.args[1] if len(y.args) > 1 else y.kwargs.get("dim", 0)
        rank = val(y).dim()
        if (len(parts) == 2 and parts[0] is scores and dim % rank == rank - 1 and isinstance(parts[1], fx.Node)
                and val(parts[1]).dim() == rank and val(parts[1]).shape[-1] == 1):
            return Spelling(exp, scores, parts[1], y)
        return None
    if target_of(lse) != aten.logaddexp.default or len(lse.users) != 1:
        return None
    for inner, sink in (lse.args, reversed(lse.args)):
        if _logsumexp_input(inner) is scores and _column(sink, inner):
            return _sink_spelling(exp, scores, sink)
    return None


def _sink_spelling(weights: fx.Node, scores: fx.Node, sink: fx.Node) -> Optional[Spelling]:
    """A sink column the rewrite joins to the scores itself: broadcast to their rows by their sizes, or where those
    are symbolic by their product's query operand's (None where it has not got them)."""
    if all(isinstance(size, int) for size in val(scores).shape[:-1]):
        return Spelling(weights, scores, sink, None)
    rows = _query_operand(scores)
    return None if rows is None else Spelling(weights, scores, sink, None, rows)


def find(graph: fx.Graph) -> list[Spelling]:
    forms = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        form = _quotient(node) or _exponential(node)
        if form is not None and weights_meet_a_product(node):
            forms.append(form)
    return forms


def as_softmax(form: Spelling, emit: Callable[..., fx.Node], graph: fx.Graph) -> fx.Node:
    """Rewrite ``form`` (``emit`` inserts before its weights, :class:`fuse_attn.graph.rewrite._Emitter`): their users
    read the softmax (cut back to the keys where it has a sink) and the chain that computed them is erased. Returns
    the softmax."""
    joined = form.joined
    if form.sink is not None and joined is None:  # logaddexp, or the sink in the denominator: the column joined here
        rows = [size if isinstance(size, int) else emit(aten.sym_size.int, form.rows, d)
                for d, size in enumerate(val(form.scores).shape[:-1])]
        joined = emit(aten.cat.default, [form.scores, emit(aten.expand.default, form.sink, [*rows, 1])], -1)
    softmax = emit(aten._softmax.default, joined if joined is not None else form.scores, -1, False)
    weights = softmax if form.sink is None else emit(aten.slice.Tensor, softmax, -1, 0, -1)
    for node in (softmax, weights):
        node.meta["stack_trace"] = form.weights.meta.get("stack_trace")
    form.weights.replace_all_uses_with(weights)
    erase_dead_nodes(graph, [form.weights])
    return softmax
