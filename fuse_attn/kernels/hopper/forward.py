"""The forward of plain attention on Hopper GPUs, written in Gluon: ``torch.ops.fuse_attn.flash_attention_hopper``.

Triton's compiler places one wgmma wait per ``tl.dot`` in the generated template, so on an H100 its forward runs
the softmax and the matmuls one after the other (0.70-0.97x cuDNN, BENCHMARKS.md). Gluon, Triton's lower-level
language, states the schedule instead, as FlashAttention-3 does:

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
(:func:`hopper_reasons` says which specs: no score program, mask or dropout; fp16/bf16; head dim 64 or 128;
causal only top-left with equal lengths; GQA by sharing each kv head), or ``softmax(q k^T * scale + bias ...)`` where
the spec's program adds its one bias tensor (:func:`adds_a_bias`), the op's ``bias``, with the generated template's
semantics for rows the bias hides wholly (``empty_rows``). Its tiles come by TMA with each k / v tile, one a consumer
in every ring stage (``BIAS_TMA``), where TMA can read the bias in place and the stages fit beside them
(:data:`_BIAS_TMA_CONFIGS`: 64-key tiles at 4 stages, :func:`bias_ring_stages`); else each consumer loads its rows of
the tile from global memory into registers beside S. Outputs match the generated template's:
``out [Z, H, M, D]`` and ``lse [Z, H, M]`` (fp32, natural log). The op's autograd formula is the Gluon backward
(:mod:`.hopper_backward`, its own op) on the GPU and the template's backward on CPU tensors. The reference is the
template's own: :func:`.reference.reference_attention`; the tests compare both against it.

It is one candidate of the compile-time choice (:mod:`.implementations`, name ``gluon``), timed against the
generated template (and SDPA's kernels where allowed). Inductor cannot launch Gluon kernels from its output code
(torch 2.11: user kernels must be ``triton.jit``), so this op is opaque to it: a library op whose Python launcher
runs on every call (host cost measured in BENCHMARKS.md). On CPU tensors it runs the generated forward (the
interpreter or the blockwise path), so its wiring is testable without a GPU.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from fuse_attn.kernels import plan
from fuse_attn.spec import AttentionSpec
from fuse_attn.kernels import ops
from fuse_attn.kernels.generated.decode import sm_count
from fuse_attn.kernels.generated.launch import broadcast_strides, empty_outputs, batch_rows_innermost, hint

# The TMA copies' names: async_load / async_store in Triton 3.9, async_copy_global_to_shared /
# async_copy_shared_to_global in 3.6 (the GPU machine's).
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

_LOG2E = math.log2(math.e)
# Per head dim: (rows per consumer warpgroup, key tile, ring stages, consumer warpgroups). From the H100 sweeps of
# benchmarks/2026-11-27-gluon-forward (gluon_ws_bench.log) and benchmarks/2026-11-27-gluon-forward-configs
# (configs_*.log, against cuDNN in each run): D128 at 64 x 128 x 3 stages, 2 consumers (2 q tiles + 3 k/v stages =
# 224 KiB of the 227 KiB a CTA may use) ran 0.84-1.11x cuDNN at N 1k-16k, ahead of 64-key tiles with 2 or 3
# consumers everywhere; D64 with 3 consumers (192 rows a CTA, FlashAttention-3's tile) at 3 stages ran 0.99-1.05x at
# N 4k-16k unmasked and 0.91-1.09x causal, against 0.89-0.94x / 0.91-1.03x with 2 consumers at 4 stages.
_CONFIGS = {64: (64, 128, 3, 3), 128: (64, 128, 3, 2)}
# Causal attention over fewer rows: per head dim, (rows below which, config). Short causal rows leave a CTA's
# prologue and epilogue (q's load, the output's store) exposed; one consumer a CTA lets CTAs share an SM
# (:data:`_ONE_CONSUMER_CTAS_AN_SM`) and overlap them. Two CTAs an SM, D64 with 64-key tiles at 3 stages: 1.16x the
# three-consumer (64, 64, 4, 3) at N1024 (0.83x cuDNN against 0.72x) and 1.04x at N2048, 0.93x at N4096; D128: 1.04x
# the two-consumer config at N1024, 0.96x at N2048 (benchmarks/2026-11-27-dq-tma-reduce/fwd_1c_ab.log, H100). Three
# CTAs an SM at D64 (twenty-fourth session, H200): 1.00x the three-consumer config at N4096, so the crossover stays.
# (Fourteenth session, D64: three consumers of 64-key tiles 0.73x / 0.90x at N1024 / 2048 against 0.59x / 0.83x with
# 128-key tiles: configs_run2.log, configs_n2048.log.) D128's crossover, both configs persistent where their blocks
# allow (runs_persistent; H200, benchmarks/2026-11-28-causal-persistent-forward, config_ab.py in call3.log and
# call4.log): two consumers 0.95x one at N1024, 0.985x at 1536, 1.00x at 1664 and 1920 (13 and 15 blocks a head: one
# block a CTA), 1.03x at 1792, 1.06-1.09x at 2000-2048; so one consumer below 1664 rows.
_SHORT_CAUSAL_CONFIGS = {64: (4096, (64, 64, 3, 1)), 128: (1664, (64, 64, 3, 1))}
# Where the bias tiles come by TMA in the k / v ring (bias_tma_view): the multi-consumer configs with 64-key tiles at 4
# stages (a bf16 bias fits 4, an fp32 one 3: bias_ring_stages). The 128-key configs keep only 2 stages beside their
# bias tiles and D64's spills 412 bytes (ptxas, sm90a). H100, B4 H16 N4096, a [1,H,N,N] bf16 bias, forward
# (benchmarks/2026-11-28-gluon-bias-tma/call2.log, two orders): D64 1.16-1.17x unmasked and 1.64-1.69x causal, D128
# 1.08-1.09x unmasked and 1.01-1.06x causal over the 128-key configs; D64 at 5 stages 0.96x unmasked, 0.99-1.01x
# causal against 4.
_BIAS_TMA_CONFIGS = {64: (64, 64, 4, 3), 128: (64, 64, 4, 2)}
# setmaxnreg budgets per thread of the multi-consumer configs, by the number of consumer warpgroups: (consumer,
# producer). The consumers' and the producer's warpgroups share Hopper's 65536 registers a CTA, 512 a thread of each of
# 128 lanes: 2 x 232 + 40 = 504 and 3 x 160 + 32 = 512 (FlashAttention-3's split for three). 232 holds a consumer's S, P
# and O tiles and the in-flight wgmma operands without spills at D128 (ptxas, sm90a); 240 / 24 timed the same at 2
# stages (benchmarks/2026-11-27-gluon-forward, gluon_ws_bench.log). 160 holds D64's without spills; D128's 128-key
# tiles with three consumers spill 1.2 KB at 160 (ptxas), so D128 keeps two. (One consumer: :func:`register_split`.)
_REGISTERS = {2: (232, 40), 3: (160, 32)}
_REGISTERS_AN_SM = 65536  # Hopper's register file, 32-bit registers
_THREADS_A_WARPGROUP = 128
_REGISTER_UNIT = 8  # setmaxnreg's counts and a launch's registers a thread are multiples of 8
# One consumer warpgroup a CTA (the short causal configs) lets CTAs share an SM, launched with the registers a thread
# that many leave each (:func:`launch_registers`). Per head dim, how many: D64's (64, 64, 3, 1) takes 57 KB of shared
# memory a CTA, so three fit (80 registers a thread at launch, 136 for the consumer: no spills, ptxas sm90a, with a
# bias too). On an H200 (benchmarks/2026-11-28-forward-ctas-an-sm) three ran 1.11-1.15x two at N1024 / 2048 (cuDNN's
# time / ours 0.83-0.87 -> 0.94-0.97), 1.02-1.10x with a bias (call2.log) and 1.00x the three-consumer config at
# N4096; four of 2 stages (64 registers, 104 for the consumer, 32 bytes of spills) 0.98-1.02x two (call1.log); at three
# 4 stages timed as 3 (1.00-1.02x) and 2 stages 0.94-0.96x (call4.log). D128's takes 115 KB: two fit (with 32-key
# tiles, 64 KB, three would, but ptxas refuses that kernel at 80 registers a thread: C7602, an instruction needs 94).
_ONE_CONSUMER_CTAS_AN_SM = {64: 3, 128: 2}
_ONE_CONSUMER_PRODUCER_REGISTERS = 24  # setmaxnreg's least: the producer's one warp only issues TMA copies
# Causal, a CTA a query block makes CTAs of unequal length (the last block's rows meet every key tile, the first's
# one), and where they are few the longest of the last heads run on alone at the end. Where one block a CTA would fill
# at most this many waves of CTAs, a CTA takes two, blocks n - 1 - pid and pid (as the backward pairs key tiles). On
# an H100 (benchmarks/2026-11-27-forward-query-pairs: paired_boundary_ab.log, paired_ab_call1.log), the one- and
# two-consumer configs at 3.9 waves 1.08-1.18x, at 7.8 waves 1.03-1.09x, at 15.5 waves 0.99-1.03x at N1024-8192 and
# 0.96x at N16384. D64's three-consumer config (causal from 4096 rows) paired ran 0.88x at 2.7 waves and 0.92-0.996x
# from 5.3 (its paired kernel spills 88 bytes a thread, ptxas): never paired. Unmasked calls (equal CTAs, nothing to
# balance) paired ran 0.82-1.02x in a first form: never paired. D64's one-consumer config at three CTAs an SM (waves
# counted at three): paired 1.30x at 1.3 waves, 1.05-1.07x at 2.6-5.2, 1.03x at 7.8 (H200,
# benchmarks/2026-11-28-forward-ctas-an-sm/call6.log).
_PAIR_UP_TO_WAVES = 8
_PAIR_UP_TO_CONSUMERS = 2
# A persistent grid (as many CTAs as the SMs hold, each taking every grid-th query block of all the heads', a head's
# blocks side by side) where its config leaves one CTA alone on an SM: its next block's k / v tiles load while it
# finishes a block, where a fresh CTA would start from an empty ring. Unmasked plain attention, H200
# (benchmarks/2026-11-28-short-unmasked-forward, against one block a CTA in the same run, two runs: call2.log,
# call3.log): D128's two-consumer config 1.077x / 1.049x at N1024, 1.045x / 1.011x at N2048; from N4096 no gain
# shown (1.020x / 1.029x B4 H16, 0.995x GQA 32/8, 0.989x N4100, 1.005x / 0.954x N16384, whose runs differed by up
# to 12%): one block a CTA there. D64's three-consumer config 0.965-0.992x at N1024-16384 (it spills already, 128
# bytes, ptxas sm90a): one block a CTA. Not measured with a bias (the loaded bias's kernel spills 760 bytes
# persistent against 360).
# Storing the output from registers instead of by TMA (to give q's tile back before the last P v) ran 0.91-0.97x
# one block a CTA, and persistent at D128 0.96-1.00x the persistent grid storing by TMA (call2.log): not kept.
# Causal, the grid's items are two blocks of equal work (causal_items), and only where pairing would not take the
# call (more than _PAIR_UP_TO_WAVES waves of single blocks). H200, benchmarks/2026-11-28-causal-persistent-forward,
# against one block a CTA and paired in the same run: at 10-16 waves and N1024-2048, even numbers of blocks a head,
# 1.03-1.06x one block a CTA and 1.00-1.04x paired (call2.log, call7.log: D64's one-consumer config, D128's one- and
# two-consumer configs, GQA 32/8); at 7.8 waves 1.00-1.02x paired, at 5.2 waves 0.92x (paired there). Odd numbers
# (the middle blocks of two heads an item; call7.log, with heads 2 g and 2 g + 1's items side by side): 1.04-1.08x
# one block a CTA at D128 over 1050 and 1664 rows, 0.995x at 1920 and 2100, 1.01x D64 with odd heads, 0.97x D64
# B16 H16 N1050 (0.96-0.97x in calls 5-7: not understood). From N4096 0.97-0.99x (call2.log; call1.log 1.06x at
# N4096 in a run whose other launch drifted by 4%): below 4096 keys, as unmasked. D64's three-consumer config (from
# N4096) 0.90x.
_PERSISTENT_CONSUMERS = 2
_PERSISTENT_BELOW_KEYS = 4096
_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
_TILE_DTYPES = {**_DTYPES, torch.float32: gl.float32}  # (fp32: the backward's dQ accumulator)
TMA_ALIGN_BYTES = 16  # a TMA descriptor's base address and every stride but the last: multiples of 16 bytes
# Shared memory of an sm90 SM, of which CUDA reserves 1 KiB a resident CTA: one CTA may use 227 KiB
# (cudaDevAttrMaxSharedMemoryPerBlockOptin), each of two 113 KiB. Beyond its tiles a CTA's kernel takes its mbarriers
# and the compiler's scratch: 236-280 bytes in the configs compiled for sm90 (test_gpu_compile.py), 1 KiB allowed.
_SHARED_MEMORY_AN_SM = 228 * 1024
_RESERVED_A_CTA = 1024
_BEYOND_THE_TILES = 1024
# Ring stages a config keeps at least with its bias tiles in the ring (BIAS_TMA); fewer, the bias is loaded by the
# consumers instead: one stage would leave the producer nothing to load while the consumers compute.
_MIN_BIAS_RING_STAGES = 2


def forward_config(head_dim: int, causal: bool, rows: int, bias_by_tma: bool = False) -> tuple[int, int, int, int]:
    """The tile config of :data:`_CONFIGS` (or :data:`_SHORT_CAUSAL_CONFIGS`, or :data:`_BIAS_TMA_CONFIGS` where
    ``bias_by_tma``: a bias TMA can read) for a call."""
    if causal and head_dim in _SHORT_CAUSAL_CONFIGS:
        below, config = _SHORT_CAUSAL_CONFIGS[head_dim]
        if rows < below:
            return config
    return _BIAS_TMA_CONFIGS[head_dim] if bias_by_tma else _CONFIGS[head_dim]


# ---- which attentions ------------------------------------------------------------------------------------------------
def hopper_reasons(spec: AttentionSpec, q: Tensor, k: Tensor) -> list[str]:
    """Why the Gluon kernels (this forward and :mod:`.hopper_backward`'s backward, tuned for the same head dims) cannot
    compute the attention (empty: they can). q ``[Z, H, M, D]``, k ``[Z, H // g, N, D]``,
    possibly fake with symbolic lengths."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    reasons = []
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device) != (9, 0):
        reasons.append("the Gluon kernels are written for Hopper (sm90) wgmma and TMA")
    if q.dtype not in _DTYPES:
        reasons.append(f"the Gluon kernels take fp16/bf16, not {q.dtype}")
    if spec.score_program and not adds_a_bias(spec):
        reasons.append("the Gluon kernels compute plain attention or add one bias tensor (no other score program, no "
                       "mask tensor)")
    elif spec.score_program and (plan.key_padding(spec) is not None or plan.mask_blocks(spec) is not None):
        reasons.append("the bias hides keys by its values, which the generated kernels skip per call where the Gluon "
                       "kernels would compute them")
    if spec.dropout_p:
        reasons.append("the Gluon kernels have no dropout")
    if spec.head_dim != spec.head_dim_v or spec.head_dim not in _CONFIGS:
        reasons.append(f"the Gluon kernels are tuned for head dims {sorted(_CONFIGS)}, not {spec.head_dim}/"
                       f"{spec.head_dim_v}")
    if spec.causal is not None and (spec.causal.window is not None or spec.causal.diagonal != 0
                                    or not statically_known_true(q.shape[2] == k.shape[2])):
        reasons.append("the Gluon kernels' causal mask is the plain diagonal of equal lengths")
    return reasons


def adds_a_bias(spec: AttentionSpec) -> bool:
    """Whether the spec's score program is ``s + bias``: the scaled score plus its one score tensor, a float bias of
    any broadcast, which the Gluon kernels load in each tile (``HAS_BIAS``)."""
    nodes = spec.score_program
    if len(nodes) != 3 or len(spec.score_tensors) != 1 or spec.score_tensors[0].role != "bias":
        return False
    return nodes[-1].op == "add" and sorted(nodes[a].op for a in nodes[-1].args) == ["load", "score"]


# ---- the kernel ------------------------------------------------------------------------------------------------------
@gluon.jit
def _keys_kept(offs_m, offs_n, N, CAUSAL: gl.constexpr):
    """Which (row offs_m, key offs_n) pairs of a masked tile are scored: keys below N and (CAUSAL) at or below the
    row's diagonal."""
    keep = offs_n[None, :] < N
    if CAUSAL:
        keep = keep & (offs_m[:, None] >= offs_n[None, :])
    return keep


@gluon.jit
def _softmax_tile(s, m_i, l_i, offs_m, offs_n, N, qk_scale, MASK: gl.constexpr, CAUSAL: gl.constexpr):
    """One tile's online softmax in log2 units: P (fp32, unnormalized), the new running max and sum, and alpha (what
    rescales the output accumulated under the old max). MASK: the tile holds keys past N or past the diagonal."""
    if MASK:
        s = gl.where(_keys_kept(offs_m, offs_n, N, CAUSAL), s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _load_bias(bias_rows, offs_m, offs_n, N, stride_bn, MASK: gl.constexpr, CAUSAL: gl.constexpr):
    """The bias tile of rows ``bias_rows`` (pointers to each row's key 0) and keys offs_n, as stored. MASK: the tile
    holds keys past N or (CAUSAL) past the diagonal of rows offs_m; those read as -inf, which masks them (the load's
    predicate is the mask: no separate select, and no key past N is read). Loaded before the tile's S is waited for
    and converted after (:func:`log2_units`), held in its own dtype meanwhile (bf16: half the registers). ptxas
    (sm90a), D128's two-consumer causal config: 160 bytes of spills so, 236 converted before the wait, 920-1076 with
    the load masked only in a tile past N (a branch); 64-key tiles spill none but ran no faster on an H100
    (benchmarks/2026-11-27-gluon-bias: the loads themselves cost the time)."""
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
def log2_units(bias):
    """A bias tile in log2 units (fp32): one multiply rounded toward zero, which keeps a finite bias finite
    (``finfo.min`` masks: eager's uniform row) and +-inf / NaN as they are (the generated template's ``_to_log2`` on
    the GPU)."""
    return gl.inline_asm_elementwise("mul.rz.f32 $0, $1, 0f3FB8AA3B;", "=r,r", [bias.to(gl.float32)],
                                     dtype=gl.float32, is_pure=True, pack=1)  # 0f3FB8AA3B: log2(e) in fp32


@gluon.jit
def _biased_softmax_tile(s, bias, m_i, l_i, qk_scale):
    """:func:`_softmax_tile` of the scores plus a bias tile (as loaded, :func:`_load_bias`: -inf where masked). A
    bias can hide every key a row has seen so far (-inf): the max then stays -inf, and the exponents are taken against
    0 instead, so that such keys give P = 0, not exp2(-inf + inf) = NaN (the generated template's ``m_safe``)."""
    s = s * qk_scale + log2_units(bias)  # (masked keys: the bias tile's -inf)
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s - m_safe[:, None])
    alpha = gl.exp2(m_i - m_safe)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _waited_softmax_tile(s, m_i, l_i, offs_m, offs_n, N, qk_scale, bias_rows, stride_bn, bias_smem, slot,
                         s_layout: gl.constexpr, PENDING: gl.constexpr, MASK: gl.constexpr, CAUSAL: gl.constexpr,
                         HAS_BIAS: gl.constexpr, BIAS_TMA: gl.constexpr):
    """A tile's S waited for (PENDING wgmmas left in flight) and its online softmax (:func:`_softmax_tile`), or with
    HAS_BIAS its bias tile read before the wait (:func:`_bias_tile`, :func:`_biased_softmax_tile`)."""
    if HAS_BIAS:
        bias = _bias_tile(bias_rows, bias_smem, slot, offs_m, offs_n, N, stride_bn, s_layout, MASK, CAUSAL, BIAS_TMA)
        s = warpgroup_mma_wait(PENDING, deps=(s, ))
        p, m_i, l_i, alpha = _biased_softmax_tile(s, bias, m_i, l_i, qk_scale)
    else:
        s = warpgroup_mma_wait(PENDING, deps=(s, ))
        p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, offs_m, offs_n, N, qk_scale, MASK, CAUSAL)
    return p, m_i, l_i, alpha


