"""Where the eager Gluon forward+backward step's host time goes beyond its two ops' (call 1: 1.29 ms a step against
0.20 + 0.26 ms for the ops): (1) host cost a call at a tiny shape, where the GPU's time cannot hold the host up;
(2) a step under torch.cuda.set_sync_debug_mode("error"): any op that synchronizes with the GPU raises, with its
traceback; (3) torch.profiler over 5 steps at B16 H16 N1024 D64 causal: host-side ops by self time, and the CUDA
runtime calls that wait. Run from the repository root on an H100/H200:  python3 host_trace.py"""
import time
import traceback

import torch
import triton

from fuse_attn.kernels import hopper_backward as hb
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

CALLS = 40


def host_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / CALLS * 1e6


def case(B, N, D, causal):
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                         causal=CausalMask() if causal else None)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    text = spec.to_json()

    def step():
        torch.autograd.grad(hf.flash_attention_hopper(*leaves, text), leaves, dout)
    return spec, text, q, k, v, dout, leaves, step


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    for B, N, D, causal in ((1, 128, 64, True), (1, 128, 128, False), (16, 1024, 64, True)):
        spec, text, q, k, v, dout, leaves, step = case(B, N, D, causal)
        out, lse = hf.hopper_forward(q, k, v, spec)
        with torch.no_grad():
            fwd = host_us(lambda: torch.ops.fuse_attn.flash_attention_hopper(q, k, v, text))
        bwd = host_us(lambda: torch.ops.fuse_attn.flash_attention_hopper_backward(dout, q, k, v, out, lse, text))
        launcher = host_us(lambda: hb.hopper_backward(dout, q, k, v, out, lse, spec))
        full = host_us(step)
        print(f"B{B} H16 N{N} D{D} {'causal' if causal else 'unmasked'}: host us a call: forward op {fwd:.1f}, "
              f"backward op {bwd:.1f} (launcher {launcher:.1f}), eager step {full:.1f}", flush=True)

    spec, text, q, k, v, dout, leaves, step = case(16, 1024, 64, True)
    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
        print("sync debug mode: no synchronizing op in a step", flush=True)
    except RuntimeError:
        print("sync debug mode: a step synchronizes:\n" + traceback.format_exc()[-3000:], flush=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70),
          flush=True)
    waits = [e for e in prof.events() if any(w in e.name for w in ("Synchronize", "Memcpy", "cudaFree", "cudaMalloc",
                                                                   "EventQuery", "StreamWait"))]
    print("CUDA runtime calls that may wait:", sorted({(e.name, round(e.cpu_time_total, 1)) for e in waits})[:40],
          flush=True)


if __name__ == "__main__":
    main()
