"""Per-kernel GPU time (torch.profiler, fwd+bwd, 5 calls) of fuse_attn and FlexAttention on bench_variants' rows."""
import sys
sys.path.insert(0, ".")
import torch, triton
import fuse_attn  # noqa
from torch.profiler import profile, ProfilerActivity
from tools.bench_variants import VARIANTS, DTYPE, make_methods, random_inputs
from fuse_attn.kernels import autotune
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
for name in sys.argv[1:]:
    torch._dynamo.reset(); torch.manual_seed(0)
    size = VARIANTS[name].default
    with torch.device("cuda"):
        module = VARIANTS[name].module(size).to(DTYPE)
    q, k, v, dout = random_inputs(size.batch, size.heads, size.seq, size.head_dim, DTYPE, True)
    if size.group > 1:
        k, v = (x[:, :size.kv_heads].detach().clone().requires_grad_(True) for x in (k, v))
    extra = module.extra_inputs(q.device)
    methods = make_methods(module, q, k, v, extra)
    for method in ("fuse_attn", "flex"):
        fn = methods[method]
        step = lambda: fn(q, k, v).backward(dout)
        step(); step(); torch.cuda.synchronize()
        ms = triton.testing.do_bench(step, rep=200)
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        rows = [(e.key, e.device_time_total / 5, e.count // 5) for e in p.key_averages()
                if e.device_time_total > 0 and e.device_type == torch.autograd.DeviceType.CUDA]
        rows.sort(key=lambda r: -r[1])
        total = sum(r[1] for r in rows)
        print(f"== {name} {method}: do_bench {ms:.3f} ms, kernels {total/1000:.3f} ms per call", flush=True)
        for kname, us, n in rows[:8]:
            print(f"   {us:9.1f} us x{n}  {kname[:120]}")
    for key, cfg in autotune.chosen_configs().items():
        print("   chosen", key.kind, cfg)
    autotune._chosen.clear()
