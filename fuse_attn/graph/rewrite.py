"""Replace matched attentions in a pre-autograd ATen graph with one call of ``fuse_attn::flash_attention`` (or of
SDPA's cuDNN / flash kernel, where :mod:`fuse_attn.kernels.dispatch` timed it faster on this GPU and shape).

The fused op takes 4-D ``[Z, H, len, dim]`` operands. Batch dims are brought to that form with size-free view
ops (``unsqueeze`` / ``flatten``), so the rewrite also works when lengths are symbolic; only a batch reshape
between the two products or a broadcast of q/k/v needs static sizes.
"""

from __future__ import annotations

import operator
import os
import re
from typing import Any, Optional

import torch
import torch.fx as fx
from torch._dispatch.python import enable_python_dispatcher
from torch._guards import detect_fake_mode

from fuse_attn.graph import softmax_spellings, sdpa_calls
from fuse_attn.graph.context_parallel import ContextParallel, ring_attention_call, uneven_total, unshardable_reason
from fuse_attn.graph.matching import (AttentionMatch, einsum_as_matmul, einsum_as_permuted_matmul, find_softmaxes,
                                      match_attention, weights_meet_a_product)
from fuse_attn.graph.nodes import (MatchContext, NotFused, aten, erase_dead_nodes, is_static, nodes_needing_grad,
                                   same_shape, shape_text, val)
from fuse_attn.graph.score_reader import Reindexing
from fuse_attn.kernels import dispatch, embedding_backward
from fuse_attn.kernels.plan import size_hint
from fuse_attn.report import GraphReport, SoftmaxVerdict, TableLookup, log


