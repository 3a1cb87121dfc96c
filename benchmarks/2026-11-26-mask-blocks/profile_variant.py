# Profile tools/bench_variants.py's padding_causal_mask_input under fuse_attn: per-kernel GPU time, forward and
# forward+backward (run from the repository root: python3 benchmarks/2026-11-26-mask-blocks/profile_variant.py fwd fwdbwd).
import os, sys, time, faulthandler
faulthandler.dump_traceback_later(int(os.environ.get("FH_SECONDS", "200")), exit=True)
sys.path.insert(0, ".")
import torch, triton
import fuse_attn  # noqa
from tools.bench_variants import VARIANTS, DTYPE
from torch.profiler import profile, ProfilerActivity

torch.manual_seed(0)
dev = "cuda"
v = VARIANTS["padding_causal_mask_input"]
size = v.default
mod = v.module(size).to(dev)
q, k, vv = (torch.randn(size.batch, size.heads, size.seq, size.head_dim, device=dev, dtype=DTYPE) for _ in range(3))
(mask,) = mod.extra_inputs(dev)
os.environ["FUSE_ATTN_CANDIDATES"] = "triton"
cm = torch.compile(mod, backend="fuse_attn")
tag = "off" if os.environ.get("FUSE_ATTN_MASK_BLOCKS") == "0" else "on"
for mode in sys.argv[1:]:
    grad = mode == "fwdbwd"
    qq, kk, vvv = (t.clone().requires_grad_(grad) for t in (q, k, vv))
    def step():
        if grad:
            out = cm(qq, kk, vvv, mask)
            out.sum().backward()
        else:
            with torch.no_grad():
                cm(qq, kk, vvv, mask)
    t0 = time.time(); step(); torch.cuda.synchronize(); print(f"[{tag} {mode}] first call {time.time()-t0:.1f} s", flush=True)
    ms = triton.testing.do_bench(step)
    print(f"[{tag} {mode}] do_bench {ms:.3f} ms", flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / 5, e.count // 5) for e in p.key_averages() if e.device_time_total > 0 and e.device_type == torch.autograd.DeviceType.CUDA]
    rows.sort(key=lambda r: -r[1])
    for name, us, n in rows[:14]:
        print(f"[{tag} {mode}] {us:9.1f} us x{n}  {name[:110]}")
