"""The backward of plain attention on Hopper GPUs, written in Gluon: the autograd formula of
``torch.ops.fuse_attn.flash_attention_hopper`` (:mod:`.forward`), as its own op
``torch.ops.fuse_attn.flash_attention_hopper_backward``.

The generated template's backward runs two kernels, dQ over key tiles and dK/dV over query tiles, each recomputing
P and dP: 7 matmuls per (query tile, key tile) pair. This one runs FlashAttention-2/3's single pass, 5 matmuls:

* a CTA owns ``BLOCK_N`` keys of one kv head (causal calls of few CTAs: two such key tiles in turn, a long walk and a
  short one) and keeps their dK and dV accumulators in registers (two warpgroups of ``BLOCK_N / 2`` rows each, or of
  half the columns each where BLOCK_N is 64: MLA's q / k 192 with v 128, whose q, k, dQ and dK tiles come in 64-column
  parts, one wgmma a part); it walks the query tiles of every query head of the kv head's GQA group (one k / v load
  serves the whole group), q and dO tiles brought by TMA into a ring of ``STAGES`` stages ahead of use by a third
  partition, one loader warp.
* per query tile: S = Q K^T and dP = dO V^T, P = exp2(S * scale - lse) from the forward's lse and
  dS = P (dP - delta), both to shared memory; then dQ = dS K, dV += P^T dO and dK += dS^T Q (the transposes are views
  of the shared tiles).
* dQ goes through a double-buffered fp32 tile in shared memory, from which one TMA reduce-add a tile adds it into an
  fp32 buffer (the CTAs of one head's key tiles all add into it; FlashAttention-3's way); a last small Triton kernel
  scales and casts it. Before the kernel, another computes delta = rowsum(dO * O) - dlse per query row and zeroes
  the buffer's rows.

An ``s + bias`` attention's bias tiles come with q and dO into the ring where TMA reads the bias in place and they
fit (:func:`bias_ring_dq_buffers`: at head dim 128 with a 2-byte bias, in the room of the second dQ buffer); else
the compute warpgroups load them from global memory. Where the bias needs a gradient (dS summed over the dims it is
broadcast over, as eager's), each tile's dS goes out from its shared tile by TMA into a ``[Z, heads, M, N]`` buffer
in the inputs' dtype (eager's dS is that rounding), and the sum comes after each launch; a launch takes as many heads
as keep that buffer and the dQ accumulator within the fp32 one the generated template's backward accumulates by
atomics (:func:`.common.dscore_kv_heads`, which keeps this to head dim 128).

Every row past M reads as zeros by TMA and gets lse = +inf, so P = 0 there; keys past N read as zeros, which makes
their dQ terms 0 (K = 0) and their dK / dV rows are never stored. Causal: the key tile's queries start at its
diagonal, and only the tiles that cross it are masked; under a sliding window they end at the last row that sees the
key tile, and the tiles whose rows' windows leave some of its keys out are masked too (one key tile a CTA). A
predicate's mask, a key padding vector or a mask tensor (``MASK_BLOCKS``): each key tile visits the query tiles the
tile-classes kernel (or :mod:`.key_range_tiles`, :mod:`.mask_tiles`) lists for it, P through the spec's program and dS
back through its adjoint in the partial ones (both generated, as the forward's).

What it computes is the template's backward for the specs :func:`.common.hopper_reasons` accepts, with the
forward's out and lse (either forward's: same layout), and the bias's gradient where :func:`.common.dscore_kv_heads`
admits it (the forward's autograd runs the template's backward for the others); the reference is
:func:`fuse_attn.kernels.reference.reference_attention`'s autograd (SDPA's math kernel for rows a bias hides under
``empty_rows="zero"``), which the tests compare against under the 2x rule.
"""

from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_init, warpgroup_mma_wait)

from fuse_attn.kernels import ops
from fuse_attn.kernels.generated.launch import batch_rows_innermost, broadcast_strides
from fuse_attn.kernels.hopper.common import (LIBRARY, LOG2E, batch_and_head, bias_of_head,
                                             bias_tma_head, bias_tma_view, causal_window, checked_call,
                                             dense_fields, described, ds_row_keys, dscore_kv_heads,
                                             fills_at_most, head_dim_part, in_place_fields, listed_tiles, log2_units,
                                             lists_tiles, scores_by_a_program, tile_lists,
                                             op_score_tensors, parsed_spec, score_program_functions,
                                             scores_over_parts, shared_memory_for_tiles,
                                             tma_descriptor, tma_load, tma_load_parts, tma_store, vector_slots,
                                             with_base)
from fuse_attn.kernels.positional_launch import PositionalLaunch
from fuse_attn.spec import AttentionSpec

# A barrier of the partition's threads: gl.barrier in Triton 3.9, gl.thread_barrier in 3.6 (the GPU machine's)
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
# Per head dim of q and k: (query rows per tile, keys per CTA, q / dO ring stages, fp32 dQ buffers). D64 and D128:
# BLOCK_N = 128 keys, dK and dV's rows, 64 a warpgroup (wgmma's M). Shared memory: k + v, 2 stages of q + dO, P + dS,
# 2 dQ buffers = 224 KiB of the 227 a CTA may use (D128: 64 + 64 + 32 + 64; D64: 32 + 64 + 64 + 64). D64 takes 128
# query rows, faster than 64 (H100); D128 has no registers for 128 (S and dP would take 128 a thread beside dK and
# dV's 128). 3 stages with one dQ buffer ran no faster than 2 and 2.
# D192 (v 128, MLA): 64 keys, the warpgroups splitting dK's and dV's columns (128 keys' dK and dV would take 160 of a
# thread's 240 registers, leaving too few for S, dP and dQ): 48 + 32 a thread, S and dP 16 each, dQ's three parts
# 48; shared memory k + v 40 KiB, q + dO 40 a stage, P + dS 16, a dQ buffer 48: 3 stages and one buffer (224 KiB),
# against 2 stages 4-5% faster unmasked and 1-1.6% slower causal (H200, B * N 16k-32k; 128 keys spill 0.5-1.1 KB).
# The loads come from a one-warp partition (:func:`_loader`), not from the compute warpgroups: Triton 3.6 puts a
# CTA-wide barrier before each TMA load that 256 threads issue (five barriers a query tile, three with the loader).
_CONFIGS = {64: (128, 128, 2, 2), 128: (64, 128, 2, 2), 192: (64, 64, 3, 1)}
_NUM_WARPS = 8  # two warpgroups
# Causal, a CTA a key tile makes CTAs of very unequal walks (the first key tile's meets every query tile, the last's
# one), and where they are few the longest of the last heads run on alone at the end. Where one CTA a key tile would
# fill at most this many waves of CTAs (one CTA an SM), a CTA takes two key tiles, a long walk and a short one
# (:func:`_causal_key_tile`): faster at 4 waves, even at 8 and slower at 16 (H100, N 4k-16k).
_PAIR_UP_TO_WAVES = 4
_PRE_ROWS = 64  # rows of delta per program of the small kernels (any power of 2 works; bandwidth-bound)


