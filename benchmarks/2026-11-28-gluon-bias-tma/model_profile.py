"""Where a whole model's step spends its GPU time: torch.profiler over a few steps of one model of
tools/bench_models.py under one variant, kernels grouped by name, the largest first. Written for T5-small's training
step (call 5: 406 ms a step under fuse_attn, of which the 18 attentions' tuned times add up to about 33 ms) to find
what the rest is, e.g. the learned relative bias's gradient -- dS summed over the batch into a [1, H, N, N] buffer,
then the embedding's backward scattering N^2 x H values into a 32-bucket table.

    python3 benchmarks/2026-11-28-gluon-bias-tma/model_profile.py [--model t5] [--length 4096] [--batch 4]
        [--mode train] [--variant fuse_attn] [--steps 3] [--top 25] [--tiny --device cpu]
"""
import argparse
import collections
import os
import sys

import torch
from tabulate import tabulate

sys.path.insert(0, os.getcwd())
from tools import bench_models as bm  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="t5", choices=bm.MODEL_NAMES)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--mode", default="train", choices=bm.MODES)
    ap.add_argument("--variant", default="fuse_attn", choices=bm.COMPILED_VARIANTS)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    train = args.mode == "train"
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = bm.build(args.model, bm.VARIANTS[args.variant][0], args.tiny, args.length, args.device, dtype, train)
    step = bm.make_step(bm.compiled(model, args.variant),
                        bm.make_inputs(args.model, model.config.vocab_size, args.batch, args.length, args.device), train)
    for _ in range(2):  # compile, then one step as the profiled ones run
        step()
        model.zero_grad(set_to_none=True)
    bm.synchronize(args.device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(args.steps):
            step()
            model.zero_grad(set_to_none=True)
        bm.synchronize(args.device)
    device_time = collections.Counter()
    calls = collections.Counter()
    for event in prof.key_averages():
        if args.device == "cuda" and event.device_type != torch.autograd.DeviceType.CUDA:
            continue  # (the ops that launched the kernels: their device time is the kernels', counted once)
        us = event.device_time_total if args.device == "cuda" else event.self_cpu_time_total
        if us > 0:
            device_time[event.key] += us / args.steps
            calls[event.key] += event.count / args.steps
    total = sum(device_time.values()) if args.device == "cuda" else None
    rows = [(name[:90], f"{us / 1000:.2f}", f"{calls[name]:.0f}", f"{100 * us / total:.1f}%" if total else "-")
            for name, us in device_time.most_common(args.top)]
    print(f"{args.model} {args.mode} B{args.batch} N{args.length} {args.variant} on "
          f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}: "
          f"{'GPU' if args.device == 'cuda' else 'self CPU'} time a step by kernel / op"
          + (f", {total / 1000:.1f} ms in all" if total else ""))
    print(tabulate(rows, headers=["kernel", "ms / step", "calls / step", "share"], tablefmt="github"))


main()
