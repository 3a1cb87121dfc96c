"""The forward as a user calls it (``torch.ops.fuse_attn.flash_attention_hopper``, eager) at causal shapes the pairing
rule pairs: GPU time (CUDA graph) and wall time per call (200 calls back to back, then one synchronize: the host's
cost where it exceeds the kernel's), with the rule (paired) and with pairing off, cuDNN's SDPA beside. bf16.

    python3 wall_per_call.py
"""
import time
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
rule = hf.pairs_query_blocks


def wall_ms(fn, calls=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / calls


print("shape,paired_by_rule,gpu_ms_paired,gpu_ms_unpaired,paired_vs_unpaired,wall_ms_paired,wall_ms_unpaired,"
      "cudnn_gpu_ms,cudnn_wall_ms,paired_gpu_vs_cudnn", flush=True)
for B, H, group, N, D in ((4, 16, 1, 1024, 64), (2, 16, 1, 2048, 64), (4, 16, 1, 1024, 128), (2, 16, 1, 2048, 128),
                          (1, 32, 4, 4096, 128), (2, 16, 1, 4096, 128)):
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask(),
                         gqa_group=group)
    text = spec.to_json()
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, H // group, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    op = lambda: torch.ops.fuse_attn.flash_attention_hopper(q, k, v, text)
    block_m, _, _, consumers = hf.forward_config(D, True, N)
    by_rule = rule(True, triton.cdiv(N, consumers * block_m), B * H, consumers, q.device)
    times = {}
    for paired in (True, False):
        hf.pairs_query_blocks = (lambda *args: paired and rule(*args))
        times[paired] = do_bench_cudagraph(op), wall_ms(op)
    hf.pairs_query_blocks = rule

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=spec.scale, enable_gqa=group > 1)
    t_cudnn = do_bench_cudagraph(cudnn), wall_ms(cudnn)
    print(f"B{B} H{H}/{H // group} N{N} D{D} causal,{by_rule},{times[True][0]:.4f},{times[False][0]:.4f},"
          f"{times[False][0] / times[True][0]:.3f},{times[True][1]:.4f},{times[False][1]:.4f},{t_cudnn[0]:.4f},"
          f"{t_cudnn[1]:.4f},{t_cudnn[0] / times[True][0]:.3f}", flush=True)