@gluon.jit
def _consumer_tile(q, k_smem, v_smem, kv_ready, kv_empty, acc, p_op, m_i, l_i, s_zero, offs_m, N, qk_scale, j, r0,
                   bias_rows, stride_bn, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, col_layout: gl.constexpr,
                   o_layout: gl.constexpr, p_layout: gl.constexpr, MASK: gl.constexpr, CAUSAL: gl.constexpr,
                   HAS_BIAS: gl.constexpr, bias_smem, C: gl.constexpr, CONSUMERS: gl.constexpr,
                   s_layout: gl.constexpr, BIAS_TMA: gl.constexpr):
    """Key tile j (ring position r0 + j): its q k^T and tile j-1's P v in flight together (and the bias tile's loads,
    HAS_BIAS); tile j's softmax while P v runs; then tile j-1's ring stage is released and the output rescaled."""
    r = r0 + j
    stage = r % STAGES
    mbarrier.wait(kv_ready.index(stage), (r // STAGES) & 1)
    s = warpgroup_mma(q, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    prev = (r - 1) % STAGES
    acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
    offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_layout)
    p, m_i, l_i, alpha = _waited_softmax_tile(s, m_i, l_i, offs_m, offs_n, N, qk_scale, bias_rows, stride_bn, bias_smem,
                                              stage * CONSUMERS + C, s_layout, 1, MASK, CAUSAL, HAS_BIAS,
                                              BIAS_TMA)  # (P v stays in flight)
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
              PERSISTENT: gl.constexpr, BATCH_INNER: gl.constexpr):
    """The CTA's it-th query block: its (batch row, head), first row and key tiles. PERSISTENT: unmasked, block
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
    if CAUSAL:
        n_tiles = gl.cdiv(gl.minimum(row0 + ROWS, N), BLOCK_N)
    else:
        n_tiles = gl.cdiv(N, BLOCK_N)
    return z, h, row0, n_tiles


@gluon.jit
def _consumer_block(o_desc, Lse, q_smem, k_smem, v_smem, q_bars, kv_ready, kv_empty, z, h, H, M, N, row0, n_tiles, r0,
                    phase, qk_scale, bias_head, stride_bm, stride_bn, C: gl.constexpr, CAUSAL: gl.constexpr,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                    HAS_BIAS: gl.constexpr, ZERO_EMPTY_ROWS: gl.constexpr, bias_smem, CONSUMERS: gl.constexpr,
                    BIAS_TMA: gl.constexpr):
    """Consumer warpgroup C in the query block of rows ``row0`` on (its q tile's barrier at ``phase``, its n_tiles
    key tiles from ring position r0): rows ``row0 + C * BLOCK_M`` on, all the block's key tiles; stores the output
    and lse. A warpgroup whose rows all lie past M only releases the tiles: at D64 (192 rows a CTA) and N1024 the
    last CTA of each head has one warpgroup's rows, and it then runs alone on its SM (H100: 1.07x the forward there,
    where all three computed; benchmarks/2026-11-27-backward-loader-warp, spare_consumers_ab.log).
    HAS_BIAS: the scores plus the bias at ``bias_head`` (this head's ``[M, N]`` by strides, 0 where broadcast), or
    (BIAS_TMA) its tiles in ``bias_smem``, slot ``stage * CONSUMERS + C``; a row whose every score is -inf gets out
    NaN (0 under ZERO_EMPTY_ROWS) and lse -inf, as the template's."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)

    start_m = row0 + C * BLOCK_M
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_layout)
    # tiles [1, n_full) need no mask: every key is below N and (causal) at or below each row's diagonal; causal, this
    # warpgroup's rows see only tiles [0, n_mine) of the block's n_tiles (with three consumers the first one's rows
    # end a key tile before the block's last)
    if CAUSAL:
        n_mine = gl.cdiv(gl.minimum(start_m + BLOCK_M, N), BLOCK_N)
        n_full = gl.minimum(gl.maximum((start_m + 1) // BLOCK_N, 1), n_mine)
    else:
        n_mine = n_tiles
        n_full = gl.maximum(N // BLOCK_N, 1)
    mbarrier.wait(q_bars.index(C), phase)
    if start_m < M:
        q = q_smem.index(C)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_layout)
        l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=row_layout)
        acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=o_layout)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        # (a row past M reads the bias of row M - 1: its output is never stored)
        bias_rows = bias_head
        if HAS_BIAS:
            bias_rows = bias_head + gl.minimum(offs_m, M - 1).to(gl.int64) * stride_bm

        # tile 0 alone (nothing to overlap with), masked: it may hold keys past N or past the diagonal
        mbarrier.wait(kv_ready.index(r0 % STAGES), (r0 // STAGES) & 1)
        s = warpgroup_mma(q, k_smem.index(r0 % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        p, m_i, l_i, alpha = _waited_softmax_tile(s, m_i, l_i, offs_m, gl.arange(0, BLOCK_N, layout=col_layout), N,
                                                  qk_scale, bias_rows, stride_bn, bias_smem,
                                                  (r0 % STAGES) * CONSUMERS + C, s_layout, 0, True, CAUSAL, HAS_BIAS,
                                                  BIAS_TMA)
        p_op = gl.convert_layout(p.to(q_smem.dtype), p_layout)
        for j in range(1, n_full):
            acc, p_op, m_i, l_i = _consumer_tile(q, k_smem, v_smem, kv_ready, kv_empty, acc, p_op, m_i, l_i, s_zero,
                                                 offs_m, N, qk_scale, j, r0, bias_rows, stride_bn, BLOCK_N, STAGES,
                                                 col_layout, o_layout, p_layout, False, CAUSAL, HAS_BIAS, bias_smem, C,
                                                 CONSUMERS, s_layout, BIAS_TMA)
        # the masked tail
        for j in range(n_full, n_mine):
            acc, p_op, m_i, l_i = _consumer_tile(q, k_smem, v_smem, kv_ready, kv_empty, acc, p_op, m_i, l_i, s_zero,
                                                 offs_m, N, qk_scale, j, r0, bias_rows, stride_bn, BLOCK_N, STAGES,
                                                 col_layout, o_layout, p_layout, True, CAUSAL, HAS_BIAS, bias_smem, C,
                                                 CONSUMERS, s_layout, BIAS_TMA)
        last = (r0 + n_mine - 1) % STAGES
        acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
        mbarrier.arrive(kv_empty.index(last))
        _release_tiles(kv_ready, kv_empty, r0, n_mine, n_tiles, STAGES)  # the block's tiles past these rows' diagonal

        lse = (m_i + gl.log2(l_i)) / 1.4426950408889634  # log2(e): back to natural log, as the template stores it
        gl.store(Lse + (z * H + h) * M + offs_m, lse, mask=offs_m < M)
        out = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
        if ZERO_EMPTY_ROWS:  # (only a bias can hide a row's every key: HAS_BIAS)
            out = gl.where((gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)) == 0.0)[:, None], 0.0, out)
        q.store(out.to(o_desc.dtype))  # this warpgroup's q tile, read only by its own finished matmuls
        fence_async_shared()
        tma_store(o_desc, [z, h, start_m, 0], q)  # rows past M are not written
        tma.store_wait(0)
    else:  # every row past M (the last block's spare warpgroups where M is no multiple of its rows): nothing to compute
        _release_tiles(kv_ready, kv_empty, r0, 0, n_tiles, STAGES)


@gluon.jit
def _consumer(o_desc, Lse, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, Z, H, M, N, pid_m, second, bh,
              n_blocks, qk_scale, Bias, stride_bz, stride_bh, stride_bm, stride_bn, C: gl.constexpr,
              CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
              STAGES: gl.constexpr, CONSUMERS: gl.constexpr, PAIRED: gl.constexpr, PERSISTENT: gl.constexpr,
              BATCH_INNER: gl.constexpr, HAS_BIAS: gl.constexpr, ZERO_EMPTY_ROWS: gl.constexpr, bias_smem,
              BIAS_TMA: gl.constexpr):
    """Consumer warpgroup C: the CTA's query block (:func:`_block_of`); paired or persistent, each of its n_blocks
    blocks in turn, freeing its q tile for the next (``q_free``) once the block's output is stored."""
    if PAIRED or PERSISTENT:
        r0 = 0  # the ring position of the block's key tile 0
        for it in range(n_blocks):
            z, h, row0, n_tiles = _block_of(it, pid_m, second, bh, Z, H, M, N, CAUSAL, CONSUMERS * BLOCK_M, BLOCK_N,
                                            PERSISTENT, BATCH_INNER)
            _consumer_block(o_desc, Lse, q_smem, k_smem, v_smem, q_bars, kv_ready, kv_empty, z, h, H, M, N, row0,
                            n_tiles, r0, it & 1, qk_scale, bias_of_head(Bias, z, h, stride_bz, stride_bh, HAS_BIAS),
                            stride_bm, stride_bn, C, CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES, HAS_BIAS,
                            ZERO_EMPTY_ROWS, bias_smem, CONSUMERS, BIAS_TMA)
            mbarrier.arrive(q_free.index(C))
            r0 += n_tiles
    else:
        z, h, row0, n_tiles = _block_of(0, pid_m, second, bh, Z, H, M, N, CAUSAL, CONSUMERS * BLOCK_M, BLOCK_N,
                                        PERSISTENT, BATCH_INNER)
        _consumer_block(o_desc, Lse, q_smem, k_smem, v_smem, q_bars, kv_ready, kv_empty, z, h, H, M, N, row0, n_tiles,
                        0, 0, qk_scale, bias_of_head(Bias, z, h, stride_bz, stride_bh, HAS_BIAS), stride_bm, stride_bn,
                        C, CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES, HAS_BIAS, ZERO_EMPTY_ROWS, bias_smem, CONSUMERS,
                        BIAS_TMA)


@gluon.jit
def bias_of_head(Bias, z, h, stride_bz, stride_bh, HAS_BIAS: gl.constexpr):
    """The bias of batch row z and head h (0 strides where it broadcasts); Bias itself where there is none."""
    if HAS_BIAS:
        return Bias + z.to(gl.int64) * stride_bz + h.to(gl.int64) * stride_bh
    return Bias


@gluon.jit
def bias_tma_head(z, h, stride_bz, stride_bh):
    """The (batch row, head) coordinates in the bias's TMA view (:func:`bias_tma_view`) of batch row z and head h: 0
    along a dim the bias is broadcast over (size 1 there)."""
    return gl.where(stride_bz == 0, 0, z), gl.where(stride_bh == 0, 0, h)


@gluon.jit
def _load_q(q_desc, q_smem, q_bars, q_free, z, h, row0, it, BLOCK_M: gl.constexpr, CONSUMERS: gl.constexpr,
            MANY_BLOCKS: gl.constexpr):
    """Every consumer's q tile of the CTA's it-th query block; where a CTA takes MANY_BLOCKS, each once its consumer
    gave the last one back (a fresh barrier passes a wait on parity 1: block 0's loads do not wait)."""
    for c in gl.static_range(CONSUMERS):
        if MANY_BLOCKS:
            mbarrier.wait(q_free.index(c), (it & 1) ^ 1)
        mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
        tma_load(q_desc, [z, h, row0 + c * BLOCK_M, 0], q_bars.index(c), q_smem.index(c))


@gluon.jit
def _load_kv_tiles(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, z, h, h_kv,
                   row0, n_tiles, r0, it, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                   CONSUMERS: gl.constexpr, MANY_BLOCKS: gl.constexpr, bias_desc, bias_smem, bz, bh,
                   BIAS_TMA: gl.constexpr):
    """The it-th query block's n_tiles k / v tiles into the ring (from position r0) as stages come free, and
    (BIAS_TMA) each consumer's bias tile beside them, of bias batch row bz and head bh; where a CTA takes
    MANY_BLOCKS, a later block's q tiles once its first STAGES tiles are asked for (those stages come free while the
    consumers finish the last block, its q buffers only after the consumers' output stores have read them)."""
    for j in range(n_tiles):
        r = r0 + j
        stage = r % STAGES
        # a fresh barrier passes a wait on parity 1, so the first STAGES loads do not wait
        mbarrier.wait(kv_empty.index(stage), ((r // STAGES) & 1) ^ 1)
        ready = kv_ready.index(stage)
        if BIAS_TMA:
            mbarrier.expect(ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes
                            + CONSUMERS * bias_desc.block_type.nbytes)
        else:
            mbarrier.expect(ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma_load(k_desc, [z, h_kv, j * BLOCK_N, 0], ready, k_smem.index(stage))
        tma_load(v_desc, [z, h_kv, j * BLOCK_N, 0], ready, v_smem.index(stage))
        if BIAS_TMA:  # (rows past M and keys past N read as 0; a consumer with no rows below M never reads its tile)
            for c in gl.static_range(CONSUMERS):
                tma_load(bias_desc, [bz, bh, row0 + c * BLOCK_M, j * BLOCK_N], ready,
                          bias_smem.index(stage * CONSUMERS + c))
        if MANY_BLOCKS:
            if (it > 0) & (j == gl.minimum(n_tiles, STAGES) - 1):
                _load_q(q_desc, q_smem, q_bars, q_free, z, h, row0, it, BLOCK_M, CONSUMERS, MANY_BLOCKS)


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, Z, H, M, N, pid_m,
              second, bh, n_blocks, stride_bz, stride_bh, GQA_GROUP: gl.constexpr, CAUSAL: gl.constexpr,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
              PAIRED: gl.constexpr, PERSISTENT: gl.constexpr, BATCH_INNER: gl.constexpr, bias_desc, bias_smem,
              BIAS_TMA: gl.constexpr):
    """The q tiles of every consumer, then the k / v tiles into the ring; paired or persistent, so for each query
    block in turn (the ring runs on). BIAS_TMA: the bias tiles of the bias's batch row and head where it has them
    (else 0)."""
    if PAIRED or PERSISTENT:
        r0 = 0
        for it in range(n_blocks):
            z, h, row0, n_tiles = _block_of(it, pid_m, second, bh, Z, H, M, N, CAUSAL, CONSUMERS * BLOCK_M, BLOCK_N,
                                            PERSISTENT, BATCH_INNER)
            if it == 0:
                _load_q(q_desc, q_smem, q_bars, q_free, z, h, row0, it, BLOCK_M, CONSUMERS, True)
            bias_z, bias_h = bias_tma_head(z, h, stride_bz, stride_bh)
            _load_kv_tiles(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, z, h,
                           h // GQA_GROUP, row0, n_tiles, r0, it, BLOCK_M, BLOCK_N, STAGES, CONSUMERS, True,
                           bias_desc, bias_smem, bias_z, bias_h, BIAS_TMA)
            r0 += n_tiles
    else:
        z, h, row0, n_tiles = _block_of(0, pid_m, second, bh, Z, H, M, N, CAUSAL, CONSUMERS * BLOCK_M, BLOCK_N,
                                        PERSISTENT, BATCH_INNER)
        _load_q(q_desc, q_smem, q_bars, q_free, z, h, row0, 0, BLOCK_M, CONSUMERS, False)
        bias_z, bias_h = bias_tma_head(z, h, stride_bz, stride_bh)
        _load_kv_tiles(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, z, h,
                       h // GQA_GROUP, row0, n_tiles, 0, 0, BLOCK_M, BLOCK_N, STAGES, CONSUMERS, False, bias_desc,
                       bias_smem, bias_z, bias_h, BIAS_TMA)


@gluon.jit
def batch_and_head(bh, Z, H, BATCH_INNER: gl.constexpr):
    """The (batch row, head) of grid row bh of Z * H: heads fastest, or (BATCH_INNER, a bias broadcast over the batch)
    batch rows fastest, so that the CTAs of one head's batch rows run together and share its bias tiles in L2."""
    if BATCH_INNER:
        return bh % Z, bh // Z
    return bh // H, bh % H


@gluon.jit
def _hopper_attn_fwd(q_desc, k_desc, v_desc, o_desc, Lse, H, M, N, qk_scale, Bias, stride_bz, stride_bh,
                     stride_bm, stride_bn, Z, bias_desc, GQA_GROUP: gl.constexpr, CAUSAL: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                     CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                     PAIRED: gl.constexpr, PERSISTENT: gl.constexpr, HAS_BIAS: gl.constexpr,
                     BATCH_INNER: gl.constexpr, ZERO_EMPTY_ROWS: gl.constexpr, BIAS_TMA: gl.constexpr):
    gl.static_assert(CAUSAL or not PAIRED, "only causal calls pair query blocks")
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

    smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_D], q_desc.dtype)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_D], q_desc.dtype)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, BLOCK_M, HEAD_D], q_layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_D], smem_layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_D], smem_layout)
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

    # (a partition list cannot hold tuples made beforehand: each entry is written out)
    if CONSUMERS == 3:
        gl.warp_specialize([
            (_consumer, (o_desc, Lse, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, Z, H, M, N,
                         pid_m, second, bh, n_blocks, qk_scale, Bias, stride_bz, stride_bh, stride_bm, stride_bn,
                         0, CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CONSUMERS, PAIRED, PERSISTENT, BATCH_INNER,
                         HAS_BIAS, ZERO_EMPTY_ROWS, bias_smem, BIAS_TMA)),
            (_consumer, (o_desc, Lse, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, Z, H, M, N,
                         pid_m, second, bh, n_blocks, qk_scale, Bias, stride_bz, stride_bh, stride_bm, stride_bn,
                         1, CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CONSUMERS, PAIRED, PERSISTENT, BATCH_INNER,
                         HAS_BIAS, ZERO_EMPTY_ROWS, bias_smem, BIAS_TMA)),
            (_consumer, (o_desc, Lse, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, Z, H, M, N,
                         pid_m, second, bh, n_blocks, qk_scale, Bias, stride_bz, stride_bh, stride_bm, stride_bn,
                         2, CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CONSUMERS, PAIRED, PERSISTENT, BATCH_INNER,
                         HAS_BIAS, ZERO_EMPTY_ROWS, bias_smem, BIAS_TMA)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, Z, H, M,
                         N, pid_m, second, bh, n_blocks, stride_bz, stride_bh, GQA_GROUP, CAUSAL, BLOCK_M, BLOCK_N,
                         STAGES, CONSUMERS, PAIRED, PERSISTENT, BATCH_INNER, bias_desc, bias_smem, BIAS_TMA)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
    elif CONSUMERS == 1:
        gl.warp_specialize([
            (_consumer, (o_desc, Lse, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, Z, H, M, N,
                         pid_m, second, bh, n_blocks, qk_scale, Bias, stride_bz, stride_bh, stride_bm, stride_bn,
                         0, CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CONSUMERS, PAIRED, PERSISTENT, BATCH_INNER,
                         HAS_BIAS, ZERO_EMPTY_ROWS, bias_smem, BIAS_TMA)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, Z, H, M,
                         N, pid_m, second, bh, n_blocks, stride_bz, stride_bh, GQA_GROUP, CAUSAL, BLOCK_M, BLOCK_N,
                         STAGES, CONSUMERS, PAIRED, PERSISTENT, BATCH_INNER, bias_desc, bias_smem, BIAS_TMA)),
        ], [1], [PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (o_desc, Lse, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, Z, H, M, N,
                         pid_m, second, bh, n_blocks, qk_scale, Bias, stride_bz, stride_bh, stride_bm, stride_bn,
                         0, CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CONSUMERS, PAIRED, PERSISTENT, BATCH_INNER,
                         HAS_BIAS, ZERO_EMPTY_ROWS, bias_smem, BIAS_TMA)),
            (_consumer, (o_desc, Lse, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, Z, H, M, N,
                         pid_m, second, bh, n_blocks, qk_scale, Bias, stride_bz, stride_bh, stride_bm, stride_bn,
                         1, CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CONSUMERS, PAIRED, PERSISTENT, BATCH_INNER,
                         HAS_BIAS, ZERO_EMPTY_ROWS, bias_smem, BIAS_TMA)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_free, kv_ready, kv_empty, Z, H, M,
                         N, pid_m, second, bh, n_blocks, stride_bz, stride_bh, GQA_GROUP, CAUSAL, BLOCK_M, BLOCK_N,
                         STAGES, CONSUMERS, PAIRED, PERSISTENT, BATCH_INNER, bias_desc, bias_smem, BIAS_TMA)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# ---- launcher --------------------------------------------------------------------------------------------------------
def tma_ready(t: Tensor) -> Tensor:
    """``t`` if TMA can read it where it lies (unit last stride, 16-byte aligned base and strides, none 0: a broadcast
    dim), else a copy."""
    size = t.element_size()
    if (t.stride(-1) == 1 and t.data_ptr() % TMA_ALIGN_BYTES == 0
            and all(s > 0 and s * size % TMA_ALIGN_BYTES == 0 for s in t.stride()[:-1])):
        return t
    return t.contiguous()


@functools.lru_cache(maxsize=None)
def _tile_layout(rows: int, head_dim: int, dtype: torch.dtype) -> "gl.NVMMASharedLayout":
    """The shared-memory layout of a ``[1, 1, rows, head_dim]`` TMA tile (the same for every call of a shape)."""
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim], _TILE_DTYPES[dtype])