class _Emitter:
    """Inserts nodes before ``anchor`` and fills their ``meta['val']`` by running them on fake tensors."""

    def __init__(self, graph: fx.Graph, anchor: fx.Node, fake_mode,
                 shared_inputs: Optional[dict[tuple, fx.Node]] = None):
        self.graph = graph
        self.anchor = anchor
        self.fake_mode = fake_mode
        self.inserted: list[fx.Node] = []
        # made once a graph for every match that reads them: (kind, node, ...) -> the node made from it
        self.shared_inputs = {} if shared_inputs is None else shared_inputs

    def __call__(self, target, *args, **kwargs) -> fx.Node:
        with self.graph.inserting_before(self.anchor):
            node = self.graph.call_function(target, args, kwargs)
        self.inserted.append(node)
        self._fill_val(node, target, args, kwargs)
        return node

    def _fill_val(self, node: fx.Node, target, args, kwargs) -> None:
        if self.fake_mode is not None:
            fake_args, fake_kwargs = fx.node.map_arg((args, kwargs), val)
            # the Python dispatcher runs composite ops (matmul) through their symbolic-shape-aware Python
            # decompositions, as Dynamo's tracing does; without it the C++ matmul (torch 2.11) specializes every
            # size of a dynamic shape (one compile per length)
            with self.fake_mode, enable_python_dispatcher():
                node.meta["val"] = target(*fake_args, **fake_kwargs)

    def keys_contiguous(self, node: fx.Node) -> fx.Node:
        """A score tensor ``[..., M, N]`` whose keys are strided in memory (T5's position bias: an embedding's
        ``[N, N, H]`` output permuted to ``[1, H, N, N]``), copied once a graph to the contiguous layout, or ``node``
        itself where its keys are adjacent (or one), or where a dim is broadcast by a zero stride (a copy would store
        it in full). Each kernel tile then reads whole rows of keys -- 16-byte runs that TMA can bring -- instead of
        one element every stride; Inductor writes the copy from the producer's loop (the permuted buffer is not kept
        where nothing else reads it), and the attentions that share the tensor (every T5 layer) share the copy.
        The copy is placed after ``node`` (after the graph's inputs where ``node`` is one), before every use."""
        t = val(node)
        sizes, strides = [size_hint(n) for n in t.shape], [size_hint(n) for n in t.stride()]
        if t.dim() == 0 or strides[-1] == 1 or sizes[-1] == 1 or any(st == 0 and n > 1 for n, st in zip(sizes, strides)):
            return node
        copy = self.shared_inputs.get(("keys contiguous", node))
        if copy is None:
            contiguous = {"memory_format": torch.contiguous_format}
            with self.graph.inserting_after(self._after_inputs(node)):
                copy = self.graph.call_function(aten.clone.default, (node,), contiguous)
            self._fill_val(copy, aten.clone.default, (node,), contiguous)
            self.shared_inputs[("keys contiguous", node)] = copy
        return copy

    def runtime_scalar_tensor(self, node: fx.Node, device: torch.device) -> fx.Node:
        """The run-time float ``node`` (:func:`fuse_attn.graph.nodes.runtime_scalar`) as a ``[1, 1, 1, 1]`` fp32
        tensor on ``device``, made once a graph after ``node``: ``ones * node``. Written as a product because
        AOTAutograd's pass that turns Dynamo's lifted floats back into tensors (``tensorify_python_scalars``) reads a
        float used by ``mul``; a float it cannot place is specialized -- a guard on its value, a recompile for each
        new value -- and Dynamo restarts its analysis of the frame."""
        key = ("scalar", node, device)  # (model parallel: attentions on two devices may read one float)
        made = self.shared_inputs.get(key)
        if made is None:
            ones_args = ([1, 1, 1, 1], 1.0)
            ones_kwargs = {"dtype": torch.float32, "device": device}
            with self.graph.inserting_after(self._after_inputs(node)):
                ones = self.graph.call_function(aten.full.default, ones_args, ones_kwargs)
            with self.graph.inserting_after(ones):
                made = self.graph.call_function(aten.mul.Tensor, (ones, node))
            self._fill_val(ones, aten.full.default, ones_args, ones_kwargs)
            self._fill_val(made, aten.mul.Tensor, (ones, node), {})
            self.shared_inputs[key] = made
        return made

    def view_read(self, gather: fx.Node, reindexing: Reindexing) -> fx.Node:
        """The view of the source of ``gather`` that holds its values (:class:`Reindexing`): the dims read at one
        index selected, the others sliced to the range read, permuted to the order of ``gather``'s dims they
        become, and ones inserted for its other dims."""
        node = reindexing.source
        for k in reversed(range(len(reindexing.dims))):  # (from the last, so that the earlier dims keep their place)
            if reindexing.dims[k] is None:
                node = self(aten.select.int, node, k, reindexing.starts[k])
        shape = val(gather).shape
        kept = [(dim, start) for dim, start in zip(reindexing.dims, reindexing.starts) if dim is not None]
        for k, (dim, start) in enumerate(kept):
            if start != 0 or not same_shape((val(node).shape[k],), (shape[dim],)):
                node = self(aten.slice.Tensor, node, k, start, start + shape[dim])
        order = sorted(range(len(kept)), key=lambda k: kept[k][0])
        if order != list(range(len(kept))):
            node = self(aten.permute.default, node, order)
        placed = {dim for dim, _ in kept}
        for dim in range(len(shape)):
            if dim not in placed:
                node = self(aten.unsqueeze.default, node, dim)
        return node

    def _after_inputs(self, node: fx.Node) -> fx.Node:
        """``node``, or the graph's last input where ``node`` is one: where a node made from ``node`` goes."""
        return node if node.op != "placeholder" else [n for n in self.graph.nodes if n.op == "placeholder"][-1]

    def operand(self, operand) -> fx.Node:
        """An operand's node with its views replayed and its permutation applied."""
        node = operand.node
        for view in operand.views:
            node = self(view.target, node, *view.args[1:])
        if operand.permute is not None and operand.permute != sorted(operand.permute):
            node = self(aten.permute.default, node, list(operand.permute))
        return node

    def transpose_last(self, node: fx.Node) -> fx.Node:
        """Swap the last two dims; when ``node`` is itself such a swap, return its input instead."""
        if node.op == "call_function" and node.target in (aten.transpose.int, aten.t.default):
            rank = val(node).dim()
            dims = {d % rank for d in node.args[1:3]} if node.target == aten.transpose.int else {0, 1}
            if dims == {rank - 2, rank - 1}:
                return node.args[0]
        return self(aten.transpose.int, node, -2, -1)

    def to_4d(self, node: fx.Node, batch_rank: int) -> fx.Node:
        """[*b, L, E] -> [Z, H, L, E] with Z = prod(b[:-1]) and H = b[-1] (ones where b is shorter)."""
        if batch_rank > 2:
            return self(aten.flatten.using_ints, node, 0, batch_rank - 2)
        for _ in range(2 - batch_rank):
            node = self(aten.unsqueeze.default, node, 0)
        return node

    def from_4d(self, node: fx.Node, batch: tuple, tail: list) -> fx.Node:
        if len(batch) > 2:
            if not is_static(batch) or not is_static(tail):
                raise NotFused(f"cannot restore the output batch {shape_text(batch)} with symbolic sizes")
            return self(aten.view.default, node, [*batch, *tail])
        for _ in range(2 - len(batch)):
            node = self(aten.squeeze.dim, node, 0)
        return node

    def broadcast_to(self, node: fx.Node, batch: tuple, what: str) -> fx.Node:
        shape = tuple(val(node).shape)
        if same_shape(shape[:-2], batch):
            return node
        if not is_static(batch) or not is_static(shape):
            raise NotFused(f"{what} {shape_text(shape)} is broadcast to batch {shape_text(batch)} with symbolic sizes")
        return self(aten.expand.default, node, [*batch, *shape[-2:]])

    def in_batch_4d(self, node: fx.Node, source_batch: tuple, batch: tuple, what: str) -> fx.Node:
        """``node`` [*b, L, E] of a product whose batch is ``source_batch`` as the op's ``[Z, H, L, E]`` operand in
        the attention's ``batch``: broadcast to its batch, reshaped to the attention's, laid out 4-D."""
        node = self.rebatch(self.broadcast_to(node, source_batch, what), source_batch, batch, what)
        return self.to_4d(node, len(batch))

    def rebatch(self, node: fx.Node, source_batch: tuple, target_batch: tuple, what: str) -> fx.Node:
        """Reshape batch dims (the score path reshaped the scores' batch between the two products)."""
        if same_shape(source_batch, target_batch):
            return node
        shape = tuple(val(node).shape)
        if not is_static(target_batch) or not is_static(shape):
            raise NotFused(f"{what}: batch reshape {shape_text(source_batch)} -> {shape_text(target_batch)} with symbolic sizes")
        return self(aten.reshape.default, node, [*target_batch, *shape[-2:]])


