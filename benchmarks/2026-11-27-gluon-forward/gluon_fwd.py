"""Probe: a Hopper flash forward written in Gluon (Triton's lower-level language: explicit TMA loads, mbarriers and
asynchronous wgmma), with FlashAttention-3's intra-warpgroup overlap: tile j's q k^T and tile j-1's P v are issued
together, and tile j's softmax runs while P v is on the tensor cores. The question: does control over the wgmma
waits (which Triton's own pipeliner places one per dot in our kernels) close the forward's gap to cuDNN?

Limits of the probe: bf16, q/k/v [B, H, N, D] contiguous, N a multiple of 128, causal or not, D 64 or 128.

    python gluon_fwd.py compile            # CPU machine: compile for sm90 (Triton 3.6 wheel), print regs/spills
    python gluon_fwd.py check bench        # GPU: error against fp64 (2x eager's rule) and CUDA-graph times
"""
import math
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
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LOG2E = 1.4426950408889634


@gluon.jit
def _softmax_step(s, m_i, l_i, offs_m, offs_n, qk_scale, MASK: gl.constexpr):
    """One tile's online softmax in log2 units: the new running max, P (fp32, unnormalized), alpha = the factor that
    rescales what was accumulated under the old max."""
    if MASK:
        s = gl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _load_kv(k_desc, v_desc, k_smem, v_smem, bars, row, tile, STAGES: gl.constexpr):
    stage = tile % STAGES
    bar = bars.index(stage)
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [row, 0], bar, k_smem.index(stage))
    tma.async_copy_global_to_shared(v_desc, [row, 0], bar, v_smem.index(stage))


@gluon.jit
def _step(q_smem, k_smem, v_smem, kv_bars, k_desc, v_desc, acc, p_op, m_i, l_i, s_zero, offs_m, qk_scale, j, n_tiles,
          kv_row, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, col_layout: gl.constexpr, o_layout: gl.constexpr,
          p_layout: gl.constexpr, MASK: gl.constexpr):
    # refill the stage of tile j + STAGES - 2: it held tile j - 2, whose P v every warp has waited for
    gl.thread_barrier()
    nxt = j + STAGES - 2
    if nxt < n_tiles:
        _load_kv(k_desc, v_desc, k_smem, v_smem, kv_bars, kv_row + nxt * BLOCK_N, nxt, STAGES)
    stage = j % STAGES
    mbarrier.wait(kv_bars.index(stage), (j // STAGES) & 1)
    s = warpgroup_mma(q_smem, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    acc = warpgroup_mma(p_op, v_smem.index((j - 1) % STAGES), acc, is_async=True)
    s = warpgroup_mma_wait(1, deps=(s, ))
    offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_layout)
    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, offs_m, offs_n, qk_scale, MASK)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p_op = gl.convert_layout(p.to(p_op.dtype), p_layout)
    return acc, p_op, m_i, l_i


@gluon.jit
def gluon_attn_fwd(q_desc, k_desc, v_desc, o_desc, Lse, N, qk_scale,
                   CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                   STAGES: gl.constexpr, num_warps: gl.constexpr):
    n_m = N // BLOCK_M
    pid_m = gl.program_id(0)
    if CAUSAL:  # the longest rows first
        pid_m = n_m - 1 - pid_m
    bh = gl.program_id(1)
    q_row = bh * N + pid_m * BLOCK_M
    kv_row = bh * N

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK_M, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(kv_bars.index(i), count=1)

    if CAUSAL:  # key tiles up to the diagonal; those before n_full see no masked key
        n_tiles = gl.cdiv((pid_m + 1) * BLOCK_M, BLOCK_N)
        n_full = gl.maximum((pid_m * BLOCK_M + 1) // BLOCK_N, 1)
    else:
        n_tiles = N // BLOCK_N
        n_full = n_tiles

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES - 1):
        if i < n_tiles:
            _load_kv(k_desc, v_desc, k_smem, v_smem, kv_bars, kv_row + i * BLOCK_N, i, STAGES)

    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_layout)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=row_layout)
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)

    # tile 0: q k^T, its softmax
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(kv_bars.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    offs_n = gl.arange(0, BLOCK_N, layout=col_layout)
    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, offs_m, offs_n, qk_scale, CAUSAL)  # (a harmless mask off the diagonal)
    p_op = gl.convert_layout(p.to(q_desc.dtype), p_layout)

    # tiles 1 .. n_tiles - 1: tile j's q k^T and tile j-1's P v in flight while tile j's softmax runs; the tiles
    # from n_full on cross the causal diagonal and are masked. (Tile 0 is masked whenever CAUSAL: harmless off it.)
    for j in range(1, n_full):
        acc, p_op, m_i, l_i = _step(q_smem, k_smem, v_smem, kv_bars, k_desc, v_desc, acc, p_op, m_i, l_i, s_zero, offs_m,
                                    qk_scale, j, n_tiles, kv_row, BLOCK_N, STAGES, col_layout, o_layout, p_layout, False)
    if CAUSAL:
        for j in range(n_full, n_tiles):
            acc, p_op, m_i, l_i = _step(q_smem, k_smem, v_smem, kv_bars, k_desc, v_desc, acc, p_op, m_i, l_i, s_zero,
                                        offs_m, qk_scale, j, n_tiles, kv_row, BLOCK_N, STAGES, col_layout, o_layout,
                                        p_layout, True)

    last = (n_tiles - 1) % STAGES
    acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))

    gl.thread_barrier()  # every warpgroup's last q k^T has read q's tile
    lse = (m_i + gl.log2(l_i)) / 1.4426950408889634
    gl.store(Lse + bh * N + offs_m, lse)
    out = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    q_smem.store(out.to(o_desc.dtype))  # q's tile is no longer read: the output goes out through it
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row, 0], q_smem)
    tma.store_wait(0)
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(kv_bars.index(i))


