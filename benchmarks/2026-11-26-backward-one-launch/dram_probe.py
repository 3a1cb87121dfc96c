"""DRAM bytes of ours and FlexAttention's backward kernels (run under ncu --profile-from-start off): window 1024
and causal, B4 H16 N4096 D128 bf16. Tuning and compiles happen before the profiled range."""
import sys
import torch
from torch.nn.attention.flex_attention import flex_attention
from fuse_attn.kernels import flash_attention
from probe_common import causal_case
flex_c = torch.compile(flex_attention)
B, H, N, D = 4, 16, 4096, 128
window = int(sys.argv[1]) if len(sys.argv) > 1 else None
q, k, v, do, spec, bm = causal_case(B, H, N, D, window)
steps = [lambda: flash_attention(q, k, v, spec).backward(do), lambda: flex_c(q, k, v, block_mask=bm).backward(do)]
for s in steps:
    s(); s()
torch.cuda.synchronize()
torch.cuda.profiler.start()
for s in steps:
    s()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