def _fused_call(match: AttentionMatch, emit: _Emitter, training: bool, context_parallel: Optional[ContextParallel],
                needing_grad: set[fx.Node]) -> tuple[fx.Node, dispatch.ImplementationChoice]:
    """The nodes computing the match (the fused op; the Gluon forward's op or SDPA's kernel where it was timed faster;
    the ring over the ranks under ``context_parallel``) and that choice (``needing_grad``: the graph's values that
    autograd differentiates, :func:`nodes_needing_grad`)."""
    qk_batch, pv_batch, batch = match.qk_batch, match.pv_batch, match.batch
    q4 = emit.in_batch_4d(emit.operand(match.q), qk_batch, batch, "q")
    if match.kv_heads_source is not None:
        k4, v4 = match.kv_heads_source  # already [Z, H // gqa_group, N, D]: the kernel shares each kv head
    else:
        k = emit.operand(match.k)
        if match.k.permute is None:
            k = emit.transpose_last(k)  # the product's right operand is k^T
        k4 = emit.in_batch_4d(k, qk_batch, batch, "k")
        v4 = emit.in_batch_4d(emit.operand(match.v), pv_batch, batch, "v")

    tensors = []
    for use in match.tensors:
        if use.scalar:
            tensors.append(emit.runtime_scalar_tensor(use.node, val(q4).device))
            continue
        tensor = emit.keys_contiguous(use.node if use.reindexed is None else emit.view_read(use.node, use.reindexed))
        for _ in range(len(use.tensor_batch) + 2 - val(tensor).dim()):
            tensor = emit(aten.unsqueeze.default, tensor, 0)
        if use.expanded_batch is not None:
            tensor = emit(aten.expand.default, tensor, [*use.expanded_batch, *val(tensor).shape[-2:]])
        if use.rebatch:
            tensor = emit.rebatch(tensor, use.tensor_batch, batch, "a mask/bias")
        tensors.append(emit.to_4d(tensor, len(batch) if use.rebatch else len(use.tensor_batch)))

    if context_parallel is not None:
        if match.sink_column is not None:
            raise NotFused("context parallel: the ring merges its shards' outputs without the sink's share")
        return _ring_call(match, emit, q4, k4, v4, tensors, context_parallel)
    choice = dispatch.choose_implementation(match.spec, val(q4), val(k4), val(v4), training, [val(t) for t in tensors],
                                            [use.node in needing_grad for use in match.tensors],
                                            lse_used=match.sink_column is not None or match.scores_logsumexp is not None)
    if choice.is_sdpa:
        out = dispatch.sdpa_attention(emit, choice.name, q4, k4, v4, match.spec, training)
        return _restored_output(match, emit, out), choice
    if choice.name == dispatch.GLUON:  # (plain, s + bias, or the plain scores masked by a predicate of integer vectors)
        bias, vectors = dispatch.gluon_score_operands(match.spec, tensors)
        operands = (bias, vectors) if vectors else () if bias is None else (bias, )  # (the op's defaults left out)
        fused = emit(torch.ops.fuse_attn.flash_attention_hopper.default, q4, k4, v4, match.spec.to_json(), *operands)
    else:
        fused = emit(torch.ops.fuse_attn.flash_attention.default, q4, k4, v4, tensors, _dropout_seed(match, emit, q4),
                     match.spec.to_json())
    out = emit(operator.getitem, fused, 0)
    if match.sink_column is not None:
        out = _sink_share_applied(match, emit, out, emit(operator.getitem, fused, 1))
    if match.scores_logsumexp is not None:
        _logsumexp_served(match, emit, emit(operator.getitem, fused, 1))
    return _restored_output(match, emit, out), choice


