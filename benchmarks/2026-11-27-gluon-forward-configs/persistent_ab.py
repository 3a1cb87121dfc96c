"""A/B of the persistent Gluon forward (persistent_forward.patch, applied to aee9ef4 in the working tree) against
aee9ef4's forward (old_fwd.py beside this script: that commit's hopper_forward.py up to its op definitions, with
absolute imports) and SDPA cuDNN; CUDA-graph GPU time, B * N = 16384, H16, bf16.

    python3 persistent_ab.py [N ...]
"""
import importlib.util, sys
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

path = __file__.replace("fwd_ab.py", "old_fwd.py")
spec_ = importlib.util.spec_from_file_location("old_fwd", path)
old = importlib.util.module_from_spec(spec_); spec_.loader.exec_module(old)

print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("shape,old_ms,new_ms,cudnn_ms,old_vs_cudnn,new_vs_cudnn,new_vs_old", flush=True)
lengths = [int(a) for a in sys.argv[1:]] or [1024, 2048, 4096, 16384]
for D in (64, 128):
    for N in lengths:
        B = max(1, 16384 // N)
        for causal in (False, True):
            spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask() if causal else None)
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=spec.scale)
            a, b = old.hopper_forward(q, k, v, spec)[0], hf.hopper_forward(q, k, v, spec)[0]
            assert (a - b).abs().max().item() < 2e-2, "old and new differ"
            t_old = do_bench_cudagraph(lambda: old.hopper_forward(q, k, v, spec))
            t_new = do_bench_cudagraph(lambda: hf.hopper_forward(q, k, v, spec))
            t_c = do_bench_cudagraph(cudnn)
            print(f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'},{t_old:.4f},{t_new:.4f},{t_c:.4f},{t_c/t_old:.3f},{t_c/t_new:.3f},{t_old/t_new:.3f}", flush=True)
