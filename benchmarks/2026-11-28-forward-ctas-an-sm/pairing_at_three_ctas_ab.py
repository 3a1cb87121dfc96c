"""Causal forwards of few CTAs at head dim 64's one-consumer config, three CTAs an SM: paired query blocks (the
package's rule, hopper_forward._PAIR_UP_TO_WAVES waves counted at three CTAs an SM) against one block a CTA
(_PAIR_UP_TO_WAVES = 0), bf16, H16: CUDA-graph GPU time in the order rule, unpaired, unpaired, rule; outputs
compared. Run from the repository root."""
import torch, triton
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

RULE = hf._PAIR_UP_TO_WAVES
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("shape,ctas_unpaired,waves_at_3,paired_by_rule,rule_ms,unpaired_ms,rule_ms_again,unpaired_ms_again,"
      "rule_vs_unpaired,max_abs_diff", flush=True)
D, H = 64, 16
for B, N in ((1, 2048), (2, 2048), (4, 2048), (6, 2048), (12, 1024)):
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask())
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    run = lambda: hf.hopper_forward(q, k, v, spec)
    block_m, _, _, consumers = hf.forward_config(D, True, N)
    ctas = B * H * -(-N // (consumers * block_m))
    paired = hf.pairs_query_blocks(True, -(-N // (consumers * block_m)), B * H, D, consumers, q.device)
    times, outs = [], {}
    for rule in (True, False, False, True):
        hf._PAIR_UP_TO_WAVES = RULE if rule else 0
        times.append(do_bench_cudagraph(run))
        outs[rule] = run()
    hf._PAIR_UP_TO_WAVES = RULE
    torch.cuda.synchronize()
    diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(outs[True], outs[False]))
    t0, t1 = (times[0] + times[3]) / 2, (times[1] + times[2]) / 2
    print(f"B{B} H{H} N{N} D{D} causal,{ctas},{ctas / (3 * torch.cuda.get_device_properties(0).multi_processor_count):.1f},"
          f"{paired}," + ",".join(f"{t:.4f}" for t in (times[0], times[1], times[3], times[2]))
          + f",{t1 / t0:.3f},{diff:.2e}", flush=True)
