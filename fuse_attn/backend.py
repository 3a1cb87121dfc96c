"""The ``fuse_attn`` torch.compile backend (registered through the ``torch_dynamo_backends`` entry point).

Pipeline for each graph Dynamo hands over:

1. trace it to a pre-autograd ATen graph (``make_fx(pre_dispatch=True)`` on Dynamo's fake inputs): one spelling
   per op, grad-mode regions kept, no backward yet;
2. match every softmax and replace each proven attention with ``torch.ops.fuse_attn.flash_attention``
   (``fuse_attn.graph.rewrite``) -- or with SDPA's cuDNN / flash kernel where one computes it exactly and was timed faster
   (``fuse_attn.kernels.dispatch``); every softmax left alone gets a recorded reason; in a trained graph,
   each lookup of a few-row embedding table (T5's position bias) becomes ``fuse_attn::table_lookup``, whose
   gradient sums by programs instead of atomic adds (``fuse_attn.kernels.embedding_backward``);
3. hand the rewritten graph to Inductor's ``compile_fx``: AOTAutograd builds the joint graph -- the fused op's
   registered autograd formula puts our backward kernel into it -- then Inductor partitions, fuses and compiles
   everything else.

On CUDA tensors AOTAutograd and Inductor trace into the fused ops (``torch.library.triton_op``, see
``fuse_attn.kernels.ops``): the generated kernels, their tuned configs and any per-call tile summaries become part
of the compiled code that Inductor's FX graph cache and AOTAutograd's cache keep. The rewrite runs before Inductor's
cache lookup, so a changed matcher changes the graph and the key. What is left -- kernel templates, launch code,
the autograd wiring and the ``FUSE_ATTN_*`` environment settings, which change what the ops trace but not the
rewritten graph -- is covered by :class:`PostGradPass`: Inductor's post-grad pass, whose ``uuid`` digests this package's
sources and those settings, which both caches put into their keys.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import operator
import os
import time
from pathlib import Path
from typing import Any, Optional

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
from torch._inductor import config as inductor_config
# Imported with the backend, as torch.compile(backend="inductor") imports it when it is called (about 1 s): imported
# in the backend's first call, a model's first step would wait for it where Inductor's does not
from torch._inductor.async_compile import maybe_warm_pool
from torch._inductor.compile_fx import compile_fx
from torch._inductor.custom_graph_pass import CustomGraphPass
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, get_proxy_mode, make_fx, track_tensor_tree
from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule
from torch._guards import detect_fake_mode

from fuse_attn import analysis_cache, settings
from fuse_attn.graph.nodes import MatchContext
from fuse_attn.graph.rewrite import rewrite_attention
from fuse_attn.kernels import dispatch
from fuse_attn.report import GraphReport, SoftmaxVerdict, TableLookup, explained, log, publish


def _static_launch_in_compile_workers() -> None:
    """Inductor's compile workers decide whether a user-defined kernel launches statically; each reads its config
    once at start, from its environment, and a task carries only ``use_static_triton_launcher`` of the parent's
    config, so the config patch reaches kernels compiled in this process only (with parallel compile on, none of
    ours). The environment setting reaches workers started after it: the pool starts in this backend's first call,
    after it, unless another compile of this process started it before.
    A setting of the user's own is kept."""
    os.environ.setdefault(_STATIC_LAUNCH_ENVIRONMENT, "1")


_STATIC_LAUNCH_ENVIRONMENT = "TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS"


