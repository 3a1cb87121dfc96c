"""A/B of the Gluon backward: an earlier commit's (old_bwd.py beside this script: that commit's hopper_backward.py up
to its op definitions, with absolute imports; call 6: aab8416, call 7: 2223c39) against the working tree's (call 6:
dK / dV in flight between query tiles when causal; call 7: also unmasked, the first tile apart), and cuDNN's backward (its fwd+bwd less its fwd); CUDA-graph GPU time, B*N = 16384, H16, bf16. Then forward + backward
of the product against cuDNN.

    python3 deferred_bwd_ab.py [causal] [full]

OLD_BWD=path: the earlier backward from another file (the fifteenth session's calls 2 and 3: .gpu/old_bwd.py, from
fd65393 and 0d761cc, against dQ by TMA reduce-adds and the transposed form; benchmarks/2026-11-27-dq-tma-reduce/).
"""
import importlib.util, os, sys
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_backward as hb
from fuse_attn.kernels.hopper_forward import flash_attention_hopper, hopper_forward
from fuse_attn.spec import AttentionSpec, CausalMask

spec_ = importlib.util.spec_from_file_location(
    "old_bwd", os.environ.get("OLD_BWD") or __file__.replace("deferred_bwd_ab.py", "old_bwd.py"))
old = importlib.util.module_from_spec(spec_); spec_.loader.exec_module(old)
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("shape,old_bwd_ms,new_bwd_ms,new_vs_old,cudnn_bwd_ms,old_vs_cudnn,new_vs_cudnn,fwd_bwd_ms,cudnn_fwd_bwd_ms,fwd_bwd_vs_cudnn", flush=True)
masks = [m == "causal" for m in (sys.argv[1:] or ["causal"])]
for D in (64, 128):
    for N in (1024, 4096, 16384):
        B = 16384 // N
        for causal in masks:
            spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask() if causal else None)
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, dout = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
            out, lse = hopper_forward(q, k, v, spec)
            run_old = lambda: old.hopper_backward(dout, q, k, v, out, lse, spec.scale, causal, 1)
            run_new = lambda: hb.hopper_backward(dout, q, k, v, out, lse, spec.scale, causal, 1)
            a, b = run_old(), run_new()
            for x, y in zip(a, b):
                assert (x.float() - y.float()).abs().max().item() < 5e-2, "old and new differ"
            t_old, t_new = do_bench_cudagraph(run_old), do_bench_cudagraph(run_new)
            def cudnn(q, k, v):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=spec.scale)
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            step = {name: (lambda fn=fn: torch.autograd.grad(fn(*leaves), leaves, dout))
                    for name, fn in (("ours", lambda q, k, v: flash_attention_hopper(q, k, v, spec)), ("cudnn", cudnn))}
            for fn in step.values():
                fn()
            t_ours, t_cudnn = do_bench_cudagraph(step["ours"]), do_bench_cudagraph(step["cudnn"])
            with torch.no_grad():
                t_cudnn_fwd = do_bench_cudagraph(lambda: cudnn(q, k, v))
            c_bwd = t_cudnn - t_cudnn_fwd
            print(f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'},{t_old:.4f},{t_new:.4f},{t_old/t_new:.3f},{c_bwd:.4f},"
                  f"{c_bwd/t_old:.3f},{c_bwd/t_new:.3f},{t_ours:.4f},{t_cudnn:.4f},{t_cudnn/t_ours:.3f}", flush=True)
