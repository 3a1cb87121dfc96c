"""Forward configs under the launch each would get, forced, per shape, in the order a, b, ..., ..., b, a; CUDA-graph
GPU time (ms), outputs compared with the first's, cuDNN beside. A config is (rows per consumer, key tile, stages,
consumers); "persistent" forces a persistent grid, "rule" takes runs_persistent's word. H16, bf16. Asks: D128 causal,
where the one-consumer config (two CTAs an SM) should give way to the two-consumer one now that both run persistent;
D64 unmasked at N1024 / 2048 (0.93 / 1.02 cuDNN on its three-consumer config), on one consumer (three CTAs an SM) or
two, each persistent; with the argument ``crossover``, lengths between (``crossover-odd``: D128 where two consumers
have an odd number of blocks a head). Run from the repository root on an
H100/H200."""
import sys
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

CONFIG, RULE = hf.forward_config, hf.runs_persistent
ONE_128, TWO_128 = (64, 64, 3, 1), (64, 128, 3, 2)
ONE_64, TWO_64, THREE_64 = (64, 64, 3, 1), (64, 128, 3, 2), (64, 128, 3, 3)
CASES = [(128, True, B, N, [(ONE_128, "rule"), (TWO_128, "rule")])
         for B, N in ((16, 1024), (10, 1536), (8, 2000), (8, 2048))]
CASES += [(64, False, B, N, [(THREE_64, "rule"), (ONE_64, "one"), (ONE_64, "persistent"), (TWO_64, "persistent")])
          for B, N in ((16, 1024), (8, 2048))]
if sys.argv[1:] == ["crossover"]:  # (call 4) between the lengths above: where each head dim's shorter config stops
    CASES = [(128, True, B, N, [(ONE_128, "rule"), (TWO_128, "rule")]) for B, N in ((9, 1792), (8, 1920), (10, 1664))]
    CASES += [(64, False, B, N, [(THREE_64, "rule"), (ONE_64, "persistent")])
              for B, N in ((16, 1024), (12, 1280), (10, 1536), (9, 1792))]
if sys.argv[1:] == ["crossover-odd"]:  # (call 5) D128's two consumers persistent over 13 and 15 blocks a head too
    CASES = [(128, True, B, N, [(ONE_128, "rule"), (TWO_128, "rule")]) for B, N in ((10, 1664), (8, 1920))]
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("shape,config,launch,ms,ms_again,vs_first,cudnn_ms,cudnn_vs_this,max_abs_diff_vs_first", flush=True)
for D, causal, B, N, variants in CASES:
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                         causal=CausalMask() if causal else None)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=spec.scale)

    times, outs = [[] for _ in variants], []
    for i in list(range(len(variants))) + list(reversed(range(len(variants)))):
        config, launch = variants[i]
        hf.forward_config = lambda *a, c=config, **kw: c
        hf.runs_persistent = {"rule": RULE, "one": lambda *a: False, "persistent": lambda *a: True}[launch]
        if len(outs) < len(variants):
            outs.append(hf.hopper_forward(q, k, v, spec))
        times[i].append(do_bench_cudagraph(lambda: hf.hopper_forward(q, k, v, spec)))
    hf.forward_config, hf.runs_persistent = CONFIG, RULE
    torch.cuda.synchronize()
    tc = do_bench_cudagraph(cudnn)
    first = sum(times[0]) / 2
    for (config, launch), ts, out in zip(variants, times, outs):
        diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(outs[0], out))
        t = sum(ts) / 2
        print(f"B{B} H16 N{N} D{D} {'causal' if causal else 'unmasked'},\"{config}\",{launch},{ts[0]:.4f},{ts[1]:.4f},"
              f"{first / t:.3f},{tc:.4f},{tc / t:.3f},{diff:.2e}", flush=True)
