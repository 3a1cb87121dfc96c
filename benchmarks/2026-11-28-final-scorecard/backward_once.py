"""Three Gluon backwards of plain attention, B4 H16 N4096, bf16 (D from argv[1], default 128; argv[2] "causal" for the
causal mask), for Nsight Compute to profile the last: ``ncu -k regex:_hopper_attn_bwd --launch-skip 2 --launch-count 1
python3 backward_once.py 128``. Run from the repository root on an H100/H200."""
import sys

import torch

from fuse_attn.kernels import hopper_backward as hb
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

D = int(sys.argv[1]) if len(sys.argv) > 1 else 128
causal = sys.argv[2:] == ["causal"]
spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask() if causal else None)
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, dout = (torch.randn(4, 16, 4096, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
out, lse = hf.hopper_forward(q, k, v, spec)
for _ in range(3):
    hb.hopper_backward(dout, q, k, v, out, lse, spec)
torch.cuda.synchronize()
print("done", flush=True)
