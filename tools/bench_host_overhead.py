"""Host cost per call of one attention: wall time against GPU time, forward and forward+backward.

    python3 tools/bench_host_overhead.py --out OUTDIR [--shapes 8,12,1024,64 32,12,512,64 1,32,256,128] [--dtype bfloat16]
                                         [--chain 12]

For each shape (causal, nanoGPT-style eager attention: a tril buffer, ``masked_fill(== 0, -inf)``, softmax, ``@ v``)
and each method, two numbers per call:

* **wall**: ``triton.testing.do_bench`` median of back-to-back calls. When the host cannot issue the kernels as fast as
  the GPU runs them, the GPU idles between them and this time grows: it is what a training or inference step pays.
* **GPU**: the same call captured once in a CUDA graph and replayed (median of ``do_bench`` on the replay): the
  kernels' time with no host work at all.

wall / GPU near 1 means the call is GPU-bound. Methods: ``fuse_attn`` (``torch.compile(backend="fuse_attn")`` of the
eager attention: the generated kernels launched from Inductor's code), ``fuse_attn op`` (``fuse_attn.kernels
.flash_attention`` called directly, outside any compiled graph), ``fuse_attn Gluon`` (the same compiled attention with
the Gluon kernels a candidate at any step size, chosen where they time faster: Hopper), ``Gluon op`` (``flash_attention_hopper`` called directly),
``torch.compile`` (Inductor's default on the same eager attention), ``compiled SDPA`` (``torch.compile`` of
``F.scaled_dot_product_attention(is_causal=True)``: the host cost any compiled one-attention graph pays -- Dynamo's
guards, AOTAutograd's wrappers, the autograd node), ``SDPA cuDNN`` and ``SDPA flash`` (the same call eagerly, with
that backend).
With ``--chain K`` each call runs K attentions one after another, each one's output the next one's queries: a
compiled method compiles the K of them as one graph (as a model's layers are), so torch.compile's per-graph cost is
spread over K attentions; an eager method makes K calls. Times are then per attention (the call's over K).
Rows are printed as a table and appended to OUTDIR/bench_host_overhead.csv with the GPU, versions and date.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
from unittest import mock

import torch
import triton
import triton.testing
from tabulate import tabulate

if __package__ in (None, ""):  # run as a script: the repository root holds fuse_attn and tools
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What is measured is the generated kernels' launch path: the compiled attention must not run SDPA's kernel
# instead (fuse_attn.kernels.dispatch), whatever this GPU would time faster. (Only when run: a tool that
# imports from here, tools/bench_variants.py, sets its own.)
if __name__ == "__main__":
    os.environ["FUSE_ATTN_CANDIDATES"] = "triton"
from fuse_attn import settings  # noqa: E402
from fuse_attn.kernels import flash_attention  # noqa: E402
from fuse_attn.kernels import dispatch  # noqa: E402
from fuse_attn.kernels.dispatch import GLUON  # noqa: E402
from fuse_attn.spec import AttentionSpec, CausalMask  # noqa: E402
from tools.bench_csv import appending  # noqa: E402

DEFAULT_SHAPES = [(8, 12, 1024, 64), (32, 12, 512, 64), (1, 32, 256, 128)]
METHODS = ("fuse_attn", "fuse_attn op", "fuse_attn Gluon", "Gluon op", "torch.compile", "compiled SDPA", "SDPA cuDNN",
           "SDPA flash")
CSV_COLUMNS = ["B", "H", "N", "D", "dtype", "mode", "chain", "method", "wall_us", "gpu_us", "gpu", "torch", "triton", "date"]


class CausalAttention(torch.nn.Module):
    """nanoGPT's attention core on [B, H, N, D] inputs: a registered tril buffer, masked_fill(== 0, -inf)."""

    def __init__(self, n: int):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(n, n)).view(1, 1, n, n))

    def forward(self, q, k, v):
        n = q.shape[2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :n, :n] == 0, float("-inf"))
        return torch.softmax(att, dim=-1) @ v


class Chain(torch.nn.Module):
    """``layers`` calls of ``attention`` one after another, each one's output the next one's queries."""

    def __init__(self, attention, layers: int):
        super().__init__()
        self.attention, self.layers = attention, layers

    def forward(self, q, k, v):
        for _ in range(self.layers):
            q = self.attention(q, k, v)
        return q


