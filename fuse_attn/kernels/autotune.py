"""Launch configurations for the attention kernels and the run-time tuner (v1: in-process cache only).

A config is (BLOCK_M, BLOCK_N, num_warps, num_stages). Candidates come from a small space pruned by the GPU's
shared-memory limit, the head dim and causality; at the first call for a key, each candidate is timed with
``triton.testing.do_bench`` on the real inputs and the fastest kept for that key:
(GPU name, compute capability, kernel, spec digest, dtype, head dims, power-of-two buckets of M and N).
Under the Triton interpreter exactly one config is used (multi-config tuning does not work there, and timing
an interpreter is meaningless). ``FUSE_ATTN_AUTOTUNE=0`` skips timing and takes the first candidate.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from typing import Callable, Sequence

import torch

log = logging.getLogger("fuse_attn.kernels.autotune")


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    block_m: int  # query rows per tile
    block_n: int  # key columns per tile
    num_warps: int
    num_stages: int  # software-pipelining depth of the inner loop's loads

    def __str__(self) -> str:
        return f"BLOCK_M={self.block_m} BLOCK_N={self.block_n} warps={self.num_warps} stages={self.num_stages}"


# One config per kernel under the interpreter. Small blocks keep each interpreted program cheap, and
# BLOCK_M != BLOCK_N makes the tests cross the causal diagonal at block boundaries that are not aligned.
INTERPRETER_CONFIGS = {
    "fwd": KernelConfig(32, 16, 4, 1),
    "bwd_dq": KernelConfig(32, 16, 4, 1),
    "bwd_dkdv": KernelConfig(16, 32, 4, 1),  # (query rows, key rows) per step of the dK/dV loop
}
# The preprocess (delta = rowsum(dO * O)) is memory-bound and tiny; 64 rows x BLOCK_DV keep it one pass.
PREPROCESS_BLOCK_M = 64

# Candidate axes. Tensor-core tiles want multiples of 16 rows per warp (mma m16); Hopper's wgmma issues
# 64-row tiles per 4-warp group, so BLOCK_M in {64, 128} with 4 or 8 warps are the shapes FA2/FA3 and Triton's
# fused-attention tutorial use on sm80/sm90; stages 2-3 cover their pipelining depths for attention.
_FWD_BLOCK_M = (64, 128)
_FWD_BLOCK_N = (32, 64, 128)
_WARPS = (4, 8)
_STAGES = (2, 3)
# Backward, dK/dV kernel: the key block stays resident (k, v, dk, dv), the query block streams; Triton's
# tutorial uses (BLOCK_M, BLOCK_N) = (32, 128) there and (128, 32) for dQ (the resident side is the large one).
_DKDV_SHAPES = ((32, 128), (64, 128), (32, 64))
_DQ_SHAPES = ((128, 32), (128, 64), (64, 32))
# The dK/dV kernel is not software-pipelined: on an H200 with Triton 3.6 (2026-11-21), bf16, D=64, causal,
# M=N=1024 and M=97/N=1000, num_stages=2 at (32, 128, 4 warps) gave dk errors 40-50x eager's, and
# (32, 128, 8 warps, 3 stages) 4x, while every num_stages=1 config agreed with the fp64 reference; dq and dv
# were right in all of them. Until that is narrowed down (compiler or kernel), stages=1 is the only safe choice.
_DKDV_STAGES = (1,)


def _smem_bytes(resident_rows: int, streamed_rows: int, block_d: int, block_dv: int, elem: int, stages: int) -> int:
    """Rough shared memory of one program: the streamed k/v (or q/dO) tiles, `stages` deep, plus the resident
    tile staged once for the dot. An estimate only: a config that still does not fit fails to compile and is
    dropped by the tuner."""
    return elem * (stages * streamed_rows * (block_d + block_dv) + resident_rows * max(block_d, block_dv))


@functools.lru_cache(maxsize=None)
def _max_shared_memory(index: int) -> int:
    from triton.runtime import driver

    return int(driver.active.utils.get_device_properties(index)["max_shared_mem"])


def max_shared_memory(device: torch.device) -> int:
    # Cached: the driver query reads several device attributes per call and is far slower than a launch.
    return _max_shared_memory(device.index if device.index is not None else torch.cuda.current_device())


def forward_candidates(block_d: int, block_dv: int, elem: int, causal: bool, smem_limit: int) -> list[KernelConfig]:
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
                    if _smem_bytes(bm, bn, block_d, block_dv, elem, stages) <= smem_limit:
                        out.append(KernelConfig(bm, bn, warps, stages))
    return out or [KernelConfig(64, 32, 4, 1)]


def _backward_candidates(shapes, block_d, block_dv, elem, smem_limit, resident_is_n: bool, stages_axis=_STAGES) -> list[KernelConfig]:
    out = []
    for bm, bn in shapes:
        resident, streamed = (bn, bm) if resident_is_n else (bm, bn)
        if max(block_d, block_dv) > 128 and resident > 64:
            continue  # head dim 256: two resident fp32 accumulators of 128 x 256 exceed the register file
        if max(block_d, block_dv) <= 128 and resident < 128:
            continue  # the 64-row resident shapes are the fallback for 256-wide heads only
        for warps in _WARPS:
            if warps == 8 and resident < 128:
                continue  # as in the forward: >= 16 resident rows per warp
            for stages in stages_axis:
                if _smem_bytes(resident, streamed, block_d, block_dv, elem, stages) <= smem_limit:
                    out.append(KernelConfig(bm, bn, warps, stages))
    return out or [KernelConfig(32, 32, 4, 1)]


def dkdv_candidates(block_d, block_dv, elem, causal, smem_limit) -> list[KernelConfig]:
    return _backward_candidates(_DKDV_SHAPES, block_d, block_dv, elem, smem_limit, resident_is_n=True, stages_axis=_DKDV_STAGES)


def dq_candidates(block_d, block_dv, elem, causal, smem_limit) -> list[KernelConfig]:
    return _backward_candidates(_DQ_SHAPES, block_d, block_dv, elem, smem_limit, resident_is_n=False)


def length_bucket(n: int) -> int:
    """Next power of two: lengths in one bucket share a tuned config."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