def fuse_attn_backend(gm: fx.GraphModule, example_inputs: list[Any], **kwargs) -> Any:
    """The backend. The options named in :mod:`fuse_attn.settings` are taken out of ``torch.compile(...,
    options={...})``; all others go to Inductor as config patches."""
    options = dict(kwargs.get("options") or {})
    enabled = bool(options.pop(settings.OPTION_ENABLED, True)) and not settings.disabled()
    log_only = bool(options.pop(settings.OPTION_LOG_ONLY, False))
    context_parallel = options.pop(settings.OPTION_CONTEXT_PARALLEL, None)
    config_patches = _inductor_mode_options(kwargs.get("mode"))
    config_patches.update(options)
    config_patches.setdefault("post_grad_custom_post_pass", PostGradPass())
    if hasattr(inductor_config, "static_launch_user_defined_triton_kernels"):
        # The fused kernels are user-defined Triton kernels to Inductor, which launches those through Triton's
        # Python launcher unless this is on. The static launcher costs less host time per launch: on an H100 a
        # one-attention step takes 5% less time with it (fwd+bwd, B8 H12 N1024 D64), 31% less forward only (B1 H32
        # N256 D128), where the launch is most of the step.
        config_patches.setdefault("static_launch_user_defined_triton_kernels", True)
        if config_patches["static_launch_user_defined_triton_kernels"]:
            _static_launch_in_compile_workers()
    if any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs):
        # Inductor's compile workers, started now as torch.compile(backend="inductor") starts them (its backend's
        # first line): they take about 8 s to start on an H200 host, and the tuner compiles its candidates on them
        # once they are ready -- started by Inductor's compile_fx, after this backend's analysis, which tunes the
        # forward, they were not.
        maybe_warm_pool()

    if not enabled:
        return compile_fx(gm, example_inputs, config_patches=config_patches)
    cuda_graphs = bool(config_patches.get("triton.cudagraphs", inductor_config.triton.cudagraphs))
    start = time.perf_counter()
    with dispatch.replayed_as_cuda_graphs(cuda_graphs):
        rewritten, report = _stored_or_analyzed(gm, example_inputs, apply=not log_only,
                                                context_parallel=context_parallel, cuda_graphs=cuda_graphs)
    _seconds["analysis"] += time.perf_counter() - start
    if report is not None:
        publish(report)
    if rewritten is None or log_only or not report.changed:
        return compile_fx(gm, example_inputs, config_patches=config_patches)
    return compile_fx(rewritten, example_inputs, config_patches=config_patches)


def _stored_or_analyzed(gm: fx.GraphModule, example_inputs: list[Any], *, apply: bool, context_parallel: Any,
                        cuda_graphs: bool) -> tuple[Optional[fx.GraphModule], Optional[GraphReport]]:
    """:func:`analyze_graph`'s answer, from the disk where an earlier process stored it
    (:mod:`fuse_attn.analysis_cache`: a rewrite that changed the graph, applied, without context parallelism)."""
    key = None
    buffers = _buffer_flags(gm)
    if apply and context_parallel is None:
        key = analysis_cache.analysis_key(gm, example_inputs, buffers, cuda_graphs=cuda_graphs,
                                          sources=PostGradPass().uuid())
    if key is not None:
        loaded = analysis_cache.load(key)
        # (a report stored without the graph's text before and after serves no one asking for it)
        if loaded is not None and (loaded[1].before is not None or not capture_requested()):
            return loaded
    rewritten, report = analyze_graph(gm, example_inputs, apply=apply, buffers=buffers,
                                      context_parallel=context_parallel)
    if key is not None and rewritten is not None and report is not None and report.changed:
        rewritten = analysis_cache.stored(key, rewritten, report)
    return rewritten, report


# Seconds this process spent in the backend before handing graphs to Inductor (compile_seconds).
_seconds = {"analysis": 0.0, "trace": 0.0}


def compile_seconds() -> dict[str, float]:
    """Where this process's compile time went, in seconds: ``analysis``, the backend's work on Dynamo's graphs before
    Inductor (tracing them, ``trace``; matching, rewriting, and whatever tuning the rewrite triggers), and from
    :func:`fuse_attn.kernels.tuning.seconds_spent` all ``tuning`` wherever it ran (in the analysis, or while Inductor
    traced the fused ops), of it ``compiling candidates``. The rest of a first step is Dynamo's, AOTAutograd's and
    Inductor's own work and the step itself."""
    from fuse_attn.kernels import tuning

    return {**_seconds, **tuning.seconds_spent()}