# ---- delta and dq's cast: small Triton kernels -----------------------------------------------------------------------
@triton.jit
def _delta_kernel(Out, DO, DLse, Delta, Lse, NanHeads, DQAcc, H, M, so_z, so_h, so_m, sdo_z, sdo_h, sdo_m,
                  HAS_DLSE: tl.constexpr, ROWS: tl.constexpr, HEAD_DV: tl.constexpr, HEAD_D: tl.constexpr,
                  PART_D: tl.constexpr, FLAG_NAN_ROWS: tl.constexpr, ZERO_EMPTY_ROWS: tl.constexpr):
    """delta[z, h, m] = sum_d dO * O - dlse (fp32; O and dO HEAD_DV wide), for ROWS rows of one (z, h), and those rows
    of the fp32 dQ accumulator (contiguous [Z, H, M, HEAD_D], zeroed PART_D columns at a time) zeroed for the backward
    kernel's reduce-adds: one launch and one allocation fewer a call than a separate fill. FLAG_NAN_ROWS: NanHeads[z *
    H + h] set where one of the rows has an lse that is not finite (-inf allowed under ZERO_EMPTY_ROWS): a row that a
    bias made NaN, whose NaN eager's dV carries to every key (:func:`_nan_dv_kernel`)."""
    bh = tl.program_id(1)
    z = bh // H
    h = bh % H
    offs_m = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    if FLAG_NAN_ROWS:
        lse = tl.load(Lse + bh * M + offs_m, mask=offs_m < M, other=0.0)
        bad = ~(tl.abs(lse) < float("inf"))  # (NaN < inf is False)
        if ZERO_EMPTY_ROWS:
            bad = bad & (lse != float("-inf"))
        if tl.max(bad.to(tl.int32), 0) > 0:
            tl.store(NanHeads + bh, 1)
    offs_d = tl.arange(0, HEAD_DV)
    rows = offs_m[:, None] < M
    o = tl.load(Out + z * so_z + h * so_h + offs_m[:, None] * so_m + offs_d[None, :], mask=rows, other=0.0)
    do = tl.load(DO + z * sdo_z + h * sdo_h + offs_m[:, None] * sdo_m + offs_d[None, :], mask=rows, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    if HAS_DLSE:
        delta -= tl.load(DLse + bh * M + offs_m, mask=offs_m < M, other=0.0)
    tl.store(Delta + bh * M + offs_m, delta, mask=offs_m < M)
    offs_part = tl.arange(0, PART_D)
    for part in tl.static_range(HEAD_D // PART_D):
        tl.store(DQAcc + (bh.to(tl.int64) * M + offs_m[:, None]) * HEAD_D + part * PART_D + offs_part[None, :],
                 tl.zeros([ROWS, PART_D], tl.float32), mask=rows)


@triton.jit
def _nan_dv_kernel(DV, NanHeads, H, H_KV, N, GQA_GROUP: tl.constexpr, ROWS: tl.constexpr, HEAD_D: tl.constexpr):
    """dV (contiguous [Z, H_KV, N, HEAD_D]) NaN in ROWS keys of one (z, kv head) where a query head of its group has
    a row that a bias made NaN (the delta kernel's NanHeads): eager's P is NaN in every column of such a row, and so
    its dV at every key, keys that the causal walk does not take to that row too (the generated template's dK/dV
    kernel does as much from its lse flags). (In the Gluon kernel, a select on its dV accumulator made ptxas
    serialize its wgmmas, C7514.)"""
    bh = tl.program_id(1)
    z = bh // H_KV
    h_kv = bh % H_KV
    flagged = tl.load(NanHeads + z * H + h_kv * GQA_GROUP)
    for g in tl.static_range(1, GQA_GROUP):
        flagged = tl.maximum(flagged, tl.load(NanHeads + z * H + h_kv * GQA_GROUP + g))
    if flagged > 0:
        offs_n = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        offs_d = tl.arange(0, HEAD_D)
        tl.store(DV + (bh.to(tl.int64) * N + offs_n[:, None]) * HEAD_D + offs_d[None, :],
                 tl.full([ROWS, HEAD_D], float("nan"), DV.dtype.element_ty), mask=offs_n[:, None] < N)


@triton.jit
def _dq_cast_kernel(DQAcc, DQ, total, sm_scale, BLOCK: tl.constexpr):
    """dq = dq_acc * scale in dq's dtype (both contiguous)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < total
    tl.store(DQ + offs, (tl.load(DQAcc + offs, mask=keep) * sm_scale).to(DQ.dtype.element_ty), mask=keep)


_CAST_BLOCK = 1024  # elements per program of the cast (bandwidth-bound)


@builtin
def _tma_add_v36(tensor_desc, coord, src, _semantic=None):
    """``tma.async_atomic_add`` (Triton 3.9 has it) for Triton 3.6, whose Gluon has the op (TTNG's async_tma_reduce)
    but no function for it: adds the shared-memory tile ``src`` into the descriptor's tensor at ``coord``."""
    from triton._C.libtriton import ir
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle,
                                              _semantic._convert_to_ir_values(coord, require_i64=False), src.handle)


_tma_add = getattr(tma, "async_atomic_add", None) or _tma_add_v36


# ---- the kernel ------------------------------------------------------------------------------------------------------
@gluon.jit
def _load_q_do(q_desc, do_desc, q_smem, do_smem, ready, z, h, m0, stage, bias_desc, bias_smem, bz, bh, n0,
               BIAS_TMA: gl.constexpr, PARTS: gl.constexpr, PART_D: gl.constexpr):
    """A query tile's q (in PARTS column parts of PART_D) and dO into ring stage ``stage``, and (BIAS_TMA) its bias
    tile against keys n0 on, of bias batch row bz and head bh (rows past M and keys past N read as 0: those rows' P
    is 0, those keys' dK / dV rows are never stored)."""
    bar = ready.index(stage)
    if BIAS_TMA:
        mbarrier.expect(bar, PARTS * q_desc.block_type.nbytes + do_desc.block_type.nbytes
                        + bias_desc.block_type.nbytes)
        tma_load(bias_desc, [bz, bh, m0, n0], bar, bias_smem.index(stage))
    else:
        mbarrier.expect(bar, PARTS * q_desc.block_type.nbytes + do_desc.block_type.nbytes)
    tma_load_parts(q_desc, z, h, m0, bar, q_smem, stage * PARTS, PARTS, PART_D)
    tma_load(do_desc, [z, h, m0, 0], bar, do_smem.index(stage))


@gluon.jit
def _tile_of(it, h_kv, m_lo, per_head, GQA_GROUP: gl.constexpr, qlist, MASK_BLOCKS: gl.constexpr):
    """Iteration it's query head and tile: the group's heads one after the other, each over its query tiles from
    m_lo (every key tile's CTA in the same order: staggering them so that their dQ adds meet less was no faster), or
    (MASK_BLOCKS) over those the tile-classes kernel listed for the key tile (``qlist``)."""
    if MASK_BLOCKS:
        return h_kv * GQA_GROUP + it // per_head, gl.load(qlist + it % per_head)
    return h_kv * GQA_GROUP + it // per_head, m_lo + it % per_head




@gluon.jit
def _biased_row_lse(lse, in_rows, ZERO_EMPTY_ROWS: gl.constexpr):
    """The lse (natural log, as stored) of rows whose scores a bias or a predicate's program changed, in log2 units
    as the generated template's ``_lse_to_log2`` takes it: a finite lse stays finite (a row a finite fill hid wholly
    has one near -FLT_MAX / log2(e), whose product with log2(e) can round past -FLT_MAX); a row of M whose lse is not
    finite (it saw only -inf, or a NaN / +inf score) gets NaN, so that its P is NaN everywhere as in eager's backward;
    under ZERO_EMPTY_ROWS a row that saw only -inf gets +inf instead (P = 0). Rows past M keep their +inf."""
    bad = in_rows & ((gl.abs(lse) == float("inf")) | (lse != lse))
    out = gl.where(bad, float("nan"), gl.maximum(lse * 1.4426950408889634, -3.4028234663852886e38))
    if ZERO_EMPTY_ROWS:
        out = gl.where(in_rows & (lse == float("-inf")), float("inf"), out)
    return out


@gluon.jit
def _query_tile(q_desc, dq_desc, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem, ready, empty, dk, dv, Lse,
                Delta, Bias, stride_bz, stride_bh, stride_bm, stride_bn, z, h_kv, it, r0, m_lo, per_head, H, M, N,
                qk_scale, offs_n, GQA_GROUP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                PARTS: gl.constexpr, PART_D: gl.constexpr, STAGES: gl.constexpr, s_layout: gl.constexpr,
                dq_layout: gl.constexpr, dk_layout: gl.constexpr,
                MASK: gl.constexpr, FIRST: gl.constexpr, HAS_BIAS: gl.constexpr, ZERO_EMPTY_ROWS: gl.constexpr,
                bias_smem, BIAS_TMA: gl.constexpr, DQ_BUFFERS: gl.constexpr, ds_desc, n0, ds_head0,
                DS_OUT: gl.constexpr, qlist, vectors, MASK_BLOCKS: gl.constexpr, PROGRAM_GRAD: gl.constexpr,
                PROGRAM: gl.constexpr, window, WINDOWED: gl.constexpr, SCORED: gl.constexpr):
    """Iteration it of a key tile's walk, ring position ``r0 + it`` (r0: the CTA's iterations for its earlier key
    tiles): its query tile against the key tile; dK (a tuple of its PARTS column parts, as q and k come) and dV
    accumulate (FIRST: start from this tile's products), dQ is added into global memory from dq_smem by TMA, a part at
    a time. dK and dV's matmuls stay in flight into the next iteration, which waits for them with its S and then gives
    their ring stage back to the loader. HAS_BIAS: the scores plus the bias (in log2 units as the forward's,
    :func:`.common.log2_units`), its tile loaded while S and dP are on the tensor cores: from the ring stage
    (BIAS_TMA: the loader brought it with q and dO) or from global memory. dQ goes out through DQ_BUFFERS shared
    buffers (one where the bias tiles take the second's room). DS_OUT: the dS tile (the gradient of the scores, as the
    bias's) goes out too, by TMA from its shared tile into ds_desc's tensor at query head h - ds_head0 and keys n0
    on. MASK_BLOCKS: the query tiles listed for the key tile (``qlist``), MASK the partial ones: the scores through the
    spec's program of the ``vectors`` (``PROGRAM``, generated) and dS back through it (``PROGRAM_GRAD``).
    WINDOWED: MASK also hides the keys before each row's window of ``window`` keys. SCORED: every score through the
    spec's program (``PROGRAM``) and dS back through it (``PROGRAM_GRAD``), the tensors it reads in ``vectors``."""
    dtype: gl.constexpr = q_desc.dtype
    h, mb = _tile_of(it, h_kv, m_lo, per_head, GQA_GROUP, qlist, MASK_BLOCKS)
    ring = r0 + it
    stage = ring % STAGES
    mbarrier.wait(ready.index(stage), (ring // STAGES) & 1)
    do = do_smem.index(stage)
    # k, v, P and dS each have one buffer (k one a part), indexed by a value that is always 0 (ring < 2^30) but
    # changes with the loop: their wgmma descriptors are then computed where used, not hoisted out of the loop (~48
    # 64-bit descriptors, 96 registers held through it; at D128 ptxas spilled ~500 bytes)
    pin = ring >> 30
    v_smem = v_smem.index(pin)
    p_smem = p_smem.index(pin)
    ds_smem = ds_smem.index(pin)
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    s = scores_over_parts(q_smem, stage * PARTS, k_smem, pin, zero, PARTS)
    dp = warpgroup_mma(do, v_smem.permute((1, 0)), zero, use_acc=False, is_async=True)

    m0 = mb * BLOCK_M
    offs_m = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    rows = (z * H + h) * M + offs_m
    # a row past M: lse +inf, so P = 0 (its q and dO read as zeros too)
    lse = gl.load(Lse + rows, mask=offs_m < M, other=float("inf"))
    delta = gl.load(Delta + rows, mask=offs_m < M, other=0.0)
    if HAS_BIAS or MASK_BLOCKS:
        lse = _biased_row_lse(lse, offs_m < M, ZERO_EMPTY_ROWS)
    else:
        lse = lse * 1.4426950408889634  # log2(e): to log2 units
    if HAS_BIAS:
        # rows past M read row M - 1's bias (0 by TMA) and keys past N read 0: their P never reaches a stored result
        # (those rows' lse is +inf; those keys' k and v read as zeros, so their dQ terms are 0, and their dK / dV rows
        # are not stored). (Keys clamped to N - 1 instead of masked: every address computed apart; ptxas, D128
        # causal, before dS's mask: 432 bytes of spills against 56)
        if BIAS_TMA:
            bias = bias_smem.index(stage).load(s_layout)
        else:
            bias_rows = (bias_of_head(Bias, z, h, stride_bz, stride_bh, True)
                         + gl.minimum(offs_m, M - 1).to(gl.int64) * stride_bm)
            bias = gl.load(bias_rows[:, None] + (offs_n * stride_bn)[None, :], mask=(offs_n < N)[None, :], other=0.0)

    if FIRST:
        s = warpgroup_mma_wait(1, deps=(s, ))
    else:  # the previous tile's dV and dK, issued before this S, complete with it
        waited = warpgroup_mma_wait(1, deps=(s, dv) + dk)
        s, dv, dk = waited[0], waited[1], waited[2:]
    if HAS_BIAS:
        p = gl.exp2(s * qk_scale + log2_units(bias) - lse[:, None])
    elif MASK_BLOCKS and MASK:  # (keys past N: P = 0)
        s = s * qk_scale
        value = PROGRAM(s, z, h, offs_m, offs_n, M, N, vectors)
        # a row a finite fill hid wholly (every tile of it is listed, so it saw every key at the fill): eager's row
        # is uniform, P = 1 / N. Its lse is the fill's (log2(N) is below the fill's ulp, 2^104), and the round trip
        # through the stored natural log can move it by an ulp, so exp2(value - lse) would give 0 or inf: P is set.
        # (A key the program took to -inf on such a row gets 0 and the rest 1 / N: eager's P where every key of the
        # row has the one fill, as transformers' masks give.)
        hidden = (lse < -0.5 * 3.4028234663852886e38)[:, None]
        p = gl.where(hidden, gl.where(value > float("-inf"), 1.0 / N, 0.0), gl.exp2(value - lse[:, None]))
        p = gl.where((offs_n < N)[None, :], p, 0.0)
    elif SCORED:
        s = s * qk_scale
        p = gl.exp2(PROGRAM(s, z, h, offs_m, offs_n, M, N, vectors) - lse[:, None])
    else:
        p = gl.exp2(s * qk_scale - lse[:, None])
    if MASK and not MASK_BLOCKS:  # causal: key n is seen by rows m >= n (WINDOWED: and m < n + window)
        seen = offs_m[:, None] >= offs_n[None, :]
        if WINDOWED:
            seen = seen & (offs_m[:, None] - offs_n[None, :] < window)
        p = gl.where(seen, p, 0.0)
    p_smem.store(p.to(dtype))
    dp = warpgroup_mma_wait(0, deps=(dp, ))
    ds = p * (dp - delta[:, None])
    if MASK_BLOCKS and MASK or SCORED:  # dS of the scores, from the program's result's
        ds = PROGRAM_GRAD(s, ds, z, h, offs_m, offs_n, M, N, vectors)
    if HAS_BIAS and MASK:  # a row the bias made NaN has delta NaN, and P = 0 past the diagonal would give 0 * NaN:
        ds = gl.where(seen, ds, 0.0)  # masked keys get no gradient (eager's masked_fill)
    if DS_OUT:  # the previous tile's dS store, issued before its dQ adds, has read the shared tile (the issuing
        tma.store_wait(PARTS)  # thread waits; the barrier holds the others until it has)
        _cta_barrier()
    ds_smem.store(ds.to(dtype))
    fence_async_shared()
    tma.store_wait((DQ_BUFFERS - 1) * PARTS)  # the dQ adds issued DQ_BUFFERS tiles ago (one a part) have read their
    # buffers (only the issuing thread waits)
    _cta_barrier()  # P and dS are in shared memory, each warpgroup's half of the keys; every warp is done with the
    # previous tile's stage; this tile's dQ buffer is free
    if DS_OUT:  # (rows past M and keys past N are not written)
        tma_store(ds_desc, [z, h - ds_head0, m0, n0], ds_smem)
    if not FIRST:
        if ring > 0:  # the previous tile's q / dO stage: its dK / dV matmuls completed with this tile's S (or, the
            # previous key tile's last, before its dK / dV were stored)
            mbarrier.arrive(empty.index((ring - 1) % STAGES))

    # dQ first: its add into global memory starts while dV and dK are on the tensor cores
    ds_a = ds_smem
    ds_t_a = ds_smem.permute((1, 0))
    # With head-dim parts, dS and dS^T are the A of PARTS wgmmas each: read into registers once instead of from
    # shared memory by every wgmma (2 x (PARTS - 1) fewer tile reads; 4-7% faster backward at 192 / 128, H200 sweep)
    if PARTS > 1:
        ds_a = ds_smem.load(gl.DotOperandLayout(0, dq_layout, 2))
        ds_t_a = ds_smem.permute((1, 0)).load(gl.DotOperandLayout(0, dk_layout, 2))
    dq_zero = gl.zeros([BLOCK_M, PART_D], gl.float32, layout=dq_layout)
    dq = (warpgroup_mma(ds_a, k_smem.index(pin), dq_zero, use_acc=False, is_async=True), )
    for part in gl.static_range(1, PARTS):
        dq = dq + (warpgroup_mma(ds_a, k_smem.index(pin + part), dq_zero, use_acc=False, is_async=True), )
    dv = warpgroup_mma(p_smem.permute((1, 0)), do, dv, use_acc=not FIRST, is_async=True)
    dk_parts = (warpgroup_mma(ds_t_a, q_smem.index(stage * PARTS), dk[0], use_acc=not FIRST,
                              is_async=True), )
    for part in gl.static_range(1, PARTS):
        dk_parts = dk_parts + (warpgroup_mma(ds_t_a, q_smem.index(stage * PARTS + part), dk[part],
                                             use_acc=not FIRST, is_async=True), )
    dq = warpgroup_mma_wait(1 + PARTS, deps=dq)  # (dV and dK's parts still in flight)
    if PARTS == 1:  # (a wait on one dependency gives it back bare)
        dq = (dq, )
    for part in gl.static_range(PARTS):
        dq_smem.index((ring % DQ_BUFFERS) * PARTS + part).store(dq[part])
    fence_async_shared()
    _cta_barrier()  # all of dQ is in shared memory
    for part in gl.static_range(PARTS):  # rows past M are not written
        _tma_add(dq_desc, [z, h, m0, part * PART_D], dq_smem.index((ring % DQ_BUFFERS) * PARTS + part))
    return dk_parts, dv


@gluon.jit
def _causal_key_tile(pid, t, n_n, n_mb, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, window,
                     WINDOWED: gl.constexpr):
    """The CTA's t-th key tile when causal: (its first key, the query tile its walk starts at (the diagonal's), the
    first query tile wholly below the diagonal, the first past it that a row's window leaves a key of the tile
    (WINDOWED: a sliding window of ``window`` keys; else none), query tiles a head). Paired
    (:data:`_PAIR_UP_TO_WAVES`), a CTA takes key tiles pid and n_n - 1 - pid (the middle one alone when n_n is odd),
    so that every CTA walks about n_mb + 1 query tiles a head; otherwise key tile pid alone. Under a window the walk
    ends at the last row that sees the tile's last key."""
    n0 = (pid if t == 0 else n_n - 1 - pid) * BLOCK_N
    m_lo = n0 // BLOCK_M
    full_lo = gl.minimum((n0 + BLOCK_N) // BLOCK_M, n_mb)
    m_hi = n_mb
    full_hi = n_mb
    if WINDOWED:  # rows n0 + window on leave key n0 out; row n0 + BLOCK_N - 1 + window is the first to see none
        m_hi = gl.minimum(gl.cdiv(n0 + BLOCK_N - 1 + window, BLOCK_M), n_mb)
        full_hi = gl.maximum(gl.minimum((n0 + window) // BLOCK_M, m_hi), full_lo)
    return n0, m_lo, full_lo, full_hi, m_hi - m_lo


@gluon.jit
def _store_dk_dv(dk, dv, dk_desc, dv_desc, k_smem, v_smem, z, h_kv, n0, sm_scale, PARTS: gl.constexpr,
                 PART_D: gl.constexpr):
    """k and v are read no more (the last tile's barrier): dK (its PARTS column parts) and dV go out through their
    tiles."""
    for part in gl.static_range(PARTS):
        k_smem.index(part).store((dk[part] * sm_scale).to(dk_desc.dtype))
    v_smem.index(0).store(dv.to(dv_desc.dtype))
    fence_async_shared()
    _cta_barrier()
    for part in gl.static_range(PARTS):  # keys past N are not written
        tma_store(dk_desc, [z, h_kv, n0, part * PART_D], k_smem.index(part))
    tma_store(dv_desc, [z, h_kv, n0, 0], v_smem.index(0))
    tma.store_wait(0)


@gluon.jit
def _compute(q_desc, dk_desc, dv_desc, dq_desc, Lse, Delta, Bias, stride_bz, stride_bh, stride_bm, stride_bn, q_smem,
             do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem, kv_bar, kv_free, ready, empty, z, h_kv, pid, n_n, n_mb,
             n_kt, H, M, N, qk_scale, sm_scale, GQA_GROUP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             PARTS: gl.constexpr, PART_D: gl.constexpr, HEAD_DV: gl.constexpr, STAGES: gl.constexpr,
             WARPS: gl.constexpr, CAUSAL: gl.constexpr,
             HAS_BIAS: gl.constexpr, ZERO_EMPTY_ROWS: gl.constexpr, bias_smem, BIAS_TMA: gl.constexpr,
             DQ_BUFFERS: gl.constexpr, ds_desc, ds_head0, DS_OUT: gl.constexpr, block_lists, vectors,
             MASK_BLOCKS: gl.constexpr, PROGRAM: gl.constexpr, PROGRAM_GRAD: gl.constexpr, window,
             WINDOWED: gl.constexpr, SCORED: gl.constexpr):
    """The CTA's two warpgroups: the five matmuls and softmax of every query tile, dK and dV, for each of its n_kt key
    tiles (causal: :func:`_causal_key_tile`; otherwise one, pid), and (DS_OUT) each tile's dS; MASK_BLOCKS, key tile
    pid's listed query tiles (:func:`.common.listed_tiles`), the first run of full ones plain, the rest masked.
    dK and dV's matmuls stay in flight from one query tile into the next (waited for with its S), faster than waiting
    in the tile (H100). Unmasked, the first tile runs before the loop: zero accumulators flowing into the loop make
    ptxas serialize its wgmmas there (C7515); causal, peeling it spills, so the loops start from zeros, which ptxas
    takes there without serializing."""
    # S / dP [BLOCK_M, BLOCK_N] and dQ's parts [BLOCK_M, PART_D]: the warpgroups split the rows (wgmma's M is 64 a
    # warpgroup: 4 warps of 16 rows), and the columns where BLOCK_M is 64; dK's parts [BLOCK_N, PART_D] and dV
    # [BLOCK_N, HEAD_DV] likewise: they split the keys, and the columns where BLOCK_N is 64
    WARPS_M: gl.constexpr = min(WARPS, BLOCK_M // 16)
    WARPS_N: gl.constexpr = min(WARPS, BLOCK_N // 16)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS_M, WARPS // WARPS_M],
                                                       instr_shape=[16, BLOCK_N // (WARPS // WARPS_M), 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS_M, WARPS // WARPS_M],
                                                        instr_shape=[16, PART_D // (WARPS // WARPS_M), 16])
    dk_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS_N, WARPS // WARPS_N],
                                                        instr_shape=[16, PART_D // (WARPS // WARPS_N), 16])
    dv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS_N, WARPS // WARPS_N],
                                                        instr_shape=[16, HEAD_DV // (WARPS // WARPS_N), 16])

    qlist = block_lists[0]  # (MASK_BLOCKS: the key tile's row of the lists)
    if MASK_BLOCKS:  # as causal, the loops start from zero accumulators (whether the first tile is masked is not known)
        qlist, n_run, per_head = listed_tiles(block_lists, z, pid, gl.cdiv(M, BLOCK_M))
        n0 = pid * BLOCK_N
        offs_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        dk = (warpgroup_mma_init(gl.zeros([BLOCK_N, PART_D], gl.float32, layout=dk_layout)), ) * PARTS
        dv = warpgroup_mma_init(gl.zeros([BLOCK_N, HEAD_DV], gl.float32, layout=dv_layout))
        mbarrier.wait(kv_bar, 0)
        for g in range(GQA_GROUP):
            for it in range(g * per_head, g * per_head + n_run):  # the first run of full tiles
                dk, dv = _query_tile(q_desc, dq_desc, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem,
                                     ready, empty, dk, dv, Lse, Delta, Bias, stride_bz, stride_bh, stride_bm,
                                     stride_bn, z, h_kv, it, 0, 0, per_head, H, M, N, qk_scale, offs_n, GQA_GROUP,
                                     BLOCK_M, BLOCK_N, PARTS, PART_D, STAGES, s_layout, dq_layout, dk_layout, False,
                                     False, HAS_BIAS, ZERO_EMPTY_ROWS, bias_smem, BIAS_TMA, DQ_BUFFERS, ds_desc, n0,
                                     ds_head0, DS_OUT, qlist, vectors, MASK_BLOCKS, PROGRAM_GRAD, PROGRAM, window,
                                     WINDOWED, SCORED)
            for it in range(g * per_head + n_run, (g + 1) * per_head):
                dk, dv = _query_tile(q_desc, dq_desc, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem,
                                     ready, empty, dk, dv, Lse, Delta, Bias, stride_bz, stride_bh, stride_bm,
                                     stride_bn, z, h_kv, it, 0, 0, per_head, H, M, N, qk_scale, offs_n, GQA_GROUP,
                                     BLOCK_M, BLOCK_N, PARTS, PART_D, STAGES, s_layout, dq_layout, dk_layout, True,
                                     False, HAS_BIAS, ZERO_EMPTY_ROWS, bias_smem, BIAS_TMA, DQ_BUFFERS, ds_desc, n0,
                                     ds_head0, DS_OUT, qlist, vectors, MASK_BLOCKS, PROGRAM_GRAD, PROGRAM, window,
                                     WINDOWED, SCORED)
        waited = warpgroup_mma_wait(0, deps=(dv, ) + dk)  # the last tile's
        _store_dk_dv(waited[1:], waited[0], dk_desc, dv_desc, k_smem, v_smem, z, h_kv, n0, sm_scale, PARTS, PART_D)
    elif CAUSAL:
        r0 = 0
        for t in range(n_kt):
            n0, m_lo, full_lo, full_hi, per_head = _causal_key_tile(pid, t, n_n, n_mb, BLOCK_M, BLOCK_N, window,
                                                                    WINDOWED)
            offs_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            # (accumulators in flight from one iteration to the next: the loops carry them as such)
            dk = (warpgroup_mma_init(gl.zeros([BLOCK_N, PART_D], gl.float32, layout=dk_layout)), ) * PARTS
            dv = warpgroup_mma_init(gl.zeros([BLOCK_N, HEAD_DV], gl.float32, layout=dv_layout))
            mbarrier.wait(kv_bar, t & 1)
            for g in range(GQA_GROUP):
                for it in range(g * per_head, g * per_head + full_lo - m_lo):  # the tiles across the diagonal
                    dk, dv = _query_tile(q_desc, dq_desc, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem,
                                         ready, empty, dk, dv, Lse, Delta, Bias, stride_bz, stride_bh, stride_bm,
                                         stride_bn, z, h_kv, it, r0, m_lo, per_head, H, M, N, qk_scale, offs_n,
                                         GQA_GROUP, BLOCK_M, BLOCK_N, PARTS, PART_D, STAGES, s_layout, dq_layout,
                                         dk_layout, True, False, HAS_BIAS, ZERO_EMPTY_ROWS, bias_smem, BIAS_TMA,
                                         DQ_BUFFERS, ds_desc, n0, ds_head0, DS_OUT, qlist, vectors, MASK_BLOCKS,
                                         PROGRAM_GRAD, PROGRAM, window, WINDOWED, SCORED)
                for it in range(g * per_head + full_lo - m_lo, g * per_head + full_hi - m_lo):
                    dk, dv = _query_tile(q_desc, dq_desc, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem,
                                         ready, empty, dk, dv, Lse, Delta, Bias, stride_bz, stride_bh, stride_bm,
                                         stride_bn, z, h_kv, it, r0, m_lo, per_head, H, M, N, qk_scale, offs_n,
                                         GQA_GROUP, BLOCK_M, BLOCK_N, PARTS, PART_D, STAGES, s_layout, dq_layout,
                                         dk_layout, False, False, HAS_BIAS, ZERO_EMPTY_ROWS, bias_smem, BIAS_TMA,
                                         DQ_BUFFERS, ds_desc, n0, ds_head0, DS_OUT, qlist, vectors, MASK_BLOCKS,
                                         PROGRAM_GRAD, PROGRAM, window, WINDOWED, SCORED)
                if WINDOWED:  # the tiles whose rows' windows leave some of the key tile out
                    for it in range(g * per_head + full_hi - m_lo, (g + 1) * per_head):
                        dk, dv = _query_tile(q_desc, dq_desc, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem,
                                             dq_smem, ready, empty, dk, dv, Lse, Delta, Bias, stride_bz, stride_bh,
                                             stride_bm, stride_bn, z, h_kv, it, r0, m_lo, per_head, H, M, N, qk_scale,
                                             offs_n, GQA_GROUP, BLOCK_M, BLOCK_N, PARTS, PART_D, STAGES, s_layout,
                                             dq_layout, dk_layout, True, False, HAS_BIAS, ZERO_EMPTY_ROWS, bias_smem,
                                             BIAS_TMA, DQ_BUFFERS, ds_desc, n0, ds_head0, DS_OUT, qlist, vectors,
                                             MASK_BLOCKS, PROGRAM_GRAD, PROGRAM, window, WINDOWED, SCORED)
            waited = warpgroup_mma_wait(0, deps=(dv, ) + dk)  # the last tile's
            _store_dk_dv(waited[1:], waited[0], dk_desc, dv_desc, k_smem, v_smem, z, h_kv, n0, sm_scale, PARTS, PART_D)
            mbarrier.arrive(kv_free)  # the loader may bring the next key tile's k and v
            r0 += GQA_GROUP * per_head
    else:
        # every tile unmasked, the group's heads one after another; the first tile apart, so that the loop's dK and
        # dV are always a wgmma's result
        n0 = pid * BLOCK_N
        offs_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        dk = (gl.zeros([BLOCK_N, PART_D], gl.float32, layout=dk_layout), ) * PARTS
        dv = gl.zeros([BLOCK_N, HEAD_DV], gl.float32, layout=dv_layout)
        mbarrier.wait(kv_bar, 0)
        dk, dv = _query_tile(q_desc, dq_desc, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem, ready, empty,
                             dk, dv, Lse, Delta, Bias, stride_bz, stride_bh, stride_bm, stride_bn, z, h_kv, 0, 0, 0,
                             n_mb, H, M, N, qk_scale, offs_n, GQA_GROUP, BLOCK_M, BLOCK_N, PARTS, PART_D, STAGES,
                             s_layout, dq_layout, dk_layout, False, True, HAS_BIAS, ZERO_EMPTY_ROWS, bias_smem,
                             BIAS_TMA, DQ_BUFFERS, ds_desc, n0, ds_head0, DS_OUT, qlist, vectors, MASK_BLOCKS,
                             PROGRAM_GRAD, PROGRAM, window, WINDOWED, SCORED)
        for it in range(1, GQA_GROUP * n_mb):
            dk, dv = _query_tile(q_desc, dq_desc, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem, ready,
                                 empty, dk, dv, Lse, Delta, Bias, stride_bz, stride_bh, stride_bm, stride_bn, z, h_kv,
                                 it, 0, 0, n_mb, H, M, N, qk_scale, offs_n, GQA_GROUP, BLOCK_M, BLOCK_N, PARTS,
                                 PART_D, STAGES, s_layout, dq_layout, dk_layout, False, False, HAS_BIAS,
                                 ZERO_EMPTY_ROWS, bias_smem, BIAS_TMA, DQ_BUFFERS, ds_desc, n0, ds_head0, DS_OUT, qlist,
                                 vectors, MASK_BLOCKS, PROGRAM_GRAD, PROGRAM, window, WINDOWED, SCORED)
        waited = warpgroup_mma_wait(0, deps=(dv, ) + dk)  # the last tile's
        _store_dk_dv(waited[1:], waited[0], dk_desc, dv_desc, k_smem, v_smem, z, h_kv, n0, sm_scale, PARTS, PART_D)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, kv_free, ready, empty, z, h_kv,
            pid, n_n, n_mb, n_kt, GQA_GROUP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
            STAGES: gl.constexpr, CAUSAL: gl.constexpr, bias_desc, bias_smem, stride_bz, stride_bh,
            BIAS_TMA: gl.constexpr, PARTS: gl.constexpr, PART_D: gl.constexpr, M, block_lists,
            MASK_BLOCKS: gl.constexpr, window, WINDOWED: gl.constexpr):
    """One warp: for each of the CTA's key tiles (MASK_BLOCKS: its listed query tiles), its k (in PARTS column parts of
    PART_D, as q) and v (once the previous key tile's dK and dV are stored from their buffers), then every query
    tile's q and dO (and BIAS_TMA, its bias tile: of the bias's batch row and head where it has them, else 0) into
    the ring as the compute warpgroups free its stages."""
    r0 = 0
    qlist = block_lists[0]
    for t in range(n_kt):
        if MASK_BLOCKS:
            qlist, _, per_head = listed_tiles(block_lists, z, pid, gl.cdiv(M, BLOCK_M))
            n0, m_lo = pid * BLOCK_N, 0
        elif CAUSAL:
            n0, m_lo, _, _, per_head = _causal_key_tile(pid, t, n_n, n_mb, BLOCK_M, BLOCK_N, window, WINDOWED)
        else:
            n0, m_lo, per_head = pid * BLOCK_N, 0, n_mb
        if t > 0:
            mbarrier.wait(kv_free, (t - 1) & 1)
        mbarrier.expect(kv_bar, PARTS * k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma_load_parts(k_desc, z, h_kv, n0, kv_bar, k_smem, 0, PARTS, PART_D)
        tma_load(v_desc, [z, h_kv, n0, 0], kv_bar, v_smem.index(0))
        for it in range(GQA_GROUP * per_head):
            ring = r0 + it
            stage = ring % STAGES
            mbarrier.wait(empty.index(stage), ((ring // STAGES) & 1) ^ 1)  # (a fresh barrier passes parity 1)
            h, mb = _tile_of(it, h_kv, m_lo, per_head, GQA_GROUP, qlist, MASK_BLOCKS)
            bias_z, bias_h = bias_tma_head(z, h, stride_bz, stride_bh)
            _load_q_do(q_desc, do_desc, q_smem, do_smem, ready, z, h, mb * BLOCK_M, stage, bias_desc, bias_smem,
                       bias_z, bias_h, n0, BIAS_TMA, PARTS, PART_D)
        r0 += GQA_GROUP * per_head


@gluon.jit
def _hopper_attn_bwd(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, dq_desc, Lse, Delta, H, H_KV, M, N, qk_scale,
                     sm_scale, window, Bias, stride_bz, stride_bh, stride_bm, stride_bn, Z, bias_desc, ds_desc,
                     kv_head0, BlockList, BlockCounts, stride_blist_z, stride_bcount_z, V0, stride_v0_z, stride_v0_h,
                     stride_v0_m, stride_v0_n, V1, stride_v1_z, stride_v1_h, stride_v1_m, stride_v1_n, V2, stride_v2_z,
                     stride_v2_h, stride_v2_m, stride_v2_n, V3, stride_v3_z, stride_v3_h, stride_v3_m, stride_v3_n,
                     GQA_GROUP: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     HEAD_D: gl.constexpr, PART_D: gl.constexpr, HEAD_DV: gl.constexpr, STAGES: gl.constexpr,
                     WARPS: gl.constexpr, PAIRED: gl.constexpr,
                     HAS_BIAS: gl.constexpr, BATCH_INNER: gl.constexpr, ZERO_EMPTY_ROWS: gl.constexpr,
                     BIAS_TMA: gl.constexpr, DQ_BUFFERS: gl.constexpr, DS_OUT: gl.constexpr, MASK_BLOCKS: gl.constexpr,
                     PROGRAM: gl.constexpr, PROGRAM_GRAD: gl.constexpr, WINDOWED: gl.constexpr,
                     SCORED: gl.constexpr):
    """The grid: key tiles (paired: two a CTA) by Z x H_KV (batch row, kv head) pairs, the kv heads kv_head0 on of a
    launch that takes H_KV of them (DS_OUT: the dS of their query heads, into ds_desc's chunk of heads). MASK_BLOCKS:
    the key-major lists and counts of the tile-classes kernel, key_range_tiles or mask_tiles (common.tile_lists); the
    vectors (V0-V3, the spec's score tensors in order; slots past them unread) that PROGRAM and PROGRAM_GRAD read."""
    gl.static_assert(not (MASK_BLOCKS and (CAUSAL or PAIRED or HAS_BIAS)), "listed tiles: one key tile a CTA")
    # WINDOWED: causal keys among each row's ``window`` latest, one key tile a CTA (every walk about the window's)
    gl.static_assert(not WINDOWED or (CAUSAL and not (PAIRED or HAS_BIAS or MASK_BLOCKS)),
                     "a window: causal, one key tile a CTA, no bias")
    # SCORED: every score through the spec's program of the score tensors in the vector slots, no bias
    gl.static_assert(not SCORED or not (MASK_BLOCKS or HAS_BIAS), "a score program: no listed tiles, no bias")
    block_lists = (BlockList, BlockCounts, stride_blist_z, stride_bcount_z)
    vectors = (V0, stride_v0_z, stride_v0_h, stride_v0_m, stride_v0_n, V1, stride_v1_z, stride_v1_h, stride_v1_m,
               stride_v1_n, V2, stride_v2_z, stride_v2_h, stride_v2_m, stride_v2_n, V3, stride_v3_z, stride_v3_h,
               stride_v3_m, stride_v3_n)
    pid = gl.program_id(0)
    z, h_kv = batch_and_head(gl.program_id(1), Z, H_KV, BATCH_INNER)
    h_kv += kv_head0
    n_n = gl.cdiv(N, BLOCK_N)
    n_mb = gl.cdiv(M, BLOCK_M)
    if PAIRED:  # (causal) key tiles pid and n_n - 1 - pid, one where they are the same
        n_kt = gl.where(n_n - 1 - pid != pid, 2, 1)
    else:
        n_kt = 1

    # q, k, dQ and dK in PARTS column parts of PART_D (:func:`.common.head_dim_part`): one buffer a part
    PARTS: gl.constexpr = HEAD_D // PART_D
    k_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, PART_D], k_desc.dtype)
    v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DV], v_desc.dtype)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, PART_D], q_desc.dtype)
    do_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DV], do_desc.dtype)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], q_desc.dtype)
    dq_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, PART_D], gl.float32)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [PARTS, BLOCK_N, PART_D], k_layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [1, BLOCK_N, HEAD_DV], v_layout)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES * PARTS, BLOCK_M, PART_D], q_layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, HEAD_DV], do_layout)
    p_smem = gl.allocate_shared_memory(q_desc.dtype, [1, BLOCK_M, BLOCK_N], p_layout)
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [1, BLOCK_M, BLOCK_N], p_layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_BUFFERS * PARTS, BLOCK_M, PART_D], dq_smem_layout)
    bias_smem = p_smem  # (no BIAS_TMA: a stand-in, never read)
    if BIAS_TMA:  # a bias tile a ring stage, beside its q and dO
        bias_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], bias_desc.dtype)
        bias_smem = gl.allocate_shared_memory(bias_desc.dtype, [STAGES, BLOCK_M, BLOCK_N], bias_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    mbarrier.init(kv_free, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)

    gl.warp_specialize([
        (_compute, (q_desc, dk_desc, dv_desc, dq_desc, Lse, Delta, Bias, stride_bz, stride_bh, stride_bm, stride_bn,
                    q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem, kv_bar, kv_free, ready, empty, z, h_kv,
                    pid, n_n, n_mb, n_kt, H, M, N, qk_scale, sm_scale, GQA_GROUP, BLOCK_M, BLOCK_N, PARTS, PART_D,
                    HEAD_DV, STAGES, WARPS, CAUSAL, HAS_BIAS, ZERO_EMPTY_ROWS, bias_smem, BIAS_TMA, DQ_BUFFERS, ds_desc,
                    kv_head0 * GQA_GROUP, DS_OUT, block_lists, vectors, MASK_BLOCKS, PROGRAM, PROGRAM_GRAD, window,
                    WINDOWED, SCORED)),
        (_loader, (q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, kv_free, ready, empty, z,
                   h_kv, pid, n_n, n_mb, n_kt, GQA_GROUP, BLOCK_M, BLOCK_N, STAGES, CAUSAL, bias_desc, bias_smem,
                   stride_bz, stride_bh, BIAS_TMA, PARTS, PART_D, M, block_lists, MASK_BLOCKS, window, WINDOWED)),
    ], [1], [24])  # the loader: one warp (Triton pads it to a warpgroup) at 24 registers a thread, so that the compute
    # threads get (65536 - 128 x 24) / 256 = 244, 240 after setmaxnreg's rounding to 8 (ptxas: no spills at D128; at
    # D64 causal, in the loop over the diagonal's query tiles, 8 bytes with GQA one key tile a CTA, 80-96 paired)


# ---- launcher --------------------------------------------------------------------------------------------------------
def bias_ring_dq_buffers(block_m: int, block_n: int, stages: int, dq_buffers: int, head_dim: int, dtype: torch.dtype,
                         bias_dtype: torch.dtype) -> int:
    """The dQ buffers a config keeps with a bias tile in each ring stage: its ``dq_buffers``, or fewer where only
    those leave the room (the kernel then waits for a tile's dQ add before the next tile's dQ goes to shared memory),
    or 0 where neither fits the shared memory a CTA may use (the compute warpgroups load the bias then)."""
    budget = shared_memory_for_tiles()
    size = dtype.itemsize
    tiles = (2 * block_n * head_dim * size + stages * 2 * block_m * head_dim * size  # k, v; q and dO
             + 2 * block_m * block_n * size + stages * block_m * block_n * bias_dtype.itemsize)  # P, dS; bias
    fitting = [n for n in range(dq_buffers, 0, -1) if tiles + n * block_m * head_dim * 4 <= budget]  # (fp32 dQ)
    return fitting[0] if fitting else 0


def pairs_key_tiles(causal: bool, key_tiles: int, kv_heads: int, device: torch.device) -> bool:
    """Whether a call's CTAs take two key tiles each (:data:`_PAIR_UP_TO_WAVES`): causal, and one key tile a CTA would
    fill at most that many waves of the device's SMs (off a GPU, no SMs: one key tile a CTA)."""
    return causal and fills_at_most(key_tiles * kv_heads, _PAIR_UP_TO_WAVES, device)


_launch_delta = PositionalLaunch(_delta_kernel)
_launch_backward = PositionalLaunch(_hopper_attn_bwd)
_launch_nan_dv = PositionalLaunch(_nan_dv_kernel)
_launch_dq_cast = PositionalLaunch(_dq_cast_kernel)


class BackwardCall:
    """The backward of one call signature -- a spec, the inputs' shapes, strides, dtypes and device (the bias's
    alignment too), whether the bias gets a gradient -- with what every call of it repeats worked out once: the
    config, the grids, the kernels' arguments but the tensors, the TMA descriptors' fields but their bases, and
    each launch's Triton specialization by the alignment of the tensors it takes as pointers. The op keeps one for each
    signature it meets (:func:`.common.checked_call`), as the forward keeps its :class:`.forward.ForwardCall`."""

    def __init__(self, spec: AttentionSpec, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None,
                 dout: Tensor, bias_grad: bool, vectors: Sequence[Tensor] = ()):
        Z, H, M, D = q.shape
        H_kv, N = k.shape[1], k.shape[2]
        DV = v.shape[3]
        self.shapes = (Z, H, M, D, DV, H_kv, N)
        self.scale, causal, self.gqa_group = spec.scale_for(D), spec.causal is not None, spec.gqa_group
        self.window = causal_window(spec, N)
        self.chunk = (0 if bias is None else dscore_kv_heads(q, k, bias)) if bias_grad else H_kv  # kv heads a launch
        if not self.chunk:
            raise ValueError("fuse_attn::flash_attention_hopper_backward computes the gradient of a bias in the "
                             "inputs' dtype whose dS chunks fit the template's gradient buffer (dscore_kv_heads)")
        block_m, block_n, stages, dq_buffers = _CONFIGS[D]
        part_d = head_dim_part(D)
        self.block_m, self.block_n, self.causal, self.bias_grad = block_m, block_n, causal, bias_grad
        # (no row of plain attention is empty: one kernel for both)
        self.zero_empty_rows = (bias is not None or bool(vectors)) and spec.empty_rows == "zero"
        # a predicate's mask, a key padding vector or a mask tensor (MASK_BLOCKS, common.lists_tiles): each call lists
        # every key tile's query tiles (else the vectors are a score program's tensors: SCORED)
        mask_blocks, scored = lists_tiles(spec), scores_by_a_program(spec)
        self.tile_classes = tile_lists(spec, vectors, M, N, block_m, block_n, key_major=True)
        programs = score_program_functions(spec)
        # causal with a bias: the query heads with a row the bias made NaN (their dV is NaN at every key, as eager's)
        self.flag_nan_rows = bias is not None and causal
        # the q, k, v and dO descriptors' tiles: q and k's in column parts (their boxes a power of two wide), as dQ's
        # and dK's
        self.tiles = ((block_m, part_d), (block_n, part_d), (block_n, DV), (block_m, DV))
        self.fields = tuple(in_place_fields(t, *tile) for t, tile in zip((q, k, v, dout), self.tiles))
        self.dk_fields = dense_fields((Z, H_kv, N, D), block_n, k.dtype, part_d)
        self.dv_fields = dense_fields((Z, H_kv, N, DV), block_n, v.dtype)
        self.dq_acc_fields = dense_fields((Z, H, M, D), block_m, torch.float32, part_d)
        self.delta_grid = (triton.cdiv(M, _PRE_ROWS), Z * H)
        self.bias_strides = (0, 0, 0, 0) if bias is None else tuple(broadcast_strides(bias))
        bias_view = None if bias is None else bias_tma_view(bias)
        self.ring_dq_buffers = 0 if bias_view is None else bias_ring_dq_buffers(block_m, block_n, stages, dq_buffers,
                                                                                D, q.dtype, bias.dtype)
        n_n = triton.cdiv(N, block_n)  # key tiles
        self.chunks = []  # (first kv head, kv heads, grid, paired) of each launch of the backward kernel
        for kv_head0 in range(0, H_kv, self.chunk):
            kv_heads = min(self.chunk, H_kv - kv_head0)
            paired = not self.window and pairs_key_tiles(causal, n_n, Z * kv_heads, q.device)
            self.chunks.append((kv_head0, kv_heads, (triton.cdiv(n_n, 2) if paired else n_n, Z * kv_heads), paired))
        self.part_d = part_d
        self.flags = (self.gqa_group, causal, block_m, block_n, D, part_d, DV, stages, _NUM_WARPS)
        self.bias_flags = (bias is not None, batch_rows_innermost(spec), self.zero_empty_rows,
                           self.ring_dq_buffers > 0, self.ring_dq_buffers or dq_buffers, bias_grad, mask_blocks,
                           *programs, bool(self.window), scored)
        self.specializations = {}  # (PositionalLaunch.launch_kept)

    def __call__(self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dlse: Tensor | None,
                 bias: Tensor | None, vectors: Sequence[Tensor] = ()) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        Z, H, M, D, DV, H_kv, N = self.shapes
        device = q.device
        q_desc, k_desc, v_desc, do_desc = (described(t, fields, *tile) for t, fields, tile
                                           in zip((q, k, v, dout), self.fields, self.tiles))
        dout = do_desc.base  # (where TMA could not read it in place, the copy the descriptor reads)
        lse = lse.contiguous()
        out = out if out.stride(-1) == 1 else out.contiguous()  # (the delta kernel reads rows along a unit stride)
        dlse = None if dlse is None else dlse.contiguous()
        delta = torch.empty(Z, H, M, dtype=torch.float32, device=device)
        nan_heads = torch.zeros(Z * H, dtype=torch.int32, device=device) if self.flag_nan_rows else lse  # (not read)
        lse_or_dlse = lse if dlse is None else dlse
        dq_acc = torch.empty(Z, H, M, D, dtype=torch.float32, device=device)  # (zeroed by the delta kernel)
        _launch_delta.launch_kept(self.specializations, (out, dout, lse_or_dlse), self.delta_grid,
                                  out, dout, lse_or_dlse, delta, lse, nan_heads, dq_acc, H, M, *out.stride()[:3],
                                  *dout.stride()[:3], dlse is not None, _PRE_ROWS, DV, D, self.part_d,
                                  self.flag_nan_rows, self.zero_empty_rows)
        dk = torch.empty(Z, H_kv, N, D, dtype=k.dtype, device=device)
        dv = torch.empty(Z, H_kv, N, DV, dtype=v.dtype, device=device)
        descriptors = (q_desc, k_desc, v_desc, do_desc, with_base(self.dk_fields, dk), with_base(self.dv_fields, dv),
                       with_base(self.dq_acc_fields, dq_acc))
        # (no bias tiles in the ring: q's descriptor stands in, never read)
        bias_desc = (tma_descriptor(bias_tma_view(bias), self.block_m, self.block_n) if self.ring_dq_buffers
                     else q_desc)
        dbias, ds_desc, ds = None, q_desc, None  # (no dS out: q's descriptor stands in, never written)
        if self.bias_grad:
            # causal: the tiles past the diagonal are never visited, and their dS is 0 (the buffer keeps its zeros
            # from one chunk to the next: each chunk writes the same tiles)
            ds = (torch.zeros if self.causal else torch.empty)(
                Z, self.chunk * self.gqa_group, M, ds_row_keys(N, q.element_size()), dtype=q.dtype, device=device)[..., :N]
            ds_desc = tma_descriptor(ds, self.block_m, self.block_n)
            dbias = torch.empty(bias.shape, dtype=bias.dtype, device=bias.device)
        bias_or_lse = lse if bias is None else bias  # (no bias: lse stands in for it)
        lists, counts, stride_lists_z, stride_counts_z = lse, lse, 0, 0  # (no mask blocks: lse stands in, not read)
        if self.tile_classes is not None:
            listed = self.tile_classes(vectors)
            lists, counts = listed["BlockList"], listed["BlockCounts"]
            stride_lists_z, stride_counts_z = listed["stride_blist_z"], listed["stride_bcount_z"]
        for kv_head0, kv_heads, grid, paired in self.chunks:
            _launch_backward.launch_kept(self.specializations, (lse, bias_or_lse, *vectors), grid,
                                         *descriptors, lse, delta, H, kv_heads, M, N, self.scale * LOG2E, self.scale,
                                         self.window, bias_or_lse, *self.bias_strides, Z, bias_desc, ds_desc, kv_head0,
                                         lists, counts, stride_lists_z, stride_counts_z, *vector_slots(vectors, lse),
                                         *self.flags, paired, *self.bias_flags, num_warps=_NUM_WARPS)
            if self.bias_grad:  # this chunk's heads of dbias (all of them where the bias is broadcast over the heads)
                heads = slice(kv_head0 * self.gqa_group, (kv_head0 + kv_heads) * self.gqa_group)
                chunk_ds = ds[:, :heads.stop - heads.start]
                part = dbias[:, heads] if bias.shape[1] == H else dbias
                summed = [d for d in range(4) if part.shape[d] == 1 and chunk_ds.shape[d] != 1]
                if summed:  # (in fp32, as eager's sum over the broadcast dims)
                    torch.sum(chunk_ds, summed, keepdim=True, out=part)
                else:
                    part.copy_(chunk_ds)
        if self.flag_nan_rows:
            _launch_nan_dv((triton.cdiv(N, _PRE_ROWS), Z * H_kv), dv, nan_heads, H, H_kv, N, self.gqa_group, _PRE_ROWS,
                           DV)
        dq = torch.empty(Z, H, M, D, dtype=q.dtype, device=device)
        _launch_dq_cast.launch_kept(self.specializations, (), (triton.cdiv(dq.numel(), _CAST_BLOCK),), dq_acc, dq,
                                    dq.numel(), self.scale, _CAST_BLOCK)
        return dq, dk, dv, dbias


def hopper_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, spec: AttentionSpec,
                    dlse: Tensor | None = None, bias: Tensor | None = None, bias_grad: bool = False,
                    vectors: Sequence[Tensor] = ()) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """``(dq, dk, dv, dbias)`` of a spec :func:`.common.hopper_reasons` accepts on an sm90 GPU, from the
    forward's ``out`` and ``lse`` ``[Z, H, M]``; ``dlse`` the gradient of lse or None; ``bias`` the spec's score
    tensor where it adds one. ``bias_grad``: dbias too (else None), the kernel's dS summed over the bias's broadcast
    dims, a launch for each chunk of :func:`.common.dscore_kv_heads` kv heads (a ValueError where it admits none).
    ``vectors``: the spec's score tensors where no bias is added (:func:`.common.lists_tiles`,
    :func:`.common.scores_by_a_program`).
    Unchecked: the op checks its inputs once a signature and keeps the call (:class:`BackwardCall`)."""
    return BackwardCall(spec, q, k, v, bias, dout, bias_grad, vectors)(dout, q, k, v, out, lse, dlse, bias, vectors)


