"""A/B of the Gluon forward: the committed kernel (OLD_FWD=path: 5f0551e's hopper_forward.py up to its op section,
absolute imports; one query block a CTA) against the working tree's, launched with one query block a CTA
("unpaired") and with two ("paired": blocks n - 1 - pid and pid, causal calls only), whatever its pairing rule says.
(Call 1 ran a first form that also paired unmasked calls, blocks 2 pid and 2 pid + 1.) Outputs and lse compared at
odd lengths first (bit for bit: each block is computed the same way); then CUDA-graph GPU time ordered old,
unpaired, paired, paired, unpaired, old; cuDNN beside. bf16.

    OLD_FWD=.gpu/v18/old_fwd_5f0551e.py python3 paired_query_blocks_ab.py [boundary | product]
"""
import importlib.util, os, sys
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


def new(q, k, v, spec, paired):
    hf.pairs_query_blocks = lambda causal, *args: paired and causal  # (the kernel pairs causal blocks only)
    return hf.hopper_forward(q, k, v, spec)


shapes = 0
for D in (64, 128):
    for causal in (False, True):
        for M in (1, 97, 300, 1025, 2000, 4100):
            for group in (1, 2):
                q, k, v = inputs(2, 4, M, D, group, M + group)
                spec = spec_of(D, causal, group)
                o1, l1 = old.hopper_forward(q, k, v, spec)
                for paired in (False, True):
                    o2, l2 = new(q, k, v, spec, paired)
                    assert torch.equal(o1, o2) and torch.equal(l1, l2), \
                        f"D{D} causal={causal} M{M} G{group} paired={paired}: not the committed kernel's outputs"
                shapes += 1
print(f"outputs and lse bit for bit the committed kernel's at {shapes} shapes, unpaired and paired", flush=True)

print("shape,old_ms,unpaired_ms,paired_ms,unpaired_vs_old,paired_vs_old_first,paired_vs_old_second,"
      "paired_vs_unpaired,old_vs_old,cudnn_ms,old_vs_cudnn,paired_vs_cudnn", flush=True)
if sys.argv[1:] == ["boundary"]:  # causal calls around the pairing rule's 4 waves (H100: 132 SMs), (D, N, B, H)
    cases = [(D, N, True, B, H, group) for D, N, B, H, group in (
        (64, 1024, 4, 16, 1), (64, 1024, 8, 16, 1), (64, 2048, 2, 16, 1), (64, 2048, 4, 16, 1),  # 3.9, 7.8 waves
        (64, 4096, 1, 16, 1), (64, 4096, 2, 16, 1), (64, 8192, 1, 16, 1), (64, 4096, 1, 32, 4),  # 2.7, 5.3 waves
        (128, 1024, 4, 16, 1), (128, 1024, 8, 16, 1), (128, 2048, 2, 16, 1), (128, 4096, 1, 16, 1),  # 3.9, 7.8
        (128, 4096, 2, 16, 1), (128, 8192, 1, 16, 1), (128, 4096, 1, 32, 4), (128, 8192, 1, 32, 4))]  # 7.8 waves
else:  # B*N = 16384, H16 (the product rows: the rule pairs none); unless "product": GQA 32/8 at B2 N4096, B4 N1024
    cases = [(D, N, causal, max(16384 // N, 1), 16, 1) for D in (64, 128) for N in (1024, 2048, 4096, 16384)
             for causal in (False, True)]
    if sys.argv[1:] != ["product"]:
        cases += [(D, 4096, True, 2, 32, 4) for D in (64, 128)] + [(D, 1024, causal, 4, 16, 1) for D in (64, 128)
                                                                     for causal in (False, True)]
for D, N, causal, B, H, group in cases:
    q, k, v = inputs(B, H, N, D, group, 0)
    spec = spec_of(D, causal, group)
    run_old = lambda: old.hopper_forward(q, k, v, spec)
    run_unpaired = lambda: new(q, k, v, spec, False)
    run_paired = lambda: new(q, k, v, spec, True)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=spec.scale, enable_gqa=group > 1)
    t = [do_bench_cudagraph(f) for f in (run_old, run_unpaired, run_paired, run_paired, run_unpaired, run_old)]
    t_old, t_unp, t_pair = (t[0] + t[5]) / 2, (t[1] + t[4]) / 2, (t[2] + t[3]) / 2
    t_cudnn = do_bench_cudagraph(cudnn)
    print(f"B{B} H{H}/{H // group} N{N} D{D} {'causal' if causal else 'full'},{t_old:.4f},{t_unp:.4f},{t_pair:.4f},"
          f"{t_old / t_unp:.3f},{t[0] / t[2]:.3f},{t[5] / t[3]:.3f},{t_unp / t_pair:.3f},{t[0] / t[5]:.3f},"
          f"{t_cudnn:.4f},{t_cudnn / t_old:.3f},{t_cudnn / t_pair:.3f}", flush=True)