def analyze_graph(gm: fx.GraphModule, example_inputs: list[Any], *, apply: bool,
                  buffers: Optional[list[bool]] = None, context_parallel: Optional[Any] = None,
                  ) -> tuple[Optional[fx.GraphModule], Optional[GraphReport]]:
    """The pre-autograd graph of ``gm`` with its attentions replaced (when ``apply``; in a trained graph also its
    lookups of few-row tables, ``rewrite.few_row_table_lookups``) and the report; the graph is None when ``gm``
    must be compiled as it is. Never raises for a graph it cannot handle.

    ``buffers`` says which placeholders are registered buffers (default: read from Dynamo's metadata); their
    values in ``example_inputs`` are real and masks built from them are evaluated at compile time.
    ``context_parallel``: a :class:`fuse_attn.graph.context_parallel.ContextParallel` when the graph's sequence is
    sharded over ranks (each attention then runs as a ring over them)."""
    buffers = _buffer_flags(gm) if buffers is None else buffers
    if _checkpoint_regions(gm):
        return _analyze_checkpointed(gm, example_inputs, apply=apply, buffers=buffers,
                                     context_parallel=context_parallel)
    if not (_mentions_softmax(gm) or (_is_trained(example_inputs) and _looks_up_a_few_row_table(gm))):
        return None, None
    if _on_distributed_tensors(gm):
        return _analyze_plain_regions(gm, example_inputs, apply=apply, buffers=buffers,
                                      context_parallel=context_parallel)
    try:
        traced, ctx = trace_pre_autograd(gm, example_inputs, buffers)
        return traced, rewrite_attention(traced, ctx, apply=apply, capture=capture_requested(),
                                         training=_is_trained(example_inputs), context_parallel=context_parallel)
    except Exception as e:
        # Every softmax of the graph gets the reason; publishing the report warns of it in one line.
        log.debug("fuse_attn: tracing or rewriting a graph failed; it compiles unchanged", exc_info=True)
        first_line = (str(e).strip().splitlines() or [""])[0]
        reason = f"its graph could not be traced or rewritten ({type(e).__name__}: {first_line}); compiled unchanged"
        verdicts = [SoftmaxVerdict(n.name, False, reason=reason) for n in gm.graph.nodes if _is_softmax_call(n)]
        return None, (GraphReport(verdicts, rewritten=False) if verdicts else None)


def analyze_only(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    """``fuse_attn.explain``'s backend: the rewrite's verdicts without the rewrite; the graph runs as Dynamo traced it
    (eagerly), and each time it runs, its report goes to the open :func:`fuse_attn.report.collect_explained`
    blocks -- so an ``explain()`` that finds the graph already compiled by an earlier one (a cache hit: the backend
    is not called again) still reports it. One function for the process: Dynamo keys its cache entries by the
    backend, so a backend made per call would add entries on every call, and past Dynamo's recompile limit (8 a
    function) the model would run uncompiled for every later compile too."""
    _, report = analyze_graph(gm, example_inputs, apply=False)
    return functools.partial(_run_reporting, gm.forward, report)


def _run_reporting(forward, report: Optional[GraphReport], *args):
    if report is not None:
        explained(report)
    return forward(*args)


def _is_trained(example_inputs: list[Any]) -> bool:
    """Whether AOTAutograd will build a backward for the graph (its test: grad mode on and an input that requires
    grad); an attention's implementation is then timed forward and backward together."""
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)


