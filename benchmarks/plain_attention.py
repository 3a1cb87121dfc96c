"""Plain attention as fuse_attn launches it on Hopper -- the Gluon forward and backward ops
(``torch.ops.fuse_attn.flash_attention_hopper``), the tile config the product picks (``forward_config``) -- against
SDPA's cuDNN kernel: forward and forward+backward, unmasked and causal, GPU time of a CUDA-graph replay
(``triton.testing.do_bench_cudagraph``, median) and the wall time of an eager call (``do_bench``, host cost
included). B * N = --batch-tokens, bf16, random normal inputs.

    PYTHONPATH=. python3 benchmarks/plain_attention.py --out OUTDIR [--lengths 1024 2048 4096 16384]
                                                       [--head-dims 64 128] [--heads 16] [--kv-heads H_KV]
                                                       [--batch-tokens 16384]

Rows are appended to OUTDIR/plain_attention.csv (one per implementation; our row's ``ratio`` is cuDNN's GPU time /
ours; ``tflops`` counts :func:`tools.bench_csv.attention_flops`) with the GPU's name, the torch and triton versions and
the date; ``tools/bench_csv.py`` appends them to benchmarks/results.csv. Needs an sm90 GPU (H100, H200).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench, do_bench_cudagraph

if __package__ in (None, ""):  # run as a script: the repository root holds fuse_attn and tools
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fuse_attn.spec import AttentionSpec, CausalMask  # noqa: E402
from tools.bench_csv import appending, attention_flops  # noqa: E402

COLUMNS = ["B", "H", "H_kv", "N", "D", "causal", "mode", "implementation", "config", "gpu_ms", "wall_ms", "tflops",
           "ratio", "gpu", "torch", "triton", "date"]


def times(fn, q, k, v, dout):
    """{mode: (GPU ms of a CUDA-graph replay, wall ms of an eager call)} of the forward and forward+backward."""
    out = {}
    with torch.no_grad():
        forward = lambda: fn(q, k, v)  # noqa: E731
        forward()
        out["fwd"] = (do_bench_cudagraph(forward, rep=100), do_bench(forward, rep=100))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    def step():
        torch.autograd.grad(fn(*leaves), leaves, dout)

    step()
    out["fwd+bwd"] = (do_bench_cudagraph(step, rep=100), do_bench(step, rep=100))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--lengths", nargs="*", type=int, default=[1024, 2048, 4096, 16384])
    ap.add_argument("--head-dims", nargs="*", type=int, default=[64, 128])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=None, help="key/value heads (GQA); default --heads")
    ap.add_argument("--batch-tokens", type=int, default=16384, help="B * N; B = max(1, this // N)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("needs an sm90 GPU (H100, H200): the Gluon kernels are Hopper's", file=sys.stderr)
        return 2
    from fuse_attn.kernels.hopper.forward import flash_attention_hopper, forward_config

    gpu = torch.cuda.get_device_name()
    run_info = [gpu, torch.__version__, triton.__version__, datetime.date.today().isoformat()]
    print(f"{gpu}, torch {torch.__version__}, triton {triton.__version__}; cuDNN GPU time / ours")
    os.makedirs(args.out, exist_ok=True)
    H = args.heads
    H_kv = args.kv_heads or H
    if H % H_kv:
        ap.error(f"--heads {H} is not a multiple of --kv-heads {H_kv}")
    with appending(os.path.join(args.out, "plain_attention.csv"), COLUMNS, run_info) as record:
        for D in args.head_dims:
            for N in args.lengths:
                B = max(1, args.batch_tokens // N)
                for causal in (False, True):
                    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                                         causal=CausalMask() if causal else None, gqa_group=H // H_kv)
                    text = spec.to_json()
                    gen = torch.Generator(device="cuda").manual_seed(0)
                    q, k, v, dout = (torch.randn(B, heads, N, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                                     for heads in (H, H_kv, H_kv, H))

                    def ours(q, k, v):
                        return flash_attention_hopper(q, k, v, text)

                    def cudnn(q, k, v):
                        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=spec.scale,
                                                                  enable_gqa=H_kv != H)

                    mine, theirs = times(ours, q, k, v, dout), times(cudnn, q, k, v, dout)
                    config = str(forward_config(D, causal, N))
                    for mode in ("fwd", "fwd+bwd"):
                        (g, gw), (c, cw) = mine[mode], theirs[mode]
                        shape = [B, H, H_kv, N, D, int(causal), mode]
                        flops = attention_flops(B, H, N, D, causal, mode == "fwd+bwd")
                        rate = [flops / ms / 1e9 for ms in (g, c)]
                        record(shape + ["fuse_attn", config, f"{g:.4f}", f"{gw:.4f}", f"{rate[0]:.1f}",
                                        f"{c / g:.3f}"])
                        record(shape + ["cudnn", "", f"{c:.4f}", f"{cw:.4f}", f"{rate[1]:.1f}", ""])
                        name = "causal" if causal else "unmasked"
                        print(f"B{B} H{H}/{H_kv} N{N} D{D} {name} {mode}: ours {g:.4f} ms ({rate[0]:.0f} TF/s), "
                              f"cuDNN {c:.4f} ms ({rate[1]:.0f} TF/s), {c / g:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
