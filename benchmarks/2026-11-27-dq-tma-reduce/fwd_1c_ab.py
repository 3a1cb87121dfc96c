"""One-consumer forward configs (2 CTAs an SM: 128 registers a thread at launch, setmaxnreg 232 / 24) against the
package's forward at short lengths: outputs compared, CUDA-graph GPU time, B*N = 16384, H16, bf16; cuDNN beside."""
import importlib.util, sys
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

s = importlib.util.spec_from_file_location("fwd_1c", ".gpu/v15/var/fwd_1c.py")
var = importlib.util.module_from_spec(s); s.loader.exec_module(var)
CONFIGS = {64: [(64, 64, 3, 1), (64, 64, 2, 1), (64, 128, 2, 1)], 128: [(64, 64, 3, 1), (64, 64, 2, 1)]}
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("shape,config,package_ms,variant_ms,variant_vs_package,cudnn_ms,package_vs_cudnn,variant_vs_cudnn,max_abs_diff", flush=True)
for D in (64, 128):
    for N in (1024, 2048, 4096):
        for causal in (False, True):
            B = 16384 // N
            spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                                 causal=CausalMask() if causal else None)
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=spec.scale)
            t0 = do_bench_cudagraph(lambda: hf.hopper_forward(q, k, v, spec))
            tc = do_bench_cudagraph(cudnn)
            ref = hf.hopper_forward(q, k, v, spec)
            for cfg in CONFIGS[D]:
                var.forward_config = lambda *a, cfg=cfg: cfg
                try:
                    out = var.hopper_forward(q, k, v, spec)
                    torch.cuda.synchronize()
                    diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(ref, out))
                    t1 = do_bench_cudagraph(lambda: var.hopper_forward(q, k, v, spec))
                except Exception as e:  # a config that does not launch
                    print(f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'},{cfg},FAILED {type(e).__name__}: {str(e)[:100]}", flush=True)
                    continue
                print(f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'},\"{cfg}\",{t0:.4f},{t1:.4f},{t0 / t1:.3f},{tc:.4f},"
                      f"{tc / t0:.3f},{tc / t1:.3f},{diff:.2e}", flush=True)
