"""Our Gluon launchers' own Python, without Triton's launch: hopper_forward() and hopper_backward() with every kernel
launch stubbed, on CPU tensors of B1 H16 N1024 D64 causal (the rules see 132 SMs, as on an H100 / H200), 2000 calls
each; the backward's CPU allocations (delta, the 4 MB fp32 dQ accumulator zeroed, dk, dv, dq) stand in for the
GPU's. Run from the repository root on a machine without a GPU:  python launcher_python.py"""
import os
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
from fuse_attn.kernels import hopper_backward as hb  # noqa: E402
from fuse_attn.kernels import hopper_forward as hf  # noqa: E402
from fuse_attn.spec import AttentionSpec, CausalMask  # noqa: E402


class Stub:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def per_call_us(fn, calls=2000):
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


for module, names in ((hf, ["_hopper_attn_fwd"]), (hb, ["_hopper_attn_bwd", "_delta_kernel", "_dq_cast_kernel"])):
    for name in names:
        setattr(module, name, Stub())
hf.sm_count = lambda device: 132
D = 64
spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask())
q, k, v, dout, out = (torch.randn(1, 16, 1024, D, dtype=torch.bfloat16) for _ in range(5))
lse = torch.randn(1, 16, 1024)
print(f"torch {torch.__version__}, host us a call, kernel launches stubbed:")
print(f"  hopper_forward()  {per_call_us(lambda: hf.hopper_forward(q, k, v, spec)):.1f}")
print(f"  hopper_backward() {per_call_us(lambda: hb.hopper_backward(dout, q, k, v, out, lse, spec)):.1f}")
print(f"  4 x TMA descriptor {per_call_us(lambda: [hf._descriptor(t, 64) for t in (q, k, v, out)]):.1f}")
