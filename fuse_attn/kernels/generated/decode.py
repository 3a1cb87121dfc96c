"""Split-K ("flash-decoding") forward of the fused op, for few query rows and many keys: generation with a KV
cache (q_len 1, k_len growing), where the ordinary forward launches one program per (batch, query head) -- far
fewer than the GPU has SMs -- and each walks the whole cache alone.

Here the key range is cut into ``num_splits`` chunks; one program per (split, batch, kv head) computes the
attention of its chunk for all rows of a tile and writes the chunk's output and log-sum-exp in fp32
(``_decode_split``); a second kernel (``_decode_combine``) weights each query row's partial outputs by
``exp(lse_split - lse)``. The GQA_GROUP query heads that share a kv head are packed, with the query rows, into the
rows of one tile, so each K/V tile is read once per kv head. The result is the op's own ``(out, lse)``: the same
values as the forward kernel's (so the backward, which reads only q, k, v, out and lse, is unchanged), and the same
spec -- score program, causal offset, sliding window, GQA, scale, dtypes -- from
``templates/flash_decoding.py.tmpl``, whose score program is the forward template's (``codegen``).

When: :func:`num_splits` (FlashAttention-2's split heuristic), from the op's launcher through
:func:`dispatch_splits`; a forward that needs dropout, has more packed rows than :func:`max_rows` or already fills
the GPU runs the ordinary kernel. Under the Triton interpreter (no GPU to fill) the op never picks split-K by
itself; tests call :func:`triton_forward` with a chosen number of splits.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from typing import Optional, Sequence

import torch
from torch import Tensor

from fuse_attn.spec import AttentionSpec
from fuse_attn.kernels import tuning
from fuse_attn.kernels.generated import codegen
from fuse_attn.kernels.plan import size_hint
from fuse_attn.kernels.generated.launch import (choose_kernel_config, common_kernel_args, kernel_grid, key_range_args, pow2_at_least_16, random_like, score_kwargs,
                     stride_args, launch, triton_cdiv)
from fuse_attn.kernels.reference import causal_visible, score_program_values

log = logging.getLogger("fuse_attn.kernels.generated.decode")

# Packed rows (GQA_GROUP * q_len) of one tile at most: 64 rows x 256-wide fp32 accumulator is the forward kernel's
# smallest BLOCK_M tile, so this kernel never holds more registers than it; LLaMA-style GQA 8 with 8 query rows
# (speculative decoding) still fits. Longer queries fill the GPU through the forward kernel's query blocks.
MAX_ROWS = 64
# Heads wider than 256 (up to spec.MAX_HEAD_DIM's 512): half as many rows, the same accumulator. Compiled for sm90, a
# 512-wide split kernel of 32 rows runs on 8 warps without spills; of 64 rows it spills 128-408 bytes a thread.
WIDEST_HEAD_MAX_ROWS = 32
# Keys per split at least: the largest BLOCK_N the tuner tries (tuning.decode_candidates), so a split is never
# less than one full tile of any config.
MIN_KEYS_PER_SPLIT = 128
# FlashAttention-2's num_splits_heuristic (csrc/flash_attn/flash_api.cpp): no split once the (batch x heads x
# row blocks) programs fill this fraction of the SMs; at most 128 splits; among split counts, the smallest whose
# wave efficiency is within this fraction of the best one.
FILL_FRACTION = 0.8
MAX_SPLITS = 128
EFFICIENCY_SLACK = 0.85


def num_splits(rows: int, n_keys: int, batch_kv_heads: int, sm_count: Optional[int]) -> int:
    """How many key splits the forward of a (rows = GQA group x q_len) x n_keys attention over batch_kv_heads
    (batch x kv heads) tiles should use on a GPU with ``sm_count`` SMs; 1: run the ordinary forward kernel.

    FlashAttention-2's heuristic on the split-K grid (one row block per batch x kv head): split only when those
    programs leave more than 1 - FILL_FRACTION of the SMs idle; split counts that give the same keys per split as a
    smaller count are skipped; of the rest (up to MAX_SPLITS, the SM count, and one split per MIN_KEYS_PER_SPLIT
    keys), the smallest whose last wave is as full as EFFICIENCY_SLACK times the best one's."""
    if sm_count is None or rows > MAX_ROWS or batch_kv_heads >= FILL_FRACTION * sm_count:
        return 1
    return _splits_of_blocks(max(1, triton_cdiv(n_keys, MIN_KEYS_PER_SPLIT)), batch_kv_heads, sm_count)


