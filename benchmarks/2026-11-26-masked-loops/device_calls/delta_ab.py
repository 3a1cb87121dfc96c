"""A/B of the backward's delta: fwd and fwd+bwd (do_bench) and per-kernel GPU time (profiler, 5 calls) of the op
called directly, on plain / window / GQA specs. Run with the package on the path (new) or via run_old.py (old)."""
import sys
import torch, triton
from torch.profiler import profile, ProfilerActivity
from tabulate import tabulate
from fuse_attn.kernels import flash_attention
from fuse_attn.spec import AttentionSpec, CausalMask
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
bench = lambda f: triton.testing.do_bench(f, warmup=50, rep=300)
CASES = [("window128 D128", 4, 16, 16, 4096, 128, CausalMask(window=128)),
         ("window512 D128", 4, 16, 16, 4096, 128, CausalMask(window=512)),
         ("causal D128", 4, 16, 16, 4096, 128, CausalMask()),
         ("full D128", 4, 16, 16, 4096, 128, None),
         ("causal D64", 4, 16, 16, 4096, 64, CausalMask()),
         ("window1024 D128", 4, 16, 16, 4096, 128, CausalMask(window=1024)),
         ("GQA 32/8 causal D128", 2, 32, 8, 4096, 128, CausalMask()),
         ("causal D128 N1024", 16, 16, 16, 1024, 128, CausalMask()),
         ("full D64 N512 B32 H12", 32, 12, 12, 512, 64, None),
         ("causal D64 N1024 B8 H12", 8, 12, 12, 1024, 64, CausalMask())]
rows = []
only = sys.argv[1:]  # case names to run (default: all)
for name, B, H, Hk, N, D, causal in CASES:
    if only and name not in only:
        continue
    torch.manual_seed(0)
    q = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(B, Hk, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn_like(q)
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=causal, gqa_group=H // Hk)
    step = lambda: flash_attention(q, k, v, spec).backward(do)
    step(); torch.cuda.synchronize()
    f = bench(lambda: flash_attention(q, k, v, spec))
    fb = bench(step)
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    kern = {e.key: e.device_time_total / 5 for e in p.key_averages() if e.device_time_total > 0 and e.key.startswith("_attn")}
    rows.append([name, f"{f:.3f}", f"{fb:.3f}", f"{fb - f:.3f}"] + [f"{kern.get(k, 0):.1f}" for k in
                ("_attn_bwd_preprocess", "_attn_bwd_dq", "_attn_bwd_dkdv", "_attn_bwd")])
    print(rows[-1], flush=True)
print(tabulate(rows, headers=["case (bf16)", "fwd ms", "fwd+bwd ms", "bwd ms", "pre us", "dQ us", "dK/dV us", "one launch us"]))
