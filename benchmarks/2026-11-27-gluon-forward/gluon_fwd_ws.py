"""Probe, second form: the Gluon forward with FlashAttention-3's warp specialization. A CTA takes 2 x BLOCK_M query rows:
two consumer warpgroups (the default partition and a 4-warp worker) own BLOCK_M rows each, and a 1-warp producer loads
q and the k / v ring by TMA. Consumers release a ring stage by an mbarrier arrive, never by a CTA-wide barrier, so the
two warpgroups drift apart and one's softmax can run while the other's matmuls do (FA3 orders them with named
barriers, "ping-pong"; this probe leaves them free). Each consumer keeps gluon_fwd.py's intra-warpgroup overlap.

    python gluon_fwd_ws.py compile | check bench    (as gluon_fwd.py)
"""
import os
import subprocess
import sys
import tempfile

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)

import gluon_fwd
from gluon_fwd import LOG2E, _descriptors, _softmax_step


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, kv_ready, kv_empty, q_row, kv_row, n_tiles,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    for c in gl.static_range(2):
        mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [q_row + c * BLOCK_M, 0], q_bars.index(c), q_smem.index(c))
    for j in range(n_tiles):
        stage = j % STAGES
        # a fresh barrier passes a wait on parity 1: the first STAGES loads do not wait
        mbarrier.wait(kv_empty.index(stage), ((j // STAGES) & 1) ^ 1)
        bar = kv_ready.index(stage)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + j * BLOCK_N, 0], bar, k_smem.index(stage))
        tma.async_copy_global_to_shared(v_desc, [kv_row + j * BLOCK_N, 0], bar, v_smem.index(stage))


@gluon.jit
def _consumer_step(q, k_smem, v_smem, kv_ready, kv_empty, acc, p_op, m_i, l_i, s_zero, offs_m, qk_scale, j,
                   BLOCK_N: gl.constexpr, STAGES: gl.constexpr, col_layout: gl.constexpr, o_layout: gl.constexpr,
                   p_layout: gl.constexpr, MASK: gl.constexpr):
    stage = j % STAGES
    mbarrier.wait(kv_ready.index(stage), (j // STAGES) & 1)
    s = warpgroup_mma(q, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    prev = (j - 1) % STAGES
    acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
    s = warpgroup_mma_wait(1, deps=(s, ))
    offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_layout)
    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, offs_m, offs_n, qk_scale, MASK)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
    mbarrier.arrive(kv_empty.index(prev))  # tile j-1's k and v are read
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p_op = gl.convert_layout(p.to(p_op.dtype), p_layout)
    return acc, p_op, m_i, l_i


@gluon.jit
def _consumer(o_desc, Lse, q_smem, k_smem, v_smem, q_bars, kv_ready, kv_empty, q_row, row_in_head, lse_row, n_tiles,
              qk_scale, C: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              HEAD_D: gl.constexpr, STAGES: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)

    start_m = row_in_head + C * BLOCK_M  # this warpgroup's first row within the head
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_layout)
    if CAUSAL:
        n_full = gl.maximum((start_m + 1) // BLOCK_N, 1)
    else:
        n_full = n_tiles
    q = q_smem.index(C)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_layout)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=row_layout)
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)

    mbarrier.wait(q_bars.index(C), 0)
    mbarrier.wait(kv_ready.index(0), 0)
    s = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, offs_m, gl.arange(0, BLOCK_N, layout=col_layout), qk_scale, CAUSAL)
    p_op = gl.convert_layout(p.to(q_smem.dtype), p_layout)
    for j in range(1, n_full):
        acc, p_op, m_i, l_i = _consumer_step(q, k_smem, v_smem, kv_ready, kv_empty, acc, p_op, m_i, l_i, s_zero, offs_m,
                                             qk_scale, j, BLOCK_N, STAGES, col_layout, o_layout, p_layout, False)
    if CAUSAL:  # (a tile that only the other warpgroup's rows see is all -inf here: p = 0, m and l unchanged)
        for j in range(n_full, n_tiles):
            acc, p_op, m_i, l_i = _consumer_step(q, k_smem, v_smem, kv_ready, kv_empty, acc, p_op, m_i, l_i, s_zero,
                                                 offs_m, qk_scale, j, BLOCK_N, STAGES, col_layout, o_layout, p_layout,
                                                 True)
    last = (n_tiles - 1) % STAGES
    acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
    mbarrier.arrive(kv_empty.index(last))

    lse = (m_i + gl.log2(l_i)) / 1.4426950408889634
    gl.store(Lse + lse_row + offs_m, lse)
    out = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    q.store(out.to(o_desc.dtype))  # this warpgroup's q tile, read only by its own finished q k^T
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row + C * BLOCK_M, 0], q)
    tma.store_wait(0)


