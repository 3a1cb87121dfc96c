"""The Gluon ops as the product launches them (hopper_forward.forward_config picks the tile config) against SDPA
cuDNN: forward and forward + backward (the Gluon backward), GPU time (CUDA-graph replay) and wall time per eager
call (do_bench: host cost included). B * N = 16384, H16, bf16.

    python3 product_rows.py [N ...]
"""
import sys

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench, do_bench_cudagraph

from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask


def main(lengths):
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    print("shape,config,what,gluon_gpu_ms,cudnn_gpu_ms,gpu_vs_cudnn,gluon_wall_ms,cudnn_wall_ms", flush=True)
    for D in (64, 128):
        for N in lengths:
            B = max(1, 16384 // N)
            for causal in (False, True):
                spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                                     causal=CausalMask() if causal else None)
                gen = torch.Generator(device="cuda").manual_seed(0)
                q, k, v, dout = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                                 for _ in range(4))

                def cudnn(q, k, v):
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=spec.scale)

                text = spec.to_json()

                def gluon(q, k, v):
                    return hf.flash_attention_hopper(q, k, v, text)

                row = {}
                for name, fn in (("gluon", gluon), ("cudnn", cudnn)):
                    with torch.no_grad():
                        forward = lambda fn=fn: fn(q, k, v)  # noqa: E731
                        forward()
                        row[name, "fwd"] = (do_bench_cudagraph(forward, rep=100), do_bench(forward, rep=100))
                    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

                    def step(fn=fn):
                        torch.autograd.grad(fn(*leaves), leaves, dout)
                    step()
                    row[name, "fwd+bwd"] = (do_bench_cudagraph(step, rep=100), do_bench(step, rep=100))
                shape = f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'}"
                config = hf.forward_config(D, causal, N)
                for what in ("fwd", "fwd+bwd"):
                    (g, gw), (c, cw) = row["gluon", what], row["cudnn", what]
                    print(f"{shape},{config},{what},{g:.4f},{c:.4f},{c / g:.3f},{gw:.4f},{cw:.4f}", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1024, 4096, 16384])
