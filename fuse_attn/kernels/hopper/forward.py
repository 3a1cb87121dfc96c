"""The forward of plain attention on Hopper GPUs, written in Gluon: ``torch.ops.fuse_attn.flash_attention_hopper``.

Triton's compiler places one wgmma wait per ``tl.dot`` in the generated template, so on an H100 its forward runs
the softmax and the matmuls one after the other. Gluon, Triton's lower-level language, states the schedule instead,
as FlashAttention-3 does:

* warp specialization: a CTA takes ``CONSUMERS * BLOCK_M`` query rows. One to three consumer warpgroups (the
  default partition and 4-warp workers; one for short causal rows, CTAs then sharing an SM) own ``BLOCK_M`` rows
  each; a 1-warp producer loads the q tiles and a ring of k / v tiles by TMA.
  A consumer frees a ring stage with an mbarrier arrive, never a CTA-wide barrier, so the two warpgroups drift apart
  and one's softmax overlaps the other's matmuls. Registers move from the producer to the consumers
  (``setmaxnreg``: :func:`register_split`).
* within a consumer, tile j's q k^T and tile j-1's P v are issued together, and tile j's softmax runs while P v is
  on the tensor cores (FA3's intra-warpgroup overlap).
* causal calls of few CTAs (:data:`_PAIR_UP_TO_WAVES`): a CTA takes two query blocks, a long row band and a short one,
  one after the other (the k / v ring runs on; each consumer's q tile is reloaded once its output is stored).
* calls of many CTAs over fewer than 4096 keys (:func:`runs_persistent`): a persistent grid, as many CTAs as the SMs
  hold, each taking every grid-th query block of all the heads' (unmasked, D128's two-consumer config) or every
  grid-th item of two blocks of equal work (causal, past the waves that pair: :func:`causal_items`), the ring running
  on from one block to the next.
* 4-D TMA descriptors over q, k, v and the output as they lie in memory (any strides TMA takes): rows past a length
  read as zeros and are never stored, so lengths need not be multiples of a tile.

What it computes: ``softmax(q k^T * scale [causal]) v`` and the row log-sum-exp, exactly the spec's plain forward
(:func:`.common.hopper_reasons` says which specs: no dropout, a score program only as below; fp16/bf16; head dim 64
or 128, or q / k 192 with v 128 (DeepSeek-V3's MLA: the output is staged in the q tile's bytes); causal only top-left
with equal lengths, with or without a sliding window (a query block's key tiles from its first row's window on, the
tiles a window's lower edge crosses masked; one block a CTA); GQA by sharing each kv head), or
``softmax(q k^T * scale + bias ...)`` where the spec's program adds its one bias tensor (:func:`.common.adds_a_bias`),
the op's ``bias``, with the generated template's semantics for rows the bias hides wholly (``empty_rows``). Its tiles
come by TMA with each k / v tile, one a consumer in every ring stage (``BIAS_TMA``), where TMA can read the bias in
place and the stages fit beside them (:data:`_BIAS_TMA_CONFIGS`, :func:`bias_ring_stages`); else each consumer loads
its rows of the tile from global memory into registers beside S.
Or the plain scores masked by a predicate of integer vectors, the op's ``vectors``
(:func:`.common.masks_by_a_predicate`: packed documents): each CTA visits the key tiles the tile-classes kernel lists
for its query block (``MASK_BLOCKS``, two launches a call), the first run of full ones plain, the rest through the
spec's program, generated as a Gluon function (codegen's ``gluon_score_program``) and passed as a constexpr argument.
A key padding vector (:func:`.common.pads_keys`: Hugging Face's padded batches, with the causal band written into the
mask or none) goes the same way over the tiles :mod:`.key_range_tiles` lists per call from the vector, and a mask
tensor of the heads (:func:`.common.masks_by_a_summary`: a mask passed in) over those :mod:`.mask_tiles` lists from
its values.
Or every score through such a program of float tensors, the op's ``vectors`` then (``SCORED``,
:func:`.common.scores_by_a_program`: a softcap, ALiBi from slopes), in every tile.
Outputs match the generated template's: ``out [Z, H, M, D]`` and ``lse [Z, H, M]`` (fp32, natural log). The op's
autograd formula is the Gluon backward (:mod:`.backward`, its own op) on the GPU and the template's backward on CPU
tensors. The reference is the template's own: :func:`fuse_attn.kernels.reference.reference_attention`; the tests
compare both against it.

It is one candidate of the compile-time choice (:mod:`fuse_attn.kernels.dispatch`, name ``gluon``), timed against
the generated template (and SDPA's kernels where allowed). Inductor cannot launch Gluon kernels from its output code
(torch 2.11-2.13: user kernels must be ``triton.jit`` and their descriptors Triton's), so this op is opaque to it: a
library op whose Python launcher runs on every call, launching the compiled kernel positionally
(:class:`..positional_launch.PositionalLaunch`; its host cost: docs/performance.md). On CPU tensors it runs the
generated forward (the interpreter or the blockwise path), so its wiring is testable without a GPU.
"""

from __future__ import annotations

import functools
from typing import Sequence

import torch
import triton
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)

from fuse_attn.kernels import ops
from fuse_attn.kernels.generated.launch import batch_rows_innermost, broadcast_strides, empty_outputs
from fuse_attn.kernels.hopper.common import (LIBRARY, LOG2E, batch_and_head, bias_of_head, bias_tma_head, bias_tma_view,
                                             causal_window, checked_call, ctas_at_once, dense_fields, described,
                                             dscore_kv_heads, fills_at_most, head_dim_part, in_place_fields,
                                             listed_tiles, log2_units, lists_tiles, op_score_tensors,
                                             parsed_spec, reinterpret_shared, score_program_functions,
                                             scores_by_a_program, scores_over_parts, shared_memory_for_tiles,
                                             tile_lists, tma_descriptor, tma_load, tma_load_parts, tma_store,
                                             vector_slots, with_base)
from fuse_attn.kernels.positional_launch import PositionalLaunch
from fuse_attn.spec import AttentionSpec

# Per head dim of q and k: (rows per consumer warpgroup, key tile, ring stages, consumer warpgroups), the fastest of a
# sweep over key tiles, stages and consumers (H100, N 1k-16k). D128: 2 q tiles + 3 k / v stages = 224 of the 227 KiB a
# CTA may use. D192 (v 128, MLA; H200, B * N 16k-32k, N 2k-16k, causal and not, against cuDNN): 64-key tiles on three
# consumers, 3 stages (q 72 + 3 x 40 KiB, 160 registers a consumer thread without spills) ran 1.04-1.09x cuDNN but
# causal N4096's 0.97x; two consumers 0.91-1.05x (3 or 4 stages), 128-key tiles (2 stages fit) 0.81-0.93x.
_CONFIGS = {64: (64, 128, 3, 3), 128: (64, 128, 3, 2), 192: (64, 64, 3, 3)}
# Causal calls over fewer rows than the number: one consumer of 64-key tiles, whose CTAs share an SM
# (_ONE_CONSUMER_CTAS_AN_SM) and so overlap the prologue and epilogue that short rows leave exposed. The number: where
# the head dim's config caught up in a sweep over N 1k-4k (H100, H200).
_SHORT_CAUSAL_CONFIGS = {64: (4096, (64, 64, 3, 1)), 128: (1664, (64, 64, 3, 1))}
# A bias that TMA reads rides in the k / v ring (BIAS_TMA): 64-key tiles keep 4 stages beside it (an fp32 bias 3:
# bias_ring_stages) where 128-key tiles keep 2 and spill at D64 (ptxas); the fastest with a bias (H100, N4096).
_BIAS_TMA_CONFIGS = {64: (64, 64, 4, 3), 128: (64, 64, 4, 2)}
# A predicate's listed tiles (MASK_BLOCKS): a CTA's rows are the tile-classes kernel's query blocks, a power of two
# (its tl.arange): two consumers, D128's config at D64 too.
_MASK_BLOCKS_CONFIGS = {64: (64, 128, 3, 2), 128: (64, 128, 3, 2)}
# setmaxnreg budgets a thread, (consumer, producer), by consumer warpgroups: within the 512 a thread of each of 128
# lanes (2 x 232 + 40, 3 x 160 + 32: FlashAttention-3's split for three), what each kernel holds without spills
# (ptxas, sm90a; D128's spill at 160, so D128 keeps two consumers). One consumer: register_split.
_REGISTERS = {2: (232, 40), 3: (160, 32)}
_REGISTERS_AN_SM = 65536  # Hopper's register file, 32-bit registers
_THREADS_A_WARPGROUP = 128
_REGISTER_UNIT = 8  # setmaxnreg's counts and a launch's registers a thread are multiples of 8
# CTAs an SM of the one-consumer configs: as many as the shared memory holds (D64's 57 KB, D128's 115 KB) and ptxas
# compiles in the registers that leaves a thread (launch_registers; D128 with 32-key tiles would fit three, but ptxas
# refuses that kernel at 80 registers, C7602). At D64 three ran faster than two and as fast as four (H200, N 1k-4k).
_ONE_CONSUMER_CTAS_AN_SM = {64: 3, 128: 2}
_ONE_CONSUMER_PRODUCER_REGISTERS = 24  # setmaxnreg's least: the producer's one warp only issues TMA copies
# Causal CTAs of one query block each are unequal (the last block meets every key tile, the first one), and where
# they are few the longest run on alone at the end: up to this many waves of them, a CTA takes blocks n - 1 - pid and
# pid instead, as the backward pairs key tiles (faster up to 8 waves, not at 15: H100, H200). Not with three consumers
# (that kernel spills paired, and ran slower); unmasked CTAs are equal, nothing to pair.
_PAIR_UP_TO_WAVES = 8
_PAIR_UP_TO_CONSUMERS = 2
# A persistent grid (every grid-th query block, or causal item of two blocks of equal work, on as many CTAs as the SMs
# hold) loads a CTA's next k / v tiles while it finishes a block: faster below this many keys, not from there (H200,
# N 1k-16k). Unmasked only D128's two-consumer config (D64's three-consumer kernel spills, and ran slower); no bias.
_PERSISTENT_CONSUMERS = 2
_PERSISTENT_BELOW_KEYS = 4096
# Ring stages a config keeps at least with its bias tiles in the ring (BIAS_TMA); fewer, the consumers load the bias:
# one stage would leave the producer nothing to load while the consumers compute.
_MIN_BIAS_RING_STAGES = 2