def trace_pre_autograd(gm: fx.GraphModule, example_inputs: list[Any],
                       buffers: Optional[list[bool]] = None) -> tuple[fx.GraphModule, MatchContext]:
    """Dynamo's graph as a pre-autograd ATen graph, plus the real values of its registered buffers (which
    placeholders are buffers: ``buffers``, by default read from Dynamo's metadata)."""
    buffers = _buffer_flags(gm) if buffers is None else buffers
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fake_inputs = [n.meta.get("example_value") for n in placeholders]
    mode = detect_fake_mode(fake_inputs)
    fake_inputs = [_as_fake_of(mode, x) for x in fake_inputs]
    # Interpreting under preserve_node_meta carries each node's stack trace (the user's source line) over.
    start = time.perf_counter()
    with fx_traceback.preserve_node_meta(), mode:
        traced = make_fx(_KeepAutogradFunctions(gm).run, pre_dispatch=True, tracing_mode="real")(*fake_inputs)
    _seconds["trace"] += time.perf_counter() - start
    # Values nobody uses (the averaged weights nn.MultiheadAttention computes and its caller drops) would count as
    # users of the attention weights; side-effecting nodes are kept by FX's own impurity rules.
    traced.graph.eliminate_dead_code()
    traced.recompile()
    traced_placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    constants = {}
    for is_buffer, traced_node, real in zip(buffers, traced_placeholders, example_inputs):
        if is_buffer and isinstance(real, torch.Tensor):
            constants[traced_node] = real
    needing_grad = frozenset(node for node, x in zip(traced_placeholders, example_inputs)
                             if isinstance(x, torch.Tensor) and x.requires_grad)
    return traced, MatchContext(constant_inputs=constants, gm=traced, inputs_needing_grad=needing_grad)


def _as_fake_of(mode, x: Any) -> Any:
    """Dynamo's fake input ``x`` as a fake tensor of ``mode``, the backend's (Dynamo hands each backend a fresh fake
    mode on the same ShapeEnv). A Python scalar Dynamo lifted to a 0-d tensor input (a float attribute that changed
    between calls: ``rms_norm_eps``, an attention's ``scaling``) keeps the symbol its ``.item()`` reads, its
    ``item_memo``: without it (``make_fx``'s own conversion drops it) the graph's ``.item()`` fails as
    data-dependent."""
    if not isinstance(x, torch.Tensor) or getattr(x, "fake_mode", None) is mode:
        return x
    converted = mode.from_tensor(x)
    memo = getattr(x, "item_memo", None)
    if memo is not None:
        converted.item_memo = memo
    return converted


def _checkpoint_regions(gm: fx.GraphModule) -> list[fx.Node]:
    """The ``torch.utils.checkpoint`` calls in Dynamo's graph (each runs a body subgraph, recomputed in the
    backward)."""
    return [n for n in gm.graph.nodes
            if n.op == "call_function" and n.target is torch.ops.higher_order.tag_activation_checkpoint]


def _analyze_checkpointed(gm: fx.GraphModule, example_inputs: list[Any], *, apply: bool, buffers: list[bool],
                          context_parallel: Optional[Any]) -> tuple[Optional[fx.GraphModule], Optional[GraphReport]]:
    """A graph with activation-checkpointed regions: each region's body is rewritten on its own (its inputs are
    the call's arguments) and put back in place, so the fused op is recomputed in the backward like the rest of
    the region. The graph around the regions stays Dynamo's: ``make_fx`` cannot re-trace the checkpoint call, so a
    softmax outside every region is reported and left alone."""
    regions = _checkpoint_regions(gm)
    verdicts, tables, rewritten = _analyze_parts(gm, example_inputs, buffers,
                                                 [(getattr(gm, r.args[0].target), r.args[1:]) for r in regions],
                                                 apply=apply, context_parallel=context_parallel)
    reason = "outside the activation-checkpointed regions of its graph: only softmaxes inside them are fused"
    verdicts += [SoftmaxVerdict(n.name, False, reason=reason) for n in gm.graph.nodes if _is_softmax_call(n)]

    def put_back():
        for i, body in rewritten.items():
            setattr(gm, regions[i].args[0].target, body)

    return _with_parts_put_back(gm, verdicts, tables, bool(rewritten), put_back, apply=apply)


