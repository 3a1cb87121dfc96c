"""Does TMA (host TensorDescriptor) help a Triton flash forward on this GPU? Causal, bf16, B4 H16 N4096 D128.
Two otherwise identical kernels: pointer loads vs descriptor loads; plus fuse_attn's forward and SDPA cuDNN."""
import torch, triton, triton.language as tl, itertools, sys
from triton.tools.tensor_descriptor import TensorDescriptor

@triton.jit
def _inner(acc, l, m, q, k_src, v_src, row0, lo, hi, offs_m, qk_scale, stride_n, offs_d,
           BLOCK_N: tl.constexpr, D: tl.constexpr, DIAG: tl.constexpr, TMA: tl.constexpr):
    offs_n0 = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        if TMA:
            k = k_src.load([row0 + start, 0])
            v = v_src.load([row0 + start, 0])
        else:
            k = tl.load(k_src + (start + offs_n0)[:, None] * stride_n + offs_d[None, :])
            v = tl.load(v_src + (start + offs_n0)[:, None] * stride_n + offs_d[None, :])
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if DIAG:
            s = tl.where(offs_m[:, None] >= (start + offs_n0)[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m = m_new
    return acc, l, m

@triton.jit
def fwd(Q, K, V, O, qd, kd, vd, od, N, qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    row0 = bh * N
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    if TMA:
        q = qd.load([row0 + start_m, 0])
        k_src, v_src = kd, vd
    else:
        q = tl.load(Q + (row0 + offs_m)[:, None] * D + offs_d[None, :])
        k_src, v_src = K + row0 * D, V + row0 * D
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    acc, l, m = _inner(acc, l, m, q, k_src, v_src, row0, 0, start_m, offs_m, qk_scale, D, offs_d, BLOCK_N, D, False, TMA)
    acc, l, m = _inner(acc, l, m, q, k_src, v_src, row0, start_m, start_m + BLOCK_M, offs_m, qk_scale, D, offs_d, BLOCK_N, D, True, TMA)
    out = (acc / l[:, None]).to(tl.bfloat16)
    if TMA:
        od.store([row0 + start_m, 0], out)
    else:
        tl.store(O + (row0 + offs_m)[:, None] * D + offs_d[None, :], out)

B, H, N, D = 4, 16, 4096, 128
torch.manual_seed(0)
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
o = torch.empty_like(q)
ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
scale = D ** -0.5 * 1.4426950408889634
rows = []
for tma in (False, True):
    best = None
    for bm, bn, w, s in itertools.product((128,), (64, 128), (8,), (2, 3, 4)):
        if bn > bm: continue
        descs = [TensorDescriptor.from_tensor(t.view(B * H * N, D), [bm if i in (0, 3) else bn, D]) for i, t in enumerate((q, k, v, o))] if tma else [q] * 4
        grid = (N // bm, B * H)
        try:
            run = lambda: fwd[grid](q, k, v, o, *descs, N, scale, BLOCK_M=bm, BLOCK_N=bn, D=D, TMA=tma, num_warps=w, num_stages=s)
            run(); torch.cuda.synchronize()
            err = (o.float() - ref.float()).abs().max().item()
            ms = triton.testing.do_bench(run, rep=200)
        except Exception as e:
            print("fail", tma, bm, bn, w, s, type(e).__name__, str(e)[:200]); continue
        print(f"tma={tma} {bm}x{bn} w{w} s{s}: {ms:.3f} ms err {err:.3g}", flush=True)
        if best is None or ms < best[0]: best = (ms, bm, bn, w, s)
    rows.append((tma, best))
from torch.nn.attention import sdpa_kernel, SDPBackend
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    cud = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), rep=200)
import fuse_attn
from fuse_attn.spec import AttentionSpec, CausalMask
from fuse_attn.kernels import flash_attention
spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask())
flash_attention(q, k, v, spec)
ours = triton.testing.do_bench(lambda: flash_attention(q, k, v, spec), rep=200)
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
for tma, best in rows: print("pointer" if not tma else "TMA", best)
print(f"cuDNN {cud:.3f} ms, fuse_attn forward (eager op call) {ours:.3f} ms")