def _descriptors(q, k, v, out, block_m, block_n):
    B, H, N, D = q.shape
    descs = []
    for t, rows in ((q, block_m), (k, block_n), (v, block_n), (out, block_m)):
        flat = t.reshape(B * H * N, D)
        layout = gl.NVMMASharedLayout.get_default_for([rows, D], gl.bfloat16)
        descs.append(TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, D], layout))
    return descs


def gluon_attention(q, k, v, causal, scale, block_m=128, block_n=128, stages=3, num_warps=8):
    B, H, N, D = q.shape
    assert N % block_m == 0 and N % block_n == 0
    out = torch.empty_like(q)
    lse = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    descs = _descriptors(q, k, v, out, block_m, block_n)
    grid = (N // block_m, B * H)
    gluon_attn_fwd[grid](*descs, lse, N, scale * LOG2E, causal, block_m, block_n, D, stages, num_warps=num_warps)
    return out, lse


def compile_for_sm90(D=128, causal=True, block_m=128, block_n=128, stages=3, num_warps=8):
    """Compile without a GPU (the signature a launch would give) and run ptxas -v on the PTX."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import mangle_type
    from triton.experimental.gluon._runtime import GluonASTSource
    x = torch.empty(1, 1, 256, D, dtype=torch.bfloat16)
    descs = _descriptors(x, x, x, x, block_m, block_n)
    fn = gluon_attn_fwd
    args = dict(zip(["q_desc", "k_desc", "v_desc", "o_desc"], descs), Lse=None, N=256, qk_scale=1.0)
    signature = {name: mangle_type(a) for name, a in zip(["q_desc", "k_desc", "v_desc", "o_desc"], descs)}
    signature.update(Lse="*fp32", N="i32", qk_scale="fp32")
    consts = dict(CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_D=D, STAGES=stages, num_warps=num_warps)
    for name, value in consts.items():
        signature[name] = "constexpr"
    src = GluonASTSource(fn=fn, signature=signature, constexprs={(fn.arg_names.index(n),): v for n, v in consts.items()})
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))
    fname = os.path.join(tempfile.mkdtemp(), "k.ptx")
    open(fname, "w").write(c.asm["ptx"])
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", fname, "-o", "/dev/null"], capture_output=True, text=True)
    info = " | ".join(l.split("ptxas info    :")[-1].strip() for l in r.stderr.splitlines()
                      if "registers" in l or "spill" in l or "C75" in l)
    print(f"D{D} causal={causal} {block_m}x{block_n} stages={stages} warps={num_warps} smem {c.metadata.shared}: {info}")
    return c


def _reference(q, k, v, causal, scale, dtype):
    s = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) * scale
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v.to(dtype), torch.logsumexp(s.double(), -1)


def check(shapes, variants):
    """Output and lse against fp64, every config of every variant ({name: (attention function, {head dim: configs})});
    the rule of tests/: our error <= 2x eager bf16's + 1e-3 (output)."""
    ok = True
    for B, H, N, D, causal in shapes:
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        scale = D ** -0.5
        ref, ref_lse = _reference(q, k, v, causal, scale, torch.float64)
        eager, _ = _reference(q, k, v, causal, scale, torch.bfloat16)
        eager_err = (eager.double() - ref).abs().max().item()
        for name, (attention, configs) in variants.items():
            for cfg in configs[D]:
                out, lse = attention(q, k, v, causal, scale, *cfg)
                err = (out.double() - ref).abs().max().item()
                lse_err = (lse.double() - ref_lse).abs().max().item()
                good = err <= 2 * eager_err + 1e-3 and lse_err <= 1e-3
                ok &= good
                print(f"check B{B} H{H} N{N} D{D} causal={causal} {name} {cfg}: out err {err:.2e} (eager bf16 "
                      f"{eager_err:.2e}), lse err {lse_err:.2e}: {'PASS' if good else 'FAIL'}", flush=True)
    return ok


def bench(shapes, variants):
    """GPU time per call (CUDA-graph replay, ms): every config of every variant, our generated forward
    (FUSE_ATTN_CANDIDATES=triton), SDPA cuDNN."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from fuse_attn.kernels import flash_attention
    from fuse_attn.spec import AttentionSpec, CausalMask
    from triton.testing import do_bench_cudagraph
    for B, H, N, D, causal in shapes:
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        scale = D ** -0.5
        spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=scale,
                             causal=CausalMask() if causal else None)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        fns = {f"{name} {cfg}": (lambda attention=attention, cfg=cfg: attention(q, k, v, causal, scale, *cfg))
               for name, (attention, configs) in variants.items() for cfg in configs[D]}
        fns.update({"template": lambda: flash_attention(q, k, v, spec, []), "cuDNN": cudnn})
        ms = {}
        for name, fn in fns.items():
            fn()
            torch.cuda.synchronize()
            ms[name] = do_bench_cudagraph(fn, rep=200)
        flops = 4 * B * H * N * N * D / (2 if causal else 1)
        shape = f"B{B} H{H} N{N} D{D} {'causal' if causal else 'full'}"
        for name, t in ms.items():
            print(f"{shape:<26} {name:<40} {t:8.3f} ms {flops / t / 1e9:6.0f} TF/s {ms['cuDNN'] / t:6.2f}x cuDNN",
                  flush=True)


# (BLOCK_M, BLOCK_N, STAGES, num_warps): one or two warpgroups a CTA; shared memory = q's tile + STAGES k and v tiles
CONFIGS = {64: [(128, 128, 3, 8), (64, 128, 3, 4), (64, 64, 4, 4)],
           128: [(128, 128, 3, 8), (64, 64, 3, 4), (128, 64, 4, 8)]}

SHAPES = [(B, 16, N, D, causal) for D in (64, 128) for causal in (False, True)
          for B, N in ((16, 1024), (4, 4096), (1, 16384))]

VARIANTS = {"gluon": (gluon_attention, CONFIGS)}
SMALL = [(2, 3, N, D, causal) for N in (128, 384, 1024) for D in (64, 128) for causal in (False, True)]


def main(variants):
    if "check" in sys.argv[1:]:
        print("all checks PASS" if check(SMALL + [(4, 16, 4096, 128, True)], variants) else "CHECK FAILED", flush=True)
    if "bench" in sys.argv[1:]:
        bench(SHAPES, variants)


if __name__ == "__main__":
    if "compile" in sys.argv[1:]:
        for D in (64, 128):
            for causal in (False, True):
                for cfg in CONFIGS[D]:
                    compile_for_sm90(D, causal, *cfg)
    main(VARIANTS)
