"""Where the Gluon op's host time goes: cProfile of eager forward + backward calls (B16 H16 N1024 D64, bf16, causal),
the top functions by own time, and the wall time per call of each op alone.

    python3 host_profile.py       (on an sm90 GPU)
"""
import cProfile
import pstats

import torch
from triton.testing import do_bench

from fuse_attn.kernels.hopper_forward import flash_attention_hopper
from fuse_attn.spec import AttentionSpec, CausalMask

spec = AttentionSpec(dtype="bfloat16", head_dim=64, head_dim_v=64, scale=0.125, causal=CausalMask())
text = spec.to_json()
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, dout = (torch.randn(16, 16, 1024, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
leaves = [t.detach().requires_grad_() for t in (q, k, v)]
out, lse = torch.ops.fuse_attn.flash_attention_hopper(q, k, v, text)


def step():
    torch.autograd.grad(flash_attention_hopper(*leaves, spec), leaves, dout)


fwd = lambda: torch.ops.fuse_attn.flash_attention_hopper(q, k, v, text)  # noqa: E731
bwd = lambda: torch.ops.fuse_attn.flash_attention_hopper_backward(dout, q, k, v, out, lse, text)  # noqa: E731
for name, fn in (("fwd op", fwd), ("bwd op", bwd), ("fwd+bwd (autograd)", step)):
    fn()
    torch.cuda.synchronize()
    print(f"{name}: wall {do_bench(fn, warmup=25, rep=200):.4f} ms a call", flush=True)

step()
torch.cuda.synchronize()
prof = cProfile.Profile()
prof.enable()
for _ in range(200):
    step()
prof.disable()
torch.cuda.synchronize()
pstats.Stats(prof).sort_stats("tottime").print_stats(25)