def forward_config(head_dim: int, causal: bool, rows: int, bias_by_tma: bool = False,
                   mask_blocks: bool = False) -> tuple[int, int, int, int]:
    """The tile config of :data:`_CONFIGS` (or :data:`_SHORT_CAUSAL_CONFIGS`, or :data:`_BIAS_TMA_CONFIGS` where
    ``bias_by_tma``: a bias TMA can read, or :data:`_MASK_BLOCKS_CONFIGS` for a predicate's listed tiles) for a
    call."""
    if mask_blocks:
        return _MASK_BLOCKS_CONFIGS[head_dim]
    if causal and head_dim in _SHORT_CAUSAL_CONFIGS:
        below, config = _SHORT_CAUSAL_CONFIGS[head_dim]
        if rows < below:
            return config
    return _BIAS_TMA_CONFIGS[head_dim] if bias_by_tma else _CONFIGS[head_dim]


# ---- the kernel ------------------------------------------------------------------------------------------------------
@gluon.jit
def _keys_kept(offs_m, offs_n, N, CAUSAL: gl.constexpr, window=0, WINDOWED: gl.constexpr = False):
    """Which (row offs_m, key offs_n) pairs of a masked tile are scored: keys below N and (CAUSAL) at or below the
    row's diagonal, and (WINDOWED) among its ``window`` latest."""
    keep = offs_n[None, :] < N
    if CAUSAL:
        keep = keep & (offs_m[:, None] >= offs_n[None, :])
    if WINDOWED:
        keep = keep & (offs_m[:, None] - offs_n[None, :] < window)
    return keep


@gluon.jit
def _softmax_tile(s, m_i, l_i, offs_m, offs_n, N, qk_scale, MASK: gl.constexpr, CAUSAL: gl.constexpr, window,
                  WINDOWED: gl.constexpr):
    """One tile's online softmax in log2 units: P (fp32, unnormalized), the new running max and sum, and alpha (what
    rescales the output accumulated under the old max). MASK: the tile holds keys past N, past the diagonal or
    (WINDOWED) before a row's window. A window's first tiles can hide every key of a row (one whose window starts
    past them): :func:`_hiding_softmax_tile`."""
    if MASK:
        s = gl.where(_keys_kept(offs_m, offs_n, N, CAUSAL, window, WINDOWED), s, float("-inf"))
    if WINDOWED:
        return _hiding_softmax_tile(s * qk_scale, m_i, l_i)
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _hiding_softmax_tile(s, m_i, l_i):
    """:func:`_softmax_tile` of scores already in log2 units that may hide every key a row has seen so far (-inf): the
    max then stays -inf, and the exponents are taken against 0 instead, so that such keys give P = 0, not
    exp2(-inf + inf) = NaN (the generated template's ``m_safe``)."""
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s - m_safe[:, None])
    alpha = gl.exp2(m_i - m_safe)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _program_softmax_tile(s, m_i, l_i, offs_m, offs_n, M, N, qk_scale, z, h, vectors, MASK: gl.constexpr,
                          PROGRAM: gl.constexpr):
    """:func:`_softmax_tile` of a tile the tile-classes kernel listed (MASK_BLOCKS): MASK, a partial tile, the scores
    through the spec's program (``PROGRAM``, generated: the mask's predicate of the integer ``vectors`` evaluated here;
    keys past N -inf); else a full one, the plain scores. The program can hide every key a row has seen so far
    (:func:`_hiding_softmax_tile`)."""
    s = s * qk_scale
    if MASK:
        s = gl.where(offs_n[None, :] < N, PROGRAM(s, z, h, offs_m, offs_n, M, N, vectors), float("-inf"))
    return _hiding_softmax_tile(s, m_i, l_i)


@gluon.jit
def _scored_softmax_tile(s, m_i, l_i, offs_m, offs_n, M, N, qk_scale, z, h, vectors, MASK: gl.constexpr,
                         CAUSAL: gl.constexpr, window, WINDOWED: gl.constexpr, PROGRAM: gl.constexpr):
    """:func:`_softmax_tile` of the scores through the spec's program (SCORED: a pointwise change of every score,
    generated, :func:`.common.scores_by_a_program`), then masked where MASK as the plain scores are (a window's first
    tiles can hide every key of a row: :func:`_hiding_softmax_tile`)."""
    s = PROGRAM(s * qk_scale, z, h, offs_m, offs_n, M, N, vectors)
    if MASK:
        s = gl.where(_keys_kept(offs_m, offs_n, N, CAUSAL, window, WINDOWED), s, float("-inf"))
    return _hiding_softmax_tile(s, m_i, l_i)


@gluon.jit
def _key_tile(blist, t0, j, MASK_BLOCKS: gl.constexpr):
    """The key tile of a query block's j-th visit: its j-th listed (MASK_BLOCKS: ``blist``, the block's row of the
    tile-classes kernel's lists), else tile t0 + j (t0: the block's first, 0 but under a window)."""
    if MASK_BLOCKS:
        return gl.load(blist + j)
    return t0 + j


@gluon.jit
def _load_bias(bias_rows, offs_m, offs_n, N, stride_bn, MASK: gl.constexpr, CAUSAL: gl.constexpr):
    """The bias tile of rows ``bias_rows`` (pointers to each row's key 0) and keys offs_n, as stored. MASK: the tile
    holds keys past N or (CAUSAL) past the diagonal of rows offs_m; those read as -inf, which masks them (the load's
    predicate is the mask: no separate select, and no key past N is read). Loaded before the tile's S is waited for
    and converted after (:func:`.common.log2_units`), held in its own dtype meanwhile (bf16: half the registers): the
    order ptxas spills least in at D128 (sm90a; converted before the wait, or masked only in a tile past N, more)."""
    # (the mask before the addresses: with them first, ptxas scheduled the D128 causal kernel's softmax differently)
    keep = _keys_kept(offs_m, offs_n, N, CAUSAL) if MASK else None
    ptrs = bias_rows[:, None] + (offs_n * stride_bn)[None, :]
    if MASK:
        return gl.load(ptrs, mask=keep, other=float("-inf"))
    return gl.load(ptrs)


@gluon.jit
def _bias_tile(bias_rows, bias_smem, slot, offs_m, offs_n, N, stride_bn, s_layout: gl.constexpr, MASK: gl.constexpr,
               CAUSAL: gl.constexpr, BIAS_TMA: gl.constexpr):
    """The bias tile of key tile offs_n for rows offs_m, as stored, -inf where MASK masks it: BIAS_TMA, read from the
    ring slot the producer loaded by TMA with the tile's k and v (keys past N and rows past M read as 0 there, the
    keys then masked); else loaded from global memory (:func:`_load_bias`)."""
    if BIAS_TMA:
        bias = bias_smem.index(slot).load(s_layout)
        if MASK:
            bias = gl.where(_keys_kept(offs_m, offs_n, N, CAUSAL), bias, float("-inf"))
        return bias
    return _load_bias(bias_rows, offs_m, offs_n, N, stride_bn, MASK, CAUSAL)


