"""Head dim 256, plain attention: the Gluon forward (64 x 64 x 2 stages, 2 consumers) against SDPA's cuDNN and
flash kernels and the generated template; forward+backward with the template's backward behind the Gluon forward.
CUDA-graph GPU time, ms; B*N = 16384, H8 (Gemma's heads), bf16."""
import sys, time
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import flash_attention
from fuse_attn.kernels.hopper_forward import flash_attention_hopper
from fuse_attn.spec import AttentionSpec, CausalMask

print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
t0 = time.time()
D, H = 256, 8
print("shape,mode,gluon_ms,template_ms,cudnn_ms,flash_ms,gluon_vs_best_peer", flush=True)
for N in (1024, 4096, 16384):
    for causal in (True, False):
        B = 16384 // N
        spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                             causal=CausalMask() if causal else None)
        g = torch.Generator(device="cuda").manual_seed(N)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
                   for _ in range(3))
        dout = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)

        def sdpa(backend):
            def f():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=spec.scale)
            return f
        fwds = {"gluon": lambda: flash_attention_hopper(q, k, v, spec), "template": lambda: flash_attention(q, k, v, spec),
                "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "flash": sdpa(SDPBackend.FLASH_ATTENTION)}
        for mode in ("fwd", "fwd+bwd"):
            times = {}
            for name, fwd in fwds.items():
                if name == "template" and time.time() - t0 > 330:
                    times[name] = float("nan")
                    continue
                def step(fwd=fwd):
                    if mode == "fwd":
                        with torch.no_grad():
                            fwd()
                    else:
                        torch.autograd.grad(fwd(), (q, k, v), dout)
                try:
                    step(); torch.cuda.synchronize()
                    times[name] = do_bench_cudagraph(step)
                except Exception as e:  # a backend that does not take this shape
                    print(f"# {name} {mode} N{N}: {type(e).__name__}: {str(e)[:100]}", flush=True)
                    times[name] = float("nan")
            peers = [t for n, t in times.items() if n != "gluon" and t == t]
            print(f"B{B} H{H} N{N} D{D} {'causal' if causal else 'full'},{mode},{times['gluon']:.4f},{times['template']:.4f},"
                  f"{times['cudnn']:.4f},{times['flash']:.4f},{min(peers) / times['gluon']:.3f}", flush=True)
print(f"done ({time.time() - t0:.0f} s)", flush=True)
