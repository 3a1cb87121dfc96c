"""Where the per-program cost of the backward kernels goes (window 512, causal, B4 H16 N4096 D128 bf16):
kernel time against program count (B), compiled metadata (registers, spills, shared memory), and relaunches of
the captured dQ / dK/dV launches with head_group 1."""
import torch, triton
from torch.profiler import profile, ProfilerActivity
from tabulate import tabulate
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
from fuse_attn.kernels import flash_attention, launch, autotune
from fuse_attn.spec import AttentionSpec, CausalMask
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
flex_c = torch.compile(flex_attention)
H, N, D = 16, 4096, 128
bench = lambda f: triton.testing.do_bench(f, warmup=25, rep=200)

def kernels(step):
    step(); step(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / 5 for e in p.key_averages() if e.device_time_total > 0}

rows = []
for window in (128, 512, None):
    for B in (2, 4, 8):
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn_like(q)
        spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask(window=window))
        ours = kernels(lambda: flash_attention(q, k, v, spec).backward(do))
        w = window or N + 1
        bm = create_block_mask(lambda b, h, m, n: (m >= n) & (m - n < w), None, None, N, N)
        flex = kernels(lambda: flex_c(q, k, v, block_mask=bm).backward(do))
        fb = sum(us for name, us in flex.items() if "flex_attention_backward" in name)
        ff = sum(us for name, us in flex.items() if "flex_attention" in name and "backward" not in name)
        extra = ""
        if B == 4:
            # capture the launches; relaunch dQ and dK/dV with head_group 1 (programs in plain block order)
            rec, orig = [], launch.launch
            launch.launch = lambda kern, grid, args, cfg=None, warmup=False: (rec.append((kern, grid, args, cfg)), orig(kern, grid, args, cfg, warmup))[1]
            out = flash_attention(q, k, v, spec); rec.clear(); out.backward(do); torch.cuda.synchronize()
            launch.launch = orig
            for kern, grid, args, cfg in rec:
                name = kern.fn.__name__
                t0 = bench(lambda: orig(kern, grid, args, cfg))
                t1 = bench(lambda: orig(kern, grid, dict(args, head_group=1), cfg))
                compiled = [c for c in kern.device_caches[0][0].values()]
                meta = "; ".join(f"{c.metadata.num_warps}w{c.metadata.num_stages}s regs {c.n_regs} spills {c.n_spills} smem {c.metadata.shared}"
                                 for c in compiled if c.metadata.num_warps == cfg.num_warps and c.metadata.num_stages == cfg.num_stages)
                extra += f" | {name} {cfg}: {t0*1000:.1f} us, head_group 1: {t1*1000:.1f} us (was {args['head_group']}); {meta}"
        rows.append([window, B, f"{ours.get('_attn_fwd', 0):.1f}", f"{ours.get('_attn_bwd_dq', 0):.1f}",
                     f"{ours.get('_attn_bwd_dkdv', 0):.1f}", f"{ff:.1f}", f"{fb:.1f}"])
        print(rows[-1], extra, flush=True)
        autotune._chosen.clear()
print(tabulate(rows, headers=["window", "B", "fwd us", "dQ us", "dKdV us", "flex fwd us", "flex bwd us (+pre)"]))
