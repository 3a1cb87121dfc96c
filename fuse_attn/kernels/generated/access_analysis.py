"""torch's analysis of which arguments a traced kernel writes, done once per generated kernel and argument signature.

A kernel launched through ``torch.library.wrap_triton`` is analysed by torch every time a launch of it is
functionalized (AOTAutograd's trace) and again when Inductor lowers it: Triton's front end turns the kernel into TTIR
and torch reads the stores off it (``torch._higher_order_ops.triton_kernel_wrap``: ``identify_mutated_tensors`` in
torch 2.11, ``identify_accessed_tensors`` in 2.13). Of each argument that analysis sees only its kind
(``generate_ttir``): a tensor's dtype, a symbolic value as one placeholder, any other value as it is. So for one
kernel and one such signature its answer never changes, while a model launches the same kernels with the same
signature in every layer, each launch analysed at least twice. Here the answer for the kernels this package launches
(:func:`remember`) is kept per (kernel, signature, TMA metadata); other kernels are analysed by torch as before.
"""

from __future__ import annotations

import copy
import functools
import threading
from typing import Any, Callable, Optional

import torch

_ANALYSES = ("identify_mutated_tensors", "identify_accessed_tensors")

_ours: set = set()
_answers: dict = {}
_lock = threading.Lock()


def remember(kernel):
    """``kernel``, whose write analysis is from now on kept per signature (the analysis is wrapped at the first)."""
    if kernel not in _ours:
        with _lock:
            if not _ours:
                _wrap_torchs_analysis()
            _ours.add(kernel)
    return kernel


def _wrap_torchs_analysis() -> None:
    from torch._higher_order_ops import triton_kernel_wrap

    for name in _ANALYSES:
        analysis = getattr(triton_kernel_wrap, name, None)
        if analysis is not None and not hasattr(analysis, "analysis_of_each_signature"):
            setattr(triton_kernel_wrap, name, _kept_per_signature(analysis))


def _kept_per_signature(analysis: Callable) -> Callable:
    @functools.wraps(analysis)
    def kept(kernel, kwargs, tma_descriptor_metadata, *args, **kw):
        key = None if args or kw else _key(kernel, kwargs, tma_descriptor_metadata)
        if key is None:
            return analysis(kernel, kwargs, tma_descriptor_metadata, *args, **kw)
        answer = _answers.get(key)
        if answer is None:
            answer = _answers[key] = analysis(kernel, kwargs, tma_descriptor_metadata)
        return copy.deepcopy(answer)  # (the callers' to change)

    kept.analysis_of_each_signature = analysis
    return kept


def _key(kernel, kwargs: dict, tma_descriptor_metadata) -> Optional[tuple]:
    """What torch's analysis reads of a launch of one of our kernels; None for other kernels, or where some value
    cannot be a key. A launch with options (``num_warps``, ``num_stages``: every launch with a config) reaches the
    analysis as a new single-config ``Autotuner`` around our kernel each time (torch's ``TritonHOPifier``), so the
    kernel is ours inside it and its configs are part of the key: without that every launch was analysed anew, 18
    TTIR generations of 0.1-0.5 s each for three chained attentions' forward and backward on a CPU host."""
    configs = None
    if kernel not in _ours:
        inner = getattr(kernel, "fn", None)  # (an Autotuner's kernel)
        configs = getattr(kernel, "configs", None)
        if configs is None or inner not in _ours:
            return None
        kernel, configs = inner, tuple(str(config) for config in configs)
    try:
        key = (kernel, configs, tuple((name, _kind(value)) for name, value in sorted(kwargs.items())),
               repr(sorted((tma_descriptor_metadata or {}).items())))
        hash(key)
        return key
    except TypeError:
        return None


def _kind(value: Any) -> Any:
    import sympy

    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, sympy.Expr)):
        return ("symbolic",)
    if isinstance(value, torch.Tensor) or hasattr(value, "get_dtype"):  # (Inductor's TensorBox)
        from torch._subclasses.fake_tensor import FakeTensor

        dtype = value.dtype if isinstance(value, torch.Tensor) else value.get_dtype()
        # torch's analysis reads a fake tensor (the trace's) and a TensorBox (Inductor's lowering) alike, as an empty
        # tensor of its dtype: one answer serves both. Other tensors it reads as they are.
        if isinstance(value, FakeTensor) or type(value).__name__ == "TensorBox":
            return ("tensor", "placeholder", dtype)
        return ("tensor", type(value).__name__, dtype)
    return ("value", type(value).__name__, value)