@gluon.jit
def _biased_softmax_tile(s, bias, m_i, l_i, qk_scale):
    """:func:`_softmax_tile` of the scores plus a bias tile (as loaded, :func:`_load_bias`: -inf where masked), which
    can hide every key a row has seen so far (:func:`_hiding_softmax_tile`)."""
    s = s * qk_scale + log2_units(bias)  # (masked keys: the bias tile's -inf)
    return _hiding_softmax_tile(s, m_i, l_i)


@gluon.jit
def _waited_softmax_tile(s, m_i, l_i, offs_m, offs_n, N, qk_scale, bias_rows, stride_bn, bias_smem, slot,
                         s_layout: gl.constexpr, PENDING: gl.constexpr, MASK: gl.constexpr, CAUSAL: gl.constexpr,
                         HAS_BIAS: gl.constexpr, BIAS_TMA: gl.constexpr, M, z, h, vectors, MASK_BLOCKS: gl.constexpr,
                         PROGRAM: gl.constexpr, window, WINDOWED: gl.constexpr, SCORED: gl.constexpr):
    """A tile's S waited for (PENDING wgmmas left in flight) and its online softmax (:func:`_softmax_tile`), or with
    HAS_BIAS its bias tile read before the wait (:func:`_bias_tile`, :func:`_biased_softmax_tile`), or with
    MASK_BLOCKS through the spec's program where MASK (:func:`_program_softmax_tile`), or with SCORED through it
    everywhere (:func:`_scored_softmax_tile`)."""
    if MASK_BLOCKS:
        s = warpgroup_mma_wait(PENDING, deps=(s, ))
        p, m_i, l_i, alpha = _program_softmax_tile(s, m_i, l_i, offs_m, offs_n, M, N, qk_scale, z, h, vectors, MASK,
                                                   PROGRAM)
    elif SCORED:
        s = warpgroup_mma_wait(PENDING, deps=(s, ))
        p, m_i, l_i, alpha = _scored_softmax_tile(s, m_i, l_i, offs_m, offs_n, M, N, qk_scale, z, h, vectors, MASK,
                                                  CAUSAL, window, WINDOWED, PROGRAM)
    elif HAS_BIAS:
        bias = _bias_tile(bias_rows, bias_smem, slot, offs_m, offs_n, N, stride_bn, s_layout, MASK, CAUSAL, BIAS_TMA)
        s = warpgroup_mma_wait(PENDING, deps=(s, ))
        p, m_i, l_i, alpha = _biased_softmax_tile(s, bias, m_i, l_i, qk_scale)
    else:
        s = warpgroup_mma_wait(PENDING, deps=(s, ))
        p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, offs_m, offs_n, N, qk_scale, MASK, CAUSAL, window, WINDOWED)
    return p, m_i, l_i, alpha