def _logsumexp_served(match: AttentionMatch, emit: _Emitter, lse: fx.Node) -> None:
    """The graph's logsumexp of the scores over the keys (``match.scores_logsumexp``, ``[*b, M, 1]`` or, its dim not
    kept, ``[*b, M]``) read from the op's lse ``[Z, H, M]`` (fp32) instead, in its shape and dtype; the scores then
    have no reader but the fused op."""
    node = match.scores_logsumexp
    kept = val(node).dim() == val(node.args[0]).dim()
    shape = tuple(val(node).shape) if kept else (*val(node).shape, 1)
    served = emit.from_4d(emit(aten.unsqueeze.default, lse, -1), match.batch, list(shape[-2:]))
    served = emit.rebatch(served, match.batch, shape[:-2], "the scores' logsumexp")
    if not kept:
        served = emit(aten.squeeze.dim, served, -1)
    served = emit(aten._to_copy.default, served, dtype=val(node).dtype)
    node.replace_all_uses_with(served)
    node.graph.erase_node(node)
    # what read the logsumexp before the attention's output (FlexAttention's form computes the sink's share first) now
    # reads the op's lse: moved after it, in their order, with whatever reads them there
    position = {n: i for i, n in enumerate(served.graph.nodes)}
    earlier, pending = set(), list(served.users)
    while pending:
        user = pending.pop()
        if user not in earlier and position[user] < position[served]:
            earlier.add(user)
            pending.extend(user.users)
    after = served
    for user in sorted(earlier, key=position.__getitem__):
        after.append(user)
        after = user


def _sink_share_applied(match: AttentionMatch, emit: _Emitter, out: fx.Node, lse: fx.Node) -> fx.Node:
    """``out`` [Z, H, M, DV] of the softmax over the keys alone, scaled as the softmax over the keys and the sink
    column: each row's weights times ``sum_j e^s_j / (sum_j e^s_j + e^sink) = sigmoid(lse - sink)``, in fp32. The
    gradients reach the op through its lse output and the sink's through the sigmoid. (A row whose keys are all
    masked: out 0 and lse -inf, so 0, as eager gives where the sink takes the whole weight.)"""
    column = emit.in_batch_4d(match.sink_column, match.qk_batch, match.batch, "the sink column")
    column = emit(aten._to_copy.default, column, dtype=torch.float32)
    share = emit(aten.sigmoid.default, emit(aten.sub.Tensor, emit(aten.unsqueeze.default, lse, -1), column))
    scaled = emit(aten.mul.Tensor, emit(aten._to_copy.default, out, dtype=torch.float32), share)
    return emit(aten._to_copy.default, scaled, dtype=val(out).dtype)


