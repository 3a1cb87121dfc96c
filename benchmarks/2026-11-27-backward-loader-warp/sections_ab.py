"""A/B of the causal CTA order: the committed Gluon forward and backward (OLD_FWD / OLD_BWD = paths: 395d771's
hopper_forward.py / hopper_backward.py up to their op sections, absolute imports; a head's CTAs in order, then the next
head's) against the working tree's (a few heads at a time, block by block across them: heads_per_section).
Outputs and gradients compared first; then CUDA-graph GPU time ordered old, new, new, old, forward and backward
kernels apart (the backward from the new forward's out and lse), cuDNN's beside (its backward = fwd+bwd - fwd).

    OLD_FWD=... OLD_BWD=... python3 sections_ab.py
"""
import importlib.util, os
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_backward as hb, hopper_forward as hf
from fuse_attn.kernels.flash_decoding import sm_count
from fuse_attn.spec import AttentionSpec, CausalMask


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
    return module


old_f, old_b = load("old_fwd", os.environ["OLD_FWD"]), load("old_bwd", os.environ["OLD_BWD"])
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, "SMs", sm_count(torch.device("cuda")),
      flush=True)
print("shape,what,old_ms,new_ms,new_vs_old_first,new_vs_old_second,old_vs_old,cudnn_ms,new_vs_cudnn", flush=True)
for D in (64, 128):
    for N, H, group in ((1024, 16, 1), (2048, 16, 1), (4096, 16, 1), (4096, 32, 4), (16384, 16, 1)):
        B = 16384 // N // (2 if group > 1 else 1)
        spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask(),
                             gqa_group=group)
        g = torch.Generator(device="cuda").manual_seed(0)
        q, dout = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        k, v = (torch.randn(B, H // group, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        out, lse = hf.hopper_forward(q, k, v, spec)
        runs = {"fwd": (lambda: old_f.hopper_forward(q, k, v, spec), lambda: hf.hopper_forward(q, k, v, spec)),
                "bwd": (lambda: old_b.hopper_backward(dout, q, k, v, out, lse, spec.scale, True, group),
                        lambda: hb.hopper_backward(dout, q, k, v, out, lse, spec.scale, True, group))}
        for what, (run_old, run_new) in runs.items():
            for x, y in zip(run_old(), run_new()):
                assert (x.float() - y.float()).abs().max().item() < 5e-2, f"{what}: old and new differ"
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]

        def cudnn(q, k, v):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=spec.scale,
                                                      enable_gqa=group > 1)
        step = lambda: torch.autograd.grad(cudnn(*leaves), leaves, dout)
        step()
        with torch.no_grad():
            t_cudnn_fwd = do_bench_cudagraph(lambda: cudnn(q, k, v))
        t_cudnn = {"fwd": t_cudnn_fwd, "bwd": do_bench_cudagraph(step) - t_cudnn_fwd}
        for what, (run_old, run_new) in runs.items():
            t_old1, t_new1, t_new2, t_old2 = (do_bench_cudagraph(f) for f in (run_old, run_new, run_new, run_old))
            t_old, t_new = (t_old1 + t_old2) / 2, (t_new1 + t_new2) / 2
            print(f"B{B} H{H}/{H // group} N{N} D{D} causal,{what},{t_old:.4f},{t_new:.4f},{t_old1 / t_new1:.3f},"
                  f"{t_old2 / t_new2:.3f},{t_old1 / t_old2:.3f},{t_cudnn[what]:.4f},{t_cudnn[what] / t_new:.3f}",
                  flush=True)
