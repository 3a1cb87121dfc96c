"""The Gluon forward's variants against the package's launch (one query block a CTA, the output stored by TMA
through q's tile): the output stored from registers (q's tile given back once the block's last q k^T is done), a
persistent grid (as many CTAs as the SMs hold, each taking every grid-th block) storing by TMA, and a persistent grid
storing from registers. B*N = 16384, H16, bf16; outputs compared with the package's; CUDA-graph GPU time in the order
package, variant, variant, package; cuDNN beside. Run from the repository root on an H100/H200."""
import sys

import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

RULE = hf.runs_persistent
VARIANTS = {"registers": (False, False), "persistent+TMA": (True, True), "persistent+registers": (True, False)}


def use(variant):
    persistent, by_tma = (False, True) if variant is None else VARIANTS[variant]
    hf.runs_persistent = (lambda causal, *a: persistent and not causal) if persistent else RULE
    hf._STORE_BY_TMA = by_tma


print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("shape,variant,config,package_ms,variant_ms,package_ms_again,variant_ms_again,variant_vs_package,"
      "cudnn_ms,package_vs_cudnn,variant_vs_cudnn,max_abs_diff", flush=True)
CASES = [(D, N, B, False) for D in (64, 128) for N in (1024, 2048, 4096, 16384) for B in (16384 // N,)]
CASES += [(D, N, 16384 // N, True) for D in (64, 128) for N in (1024, 2048, 4096)] + [(128, 2048, 1, True)]
for D, N, B, causal in CASES:
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                         causal=CausalMask() if causal else None)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=spec.scale)

    use(None)
    ref = hf.hopper_forward(q, k, v, spec)
    tc = do_bench_cudagraph(cudnn)
    for variant in VARIANTS:
        if causal and VARIANTS[variant][0]:
            continue
        times = []
        for which in (None, variant, variant, None):
            use(which)
            times.append(do_bench_cudagraph(lambda: hf.hopper_forward(q, k, v, spec)))
        use(variant)
        out = hf.hopper_forward(q, k, v, spec)
        torch.cuda.synchronize()
        diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(ref, out))
        t0, t1 = (times[0] + times[3]) / 2, (times[1] + times[2]) / 2
        print(f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'},{variant},\"{hf.forward_config(D, causal, N)}\","
              + ",".join(f"{t:.4f}" for t in (times[0], times[1], times[3], times[2]))
              + f",{t0 / t1:.3f},{tc:.4f},{tc / t0:.3f},{tc / t1:.3f},{diff:.2e}", flush=True)
use(None)
