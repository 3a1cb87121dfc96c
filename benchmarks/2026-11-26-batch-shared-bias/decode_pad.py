# Split-K decode with a left-padded KV cache (HF generate with a padded batch): the fused op's time per step.
import torch, triton, triton.testing, fuse_attn, sys
from fuse_attn.backend import fuse_attn_backend  # noqa: F401  (registers the backend)
torch.manual_seed(0)
dev = "cuda"
H, HKV, D = 32, 8, 128

def step(q, k, v, mask):
    k = k[:, :, None].expand(-1, -1, H // HKV, -1, -1).reshape(q.shape[0], H, -1, D)
    v = v[:, :, None].expand(-1, -1, H // HKV, -1, -1).reshape(q.shape[0], H, -1, D)
    s = q @ k.transpose(-2, -1) * D ** -0.5 + mask
    return torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype) @ v

f = torch.compile(step, backend="fuse_attn", dynamic=False)
print("package:", fuse_attn.__file__)
for B, L in ((8, 8192), (8, 32768), (32, 4096)):
    q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, HKV, L, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, HKV, L, D, device=dev, dtype=torch.bfloat16)
    for name, lengths in (("full", [L] * B), ("left-padded L..L/4", [L - (L * 3 // 4) * i // (B - 1) for i in range(B)])):
        am = torch.zeros(B, L, device=dev)
        for b, n in enumerate(lengths):
            am[b, L - n:] = 1
        mask = (1.0 - am[:, None, None, :]).to(torch.bfloat16) * torch.finfo(torch.bfloat16).min
        out = f(q, k, v, mask)
        ref = step(q.double(), k.double(), v.double(), mask.double())
        err = (out.double() - ref).abs().max().item()
        ms = triton.testing.do_bench(lambda: f(q, k, v, mask), warmup=25, rep=200, return_mode="median")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            f(q, k, v, mask); torch.cuda.synchronize()
        kernels = sorted({e.name[:20] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
        gb = sum(lengths) * HKV * D * 2 * 2 / 1e9
        print(f"B{B} L{L} {name}: {ms * 1e3:.1f} us, keys kept {sum(lengths) / (B * L):.2f}, {gb / (ms / 1e3):.0f} GB/s of kept K/V, max err {err:.2e}, kernels {kernels}", flush=True)