def tma_descriptor(t: Tensor, rows: int, cols: int | None = None) -> "TensorDescriptor":
    """A 4-D TMA descriptor over ``t`` whose tiles are ``rows`` x ``cols`` (default: every column)."""
    cols = t.shape[3] if cols is None else cols
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, cols], _tile_layout(rows, cols, t.dtype))


def _strides_tma_reads(strides: list, element_size: int) -> bool:
    """Whether TMA can read a bias of these strides (as the kernels index it: :func:`.launch.broadcast_strides`) in place:
    keys contiguous, queries not broadcast, every other stride a multiple of 16 bytes."""
    return (strides[3] == 1 and strides[2] != 0
            and not any(s * element_size % TMA_ALIGN_BYTES for s in strides[:3]))


def bias_layout_by_tma(bias: Tensor) -> bool:
    """Whether the bias's layout lets TMA read it in place (:func:`bias_tma_view` asks its base's alignment too).
    Fake tensors too (hinted sizes): the implementation choice times the Gluon kernels on a copy of this layout, and
    its key says which path that was."""
    return _strides_tma_reads(broadcast_strides(bias, hint), bias.element_size())


def bias_tma_view(bias: Tensor) -> Tensor | None:
    """The bias ``[Z | 1, H | 1, M, N]`` as TMA reads it in place -- the dims it is broadcast over (stride 0 or size 1,
    as the kernel indexes it: :func:`.launch.broadcast_strides`) of size 1, keys contiguous, rows and the base 16-byte
    aligned -- or None where TMA cannot (keys or queries broadcast, keys strided, an odd row length or base: the
    consumers load it instead)."""
    strides = broadcast_strides(bias)
    if not _strides_tma_reads(strides, bias.element_size()) or bias.data_ptr() % TMA_ALIGN_BYTES:
        return None
    shape = [1 if strides[d] == 0 else bias.shape[d] for d in range(4)]
    # a dim of size 1 is never stepped over: its stride need only be one TMA takes (that of a whole bias head)
    whole = bias.shape[2] * strides[2]
    return bias.as_strided(shape, [strides[0] or shape[1] * (strides[1] or whole), strides[1] or whole, strides[2], 1])


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


