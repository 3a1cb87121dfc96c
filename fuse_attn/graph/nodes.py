"""What the graph modules share: facts about the nodes of a pre-autograd ATen FX graph, and the matcher's vocabulary
(:class:`NotFused`, :class:`MatchContext`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.fx as fx

from fuse_attn.kernels.plan import size_hint

aten = torch.ops.aten

# The Python numbers a graph holds as literal operands. ``bool`` is an ``int`` to ``isinstance`` anyway; a caller that
# wants a number and not a flag excludes it.
SCALAR_TYPES = (bool, int, float)


class NotFused(Exception):
    """A softmax that is not rewritten, with the reason and the node it is about."""

    def __init__(self, reason: str, node: Optional[fx.Node] = None):
        super().__init__(reason)
        self.reason = reason
        self.node = node


@dataclass
class MatchContext:
    """What the matcher may know beyond the graph: real values of constant inputs (registered buffers), and which
    inputs require a gradient (the graph's own values say none: it is traced below autograd)."""

    constant_inputs: dict[fx.Node, torch.Tensor] = field(default_factory=dict)
    gm: Optional[fx.GraphModule] = None
    inputs_needing_grad: frozenset[fx.Node] = frozenset()

# Ops that only re-interpret or re-lay-out a tensor (values unchanged, no dtype change).
VIEW_OPS = {
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.transpose.int,
    aten.permute.default,
    aten.expand.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.t.default,
    aten.flatten.using_ints,
}
# Ops that return the same values with the same shape.
IDENTITY_OPS = {aten.alias.default, aten.clone.default, aten.contiguous.default, aten.lift_fresh_copy.default}
# (type_as is read as to(dtype) before matching: rewrite._reads_of_a_dtype_or_shape_as_values)
CAST_OPS = {aten.to.dtype, aten._to_copy.default, aten.to.dtype_layout}
SOFTMAX_OPS = {aten.softmax.int, aten._softmax.default, aten._safe_softmax.default}
# Batched matrix products: (.., m, k) x (.., k, n) -> (.., m, n), batch dims broadcast.
CONTRACTION_OPS = {aten.matmul.default, aten.bmm.default, aten.mm.default}


# In-place forms (pre-autograd graphs keep them) read as their functional forms: the matcher only follows a value
# with one user, so the mutation is seen by nothing else.
FUNCTIONAL_FORM = {
    aten.mul_.Tensor: aten.mul.Tensor,
    aten.mul_.Scalar: aten.mul.Scalar,
    aten.div_.Tensor: aten.div.Tensor,
    aten.div_.Scalar: aten.div.Scalar,
    aten.add_.Tensor: aten.add.Tensor,
    aten.add_.Scalar: aten.add.Scalar,
    aten.sub_.Tensor: aten.sub.Tensor,
    aten.sub_.Scalar: aten.sub.Scalar,
    aten.masked_fill_.Scalar: aten.masked_fill.Scalar,
    aten.masked_fill_.Tensor: aten.masked_fill.Tensor,
    aten.tanh_.default: aten.tanh.default,
    aten.clamp_.default: aten.clamp.default,
    aten.clamp_min_.default: aten.clamp_min.default,
    aten.clamp_max_.default: aten.clamp_max.default,
    aten.neg_.default: aten.neg.default,
    aten.exp_.default: aten.exp.default,
}


def target_of(node: fx.Node):
    """The node's op, an in-place form read as its functional form."""
    return FUNCTIONAL_FORM.get(node.target, node.target)


def logsumexp_over_keys(node: Any) -> Optional[fx.Node]:
    """``y`` where ``node`` is ``logsumexp(y, [-1])`` (over the last dim, kept or not: FlexAttention's sink form keeps
    it, Granite's drops it), else None."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or target_of(node) != aten.logsumexp.default:
        return None
    y, dims = node.args[0], node.args[1]
    value = val(y) if isinstance(y, fx.Node) else None
    if value is None or len(dims) != 1 or dims[0] % value.dim() != value.dim() - 1:
        return None
    return y


def op_name(target: Any) -> str:
    """An op as reasons name it (``mul.Tensor``)."""
    return str(target).replace("aten.", "")


def val(node: Any) -> Any:
    """The FakeTensor / SymInt / constant a node (or literal) stands for."""
    if isinstance(node, fx.Node):
        return node.meta.get("val", node.meta.get("example_value"))
    return node


def laid_out_as(emit: Callable[..., fx.Node], node: fx.Node, replaced: fx.Node) -> fx.Node:
    """``node``, which stands for ``replaced``'s value, laid out in memory as that value is (a permuted copy, through
    ``emit(target, *args, **kwargs)``, where the order of their dims in memory differs): the graph after it was
    traced with those strides, and a ``view`` there may hold only for them. SDPA's kernels return ``[B, H, M, D]``
    with the heads inside each row, so the trace keeps no copy for a ``.transpose(1, 2).contiguous()`` of their output
    (JetMoE then ``.view``s it as ``[B, M, top_k, -1]``), while the math that replaces the call is laid out as
    ``[B, H, M, D]``. Where a ``reshape`` follows instead, it would make the same copy."""
    order, current = _memory_order(val(replaced)), _memory_order(val(node))
    if _without_unit_dims(order, val(replaced)) == _without_unit_dims(current, val(node)):
        return node
    copy = emit(aten.clone.default, emit(aten.permute.default, node, order), memory_format=torch.contiguous_format)
    return emit(aten.permute.default, copy, [order.index(d) for d in range(len(order))])


def _memory_order(t: torch.Tensor) -> list[int]:
    """The dims of a dense tensor from the outermost in memory to the innermost."""
    strides = [size_hint(n) for n in t.stride()]
    return sorted(range(t.dim()), key=lambda d: -strides[d])


def _without_unit_dims(order: list[int], t: torch.Tensor) -> list[int]:
    """``order`` without the dims of size 1, whose stride places nothing."""
    return [d for d in order if size_hint(t.shape[d]) != 1]


def runtime_scalar(x: Any) -> Optional[torch.SymFloat]:
    """The value of ``x`` when it is a float the graph reads at run time -- a Python float Dynamo lifted to an input
    (the ``.item()`` of a 0-d tensor placeholder: an attribute that changed between calls), a ``.item()`` captured
    from a tensor, or arithmetic of such floats; None for anything else (constants, and sizes: a symbolic head dim's
    ``D ** -0.5`` is a size expression, not a run-time float)."""
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    value = val(x) if isinstance(x, fx.Node) else None
    if not isinstance(value, torch.SymFloat):
        return None
    symbols = value.node.expr.free_symbols
    if symbols and all(symbol_is_type(s, (SymT.FLOAT, SymT.UNBACKED_FLOAT)) for s in symbols):
        return value
    return None


def is_static(shape) -> bool:
    return all(isinstance(s, int) for s in shape)


def same_shape(a, b) -> bool:
    """Sizes equal for every value of their symbols (never adds a guard: the graph is already guarded)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    a, b = tuple(a), tuple(b)
    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b))