@gluon.jit
def _consumer_tile(q_smem, k_smem, v_smem, kv_ready, kv_empty, acc, p_op, m_i, l_i, s_zero, offs_m, N, qk_scale, j,
                   r0, bias_rows, stride_bn, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, col_layout: gl.constexpr,
                   o_layout: gl.constexpr, p_layout: gl.constexpr, MASK: gl.constexpr, CAUSAL: gl.constexpr,
                   HAS_BIAS: gl.constexpr, bias_smem, C: gl.constexpr, CONSUMERS: gl.constexpr,
                   s_layout: gl.constexpr, BIAS_TMA: gl.constexpr, PARTS: gl.constexpr, M, z, h, vectors, blist,
                   MASK_BLOCKS: gl.constexpr, PROGRAM: gl.constexpr, t0, window, WINDOWED: gl.constexpr,
                   SCORED: gl.constexpr):
    """The block's j-th key tile (ring position r0 + j; :func:`_key_tile`, t0 the block's first): its q k^T
    and the last tile's P v in flight together (and the bias tile's loads, HAS_BIAS); this tile's softmax while P v
    runs; then the last tile's ring stage is released and the output rescaled."""
    r = r0 + j
    stage = r % STAGES
    mbarrier.wait(kv_ready.index(stage), (r // STAGES) & 1)
    s = scores_over_parts(q_smem, C * PARTS, k_smem, stage * PARTS, s_zero, PARTS)  # (consumer C's q)
    prev = (r - 1) % STAGES
    acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
    offs_n = _key_tile(blist, t0, j, MASK_BLOCKS) * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_layout)
    p, m_i, l_i, alpha = _waited_softmax_tile(s, m_i, l_i, offs_m, offs_n, N, qk_scale, bias_rows, stride_bn, bias_smem,
                                              stage * CONSUMERS + C, s_layout, 1, MASK, CAUSAL, HAS_BIAS,
                                              BIAS_TMA, M, z, h, vectors, MASK_BLOCKS,
                                              PROGRAM, window, WINDOWED, SCORED)  # (P v stays in flight)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
    mbarrier.arrive(kv_empty.index(prev))
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p_op = gl.convert_layout(p.to(p_op.dtype), p_layout)
    return acc, p_op, m_i, l_i


@gluon.jit
def _release_tiles(kv_ready, kv_empty, r0, first, n_tiles, STAGES: gl.constexpr):
    """Key tiles [first, n_tiles) of a query block whose tile 0 took ring position r0, released once loaded, not
    read."""
    for j in range(r0 + first, r0 + n_tiles):
        mbarrier.wait(kv_ready.index(j % STAGES), (j // STAGES) & 1)
        mbarrier.arrive(kv_empty.index(j % STAGES))


@gluon.jit
def _block_of(it, pid_m, second, bh, Z, H, M, N, CAUSAL: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
              PERSISTENT: gl.constexpr, BATCH_INNER: gl.constexpr, block_lists, MASK_BLOCKS: gl.constexpr, window,
              WINDOWED: gl.constexpr):
    """The CTA's it-th query block: its (batch row, head), first row, first key tile (WINDOWED: that of its first
    row's window, else 0) and key tiles to visit from there (MASK_BLOCKS: those the tile-classes kernel listed,
    :func:`.common.listed_tiles`). PERSISTENT: unmasked, block
    pid_m + it x (the grid's CTAs) of every head's blocks, a head's blocks in a row; causal, block it % 2 of item
    pid_m + (it // 2) x (the grid's CTAs) of :func:`causal_items` (blocks - 1 - p and p of a head, the longer first,
    and where the blocks a head are odd the middle blocks of two heads: items of equal work). Else block
    ``pid_m``, then (paired) block ``second``, of grid row bh's head."""
    if PERSISTENT and CAUSAL:
        blocks = gl.cdiv(M, ROWS)
        pairs = blocks // 2
        odd = blocks % 2
        t = pid_m + (it // 2) * gl.num_programs(0)
        r = t % (2 * pairs + odd)  # in heads 2 g and 2 g + 1's items: 2 g's pairs, their middle blocks, 2 g + 1's
        middle = (odd == 1) & (r == pairs)
        second_head = (r >= pairs + odd).to(gl.int32)
        head = 2 * (t // (2 * pairs + odd)) + gl.where(middle, it % 2, second_head)
        z, h = batch_and_head(head, Z, H, BATCH_INNER)
        p = r - second_head * (pairs + odd)
        row0 = gl.where(middle, pairs, gl.where(it % 2 == 0, blocks - 1 - p, p)) * ROWS
    elif PERSISTENT:
        blocks = gl.cdiv(M, ROWS)
        t = pid_m + it * gl.num_programs(0)
        z, h = batch_and_head(t // blocks, Z, H, BATCH_INNER)
        row0 = (t % blocks) * ROWS
    else:
        z, h = batch_and_head(bh, Z, H, BATCH_INNER)
        row0 = (pid_m + it * (second - pid_m)) * ROWS  # it is 0 or 1
    t0 = 0
    if MASK_BLOCKS:
        _, _, n_tiles = listed_tiles(block_lists, z, row0 // ROWS, gl.cdiv(N, BLOCK_N))
    elif CAUSAL:
        if WINDOWED:
            t0 = gl.maximum(row0 - window + 1, 0) // BLOCK_N
        n_tiles = gl.cdiv(gl.minimum(row0 + ROWS, N), BLOCK_N) - t0
    else:
        n_tiles = gl.cdiv(N, BLOCK_N)
    return z, h, row0, t0, n_tiles


@gluon.jit
def _consumer_block(o_desc, Lse, q_smem, k_smem, v_smem, q_bars, kv_ready, kv_empty, z, h, H, M, N, row0, t0,
                    n_tiles, r0, phase, qk_scale, bias_head, stride_bm, stride_bn, C: gl.constexpr,
                    CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                    HEAD_DV: gl.constexpr, STAGES: gl.constexpr, HAS_BIAS: gl.constexpr,
                    ZERO_EMPTY_ROWS: gl.constexpr, bias_smem, CONSUMERS: gl.constexpr, BIAS_TMA: gl.constexpr,
                    PARTS: gl.constexpr, block_lists, vectors, MASK_BLOCKS: gl.constexpr, PROGRAM: gl.constexpr,
                    window, WINDOWED: gl.constexpr, SCORED: gl.constexpr):
    """Consumer warpgroup C in the query block of rows ``row0`` on (its q tile's barrier at ``phase``, its n_tiles
    key tiles from tile t0, from ring position r0): rows ``row0 + C * BLOCK_M`` on, all the block's key tiles;
    stores the output and lse. A warpgroup whose rows all lie past M only releases the tiles (at D64, 192 rows a
    CTA, and N1024 the last CTA of each head has one warpgroup's rows).
    WINDOWED (causal, a sliding window of ``window`` keys): the warpgroup releases the block's tiles below its rows'
    windows unread, then visits its first tile and those its window's lower edge crosses masked, the ones wholly
    inside plain, the diagonal's masked.
    HAS_BIAS: the scores plus the bias at ``bias_head`` (this head's ``[M, N]`` by strides, 0 where broadcast), or
    (BIAS_TMA) its tiles in ``bias_smem``, slot ``stage * CONSUMERS + C``; a row whose every score is -inf gets out
    NaN (0 under ZERO_EMPTY_ROWS) and lse -inf, as the template's.
    MASK_BLOCKS: the key tiles the tile-classes kernel listed for the block (``block_lists``), its first run of full
    ones plain, the rest through the spec's program of the integer ``vectors`` (``PROGRAM``); every row's the same
    tiles (a row a program hides wholly gets the same as under a bias)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DV, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)

    start_m = row0 + C * BLOCK_M
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_layout)
    # tiles [n_low, n_full) need no mask: every key is below N and (causal) at or below each row's diagonal; causal,
    # this warpgroup's rows see only tiles [j0, n_mine) of the block's n_tiles (with three consumers the first one's
    # rows end a key tile before the block's last; under a window later ones start later); tiles [j0 + 1, n_low)
    # cross a window's lower edge
    blist = block_lists[0]  # (MASK_BLOCKS: the block's row of the lists)
    j0 = 0
    n_low = 1
    if MASK_BLOCKS:
        blist, n_run, _ = listed_tiles(block_lists, z, row0 // (CONSUMERS * BLOCK_M),
                                         gl.cdiv(N, BLOCK_N))
        n_mine = n_tiles
        n_full = gl.maximum(n_run, 1)
    elif CAUSAL and WINDOWED:  # (tile indices from the block's first, t0)
        j0 = gl.maximum(start_m - window + 1, 0) // BLOCK_N - t0
        n_mine = gl.cdiv(gl.minimum(start_m + BLOCK_M, N), BLOCK_N) - t0
        n_low = gl.maximum(gl.cdiv(gl.maximum(start_m + BLOCK_M - window, 0), BLOCK_N) - t0, j0 + 1)
        n_full = gl.minimum(gl.maximum((start_m + 1) // BLOCK_N - t0, n_low), n_mine)
    elif CAUSAL:
        n_mine = gl.cdiv(gl.minimum(start_m + BLOCK_M, N), BLOCK_N)
        n_full = gl.minimum(gl.maximum((start_m + 1) // BLOCK_N, 1), n_mine)
    else:
        n_mine = n_tiles
        n_full = gl.maximum(N // BLOCK_N, 1)
    mbarrier.wait(q_bars.index(C), phase)
    if start_m < M:
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_layout)
        l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=row_layout)
        acc = gl.zeros([BLOCK_M, HEAD_DV], gl.float32, layout=o_layout)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        # (a row past M reads the bias of row M - 1: its output is never stored)
        bias_rows = bias_head
        if HAS_BIAS:
            bias_rows = bias_head + gl.minimum(offs_m, M - 1).to(gl.int64) * stride_bm

        if WINDOWED:  # the block's tiles below these rows' windows
            _release_tiles(kv_ready, kv_empty, r0, 0, j0, STAGES)
        # tile j0 alone (nothing to overlap with), masked: it may hold keys past N, past the diagonal or before a
        # row's window
        r = r0 + j0
        mbarrier.wait(kv_ready.index(r % STAGES), (r // STAGES) & 1)
        s = scores_over_parts(q_smem, C * PARTS, k_smem, (r % STAGES) * PARTS, s_zero, PARTS)
        offs_n = _key_tile(blist, t0, j0, MASK_BLOCKS) * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_layout)
        p, m_i, l_i, alpha = _waited_softmax_tile(s, m_i, l_i, offs_m, offs_n, N, qk_scale, bias_rows, stride_bn,
                                                  bias_smem, (r % STAGES) * CONSUMERS + C, s_layout, 0, True, CAUSAL,
                                                  HAS_BIAS, BIAS_TMA, M, z, h, vectors, MASK_BLOCKS, PROGRAM, window,
                                                  WINDOWED, SCORED)
        p_op = gl.convert_layout(p.to(q_smem.dtype), p_layout)
        if WINDOWED:  # the other tiles the window's lower edge crosses
            for j in range(j0 + 1, n_low):
                acc, p_op, m_i, l_i = _consumer_tile(q_smem, k_smem, v_smem, kv_ready, kv_empty, acc, p_op, m_i, l_i,
                                                     s_zero, offs_m, N, qk_scale, j, r0, bias_rows, stride_bn,
                                                     BLOCK_N, STAGES, col_layout, o_layout, p_layout, True, CAUSAL,
                                                     HAS_BIAS, bias_smem, C, CONSUMERS, s_layout, BIAS_TMA, PARTS, M,
                                                     z, h, vectors, blist, MASK_BLOCKS, PROGRAM, t0, window, WINDOWED,
                                                     SCORED)
        for j in range(n_low, n_full):
            acc, p_op, m_i, l_i = _consumer_tile(q_smem, k_smem, v_smem, kv_ready, kv_empty, acc, p_op, m_i, l_i,
                                                 s_zero, offs_m, N, qk_scale, j, r0, bias_rows, stride_bn, BLOCK_N,
                                                 STAGES, col_layout, o_layout, p_layout, False, CAUSAL, HAS_BIAS,
                                                 bias_smem, C, CONSUMERS, s_layout, BIAS_TMA, PARTS, M, z, h, vectors,
                                                 blist, MASK_BLOCKS, PROGRAM, t0, window, WINDOWED, SCORED)
        # the masked tail (MASK_BLOCKS: the listed tiles after the first run of full ones)
        for j in range(n_full, n_mine):
            acc, p_op, m_i, l_i = _consumer_tile(q_smem, k_smem, v_smem, kv_ready, kv_empty, acc, p_op, m_i, l_i,
                                                 s_zero, offs_m, N, qk_scale, j, r0, bias_rows, stride_bn, BLOCK_N,
                                                 STAGES, col_layout, o_layout, p_layout, True, CAUSAL, HAS_BIAS,
                                                 bias_smem, C, CONSUMERS, s_layout, BIAS_TMA, PARTS, M, z, h, vectors,
                                                 blist, MASK_BLOCKS, PROGRAM, t0, window, WINDOWED, SCORED)
        last = (r0 + n_mine - 1) % STAGES
        acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
        mbarrier.arrive(kv_empty.index(last))
        _release_tiles(kv_ready, kv_empty, r0, n_mine, n_tiles, STAGES)  # the block's tiles past these rows' diagonal

        lse = (m_i + gl.log2(l_i)) / 1.4426950408889634  # log2(e): back to natural log, as the template stores it
        gl.store(Lse + (z * H + h) * M + offs_m, lse, mask=offs_m < M)
        out = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
        if ZERO_EMPTY_ROWS:  # (only a bias or a program can hide a row's every key: HAS_BIAS, MASK_BLOCKS)
            out = gl.where((gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)) == 0.0)[:, None], 0.0, out)
        # staged in this warpgroup's q tile, read only by its own finished matmuls; where v's head dim is not q's (or
        # q's comes in parts), the q tiles' bytes seen as output tiles, this warpgroup's the first within its q's
        o_tile = q_smem.index(C)
        if HEAD_DV != HEAD_D or PARTS != 1:
            o_first: gl.constexpr = (C * HEAD_D + HEAD_DV - 1) // HEAD_DV
            gl.static_assert((o_first + 1) * HEAD_DV <= (C + 1) * HEAD_D, "an output tile within its q tile's bytes")
            o_tile = reinterpret_shared(q_smem, o_desc.dtype, [CONSUMERS * HEAD_D // HEAD_DV, BLOCK_M, HEAD_DV],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DV],
                                                                             o_desc.dtype)).index(o_first)
        o_tile.store(out.to(o_desc.dtype))
        fence_async_shared()
        tma_store(o_desc, [z, h, start_m, 0], o_tile)  # rows past M are not written
        tma.store_wait(0)
    else:  # every row past M (the last block's spare warpgroups where M is no multiple of its rows): nothing to compute
        _release_tiles(kv_ready, kv_empty, r0, 0, n_tiles, STAGES)


@gluon.jit
def _consumer(C: gl.constexpr, o_desc, Lse, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, Z, H, M, N,
              pid_m, second, bh, n_blocks, qk_scale, Bias, stride_bz, stride_bh, stride_bm, stride_bn,
              CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
              HEAD_DV: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr, PAIRED: gl.constexpr,
              PERSISTENT: gl.constexpr, BATCH_INNER: gl.constexpr, HAS_BIAS: gl.constexpr,
              ZERO_EMPTY_ROWS: gl.constexpr, bias_smem, BIAS_TMA: gl.constexpr, PARTS: gl.constexpr, block_lists,
              vectors, MASK_BLOCKS: gl.constexpr, PROGRAM: gl.constexpr, window, WINDOWED: gl.constexpr,
              SCORED: gl.constexpr):
    """Consumer warpgroup C: the CTA's query block (:func:`_block_of`); paired or persistent, each of its n_blocks
    blocks in turn, freeing its q tile for the next (``q_free``) once the block's output is stored."""
    if PAIRED or PERSISTENT:
        r0 = 0  # the ring position of the block's first key tile
        for it in range(n_blocks):
            z, h, row0, t0, n_tiles = _block_of(it, pid_m, second, bh, Z, H, M, N, CAUSAL, CONSUMERS * BLOCK_M,
                                                BLOCK_N, PERSISTENT, BATCH_INNER, block_lists, MASK_BLOCKS, window,
                                                WINDOWED)
            _consumer_block(o_desc, Lse, q_smem, k_smem, v_smem, q_bars, kv_ready, kv_empty, z, h, H, M, N, row0, t0,
                            n_tiles, r0, it & 1, qk_scale, bias_of_head(Bias, z, h, stride_bz, stride_bh, HAS_BIAS),
                            stride_bm, stride_bn, C, CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, HEAD_DV, STAGES, HAS_BIAS,
                            ZERO_EMPTY_ROWS, bias_smem, CONSUMERS, BIAS_TMA, PARTS, block_lists, vectors, MASK_BLOCKS,
                            PROGRAM, window, WINDOWED, SCORED)
            mbarrier.arrive(q_free.index(C))
            r0 += n_tiles
    else:
        z, h, row0, t0, n_tiles = _block_of(0, pid_m, second, bh, Z, H, M, N, CAUSAL, CONSUMERS * BLOCK_M, BLOCK_N,
                                            PERSISTENT, BATCH_INNER, block_lists, MASK_BLOCKS, window, WINDOWED)
        _consumer_block(o_desc, Lse, q_smem, k_smem, v_smem, q_bars, kv_ready, kv_empty, z, h, H, M, N, row0, t0,
                        n_tiles, 0, 0, qk_scale, bias_of_head(Bias, z, h, stride_bz, stride_bh, HAS_BIAS), stride_bm,
                        stride_bn, C, CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, HEAD_DV, STAGES, HAS_BIAS, ZERO_EMPTY_ROWS,
                        bias_smem, CONSUMERS, BIAS_TMA, PARTS, block_lists, vectors, MASK_BLOCKS, PROGRAM, window,
                        WINDOWED, SCORED)


@gluon.jit
def _load_q(q_desc, q_smem, q_bars, q_free, z, h, row0, it, BLOCK_M: gl.constexpr, CONSUMERS: gl.constexpr,
            MANY_BLOCKS: gl.constexpr, PARTS: gl.constexpr, PART_D: gl.constexpr):
    """Every consumer's q tile of the CTA's it-th query block (in PARTS column parts of PART_D); where a CTA takes
    MANY_BLOCKS, each once its consumer gave the last one back (a fresh barrier passes a wait on parity 1: block 0's
    loads do not wait)."""
    for c in gl.static_range(CONSUMERS):
        if MANY_BLOCKS:
            mbarrier.wait(q_free.index(c), (it & 1) ^ 1)
        mbarrier.expect(q_bars.index(c), PARTS * q_desc.block_type.nbytes)
        tma_load_parts(q_desc, z, h, row0 + c * BLOCK_M, q_bars.index(c), q_smem, c * PARTS, PARTS, PART_D)


@gluon.jit
def _load_kv_tiles(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, z, h, h_kv,
                   row0, t0, n_tiles, r0, it, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                   CONSUMERS: gl.constexpr, MANY_BLOCKS: gl.constexpr, bias_desc, bias_smem, bz, bh,
                   BIAS_TMA: gl.constexpr, PARTS: gl.constexpr, PART_D: gl.constexpr, N, block_lists,
                   MASK_BLOCKS: gl.constexpr):
    """The it-th query block's n_tiles k / v tiles from tile t0 (MASK_BLOCKS: those listed, :func:`_key_tile`) into the
    ring (from position r0) as stages come free, and (BIAS_TMA) each consumer's bias tile beside them, of bias batch row
    bz and head bh; where a CTA takes MANY_BLOCKS, a later block's q tiles once its first STAGES tiles are asked for
    (those stages come free while the consumers finish the last block, its q buffers only after the consumers' output
    stores have read them)."""
    blist = block_lists[0]
    if MASK_BLOCKS:
        blist, _, _ = listed_tiles(block_lists, z, row0 // (CONSUMERS * BLOCK_M),
                                         gl.cdiv(N, BLOCK_N))
    for j in range(n_tiles):
        key0 = _key_tile(blist, t0, j, MASK_BLOCKS) * BLOCK_N
        r = r0 + j
        stage = r % STAGES
        # a fresh barrier passes a wait on parity 1, so the first STAGES loads do not wait
        mbarrier.wait(kv_empty.index(stage), ((r // STAGES) & 1) ^ 1)
        ready = kv_ready.index(stage)
        if BIAS_TMA:
            mbarrier.expect(ready, PARTS * k_desc.block_type.nbytes + v_desc.block_type.nbytes
                            + CONSUMERS * bias_desc.block_type.nbytes)
        else:
            mbarrier.expect(ready, PARTS * k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma_load_parts(k_desc, z, h_kv, key0, ready, k_smem, stage * PARTS, PARTS, PART_D)
        tma_load(v_desc, [z, h_kv, key0, 0], ready, v_smem.index(stage))
        if BIAS_TMA:  # (rows past M and keys past N read as 0; a consumer with no rows below M never reads its tile)
            for c in gl.static_range(CONSUMERS):
                tma_load(bias_desc, [bz, bh, row0 + c * BLOCK_M, key0], ready,
                          bias_smem.index(stage * CONSUMERS + c))
        if MANY_BLOCKS:
            if (it > 0) & (j == gl.minimum(n_tiles, STAGES) - 1):
                _load_q(q_desc, q_smem, q_bars, q_free, z, h, row0, it, BLOCK_M, CONSUMERS, MANY_BLOCKS, PARTS, PART_D)


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, Z, H, M, N, pid_m,
              second, bh, n_blocks, stride_bz, stride_bh, GQA_GROUP: gl.constexpr, CAUSAL: gl.constexpr,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
              PAIRED: gl.constexpr, PERSISTENT: gl.constexpr, BATCH_INNER: gl.constexpr, bias_desc, bias_smem,
              BIAS_TMA: gl.constexpr, PARTS: gl.constexpr, PART_D: gl.constexpr, block_lists,
              MASK_BLOCKS: gl.constexpr, window, WINDOWED: gl.constexpr):
    """The q tiles of every consumer, then the k / v tiles into the ring; paired or persistent, so for each query
    block in turn (the ring runs on). BIAS_TMA: the bias tiles of the bias's batch row and head where it has them
    (else 0)."""
    if PAIRED or PERSISTENT:
        r0 = 0
        for it in range(n_blocks):
            z, h, row0, t0, n_tiles = _block_of(it, pid_m, second, bh, Z, H, M, N, CAUSAL, CONSUMERS * BLOCK_M,
                                                BLOCK_N, PERSISTENT, BATCH_INNER, block_lists, MASK_BLOCKS, window,
                                                WINDOWED)
            if it == 0:
                _load_q(q_desc, q_smem, q_bars, q_free, z, h, row0, it, BLOCK_M, CONSUMERS, True, PARTS, PART_D)
            bias_z, bias_h = bias_tma_head(z, h, stride_bz, stride_bh)
            _load_kv_tiles(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, z, h,
                           h // GQA_GROUP, row0, t0, n_tiles, r0, it, BLOCK_M, BLOCK_N, STAGES, CONSUMERS, True,
                           bias_desc, bias_smem, bias_z, bias_h, BIAS_TMA, PARTS, PART_D, N, block_lists, MASK_BLOCKS)
            r0 += n_tiles
    else:
        z, h, row0, t0, n_tiles = _block_of(0, pid_m, second, bh, Z, H, M, N, CAUSAL, CONSUMERS * BLOCK_M, BLOCK_N,
                                            PERSISTENT, BATCH_INNER, block_lists, MASK_BLOCKS, window, WINDOWED)
        _load_q(q_desc, q_smem, q_bars, q_free, z, h, row0, 0, BLOCK_M, CONSUMERS, False, PARTS, PART_D)
        bias_z, bias_h = bias_tma_head(z, h, stride_bz, stride_bh)
        _load_kv_tiles(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, z, h,
                       h // GQA_GROUP, row0, t0, n_tiles, 0, 0, BLOCK_M, BLOCK_N, STAGES, CONSUMERS, False, bias_desc,
                       bias_smem, bias_z, bias_h, BIAS_TMA, PARTS, PART_D, N, block_lists, MASK_BLOCKS)


@gluon.jit
def _consumer_partition(C: gl.constexpr, args):
    """Consumer warpgroup C's partition: :func:`_consumer` of C and ``args``."""
    _consumer(C, *args)


@gluon.jit
def _warp_specialize(consumer_args, producer_args, CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                     PRODUCER_REGS: gl.constexpr):
    """The CTA's partitions: CONSUMERS consumer warpgroups (:func:`_consumer` of ``consumer_args``; C = 0 the default
    partition, the others 4-warp workers, at CONSUMER_REGS registers a thread) and the 1-warp producer
    (:func:`_producer` of ``producer_args``, at PRODUCER_REGS). The argument tuples come in as a call's arguments: a
    tuple assigned to a name in a kernel turns its constexprs into tensors."""
    if CONSUMERS == 1:
        gl.warp_specialize([(_consumer_partition, (0, consumer_args)), (_producer, producer_args)], [1],
                           [PRODUCER_REGS])
    elif CONSUMERS == 2:
        gl.warp_specialize([(_consumer_partition, (0, consumer_args)), (_consumer_partition, (1, consumer_args)),
                            (_producer, producer_args)], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([(_consumer_partition, (0, consumer_args)), (_consumer_partition, (1, consumer_args)),
                            (_consumer_partition, (2, consumer_args)), (_producer, producer_args)], [4, 4, 1],
                           [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])


@gluon.jit
def _hopper_attn_fwd(q_desc, k_desc, v_desc, o_desc, Lse, H, M, N, qk_scale, window, Bias, stride_bz, stride_bh,
                     stride_bm, stride_bn, Z, bias_desc, BlockList, BlockCounts, stride_blist_z, stride_bcount_z,
                     V0, stride_v0_z, stride_v0_h, stride_v0_m, stride_v0_n, V1, stride_v1_z, stride_v1_h, stride_v1_m,
                     stride_v1_n, V2, stride_v2_z, stride_v2_h, stride_v2_m, stride_v2_n, V3, stride_v3_z, stride_v3_h,
                     stride_v3_m, stride_v3_n, GQA_GROUP: gl.constexpr, CAUSAL: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, HEAD_DV: gl.constexpr,
                     PART_D: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
                     CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, PAIRED: gl.constexpr,
                     PERSISTENT: gl.constexpr, HAS_BIAS: gl.constexpr, BATCH_INNER: gl.constexpr,
                     ZERO_EMPTY_ROWS: gl.constexpr, BIAS_TMA: gl.constexpr, MASK_BLOCKS: gl.constexpr,
                     PROGRAM: gl.constexpr, WINDOWED: gl.constexpr, SCORED: gl.constexpr):
    gl.static_assert(CAUSAL or not PAIRED, "only causal calls pair query blocks")
    # SCORED: every score through the spec's program (PROGRAM) of the score tensors in the vector slots, no bias
    gl.static_assert(not SCORED or not (MASK_BLOCKS or HAS_BIAS), "a score program: no listed tiles, no bias")
    gl.static_assert(not (MASK_BLOCKS and (CAUSAL or PERSISTENT or HAS_BIAS)), "listed tiles: one block a CTA")
    # WINDOWED: causal keys among each row's ``window`` latest, one query block a CTA (its walk is the window's, about
    # equal for every block: nothing to pair), no bias
    gl.static_assert(not WINDOWED or (CAUSAL and not (PAIRED or PERSISTENT or HAS_BIAS or MASK_BLOCKS)),
                     "a window: causal, one block a CTA, no bias")
    # MASK_BLOCKS: the lists and counts of the tile-classes kernel, key_range_tiles or mask_tiles (common.tile_lists),
    # and the vectors (V0-V3, the spec's score tensors in order; slots past them unread) that PROGRAM reads
    block_lists = (BlockList, BlockCounts, stride_blist_z, stride_bcount_z)
    vectors = (V0, stride_v0_z, stride_v0_h, stride_v0_m, stride_v0_n, V1, stride_v1_z, stride_v1_h, stride_v1_m,
               stride_v1_n, V2, stride_v2_z, stride_v2_h, stride_v2_m, stride_v2_n, V3, stride_v3_z, stride_v3_h,
               stride_v3_m, stride_v3_n)
    # The CTA's query block, the longest first where causal; paired (causal, :func:`pairs_query_blocks`), blocks
    # blocks - 1 - pid and pid, a long row band and a short one (the middle one alone where they meet); persistent
    # (:func:`runs_persistent`), every grid-th block, causal every grid-th item of two, from pid (:func:`_block_of`)
    pid_m = gl.program_id(0)
    if PERSISTENT and CAUSAL:  # two blocks an item, but the last item where both blocks and heads are odd
        second = pid_m
        blocks = gl.cdiv(M, CONSUMERS * BLOCK_M)
        items = blocks // 2 * Z * H + blocks % 2 * gl.cdiv(Z * H, 2)
        lone = (blocks % 2 == 1) & (Z * H % 2 == 1) & ((items - 1) % gl.num_programs(0) == pid_m)
        n_blocks = 2 * gl.cdiv(items - pid_m, gl.num_programs(0)) - gl.where(lone, 1, 0)
    elif PERSISTENT:
        second = pid_m
        n_blocks = gl.cdiv(gl.cdiv(M, CONSUMERS * BLOCK_M) * Z * H - pid_m, gl.num_programs(0))
    elif PAIRED:
        second = pid_m
        pid_m = gl.cdiv(M, CONSUMERS * BLOCK_M) - 1 - pid_m
        n_blocks = gl.where(pid_m == second, 1, 2)
    else:
        if CAUSAL:
            pid_m = gl.num_programs(0) - 1 - pid_m
        second = pid_m
        n_blocks = 1
    bh = gl.program_id(1)

    # q and k tiles in PARTS column parts of PART_D each (the whole head dim, or 192's three 64-column TMA boxes)
    PARTS: gl.constexpr = HEAD_D // PART_D
    k_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, PART_D], q_desc.dtype)
    v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DV], q_desc.dtype)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, PART_D], q_desc.dtype)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS * PARTS, BLOCK_M, PART_D], q_layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES * PARTS, BLOCK_N, PART_D], k_layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DV], v_layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    q_free = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    # BIAS_TMA: a bias tile a consumer a ring stage, of the bias's batch row and head where it has them (else 0)
    bias_smem = k_smem  # (no BIAS_TMA: a stand-in, never read)
    if BIAS_TMA:
        bias_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], bias_desc.dtype)
        bias_smem = gl.allocate_shared_memory(bias_desc.dtype, [STAGES * CONSUMERS, BLOCK_M, BLOCK_N], bias_layout)
    for c in gl.static_range(CONSUMERS):
        mbarrier.init(q_bars.index(c), count=1)
        if PAIRED or PERSISTENT:  # (one block a CTA, q_free is never used)
            mbarrier.init(q_free.index(c), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=CONSUMERS)  # one arrive per consumer warpgroup

    _warp_specialize(
        (o_desc, Lse, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, Z, H, M, N, pid_m, second, bh,
         n_blocks, qk_scale, Bias, stride_bz, stride_bh, stride_bm, stride_bn, CAUSAL, BLOCK_M, BLOCK_N, HEAD_D,
         HEAD_DV, STAGES, CONSUMERS, PAIRED, PERSISTENT, BATCH_INNER, HAS_BIAS, ZERO_EMPTY_ROWS, bias_smem, BIAS_TMA,
         PARTS, block_lists, vectors, MASK_BLOCKS, PROGRAM, window, WINDOWED, SCORED),
        (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, Z, H, M, N, pid_m, second,
         bh, n_blocks, stride_bz, stride_bh, GQA_GROUP, CAUSAL, BLOCK_M, BLOCK_N, STAGES, CONSUMERS, PAIRED, PERSISTENT,
         BATCH_INNER, bias_desc, bias_smem, BIAS_TMA, PARTS, PART_D, block_lists, MASK_BLOCKS, window, WINDOWED),
        CONSUMERS, CONSUMER_REGS, PRODUCER_REGS)