def _methods(n: int, d: int, dtype: torch.dtype, chain: int = 1) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    from fuse_attn.kernels.hopper.forward import flash_attention_hopper

    core = CausalAttention(n).cuda()
    spec = AttentionSpec(dtype=str(dtype).removeprefix("torch."), head_dim=d, head_dim_v=d, scale=d ** -0.5,
                         causal=CausalMask())

    def sdpa(backend):
        def f(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return f

    def chained(attention):
        return Chain(attention, chain)

    return {
        "fuse_attn": torch.compile(chained(core), backend="fuse_attn"),
        "fuse_attn op": chained(lambda q, k, v: flash_attention(q, k, v, spec)),
        "fuse_attn Gluon": _compiled_choosing(GLUON, chained(CausalAttention(n).cuda())),
        "Gluon op": chained(lambda q, k, v: flash_attention_hopper(q, k, v, spec)),
        "torch.compile": torch.compile(chained(CausalAttention(n).cuda())),
        "compiled SDPA": torch.compile(chained(lambda q, k, v: F.scaled_dot_product_attention(q, k, v,
                                                                                              is_causal=True))),
        "SDPA cuDNN": chained(sdpa(SDPBackend.CUDNN_ATTENTION)),
        "SDPA flash": chained(sdpa(SDPBackend.FLASH_ATTENTION)),
    }


def _compiled_choosing(candidates: str, module: torch.nn.Module):
    """``torch.compile(module, backend="fuse_attn")`` whose attention is chosen among ``candidates`` (the value of
    ``FUSE_ATTN_CANDIDATES`` while the first call compiles it; the generated kernels are always one), with the Gluon
    kernels' step-size gate (``dispatch.GLUON_MIN_STEP_FLOPS``) lifted: the column measures their host cost at any
    size, which is what sets that gate."""
    compiled = torch.compile(module, backend="fuse_attn")
    compiling = [True]

    def call(q, k, v):
        if not compiling:
            return compiled(q, k, v)
        try:
            with mock.patch.dict(os.environ, {settings.CANDIDATES: candidates}), \
                    mock.patch.dict(dispatch.GLUON_MIN_STEP_FLOPS, {False: 0, True: 0}):
                return compiled(q, k, v)
        finally:
            compiling.clear()
    return call


def graph_time_ms(step) -> float:
    """Median ms of one replay of ``step`` captured in a CUDA graph (warmed up on a side stream first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    ms = triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median")
    del graph
    return ms


def random_inputs(B: int, H: int, N: int, D: int, dtype: torch.dtype, backward: bool, seed: int = 0) -> tuple:
    """q, k, v ([B, H, N, D], requiring grad when ``backward``) and dout, normal random values on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype, generator=gen).requires_grad_(backward)
               for _ in range(3))
    return q, k, v, torch.randn(B, H, N, D, device="cuda", dtype=dtype, generator=gen)


def measure(fn, q, k, v, dout, backward: bool) -> tuple[float, float]:
    """(wall ms, GPU ms) per call."""
    def step():
        out = fn(q, k, v)
        if backward:
            out.backward(dout)

    for _ in range(3):  # compile, tune, and reach the steady state outside the timing
        step()
    torch.cuda.synchronize()
    wall = triton.testing.do_bench(step, warmup=25, rep=200, grad_to_none=[q, k, v] if backward else None,
                                   return_mode="median")
    for t in (q, k, v):
        t.grad = None
    return wall, graph_time_ms(step)


def run(shapes, dtype, record, chain: int = 1) -> list:
    rows = []
    for B, H, N, D in shapes:
        methods = _methods(N, D, dtype, chain)
        for mode in ("fwd", "fwd+bwd"):
            backward = mode == "fwd+bwd"
            q, k, v, dout = random_inputs(B, H, N, D, dtype, backward)
            row = [f"{B},{H},{N},{D}", mode]
            for name in METHODS:
                # (each compiled method from its own compile: Dynamo would serve a second instance of a module class
                # the graph the first was compiled to, with that one's attention implementation)
                torch._dynamo.reset()
                try:
                    wall, gpu = (ms / chain for ms in measure(methods[name], q, k, v, dout, backward))
                except Exception as e:  # one method's failure must not hide the others' numbers
                    print(f"{name} {mode} {B},{H},{N},{D} failed: {type(e).__name__}: {e}", flush=True)
                    row.append("error")
                    continue
                record([B, H, N, D, str(dtype).removeprefix("torch."), mode, chain, name, f"{wall * 1e3:.1f}",
                        f"{gpu * 1e3:.1f}"])
                row.append(f"{wall * 1e3:.0f} / {gpu * 1e3:.0f} ({wall / gpu:.2f}x)")
            print(row, flush=True)
            rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--shapes", nargs="*", default=None, help="B,H,N,D ...")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--chain", type=int, default=1, help="attentions a call, one after another (times per attention)")
    args = ap.parse_args(argv)
    shapes = [tuple(map(int, s.split(","))) for s in args.shapes] if args.shapes else DEFAULT_SHAPES
    os.makedirs(args.out, exist_ok=True)
    run_info = [torch.cuda.get_device_name(), torch.__version__, triton.__version__, datetime.date.today().isoformat()]
    with appending(os.path.join(args.out, "bench_host_overhead.csv"), CSV_COLUMNS, run_info) as record:
        rows = run(shapes, getattr(torch, args.dtype), record, args.chain)
    per = "per call" if args.chain == 1 else f"per attention of {args.chain} chained"
    print(f"\n{run_info[0]}, torch {run_info[1]}, triton {run_info[2]}, causal, {args.dtype}; "
          f"{per}: wall us / CUDA-graph GPU us (wall / GPU)")
    print(tabulate(rows, headers=["B,H,N,D", "mode", *METHODS], tablefmt="github"))


if __name__ == "__main__":
    main()
