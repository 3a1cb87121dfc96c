"""Unmasked attention over few rows on the Gluon forward's one-consumer configs (CTAs sharing an SM) against the
package's multi-consumer configs, at B*N = 16384, H16, bf16: outputs compared with the package's, CUDA-graph GPU time
in the order package, variant, variant, package; cuDNN beside. Run from the repository root on an H100/H200."""
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec

PACKAGE = (hf.forward_config, dict(hf._ONE_CONSUMER_CTAS_AN_SM))
# per head dim: (config, CTAs an SM)
VARIANTS = {64: {"(64,64,3,1) x3": ((64, 64, 3, 1), 3), "(64,128,3,1) x2": ((64, 128, 3, 1), 2)},
            128: {"(64,64,3,1) x2": ((64, 64, 3, 1), 2)}}


def use(D, variant):
    hf.forward_config = PACKAGE[0]
    hf._ONE_CONSUMER_CTAS_AN_SM.clear(); hf._ONE_CONSUMER_CTAS_AN_SM.update(PACKAGE[1])
    if variant is not None:
        cfg, ctas = VARIANTS[D][variant]
        hf.forward_config = lambda *a, cfg=cfg: cfg
        hf._ONE_CONSUMER_CTAS_AN_SM[D] = ctas


print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("shape,variant,package_config,package_ms,variant_ms,package_ms_again,variant_ms_again,variant_vs_package,"
      "cudnn_ms,package_vs_cudnn,variant_vs_cudnn,max_abs_diff", flush=True)
for D in (64, 128):
    for N in (1024, 2048):
        B = 16384 // N
        spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5)
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, scale=spec.scale)

        use(D, None)
        package_cfg = hf.forward_config(D, False, N)
        ref = hf.hopper_forward(q, k, v, spec)
        tc = do_bench_cudagraph(cudnn)
        for variant in VARIANTS[D]:
            times = []
            for which in (None, variant, variant, None):
                use(D, which)
                times.append(do_bench_cudagraph(lambda: hf.hopper_forward(q, k, v, spec)))
            use(D, variant)
            out = hf.hopper_forward(q, k, v, spec)
            torch.cuda.synchronize()
            diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(ref, out))
            t0, t1 = (times[0] + times[3]) / 2, (times[1] + times[2]) / 2
            print(f"B{B} H16 N{N} D{D} full,{variant},\"{package_cfg}\","
                  + ",".join(f"{t:.4f}" for t in (times[0], times[1], times[3], times[2]))
                  + f",{t0 / t1:.3f},{tc:.4f},{tc / t0:.3f},{tc / t1:.3f},{diff:.2e}", flush=True)
use(None, None)
