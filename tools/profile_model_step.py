"""Where one model step's time goes, under several compiled variants side by side: host or GPU, which kernels.

    PYTHONPATH=. python3 tools/profile_model_step.py [--model gpt2-small] [--length 1024] [--batch-tokens 8192]
                                                     [--mode train] [--variants fuse_attn sdpa+fuse_attn] [--top 30]
    PYTHONPATH=. python3 tools/profile_model_step.py --device cpu --tiny        # smoke test

The models and variants are ``tools/bench_models.py``'s (a training step: forward, Hugging Face's loss, backward). Each
variant runs in a process of its own, in the order given (a variant named twice, ``--variants a b a``, shows the
spread from one process to the next): a process that has run ``torch.profiler`` once launches kernels more slowly
from then on, so variants profiled one after another in one process measured 16, 24 and 30 ms of host time a step
for the same GPT-2 step (H200). In each, after one compiling step:

* **step ms**: ``triton.testing.do_bench`` median of back-to-back steps, what a training loop pays;
* **host ms**: the median time to *enqueue* one step, starting with the GPU idle (``synchronize`` before each). Over
  the GPU's time, the step is host-bound: the GPU waits for launches;
* **GPU ms**, **kernels**: the GPU's busy time and the kernels launched per step (``torch.profiler``, 5 steps);
* **graphs**, **breaks**: Dynamo's graphs and graph breaks while compiling.

Then the kernels' GPU time per step, variants side by side (the ``--top`` largest), and the CPU operators' self time
per step. On a CPU (``--device cpu``) the GPU columns are empty and host ms is the step's time.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

import torch
from tabulate import tabulate

if __package__ in (None, ""):  # run as a script: the repository root holds fuse_attn and tools
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools.bench_models import (COMPILED_VARIANTS, DEFAULT_COMPILE_MODE, MODEL_NAMES, TINY_LENGTH, VARIANTS,  # noqa: E402
                                build, compiled, make_inputs, make_step, marked_result, synchronize)

RESULT_MARK = "profiled variant:"  # the line a --one-variant subprocess prints its result on
PROFILED_STEPS = 5  # steps under torch.profiler: enough for a per-step mean of each kernel, few for the trace's size
HOST_SAMPLES = 11  # steps timed from an idle GPU; the median is reported


def profile_variant(args, variant):
    """(summary dict, {kernel: GPU ms per step}, {CPU op: self ms per step}) of ``variant``'s step."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    train = args.mode == "train"
    model = build(args.model, VARIANTS[variant][0], args.tiny, args.length, args.device, args.dtype, train)
    batch = max(1, args.batch_tokens // args.length)
    step = make_step(compiled(args.model, model, variant, DEFAULT_COMPILE_MODE),
                     make_inputs(args.model, model.config.vocab_size, batch, args.length, args.device), train)
    params = list(model.parameters())

    def drop_grads():
        for p in params:
            p.grad = None

    step()
    synchronize(args.device)
    drop_grads()
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    if args.device == "cuda":
        import triton.testing

        step_ms = triton.testing.do_bench(step, rep=1000, grad_to_none=params if train else None,
                                          return_mode="median")
    else:
        step_ms = None
    host = []
    for _ in range(HOST_SAMPLES):
        synchronize(args.device)
        start = time.perf_counter()
        step()
        host.append((time.perf_counter() - start) * 1e3)
        synchronize(args.device)
        drop_grads()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(PROFILED_STEPS):
            step()
            drop_grads()
        synchronize(args.device)
    kernels, launches, cpu_ops = collections.Counter(), 0, collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name] += event.device_time / PROFILED_STEPS / 1e3
            launches += 1
    for event in prof.key_averages():
        cpu_ops[event.key] += event.self_cpu_time_total / PROFILED_STEPS / 1e3
    summary = {
        "variant": variant,
        "step ms": f"{step_ms:.2f}" if step_ms is not None else "",
        "host ms": f"{sorted(host)[HOST_SAMPLES // 2]:.2f}",
        "GPU ms": f"{sum(kernels.values()):.2f}" if args.device == "cuda" else "",
        "kernels": f"{launches / PROFILED_STEPS:.0f}" if args.device == "cuda" else "",
        "graphs": graphs,
        "breaks": breaks,
    }
    return summary, kernels, cpu_ops


def side_by_side(per_variant, labels, top):
    """Rows of the ``top`` largest entries (by their largest value over the variants), one column per variant."""
    names = set().union(*per_variant)
    largest = sorted(names, key=lambda n: -max(values.get(n, 0.0) for values in per_variant))[:top]
    return [[name[:70], *(f"{values.get(name, 0.0):.3f}" for values in per_variant)] for name in largest], \
        ["name", *labels]


def profiled_in_a_process(argv, variant):
    """:func:`profile_variant`'s result for ``variant``, run in a subprocess with this command's other arguments."""
    command = [sys.executable, os.path.abspath(__file__), *(sys.argv[1:] if argv is None else argv),
               "--one-variant", variant]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)  # (its stderr: this one's)
    result = marked_result(done.stdout, RESULT_MARK)
    if done.returncode or result is None:
        raise RuntimeError(f"profiling {variant} failed (exit {done.returncode}):\n{done.stdout[-3000:]}")
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2-small", choices=MODEL_NAMES)
    ap.add_argument("--length", type=int, default=None, help=f"N (default 1024, {TINY_LENGTH} with --tiny)")
    ap.add_argument("--batch-tokens", type=int, default=None, help="B*N (default 8192, 2N with --tiny)")
    ap.add_argument("--mode", default="train", choices=["train", "infer"])
    ap.add_argument("--variants", nargs="+", default=["fuse_attn", "sdpa+fuse_attn"], choices=COMPILED_VARIANTS)
    ap.add_argument("--top", type=int, default=30, help="rows of the kernel and CPU-operator tables")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="bench_models' tiny configs (a smoke test)")
    ap.add_argument("--one-variant", choices=COMPILED_VARIANTS, help=argparse.SUPPRESS)  # (the subprocess of one)
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU, or --device cpu --tiny for a smoke test", file=sys.stderr, flush=True)
        return 2
    args.dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    args.length = args.length or (TINY_LENGTH if args.tiny else 1024)
    args.batch_tokens = args.batch_tokens or (2 * args.length if args.tiny else 8192)
    if args.one_variant:
        print(RESULT_MARK, json.dumps(profile_variant(args, args.one_variant)), flush=True)
        return 0
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"{args.model} {args.mode} B{max(1, args.batch_tokens // args.length)} N{args.length} on {device_name}, "
          f"torch {torch.__version__}", flush=True)
    summaries, kernels, cpu_ops, labels = [], [], [], []
    for i, variant in enumerate(args.variants):
        summary, variant_kernels, variant_cpu_ops = profiled_in_a_process(argv, variant)
        summaries.append({"#": i + 1, **summary})
        kernels.append(variant_kernels)
        cpu_ops.append(variant_cpu_ops)
        labels.append(f"{i + 1}: {variant}")
        print(f"  {labels[-1]}: " + ", ".join(f"{k} {v}" for k, v in summary.items() if k != "variant"), flush=True)
    print(tabulate(summaries, headers="keys", tablefmt="github"), flush=True)
    if args.device == "cuda":
        rows, headers = side_by_side(kernels, labels, args.top)
        print("\nGPU ms per step, by kernel", flush=True)
        print(tabulate(rows, headers=headers, tablefmt="github"), flush=True)
    rows, headers = side_by_side(cpu_ops, labels, args.top)
    print("\nCPU self ms per step, by operator", flush=True)
    print(tabulate(rows, headers=headers, tablefmt="github"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