@gluon.jit
def gluon_attn_fwd_ws(q_desc, k_desc, v_desc, o_desc, Lse, N, qk_scale,
                      CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                      STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    n_m = N // (2 * BLOCK_M)
    pid_m = gl.program_id(0)
    if CAUSAL:
        pid_m = n_m - 1 - pid_m
    bh = gl.program_id(1)
    row_in_head = pid_m * 2 * BLOCK_M
    q_row = bh * N + row_in_head
    kv_row = bh * N
    if CAUSAL:
        n_tiles = gl.cdiv(row_in_head + 2 * BLOCK_M, BLOCK_N)
    else:
        n_tiles = N // BLOCK_N

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, BLOCK_M, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(2):
        mbarrier.init(q_bars.index(c), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)  # one arrive per consumer warpgroup

    lse_row = bh * N
    gl.warp_specialize([
        (_consumer, (o_desc, Lse, q_smem, k_smem, v_smem, q_bars, kv_ready, kv_empty, q_row, row_in_head, lse_row,
                     n_tiles, qk_scale, 0, CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES)),
        (_consumer, (o_desc, Lse, q_smem, k_smem, v_smem, q_bars, kv_ready, kv_empty, q_row, row_in_head, lse_row,
                     n_tiles, qk_scale, 1, CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES)),
        (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, kv_ready, kv_empty, q_row, kv_row,
                     n_tiles, BLOCK_M, BLOCK_N, STAGES)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def gluon_attention_ws(q, k, v, causal, scale, block_m=64, block_n=128, stages=2, consumer_regs=232, producer_regs=40):
    B, H, N, D = q.shape
    assert N % (2 * block_m) == 0 and N % block_n == 0
    out = torch.empty_like(q)
    lse = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    descs = _descriptors(q, k, v, out, block_m, block_n)
    grid = (N // (2 * block_m), B * H)
    gluon_attn_fwd_ws[grid](*descs, lse, N, scale * LOG2E, causal, block_m, block_n, D, stages, consumer_regs,
                            producer_regs, num_warps=4)
    return out, lse


def compile_for_sm90(D=128, causal=True, block_m=64, block_n=128, stages=2, consumer_regs=232, producer_regs=40):
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import mangle_type
    from triton.experimental.gluon._runtime import GluonASTSource
    x = torch.empty(1, 1, 256, D, dtype=torch.bfloat16)
    descs = _descriptors(x, x, x, x, block_m, block_n)
    fn = gluon_attn_fwd_ws
    names = ["q_desc", "k_desc", "v_desc", "o_desc"]
    signature = {name: mangle_type(a) for name, a in zip(names, descs)}
    signature.update(Lse="*fp32", N="i32", qk_scale="fp32")
    consts = dict(CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_D=D, STAGES=stages,
                  CONSUMER_REGS=consumer_regs, PRODUCER_REGS=producer_regs)
    signature.update({name: "constexpr" for name in consts})
    src = GluonASTSource(fn=fn, signature=signature, constexprs={(fn.arg_names.index(n),): v for n, v in consts.items()})
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    fname = os.path.join(tempfile.mkdtemp(), "k.ptx")
    open(fname, "w").write(c.asm["ptx"])
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", fname, "-o", "/dev/null"], capture_output=True, text=True)
    info = " | ".join(l.split("ptxas info    :")[-1].strip() for l in r.stderr.splitlines()
                      if "registers" in l or "spill" in l or "C75" in l or "rror" in l)
    print(f"WS D{D} causal={causal} 2x{block_m}x{block_n} stages={stages} regs {consumer_regs}/{producer_regs} "
          f"smem {c.metadata.shared}: {info}", flush=True)
    return c


# (BLOCK_M per consumer, BLOCK_N, STAGES, consumer regs, producer regs); smem = 2 q tiles + STAGES k and v tiles
CONFIGS = {64: [(64, 128, 4, 232, 40), (64, 64, 4, 232, 40)],
           128: [(64, 128, 2, 232, 40), (64, 128, 3, 232, 40), (64, 64, 4, 232, 40), (64, 128, 2, 240, 24)]}


if __name__ == "__main__":
    if "compile" in sys.argv[1:]:
        for D in (64, 128):
            for causal in (False, True):
                for cfg in CONFIGS[D]:
                    compile_for_sm90(D, causal, *cfg)
    # both forms side by side: the first form at this session's best configs (gluon_run2.log)
    gluon_fwd.main({"gluon": (gluon_fwd.gluon_attention, {64: [(64, 128, 3, 4), (64, 64, 4, 4)],
                                                          128: [(128, 128, 3, 8), (64, 64, 3, 4)]}),
                    "gluon-ws": (gluon_attention_ws, CONFIGS)})
