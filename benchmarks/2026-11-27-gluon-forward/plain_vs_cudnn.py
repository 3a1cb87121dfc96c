"""Plain attention, our kernels against SDPA cuDNN, the three numbers of a performance claim: kernel GPU time (a CUDA
graph's replay), wall time per call (``do_bench`` of the eager call: host cost included), forward and forward +
backward. Ours: the generated template (``flash_attention``: its forward and backward) and the Gluon forward
(``flash_attention_hopper``: it, then the template's backward). B * N = 16384 tokens, 16 heads, bf16.

    FUSE_ATTN_CACHE_DIR=... python3 plain_vs_cudnn.py [N ...]      (on an sm90 GPU)
"""
import sys

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench, do_bench_cudagraph

from fuse_attn.kernels import flash_attention
from fuse_attn.kernels.hopper_forward import flash_attention_hopper
from fuse_attn.spec import AttentionSpec, CausalMask


def methods(spec, causal, scale):
    def cudnn(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    return {"template": lambda q, k, v: flash_attention(q, k, v, spec),
            "gluon fwd": lambda q, k, v: flash_attention_hopper(q, k, v, spec),
            "cuDNN": cudnn}


def main(lengths):
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    print("shape,mode,method,gpu_ms,wall_ms,gpu_vs_cudnn,wall_vs_cudnn", flush=True)
    for D in (64, 128):
        for N in lengths:
            B = max(1, 16384 // N)
            for causal in (False, True):
                scale = D ** -0.5
                spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=scale,
                                     causal=CausalMask() if causal else None)
                gen = torch.Generator(device="cuda").manual_seed(0)
                q, k, v, dout = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                                 for _ in range(4))
                for mode in ("fwd", "fwd+bwd"):
                    times = {}
                    for name, fn in methods(spec, causal, scale).items():
                        leaves = [t.detach().requires_grad_(mode == "fwd+bwd") for t in (q, k, v)]

                        def step():
                            out = fn(*leaves)
                            if mode == "fwd+bwd":
                                torch.autograd.grad(out, leaves, dout)
                        step()
                        torch.cuda.synchronize()
                        times[name] = (do_bench_cudagraph(step, rep=100), do_bench(step, warmup=25, rep=100))
                    shape = f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'}"
                    for name, (gpu, wall) in times.items():
                        print(f"{shape},{mode},{name},{gpu:.4f},{wall:.4f},{times['cuDNN'][0] / gpu:.3f},"
                              f"{times['cuDNN'][1] / wall:.3f}", flush=True)


if __name__ == "__main__":
    main([int(n) for n in sys.argv[1:]] or [1024, 4096, 16384])
