"""The Gluon ops' host time per call (the forward's, the backward's piece by piece), at a shape whose GPU work is negligible (B1 H2 N128 D64,
causal): each piece run 500 times back to back, host time per call (perf_counter; the queue never fills).

    python3 host_breakdown.py       (on an sm90 GPU)
"""
import time

import torch

from fuse_attn.kernels import hopper_backward as hb
from fuse_attn.kernels import ops
from fuse_attn.kernels.hopper_forward import _descriptor, _tma_ready, hopper_forward, hopper_reasons
from fuse_attn.spec import AttentionSpec, CausalMask

spec = AttentionSpec(dtype="bfloat16", head_dim=64, head_dim_v=64, scale=0.125, causal=CausalMask())
text = spec.to_json()
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, dout = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
out, lse = hopper_forward(q, k, v, spec)
Z, H, M, D = q.shape
block_m, block_n, stages = hb._CONFIGS[D]
delta = torch.empty(Z, H, M, dtype=torch.float32, device="cuda")
dq_acc = torch.zeros(Z, H, M, D, dtype=torch.float32, device="cuda")
dk, dv, dq = torch.empty_like(k), torch.empty_like(v), torch.empty_like(q)
descs = [_descriptor(t, r) for t, r in ((q, block_m), (k, block_n), (v, block_n), (dout, block_m), (dk, block_n),
                                        (dv, block_n))]


def per_call_us(fn, n=500):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


pieces = {
    "forward op (torch.ops.fuse_attn.flash_attention_hopper)":
        lambda: torch.ops.fuse_attn.flash_attention_hopper(q, k, v, text),
    "hopper_forward() (its launcher, no op dispatch)": lambda: hopper_forward(q, k, v, spec),
    "op (torch.ops.fuse_attn.flash_attention_hopper_backward)":
        lambda: torch.ops.fuse_attn.flash_attention_hopper_backward(dout, q, k, v, out, lse, text),
    "hopper_backward() (the launcher, no op dispatch)":
        lambda: hb.hopper_backward(dout, q, k, v, out, lse, 0.125, True, 1),
    "parse_spec + validate + hopper_reasons": lambda: (ops.validate(q, k, v, [], ops.parse_spec(text)),
                                                        hopper_reasons(spec, q, k)),
    "4 x _tma_ready": lambda: [_tma_ready(t) for t in (q, k, v, dout)],
    "6 x TensorDescriptor": lambda: [_descriptor(t, r) for t, r in ((q, block_m), (k, block_n), (v, block_n),
                                                                     (dout, block_m), (dk, block_n), (dv, block_n))],
    "5 x torch.empty / zeros": lambda: (torch.empty(Z, H, M, device="cuda"), torch.zeros(Z, H, M, D, device="cuda"),
                                        torch.empty_like(k), torch.empty_like(v), torch.empty_like(q)),
    "delta kernel launch": lambda: hb._delta_kernel[(triton_cdiv(M, hb._PRE_ROWS), Z * H)](
        out, dout, lse, delta, H, M, *out.stride()[:3], *dout.stride()[:3], False, hb._PRE_ROWS, D),
    "Gluon kernel launch (descriptors made)": lambda: hb._hopper_attn_bwd[(triton_cdiv(128, block_n), Z * H)](
        *descs, dq_acc, lse, delta, H, H, M, 128, 0.125 * 1.4426950408889634, 0.125, 1, True, block_m, block_n, D,
        stages, hb._NUM_WARPS, hb._ADDER_WARPS, hb._ADDER_REGS, num_warps=hb._NUM_WARPS),
    "dq cast kernel launch": lambda: hb._dq_cast_kernel[(triton_cdiv(dq.numel(), hb._CAST_BLOCK), )](
        dq_acc, dq, dq.numel(), 0.125, hb._CAST_BLOCK),
}


def triton_cdiv(a, b):
    return -(-a // b)


for name, fn in pieces.items():
    print(f"{per_call_us(fn):8.1f} us  {name}", flush=True)
