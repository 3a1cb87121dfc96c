"""A/B of the causal Gluon backward: the committed kernel (OLD_BWD=path: 395d771's hopper_backward.py up to its op
section, absolute imports; a CTA a key tile) against the working tree's (two key tiles a CTA, pid and n - 1 - pid).
Gradients compared first; CUDA-graph GPU time ordered old, new, new, old; cuDNN's backward beside (its fwd+bwd less
its fwd, enable_gqa where the kv heads are fewer). bf16, causal.

    OLD_BWD=.gpu/v17/old_bwd_395d771.py python3 paired_key_tiles_ab.py
"""
import importlib.util, os
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_backward as hb
from fuse_attn.kernels.hopper_forward import hopper_forward
from fuse_attn.spec import AttentionSpec, CausalMask

spec_ = importlib.util.spec_from_file_location("old_bwd", os.environ["OLD_BWD"])
old = importlib.util.module_from_spec(spec_); spec_.loader.exec_module(old)
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("shape,old_ms,new_ms,new_vs_old_first,new_vs_old_second,old_vs_old,cudnn_ms,old_vs_cudnn,new_vs_cudnn",
      flush=True)
for D in (64, 128):
    for B, H, N, group in ((16, 16, 1024, 1), (8, 16, 2048, 1), (4, 16, 4096, 1), (1, 16, 16384, 1),
                           (2, 32, 4096, 4), (4, 32, 4096, 4), (1, 32, 8192, 4)):
        spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask(),
                             gqa_group=group)
        g = torch.Generator(device="cuda").manual_seed(0)
        q, dout = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        k, v = (torch.randn(B, H // group, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        out, lse = hopper_forward(q, k, v, spec)
        run_old = lambda: old.hopper_backward(dout, q, k, v, out, lse, spec.scale, True, group)
        run_new = lambda: hb.hopper_backward(dout, q, k, v, out, lse, spec.scale, True, group)
        for x, y in zip(run_old(), run_new()):
            assert (x.float() - y.float()).abs().max().item() < 5e-2, "old and new differ"
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]

        def cudnn(q, k, v):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=spec.scale, enable_gqa=group > 1)
        step = lambda: torch.autograd.grad(cudnn(*leaves), leaves, dout)
        step()
        with torch.no_grad():
            t_cudnn_fwd = do_bench_cudagraph(lambda: cudnn(q, k, v))
        t_cudnn = do_bench_cudagraph(step) - t_cudnn_fwd
        t_old1, t_new1, t_new2, t_old2 = (do_bench_cudagraph(f) for f in (run_old, run_new, run_new, run_old))
        t_old, t_new = (t_old1 + t_old2) / 2, (t_new1 + t_new2) / 2
        print(f"B{B} H{H}/{H // group} N{N} D{D} causal,{t_old:.4f},{t_new:.4f},{t_old1 / t_new1:.3f},"
              f"{t_old2 / t_new2:.3f},{t_old1 / t_old2:.3f},{t_cudnn:.4f},{t_cudnn / t_old:.3f},{t_cudnn / t_new:.3f}",
              flush=True)