def all_ones(sizes) -> bool:
    """Every size is a literal 1 (a symbolic size is never 1: Dynamo specializes 0 and 1)."""
    return all(isinstance(s, int) and s == 1 for s in sizes)


def shape_text(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def cast_dtype(node: fx.Node) -> Optional[torch.dtype]:
    """The target dtype of a cast node that changes nothing but the dtype, else None."""
    if node.target not in CAST_OPS:
        return None
    out = val(node)
    if not isinstance(out, torch.Tensor):
        return None
    source = val(node.args[0])
    if not isinstance(source, torch.Tensor) or source.device != out.device or source.shape != out.shape:
        return None
    return out.dtype


def is_pure(node: fx.Node) -> bool:
    """A call whose only effect is its result (safe to drop when unused)."""
    if node.op == "get_attr":
        return True
    if node.op != "call_function":
        return False
    target = node.target
    if target in (aten.dropout.default, aten.native_dropout.default) and (not node.args[2] or node.args[1] == 0):
        return True  # dropout in eval mode or with p=0 draws no random numbers: it is the identity
    if node.is_impure():
        return False
    if isinstance(target, torch._ops.OpOverload):
        return not target._schema.is_mutable and torch.Tag.nondeterministic_seeded not in target.tags
    return target.__module__ == "_operator"


def erase_dead_nodes(graph: fx.Graph, candidates, owned=frozenset()) -> None:
    """Erase, among ``candidates`` and their ancestors, every pure node left without users.

    ``owned`` nodes are erased when unused even if they mutate their input (an in-place op on the scores inside a
    matched attention: what it mutates is matched too, and nothing else sees it).
    """
    pending = list(candidates)
    while pending:
        node = pending.pop()
        if getattr(node, "_erased", False) or node.graph is not graph or node.users:
            continue
        if not (is_pure(node) or node in owned):
            continue
        inputs = list(node.all_input_nodes)
        graph.erase_node(node)
        pending.extend(inputs)


# Ops whose outputs carry no gradient whatever their inputs (the graph is traced below autograd, so its values say
# nothing: nodes_needing_grad follows the graph instead)
_NO_GRAD_OPS = {aten.detach.default, aten.detach_.default}


def nodes_needing_grad(graph: fx.Graph, inputs: frozenset) -> set[fx.Node]:
    """The nodes of a pre-autograd graph whose values autograd will differentiate: those computed, with grad mode on,
    from ``inputs`` (placeholders whose tensors require a gradient), floating-point, not detached. Grad mode follows
    the graph's ``torch._C._set_grad_enabled`` calls (a ``torch.no_grad()`` block traced pre-dispatch)."""
    needing, grad_on = set(), True
    for node in graph.nodes:
        if node.op == "placeholder":
            if node in inputs:
                needing.add(node)
        elif node.op == "call_function" and node.target is torch._C._set_grad_enabled:
            grad_on = bool(node.args[0])
        elif node.op == "call_function" and grad_on and node.target not in _NO_GRAD_OPS:
            value = val(node)
            floating = (isinstance(value, (tuple, list))
                        or (isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())))
            if floating and any(a in needing for a in node.all_input_nodes):
                needing.add(node)
    return needing
