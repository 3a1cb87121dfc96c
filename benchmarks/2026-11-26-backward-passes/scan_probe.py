"""GPU time of our dK/dV and dQ kernels (captured launches, tuned configs) on causal, window and GQA shapes."""
import torch, triton, fuse_attn
from fuse_attn.kernels import flash_attention, launch
from fuse_attn.spec import AttentionSpec, CausalMask
print(fuse_attn.__file__, torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
bench = lambda f: triton.testing.do_bench(f, warmup=30, rep=200)
for B, H, HKV, N, D, window in [(4, 16, 16, 4096, 128, None), (4, 16, 16, 4096, 128, 1024), (2, 32, 8, 4096, 128, None),
                                (4, 16, 16, 4096, 64, 1024), (8, 16, 16, 2048, 64, 256)]:
    torch.manual_seed(0)
    q = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn_like(q)
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask(window=window),
                         gqa_group=H // HKV)
    out = flash_attention(q, k, v, spec); out.backward(do)
    # against fp32 eager (GQA: kv heads repeated), as a sanity check that both packages agree
    qf, kf, vf = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    ke, ve = (t.repeat_interleave(H // HKV, 1) for t in (kf, vf))
    s = (qf @ ke.transpose(-1, -2)) * D ** -0.5
    i, j = torch.arange(N, device="cuda")[:, None], torch.arange(N, device="cuda")[None, :]
    vis = (j <= i) & ((j > i - window) if window else True)
    ref = torch.softmax(s.masked_fill(~vis, float("-inf")), -1) @ ve
    ref.backward(do.float())
    err = " ".join(f"{n} {(a.grad.float() - b.grad).abs().max().item():.3e}" for n, a, b in zip("qkv", (q, k, v), (qf, kf, vf)))
    print(f"  out {(out.float() - ref).abs().max().item():.3e} {err}", flush=True)
    del s, ref, qf, kf, vf, ke, ve
    for t in (q, k, v): t.grad = None
    rec, orig = [], launch.launch
    launch.launch = lambda kern, grid, args, cfg=None, warmup=False: (rec.append((kern, grid, args, cfg)), orig(kern, grid, args, cfg, warmup))[1]
    out = flash_attention(q, k, v, spec); rec.clear(); out.backward(do); torch.cuda.synchronize()
    launch.launch = orig
    by = {kern.fn.__name__: (kern, grid, args, cfg) for kern, grid, args, cfg in rec}
    t = {n: bench(lambda: orig(*by[n])) for n in ("_attn_bwd_dkdv", "_attn_bwd_dq")}
    # the dK/dV kernel at one fixed config too, so the variants compare the same tiling
    fixed = by["_attn_bwd_dkdv"]
    from fuse_attn.kernels import autotune
    cfg = autotune.KernelConfig(64, 128, 8, 3 if D <= 128 else 2)
    args = dict(fixed[2], BLOCK_M=64, BLOCK_N=128)
    grid = (triton.cdiv(N, 128) * B * HKV,)
    t_fixed = bench(lambda: orig(fixed[0], grid, args, cfg))
    print(f"B{B} H{H}/{HKV} N{N} D{D} window={window}: dkdv {t['_attn_bwd_dkdv']*1e3:.1f} us ({fixed[3]}), "
          f"dkdv at 64x128/8/3 {t_fixed*1e3:.1f} us, dq {t['_attn_bwd_dq']*1e3:.1f} us", flush=True)