def _analyze_parts(gm: fx.GraphModule, example_inputs: list[Any], buffers: list[bool], parts: list, *, apply: bool,
                   context_parallel: Optional[Any],
                   ) -> tuple[list[SoftmaxVerdict], list[TableLookup], dict[int, fx.GraphModule]]:
    """Each part of ``gm`` -- (a graph of its own, the nodes of ``gm`` its placeholders take) -- analyzed like any
    graph: a part's input is real where it is a graph input of ``gm`` (buffers' values are read), fake elsewhere.
    Returns the parts' verdicts and table lookups and, by the part's index, the rewritten graph of each part that
    the rewrite changed."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    real = dict(zip(placeholders, example_inputs))
    outer_buffer = dict(zip(placeholders, buffers))
    verdicts: list[SoftmaxVerdict] = []
    tables: list[TableLookup] = []
    rewritten_parts: dict[int, fx.GraphModule] = {}
    for i, (part, args) in enumerate(parts):
        rewritten, report = analyze_graph(part, [real[a] if a in real else a.meta.get("example_value") for a in args],
                                          apply=apply, buffers=[bool(outer_buffer.get(a, False)) for a in args],
                                          context_parallel=context_parallel)
        if report is not None:
            verdicts += report.verdicts
            tables += report.tables
        if rewritten is not None and report.changed:
            rewritten_parts[i] = rewritten
    return verdicts, tables, rewritten_parts


def _with_parts_put_back(gm: fx.GraphModule, verdicts: list[SoftmaxVerdict], tables: list[TableLookup], changed: bool,
                         put_back, *, apply: bool) -> tuple[Optional[fx.GraphModule], Optional[GraphReport]]:
    """``gm`` with its rewritten parts put back (``put_back()``, when ``apply`` and a part ``changed``) and the report
    of ``verdicts`` and ``tables`` -- or None where nothing was looked at or changed."""
    if not verdicts and not tables:
        return None, None
    if not (apply and changed):
        return None, GraphReport(verdicts, rewritten=False, tables=tables)
    before = gm.print_readable(print_output=False) if capture_requested() else None
    put_back()
    gm.recompile()
    after = gm.print_readable(print_output=False) if before is not None else None
    return gm, GraphReport(verdicts, before=before, after=after, tables=tables)


def _is_distributed_value(value: Any) -> bool:
    """A DTensor, or the device mesh (Dynamo hands it over as an opaque object) that DTensor code reads."""
    from torch._library.fake_class_registry import FakeScriptObject

    if isinstance(value, FakeScriptObject):
        return True
    if not torch.distributed.is_available():
        return False
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

    return isinstance(value, (DTensor, DeviceMesh))


def _touches_distributed_values(node: fx.Node) -> bool:
    """Whether the node takes or makes a DTensor or a device mesh (``from_local``, ``to_local``, ``redistribute``, an
    op on DTensor parameters), by the example values Dynamo recorded."""
    values = [node.meta.get("example_value")] + [a.meta.get("example_value") for a in node.all_input_nodes]
    return any(_is_distributed_value(v) for v in pytree.tree_leaves(values))


def _on_distributed_tensors(gm: fx.GraphModule) -> bool:
    return any(_touches_distributed_values(n) for n in gm.graph.nodes if n.op == "placeholder")


def _plain_regions(gm: fx.GraphModule) -> list[list[fx.Node]]:
    """The graph's nodes that touch no DTensor, in convex regions: each node's level counts the changes between
    DTensor and plain nodes on its longest path from the inputs, and the plain nodes of one level form a region --
    a path that leaves a region through a DTensor node comes back at least two levels up, so no region depends on
    itself through the rest of the graph. Under tensor parallelism (``parallelize_module``'s local outputs) the
    attention between the projections' ``to_local`` and the output projection's ``from_local`` is one region."""
    level: dict[fx.Node, int] = {}
    distributed: dict[fx.Node, bool] = {}
    regions: dict[int, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        distributed[node] = _touches_distributed_values(node)
        level[node] = max((level[a] + (distributed[a] != distributed[node]) for a in node.all_input_nodes),
                          default=0)
        if not distributed[node] and node.op not in ("placeholder", "output"):
            regions.setdefault(level[node], []).append(node)
    return list(regions.values())


def _analyze_plain_regions(gm: fx.GraphModule, example_inputs: list[Any], *, apply: bool, buffers: list[bool],
                           context_parallel: Optional[Any]) -> tuple[Optional[fx.GraphModule], Optional[GraphReport]]:
    """A graph holding DTensors (tensor parallelism): ``make_fx(pre_dispatch=True)`` cannot trace DTensor code, so
    each plain region with a softmax (:func:`_plain_regions`) is cut out as a graph of its own, rewritten like any
    graph (:func:`_analyze_parts`), and put back as a call of the rewritten graph. The DTensor code around stays
    Dynamo's, which AOTAutograd traces as usual. A softmax on DTensors (``parallelize_module`` with DTensor outputs)
    is reported and left alone."""
    on_dtensors = "a softmax on DTensors: only attentions on local tensors are fused"
    verdicts = [SoftmaxVerdict(n.name, False, reason=on_dtensors)
                for n in gm.graph.nodes if _is_softmax_call(n) and _touches_distributed_values(n)]
    regions = []  # (its name, its nodes, the region cut out as a graph, the nodes it reads, the nodes read of it)
    for i, nodes in enumerate(_plain_regions(gm)):
        if _any_attention_candidate(nodes):
            name = f"fuse_attn_plain_region_{i}"
            regions.append((name, nodes, *fuse_as_graphmodule(gm, nodes, name, always_return_tuple=True)))
    part_verdicts, tables, rewritten = _analyze_parts(gm, example_inputs, buffers,
                                                      [(region, inputs) for _, _, region, inputs, _ in regions],
                                                      apply=apply, context_parallel=context_parallel)

    def put_back():
        for i, body in rewritten.items():
            name, nodes, _, inputs, outputs = regions[i]
            gm.add_submodule(name, body)
            with gm.graph.inserting_after(nodes[-1]):
                call = gm.graph.call_module(name, args=tuple(inputs))
            with gm.graph.inserting_after(call):
                for j, out in enumerate(outputs):
                    out.replace_all_uses_with(gm.graph.call_function(operator.getitem, (call, j)), propagate_meta=True)
            for node in reversed(nodes):
                gm.graph.erase_node(node)
        _sort_topologically(gm.graph)
        gm.graph.lint()

    return _with_parts_put_back(gm, verdicts + part_verdicts, tables, bool(rewritten), put_back, apply=apply)


def _sort_topologically(graph: fx.Graph) -> None:
    """Reorders the graph's nodes so that each comes after its inputs, keeping the given order where it can (the
    earliest ready node first). In place: torch's ``stable_topological_sort`` copies the nodes, which drops the
    ``_dynamo_source`` that AOTAutograd reads from Dynamo's placeholders."""
    nodes = list(graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    waiting = {node: len(set(node.all_input_nodes)) for node in nodes}
    ready = [(position[n], n) for n in nodes if waiting[n] == 0]
    heapq.heapify(ready)
    previous = None
    while ready:
        _, node = heapq.heappop(ready)
        if previous is not None and previous.next is not node:
            previous.append(node)
        previous = node
        for user in node.users:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, (position[user], user))