def _dropout_seed(match: AttentionMatch, emit: _Emitter, q4: fx.Node) -> Optional[fx.Node]:
    if match.spec.dropout_p == 0:
        return None
    # The keep-mask's Philox seed, drawn from torch's generator of q's device on every call (so torch.manual_seed
    # governs it, as it does eager dropout); the backward reuses the saved seed.
    return emit(aten.randint.low, 0, 2**62, [], dtype=torch.int64, device=val(q4).device)


def _ring_call(match: AttentionMatch, emit: _Emitter, q4, k4, v4, tensors,
               cp: ContextParallel) -> tuple[fx.Node, dispatch.ImplementationChoice]:
    """The attention over the sequence sharded as ``cp`` says (:func:`fuse_attn.graph.context_parallel.ring_attention`)."""
    rank, world = cp.rank_and_size()
    uneven = uneven_total(cp.sequence_length, world, cp.load_balance)
    problem = unshardable_reason(val(q4).shape[2], [val(t).shape for t in tensors], cp.load_balance, uneven)
    if problem is not None:
        raise NotFused(f"context parallel: {problem}; the attention cannot run on the sharded sequence")
    out = emit(ring_attention_call, q4, k4, v4, tensors, _dropout_seed(match, emit, q4), match.spec.to_json(),
               cp.group_name, rank, world, cp.load_balance, cp.sequence_length)
    shards = f"{'load-balanced' if cp.load_balance else 'contiguous'} shards"
    if uneven is not None:
        shards += f" of an uneven sequence of {uneven}, run gathered"
    return _restored_output(match, emit, out), dispatch.ImplementationChoice(
        dispatch.TRITON, f"context parallel over {world} ranks ({shards})")


def _restored_output(match: AttentionMatch, emit: _Emitter, out: fx.Node) -> fx.Node:
    """The ``[Z, H, M, DV]`` output back in the shape of the matched product."""
    out = emit.from_4d(out, match.batch, list(val(match.pv).shape[-2:]))
    return emit.rebatch(out, match.batch, match.pv_batch, "the output")


def _source_line(node: fx.Node) -> Optional[str]:
    """``file:line  code`` of the user's line that created ``node`` (from the innermost stack frame)."""
    lines = (node.meta.get("stack_trace") or "").splitlines()
    frames = [i for i, line in enumerate(lines) if line.strip().startswith("File ")]
    if not frames:
        return None
    frame = lines[frames[-1]].strip()
    match = re.match(r'File "(?P<file>[^"]+)", line (?P<line>\d+)', frame)
    code = lines[frames[-1] + 1].strip() if frames[-1] + 1 < len(lines) else ""
    if match is None:
        return None
    return f"{os.path.basename(match['file'])}:{match['line']} `{code}`"


