"""Every setting of fuse_attn in one place: the backend's ``torch.compile`` options and the ``FUSE_ATTN_*``
environment variables.

Environment variables are read on every call, not at import, so a process (or a test) may change them between
compiles. Under torch.compile the ops' bodies run while tracing, so these settings shape the compiled code: the
backend folds all of them but the cache directory into Inductor's cache key (:func:`environment_settings`).
"""

from __future__ import annotations

import os
from typing import Optional

# ---- options: torch.compile(model, backend="fuse_attn", options={...}) ------------------------------------------------
OPTION_ENABLED = "fuse_attn.enabled"  # False: no rewriting, plain Inductor
OPTION_LOG_ONLY = "fuse_attn.log_only"  # True: match and log, but compile the graph unchanged
# a fuse_attn.graph.context_parallel.ContextParallel: the graph's sequence is sharded over ranks; attentions run as a ring
OPTION_CONTEXT_PARALLEL = "fuse_attn.context_parallel"

# ---- environment variables -------------------------------------------------------------------------------------------
PREFIX = "FUSE_ATTN_"  # every environment setting of the package starts with it
DISABLE = "FUSE_ATTN_DISABLE"  # 1: every rewrite off (for bisecting)
CANDIDATES = "FUSE_ATTN_CANDIDATES"  # comma-separated implementations the tuner may time (kernels.dispatch)
AUTOTUNE = "FUSE_ATTN_AUTOTUNE"  # 0: take the first config that launches, untimed
CACHE = "FUSE_ATTN_CACHE"  # 0: no tuning results read from or written to disk
CACHE_DIR = "FUSE_ATTN_CACHE_DIR"  # where tuning results and generated kernels live
SPECIALIZE = "FUSE_ATTN_SPECIALIZE"  # 0: generated kernels take every run-time argument unspecialized
MASK_BLOCKS = "FUSE_ATTN_MASK_BLOCKS"  # 0: no per-call tile summaries of a mask tensor
EXACT_DELTA = "FUSE_ATTN_EXACT_DELTA"  # 1: fp16 / bf16 backward takes delta from P and dP, as fp32 does


def _flag(name: str, default: str) -> str:
    return os.environ.get(name, default)


def disabled() -> bool:
    return _flag(DISABLE, "0") == "1"


def candidates_text() -> Optional[str]:
    """``FUSE_ATTN_CANDIDATES`` as set (None: unset); :func:`fuse_attn.kernels.dispatch.allowed_candidates` parses it."""
    return os.environ.get(CANDIDATES)


def autotune_timed() -> bool:
    return _flag(AUTOTUNE, "1") != "0"


def disk_cache_enabled() -> bool:
    return _flag(CACHE, "1") != "0"


def cache_dir() -> str:
    """``$FUSE_ATTN_CACHE_DIR``, else ``$XDG_CACHE_HOME/fuse_attn``, else ``~/.cache/fuse_attn``."""
    explicit = os.environ.get(CACHE_DIR)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fuse_attn")


def specialized() -> bool:
    """False under ``FUSE_ATTN_SPECIALIZE=0``: the launched kernels are generated without value specialization."""
    return _flag(SPECIALIZE, "1") != "0"


def mask_blocks_enabled() -> bool:
    """``FUSE_ATTN_MASK_BLOCKS=0`` turns the per-call tile summaries of a mask tensor off: every tile then loads the
    mask and runs the score program (the same results; for measuring what the summaries save)."""
    return _flag(MASK_BLOCKS, "1") != "0"


def exact_delta_forced() -> bool:
    """``FUSE_ATTN_EXACT_DELTA=1``: the backward takes delta = rowsum(P * dP) from P and dP for fp16 / bf16 too (as
    for fp32), at the cost of one more pass over K and V in the dQ kernel (two more matmuls per tile)."""
    return _flag(EXACT_DELTA, "0") == "1"


def interpreting() -> bool:
    """True under Triton's interpreter (``TRITON_INTERPRET=1``): kernels run on CPU tensors, untimed."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def environment_settings() -> list[tuple[str, str]]:
    """Every ``FUSE_ATTN_*`` variable set in this process that may shape the compiled code, sorted: all but
    ``FUSE_ATTN_CACHE_DIR``, which says where the caches are, not what is compiled, so that processes each given a
    directory of their own share Inductor's and AOTAutograd's entries. (A tuning result read from a directory is no
    more part of the key than one read from the default.)"""
    return sorted((name, value) for name, value in os.environ.items() if name.startswith(PREFIX) and name != CACHE_DIR)
