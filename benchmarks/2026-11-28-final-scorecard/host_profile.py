"""Host cost of the Gluon ops, split: per call, the time the host takes to issue each piece (perf_counter over 40
back-to-back calls, few enough that the launch queue never fills and blocks; the GPU synchronized before and after),
then cProfile of 100 eager forward+backward steps. SDPA cuDNN's eager calls beside. H16, bf16. Run from the
repository root on an H100/H200:  python3 host_profile.py"""
import cProfile
import io
import pstats
import time

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

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


class Recorded:
    """A kernel object that records its launch's grid and arguments, then launches."""

    def __init__(self, kernel, calls):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((grid, args, kwargs))
            return self.kernel[grid](*args, **kwargs)
        return launch


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    for B, N, D, causal in ((16, 1024, 64, True), (16, 1024, 128, False)):
        spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                             causal=CausalMask() if causal else None)
        text = spec.to_json()
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, dout = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out, lse = hf.hopper_forward(q, k, v, spec)
        rows = {}

        def step():
            torch.autograd.grad(hf.flash_attention_hopper(*leaves, text), leaves, dout)

        def cudnn(q, k, v):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=spec.scale)

        def cudnn_step():
            torch.autograd.grad(cudnn(*leaves), leaves, dout)

        with torch.no_grad():
            rows["eager forward (flash_attention_hopper)"] = host_us(lambda: hf.flash_attention_hopper(q, k, v, text))
            rows["forward op (torch.ops...flash_attention_hopper)"] = host_us(
                lambda: torch.ops.fuse_attn.flash_attention_hopper(q, k, v, text))
            rows["hopper_forward() launcher"] = host_us(lambda: hf.hopper_forward(q, k, v, spec))
        rows["eager forward+backward step (autograd.grad)"] = host_us(step)
        rows["backward op (torch.ops...flash_attention_hopper_backward)"] = host_us(
            lambda: torch.ops.fuse_attn.flash_attention_hopper_backward(dout, q, k, v, out, lse, text))
        rows["hopper_backward() launcher"] = host_us(lambda: hb.hopper_backward(dout, q, k, v, out, lse, spec))
        # the kernels' launches alone, with the arguments a launcher gave them
        fwd_calls, bwd_calls = [], []
        real_fwd, real_bwd = hf._hopper_attn_fwd, hb._hopper_attn_bwd
        hf._hopper_attn_fwd, hb._hopper_attn_bwd = Recorded(real_fwd, fwd_calls), Recorded(real_bwd, bwd_calls)
        try:
            hf.hopper_forward(q, k, v, spec)
            hb.hopper_backward(dout, q, k, v, out, lse, spec)
        finally:
            hf._hopper_attn_fwd, hb._hopper_attn_bwd = real_fwd, real_bwd
        for name, kernel, (grid, args, kwargs) in (("forward", real_fwd, fwd_calls[0]),
                                                   ("backward", real_bwd, bwd_calls[0])):
            rows[f"Gluon {name} kernel launch alone"] = host_us(lambda: kernel[grid](*args, **kwargs))
        rows["4 x TMA descriptor"] = host_us(lambda: [hf._descriptor(t, 64) for t in (q, k, v, out)])
        rows["torch.empty out + lse"] = host_us(lambda: (torch.empty_like(q), torch.empty(B, 16, N, device="cuda")))
        with torch.no_grad():
            rows["SDPA cuDNN eager forward"] = host_us(lambda: cudnn(q, k, v))
        rows["SDPA cuDNN eager forward+backward step"] = host_us(cudnn_step)
        print(f"\nB{B} H16 N{N} D{D} {'causal' if causal else 'unmasked'}: host us a call", flush=True)
        for name, us in rows.items():
            print(f"{us:9.1f}  {name}", flush=True)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(100):
            step()
        profile.disable()
        torch.cuda.synchronize()
        text_out = io.StringIO()
        stats = pstats.Stats(profile, stream=text_out)
        stats.sort_stats("tottime").print_stats(25)
        print(text_out.getvalue()[-9000:], flush=True)


if __name__ == "__main__":
    main()