# ---- launcher --------------------------------------------------------------------------------------------------------
def resident_ctas(head_dim: int, consumers: int) -> int:
    """How many CTAs of a config share an SM: :data:`_ONE_CONSUMER_CTAS_AN_SM` for one consumer, else one."""
    return _ONE_CONSUMER_CTAS_AN_SM[head_dim] if consumers == 1 else 1


def launch_registers(ctas: int) -> int | None:
    """Registers a thread at launch where ``ctas`` CTAs share an SM: the register file over their threads, 256 a CTA
    (Triton pads the producer's warp to a warpgroup), in whole units; None for one CTA an SM (Triton's default)."""
    if ctas == 1:
        return None
    return _REGISTERS_AN_SM // (ctas * 2 * _THREADS_A_WARPGROUP) // _REGISTER_UNIT * _REGISTER_UNIT


def register_split(head_dim: int, consumers: int) -> tuple[int, int]:
    """setmaxnreg's budgets a thread, (consumer, producer). One consumer: the producer takes the least and the
    consumer, Triton's default partition, what it leaves of the CTA's launch registers (two warpgroups' worth)."""
    if consumers != 1:
        return _REGISTERS[consumers]
    launch = launch_registers(resident_ctas(head_dim, consumers))
    return 2 * launch - _ONE_CONSUMER_PRODUCER_REGISTERS, _ONE_CONSUMER_PRODUCER_REGISTERS


