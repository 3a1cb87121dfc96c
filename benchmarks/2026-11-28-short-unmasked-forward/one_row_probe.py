"""Which of a query length or a key length of 1 makes Triton 3.6 fail to lower the persistent Gluon forward
(call3.log: ConvertTritonGPUToLLVM's assertion at M = N = 1): the persistent grid forced at D128 unmasked, Z64 H4,
each shape compiled and checked against fp64. Run from the repository root on an H100/H200."""
import torch
from fuse_attn.kernels import hopper_forward as hf, reference_attention
from fuse_attn.spec import AttentionSpec

hf.runs_persistent = lambda *args: True
spec = AttentionSpec(dtype="bfloat16", head_dim=128, head_dim_v=128, scale=128 ** -0.5)
for M, N in ((1, 1), (1, 17), (17, 1), (2, 2), (17, 17)):
    q = torch.randn(64, 4, M, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(64, 4, N, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    try:
        out, _ = hf.hopper_forward(q, k, v, spec)
        ref, _ = reference_attention(q.double(), k.double(), v.double(), [], spec)
        print(f"M{M} N{N}: ran, max |out - fp64| {(out.double() - ref).abs().max().item():.2e}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"M{M} N{N}: {type(e).__name__}: {str(e).splitlines()[0][:150]}", flush=True)
