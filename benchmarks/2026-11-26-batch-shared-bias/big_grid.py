# Batch rows x heads past CUDA's 65535 second grid dimension: the compiled attention (generated kernels only)
# against eager bf16 and an fp64 reference, forward and gradients; and a decode step with batch x kv heads past it.
import os, sys, torch, fuse_attn
os.environ["FUSE_ATTN_CANDIDATES"] = "triton"
print("package:", fuse_attn.__file__, flush=True)

def attn(q, k, v):
    Z, H, M, D = q.shape
    G = H // k.shape[1]
    k = k[:, :, None].expand(-1, -1, G, -1, -1).reshape(Z, H, -1, D)
    v = v[:, :, None].expand(-1, -1, G, -1, -1).reshape(Z, H, -1, D)
    s = q @ k.transpose(-2, -1) * D ** -0.5
    if M > 1:
        s = s.masked_fill(torch.ones(M, k.shape[2], dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype) @ v

def err(a, r):
    return (a.double() - r).abs().max().item()

for Z, H, HKV, M, N in ((4400, 16, 16, 16, 16), (9000, 32, 8, 1, 64)):
    torch.manual_seed(0)
    train = M > 1
    base = [torch.randn(Z, h, n, 64, device="cuda") for h, n in ((H, M), (HKV, N), (HKV, N))]
    runs = {}
    for name, fn, dt in (("ours", torch.compile(attn, backend="fuse_attn"), torch.bfloat16), ("eager", attn, torch.bfloat16),
                         ("ref", attn, torch.float64)):
        xs = [x.to(dt).requires_grad_(train) for x in base]
        try:
            out = fn(*xs)
            grads = torch.autograd.grad(out, xs, torch.ones_like(out)) if train else []
            torch.cuda.synchronize()
            runs[name] = [out] + list(grads)
        except Exception as e:
            print(f"Z{Z} H{H}/{HKV} M{M} N{N} {name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
            break
    if len(runs) == 3:
        parts = ["out"] + (["dq", "dk", "dv"] if train else [])
        line = ", ".join(f"{p} {err(o, r):.2e}/{err(e, r):.2e}" for p, o, e, r in zip(parts, runs["ours"], runs["eager"], runs["ref"]))
        ok = all(err(o, r) <= 2 * err(e, r) + 1e-3 for o, e, r in zip(runs["ours"], runs["eager"], runs["ref"]))
        print(f"Z{Z} H{H}/{HKV} M{M} N{N} (Z*H_kv {Z * HKV}): {'PASS' if ok else 'FAIL'} ours/eager error {line}", flush=True)