def shared_memory_for_tiles(ctas_an_sm: int = 1) -> int:
    """Bytes of shared memory a CTA's tiles may take where ``ctas_an_sm`` CTAs share an SM."""
    return _SHARED_MEMORY_AN_SM // ctas_an_sm - _RESERVED_A_CTA - _BEYOND_THE_TILES


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


def fills_at_most(ctas: int, waves: int, device: torch.device, ctas_an_sm: int = 1) -> bool:
    """Whether a grid of ``ctas`` CTAs fills at most ``waves`` waves of the device's SMs, ``ctas_an_sm`` at a time on
    each (off a GPU, no SMs: False). The Gluon kernels' pairing rules ask it."""
    return ctas <= waves * ctas_an_sm * (sm_count(device) or 0)


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
    that kernel for one: its launch specializes the length 1; a ConvertTritonGPUToLLVM assertion on the H200
    machine, at any key length; Triton 3.9 compiles it) over fewer than :data:`_PERSISTENT_BELOW_KEYS` keys, on a
    GPU (off one, no SMs to count: never). Unmasked (:data:`_PERSISTENT_CONSUMERS`): the two-consumer config, whose
    query blocks outnumber the CTAs the device's SMs hold at once (fewer, each CTA would take one anyway). Causal
    (:data:`_PAIR_UP_TO_WAVES`): a config that pairs (the grid's items are two blocks, :func:`causal_items`), more
    than one block a head (one: blocks of equal work), where one block a CTA would fill more waves than pairing
    takes (:func:`pairs_query_blocks`)."""
    if has_bias or rows <= 1 or keys >= _PERSISTENT_BELOW_KEYS or sm_count(device) is None:
        return False
    if causal:
        return (consumers <= _PAIR_UP_TO_CONSUMERS and blocks > 1
                and not pairs_query_blocks(True, blocks, heads, head_dim, consumers, device))
    return consumers == _PERSISTENT_CONSUMERS and not fills_at_most(blocks * heads, 1, device)


def hopper_forward(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec,
                   bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(out [Z, H, M, D], lse [Z, H, M] fp32)`` of a spec :func:`hopper_reasons` accepts, on an sm90 GPU; ``bias``
    the spec's score tensor where it has one (:func:`adds_a_bias`)."""
    Z, H, M, D = q.shape
    N = k.shape[2]
    bias_view = None if bias is None else bias_tma_view(bias)
    block_m, block_n, stages, consumers = forward_config(D, spec.causal is not None, M, bias_view is not None)
    ring_stages = 0 if bias_view is None else bias_ring_stages(block_m, block_n, stages, consumers, D, q.dtype,
                                                               bias.dtype)
    if ring_stages:  # the bias tiles come by TMA with k and v
        stages = ring_stages
    q, k, v = tma_ready(q), tma_ready(k), tma_ready(v)
    out = torch.empty(Z, H, M, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(Z, H, M, dtype=torch.float32, device=q.device)
    blocks = triton.cdiv(M, consumers * block_m)  # query blocks a head
    paired = pairs_query_blocks(spec.causal is not None, blocks, Z * H, D, consumers, q.device)
    ctas_an_sm = resident_ctas(D, consumers)
    persistent = runs_persistent(spec.causal is not None, bias is not None, consumers, M, blocks, Z * H, N, D,
                                 q.device)
    if persistent:  # the grid's items: a block, or causal two (_block_of), every CTA taking every grid-th
        items = causal_items(blocks, Z * H) if spec.causal is not None else blocks * Z * H
        grid = (min(items, ctas_an_sm * sm_count(q.device)), 1)  # (never paired: runs_persistent asks that)
    else:
        grid = (triton.cdiv(blocks, 2) if paired else blocks, Z * H)
    strides = (0, 0, 0, 0) if bias is None else broadcast_strides(bias)
    q_desc = tma_descriptor(q, block_m)
    launch = launch_registers(ctas_an_sm)
    _hopper_attn_fwd[grid](
        q_desc, tma_descriptor(k, block_n), tma_descriptor(v, block_n), tma_descriptor(out, block_m), lse,
        H, M, N, spec.scale_for(D) * _LOG2E,
        lse if bias is None else bias, *strides, Z,  # (no bias: lse stands in, never read)
        tma_descriptor(bias_view, block_m, block_n) if ring_stages else q_desc,  # (q's: a stand-in, never read)
        spec.gqa_group,
        spec.causal is not None, block_m, block_n, D, stages, consumers, *register_split(D, consumers), paired,
        persistent, bias is not None, batch_rows_innermost(spec),
        bias is not None and spec.empty_rows == "zero",  # (no row of plain attention is empty: its kernel unchanged)
        ring_stages > 0,
        num_warps=4,
        **({} if launch is None else {"maxnreg": launch}))
    return out, lse


# ---- the op and its autograd -----------------------------------------------------------------------------------------
# The Gluon ops are defined on a torch.library.Library rather than with torch.library.custom_op: the dispatch of a
# custom_op (its Python wrappers and output checks) cost 110-150 us a call on an H100 machine's host against the
# launcher alone (benchmarks/2026-11-27-gluon-backward/host_breakdown.log); fake, autograd and kernel are registered
# the same way. Kernels for CPU and CUDA tensors: the CPU one runs the generated forward (tests without a GPU).
LIBRARY = torch.library.Library("fuse_attn", "FRAGMENT")
LIBRARY.define("flash_attention_hopper(Tensor q, Tensor k, Tensor v, str spec, Tensor? bias=None) -> (Tensor, Tensor)")


def bias_score_tensors(bias: Tensor | None) -> list[Tensor]:
    """The op's bias as the template op's list of score tensors."""
    return [] if bias is None else [bias]


def flash_attention_hopper_op(q: Tensor, k: Tensor, v: Tensor, spec: str,
                              bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(out, lse)`` as ``fuse_attn::flash_attention`` gives them for the spec (plain, or ``s + bias`` with ``bias``
    its score tensor). Opaque to torch.compile."""
    if q.device.type != "cuda":  # (tests without a GPU) the generated forward: interpreter or blockwise
        return ops.forward_op(q, k, v, bias_score_tensors(bias), None, spec, cpu_op=True)
    s = checked_spec("flash_attention_hopper", q, k, v, spec, bias)
    if ops.is_empty(q, k):
        return ops.empty_forward(q, v)
    return hopper_forward(q, k, v, s, bias)


def checked_spec(op_name: str, q: Tensor, k: Tensor, v: Tensor, spec: str, bias: Tensor | None) -> AttentionSpec:
    """The spec of a Gluon op's call, its inputs validated as the template's op validates them (shapes, dtypes,
    devices); a ValueError naming ``fuse_attn::<op_name>`` where :func:`hopper_reasons` refuses them."""
    s = ops.parse_spec(spec)
    ops.validate(q, k, v, bias_score_tensors(bias), s)
    reasons = hopper_reasons(s, q, k)
    if reasons:
        raise ValueError(f"fuse_attn::{op_name} cannot run {plan.describe(s)}: {'; '.join(reasons)}")
    return s


for _device in ("CPU", "CUDA"):
    LIBRARY.impl("flash_attention_hopper", flash_attention_hopper_op, _device)


@torch.library.register_fake("fuse_attn::flash_attention_hopper")
def _(q, k, v, spec, bias=None):
    ops.validate(q, k, v, bias_score_tensors(bias), ops.parse_spec(spec))
    return empty_outputs(q, v)


def _setup_context(ctx, inputs, output):
    q, k, v, spec, *bias = inputs  # (a bias: the template op's one score tensor)
    ops.autograd_setup_context(ctx, (q, k, v, bias_score_tensors(bias[0] if bias else None), None, spec), output)


def _backward(ctx, dout, dlse):
    """The Gluon backward (:mod:`.hopper_backward`) on the GPU, the bias's gradient too where
    :func:`.hopper_backward.dscore_kv_heads` admits it; the generated template's on CPU tensors (the op's forward
    there is the template's too) and for the other biases that need a gradient. Both take this forward's out and lse
    as their own."""
    from fuse_attn.kernels.hopper.backward import dscore_kv_heads  # (that module imports this one)

    q, k, v, out, lse, _, *bias = ctx.saved_tensors
    bias_grad = any(ctx.needs)
    if q.device.type != "cuda" or bias_grad and not dscore_kv_heads(q, k, bias[0]):
        dq, dk, dv, dbias, *_ = ops.autograd_backward(ctx, dout, dlse)
        return dq, dk, dv, None, (dbias[0] if bias else None)
    if dout is None:  # only lse was used
        dout = torch.zeros_like(out)
    dq, dk, dv, dbias = torch.ops.fuse_attn.flash_attention_hopper_backward(dout, q, k, v, out, lse, ctx.spec, dlse,
                                                                            bias[0] if bias else None, bias_grad)
    return dq, dk, dv, None, dbias if bias_grad else None


torch.library.register_autograd("fuse_attn::flash_attention_hopper", _backward, setup_context=_setup_context)


def flash_attention_hopper(q: Tensor, k: Tensor, v: Tensor, spec, return_lse: bool = False,
                           bias: Tensor | None = None):
    """The op without torch.compile (differentiable); ``spec`` an :class:`AttentionSpec` or its JSON, ``bias`` its
    score tensor where its program adds one."""
    text = spec.to_json() if isinstance(spec, AttentionSpec) else spec
    out, lse = torch.ops.fuse_attn.flash_attention_hopper(q, k, v, text, bias)
    return (out, lse) if return_lse else out
