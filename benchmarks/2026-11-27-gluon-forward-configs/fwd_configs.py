"""The Gluon forward (fuse_attn/kernels/hopper_forward.py) at other tile configs than its _CONFIGS: two or three
consumer warpgroups, 64- or 128-key tiles, ring depth. Output (the tests' 2x rule) and lse (1e-4) against fp64, then
GPU time (CUDA-graph replay) against SDPA cuDNN in the same run.

    python3 fwd_configs.py check bench [N ...]  # every candidate at odd and long shapes; then B * N = 16384, H16, bf16
    python3 fwd_configs.py probe D a,b,c,d      # one small forward at that config (run first in a subprocess with a
                                                # timeout: a config that does not finish in a minute is left out)
A config is (rows per consumer warpgroup, key tile, ring stages, consumer warpgroups).
"""
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph

from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.kernels import reference_attention
from fuse_attn.spec import AttentionSpec, CausalMask
from test_kernels import assert_close_2x

CANDIDATES = {64: [(64, 128, 4, 2), (64, 128, 2, 3), (64, 128, 3, 3), (64, 64, 4, 3), (64, 64, 6, 3)],
              128: [(64, 128, 3, 2), (64, 64, 4, 3), (64, 64, 5, 3)]}


def spec_of(D, causal, group=1):
    return AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                         causal=CausalMask() if causal else None, gqa_group=group)


def with_config(cfg, fn):
    """fn() with the Gluon forward launched at cfg for every call."""
    saved = hf.forward_config
    hf.forward_config = lambda head_dim, causal, rows: cfg
    try:
        return fn()
    finally:
        hf.forward_config = saved


def probe(D, cfg):
    spec = spec_of(D, True)
    q, k, v = (torch.randn(1, 4, 1000, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with_config(cfg, lambda: hf.hopper_forward(q, k, v, spec))
    torch.cuda.synchronize()


def finishing(candidates):
    """The candidates whose small forward finishes within 60 s in a subprocess (others printed as HANG); the
    subprocesses run side by side."""
    runs = {(D, cfg): subprocess.Popen([sys.executable, __file__, "probe", str(D), ",".join(map(str, cfg))],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for D, cfgs in candidates.items() for cfg in cfgs}
    start, kept = time.time(), {}
    for (D, cfg), run in runs.items():
        try:
            _, err = run.communicate(timeout=max(1.0, 60 - (time.time() - start)))
            status = "ok" if run.returncode == 0 else f"rc {run.returncode}: {err[-300:]}"
        except subprocess.TimeoutExpired:
            run.kill()
            status = "HANG (killed after 60 s)"
        print(f"probe D{D} {cfg}: {status}", flush=True)
        if status == "ok":
            kept.setdefault(D, []).append(cfg)
    return kept


def check():
    bad = 0
    for D in CANDIDATES:
        for B, H, N, causal, group in ((1, 4, 4096, True, 2), (2, 4, 1025, False, 1), (2, 2, 97, True, 1),
                                       (3, 2, 17, False, 1), (2, 2, 1, True, 1), (1, 8, 1000, True, 4)):
            spec = spec_of(D, causal, group)
            g = torch.Generator(device="cuda").manual_seed(N)
            q = torch.randn(B, H, N, D, device="cuda", generator=g, dtype=torch.bfloat16)
            k, v = (torch.randn(B, H // group, N, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
            ref, ref_lse = reference_attention(q.double(), k.double(), v.double(), [], spec)
            eager, _ = reference_attention(q, k, v, [], spec)
            for cfg in CANDIDATES[D]:
                out, lse = with_config(cfg, lambda: hf.hopper_forward(q, k, v, spec))
                what = f"{cfg} B{B} H{H} N{N} D{D} causal={causal} G{group}"
                try:
                    assert_close_2x(what + " out", out, ref, eager, torch.bfloat16)
                    torch.testing.assert_close(lse.double(), ref_lse.double(), rtol=0, atol=1e-4)  # the tests' rule
                except AssertionError as e:
                    bad += 1
                    print(f"check {what}: FAIL {str(e)[:300]}", flush=True)
    print("all checks PASS" if not bad else f"{bad} CHECKS FAILED", flush=True)


def bench(lengths):
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    print("shape,config,gpu_ms,tflops,vs_cudnn", flush=True)
    for D in CANDIDATES:
        for N in lengths:
            B = max(1, 16384 // N)
            for causal in (False, True):
                spec = spec_of(D, causal)
                gen = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                           for _ in range(3))
                shape = f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'}"
                flops = 4 * B * 16 * N * N * D / (2 if causal else 1)

                def cudnn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=spec.scale)

                base = do_bench_cudagraph(cudnn)
                print(f"{shape},cuDNN,{base:.4f},{flops / base * 1e-9:.0f},1.00", flush=True)
                for cfg in CANDIDATES[D]:
                    run = lambda cfg=cfg: with_config(cfg, lambda: hf.hopper_forward(q, k, v, spec))  # noqa: E731
                    run()
                    ms = do_bench_cudagraph(run)
                    print(f"{shape},{cfg},{ms:.4f},{flops / ms * 1e-9:.0f},{base / ms:.2f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "probe":
        probe(int(sys.argv[2]), tuple(int(x) for x in sys.argv[3].split(",")))
    else:
        CANDIDATES = finishing(CANDIDATES)
        if "check" in sys.argv[1:]:
            check()
        if "bench" in sys.argv[1:]:
            bench([int(n) for n in sys.argv[2:] if n.isdigit()] or [1024, 4096, 16384])
