"""Where the per-program cost of the backward kernels goes (window 512, causal, B4 H16 N4096 D128 bf16):
kernel time against program count (B), compiled metadata (registers, spills, shared memory), and relaunches of
the captured dQ / dK/dV launches with head_group 1."""
import torch, triton
from tabulate import tabulate
from torch.nn.attention.flex_attention import flex_attention
from fuse_attn.kernels import flash_attention, autotune
from probe_common import backward_launches, causal_case, kernel_times
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
flex_c = torch.compile(flex_attention)
H, N, D = 16, 4096, 128
bench = lambda f: triton.testing.do_bench(f, warmup=25, rep=200)

rows = []
for window in (128, 512, None):
    for B in (2, 4, 8):
        q, k, v, do, spec, bm = causal_case(B, H, N, D, window)
        ours = kernel_times(lambda: flash_attention(q, k, v, spec).backward(do))
        flex = kernel_times(lambda: flex_c(q, k, v, block_mask=bm).backward(do))
        fb = sum(us for name, us in flex.items() if "flex_attention_backward" in name)
        ff = sum(us for name, us in flex.items() if "flex_attention" in name and "backward" not in name)
        extra = ""
        if B == 4:
            # relaunch dQ and dK/dV as launched, and with head_group 1 (programs in plain block order)
            relaunch = backward_launches(q, k, v, do, spec)
            for name in ("_attn_bwd_dq", "_attn_bwd_dkdv"):
                kern, grid, args, cfg = relaunch[name + ".launch"]
                t0 = bench(lambda: relaunch[name]())
                t1 = bench(lambda: relaunch[name](head_group=1))
                compiled = [c for c in kern.device_caches[0][0].values()]
                meta = "; ".join(f"{c.metadata.num_warps}w{c.metadata.num_stages}s regs {c.n_regs} spills {c.n_spills} smem {c.metadata.shared}"
                                 for c in compiled if c.metadata.num_warps == cfg.num_warps and c.metadata.num_stages == cfg.num_stages)
                extra += f" | {name} {cfg}: {t0*1000:.1f} us, head_group 1: {t1*1000:.1f} us (was {args['head_group']}); {meta}"
        rows.append([window, B, f"{ours.get('_attn_fwd', 0):.1f}", f"{ours.get('_attn_bwd_dq', 0):.1f}",
                     f"{ours.get('_attn_bwd_dkdv', 0):.1f}", f"{ff:.1f}", f"{fb:.1f}"])
        print(rows[-1], extra, flush=True)
        autotune._chosen.clear()
print(tabulate(rows, headers=["window", "B", "fwd us", "dQ us", "dKdV us", "flex fwd us", "flex bwd us (+pre)"]))
