"""A forward CTA's fixed cost (its start and end: q's load, an empty k / v ring, the output's store) against its cost a
key tile, per config: the Gluon forward one block a CTA (no pairing, no persistent grid), unmasked, B * N = 16384
rows... at N 512-8192, H16, bf16, CUDA-graph GPU time. A CTA meets N / BLOCK_N key tiles; with C CTAs on S SMs at
r CTAs an SM the time is about ceil(C / (S r)) waves of (fixed + tiles x per_tile): a least-squares fit of
(fixed, per_tile) over the lengths, and the fixed share at N1024. Run from the repository root on an H100/H200."""
import numpy as np
import torch
import triton
from triton.testing import do_bench_cudagraph

from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec

RULE = hf.runs_persistent
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("D,N,config,ctas,waves,tiles_a_cta,ms", flush=True)
sms = torch.cuda.get_device_properties(0).multi_processor_count
hf.runs_persistent = lambda *a: False
try:
    for D in (64, 128):
        rows = []
        for N in (512, 1024, 2048, 4096, 8192):
            B = 16384 // N
            spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5)
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            block_m, block_n, stages, consumers = hf.forward_config(D, False, N)
            ctas = B * 16 * triton.cdiv(N, block_m * consumers)
            waves = triton.cdiv(ctas, sms * hf.resident_ctas(D, consumers))
            tiles = triton.cdiv(N, block_n)
            ms = do_bench_cudagraph(lambda: hf.hopper_forward(q, k, v, spec), rep=200)
            rows.append((waves, tiles, ms))
            print(f"{D},{N},\"{(block_m, block_n, stages, consumers)}\",{ctas},{waves},{tiles},{ms:.4f}", flush=True)
        a = np.array([[w, w * t] for w, t, _ in rows], dtype=float)
        (fixed, per_tile), *_ = np.linalg.lstsq(a, np.array([r[2] for r in rows]) * 1e3, rcond=None)
        print(f"D{D}: a CTA's wave {fixed:.2f} us fixed + {per_tile:.3f} us a key tile; at N1024 "
              f"({triton.cdiv(1024, hf.forward_config(D, False, 1024)[1])} tiles) the fixed part is "
              f"{fixed / (fixed + per_tile * triton.cdiv(1024, hf.forward_config(D, False, 1024)[1])):.0%}", flush=True)
finally:
    hf.runs_persistent = RULE
