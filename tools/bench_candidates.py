"""What the implementation choice sees: the GPU time of each candidate of a plain attention -- the generated kernels,
the Gluon forward (sm90; "failed" elsewhere) and SDPA's cuDNN and flash kernels, and the generated kernels untuned
(their first working launch configs) -- per shape, forward and
forward+backward, timed as the tuner times them (``fuse_attn.kernels.dispatch``: each step recorded as a CUDA
graph, the replay timed, median; the Gluon kernels' step timed as called), and the one it keeps.

    PYTHONPATH=. python3 tools/bench_candidates.py [--out OUTDIR]

Shapes: the attentions of ``tools/bench_models.py``'s models (GPT-2 small, BERT-base, Llama-3.2-1B with GQA 4) and
the host-overhead rows (B1 H32 N256 D128), bf16. Rows go to OUTDIR/bench_candidates.csv with the device, versions
and date.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch
import triton
from tabulate import tabulate

from fuse_attn.kernels import tuning, dispatch
from fuse_attn.kernels.tuning import Implementation
from fuse_attn.spec import AttentionSpec, CausalMask
from tools.bench_csv import appending

# (name, Z, H, H_kv, N, D, causal)
SHAPES = [
    ("gpt2-small", 8, 12, 12, 1024, 64, True),
    ("bert-base", 32, 12, 12, 512, 64, False),
    ("llama-1b", 2, 32, 8, 4096, 64, True),
    ("host row", 1, 32, 32, 256, 128, True),
]
UNTUNED = "triton untuned"


def candidate_times(spec: AttentionSpec, shape, training: bool) -> dict[str, float]:
    """Milliseconds per step of each candidate (None where it failed), timed as
    ``dispatch.choose_implementation`` does."""
    _, Z, H, H_kv, N, D, _ = shape
    q = torch.empty(Z, H, N, D, device="cuda", dtype=torch.bfloat16)
    k = torch.empty(Z, H_kv, N, D, device="cuda", dtype=torch.bfloat16)
    steps = dispatch._CandidateSteps(spec, q, k, k, training)
    times = {}
    for name in dispatch.ALL_CANDIDATES:
        try:
            times[name] = tuning._time_config(steps.replay, Implementation(name), tuning._FINAL_PASS_REP_MS)
        except Exception as e:  # noqa: BLE001 -- a candidate that cannot run this shape
            print(f"  {name} failed on {shape}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            times[name] = None
    # The generated kernels with their first working configs, untuned (tuning.untimed()): how much the tuning of
    # their launch configs gains, i.e. how far behind the best candidate an untuned template can be and still win
    # once tuned
    untuned_steps = dispatch._CandidateSteps(spec, q, k, k, training)
    with tuning.untimed():
        times[UNTUNED] = tuning._time_config(untuned_steps.replay, Implementation(dispatch.TRITON),
                                             tuning._FINAL_PASS_REP_MS)
    return times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    run_info = [torch.cuda.get_device_name(), torch.__version__, triton.__version__, datetime.date.today().isoformat()]
    print(f"device: {run_info[0]}, torch {run_info[1]}, triton {run_info[2]}, bf16, GPU time per step (us)")
    rows = []
    columns = ["model", "Z", "H", "H_kv", "N", "D", "causal", "mode", "candidate", "ms", "device", "torch", "triton",
               "date"]
    with appending(os.path.join(args.out, "bench_candidates.csv"), columns, run_info) as record:
        for shape in SHAPES:
            name, Z, H, H_kv, N, D, causal = shape
            spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                                 causal=CausalMask() if causal else None, gqa_group=H // H_kv)
            for training in (False, True):
                mode = "fwd+bwd" if training else "fwd"
                times = candidate_times(spec, shape, training)
                for candidate, ms in times.items():
                    record([name, Z, H, H_kv, N, D, causal, mode, candidate, "" if ms is None else f"{ms:.5f}"])
                ran = {n: t for n, t in times.items() if t is not None}
                sdpa = [t for n, t in ran.items() if n in (dispatch.SDPA_CUDNN, dispatch.SDPA_FLASH)]
                rows.append([name, f"{Z},{H}/{H_kv},{N},{D}", "causal" if causal else "full", mode,
                             *("failed" if times[n] is None else f"{times[n] * 1e3:.1f}"
                               for n in (*dispatch.ALL_CANDIDATES, UNTUNED)),
                             min((n for n in ran if n != UNTUNED), key=ran.get),
                             f"{times[UNTUNED] / times['triton']:.2f}" if times["triton"] is not None else "-",
                             f"{times['triton'] / min(sdpa):.2f}" if sdpa and times["triton"] is not None else "-"])
    headers = ["model", "Z,H/H_kv,N,D", "mask", "mode", *(f"{n} us" for n in (*dispatch.ALL_CANDIDATES, UNTUNED)),
               "kept", "untuned / tuned triton", "triton / best SDPA"]
    print(tabulate(rows, headers=headers, tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
