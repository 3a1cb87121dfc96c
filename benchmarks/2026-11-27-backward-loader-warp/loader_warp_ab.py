"""A/B of the Gluon backward's main kernel step: the committed one (OLD_BWD=path: that commit's hopper_backward.py up
to its op definitions, absolute imports) against the working tree's (the loader warp), including GQA groups.
Each pair is timed old, new, new, old (CUDA-graph GPU time, do_bench_cudagraph) so that an order effect shows as
the two ratios' difference; the last column is the same kernel timed twice (old first against old last).

    OLD_BWD=.gpu/v17/old_bwd.py python3 loader_warp_ab.py
"""
import importlib.util, os
import torch, triton
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_backward as hb
from fuse_attn.kernels.hopper_forward import hopper_forward
from fuse_attn.spec import AttentionSpec, CausalMask

spec_ = importlib.util.spec_from_file_location("old_bwd", os.environ["OLD_BWD"])
old = importlib.util.module_from_spec(spec_); spec_.loader.exec_module(old)
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("shape,old_ms,new_ms,new_vs_old_first,new_vs_old_second,old_vs_old", flush=True)
for D in (64, 128):
    for N, H, group in ((1024, 16, 1), (4096, 16, 1), (4096, 32, 4), (16384, 16, 1)):
        B = 16384 // N
        for causal in (False, True):
            spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                                 causal=CausalMask() if causal else None, gqa_group=group)
            g = torch.Generator(device="cuda").manual_seed(0)
            q, dout = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            k, v = (torch.randn(B, H // group, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            out, lse = hopper_forward(q, k, v, spec)
            run_old = lambda: old.hopper_backward(dout, q, k, v, out, lse, spec.scale, causal, group)
            run_new = lambda: hb.hopper_backward(dout, q, k, v, out, lse, spec.scale, causal, group)
            for x, y in zip(run_old(), run_new()):
                assert (x.float() - y.float()).abs().max().item() < 5e-2, "old and new differ"
            t_old1, t_new1, t_new2, t_old2 = (do_bench_cudagraph(f) for f in (run_old, run_new, run_new, run_old))
            t_old, t_new = (t_old1 + t_old2) / 2, (t_new1 + t_new2) / 2
            print(f"B{B} H{H}/{H // group} N{N} D{D} {'causal' if causal else 'full'},{t_old:.4f},{t_new:.4f},"
                  f"{t_old1 / t_new1:.3f},{t_old2 / t_new2:.3f},{t_old1 / t_old2:.3f}", flush=True)