def _reads_of_a_dtype_or_shape_as_values(graph: fx.Graph, fake_mode) -> None:
    """``x.type_as(other)`` becomes ``x.to(other.dtype)`` and ``x.expand_as(other)`` ``x.expand(other.shape)`` (where
    its sizes are static), which they are: ``other`` is read for its dtype or shape alone, which the graph knows, so
    XLM's scores (``mask.expand_as(scores)``, ``softmax(scores.float()).type_as(scores)``) have no other reader."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (aten.type_as.default, aten.expand_as.default):
            continue
        other = val(node.args[1]) if isinstance(node.args[1], fx.Node) else None
        if not isinstance(other, torch.Tensor):
            continue
        if node.target == aten.type_as.default:
            target, value = aten.to.dtype, other.dtype
        elif all(isinstance(n, int) for n in other.shape):
            target, value = aten.expand.default, list(other.shape)
        else:
            continue
        replaced = _Emitter(graph, node, fake_mode)(target, node.args[0], value)
        replaced.meta["stack_trace"] = node.meta.get("stack_trace")
        node.replace_all_uses_with(replaced)
        graph.erase_node(node)


def _einsums_as_matmuls(graph: fx.Graph, fake_mode) -> None:
    """A two-operand ``einsum`` that is a batched matrix product in another dim order than ``[batch, m, c] x
    [batch, n, c] -> [batch, m, n]`` (which the matcher reads as it is) becomes that product of permuted operands,
    permuted to the einsum's output: LongT5's blocked local attention (``...qhd,...khd->...hqk``, then
    ``...hqk,...khd->...qhd``). The same values: einsum computes it so."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != aten.einsum.default or einsum_as_matmul(node) is not None:
            continue
        permutations = einsum_as_permuted_matmul(node)
        if permutations is None:
            continue
        left, right, out = permutations
        emit = _Emitter(graph, node, fake_mode)
        x, y = node.args[1]
        permuted = lambda t, order: t if order == sorted(order) else emit(aten.permute.default, t, order)  # noqa: E731
        replaced = permuted(emit(aten.matmul.default, permuted(x, left), permuted(y, right)), out)
        for made in emit.inserted:
            made.meta["stack_trace"] = node.meta.get("stack_trace")
        node.replace_all_uses_with(replaced)
        graph.erase_node(node)


def rewrite_attention(gm: fx.GraphModule, ctx: MatchContext, *, apply: bool = True, capture: bool = False,
                      training: bool = False, context_parallel: Optional[ContextParallel] = None) -> GraphReport:
    """Match every softmax of ``gm``; when ``apply``, replace each match with the fused op in place (or with SDPA's
    kernel, where :mod:`fuse_attn.kernels.dispatch` timed it faster: forward and backward when ``training``;
    with the ring over the ranks when the graph's sequence is sharded as ``context_parallel`` says)."""
    import fuse_attn.kernels  # noqa: F401  (registers torch.ops.fuse_attn.*)

    graph = gm.graph
    before = gm.print_readable(print_output=False) if capture else None
    fake_mode = detect_fake_mode([val(n) for n in graph.nodes if n.op == "placeholder"])
    verdicts: list[SoftmaxVerdict] = []
    shared_inputs: dict[tuple, fx.Node] = {}  # made once for every match (_Emitter.shared_inputs)
    # which values autograd differentiates: the choice times a score tensor's gradient where it has one
    needing_grad = nodes_needing_grad(graph, ctx.inputs_needing_grad) if training else set()
    # softmaxes spelled out (exp / sum, exp(s - logsumexp)) become the softmax the matcher reads
    # (fuse_attn.graph.softmax_spellings); each verdict names the node whose weights the softmax replaced, as the graph
    # before the rewrite shows it
    _reads_of_a_dtype_or_shape_as_values(graph, fake_mode)
    _einsums_as_matmuls(graph, fake_mode)
    written_out = {}
    for form in softmax_spellings.find(graph):
        name = form.weights.name
        written_out[softmax_spellings.as_softmax(form, _Emitter(graph, form.weights, fake_mode), graph)] = name
    # SDPA calls are matched through their expansion (fuse_attn.graph.sdpa_calls); each verdict is the call's
    expansions: dict[fx.Node, sdpa_calls.Expansion] = {}
    for call in sdpa_calls.find_calls(graph):
        try:
            expansion = sdpa_calls.expand(call, _Emitter(graph, call, fake_mode))
        except NotFused as e:
            verdicts.append(SoftmaxVerdict(call.name, False, reason=e.reason, about=call.name,
                                           source=_source_line(call), attention=True))
            continue
        expansions[expansion.softmax] = expansion
    for softmax in find_softmaxes(graph):
        if getattr(softmax, "_erased", False):
            continue
        expansion = expansions.get(softmax)
        anchor = expansion.call if expansion is not None else softmax
        name, source = written_out.get(anchor, anchor.name), _source_line(anchor)
        try:
            match = match_attention(softmax, ctx)
            choice = (_apply(graph, match, fake_mode, training, context_parallel, shared_inputs, needing_grad)
                      if apply else None)
        except NotFused as e:
            about = e.node.name if e.node is not None else None
            verdicts.append(SoftmaxVerdict(name, False, reason=e.reason, about=about, source=source,
                                           attention=expansion is not None or weights_meet_a_product(softmax)))
            continue
        except Exception as e:  # a bug of ours must cost the fusion, never the user's model
            log.debug("fuse_attn: internal error while matching %s", name, exc_info=True)  # (the verdict says it)
            verdicts.append(SoftmaxVerdict(name, False, reason=f"internal error: {type(e).__name__}: {e}",
                                           source=source, attention=True))
            continue
        finally:
            if expansion is not None:
                fused = apply and getattr(expansion.product, "_erased", False)
                sdpa_calls.settle(expansion, fused, graph)
        verdicts.append(SoftmaxVerdict(name, True, spec=match.spec, source=source,
                                       runs=choice.text() if choice is not None else None,
                                       implementation=choice.name if choice is not None else None,
                                       sink=match.sink_column is not None,
                                       logsumexp_read=match.scores_logsumexp is not None))
    for key, made in shared_inputs.items():
        if not made.users:  # (made for a match that then failed)
            graph.erase_node(made)
            if key[0] == "scalar":
                graph.erase_node(made.args[0])  # its ones
    tables = few_row_table_lookups(graph, fake_mode, needing_grad, apply) if training else []
    if apply or expansions:
        graph.lint()
        gm.recompile()
    after = gm.print_readable(print_output=False) if capture else None
    return GraphReport(verdicts, before=before, after=after, rewritten=apply, tables=tables)