# ---- the op (on common.LIBRARY: see there why not a custom_op) -------------------------------------------------------
LIBRARY.define("flash_attention_hopper_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
               "str spec, Tensor? dlse=None, Tensor? bias=None, bool bias_grad=False, Tensor[]? vectors=None) "
               "-> (Tensor, Tensor, Tensor, Tensor)")


def flash_attention_hopper_backward_op(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                                       spec: str, dlse: Tensor | None = None, bias: Tensor | None = None,
                                       bias_grad: bool = False,
                                       vectors: Sequence[Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dq, dk, dv, dbias)`` of ``fuse_attn::flash_attention_hopper``'s output (and lse, ``dlse``), ``bias`` its
    score tensor where the spec adds one, ``vectors`` its score tensors where a predicate of them masks; dbias the
    bias's gradient where ``bias_grad`` (:func:`.common.dscore_kv_heads` must admit it), else an empty tensor. Opaque
    to torch.compile, as the forward. On CPU tensors it refuses (its reasons say why)."""
    vectors = vectors or ()
    if ops.is_empty(q, k):
        checked_call("flash_attention_hopper_backward", q, k, v, spec, bias, parsed_spec, vectors=vectors)
        dq, dk, dv, dbias = ops.empty_backward(q, k, v, [bias] if bias_grad else [], [bias_grad])
        return dq, dk, dv, dbias[0] if bias_grad else q.new_empty(0)
    call = checked_call("flash_attention_hopper_backward", q, k, v, spec, bias,
                        lambda s, q, k, v, bias, vectors: BackwardCall(s, q, k, v, bias, dout, bias_grad, vectors),
                        dout, bias_grad, vectors=vectors)
    dq, dk, dv, dbias = call(dout, q, k, v, out, lse, dlse, bias, vectors)
    return dq, dk, dv, q.new_empty(0) if dbias is None else dbias


for _device in ("CPU", "CUDA"):
    LIBRARY.impl("flash_attention_hopper_backward", flash_attention_hopper_backward_op, _device)


@torch.library.register_fake("fuse_attn::flash_attention_hopper_backward")
def _(dout, q, k, v, out, lse, spec, dlse=None, bias=None, bias_grad=False, vectors=None):
    ops.validate(q, k, v, op_score_tensors(bias, vectors or ()), ops.parse_spec(spec))
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            bias.new_empty(bias.shape) if bias_grad else q.new_empty(0))