_chosen: dict[tuple, KernelConfig] = {}


@functools.lru_cache(maxsize=None)
def _device_id(index: int) -> tuple:
    props = torch.cuda.get_device_properties(index)
    return props.name, (props.major, props.minor)


def tuning_key(kind: str, device: torch.device, spec_digest: str, dtype: torch.dtype, d: int, dv: int, m: int, n: int) -> tuple:
    untimed = os.environ.get("FUSE_ATTN_AUTOTUNE", "1") == "0"  # an untimed pick must not stand in for a tuned one
    index = device.index if device.index is not None else torch.cuda.current_device()
    return (*_device_id(index), kind, spec_digest, str(dtype), d, dv, length_bucket(m), length_bucket(n), untimed)


def cached(key: tuple) -> KernelConfig | None:
    return _chosen.get(key)


def choose(key: tuple, candidates: Sequence[KernelConfig], launch: Callable[[KernelConfig], None],
           reset: Callable[[], None] | None = None) -> KernelConfig:
    """The fastest candidate for ``key``, timing each with ``launch`` on first use. ``reset`` runs after tuning
    (e.g. to zero gradient buffers that the timed launches accumulated into)."""
    cfg = _chosen.get(key)
    if cfg is not None:
        return cfg
    if len(candidates) == 1:
        cfg = candidates[0]
    elif os.environ.get("FUSE_ATTN_AUTOTUNE", "1") == "0":
        # no timing: the first candidate that compiles and runs (the smem estimate is only an estimate)
        errors = []
        for cand in candidates:
            try:
                launch(cand)
            except Exception as e:
                log.debug("config %s for %s failed: %s", cand, key, e)
                errors.append(f"{cand}: {type(e).__name__}: {e}")
                continue
            cfg = cand
            break
        else:
            raise RuntimeError(f"no launch config compiled for {key}; first error: {errors[0]}")
        if reset is not None:
            reset()
    else:
        import triton.testing

        best, errors = None, []
        for cand in candidates:
            try:
                # warmup/rep in ms: ~25 timed launches of a ms-scale kernel are enough to rank configs apart
                # and keep first-call tuning of ~10 candidates under a few seconds.
                t = triton.testing.do_bench(lambda: launch(cand), warmup=5, rep=25)
            except Exception as e:  # out of shared memory / registers: not a usable config here
                log.debug("config %s for %s failed: %s", cand, key, e)
                errors.append(f"{cand}: {type(e).__name__}: {e}")
                continue
            log.debug("config %s for %s: %.4f ms", cand, key, t)
            if best is None or t < best[0]:
                best = (t, cand)
        if best is None:
            raise RuntimeError(f"no launch config compiled for {key}; first error: {errors[0]}")
        cfg = best[1]
        if reset is not None:
            reset()
        log.info("tuned %s -> %s", key, cfg)
    _chosen[key] = cfg
    return cfg


def chosen_configs() -> dict[tuple, KernelConfig]:
    return dict(_chosen)
