"""Helpers this folder's device probes share (H100, 2026-11-26, ninth session): inputs of a causal attention with an
optional sliding window (ours and FlexAttention's statement of it), per-kernel GPU times from the profiler, and the
captured launches of one backward, to relaunch its kernels alone. (The probes ran with these parts inline; they
moved here afterwards, unchanged in what they build and measure.)"""
import contextlib

import torch
from torch.nn.attention.flex_attention import create_block_mask
from torch.profiler import ProfilerActivity, profile

from fuse_attn.kernels import flash_attention, launch
from fuse_attn.spec import AttentionSpec, CausalMask


def causal_case(B, H, N, D, window=None):
    """bf16 q, k, v (requiring grad) and dO, our spec and FlexAttention's block mask: causal, within ``window`` keys."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask(window=window))
    width = window or N + 1
    block_mask = create_block_mask(lambda b, h, m, n: (m >= n) & (m - n < width), None, None, N, N)
    return q, k, v, torch.randn_like(q), spec, block_mask


def kernel_times(step, calls: int = 5) -> dict:
    """GPU microseconds per call of each kernel that ``step()`` launches (two warm-up calls first)."""
    step()
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / calls for e in prof.key_averages() if e.device_time_total > 0}


@contextlib.contextmanager
def _recording(into: list):
    launch_kernel = launch.launch
    launch.launch = lambda kernel, grid, args, cfg=None, warmup=False: (
        into.append((kernel, grid, args, cfg)), launch_kernel(kernel, grid, args, cfg, warmup))[1]
    try:
        yield launch_kernel
    finally:
        launch.launch = launch_kernel


def backward_launches(q, k, v, do, spec) -> dict:
    """{kernel name: a function relaunching it as our backward launched it, given argument overrides}, and the
    launch's (grid, args, config) under "<name>.launch"."""
    out = flash_attention(q, k, v, spec)
    launches = []
    with _recording(launches) as launch_kernel:
        out.backward(do)
        torch.cuda.synchronize()
    found = {}
    for kernel, grid, args, cfg in launches:
        name = kernel.fn.__name__
        found[name] = (lambda kernel=kernel, grid=grid, args=args, cfg=cfg, **changes:
                       launch_kernel(kernel, grid, dict(args, **changes), cfg))
        found[name + ".launch"] = (kernel, grid, args, cfg)
    return found