@functools.lru_cache(maxsize=4096)
def _splits_of_blocks(n_blocks: int, batch_kv_heads: int, sm_count: int) -> int:
    # Memoized: the op asks once per layer and generated token, and n_blocks changes only every
    # MIN_KEYS_PER_SPLIT tokens, where the search below is up to 128 steps of Python.
    most = min(MAX_SPLITS, sm_count, n_blocks)

    def eligible(s):
        return s == 1 or triton_cdiv(n_blocks, s) != triton_cdiv(n_blocks, s - 1)

    def efficiency(s):
        waves = batch_kv_heads * s / sm_count
        return waves / math.ceil(waves)

    candidates = [s for s in range(1, most + 1) if eligible(s)]
    best = max(efficiency(s) for s in candidates)
    return next(s for s in candidates if efficiency(s) >= EFFICIENCY_SLACK * best)


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> Optional[int]:
    """The SMs of a CUDA device; None elsewhere (the interpreter has no GPU to fill)."""
    if device.type != "cuda":
        return None
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


_logged: set[str] = set()


def _fallback(reason: str) -> int:
    """Log (once per reason and process: the launcher runs per generated token) why split-K is not used."""
    if reason not in _logged:
        _logged.add(reason)
        log.info("split-K decode not used: %s; running the ordinary forward kernel", reason)
    return 1