def bias_ring_stages(block_m: int, block_n: int, stages: int, consumers: int, head_dim: int, dtype: torch.dtype,
                     bias_dtype: torch.dtype) -> int:
    """Ring stages of a config whose stages also hold each consumer's bias tile: as many of its ``stages`` as fit the
    shared memory a CTA may use (its share where one consumer lets CTAs share an SM), or 0 where fewer than
    :data:`_MIN_BIAS_RING_STAGES` fit."""
    budget = shared_memory_for_tiles(resident_ctas(head_dim, consumers))
    q_bytes = consumers * block_m * head_dim * dtype.itemsize
    stage_bytes = 2 * block_n * head_dim * dtype.itemsize + consumers * block_m * block_n * bias_dtype.itemsize
    fitting = min(stages, (budget - q_bytes) // stage_bytes)
    return fitting if fitting >= _MIN_BIAS_RING_STAGES else 0


def pairs_query_blocks(causal: bool, blocks: int, heads: int, head_dim: int, consumers: int,
                       device: torch.device) -> bool:
    """Whether a call's CTAs take two query blocks each (:data:`_PAIR_UP_TO_WAVES`): causal, a config of at most two
    consumers, and one block a CTA would fill at most that many waves of the device's SMs (off a GPU, no SMs: one
    block a CTA)."""
    return (causal and consumers <= _PAIR_UP_TO_CONSUMERS
            and fills_at_most(blocks * heads, _PAIR_UP_TO_WAVES, device, resident_ctas(head_dim, consumers)))


def causal_items(blocks: int, heads: int) -> int:
    """The items of a causal persistent grid (:func:`_block_of`): each head's blocks ``blocks - 1 - p`` and ``p`` in
    pairs and, where ``blocks`` is odd, the middle blocks of two heads an item (the last alone where ``heads`` is
    odd), heads 2 g and 2 g + 1 side by side: 2 g's pairs, their middle blocks, 2 g + 1's pairs (their k / v tiles
    in L2 for the next). Block ``b`` meets ``b + 1`` key tiles (the configs that pair take key tiles of a block's
    rows; causal, M == N), so each item meets ``blocks + 1``."""
    return blocks // 2 * heads + blocks % 2 * -(-heads // 2)


def runs_persistent(causal: bool, has_bias: bool, consumers: int, rows: int, blocks: int, heads: int, keys: int,
                    head_dim: int, device: torch.device) -> bool:
    """Whether a call's grid is persistent: plain attention over more than one query row (Triton 3.6 fails to lower
    that kernel where its launch specializes the length 1: a ConvertTritonGPUToLLVM assertion) over fewer than
    :data:`_PERSISTENT_BELOW_KEYS` keys, on a GPU (off one, no SMs to count: never). Unmasked
    (:data:`_PERSISTENT_CONSUMERS`): the two-consumer config, whose query blocks outnumber the CTAs the device's SMs
    hold at once (fewer, each CTA would take one anyway). Causal (:data:`_PAIR_UP_TO_WAVES`): a config that pairs (the
    grid's items are two blocks, :func:`causal_items`), more than one block a head (one: blocks of equal work), where
    one block a CTA would fill more waves than pairing takes (:func:`pairs_query_blocks`)."""
    if has_bias or rows <= 1 or keys >= _PERSISTENT_BELOW_KEYS or ctas_at_once(device) is None:
        return False
    if causal:
        return (consumers <= _PAIR_UP_TO_CONSUMERS and blocks > 1
                and not pairs_query_blocks(True, blocks, heads, head_dim, consumers, device))
    return consumers == _PERSISTENT_CONSUMERS and not fills_at_most(blocks * heads, 1, device)


@functools.lru_cache(maxsize=4096)
def _launch_plan(Z: int, H: int, M: int, N: int, D: int, causal: bool, dtype: torch.dtype,
                 bias_dtype: torch.dtype | None, bias_by_tma: bool, device: torch.device, ctas: int | None,
                 mask_blocks: bool = False, windowed: bool = False) -> tuple:
    """``(block_m, block_n, stages, consumers, ring_stages, grid, paired, persistent, consumer_regs, producer_regs,
    registers)`` of a call: what the launch rules decide from the sizes and the device's SMs (``ctas``: the CTAs they
    hold at once, :func:`.common.ctas_at_once`), once a shape, as the host time of a call should be the kernel's.
    ``mask_blocks``: the listed tiles of a predicate's mask (``MASK_BLOCKS``), one query block a CTA; ``windowed``: a
    causal sliding window, one query block a CTA (the blocks' walks are about equal)."""
    block_m, block_n, stages, consumers = forward_config(D, causal, M, bias_by_tma, mask_blocks)
    ring_stages = 0 if not bias_by_tma else bias_ring_stages(block_m, block_n, stages, consumers, D, dtype, bias_dtype)
    if ring_stages:  # the bias tiles come by TMA with k and v
        stages = ring_stages
    blocks = triton.cdiv(M, consumers * block_m)  # query blocks a head
    paired = not windowed and pairs_query_blocks(causal, blocks, Z * H, D, consumers, device)
    ctas_an_sm = resident_ctas(D, consumers)
    persistent = not (mask_blocks or windowed) and runs_persistent(causal, bias_dtype is not None, consumers, M, blocks,
                                                                   Z * H, N, D, device)
    if persistent:  # the grid's items: a block, or causal two (_block_of), every CTA taking every grid-th
        items = causal_items(blocks, Z * H) if causal else blocks * Z * H
        grid = (min(items, ctas_at_once(device, ctas_an_sm)), 1)  # (never paired: runs_persistent asks that)
    else:
        grid = (triton.cdiv(blocks, 2) if paired else blocks, Z * H)
    return (block_m, block_n, stages, consumers, ring_stages, grid, paired, persistent,
            *register_split(D, consumers), launch_registers(ctas_an_sm))


_launch_forward = PositionalLaunch(_hopper_attn_fwd)


class ForwardCall:
    """The forward of one call signature -- a spec and the inputs' shapes, strides, dtypes and device (the bias's
    alignment too) -- with what every call of it repeats worked out once: the launch plan (:func:`_launch_plan`), the
    kernel's arguments but the tensors, each TMA descriptor's fields but its base, and the compiled kernel's
    specialization. A call then allocates the outputs, sets the descriptors' bases and runs the compiled kernel. The op
    keeps one for each signature it meets (:func:`.common.checked_call`): in a compiled model's step each attention
    calls it with the same signature again."""

    def __init__(self, spec: AttentionSpec, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None,
                 vectors: Sequence[Tensor] = ()):
        Z, H, M, D = q.shape
        N, DV = k.shape[2], v.shape[3]
        causal = spec.causal is not None
        window = causal_window(spec, N)
        mask_blocks, scored = lists_tiles(spec), scores_by_a_program(spec)
        bias_view = None if bias is None else bias_tma_view(bias)
        (block_m, block_n, stages, consumers, ring_stages, self.grid, paired, persistent, consumer_regs, producer_regs,
         registers) = _launch_plan(Z, H, M, N, D, causal, q.dtype, None if bias is None else bias.dtype,
                                   bias_view is not None, q.device, ctas_at_once(q.device), mask_blocks, bool(window))
        # a predicate's mask, a key padding vector or a mask tensor (MASK_BLOCKS, common.lists_tiles): each call lists
        # the tiles of every query block of the CTA's rows
        self.tile_classes = tile_lists(spec, vectors, M, N, consumers * block_m, block_n, key_major=False)
        program = score_program_functions(spec)[0]
        self.out_shape, self.lse_shape = (Z, H, M, DV), (Z, H, M)
        part_d = head_dim_part(D)
        # the q, k and v descriptors' tiles: q and k's in column parts (their boxes a power of two wide)
        self.tiles = ((block_m, part_d), (block_n, part_d), (block_n, DV))
        self.fields = tuple(in_place_fields(t, *tile) for t, tile in zip((q, k, v), self.tiles))
        self.out_fields = dense_fields(self.out_shape, block_m, q.dtype)
        self.bias_tiles = (block_m, block_n) if ring_stages else None
        self.scalars = (H, M, N, spec.scale_for(D) * LOG2E, window)
        self.bias_strides = (0, 0, 0, 0) if bias is None else tuple(broadcast_strides(bias))
        self.flags = (spec.gqa_group, causal, block_m, block_n, D, DV, part_d, stages, consumers, consumer_regs,
                      producer_regs, paired, persistent, bias is not None, batch_rows_innermost(spec),
                      (bias is not None or bool(vectors)) and spec.empty_rows == "zero",  # (no plain row is empty)
                      ring_stages > 0, mask_blocks, program, bool(window), scored)
        self.options = {"num_warps": 4, **({} if registers is None else {"maxnreg": registers})}
        self.specializations = {}  # (PositionalLaunch.launch_kept)

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None,
                 vectors: Sequence[Tensor] = ()) -> tuple[Tensor, Tensor]:
        out = torch.empty(self.out_shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=q.device)
        lists, counts, stride_lists_z, stride_counts_z = lse, lse, 0, 0  # (no mask blocks: lse stands in, not read)
        if self.tile_classes is not None:
            listed = self.tile_classes(vectors)
            lists, counts = listed["BlockList"], listed["BlockCounts"]
            stride_lists_z, stride_counts_z = listed["stride_blist_z"], listed["stride_bcount_z"]
        q_desc, k_desc, v_desc = (described(t, fields, *tile) for t, fields, tile in zip((q, k, v), self.fields,
                                                                                         self.tiles))
        args = (q_desc, k_desc, v_desc, with_base(self.out_fields, out), lse, *self.scalars,
                lse if bias is None else bias, *self.bias_strides, self.out_shape[0],  # (no bias: lse, never read)
                # (no bias tiles in the ring: q's descriptor stands in, never read)
                q_desc if self.bias_tiles is None else tma_descriptor(bias_tma_view(bias), *self.bias_tiles),
                lists, counts, stride_lists_z, stride_counts_z, *vector_slots(vectors, lse), *self.flags)
        # (pointers whose alignment may change: the vectors; lse and the lists are new, the bias's alignment is part
        # of the signature)
        _launch_forward.launch_kept(self.specializations, tuple(vectors), self.grid, *args, **self.options)
        return out, lse


