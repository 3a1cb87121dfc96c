"""Prepared for the next session, not run: causal calls on a persistent grid (causal_persistent.patch applied: items of
two blocks of a head, blocks - 1 - p and p, equal work, every grid-th item) against the package's launch (one block a
CTA, or two where CTAs are few: pairs_query_blocks), in the order package, persistent, persistent, package; CUDA-graph
GPU time, outputs compared, cuDNN beside. B*N = 16384 (and few-CTA shapes), H16, bf16. Run from the repository root
on an H100/H200 with the patch applied."""
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

RULE = hf.runs_persistent


HEAD_DIM = [64]  # the head dim of the call being launched (the rule's arguments do not carry it)


def causal_persistent(causal, has_bias, consumers, rows, blocks, heads, keys, device):
    """Causal: persistent where its items (pairs of blocks) outnumber the CTAs the SMs hold at once."""
    if not causal:
        return RULE(causal, has_bias, consumers, rows, blocks, heads, keys, device)
    ctas = hf.resident_ctas(HEAD_DIM[0], consumers)
    return (not has_bias and blocks % 2 == 0 and rows > 1
            and not hf.fills_at_most(blocks // 2 * heads, 1, device, ctas))


print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("shape,config,package_ms,persistent_ms,package_ms_again,persistent_ms_again,persistent_vs_package,cudnn_ms,"
      "package_vs_cudnn,persistent_vs_cudnn,max_abs_diff", flush=True)
for D in (64, 128):
    HEAD_DIM[0] = D
    for B, N in ((16, 1024), (8, 2048), (4, 4096), (1, 2048), (2, 2048)):
        spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask())
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=spec.scale)

        ref = hf.hopper_forward(q, k, v, spec)
        times = []
        for persistent in (False, True, True, False):
            hf.runs_persistent = causal_persistent if persistent else RULE
            times.append(do_bench_cudagraph(lambda: hf.hopper_forward(q, k, v, spec)))
        hf.runs_persistent = causal_persistent
        out = hf.hopper_forward(q, k, v, spec)
        hf.runs_persistent = RULE
        torch.cuda.synchronize()
        diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(ref, out))
        tc = do_bench_cudagraph(cudnn)
        t0, t1 = (times[0] + times[3]) / 2, (times[1] + times[2]) / 2
        print(f"B{B} H16 N{N} D{D} causal,\"{hf.forward_config(D, True, N)}\"," + ",".join(f"{t:.4f}" for t in times)
              + f",{t0 / t1:.3f},{tc:.4f},{tc / t0:.3f},{tc / t1:.3f},{diff:.2e}", flush=True)
