"""Ring stages of head dim 64's one-consumer config at three CTAs an SM: (64, 64, 4, 1) and (64, 64, 2, 1) against
the package's forward ((64, 64, 3, 1) under 4096 rows, the three-consumer config from 4096), causal, B*N = 16384,
H16, bf16: outputs compared, CUDA-graph GPU time in the order package, variant, variant, package; cuDNN beside. Run
from the repository root."""
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

PACKAGE = hf._SHORT_CAUSAL_CONFIGS[64]
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("shape,variant,package_config,package_ms,variant_ms,package_ms_again,variant_ms_again,variant_vs_package,"
      "cudnn_ms,package_vs_cudnn,variant_vs_cudnn,max_abs_diff", flush=True)
D = 64
for N in (1024, 2048, 4096):
    B = 16384 // N
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask())
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=spec.scale)

    run = lambda: hf.hopper_forward(q, k, v, spec)
    package_cfg = hf.forward_config(D, True, N)
    ref = run()
    tc = do_bench_cudagraph(cudnn)
    for cfg in [(64, 64, 4, 1), (64, 64, 2, 1)]:
        times = []
        for variant in (False, True, True, False):
            hf._SHORT_CAUSAL_CONFIGS[64] = (2 * 4096, cfg) if variant else PACKAGE
            times.append(do_bench_cudagraph(run))
        hf._SHORT_CAUSAL_CONFIGS[64] = (2 * 4096, cfg)
        out = run()
        hf._SHORT_CAUSAL_CONFIGS[64] = PACKAGE
        torch.cuda.synchronize()
        diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(ref, out))
        t0, t1 = (times[0] + times[3]) / 2, (times[1] + times[2]) / 2
        print(f"B{B} H16 N{N} D{D} causal,\"{cfg}\",\"{package_cfg}\","
              + ",".join(f"{t:.4f}" for t in (times[0], times[1], times[3], times[2]))
              + f",{t0 / t1:.3f},{tc:.4f},{tc / t0:.3f},{tc / t1:.3f},{diff:.2e}", flush=True)
