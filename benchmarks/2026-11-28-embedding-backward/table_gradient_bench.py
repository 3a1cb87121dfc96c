"""The few-row table gradient (fuse_attn/kernels/embedding_backward.py) on the GPU, at T5's shapes: its launch settings
swept, then against eager's ``embedding_dense_backward`` (sort and segment sums), Inductor's decomposition (one atomic
add per value) with and without Inductor's partitioned-scatter pass, and our op compiled. GPU time by CUDA-graph
replay (``do_bench_cudagraph``), wall time of a call (``do_bench``); errors against fp64.

The gradient is laid out as T5's reaches the embedding (the [1, H, N, N] score gradient permuted to [N, N, H]) and
the indices are T5's buckets (32, max distance 128; bidirectional in the encoder, causal in the decoder).

    python3 benchmarks/2026-11-28-embedding-backward/table_gradient_bench.py [--sweep]
"""
import argparse
import itertools

import torch
import triton
from tabulate import tabulate
from torch._inductor import config as inductor_config
from transformers.models.t5.modeling_t5 import T5Attention
from triton.testing import do_bench, do_bench_cudagraph

from fuse_attn.kernels import embedding_backward as eb

ROWS = 32
aten = torch.ops.aten


def t5_case(n, heads, bidirectional, dtype=torch.bfloat16):
    position = torch.arange(n, device="cuda")
    buckets = T5Attention._relative_position_bucket(position[None, :] - position[:, None], bidirectional=bidirectional,
                                                    num_buckets=ROWS, max_distance=128)
    grad = torch.randn(1, heads, n, n, device="cuda", dtype=dtype).permute(2, 3, 1, 0).squeeze(-1)
    return grad, buckets


def errors(out, grad, buckets):
    ref = eb.reference_table_gradient(grad.double().reshape(-1, grad.shape[-1]), buckets.reshape(-1), ROWS, -1)
    return (out.double() - ref).abs().max().item()


def sweep(grad, buckets):
    g2, idx = grad.reshape(-1, grad.shape[-1]), buckets.reshape(-1)
    rows = []
    defaults = eb.BLOCK_P, eb.PROGRAMS_PER_SM
    for block_p, per_sm, warps, stages in itertools.product((128, 256, 512, 1024), (1, 2, 4, 8), (4, 8), (1, 3)):
        eb.BLOCK_P, eb.PROGRAMS_PER_SM = block_p, per_sm
        grid, args, partials = eb.partials_launch(g2, idx, ROWS, -1)

        def run():
            eb._table_gradient_partials[grid](**args, num_warps=warps, num_stages=stages)
            return partials.sum(0)

        run()
        rows.append((block_p, per_sm, warps, stages, do_bench_cudagraph(run) * 1e3))
    eb.BLOCK_P, eb.PROGRAMS_PER_SM = defaults
    rows.sort(key=lambda r: r[-1])
    print(tabulate(rows[:12] + rows[-3:], headers=["BLOCK_P", "programs/SM", "warps", "stages", "GPU us"],
                   floatfmt=".1f"))
    return rows


def compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn)


def compare(n, heads, bidirectional):
    grad, buckets = t5_case(n, heads, bidirectional)
    g2, idx = grad.reshape(-1, heads), buckets.reshape(-1)

    def ours():
        return eb.table_gradient(g2, idx, ROWS, -1).to(grad.dtype)

    def eager():
        return aten.embedding_dense_backward(grad, buckets, ROWS, -1, False)

    def decomposition(g, i):
        return aten.embedding_dense_backward(g, i, ROWS, -1, False)

    def our_op(g, i):
        return torch.ops.fuse_attn.table_gradient(g.reshape(-1, g.shape[-1]), i.reshape(-1), ROWS, -1).to(g.dtype)

    methods = {"fuse_attn op (eager call)": ours, "eager embedding_dense_backward": eager}
    inductor = compiled(decomposition)
    methods["torch.compile (Inductor's atomics)"] = lambda: inductor(grad, buckets)
    if hasattr(inductor_config, "partitioned_scatter_enabled"):
        with inductor_config.patch(partitioned_scatter_enabled=True):
            torch._dynamo.reset()
            partitioned = torch.compile(decomposition)
            partitioned(grad, buckets)  # compiled under the patch
        methods["torch.compile + partitioned scatter"] = lambda: partitioned(grad, buckets)
    ours_compiled = compiled(our_op)
    ours_compiled(grad, buckets)
    methods["fuse_attn op under torch.compile"] = lambda: ours_compiled(grad, buckets)
    rows = []
    for name, fn in methods.items():
        out = fn()
        err = errors(out, grad, buckets)
        gpu = do_bench_cudagraph(fn) * 1e3
        wall = do_bench(fn) * 1e3
        rows.append((f"N{n} H{heads} {'bi' if bidirectional else 'causal'}", name, gpu, wall, err))
        print(rows[-1], flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    if args.sweep:
        print("sweep, T5-small encoder's table (N4096 H8, bidirectional):")
        sweep(*t5_case(4096, 8, True))
        print("sweep, N1024 H8:")
        sweep(*t5_case(1024, 8, True))
    rows = []
    for n, heads, bidirectional in [(4096, 8, True), (4096, 8, False), (1024, 8, True), (2048, 12, True),
                                    (4096, 16, True)]:
        rows += compare(n, heads, bidirectional)
    print(tabulate(rows, headers=["case", "method", "GPU us", "wall us", "max err vs fp64"], floatfmt=".4g"))


if __name__ == "__main__":
    main()
