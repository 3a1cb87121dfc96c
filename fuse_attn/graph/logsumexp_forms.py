"""Softmaxes spelled with ``logsumexp``, rewritten into the softmax the matcher reads before it runs.

In the pre-autograd ATen graph these are ``exp(s - L)`` over the last dim, ``L`` kept as ``[..., M, 1]``:

* ``L = logsumexp(s)``: the softmax of ``s``;
* ``L = logsumexp(cat([s, sink], -1))`` or ``L = logaddexp(logsumexp(s), sink)``, ``sink`` a column of logits
  (``[..., M, 1]`` after broadcasting): an attention sink, the weights over the keys of the softmax over the keys and
  the sink -- rewritten as gpt-oss spells it, ``softmax(cat([s, sink], -1))[..., :-1]``, which
  :func:`fuse_attn.graph.matching.attention_sink` reads.

The values are the same (``exp(s - logsumexp(s))`` is the softmax's definition) but where a score is ``+inf``: there
the softmax's row is NaN, where ``exp(s - L)`` is NaN at that key and 0 at the others -- and ``P @ V`` makes that
output row NaN either way. Only forms whose weights reach a matrix product (``P @ V``:
:func:`fuse_attn.graph.matching.weights_meet_a_product`) are rewritten; the rewrite keeps ``exp``'s source line for
the verdict. A sink joined by ``logaddexp`` to scores of symbolic sizes is broadcast to their rows with the sizes of
their product's query operand, and left as written where that operand does not have them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.fx as fx

from fuse_attn.graph.matching import weights_meet_a_product
from fuse_attn.graph.nodes import (CONTRACTION_OPS, aten, erase_dead_nodes, logsumexp_over_keys, same_shape,
                                  target_of, val)


@dataclass
class LogsumexpForm:
    exp: fx.Node  # exp(s - L): the weights
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


def find(graph: fx.Graph) -> list[LogsumexpForm]:
    forms = []
    for exp in graph.nodes:
        if exp.op != "call_function" or target_of(exp) != aten.exp.default:
            continue
        sub = exp.args[0]
        if (not isinstance(sub, fx.Node) or target_of(sub) != aten.sub.Tensor or len(sub.users) != 1
                or sub.kwargs.get("alpha", 1) != 1 or len(sub.args) != 2):
            continue
        scores, lse = sub.args
        if not isinstance(scores, fx.Node) or val(scores) is None or not isinstance(lse, fx.Node):
            continue
        form = None
        y = _logsumexp_input(lse)
        if y is scores:
            form = LogsumexpForm(exp, scores, None, None)
        elif y is not None and target_of(y) == aten.cat.default and len(y.users) == 1:
            parts = y.args[0]
            dim = y.args[1] if len(y.args) > 1 else y.kwargs.get("dim", 0)
            rank = val(y).dim()
            if (len(parts) == 2 and parts[0] is scores and dim % rank == rank - 1 and isinstance(parts[1], fx.Node)
                    and val(parts[1]).dim() == rank and val(parts[1]).shape[-1] == 1):
                form = LogsumexpForm(exp, scores, parts[1], y)
        elif target_of(lse) == aten.logaddexp.default and len(lse.users) == 1:
            for inner, sink in (lse.args, reversed(lse.args)):
                if _logsumexp_input(inner) is scores and _column(sink, inner):
                    static = all(isinstance(size, int) for size in val(scores).shape[:-1])
                    rows = None if static else _query_operand(scores)
                    if static or rows is not None:
                        form = LogsumexpForm(exp, scores, sink, None, rows)
                    break
        if form is not None and weights_meet_a_product(exp):
            forms.append(form)
    return forms


def as_softmax(form: LogsumexpForm, emit: Callable[..., fx.Node], graph: fx.Graph) -> fx.Node:
    """Rewrite ``form`` (``emit`` inserts before its ``exp``, :class:`fuse_attn.graph.rewrite._Emitter`): its users
    read the softmax (cut back to the keys where it has a sink) and its ``exp(s - L)`` chain is erased. Returns the
    softmax."""
    joined = form.joined
    if form.sink is not None and joined is None:  # logaddexp(logsumexp(s), sink): the column joined here
        rows = [size if isinstance(size, int) else emit(aten.sym_size.int, form.rows, d)
                for d, size in enumerate(val(form.scores).shape[:-1])]
        joined = emit(aten.cat.default, [form.scores, emit(aten.expand.default, form.sink, [*rows, 1])], -1)
    softmax = emit(aten._softmax.default, joined if joined is not None else form.scores, -1, False)
    weights = softmax if form.sink is None else emit(aten.slice.Tensor, softmax, -1, 0, -1)
    for node in (softmax, weights):
        node.meta["stack_trace"] = form.exp.meta.get("stack_trace")
    form.exp.replace_all_uses_with(weights)
    erase_dead_nodes(graph, [form.exp])
    return softmax