def _apply(graph: fx.Graph, match: AttentionMatch, fake_mode: Any, training: bool,
           context_parallel: Optional[ContextParallel],
           shared_inputs: dict[tuple, fx.Node], needing_grad: set[fx.Node]) -> dispatch.ImplementationChoice:
    emit = _Emitter(graph, match.pv, fake_mode, shared_inputs)
    try:
        replacement, choice = _fused_call(match, emit, training, context_parallel, needing_grad)
    except BaseException:
        # Leave the graph as it was: drop whatever was inserted for this match.
        for node in reversed(emit.inserted):
            graph.erase_node(node)
        raise
    match.pv.replace_all_uses_with(replacement)
    # The matched nodes, their dead inputs, and inserted views that ended up unused (e.g. a transpose undone).
    erase_dead_nodes(graph, [match.pv, *emit.inserted], owned=set(match.matched_nodes))
    return choice


def few_row_table_lookups(graph: fx.Graph, fake_mode: Any, needing_grad: set[fx.Node],
                           apply: bool) -> list[TableLookup]:
    """Each embedding lookup of a table with few rows that needs a gradient -- T5's relative position bias, a
    [32, heads] table looked up at every (query, key) pair -- becomes ``fuse_attn::table_lookup`` (when ``apply``;
    otherwise it is only reported): the same lookup, whose backward sums the gradient a program at a time
    (``fuse_attn.kernels.embedding_backward``) where Inductor's decomposition adds each value atomically into the
    few rows' addresses."""
    tables = []
    for node in list(graph.nodes):
        if node.target is not aten.embedding.default or node.args[0] not in needing_grad:
            continue
        weight, indices = node.args[:2]
        options = {"padding_idx": -1, "scale_grad_by_freq": False, "sparse": False}  # aten.embedding's defaults
        options.update(zip(options, node.args[2:]), **node.kwargs)
        if not embedding_backward.handles(val(weight), options["scale_grad_by_freq"], options["sparse"]):
            continue
        found = TableLookup(node.name, shape_text(val(weight).shape), _source_line(node))
        if not apply:
            tables.append(found)
            continue
        emit = _Emitter(graph, node, fake_mode)
        try:
            lookup = emit(torch.ops.fuse_attn.table_lookup.default, weight, indices, options["padding_idx"])
        except Exception:  # a bug of ours costs this lookup its table gradient, not the graph its attentions
            log.debug("fuse_attn: internal error while rewriting the lookup %s", node.name, exc_info=True)
            for inserted in reversed(emit.inserted):
                graph.erase_node(inserted)
            continue
        lookup.meta["stack_trace"] = node.meta.get("stack_trace")
        node.replace_all_uses_with(lookup)
        graph.erase_node(node)
        tables.append(found)
    return tables