def _buffer_flags(gm: fx.GraphModule) -> list[bool]:
    return [_is_registered_buffer(n) for n in gm.graph.nodes if n.op == "placeholder"]


def _is_registered_buffer(node: fx.Node) -> bool:
    """A module buffer (read at compile time when a mask is built from it; buffers are not mutated in forward)."""
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    return source is not None and "._buffers[" in source.name


def _is_softmax_call(node: fx.Node) -> bool:
    """A softmax in Dynamo's graph, however it is spelled (not log_softmax: losses are no attention)."""
    name = str(node.target).lower()
    return node.op in ("call_function", "call_method", "call_module") and "softmax" in name and "log_softmax" not in name


def _mentions_softmax(gm: fx.GraphModule) -> bool:
    """Cheap pre-check on Dynamo's graph: without a softmax there is nothing to fuse."""
    return _any_attention_candidate(gm.graph.nodes)


def _looks_up_a_few_row_table(gm: fx.GraphModule) -> bool:
    """Whether Dynamo's graph looks up a trained embedding table that the table gradient handles (``F.embedding``,
    an ``nn.Embedding`` inlined): such a graph is traced for the table's gradient even without a softmax (a graph
    break can put T5's position-bias lookup apart from its attentions)."""
    from fuse_attn.kernels import embedding_backward

    for node in gm.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "__name__", "") == "embedding" and len(node.args) > 1:
            weight = node.args[1].meta.get("example_value") if isinstance(node.args[1], fx.Node) else None
            if isinstance(weight, torch.Tensor) and weight.requires_grad and embedding_backward.handles(weight):
                return True
    return False


