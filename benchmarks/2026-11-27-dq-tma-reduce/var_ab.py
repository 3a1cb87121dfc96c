"""Backward variants (.gpu/v15/var/<name>.py) against the package's hopper_backward: same inputs, results compared
with the package's (max abs diff), CUDA-graph GPU time, B*N = 16384, H16, bf16.
    python3 var_ab.py NAME [NAME ...] -- D:N:causal ...
"""
import importlib.util, sys
import torch, triton
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_backward as hb, hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

names = sys.argv[1:sys.argv.index("--")]
shapes = [tuple(int(x) for x in a.split(":")) for a in sys.argv[sys.argv.index("--") + 1:]]
mods = {"package": hb}
for name in names:
    s = importlib.util.spec_from_file_location(name, f".gpu/v15/var/{name}.py")
    mods[name] = importlib.util.module_from_spec(s); s.loader.exec_module(mods[name])
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("shape," + ",".join(f"{n}_ms" for n in mods) + "," + ",".join(f"{n}_vs_package" for n in names) + ",max_abs_diff", flush=True)
for D, N, causal in shapes:
    B = 16384 // N
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask() if causal else None)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    out, lse = hf.hopper_forward(q, k, v, spec)
    runs = {n: (lambda m=m: m.hopper_backward(dout, q, k, v, out, lse, spec.scale, bool(causal), 1)) for n, m in mods.items()}
    ref = runs["package"]()
    diff = max((a.float() - b.float()).abs().max().item() for n in names for a, b in zip(ref, runs[n]()))
    ts = {n: do_bench_cudagraph(fn) for n, fn in runs.items()}
    print(f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'}," + ",".join(f"{t:.4f}" for t in ts.values()) + ","
          + ",".join(f"{ts['package'] / ts[n]:.3f}" for n in names) + f",{diff:.2e}", flush=True)