def hopper_forward(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec, bias: Tensor | None = None,
                   vectors: Sequence[Tensor] = ()) -> tuple[Tensor, Tensor]:
    """``(out [Z, H, M, DV], lse [Z, H, M] fp32)`` of a spec :func:`.common.hopper_reasons` accepts, on an sm90 GPU;
    ``bias`` the spec's score tensor where it adds one (:func:`.common.adds_a_bias`, no listed tiles), ``vectors`` its
    score tensors otherwise (:func:`.common.lists_tiles`, :func:`.common.scores_by_a_program`). Unchecked: the op
    checks its inputs once a signature and keeps the call (:class:`ForwardCall`)."""
    return ForwardCall(spec, q, k, v, bias, vectors)(q, k, v, bias, vectors)


# ---- the op and its autograd (on common.LIBRARY) ---------------------------------------------------------------------
LIBRARY.define("flash_attention_hopper(Tensor q, Tensor k, Tensor v, str spec, Tensor? bias=None, "
               "Tensor[]? vectors=None) -> (Tensor, Tensor)")


def flash_attention_hopper_op(q: Tensor, k: Tensor, v: Tensor, spec: str, bias: Tensor | None = None,
                              vectors: Sequence[Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """``(out, lse)`` as ``fuse_attn::flash_attention`` gives them for the spec (plain, ``s + bias`` with ``bias``
    its score tensor, or the plain scores masked by a predicate of the integer ``vectors``, its score tensors).
    Opaque to torch.compile."""
    vectors = vectors or ()
    if q.device.type != "cuda":  # (tests without a GPU) the generated forward: interpreter or blockwise
        return ops.forward_op(q, k, v, op_score_tensors(bias, vectors), None, spec, cpu_op=True)
    if ops.is_empty(q, k):
        checked_call("flash_attention_hopper", q, k, v, spec, bias, parsed_spec, vectors=vectors)
        return ops.empty_forward(q, v)
    return checked_call("flash_attention_hopper", q, k, v, spec, bias, ForwardCall, vectors=vectors)(q, k, v, bias,
                                                                                                   vectors)


# The same forward without an autograd formula, for graphs whose autograd is done: Inductor's post-grad pass
# (fuse_attn.backend.PostGradPass) calls it where AOTAutograd left the op. The op's formula, Python, would run on every
# call of a compiled step only to find nothing to record.
LIBRARY.define("flash_attention_hopper_no_autograd(Tensor q, Tensor k, Tensor v, str spec, Tensor? bias=None, "
               "Tensor[]? vectors=None) -> (Tensor, Tensor)")
for _device in ("CPU", "CUDA"):
    LIBRARY.impl("flash_attention_hopper", flash_attention_hopper_op, _device)
    LIBRARY.impl("flash_attention_hopper_no_autograd", flash_attention_hopper_op, _device)


@torch.library.register_fake("fuse_attn::flash_attention_hopper")
def _(q, k, v, spec, bias=None, vectors=None):
    ops.validate(q, k, v, op_score_tensors(bias, vectors or ()), ops.parse_spec(spec))
    return empty_outputs(q, v)


torch.library.register_fake("fuse_attn::flash_attention_hopper_no_autograd")(_)


def _setup_context(ctx, inputs, output):
    q, k, v, spec, *rest = inputs  # (a bias, or the vectors: the template op's score tensors)
    bias, vectors = (*rest, None, None)[:2]
    vectors = vectors or ()
    ctx.vectors = len(vectors)
    ops.autograd_setup_context(ctx, (q, k, v, op_score_tensors(bias, vectors), None, spec), output)


def _backward(ctx, dout, dlse):
    """The Gluon backward (:mod:`.backward`) on the GPU, the bias's gradient too where
    :func:`.common.dscore_kv_heads` admits it; the generated template's on CPU tensors (the op's forward there is the
    template's too) and for the other biases that need a gradient. Both take this forward's out and lse as their
    own."""
    q, k, v, out, lse, _, *score_tensors = ctx.saved_tensors
    bias = [] if ctx.vectors else score_tensors
    bias_grad = any(ctx.needs)
    vector_grads = [None] * ctx.vectors if ctx.vectors else None  # (none needs one: else the template's, below)
    # a gradient for each argument the op's call passed (the dispatcher leaves out trailing ones at their defaults)
    inputs = len(ctx.needs_input_grad)
    if q.device.type != "cuda" or bias_grad and (ctx.vectors or not dscore_kv_heads(q, k, bias[0])):
        # (a score program's tensors that need a gradient: the template's backward computes it)
        dq, dk, dv, dscores, *_ = ops.autograd_backward(ctx, dout, dlse)
        return (dq, dk, dv, None, (dscores[0] if bias else None), list(dscores) if ctx.vectors else None)[:inputs]
    if dout is None:  # only lse was used
        dout = torch.zeros_like(out)
    dq, dk, dv, dbias = torch.ops.fuse_attn.flash_attention_hopper_backward(
        dout, q, k, v, out, lse, ctx.spec, dlse, bias[0] if bias else None, bias_grad,
        score_tensors if ctx.vectors else None)
    return (dq, dk, dv, None, dbias if bias_grad else None, vector_grads)[:inputs]


torch.library.register_autograd("fuse_attn::flash_attention_hopper", _backward, setup_context=_setup_context)


def flash_attention_hopper(q: Tensor, k: Tensor, v: Tensor, spec, return_lse: bool = False,
                           bias: Tensor | None = None, vectors: Sequence[Tensor] = ()):
    """The op without torch.compile (differentiable); ``spec`` an :class:`AttentionSpec` or its JSON, ``bias`` its
    score tensor where its program adds one, ``vectors`` its score tensors where a predicate of them masks."""
    text = spec.to_json() if isinstance(spec, AttentionSpec) else spec
    out, lse = torch.ops.fuse_attn.flash_attention_hopper(q, k, v, text, bias, list(vectors) or None)
    return (out, lse) if return_lse else out
