"""A/B of the Gluon forward: the committed kernel (OLD_FWD=path: that commit's hopper_forward.py up to its op section,
absolute imports) against the working tree's, where a consumer warpgroup whose rows all lie past M (the last CTA of
a head where M is no multiple of the CTA's rows: at D64, 192) releases the key tiles without computing.
Outputs compared at odd lengths first; then CUDA-graph GPU time ordered old, new, new, old, cuDNN beside; bf16, H16.

    OLD_FWD=.gpu/v17/old_fwd_kernel.py python3 spare_consumers_ab.py
"""
import importlib.util, os
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

spec_ = importlib.util.spec_from_file_location("old_fwd", os.environ["OLD_FWD"])
old = importlib.util.module_from_spec(spec_); spec_.loader.exec_module(old)
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)


def spec_of(D, causal, group=1):
    return AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                         causal=CausalMask() if causal else None, gqa_group=group)


def inputs(B, H, M, D, group, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, M, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, H // group, M, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    return q, k, v


worst = 0.0
for D in (64, 128):
    for causal in (False, True):
        for M in (1, 97, 300, 1025, 4100):
            for group in (1, 2):
                q, k, v = inputs(2, 4, M, D, group, M + group)
                spec = spec_of(D, causal, group)
                (o1, l1), (o2, l2) = old.hopper_forward(q, k, v, spec), hf.hopper_forward(q, k, v, spec)
                err = max((o1.float() - o2.float()).abs().max().item(), (l1 - l2).abs().max().item())
                assert err < 1e-2, f"D{D} causal={causal} M{M} G{group}: old and new differ by {err}"
                worst = max(worst, err)
print(f"outputs and lse as the committed kernel's at 40 shapes (largest difference {worst:.2e})", flush=True)

print("shape,old_ms,new_ms,new_vs_old_first,new_vs_old_second,old_vs_old,cudnn_ms,new_vs_cudnn", flush=True)
for D in (64, 128):
    for N in (1000, 1024, 2048, 3000, 4096, 16384):
        B = max(16384 // N, 1)
        for causal in (False, True):
            q, k, v = inputs(B, 16, N, D, 1, 0)
            spec = spec_of(D, causal)
            run_old = lambda: old.hopper_forward(q, k, v, spec)
            run_new = lambda: hf.hopper_forward(q, k, v, spec)

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=spec.scale)
            t_old1, t_new1, t_new2, t_old2 = (do_bench_cudagraph(f) for f in (run_old, run_new, run_new, run_old))
            t_old, t_new, t_cudnn = (t_old1 + t_old2) / 2, (t_new1 + t_new2) / 2, do_bench_cudagraph(cudnn)
            print(f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'},{t_old:.4f},{t_new:.4f},{t_old1 / t_new1:.3f},"
                  f"{t_old2 / t_new2:.3f},{t_old1 / t_old2:.3f},{t_cudnn:.4f},{t_cudnn / t_new:.3f}", flush=True)