def dispatch_splits(q: Tensor, k: Tensor, spec: AttentionSpec) -> int:
    """The op's choice for validated inputs with N > 0: the number of splits, 1 for the ordinary forward. A speed
    choice, made on the lengths' hints when they are symbolic (no guard: the split kernels are correct for any
    length, see :func:`triton_forward`)."""
    if spec.gqa_group * q.shape[2] > max_rows(spec):  # a guard where q_len is symbolic: the split kernel's row tile is fixed
        return 1  # not a decode shape: nothing to log
    Z, H, M, _ = (size_hint(x) for x in q.shape)
    rows = spec.gqa_group * M
    kv_lo, kv_hi = visible_key_range(spec, M, size_hint(k.shape[2]))
    splits = num_splits(rows, kv_hi - kv_lo, Z * (H // spec.gqa_group), sm_count(q.device))
    if splits > 1 and spec.dropout_p:
        return _fallback(f"dropout_p {spec.dropout_p:g} (the split kernel draws no dropout mask)")
    return splits


def max_rows(spec: AttentionSpec) -> int:
    """The most packed rows (GQA group x q_len) the split kernel takes for this spec's head dims."""
    return MAX_ROWS if max(spec.head_dim, spec.head_dim_v) <= tuning.WIDEST_HEAD else WIDEST_HEAD_MAX_ROWS


def visible_key_range(spec: AttentionSpec, M, N) -> tuple:
    """Keys [lo, hi) hold every key some query row can see (the causal band and window are index-only); may be
    empty (q_len > k_len with a negative causal offset can leave every row without a key). Symbolic where M or N
    is."""
    if spec.causal is None:
        return 0, N
    offset = spec.causal.offset(M, N)
    hi = torch.sym_min(torch.sym_max(M - 1 + offset + 1, 0), N)
    lo = 0 if spec.causal.window is None else torch.sym_min(torch.sym_max(offset - spec.causal.window + 1, 0), N)
    return lo, torch.sym_max(lo, hi)


def _split_range(kv_lo, kv_hi, splits: int, block_n: int) -> tuple:
    """(first key, keys per split, launched splits): kv_lo rounded down and the chunk rounded up to BLOCK_N, the
    number of splits cut down to the chunks that hold keys (at least one, so empty ranges still write lse -inf)."""
    lo = kv_lo // block_n * block_n
    blocks = triton_cdiv(kv_hi - lo, block_n)
    chunk = torch.sym_max(1, triton_cdiv(blocks, splits)) * block_n
    return lo, chunk, torch.sym_max(1, triton_cdiv(kv_hi - lo, chunk))


def _launch_split(mod, cfg, common, q, k, v, score_tensors, spec, splits: int,
                  warmup: bool = False) -> tuple[Tensor, Tensor]:
    """The split kernel's fp32 partials ([Z * H * M, S, DV] outputs and [Z * H * M, S] log-sum-exps). ``common``:
    ``common_kernel_args`` of these q, k, v."""
    Z, H, M, _ = q.shape
    N, DV = k.shape[2], v.shape[3]
    # no dropout in decoding; empty rows are the combine's business (an empty split writes out 0 and lse -inf); no
    # score tile is shared by the batch rows' splits
    common = {name: value for name, value in common.items()
              if name not in ("DROPOUT", "dropout_p", "ZERO_EMPTY_ROWS", "BATCH_INNER")}
    kv_lo, kv_hi = visible_key_range(spec, M, N)
    lo, chunk, launched = _split_range(kv_lo, kv_hi, splits, cfg.block_n)
    out_part = torch.empty((Z * H * M, launched, DV), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((Z * H * M, launched), dtype=torch.float32, device=q.device)
    # a key padding vector's range per batch row (the split kernel runs the whole program on every tile it reads)
    key_range = {name: value for name, value in key_range_args(spec, score_tensors, Z, N, lse_part).items()
                 if name != "KEY_FULL"}
    args = dict(Q=q, K=k, V=v, OutPart=out_part, LsePart=lse_part, **score_kwargs(score_tensors), **stride_args("q", q),
                **stride_args("k", k), **stride_args("v", v), kv_lo=lo, kv_hi=kv_hi, chunk=chunk, num_splits=launched,
                **key_range, **common, BLOCK_R=cfg.block_m, BLOCK_N=cfg.block_n)
    launch(mod._decode_split, kernel_grid(launched, Z, H // spec.gqa_group), args, cfg, warmup)
    return out_part, lse_part


def _config(mod, common, q, k, v, score_tensors, spec, splits: int) -> tuning.KernelConfig:
    """The launch config: tuned like the other kernels (kind "decode", keyed by power-of-two buckets of the packed
    rows and of k_len, so a growing cache is tuned once per doubling -- a handful of times per generation, stored
    on disk for the next process), or the interpreter's; its row tile is always the packed rows'."""
    # the packed rows, >= 16 for tl.dot; a symbolic q_len specializes here (the row tile must hold every row)
    block_r = pow2_at_least_16(spec.gqa_group * int(q.shape[2]))

    def candidates():
        return tuning.decode_candidates(block_r, common["BLOCK_D"], common["BLOCK_DV"], q.element_size(),
                                          tuning.shared_memory(q.device))

    def bind():
        rq, rk, rv, *rs = map(random_like, (q, k, v, *score_tensors))
        real = common_kernel_args(rq, rk, rv, spec)
        return lambda cfg, warmup: _launch_split(mod, cfg, real, rq, rk, rv, rs, spec, splits, warmup)

    cfg = choose_kernel_config("decode", q, mod.KERNEL_ID, common, candidates, bind, m=spec.gqa_group * int(q.shape[2]))
    return dataclasses.replace(cfg, block_m=block_r)


def triton_forward(q: Tensor, k: Tensor, v: Tensor, score_tensors: Sequence[Tensor], spec: AttentionSpec,
                   splits: int) -> tuple[Tensor, Tensor]:
    """(out, lse) of validated inputs (N > 0, no dropout) through at most ``splits`` key splits."""
    mod = codegen.load_module(spec, codegen.DECODING_TEMPLATE_NAME)
    Z, H, M, _ = q.shape
    common = common_kernel_args(q, k, v, spec)
    cfg = _config(mod, common, q, k, v, score_tensors, spec, splits)
    out_part, lse_part = _launch_split(mod, cfg, common, q, k, v, score_tensors, spec, splits)
    out = torch.empty((Z, H, M, v.shape[3]), dtype=q.dtype, device=q.device)
    lse = torch.empty((Z, H, M), dtype=torch.float32, device=q.device)
    combine(mod, out_part, lse_part, out, lse, zero_empty_rows=spec.empty_rows == "zero")
    return out, lse


def combine(mod, out_part: Tensor, lse_part: Tensor, out: Tensor, lse: Tensor, zero_empty_rows: bool = False) -> None:
    """Write into ``out`` [Z, H, M, DV] and ``lse`` [Z, H, M] (contiguous) the combination of the fp32 partials
    ``out_part`` [Z * H * M, S, DV] and ``lse_part`` [Z * H * M, S] (rows in (z, h, m) order); a row with every
    split empty gets out NaN, or 0 with ``zero_empty_rows``."""
    Z, H, M, DV = out.shape
    args = dict(OutPart=out_part, LsePart=lse_part, Out=out, Lse=lse,
                **{f"stride_o{d}": s for d, s in zip("zhmd", out.stride())}, H=H, M=M, num_splits=lse_part.shape[1],
                DV=DV, BLOCK_DV=pow2_at_least_16(int(DV)), ZERO_EMPTY_ROWS=zero_empty_rows)
    launch(mod._decode_combine, (Z * H * M,), args)


# ---- plain-PyTorch reference ---------------------------------------------------------------------------------------
def combine_reference(out_part: Tensor, lse_part: Tensor, zero_empty_rows: bool = False) -> tuple[Tensor, Tensor]:
    """The combine in plain PyTorch: partials [..., S, DV] and [..., S] -> (out [..., DV], lse [...]). Splits with
    lse -inf weigh 0; a row with every split at -inf gets lse -inf and out NaN (0/0), as eager softmax gives (0
    with ``zero_empty_rows``, as SDPA gives)."""
    top = lse_part.amax(-1, keepdim=True)
    weights = torch.exp(lse_part - torch.where(torch.isneginf(top), 0.0, top))
    total = weights.sum(-1)
    out = (weights.unsqueeze(-1) * out_part).sum(-2) / total.unsqueeze(-1)
    if zero_empty_rows:
        out = out.masked_fill((total == 0).unsqueeze(-1), 0.0)
    return out, torch.log(total) + top.squeeze(-1).nan_to_num(neginf=0.0)


def split_reference(q: Tensor, k: Tensor, v: Tensor, score_tensors: Sequence[Tensor], spec: AttentionSpec,
                    bounds: Sequence[int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Split-K in plain PyTorch (in q's dtype: run it on fp64 copies): the attention of each key range
    [bounds[i], bounds[i + 1]) on the reference's masked scores, then :func:`combine_reference`. Returns
    (out, lse, out_part [Z, H, M, S, DV], lse_part [Z, H, M, S]); a split where a row sees no key has lse -inf
    and out 0."""
    scores = reference_scores(q, k, score_tensors, spec)
    keys = torch.arange(k.shape[2], device=q.device)
    outs, lses = [], []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        s = scores.masked_fill((keys < lo) | (keys >= hi), float("-inf"))
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse).unsqueeze(-1))
        outs.append(p @ v.repeat_interleave(spec.gqa_group, 1).to(p.dtype))
        lses.append(lse)
    out_part, lse_part = torch.stack(outs, -2), torch.stack(lses, -1)
    out, lse = combine_reference(out_part, lse_part, zero_empty_rows=spec.empty_rows == "zero")
    return out, lse, out_part, lse_part


def reference_scores(q: Tensor, k: Tensor, score_tensors: Sequence[Tensor], spec: AttentionSpec) -> Tensor:
    """The modified, masked scores [Z, H, M, N] as :func:`fuse_attn.kernels.reference.reference_attention` computes
    them."""
    kk = k.repeat_interleave(spec.gqa_group, dim=1)
    s = (q @ kk.transpose(-2, -1)) * spec.scale_for(q.shape[3])
    Z, H, M, N = s.shape
    s = score_program_values(s, score_tensors, spec, 0, M, N)[-1]
    if spec.causal is not None:
        s = s.masked_fill(~causal_visible(0, M, M, N, spec, s.device), float("-inf"))
    return s
