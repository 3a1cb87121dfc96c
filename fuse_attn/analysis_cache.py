"""The backend's analysis of a graph kept on disk: a second process compiling the same graph skips it.

The analysis (``fuse_attn.backend.analyze_graph``: the pre-autograd trace, the matching, the implementation choice)
took 1.2 s of BERT-base's 5.2 s warm first step on an H200 host and 1.8 s of GPT-2 small's 9.7 s, where
``torch.compile`` default took 4.3 s and 7.5 s: Inductor's and AOTAutograd's caches make the rest of a warm compile
cheap, and this is what fuse_attn adds to it. Its result, the rewritten graph and the report, depends only on

* Dynamo's graph: its code and the operators it calls (graphs holding modules or attributes are not kept);
* the inputs' metadata (shape, strides, dtype, device, whether each requires grad) and the values of the registered
  buffers, from which the rewrite evaluates masks (graphs with symbolic sizes or tensor subclasses are not kept);
* this package's sources and ``FUSE_ATTN_*`` settings, torch's and Triton's versions, the GPU;
* the ambient state that changes what the trace or the choice sees: grad mode, autocast, TF32, deterministic
  algorithms, cuDNN's version, which of SDPA's kernels are enabled, and whether the graph replays as CUDA graphs.

All of it goes into the key. An entry is the rewritten graph as plain data (each node's operator or function by name,
its arguments, its user source line, the values of the tensor constants it reads; ``GraphModule``'s own pickling
traces the code again, evaluating calls without tensor arguments into constants) and the report. The process that
stores an entry compiles the graph rebuilt from it, so that both processes hand Inductor the same graph (the same
AOTAutograd and FX-graph cache keys). Entries live beside the tuning cache (``FUSE_ATTN_CACHE_DIR``) and are off with
it (``FUSE_ATTN_CACHE=0``); an entry that does not load is ignored with a warning and replaced.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import pickle
import tempfile
from typing import Any, Optional

import torch
import torch.fx as fx

from fuse_attn import settings
from fuse_attn.kernels.tuning import device_identity, software_versions

log = logging.getLogger("fuse_attn")

# Registered buffers are hashed into the key, and the rewritten graph's tensor constants copied into its entry; a graph
# whose buffers, or constants, are larger than this is analysed every time. 16 MiB (a causal mask of N=4096, bool)
# copies and hashes in about 20 ms on a 2-core CPU host, a tenth of the smallest analysis this cache saves (0.2 s, tiny
# GPT-2 on that host); more would eat into it.
MAX_COPIED_BYTES = 16 << 20
_FORMAT = 1  # bumped when an entry's layout changes


def analysis_key(gm: fx.GraphModule, example_inputs: list[Any], buffers: list[bool], *, cuda_graphs: bool,
                 sources: str) -> Optional[str]:
    """The key of ``gm``'s analysis, or None where it is not kept (see the module's docstring); ``sources``: the
    package's source and settings digest."""
    if not settings.disk_cache_enabled():
        return None
    digest = hashlib.sha256()

    def add(*parts: Any) -> None:
        digest.update(repr(parts).encode())

    add(_FORMAT, sources, software_versions(), gm.code)
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            return _not_kept(f"Dynamo's graph has a {node.op} node ({node.target})")
        if node.op == "call_function":
            add(getattr(node.target, "__module__", None), getattr(node.target, "__qualname__", repr(node.target)))
    hashed_bytes = 0
    for x, is_buffer in zip(example_inputs, buffers):
        if isinstance(x, torch.Tensor):
            if type(x) not in (torch.Tensor, torch.nn.Parameter):
                return _not_kept(f"an input is a {type(x).__name__}")
            if not _static(x) or getattr(x, "item_memo", None) is not None:
                return _not_kept("an input has symbolic sizes or stands for a Python scalar")
            add("tensor", tuple(x.shape), x.stride(), x.storage_offset(), x.dtype, x.device, x.requires_grad,
                is_buffer)
            if x.is_cuda:
                add(device_identity(x.device))
            if is_buffer:
                hashed_bytes += x.numel() * x.element_size()
                if hashed_bytes > MAX_COPIED_BYTES:
                    return _not_kept(f"its buffers hold more than {MAX_COPIED_BYTES} bytes")
                digest.update(_value_bytes(x))
        elif isinstance(x, (bool, int, float)):  # (a SymInt is none of them)
            add(type(x).__name__, x)
        else:
            return _not_kept(f"an input is a {type(x).__name__}")
    add(torch.is_grad_enabled(), cuda_graphs, torch.are_deterministic_algorithms_enabled(),
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(), torch.backends.cudnn.version(),
        # (SDPA's kernels switched off are no candidates of the implementation choice)
        torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled(),
        torch.backends.cuda.mem_efficient_sdp_enabled(), torch.backends.cuda.math_sdp_enabled(),
        [(device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)) for device in ("cpu", "cuda")])
    return digest.hexdigest()


