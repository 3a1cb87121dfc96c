"""Forward variants (.gpu/v15/var/<name>.py, a copy of hopper_forward's kernel and launcher) against the package's:
outputs compared, CUDA-graph GPU time, B*N = 16384, H16, bf16; cuDNN's forward beside.
    python3 fwd_var_ab.py NAME -- D:N:causal ...
"""
import importlib.util, sys
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

name = sys.argv[1]
shapes = [tuple(int(x) for x in a.split(":")) for a in sys.argv[sys.argv.index("--") + 1:]]
s = importlib.util.spec_from_file_location(name, f".gpu/v15/var/{name}.py")
var = importlib.util.module_from_spec(s); s.loader.exec_module(var)
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print(f"shape,package_ms,{name}_ms,{name}_vs_package,cudnn_ms,package_vs_cudnn,{name}_vs_cudnn,max_abs_diff", flush=True)
for D, N, causal in shapes:
    B = 16384 // N
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask() if causal else None)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    a, b = hf.hopper_forward(q, k, v, spec), var.hopper_forward(q, k, v, spec)
    diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))
    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), scale=spec.scale)
    t0 = do_bench_cudagraph(lambda: hf.hopper_forward(q, k, v, spec))
    t1 = do_bench_cudagraph(lambda: var.hopper_forward(q, k, v, spec))
    tc = do_bench_cudagraph(cudnn)
    print(f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'},{t0:.4f},{t1:.4f},{t0 / t1:.3f},{tc:.4f},{tc / t0:.3f},"
          f"{tc / t1:.3f},{diff:.2e}", flush=True)
