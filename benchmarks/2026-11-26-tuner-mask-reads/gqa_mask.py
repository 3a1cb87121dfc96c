"""Per-kernel GPU time of a compiled fwd+bwd whose causal mask is passed in as a tensor (as the graphs that DDP splits a
LLaMA-shaped model into get it): B4 H16 N2048 D64 bf16, GQA 4 and none, tile summaries on and off. python3 gqa_mask.py"""
import os, sys, torch, triton
from torch.profiler import profile, ProfilerActivity
import fuse_attn  # noqa: F401
import logging; logging.basicConfig(level=logging.WARNING); logging.getLogger("fuse_attn.kernels.autotune").setLevel(logging.INFO)
os.environ["FUSE_ATTN_CANDIDATES"] = "triton"
B, H, N, D = 4, 16, 2048, 64
dt = torch.bfloat16

def make(hkv):
    def attn(q, k, v, mask):
        g = H // hkv
        k = k[:, :, None].expand(B, hkv, g, N, D).reshape(B, H, N, D)
        v = v[:, :, None].expand(B, hkv, g, N, D).reshape(B, H, N, D)
        s = torch.matmul(q, k.transpose(2, 3)) * D ** -0.5 + mask
        p = torch.softmax(s, dim=-1, dtype=torch.float32).to(dt)
        return torch.matmul(p, v)
    return attn

mask = torch.full((N, N), torch.finfo(dt).min, device="cuda", dtype=dt).triu(1)[None, None].expand(B, 1, N, N).contiguous()
for hkv in (4, 16):
    for blocks in ("1", "0"):
        os.environ["FUSE_ATTN_MASK_BLOCKS"] = blocks
        torch._dynamo.reset()
        q = torch.randn(B, H, N, D, device="cuda", dtype=dt, requires_grad=True)
        k, v = (torch.randn(B, hkv, N, D, device="cuda", dtype=dt, requires_grad=True) for _ in range(2))
        do = torch.randn(B, H, N, D, device="cuda", dtype=dt)
        f = torch.compile(make(hkv), backend="fuse_attn")
        step = lambda: torch.autograd.grad(f(q, k, v, mask), (q, k, v), do)
        step(); step(); torch.cuda.synchronize()
        ms = triton.testing.do_bench(step, rep=200)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5): step()
            torch.cuda.synchronize()
        rows = sorted(((e.key, e.device_time_total / e.count, e.count) for e in prof.key_averages() if e.device_time_total > 0), key=lambda r: -r[1] * r[2])
        print(f"kv heads {hkv} mask blocks {blocks}: fwd+bwd {ms:.3f} ms; " + "; ".join(f"{k[:28]} {t:.0f}us x{c//5}" for k, t, c in rows[:7]), flush=True)
