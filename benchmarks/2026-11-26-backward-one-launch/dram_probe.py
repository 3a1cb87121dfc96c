"""DRAM bytes of ours and FlexAttention's backward kernels (run under ncu --profile-from-start off): window 1024
and causal, B4 H16 N4096 D128 bf16. Tuning and compiles happen before the profiled range."""
import sys
import torch
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
from fuse_attn.kernels import flash_attention
from fuse_attn.spec import AttentionSpec, CausalMask
flex_c = torch.compile(flex_attention)
B, H, N, D = 4, 16, 4096, 128
window = int(sys.argv[1]) if len(sys.argv) > 1 else None
torch.manual_seed(0)
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
do = torch.randn_like(q)
spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask(window=window))
w = window or N + 1
bm = create_block_mask(lambda b, h, m, n: (m >= n) & (m - n < w), None, None, N, N)
steps = [lambda: flash_attention(q, k, v, spec).backward(do), lambda: flex_c(q, k, v, block_mask=bm).backward(do)]
for s in steps:
    s(); s()
torch.cuda.synchronize()
torch.cuda.profiler.start()
for s in steps:
    s()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