def _any_attention_candidate(nodes) -> bool:
    """Whether a softmax is among Dynamo's ``nodes``, or one spelled out (an ``exp`` and a ``sum``, ``logsumexp`` or
    ``log_softmax``: :mod:`fuse_attn.graph.softmax_spellings`). Dynamo keeps some functions whole
    (``F.multi_head_attention_forward``), so a call named after attention counts too."""
    nodes = list(nodes)
    if any(_is_softmax_call(node) or (node.op == "call_function" and "attention" in str(node.target).lower())
           for node in nodes):
        return True
    called = {node.target if node.op == "call_method" else getattr(node.target, "__name__", None)
              for node in nodes if node.op in ("call_function", "call_method")}
    return "exp" in called and bool(called & {"sum", "logsumexp", "log_softmax"})


class _KeepAutogradFunctions(fx.Interpreter):
    """Runs Dynamo's graph for ``make_fx``, keeping each custom ``torch.autograd.Function`` one node.

    Dynamo hands a custom Function over as ``autograd_function_apply(fwd_body, bwd_body, *args)``. Traced like
    any op, its forward would be inlined and AOTAutograd would differentiate that forward instead of running the
    user's backward -- a different gradient whenever the backward is not the exact derivative (Bloom's GELU). So
    the call is recorded as it is, with its two bodies, as a higher-order op does under tracing
    (``torch/_higher_order_ops/cond.py``'s ``trace_cond``); AOTAutograd then runs the user's backward, as it does
    for Dynamo's own graph.
    """

    def call_function(self, target, args, kwargs):
        mode = get_proxy_mode()
        if target is not torch.ops.higher_order.autograd_function_apply or mode is None:
            return super().call_function(target, args, kwargs)
        with disable_proxy_modes_tracing():
            out = target(*args, **kwargs)
        tracer = mode.tracer
        for body in args[:2]:  # the bodies become submodules of the traced graph (get_attr nodes)
            tracer.root.register_module(f"autograd_function_body_{len(list(tracer.root.children()))}", body)
        proxy_args, proxy_kwargs = pytree.tree_map(tracer.unwrap_proxy, (args, kwargs))
        out_proxy = tracer.create_proxy("call_function", target, proxy_args, proxy_kwargs)
        return track_tensor_tree(out, out_proxy, constant=None, tracer=tracer)


@functools.lru_cache(maxsize=None)
def source_digest() -> str:
    """sha256 of every source and template file of the package (the matcher, the op wiring, the kernels)."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".tmpl")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def settings_digest() -> str:
    """sha256 of every ``FUSE_ATTN_*`` environment setting: under torch.compile the ops' bodies run while tracing, so
    these settings (tile summaries, candidates, exact delta, specialization, tuning) shape the compiled code."""
    return hashlib.sha256(repr(settings.environment_settings()).encode()).hexdigest()


class PostGradPass(CustomGraphPass):
    """Inductor's post-grad pass: the Gluon forward's calls become its twin without an autograd formula
    (``flash_attention_hopper_no_autograd``), as AOTAutograd is done with the graph. Its uuid puts the package's
    source digest and its environment settings into Inductor's and AOTAutograd's cache keys."""

    def __call__(self, graph: fx.Graph) -> None:
        for node in graph.nodes:
            if node.op == "call_function" and str(node.target) == "fuse_attn.flash_attention_hopper.default":
                node.target = torch.ops.fuse_attn.flash_attention_hopper_no_autograd.default

    def uuid(self) -> str:
        return f"{source_digest()}:{settings_digest()}"


def _inductor_mode_options(mode: Any) -> dict:
    if mode is None or mode == "default":
        return {}
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode))


def capture_requested() -> bool:
    from fuse_attn.report import collectors

    return bool(collectors)


