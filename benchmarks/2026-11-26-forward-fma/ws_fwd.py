"""Does Triton 3.6's Hopper warp specialization (tl.range(..., warp_specialize=True)) speed up a flash forward?
Minimal causal forward, bf16, B4 H16 N4096, D128 and D64. Variants: pointer loads; device-side tensor descriptors
(tl.make_tensor_descriptor); descriptors + warp specialization; pointers + warp specialization. Against SDPA cuDNN
and fuse_attn's generated forward."""
import torch, triton, triton.language as tl, itertools, sys, time

triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))

@triton.jit
def _inner(acc, l, m, q, k_src, v_src, row0, lo, hi, offs_m, qk_scale, offs_d,
           BLOCK_N: tl.constexpr, D: tl.constexpr, DIAG: tl.constexpr, DESC: tl.constexpr, WS: tl.constexpr):
    offs_n0 = tl.arange(0, BLOCK_N)
    for start in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        if DESC:
            k = k_src.load([row0 + start, 0])
            v = v_src.load([row0 + start, 0])
        else:
            k = tl.load(k_src + (start + offs_n0)[:, None] * D + offs_d[None, :])
            v = tl.load(v_src + (start + offs_n0)[:, None] * D + offs_d[None, :])
        s = tl.dot(q, tl.trans(k))
        if DIAG:
            s = s * qk_scale + tl.where(offs_m[:, None] >= (start + offs_n0)[None, :], 0.0, -1.0e6)
            m_new = tl.maximum(m, tl.max(s, 1))
            s -= m_new[:, None]
        else:
            m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
            s = s * qk_scale - m_new[:, None]
        p = tl.math.exp2(s)
        alpha = tl.math.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(tl.bfloat16), v, acc)
        m = m_new
    return acc, l, m

@triton.jit
def fwd(Q, K, V, O, N, ROWS, qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
        CAUSAL: tl.constexpr, DESC: tl.constexpr, WS: tl.constexpr):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    row0 = bh * N
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    if DESC:
        qd = tl.make_tensor_descriptor(Q, shape=[ROWS, D], strides=[D, 1], block_shape=[BLOCK_M, D])
        kd = tl.make_tensor_descriptor(K, shape=[ROWS, D], strides=[D, 1], block_shape=[BLOCK_N, D])
        vd = tl.make_tensor_descriptor(V, shape=[ROWS, D], strides=[D, 1], block_shape=[BLOCK_N, D])
        q = qd.load([row0 + start_m, 0])
        k_src, v_src = kd, vd
    else:
        q = tl.load(Q + (row0 + offs_m)[:, None] * D + offs_d[None, :])
        k_src, v_src = K + row0 * D, V + row0 * D
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32) + 1.0
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    hi = start_m if CAUSAL else N
    acc, l, m = _inner(acc, l, m, q, k_src, v_src, row0, 0, hi, offs_m, qk_scale, offs_d, BLOCK_N, D, False, DESC, WS)
    if CAUSAL:
        acc, l, m = _inner(acc, l, m, q, k_src, v_src, row0, start_m, start_m + BLOCK_M, offs_m, qk_scale, offs_d, BLOCK_N, D, True, DESC, WS)
    out = (acc / l[:, None]).to(tl.bfloat16)
    if DESC:
        od = tl.make_tensor_descriptor(O, shape=[ROWS, D], strides=[D, 1], block_shape=[BLOCK_M, D])
        od.store([row0 + start_m, 0], out)
    else:
        tl.store(O + (row0 + offs_m)[:, None] * D + offs_d[None, :], out)

from torch.nn.attention import sdpa_kernel, SDPBackend
import fuse_attn
from fuse_attn.spec import AttentionSpec, CausalMask
from fuse_attn.kernels import flash_attention
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
table = []
for B, H, N, D, causal in [(4, 16, 4096, 128, True), (4, 16, 4096, 128, False), (4, 16, 4096, 64, True)]:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    scale = D ** -0.5 * 1.4426950408889634
    row = {"shape": f"B{B} H{H} N{N} D{D} {'causal' if causal else 'full'}"}
    for name, desc, ws in [("pointer", False, False), ("descriptor", True, False), ("descriptor+ws", True, True), ("pointer+ws", False, True)]:
        best = None
        for bn, w, s in itertools.product((64, 128), (4, 8), (2, 3)):
            bm = 128
            grid = (N // bm, B * H)
            run = lambda: fwd[grid](q, k, v, o, N, B * H * N, scale, BLOCK_M=bm, BLOCK_N=bn, D=D, CAUSAL=causal,
                                    DESC=desc, WS=ws, num_warps=w, num_stages=s)
            try:
                t0 = time.time(); run(); torch.cuda.synchronize(); ct = time.time() - t0
                err = (o.float() - ref.float()).abs().max().item()
                if err > 0.05:
                    print(f"  {name} {bm}x{bn} w{w} s{s}: WRONG err {err:.3g}"); continue
                ms = triton.testing.do_bench(run, rep=100)
            except Exception as e:
                print(f"  {name} {bm}x{bn} w{w} s{s}: fail {type(e).__name__} {str(e)[:160]}"); continue
            print(f"  {row['shape']} {name} {bm}x{bn} w{w} s{s}: {ms:.3f} ms (compile {ct:.1f}s)", flush=True)
            if best is None or ms < best[0]: best = (ms, f"{bm}x{bn} w{w} s{s}")
        row[name] = best
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        row["cuDNN"] = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal), rep=100)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        row["FA2"] = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal), rep=100)
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask() if causal else None)
    flash_attention(q, k, v, spec)
    row["fuse_attn"] = triton.testing.do_bench(lambda: flash_attention(q, k, v, spec), rep=100)
    table.append(row)
    print(row, flush=True)
print("\nSUMMARY")
for row in table:
    print(row)