def load(key: str) -> Optional[tuple[fx.GraphModule, Any]]:
    """The (rewritten graph, report) stored under ``key``; None where there is none, or it does not load (warned)."""
    path = _path(key)
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError:
        return None
    try:
        stored_format, nodes, report = pickle.loads(blob)
        if stored_format != _FORMAT:
            raise ValueError(f"format {stored_format}, not {_FORMAT}")
        return _graph_of(nodes), report
    except Exception as e:  # noqa: BLE001 -- any entry that does not load is analysed again and replaced
        log.warning("fuse_attn: ignoring the stored analysis %s (%s: %s); analysing the graph again", path,
                    type(e).__name__, e)
        return None


def stored(key: str, gm: fx.GraphModule, report: Any) -> fx.GraphModule:
    """Store ``gm`` (rewritten) and ``report`` under ``key``; return the graph to compile: the stored one as a later
    process loads it, or ``gm`` itself where it cannot be stored (then nothing is)."""
    nodes = _nodes_of(gm)
    if nodes is None:
        return gm
    try:
        blob = pickle.dumps((_FORMAT, nodes, report))
    except Exception as e:  # noqa: BLE001 -- a report that does not pickle: not kept
        _not_kept(f"{type(e).__name__}: {e}")
        return gm
    path = _path(key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", dir=os.path.dirname(path), delete=False) as f:
            f.write(blob)
        os.replace(f.name, path)
    except OSError as e:
        _not_kept(str(e))
        return gm
    return _graph_of(nodes)


# ---- the rewritten graph as plain data ------------------------------------------------------------------------------
# A rewritten pre-autograd graph holds placeholders, tensor constants, calls of operator overloads (ATen's, this
# package's) and of a few functions (below), and one output; the arguments are nodes and plain values. A graph
# with anything else is not kept.
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


class _Ref(tuple):
    """A reference to the node of that name, in stored arguments."""


def _nodes_of(gm: fx.GraphModule) -> Optional[list]:
    nodes = []
    constant_bytes = 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            target = node.target
        elif node.op == "get_attr":  # a tensor the trace made a constant (``torch.tensor(...)`` in the model's code)
            value = getattr(gm, node.target, None) if "." not in node.target else None
            if type(value) is not torch.Tensor:
                return _not_kept(f"the rewritten graph reads {node.target}, a {type(value).__name__}")
            constant_bytes += value.numel() * value.element_size()
            if constant_bytes > MAX_COPIED_BYTES:
                return _not_kept(f"its constants hold more than {MAX_COPIED_BYTES} bytes")
            target = ("constant", node.target, _detached_on_cpu(value), value.device)
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            target = ("op", node.target._schema.name, node.target._overloadname)
        elif node.op == "call_function" and _function_name(node.target) is not None:
            target = ("function", *_function_name(node.target))
        else:
            return _not_kept(f"the rewritten graph calls {node.op} {node.target}")
        try:
            args, kwargs = _plain(node.args), _plain(node.kwargs)
        except TypeError as e:
            return _not_kept(f"{node.name}: {e}")
        nodes.append((node.op, node.name, target, args, kwargs, node.meta.get("stack_trace")))
    return nodes


# Besides operator overloads, a pre-dispatch trace calls functions of these modules: ``operator.getitem`` of a
# multi-output op, ``torch._C._set_grad_enabled`` around a ``torch.no_grad()`` region (rotary embeddings),
# ``torch.amp.autocast_mode._enter_autocast`` / ``_exit_autocast`` around an autocast region. They are kept by module
# and name; torch's version is in the key.
_FUNCTION_MODULES = ("operator", "_operator", "torch._C", "torch.amp.autocast_mode")


def _function_name(fn: Any) -> Optional[tuple[str, str]]:
    """(module, name) of a function of :data:`_FUNCTION_MODULES` that the name finds again; else None."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if module not in _FUNCTION_MODULES or name is None:
        return None
    return (module, name) if _function_of(module, name) is fn else None


def _function_of(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name, None)


def _plain(value: Any) -> Any:
    if isinstance(value, fx.Node):
        return _Ref((value.name,))
    if isinstance(value, list):  # (FX's immutable_list too)
        return [_plain(v) for v in value]
    if type(value) is tuple:
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):  # (FX's immutable_dict too)
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(_plain(value.start), _plain(value.stop), _plain(value.step))
    if isinstance(value, _PLAIN):
        return value
    return _unsupported(value)


def _unsupported(value: Any):
    raise TypeError(f"not kept: an argument of type {type(value).__name__}")


def _graph_of(nodes: list) -> fx.GraphModule:
    graph = fx.Graph()
    made: dict[str, fx.Node] = {}
    constants: dict[str, torch.Tensor] = {}

    def node_values(value: Any) -> Any:
        if isinstance(value, _Ref):
            return made[value[0]]
        if isinstance(value, (list, tuple)):
            return type(value)(node_values(v) for v in value)
        if isinstance(value, dict):
            return {k: node_values(v) for k, v in value.items()}
        if isinstance(value, slice):
            return slice(node_values(value.start), node_values(value.stop), node_values(value.step))
        return value

    for op, name, target, args, kwargs, stack_trace in nodes:
        if op == "get_attr":
            _, target, value, device = target
            constants[target] = value.to(device)
        elif op == "call_function":
            if target[0] == "op":
                namespace, op_name = target[1].split("::")
                target = getattr(getattr(getattr(torch.ops, namespace), op_name), target[2])
            else:
                target = _function_of(*target[1:])
        node = graph.create_node(op, target, node_values(args), node_values(kwargs), name=name)
        if node.name != name:
            raise ValueError(f"node {name} came back as {node.name}")
        if stack_trace is not None:
            node.meta["stack_trace"] = stack_trace
        made[name] = node
    return fx.GraphModule(constants, graph)


def _not_kept(reason: str) -> None:
    log.debug("fuse_attn: the analysis of a graph is not kept: %s", reason)
    return None


def directory() -> str:
    """Where the entries are: ``analysis`` in the cache directory."""
    return os.path.join(settings.cache_dir(), "analysis")


def _path(key: str) -> str:
    return os.path.join(directory(), f"{key}.pickle")


def _static(x: torch.Tensor) -> bool:
    return all(isinstance(n, int) for n in (*x.shape, *x.stride(), x.storage_offset()))


def _detached_on_cpu(x: torch.Tensor) -> torch.Tensor:
    """A copy of real tensor ``x`` on the CPU, outside any fake or tracing mode."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch.no_grad():
        return x.detach().to("cpu", copy=True)


def _value_bytes(x: torch.Tensor) -> bytes:
    """``x``'s values as bytes, with no copy of a CPU tensor beyond the bytes' own (outside any fake or tracing mode)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch.no_grad():
        flat = x.detach().to("cpu").contiguous().reshape(-1)
        return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
