"""Launch configurations of the attention kernels and the run-time tuner, whose choices persist on disk.

A :class:`KernelConfig` is (BLOCK_M, BLOCK_N, num_warps, num_stages). The candidates of a kernel come from a small
space pruned by the GPU's shared memory, the head dim and causality. :func:`tune` returns the config of a
:class:`TuningKey` (GPU, compute capability, Triton and torch versions, kernel, dtype, head dims, power-of-two
buckets of M and N): from this process's memory, else the disk cache, else by timing every candidate with
``triton.testing.do_bench`` on random inputs of the call's shapes and timing the fastest few again for longer.
Under the Triton interpreter each kernel has one config (:data:`INTERPRETER_CONFIGS`): nothing is timed there.
A candidate that fails to compile or launch is dropped with an INFO line on the ``fuse_attn.kernels.tuning``
logger, which also logs each tuning before and after.

Disk cache (:func:`cache_file`, under :func:`fuse_attn.settings.cache_dir`): one JSON file per GPU, compute
capability, Triton and torch version -- the part of the key that decides whether a stored time means anything --
holding ``format`` (:data:`FORMAT_VERSION`), that identity and ``entries`` (the rest of the key -> the candidate
and its time in ms). Unusable files and entries are ignored with a warning and dropped by the next write; a stored
config that is no longer a candidate is re-tuned. Writes are atomic (a temp file ``os.replace``-d over the old one)
and merged under ``fcntl.flock`` on ``<file>.lock``, so processes tuning at once keep each other's entries.

The same machinery chooses the implementation of an attention (:class:`Implementation`, timed by
:func:`fuse_attn.kernels.dispatch.choose_implementation`): its entries hold a name instead of a config.

Environment: ``FUSE_ATTN_AUTOTUNE=0`` takes the first candidate that compiles and runs, untimed (kept in memory
under a key of its own, never written to disk); ``FUSE_ATTN_CACHE=0`` keeps choices in memory only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import json
import logging
import os
import re
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

import torch

from fuse_attn import settings
from fuse_attn.kernels import compile_workers

try:
    import fcntl
except ImportError:  # Windows: no flock; writes stay atomic, concurrent writers may drop each other's entries
    fcntl = None

log = logging.getLogger("fuse_attn.kernels.tuning")

try:  # Triton's own hook for compiling kernels on an executor (private; where it is missing, candidates compile
    # one by one as they are timed)
    from triton.runtime._async_compile import AsyncCompileMode
except ImportError:
    AsyncCompileMode = None


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    block_m: int  # query rows per tile
    block_n: int  # key columns per tile
    num_warps: int
    num_stages: int  # software-pipelining depth of the inner loop's loads
    # dK/dV kernel only: 1, one launch computes dK and dV; 2, one launch computes dV and another dK (2 + 3 matmuls a
    # tile instead of 4, for one fp32 accumulator per program instead of two: wide heads)
    dkdv_launches: int = 1

    def __str__(self) -> str:
        split = "" if self.dkdv_launches == 1 else f" dkdv_launches={self.dkdv_launches}"
        return f"BLOCK_M={self.block_m} BLOCK_N={self.block_n} warps={self.num_warps} stages={self.num_stages}{split}"


@dataclasses.dataclass(frozen=True)
class Implementation:
    """An implementation of a matched attention as a tuning candidate (the generated kernels, the Gluon kernels or
    one of SDPA's, :mod:`.dispatch`): timed, stored and read back like a config."""

    name: str

    def __str__(self) -> str:
        return self.name


Candidate = Union[KernelConfig, Implementation]  # what the tuner times and a tuning key's entry holds


# One config per kernel under the interpreter. Small blocks keep each interpreted program cheap, and
# BLOCK_M != BLOCK_N makes the tests cross the causal diagonal at block boundaries that are not aligned.
INTERPRETER_CONFIGS = {
    "fwd": KernelConfig(32, 16, 4, 1),
    "bwd_dq": KernelConfig(32, 16, 4, 1),
    "bwd_dkdv": KernelConfig(16, 32, 4, 1),  # (query rows, key rows) per step of the dK/dV loop
    # split-K decode (generated/decode.py): block_m is the packed-row tile, set by the launcher from the rows
    "decode": KernelConfig(16, 16, 4, 1),
}

# Candidate axes. Tensor-core tiles want multiples of 16 rows per warp (mma m16); Hopper's wgmma issues
# 64-row tiles per 4-warp group, so BLOCK_M in {64, 128} with 4 or 8 warps are the shapes FA2/FA3 and Triton's
# fused-attention tutorial use on sm80/sm90; stages 2-3 cover their pipelining depths for attention.
_FWD_BLOCK_M = (64, 128)
_FWD_BLOCK_N = (32, 64, 128)
_WARPS = (4, 8)
_STAGES = (2, 3)
# Backward, dK/dV kernel: the key block stays resident (k, v, dk, dv), the query block streams; Triton's
# tutorial uses (BLOCK_M, BLOCK_N) = (32, 128) there and (128, 32) for dQ (the resident side is the large one).
# 64 x 64 (on 4 warps, two programs an SM): the fastest of a sweep of 26 dK/dV configs at head dim 96 = 64 + 32
# (H100, Triton 3.6, causal B4 H16 N4096): 0.981 ms against 1.077 for 64 x 128.
_DKDV_SHAPES = ((32, 128), (64, 128), (64, 64))
_DQ_SHAPES = ((128, 32), (128, 64))
# Heads wider than 128 (Gemma-2's 256): a resident fp32 accumulator is 256 columns wide, so the resident side
# shrinks to 32-64 rows, given as (BLOCK_M, BLOCK_N, warps[, dK/dV launches]). From a sweep of 30 configs (H200,
# Triton 3.6, softcap + causal, B4 H8 N4096 D256): dK/dV with 64 resident rows needs 8 warps (4 warps spill
# 258-410 registers and run 2-3x slower; 8 warps hold the two 64 x 256 accumulators in 128 registers a thread, as
# FA2's 8-warp head-dim-256 backward does); dQ runs fastest on 4 warps.
# dK and dV in two launches (one accumulator each) hold 128 resident keys: in a sweep of 24 such configs (H100,
# Triton 3.6, causal B4 H8 N4096 D256, MHA and GQA 2) 32 x 128 on 8 warps ran the kernel in 1.56 / 1.63 ms against
# 2.70 / 2.45 ms for the fastest one-launch config, with no spills; 16 x 128 on 8 warps and 32 x 64 on 4 warps came
# next; 64 query rows a step, or head dim 128, ran slower.
# dQ holds one such accumulator too: 128 resident rows on 8 warps (128 x 32, 3 stages) ran it in 0.75 ms against
# 0.97 for 64 x 16 on 4 warps, no spills (the same H100 sweep; 128 x 64 fits only unpipelined).
_WIDE_DKDV = ((32, 64, 8), (16, 64, 8), (32, 32, 4), (16, 32, 4), (32, 128, 8, 2), (16, 128, 8, 2), (32, 64, 4, 2))
_WIDE_DQ = ((64, 32, 4), (64, 16, 4), (32, 64, 4), (32, 32, 4), (128, 32, 8))
_WIDE_HEAD = 128  # head dims above this take the _WIDE_ configs
# Heads wider than 256 (Gemma-4's global layers: 512): a 512-wide fp32 accumulator tile leaves room for 16-64 rows.
# From a timed sweep of 45 such tiles at every depth that compiled (H200, Triton 3.6, bf16, causal, B2 H8/2 N4096
# D512; the tuner's own timings): the forward's 64 x 32 on 8 warps, 2 stages, ran 1.40 ms (64 x 64 on 8 unpipelined
# 1.56, 32 x 32 on 4 warps 1.70, 64 x 16 on 8 2.00; 16 x 32 on 4, 2.43; 64 rows on 4 warps 4.6-5.9, 128 rows
# 5.1-6.0) -- the fastest spills 496 bytes a thread (cuobjdump -res-usage of its sm90 compile, Triton 3.9), so
# spills do not rule a tile out here. dK/dV in two launches (one accumulator each), unpipelined: 32 x 64 on 8 warps
# 4.54 ms, 64 x 32 on 8 5.47, 32 x 32 on 4 5.90 (16 x 64 on 8 at 3 stages 4.89; one launch at best 5.29, 32 x 32 on
# 8); 32 x 64 at 2 stages does not fit (262,400 bytes: k and v resident, q and dO twice). dQ: 32 x 32 on 4 warps at 3
# stages 2.55 ms, 16 x 32 on 4 3.01, 64 x 16 on 8 3.12 (64 x 32 exceeds the shared memory).
_WIDEST_FWD = ((64, 32, 8), (32, 32, 4), (64, 16, 8), (16, 32, 4))
_WIDEST_DKDV = ((32, 64, 8, 2), (64, 32, 8, 2), (32, 32, 4, 2))
_WIDEST_DQ = ((32, 32, 4), (16, 32, 4), (64, 16, 8))
# head dims above this take the _WIDEST_ configs (and the split-K decode fewer rows: decode.max_rows)
WIDEST_HEAD = 256
# dK/dV pipelining depth: 1-3. The kernel's key-major tiles (k @ q^T) keep dk within the 2x rule at every depth
# (`tools/bench_attention.py --check-backward-configs`: 125 config runs over 7 shapes, H200, Triton 3.6), and
# stages=3 is the fastest at N=4096, D=64 and 128. (Query-major tiles, which transpose P and dS in registers, give
# dk errors 4-50x eager's at num_stages >= 2 on that setup.)
_DKDV_STAGES = (1, 2, 3)


@dataclasses.dataclass(frozen=True)
class SharedMemory:
    """A GPU's shared memory as the candidate configs see it: ``limit``, the bytes one program may take; ``wgmma``,
    whether a dot over 64 or more rows runs as the asynchronous MMA of Hopper and later (wgmma), whose pipelined
    operand loads take `stages` buffers -- where the dots run on mma v2 (sm80-sm89, or fewer rows) they take one
    less (Triton's compiles for sm80 and sm90: :func:`_pipeline_buffers`, :func:`_smem_bytes`)."""

    limit: int
    wgmma: bool


def _pipeline_buffers(stages: int, dot_rows: int, wgmma: bool) -> int:
    """The buffers Triton gives a pipelined load of `stages`: as many where the dots run as wgmma (``wgmma`` and
    ``dot_rows``, the resident side's rows, >= 64: a warpgroup's tile), else one less, at least one (mma v2)."""
    return stages if wgmma and dot_rows >= 64 else max(stages - 1, 1)


def _smem_bytes(resident_rows: int, streamed_rows: int, resident_width: int, block_d: int, block_dv: int, elem: int,
                buffers: int) -> int:
    """Shared memory of one program: the streamed tiles (k and v in the forward and dQ kernels, q and dO in dK/dV),
    plus the resident tiles staged once for the dots, ``resident_width`` columns of them: q in the forward
    (``block_d``); q and dO in dQ, k and v in dK/dV (``block_d + block_dv``; a dK/dV config's dV launch reads only k).
    The streamed tiles take ``buffers`` (:func:`_pipeline_buffers`). Against Triton 3.9's compiles of every
    tile of the candidate lists at stages 1-3, whether it fits or not (252 configs for sm90 at head dims 64-512, 90
    for sm80 at 128 and 256): over by at most 16 KiB (a transposed tile's scratch; barriers), under by up to 64 KiB
    (unpipelined, or the widest tiles pipelined less than asked); every sm90 config on the same side of its limit
    (232,448 bytes), four sm80 configs estimated to fit over its 166,912 by 4-8 KiB. Head dims that the kernels load
    in two parts (96 = 64 + 32) take less than their power of two counted here. A config that does not fit fails to
    compile and is dropped by the tuner."""
    return elem * (buffers * streamed_rows * (block_d + block_dv) + resident_rows * resident_width)


@functools.lru_cache(maxsize=None)
def _shared_memory(index: int) -> SharedMemory:
    from triton.runtime import driver

    limit = int(driver.active.utils.get_device_properties(index)["max_shared_mem"])
    return SharedMemory(limit, wgmma=torch.cuda.get_device_capability(index)[0] >= 9)


def shared_memory(device: torch.device) -> SharedMemory:
    # Cached: the driver query reads several device attributes per call and is far slower than a launch.
    return _shared_memory(device.index if device.index is not None else torch.cuda.current_device())


def forward_candidates(block_d: int, block_dv: int, elem: int, causal: bool, smem: SharedMemory) -> list[KernelConfig]:
    if max(block_d, block_dv) > WIDEST_HEAD:  # (where none fits the estimate, the smallest tile unpipelined)
        return _fitting("fwd", _WIDEST_FWD, _STAGES, block_d, block_dv, elem, smem) or [KernelConfig(16, 32, 4, 1)]
    out = []
    for bm in _FWD_BLOCK_M:
        for bn in _FWD_BLOCK_N:
            if bn > bm:
                continue  # a wider key tile than query tile only adds masked work on the causal diagonal
            if bn == 32 and max(block_d, block_dv) <= 128:
                continue  # 32-wide key tiles exist for 256-wide heads only; below that they halve the mma work per load
            if causal and bn < bm // 2:
                continue  # causal: the diagonal costs BLOCK_M/BLOCK_N masked steps; keep it to at most two
            if max(block_d, block_dv) > 128 and bn > 64:
                continue  # head dim 256: a 128-wide key tile of k and v does not fit next to the accumulator
            for warps in _WARPS:
                if warps == 8 and bm < 128:
                    continue  # 64 rows over 8 warps leaves 8 rows per warp, below the 16-row mma tile
                for stages in _STAGES:
                    cfg = KernelConfig(bm, bn, warps, stages)
                    if config_smem_bytes("fwd", cfg, block_d, block_dv, elem, smem.wgmma) <= smem.limit:
                        out.append(cfg)
    return out or [KernelConfig(64, 32, 4, 1)]


def _backward_candidates(kind, shapes, wide_configs, widest_configs, block_d, block_dv, elem, smem: SharedMemory,
                         stages_axis=_STAGES) -> list[KernelConfig]:
    if max(block_d, block_dv) > WIDEST_HEAD:
        tiles = widest_configs
    elif max(block_d, block_dv) > _WIDE_HEAD:
        tiles = wide_configs
    else:  # as in the forward: >= 16 resident rows per warp
        tiles = [(bm, bn, warps) for bm, bn in shapes for warps in _WARPS
                 if warps == 4 or _resident_rows(kind, bm, bn) >= 128]
    return _fitting(kind, tiles, stages_axis, block_d, block_dv, elem, smem) or [KernelConfig(32, 32, 4, 1)]


def _fitting(kind, tiles, stages_axis, block_d, block_dv, elem, smem: SharedMemory) -> list[KernelConfig]:
    """Each tile ``(BLOCK_M, BLOCK_N, warps[, dK/dV launches])`` at each depth of ``stages_axis`` whose shared memory
    (:func:`config_smem_bytes`) fits."""
    configs = [KernelConfig(bm, bn, warps, stages, *launches)
               for bm, bn, warps, *launches in tiles for stages in stages_axis]
    return [cfg for cfg in configs if config_smem_bytes(kind, cfg, block_d, block_dv, elem, smem.wgmma) <= smem.limit]


def _resident_rows(kind: str, block_m: int, block_n: int) -> int:
    """The rows a program of ``kind`` keeps for its whole loop: the key block in dK/dV, the query block elsewhere."""
    return block_n if kind == "bwd_dkdv" else block_m


def config_smem_bytes(kind: str, cfg: KernelConfig, block_d: int, block_dv: int, elem: int, wgmma: bool) -> int:
    """:func:`_smem_bytes` of a program of ``kind`` ("fwd", "bwd_dq", "bwd_dkdv") at ``cfg``: q resident in the
    forward; q and dO in dQ, k and v in dK/dV."""
    resident = _resident_rows(kind, cfg.block_m, cfg.block_n)
    streamed = cfg.block_m + cfg.block_n - resident
    width = block_d if kind == "fwd" else block_d + block_dv
    return _smem_bytes(resident, streamed, width, block_d, block_dv, elem,
                       _pipeline_buffers(cfg.num_stages, resident, wgmma))


def dkdv_candidates(block_d, block_dv, elem, causal, smem: SharedMemory) -> list[KernelConfig]:
    return _backward_candidates("bwd_dkdv", _DKDV_SHAPES, _WIDE_DKDV, _WIDEST_DKDV, block_d, block_dv, elem, smem,
                                stages_axis=_DKDV_STAGES)


def dq_candidates(block_d, block_dv, elem, causal, smem: SharedMemory) -> list[KernelConfig]:
    return _backward_candidates("bwd_dq", _DQ_SHAPES, _WIDE_DQ, _WIDEST_DQ, block_d, block_dv, elem, smem)


# Split-K decode: a [BLOCK_R <= 64, BLOCK_N] score tile per step over few rows, so the kernel streams K/V from
# memory; the axes are the key tile (64/128 keys, 32/64 for 256-wide heads, as in the forward), the warps that
# share it, and the pipelining depth of its K/V loads.
_DECODE_BLOCK_N = (32, 64, 128)
_DECODE_WARPS = (4, 8)
_DECODE_STAGES = (2, 3, 4)


def decode_candidates(block_r: int, block_d: int, block_dv: int, elem: int, smem: SharedMemory) -> list[KernelConfig]:
    """Configs of the split-K decode kernel, whose row tile ``block_r`` is fixed by the packed rows."""
    wide = max(block_d, block_dv) > 128
    out = []
    for bn in _DECODE_BLOCK_N:
        if (bn == 128) if wide else (bn == 32):
            continue  # as in forward_candidates: 128-wide key tiles do not fit 256-wide heads, 32 only for those
        for warps in _DECODE_WARPS:
            for stages in _DECODE_STAGES:
                # (`stages` buffers at any row count: the compiles that measured _pipeline_buffers did not
                # include this kernel)
                if _smem_bytes(block_r, bn, block_d, block_d, block_dv, elem, stages) <= smem.limit:
                    out.append(KernelConfig(block_r, bn, warps, stages))
    return out or [KernelConfig(block_r, 32, 4, 1)]


def length_bucket(n: int) -> int:
    """Next power of two: lengths in one bucket share a tuned config."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


# Bump when the file layout or the meaning of an entry changes: files of any other format are ignored.
FORMAT_VERSION = 1


class TuningKey(NamedTuple):
    """What a tuned config is valid for. A tuple (not a dataclass): the launchers build one on every call."""

    gpu: str
    capability: str  # compute capability, "major.minor"
    triton_version: str
    torch_version: str
    # "fwd", "bwd_dkdv", "bwd_dq" or "decode" (m: the split-K kernel's packed rows); "impl_fwd" / "impl_train":
    # the implementation of an attention, timed forward only or forward+backward
    kind: str
    kernel_id: str  # the generated module (spec digest + source hash): a changed kernel is tuned anew; for "impl_*"
    # the spec digest and the batch and head counts
    dtype: str
    d: int
    dv: int
    m_bucket: int
    n_bucket: int
    timed: bool  # False under FUSE_ATTN_AUTOTUNE=0: an untimed pick must not stand in for a tuned one

    def file_identity(self) -> dict:
        """The part of the key that names its cache file (and is stored in it)."""
        return {"gpu": self.gpu, "capability": self.capability, "triton": self.triton_version, "torch": self.torch_version}

    def entry_name(self) -> str:
        """The rest of the key: its entry's name within the cache file."""
        return (f"{self.kind} {self.kernel_id} {self.dtype} D={self.d} DV={self.dv} "
                f"M_bucket={self.m_bucket} N_bucket={self.n_bucket}")

    def __str__(self) -> str:
        return f"{self.entry_name()} on {self.gpu} (sm {self.capability})" + ("" if self.timed else ", untimed")


_chosen: dict[TuningKey, Candidate] = {}
_unwritable_dirs: set[str] = set()  # cache dirs already warned about: one warning per directory and process


def device_identity(device: torch.device) -> tuple[str, str]:
    """(GPU name, compute capability "major.minor") of a CUDA device."""
    return _device_identity(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _device_identity(index: int) -> tuple[str, str]:
    props = torch.cuda.get_device_properties(index)
    return props.name, f"{props.major}.{props.minor}"


@functools.lru_cache(maxsize=None)
def software_versions() -> tuple[str, str]:
    """(Triton version, torch version): a new compiler can make another config the fastest."""
    import triton

    return triton.__version__, torch.__version__


_untimed_depth = 0  # > 0 inside untimed()


@contextlib.contextmanager
def untimed():
    """Within it every launch config is picked as under ``FUSE_ATTN_AUTOTUNE=0`` -- the first candidate that runs, kept
    under its untimed key -- whatever the environment says: a kernel's cost without its tuning (one compile per
    kernel instead of one per candidate)."""
    global _untimed_depth
    _untimed_depth += 1
    try:
        yield
    finally:
        _untimed_depth -= 1


def tuning_key(kind: str, device: torch.device, kernel_id: str, dtype: torch.dtype, d: int, dv: int, m: int, n: int) -> TuningKey:
    timed = settings.autotune_timed() and not _untimed_depth
    return TuningKey(*device_identity(device), *software_versions(), kind, kernel_id, str(dtype), d, dv,
                     length_bucket(m), length_bucket(n), timed)


def cached(key: TuningKey) -> Candidate | None:
    """The config chosen for ``key`` in this process, if any (memory only: the launchers' hot path)."""
    return _chosen.get(key)


# revisit(first pass's [(ms, candidate)]) -> the candidates to time again, their launch changed (see tune)
Revisit = Callable[[list[tuple[float, Candidate]]], Sequence[Candidate]]


def tune(key: TuningKey, candidates: Sequence[Candidate], launch: Callable[[Candidate], None],
         reset: Callable[[], None] | None = None,
         compile_only: Optional[Callable[[Candidate], None]] = None,
         revisit: Optional[Revisit] = None) -> Candidate:
    """The config for ``key``: from memory, else from the disk cache, else the fastest candidate, timing each with
    ``launch``. ``reset`` runs after candidates were launched (e.g. to zero gradient buffers that the launches
    accumulated into). ``compile_only(cfg)``, when given, compiles a candidate without launching it: before
    timing, every candidate is then compiled at once (:func:`_compile_concurrently`). ``revisit``, when given, sees
    the first timing pass and names candidates to time again because their launch changed (a cheap first version of
    a candidate, made dear only where it can win). Inside a CUDA graph capture nothing is launched or timed
    (:func:`_untimed_for_now`), nor inside a compile-only pass (:func:`compile_workers.compile_launches_only`)."""
    cfg = _chosen.get(key)
    if cfg is None:
        if _capturing() or compile_workers.launches_compile_only():
            return _untimed_for_now(key, candidates)
        cfg = _stored_or_tuned(key, candidates, launch, reset, compile_only, revisit)
        _chosen[key] = cfg
    return cfg


def compile_together(kernels: Sequence[tuple[TuningKey, Sequence[Candidate], Callable[[], Callable[[Candidate], None]]]]
                     ) -> None:
    """Compile in one batch the candidates of those of ``kernels`` -- (key, candidates, ``bind()`` returning the
    kernel's ``compile_only``) -- that :func:`tune` will time: kernels tuned one after the other (the backward's dQ,
    then dK/dV timed on dQ's outputs) then share Inductor's compile workers instead of each waiting for its own
    batch, and :func:`tune` finds every candidate compiled. ``bind`` is called only for those. Kernels whose
    candidates :func:`compile_ahead` submitted are left to that batch."""
    due = _due(kernels)
    if len(due) < 2:
        return  # (one kernel's tuning compiles its own batch)
    compilers = _compilers(due)
    if compilers is None:
        return
    batch = [(i, cand) for i, (_, candidates, _) in enumerate(due) for cand in candidates]
    with _progress.tuning(due[0][0]):
        _compiled_before_timing(batch, lambda item: compilers[item[0]](item[1]), [key for key, _, _ in due])


# {tuning key: (the batch compiling its candidates, its jobs' indices in the batch)}, from compile_ahead
_ahead: dict[TuningKey, tuple[compile_workers.Batch, list[int]]] = {}


def compile_ahead(kernels: Sequence[tuple[TuningKey, Sequence[Candidate], Callable[[], Callable[[Candidate], None]]]],
                  staged: bool = True) -> None:
    """Start compiling the candidates of those of ``kernels`` (as :func:`compile_together` takes them) that :func:`tune`
    will time, in one batch on Inductor's compile workers or in processes forked for it, and return without waiting:
    each kernel's tuning then waits only for its own candidates, and the later ones' compile meanwhile (the
    backward's while the forward is timed and AOTAutograd traces the joint graph). ``staged``: each kernel's
    candidates submitted once the ones before them compiled (the kernels come in the order they are timed), else
    every one at once, in that order (the CPUs then never idle while a first kernel's slowest candidates finish).
    Nothing is started where neither workers nor forked processes can compile: each tuning then compiles its own
    batch, as without it."""
    due = _due(kernels)
    if not due or (compile_workers.worker_pool() is None and not compile_workers.processes_to_fork()):
        return  # (bind() builds inputs: not for nothing)
    compilers = _compilers(due)
    submitted = None if compilers is None else _submitted(
        [(candidates, compile_only) for (_, candidates, _), compile_only in zip(due, compilers)], staged)
    if submitted is None or not submitted[0].jobs:
        return
    batch, owned = submitted
    for (key, _, _), indices in zip(due, owned):
        _ahead[key] = (batch, indices)
    log.info("compiling %d candidates for %s ahead of their tunings %s", len(batch.jobs),
             " and ".join(str(key) for key, _, _ in due), batch.where)


def _due(kernels):
    """Those of ``kernels`` (key, candidates, bind) whose candidates :func:`tune` will time and no batch compiles yet."""
    return [(key, candidates, bind) for key, candidates, bind in kernels
            if _will_time(key, candidates) and key not in _ahead]


def _submitted(groups: Sequence[tuple[Sequence[Candidate], Callable[[Candidate], None]]], staged: bool = True
               ) -> Optional[tuple[compile_workers.Batch, list[list[int]]]]:
    """One batch compiling the candidates of every group (candidates, their ``compile_only``) elsewhere -- on
    Inductor's compile workers where they are ready, else in processes forked from this one -- and each group's job
    indices in it; None where nothing could be submitted (no workers, no processes). ``staged``: a group's jobs
    submitted once the groups before it compiled, else all at once."""
    workers = compile_workers.worker_pool()
    forks = 0 if workers is not None else compile_workers.processes_to_fork()
    if workers is None and not forks:
        return None
    jobs: list = []
    owned = []
    with compile_workers.collecting(jobs):
        for candidates, compile_only in groups:
            first = len(jobs)
            _ask_to_compile(candidates, compile_only)
            owned.append(list(range(first, len(jobs))))
    if not jobs:  # (every one compiled before)
        return compile_workers.Batch([], [], "", "(every one compiled before)"), owned
    # (each group's jobs a stage: the groups come in the order their kernels are timed)
    stages = owned if staged else None
    batch = (compile_workers.start_in_workers(workers, jobs, stages) if workers is not None
             else compile_workers.start_in_forked_processes(jobs, forks, stages))
    return None if batch is None else (batch, owned)


def _compilers(due) -> Optional[list[Callable[[Candidate], None]]]:
    """Each of ``due``'s kernels' ``compile_only`` (its ``bind()``); None where one fails to bind."""
    try:
        return [bind() for _, _, bind in due]
    except Exception as e:  # noqa: BLE001 -- an optimization: each tuning then compiles its own, and reports the error
        log.info("compiling %d kernels' candidates together failed (%s: %s)", len(due), type(e).__name__, e)
        return None


def _will_time(key: TuningKey, candidates: Sequence[Candidate]) -> bool:
    """Whether :func:`tune` would time ``candidates`` for ``key`` now (and compile them first)."""
    if key in _chosen or len(candidates) < 2 or not key.timed:
        return False
    if _capturing():
        return False
    return not (settings.disk_cache_enabled() and _stored(key, candidates) is not None)


def _capturing() -> bool:
    """Whether a CUDA graph capture is recording this stream. (Only where CUDA is initialized can a capture run; asking
    starts CUDA, which fails in a process forked from one that had started it.)"""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def _untimed_for_now(key: TuningKey, candidates: Sequence[Candidate]) -> Candidate:
    """A config for a launch where none may be timed, launching nothing: one that a CUDA graph is recording
    (``torch.cuda.graph``, ``mode="reduce-overhead"``; every candidate launch would be recorded into the graph, and
    timing synchronizes the device, which invalidates the capture), or one that only compiles
    (:func:`compile_workers.compile_launches_only`). The stored config if there is one, else the first candidate -- what
    an untimed choice takes where it runs --, untimed and not remembered, so the next launch that may time tunes.
    CUDA graph trees run each new shape once before recording it, so under ``reduce-overhead`` the tuning happens in
    that warm-up run and no capture reaches this."""
    use_disk = key.timed and settings.disk_cache_enabled()
    stored = _stored(key, candidates) if use_disk and len(candidates) > 1 else None
    if stored is not None:
        _chosen[key] = stored
        return stored
    if _capturing():
        log.info("%s: first launch inside a CUDA graph capture, where configs cannot be timed; the graph uses %s "
                 "untimed", key, candidates[0])
    return candidates[0]


def chosen_configs() -> dict[TuningKey, Candidate]:
    return dict(_chosen)


def cache_file(key: TuningKey) -> str:
    identity = "-".join((key.gpu, "sm" + key.capability, "triton" + key.triton_version, "torch" + key.torch_version))
    # GPU names hold spaces (and could hold anything): keep the name portable. Two identities that map to one name
    # share a file, which then holds one of them; the identity stored in it tells them apart.
    return os.path.join(settings.cache_dir(), "autotune-" + re.sub(r"[^A-Za-z0-9.+-]", "_", identity) + ".json")


def _stored_or_tuned(key: TuningKey, candidates: Sequence[Candidate], launch: Callable[[Candidate], None],
                     reset: Callable[[], None] | None, compile_only: Optional[Callable[[Candidate], None]],
                     revisit: Optional[Revisit]) -> Candidate:
    if len(candidates) == 1:
        return candidates[0]  # nothing to choose between: neither timed nor stored
    if not key.timed:
        cfg = _first_working(key, candidates, launch)
    else:
        use_disk = settings.disk_cache_enabled()
        stored = _stored(key, candidates) if use_disk else None
        if stored is not None:
            return stored
        cfg, ms = _fastest(key, candidates, launch, compile_only, revisit)
        if use_disk:
            _store(key, cfg, ms)
    if reset is not None:
        reset()
    return cfg


def _first_working(key: TuningKey, candidates: Sequence[Candidate], launch: Callable[[Candidate], None]) -> Candidate:
    """No timing: the first candidate that compiles and runs (the smem estimate is only an estimate)."""
    errors = []
    for cand in candidates:
        try:
            launch(cand)
        except Exception as e:
            errors.append(_dropped(key, cand, e))
            continue
        return cand
    raise RuntimeError(f"no launch config compiled for {key}; first error: {errors[0]}")


# Once this process has spent this long tuning, one WARNING line says so: a first compile on a new GPU tunes each
# attention's kernels during the first step (tens of seconds for a model), which otherwise looks like a hang; a
# wait of a few seconds is what a user starts to notice.
PROGRESS_AFTER_S = 5.0


class _TuningProgress:
    """The process's time spent tuning, and the one progress line (:data:`PROGRESS_AFTER_S`). The line is written by
    a timer while the tuning it announces still runs, so it appears when the wait does, not after it."""

    def __init__(self):
        self.spent = 0.0  # seconds of finished tunings
        self.compiling = 0.0  # of them, compiling candidates before timing them
        self.started: Optional[float] = None  # the running tuning's start
        # Tunings nest (timing the implementations launches the template, whose first launch tunes its configs): the
        # outermost counts the time, once
        self.depth = 0
        self.announced = False
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def tuning(self, key: TuningKey):
        with self.lock:
            self.depth += 1
            timer = None
            if self.depth == 1:
                self.started = time.perf_counter()
            if self.depth == 1 and not self.announced:
                timer = threading.Timer(max(0.0, PROGRESS_AFTER_S - self.spent), self._announce, args=(key,))
                timer.daemon = True
                timer.start()
        try:
            yield
        finally:
            if timer is not None:
                timer.cancel()
            with self.lock:
                self.depth -= 1
                if self.depth == 0:
                    self.spent += time.perf_counter() - self.started
                    self.started = None

    def _announce(self, key: TuningKey) -> None:
        with self.lock:
            if self.announced or self.started is None:
                return
            self.announced = True
            spent = self.spent + time.perf_counter() - self.started
        where = (f"kept in {cache_file(key)}, so later processes skip it" if settings.disk_cache_enabled()
                 else "kept in memory only (FUSE_ATTN_CACHE=0)")
        log.warning("fuse_attn: tuning the attention kernels for this GPU and these shapes (%.0f s so far): the first "
                    "step takes longer; each choice is %s. TORCH_LOGS=fuse_attn shows each tuning", spent, where)


_progress = _TuningProgress()


def seconds_spent() -> dict[str, float]:
    """Seconds this process spent tuning (timing candidate configs and implementations), and of them compiling
    candidates: where a first compile's time goes (``tools/bench_models.py --compile-time`` reports them)."""
    return {"tuning": _progress.spent, "compiling candidates": _progress.compiling}


def _fastest(key: TuningKey, candidates: Sequence[Candidate], launch: Callable[[Candidate], None],
             compile_only: Optional[Callable[[Candidate], None]] = None,
             revisit: Optional[Revisit] = None) -> tuple[Candidate, float]:
    """The fastest candidate and its time in ms."""
    with _progress.tuning(key):
        return _timed_fastest(key, candidates, launch, compile_only, revisit)


def _timed_fastest(key: TuningKey, candidates: Sequence[Candidate], launch: Callable[[Candidate], None],
                   compile_only: Optional[Callable[[Candidate], None]],
                   revisit: Optional[Revisit] = None) -> tuple[Candidate, float]:
    log.info("tuning %s: timing %d candidate configs", key, len(candidates))
    start = time.perf_counter()
    if compile_only is not None:
        _compiled_before_timing(candidates, compile_only, [key])
    timed, errors = [], []

    def first_pass(cands: Sequence[Candidate]) -> None:
        for cand in cands:
            try:
                ms = _time_config(launch, cand, _FIRST_PASS_REP_MS)
            except Exception as e:  # out of shared memory / registers: not a usable config here
                errors.append(_dropped(key, cand, e))
                continue
            log.debug("config %s for %s: %.4f ms", cand, key, ms)
            timed.append((ms, cand))

    first_pass(candidates)
    again = list(revisit(timed)) if revisit is not None else []
    if again:  # (their launch changed: their first-pass times no longer stand)
        timed[:] = [(ms, cand) for ms, cand in timed if cand not in again]
        first_pass(again)
    if not timed:
        raise RuntimeError(f"no launch config compiled for {key}; first error: {errors[0]}")
    finalists = [cand for _, cand in sorted(timed, key=lambda t: t[0])[:_FINALISTS]]
    best = None
    for cand in finalists if len(finalists) > 1 else ():
        ms = _time_config(launch, cand, _FINAL_PASS_REP_MS)
        log.debug("finalist %s for %s: %.4f ms", cand, key, ms)
        if best is None or ms < best[1]:
            best = (cand, ms)
    if best is None:
        best = (timed[0][1], timed[0][0])
    log.info("tuned %s: %s at %.4f ms (%d of %d candidates ran; tuning took %.2f s)", key, best[0], best[1],
             len(candidates) - len(errors), len(candidates), time.perf_counter() - start)
    return best


def _compiled_before_timing(candidates: Sequence[Any], compile_only: Callable[[Any], None],
                            keys: Sequence[TuningKey]) -> None:
    """:func:`_compile_concurrently`, its seconds counted as the process's compiling and logged with where it ran;
    ``keys``: the tunings the candidates are of."""
    start = time.perf_counter()
    where = _compile_concurrently(candidates, compile_only, keys)
    _progress.compiling += time.perf_counter() - start
    log.info("compiled %d candidates for %s in %.2f s %s", len(candidates), " and ".join(str(key) for key in keys),
             time.perf_counter() - start, where)


def _compile_concurrently(candidates: Sequence[Candidate], compile_only: Callable[[Candidate], None],
                          keys: Sequence[TuningKey] = ()) -> str:
    """Compile every candidate before any is timed: compiling dominates a cold tuning (about 1-2 s per candidate,
    against ~0.1 s to time one). Candidates of ``keys`` that :func:`compile_ahead` submitted are waited for;
    others go to Inductor's compile workers where they are ready, else to processes forked from this one
    (:mod:`fuse_attn.kernels.compile_workers`), which leave the kernels in Triton's disk cache; then here on a thread
    pool, where each kernel loads from that cache -- or, compiled nowhere else, compiles, the parts of its compile
    outside the GIL (LLVM, ptxas) overlapping. The timing launches find them in Triton's in-memory cache. Returns
    where they compiled, for the log."""
    if len(candidates) < 2:
        return "(when timed)"
    batches = [_ahead.pop(key) for key in keys if key in _ahead]
    where = "ahead, " + batches[0][0].where if batches else None
    if not batches:
        submitted = _submitted([(candidates, compile_only)])
        batches = [(submitted[0], submitted[1][0])] if submitted is not None else []
        where = batches[0][0].where if batches else None
    if not all([batch.wait(indices) for batch, indices in batches]):  # (every batch waited for)
        where = f"here (a job failed {batches[0][0].place})"
    if AsyncCompileMode is None:
        return where or "(when timed)"
    threads = min(len(candidates), os.cpu_count() or 1)
    with _no_garbage_collection(), ThreadPoolExecutor(max_workers=threads) as pool, \
            AsyncCompileMode(pool, ignore_errors=True):  # (collection resumes once every compile ended)
        _ask_to_compile(candidates, compile_only)
    return where or "here (Inductor's compile workers not ready)"


@contextlib.contextmanager
def _no_garbage_collection():
    """Pause Python's cyclic garbage collection while compiles run on threads. Triton parses a kernel's source with
    ``ast.parse`` in each compile, and CPython 3.11's AST constructor keeps its recursion depth in interpreter-wide
    state: a collection inside it runs finalizers that can hand the GIL to another thread's ``ast.parse``, and the
    first then fails with "SystemError: AST constructor recursion depth mismatch" (here, a two-candidate thread pass
    lost one compile in 2 of 8 processes; none of 22 with collection paused). Without collection no Python code runs
    inside the constructor, so no thread switch can reach it; a pass lasts seconds, its cycles are collected after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _ask_to_compile(candidates: Sequence[Candidate], compile_only: Callable[[Candidate], None]) -> None:
    for cand in candidates:
        try:
            compile_only(cand)
        except Exception:  # noqa: BLE001 -- the timing loop compiles it again and drops it with its reason
            pass


# do_bench's rep (ms) of the first pass over every candidate: ~25 launches of a ms-scale kernel, enough to rank
# configs apart while tuning ~10 candidates in well under a second per key; of the second pass over the finalists:
# 4x as many launches. The median, not the mean: one slow launch (a clock dip, another process's kernel) must not
# decide (on an H100 one rep-25 pass by the mean picked, in two processes, dK/dV configs 25% apart in time).
_FIRST_PASS_REP_MS = 25
_FINAL_PASS_REP_MS = 100
# The first pass's fastest candidates that are timed again: its ranking is reliable beyond its top few.
_FINALISTS = 3


def _time_config(launch: Callable[[Candidate], None], cfg: Candidate, rep_ms: float) -> float:
    """Milliseconds per ``launch(cfg)`` on the GPU (median of about ``rep_ms`` of launches)."""
    import triton.testing

    return triton.testing.do_bench(lambda: launch(cfg), warmup=5, rep=rep_ms, return_mode="median")


def _dropped(key: TuningKey, cand: Candidate, error: Exception) -> str:
    """Log a candidate that failed; its reason (the error's first line) for the message if none works."""
    lines = str(error).strip().splitlines()
    reason = f"{type(error).__name__}: {lines[0] if lines else ''}"
    log.info("config %s for %s dropped: %s", cand, key, reason)
    log.debug("config %s for %s failed", cand, key, exc_info=error)
    return f"{cand}: {reason}"


# ---- disk cache ----------------------------------------------------------------------------------------------------
_CONFIG_FIELDS = tuple(field.name for field in dataclasses.fields(KernelConfig))
# the fields without a default; entries written before a defaulted field existed take its default
_REQUIRED_CONFIG_FIELDS = tuple(field.name for field in dataclasses.fields(KernelConfig)
                                if field.default is dataclasses.MISSING)


def _entry_fields(cfg: Candidate) -> dict:
    """A choice as its cache entry's fields: a config's fields without those at their default (so an entry of a
    config that does not use a newer field reads the same as before it existed)."""
    if isinstance(cfg, Implementation):
        return {"name": cfg.name}
    defaults = {field.name: field.default for field in dataclasses.fields(KernelConfig)}
    return {name: value for name, value in dataclasses.asdict(cfg).items()
            if name in _REQUIRED_CONFIG_FIELDS or value != defaults[name]}


def _entry_choice(value) -> Candidate:
    """The choice of a cache entry ({config fields..., "ms": time} or {"name": implementation, "ms": time});
    ValueError saying why if it is neither."""
    if isinstance(value, dict) and set(value) == {"name", "ms"}:
        if not isinstance(value["name"], str) or not value["name"]:
            raise ValueError(f"implementation name {value['name']!r} is not a non-empty string")
        choice = Implementation(value["name"])
    elif isinstance(value, dict) and set(_REQUIRED_CONFIG_FIELDS) <= set(value) <= {*_CONFIG_FIELDS, "ms"} and "ms" in value:
        fields = {name: value[name] for name in _CONFIG_FIELDS if name in value}
        if not all(type(v) is int and v > 0 for v in fields.values()):
            raise ValueError(f"config values must be positive integers, got {fields}")
        if fields.get("dkdv_launches", 1) not in (1, 2):
            raise ValueError(f"dkdv_launches must be 1 or 2, got {fields['dkdv_launches']}")
        choice = KernelConfig(**fields)
    else:
        raise ValueError(f"expected an object with keys {sorted({*_CONFIG_FIELDS, 'ms'})} or ['ms', 'name'], got {value!r}")
    if type(value["ms"]) not in (int, float) or not value["ms"] >= 0:  # `not >=` also rejects NaN
        raise ValueError(f"time {value['ms']!r} is not a number of milliseconds")
    return choice


def _file_problem(data, identity: dict) -> str | None:
    """Why a parsed cache file cannot be used for ``identity``; None if it can."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got a {type(data).__name__}"
    if data.get("format") != FORMAT_VERSION:
        return f"format {data.get('format')!r}, this version reads {FORMAT_VERSION}"
    found = {name: data.get(name) for name in identity}
    if found != identity:
        return f"written for {found}, not {identity}"
    if not isinstance(data.get("entries"), dict):
        return "it has no 'entries' object"
    return None


def _read_entries(path: str, identity: dict, level: int = logging.WARNING) -> dict[str, dict]:
    """The valid entries of the cache file at ``path``; {} if it is missing or unusable. Whatever is ignored is
    logged at ``level`` with the reason."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (FileNotFoundError, NotADirectoryError):  # nothing stored yet (or nothing can be: the dir is a file)
        return {}
    except (OSError, ValueError) as e:  # unreadable, truncated, not JSON, not UTF-8 (the last three: ValueErrors)
        log.log(level, "ignoring autotune cache %s: %s", path, e)
        return {}
    problem = _file_problem(data, identity)
    if problem is not None:
        log.log(level, "ignoring autotune cache %s: %s", path, problem)
        return {}
    entries = {}
    for name, value in data["entries"].items():
        try:
            _entry_choice(value)
        except ValueError as e:
            log.log(level, "ignoring entry %r of autotune cache %s: %s", name, path, e)
            continue
        entries[name] = value
    return entries


def _stored(key: TuningKey, candidates: Sequence[Candidate]) -> Candidate | None:
    path = cache_file(key)
    value = _read_entries(path, key.file_identity()).get(key.entry_name())
    if value is None:
        return None
    cfg = _entry_choice(value)
    if cfg not in candidates:  # the candidate space changed since it was stored (a config may have been found wrong)
        log.debug("stored config %s for %s is no longer a candidate; re-tuning", cfg, key)
        return None
    return cfg


def _store(key: TuningKey, cfg: Candidate, ms: float) -> None:
    """Merge the entry for ``key`` into its cache file; on an unwritable directory, warn once and go on."""
    path = cache_file(key)
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        with _locked(path + ".lock"):
            # re-read under the lock: entries other processes wrote since our lookup stay; the lookup already
            # warned about anything this drops
            entries = _read_entries(path, key.file_identity(), level=logging.DEBUG)
            entries[key.entry_name()] = {**_entry_fields(cfg), "ms": ms}
            _write_atomically(path, {"format": FORMAT_VERSION, **key.file_identity(), "entries": entries})
    except OSError as e:
        if directory not in _unwritable_dirs:
            _unwritable_dirs.add(directory)
            log.warning("cannot write the autotune cache in %s (%s); tuned configs stay in this process's memory",
                        directory, e)


@contextlib.contextmanager
def _locked(lock_path: str):
    """An exclusive lock between processes, on a file of its own: the cache file itself is replaced by each write,
    so a lock on it would guard an inode that is no longer the file."""
    if fcntl is None:
        yield
        return
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)  # 0o666 & ~umask: what open() gives a new file
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write_atomically(path: str, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
