"""One graph for every length against one graph per length: what ``dynamic=True`` costs, forward and forward+backward.

    python3 tools/bench_dynamic.py --out OUTDIR [--lengths 512 2048 4096 8192] [--compiled-at 1024] [--repeats 2]

The attention of ``tools/bench_host_overhead.py`` (nanoGPT's causal form, B2 H16 D128, bf16) is compiled with
``backend="fuse_attn"`` twice over: once with ``dynamic=True`` at ``--compiled-at`` (its kernels take a launch config
per power-of-two length bucket, chosen in Inductor's output code), and once per length with ``dynamic=False``. Each
is then run at each length and timed as ``bench_host_overhead.measure`` does: wall time (``do_bench`` median of
back-to-back calls) and GPU time (the call replayed from a CUDA graph). The dynamic graph's first compile time
(tuning every bucket from the caches as they are) is printed too. Rows are printed and appended to
OUTDIR/bench_dynamic.csv with the GPU, versions and date.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import triton
from tabulate import tabulate

# What is measured is the generated kernels' launch path: the compiled attention must not run SDPA's kernel
# instead (fuse_attn.kernels.dispatch), whatever this GPU would time faster.
os.environ["FUSE_ATTN_CANDIDATES"] = "triton"
if __package__ in (None, ""):  # run as a script: the repository root holds fuse_attn and tools
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools.bench_csv import appending  # noqa: E402
from tools.bench_host_overhead import CausalAttention, measure, random_inputs  # noqa: E402

B, H, D = 2, 16, 128
CSV_COLUMNS = ["B", "H", "N", "D", "mode", "repeat", "dynamic_wall_us", "dynamic_gpu_us", "static_wall_us",
               "static_gpu_us", "gpu", "torch", "triton", "date"]


def _inputs(n: int, backward: bool) -> tuple:
    return random_inputs(B, H, n, D, torch.bfloat16, backward, seed=n)


def run(lengths, compiled_at: int, repeats: int, record) -> list:
    rows = []
    max_len = max(*lengths, compiled_at)
    for mode in ("fwd", "fwd+bwd"):
        backward = mode == "fwd+bwd"
        torch._dynamo.reset()
        dynamic = torch.compile(CausalAttention(max_len).cuda(), backend="fuse_attn", dynamic=True)
        start = time.perf_counter()
        measure(dynamic, *_inputs(compiled_at, backward), backward)
        print(f"{mode}: dynamic graph compiled (and tuned) at N={compiled_at} in {time.perf_counter() - start:.1f} s "
              "(first compile and timing)", flush=True)
        static = {n: torch.compile(CausalAttention(max_len).cuda(), backend="fuse_attn", dynamic=False) for n in lengths}
        for repeat in range(repeats):
            for n in lengths:
                dyn_wall, dyn_gpu = measure(dynamic, *_inputs(n, backward), backward)
                st_wall, st_gpu = measure(static[n], *_inputs(n, backward), backward)
                record([B, H, n, D, mode, repeat] + [f"{ms * 1e3:.1f}" for ms in (dyn_wall, dyn_gpu, st_wall, st_gpu)])
                rows.append([mode, n, repeat, f"{dyn_gpu * 1e3:.1f} / {st_gpu * 1e3:.1f} ({dyn_gpu / st_gpu - 1:+.1%})",
                             f"{dyn_wall * 1e3:.1f} / {st_wall * 1e3:.1f} ({dyn_wall / st_wall - 1:+.1%})"])
                print(rows[-1], flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--lengths", nargs="*", type=int, default=[512, 2048, 4096, 8192])
    ap.add_argument("--compiled-at", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    run_info = [torch.cuda.get_device_name(), torch.__version__, triton.__version__, datetime.date.today().isoformat()]
    with appending(os.path.join(args.out, "bench_dynamic.csv"), CSV_COLUMNS, run_info) as record:
        rows = run(args.lengths, args.compiled_at, args.repeats, record)
    print(f"\n{run_info[0]}, torch {run_info[1]}, triton {run_info[2]}, B{B} H{H} D{D} causal bf16; "
          "dynamic / static per call, us")
    print(tabulate(rows, headers=["mode", "N", "repeat", "GPU (CUDA graph)", "wall"], tablefmt="github"))


if __name__ == "__main__":
    main()
