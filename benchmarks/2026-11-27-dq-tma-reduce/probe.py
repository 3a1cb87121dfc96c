"""Fifteenth session's first device probe.
  ablate: the backward's timing-only variants (make_bwd_variants.py) against the base; CUDA-graph GPU time
  host:   where the Gluon forward op's host time goes (tiny shape, wall per call)
  prof:   one launch each of ours and cuDNN's kernels, for ncu (NVTX range 'prof')
"""
import importlib.util, sys, time
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_backward as hb, hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

def spec_of(D, causal):
    return AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask() if causal else None)

def inputs(B, H, N, D):
    g = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4)]

def cudnn(q, k, v, causal, scale):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

def ablate():
    mods = {}
    for name in ("base", "store_not_atomic", "no_dq_traffic", "no_exp"):
        s = importlib.util.spec_from_file_location(name, f".gpu/v15/var/{name}.py")
        mods[name] = importlib.util.module_from_spec(s); s.loader.exec_module(mods[name])
    print("shape," + ",".join(f"{n}_ms" for n in mods) + ",cudnn_bwd_ms", flush=True)
    for D, N, causal in ((128, 4096, False), (128, 4096, True), (128, 16384, False), (64, 4096, False), (64, 4096, True)):
        B = 16384 // N
        spec = spec_of(D, causal)
        q, k, v, dout = inputs(B, 16, N, D)
        out, lse = hf.hopper_forward(q, k, v, spec)
        ts = [do_bench_cudagraph(lambda m=m: m.hopper_backward(dout, q, k, v, out, lse, spec.scale, causal, 1))
              for m in mods.values()]
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        full = do_bench_cudagraph(lambda: torch.autograd.grad(cudnn(*leaves, causal, spec.scale), leaves, dout))
        with torch.no_grad():
            fwd = do_bench_cudagraph(lambda: cudnn(q, k, v, causal, spec.scale))
        print(f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'}," + ",".join(f"{t:.4f}" for t in ts)
              + f",{full - fwd:.4f}", flush=True)

def host():
    spec = spec_of(64, False)
    q, k, v, _ = inputs(1, 1, 128, 64)
    def wall(fn, n=2000):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e6
    bm, bn, st, cons = hf.forward_config(64, False, 128)
    out = torch.empty_like(q); lse = torch.empty(1, 1, 128, device="cuda")
    descs = [hf._descriptor(t, r) for t, r in ((q, bm), (k, bn), (v, bn), (out, bm))]
    launch = lambda: hf._hopper_attn_fwd[(1, 1)](*descs, lse, 1, 128, 128, 0.18, 1, False, bm, bn, 64, st, cons,
                                                 *hf._REGISTERS[cons], num_warps=4)
    rows = {
        "flash_attention_hopper (public fn, autograd off)": lambda: hf.flash_attention_hopper(q, k, v, spec),
        "hopper_forward (launcher)": lambda: hf.hopper_forward(q, k, v, spec),
        "4 descriptors": lambda: [hf._descriptor(t, r) for t, r in ((q, bm), (k, bn), (v, bn), (out, bm))],
        "2 torch.empty": lambda: (torch.empty_like(q), torch.empty(1, 1, 128, device="cuda")),
        "kernel launch, descriptors built": launch,
        "cudnn sdpa": lambda: cudnn(q, k, v, False, 0.125),
    }
    with torch.no_grad():
        for name, fn in rows.items():
            print(f"host,{name},{wall(fn):.1f} us", flush=True)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q)
    print(f"host,fwd+bwd eager ours,{wall(lambda: torch.autograd.grad(hf.flash_attention_hopper(qg, kg, vg, spec), (qg, kg, vg), dout), 500):.1f} us")
    print(f"host,fwd+bwd eager cudnn,{wall(lambda: torch.autograd.grad(cudnn(qg, kg, vg, False, 0.125), (qg, kg, vg), dout), 500):.1f} us")
    o, l = hf.hopper_forward(q, k, v, spec)
    print(f"host,hopper_backward (launcher),{wall(lambda: hb.hopper_backward(dout, q, k, v, o, l, 0.125, False, 1)):.1f} us")

def prof(what):
    for D, N, causal in [tuple(int(x) for x in w.split(":")) for w in what.split(",")]:
        B = 16384 // N
        spec = spec_of(D, causal)
        q, k, v, dout = inputs(B, 16, N, D)
        out, lse = hf.hopper_forward(q, k, v, spec)
        hb.hopper_backward(dout, q, k, v, out, lse, spec.scale, bool(causal), 1)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        torch.autograd.grad(cudnn(*leaves, bool(causal), spec.scale), leaves, dout)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(f"prof")
        hf.hopper_forward(q, k, v, spec)
        hb.hopper_backward(dout, q, k, v, out, lse, spec.scale, bool(causal), 1)
        torch.autograd.grad(cudnn(*leaves, bool(causal), spec.scale), leaves, dout)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()

if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    {"ablate": ablate, "host": host}.get(sys.argv[1], lambda: prof(sys.argv[2]))()
