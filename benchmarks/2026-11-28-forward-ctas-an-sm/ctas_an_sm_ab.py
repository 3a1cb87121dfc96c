"""More CTAs an SM for the Gluon forward's one-consumer configs at head dim 64 (three at 80 registers a thread at
launch, setmaxnreg 136 / 24; four at 64, 104 / 24) against the package's forward, at B*N = 16384, H16, bf16:
outputs compared with the package's, CUDA-graph GPU time in the order package, variant, variant, package; cuDNN
beside. Run from the repository root on an H100/H200."""
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

PACKAGE = (hf.forward_config, dict(hf._LAUNCH_REGISTERS), dict(hf._REGISTERS))
# (config, registers at launch, setmaxnreg (consumer, producer)): CTAs an SM = 65536 / (256 x launch registers)
VARIANTS = {"3 CTAs (64,64,3,1)": ((64, 64, 3, 1), 80, (136, 24)),
            "4 CTAs (64,64,2,1)": ((64, 64, 2, 1), 64, (104, 24))}


def use(variant):
    if variant is None:
        hf.forward_config, launch, regs = PACKAGE[0], PACKAGE[1], PACKAGE[2]
    else:
        cfg, n, r = VARIANTS[variant]
        hf.forward_config, launch, regs = (lambda *a, cfg=cfg: cfg), {1: n}, {**PACKAGE[2], 1: r}
    hf._LAUNCH_REGISTERS.clear(); hf._LAUNCH_REGISTERS.update(launch)
    hf._REGISTERS.clear(); hf._REGISTERS.update(regs)


print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("shape,variant,package_config,package_ms,variant_ms,package_ms_again,variant_ms_again,variant_vs_package,"
      "cudnn_ms,package_vs_cudnn,variant_vs_cudnn,max_abs_diff", flush=True)
D = 64
for causal in (True, False):
    for N in (1024, 2048, 4096):
        B = 16384 // N
        spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                             causal=CausalMask() if causal else None)
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=spec.scale)

        use(None)
        package_cfg = hf.forward_config(D, causal, N)
        ref = hf.hopper_forward(q, k, v, spec)
        tc = do_bench_cudagraph(cudnn)
        for variant in VARIANTS:
            times = []
            for which in (None, variant, variant, None):
                use(which)
                times.append(do_bench_cudagraph(lambda: hf.hopper_forward(q, k, v, spec)))
            use(variant)
            out = hf.hopper_forward(q, k, v, spec)
            torch.cuda.synchronize()
            diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(ref, out))
            t0, t1 = (times[0] + times[3]) / 2, (times[1] + times[2]) / 2
            print(f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'},{variant},\"{package_cfg}\","
                  + ",".join(f"{t:.4f}" for t in (times[0], times[1], times[3], times[2]))
                  + f",{t0 / t1:.3f},{tc:.4f},{tc / t0:.3f},{tc / t1:.3f},{diff:.2e}", flush=True)
use(None)
