"""Per-kernel GPU time (profiler, 5 calls) of bench_variants' variants under fuse_attn and flex, fwd and fwd+bwd,
plus the tuner's time of every candidate config (DEBUG log) with registers / spills of the compiled kernels.
usage: python3 .gpu/prof_variant.py VARIANT [VARIANT ...]"""
import logging, os, sys, time
sys.path.insert(0, ".")
import torch, triton
from torch.profiler import profile, ProfilerActivity
import fuse_attn  # noqa
from tools.bench_variants import VARIANTS, DTYPE, make_methods
from tools.bench_host_overhead import random_inputs
from tools.profile_kernels import TimingLog, compiled_variants, KERNELS
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
timing = TimingLog()
lg = logging.getLogger("fuse_attn.kernels.autotune"); lg.setLevel(logging.DEBUG); lg.addHandler(timing)
from fuse_attn.kernels import codegen  # noqa


def prof(tag, step):
    step(); torch.cuda.synchronize()
    ms = triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median")
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / 5, e.count // 5) for e in p.key_averages()
            if e.device_time_total > 0 and e.device_type == torch.autograd.DeviceType.CUDA]
    rows.sort(key=lambda r: -r[1])
    print(f"[{tag}] do_bench {ms:.3f} ms; kernels sum {sum(r[1] for r in rows):.1f} us", flush=True)
    for name, us, n in rows[:10]:
        print(f"[{tag}] {us:9.1f} us x{n}  {name[:100]}", flush=True)


for name in sys.argv[1:]:
    v = VARIANTS[name]
    size = v.default
    for mode in ("fwd", "fwd+bwd"):
        backward = mode == "fwd+bwd"
        torch._dynamo.reset()
        torch.manual_seed(0)
        with torch.device("cuda"):
            module = VARIANTS[name].module(size).to(DTYPE)
        q, k, vv, dout = random_inputs(size.batch, size.heads, size.seq, size.head_dim, DTYPE, backward)
        extra = module.extra_inputs(q.device)
        methods = make_methods(module, q, k, vv, extra)
        for method in os.environ.get("METHODS", "fuse_attn flex").split():
            fn = methods[method]
            def step():
                for t in (q, k, vv):
                    t.grad = None
                if backward:
                    fn(q, k, vv).backward(dout)
                else:
                    with torch.no_grad():
                        fn(q, k, vv)
            prof(f"{name} {mode} {method}", step)
    # the tuner's times and the compiled kernels' registers / spills
    print(f"--- {name}: tuner times (ms) per config", flush=True)
    for (kind, cfg), ms in sorted(timing.ms.items(), key=lambda x: (x[0][0], x[1])):
        print(f"  {kind:10s} {cfg:50s} {ms:.4f}", flush=True)
    timing.ms.clear()
    for key, mod in list(codegen._modules.items()):
        for kind, kname in KERNELS.items():
            if not hasattr(mod, kname):
                continue
            for text, part, compiled in compiled_variants(getattr(mod, kname), 0):
                if getattr(compiled, "n_regs", None) is None:
                    continue
                print(f"  regs {key[0][:10]} {kind:9s} {text:45s} {part:3s} regs {compiled.n_regs} spills {compiled.n_spills}"
                      f" smem {compiled.metadata.shared // 1024} KiB", flush=True)
    codegen._modules.clear()
