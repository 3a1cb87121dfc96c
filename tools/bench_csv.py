"""CSV output shared by the benchmark tools, and ``benchmarks/results.csv``, the one record of what was measured.

* :func:`appending` -- a tool's own CSV (``OUTDIR/bench_attention.csv`` ...): rows appended and flushed as they are
  measured, each with the tool's run columns (GPU, versions, date).
* :func:`results_rows` -- a tool's CSV turned into rows of ``benchmarks/results.csv`` (:data:`RESULTS_COLUMNS`), the
  ratio of each of our rows against the fastest peer filled in; :func:`append_results` appends them.

    python tools/bench_csv.py OUTDIR/bench_variants.csv [OUTDIR/bench_models.csv ...] [--commit SHA]
                              [--results benchmarks/results.csv] [--dry-run]

reads ``bench_attention.csv``, ``bench_variants.csv``, ``bench_models.csv`` (speed rows),
``bench_host_overhead.csv`` (wall and GPU time per call: two rows each), ``bench_candidates.csv``,
``bench_models_compile_time.csv`` (the first two steps, in ms) and
``benchmarks/plain_attention.py``'s ``plain_attention.csv``, and appends their measured rows (a cell that ran out of
memory or failed is no measurement and is left out). ``commit`` is the code that ran: by default this checkout's
``git rev-parse --short HEAD``, with ``-dirty`` where tracked files differ from it; pass ``--commit`` when the run
was made elsewhere.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_PATH = os.path.join(ROOT, "benchmarks", "results.csv")
RESULTS_COLUMNS = ["date", "commit", "gpu", "torch", "triton", "case", "implementation", "ms", "tflops", "ratio"]


@contextlib.contextmanager
def appending(path, columns, run_info, lineterminator="\r\n"):
    """Yield ``record(values)``: appends one row (``values`` + ``run_info``) to ``path`` and flushes it."""
    with open(path, "a", newline="") as f:
        writer = csv.writer(f, lineterminator=lineterminator)
        if f.tell() == 0:
            writer.writerow(columns)

        def record(values):
            writer.writerow(values + run_info)
            f.flush()

        yield record


def columns_clash(path, columns):
    """Say so and return True when ``path`` exists with other columns (appended rows would not line up)."""
    if not (os.path.exists(path) and os.path.getsize(path)):
        return False
    with open(path, newline="") as f:
        header = next(csv.reader(f), None)
    if header != columns:
        print(f"{path} has other columns ({header}): choose another --out", flush=True)
    return header != columns


# ---- benchmarks/results.csv -----------------------------------------------------------------------------------------
def current_commit(root: str = ROOT) -> str:
    """``git rev-parse --short HEAD`` of ``root`` (``-dirty`` appended where tracked files differ from it); "" outside
    a git checkout."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
        clean = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=root).returncode == 0
    except (OSError, subprocess.CalledProcessError):
        return ""
    return commit if clean else commit + "-dirty"


def run_info(commit: str | None = None) -> dict[str, str]:
    """The run columns of a results row measured now, in this process: date, commit, GPU name, torch and triton."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = ""
    return {"date": datetime.date.today().isoformat(), "commit": current_commit() if commit is None else commit,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "triton": triton_version}


def attention_flops(B: int, H: int, N: int, D: int, causal: bool, backward: bool) -> float:
    """The flops the results' ``tflops`` column counts for one call: 4 B H N^2 D a forward (two N x N x D matmuls),
    half of them when causal, and 3.5x that a forward+backward (the backward's five matmuls against two): the
    convention of FlashAttention's and cuDNN's published figures."""
    return 4 * B * H * N * N * D * (0.5 if causal else 1.0) * (3.5 if backward else 1.0)


def case_name(tool: str, name: str, mode: str, shape: str) -> str:
    """A results row's ``case``: ``tool/name/mode/shape``, e.g. ``bench_variants/softcap_causal/fwd/B4 H16 Hkv16 N4096
    D128`` -- the tool that measured it (so how it was timed), what ran, fwd / fwd+bwd / train / infer, the sizes
    (bf16 unless the shape ends with another dtype)."""
    return "/".join((tool, name, mode, shape))


def is_ours(implementation: str) -> bool:
    """Whether a results row's implementation is fuse_attn's (its ratio is filled in) or a peer's."""
    return "fuse_attn" in implementation


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


# implementation names in results.csv, from bench_attention.py's methods (its "ours" is the generated template's op)
_ATTENTION_IMPLEMENTATIONS = {"ours": "fuse_attn template", "SDPA cuDNN": "cudnn", "SDPA flash": "flash",
                              "FlexAttention": "flex", "torch.compile": "torch_compile", "eager": "eager"}


def _dtype(r):
    return "" if r["dtype"] == "bfloat16" else f" {r['dtype']}"


def _attention_row(r):
    mod = r.get("score_program", r.get("score_mod", "none"))
    name = ("causal" if r["causal"] == "1" else "unmasked") + ("" if mod in ("none", "") else f"+{mod}")
    shape = f"B{r['B']} H{r['H']} N{r['N']} D{r['D']}" + _dtype(r)
    implementation = _ATTENTION_IMPLEMENTATIONS.get(r["method"], r["method"])
    return case_name("bench_attention", name, r["mode"], shape), implementation, r["median_ms"], r["TF/s"], "", r


def _variant_row(r):
    shape = f"B{r['B']} H{r['H']} Hkv{r['H_kv']} N{r['N']} D{r['D']}" + _dtype(r)
    return case_name("bench_variants", r["variant"], r["mode"], shape), r["method"], r["median_ms"], "", "", r


def _model_row(r):
    return (case_name("bench_models", r["model"], r["mode"], f"B{r['B']} N{r['N']}"), r["variant"], r["median_ms"], "",
            "", dict(r, gpu=r["device"]))


def _plain_row(r):
    name = "causal" if r["causal"] == "1" else "unmasked"
    kv_heads = f" Hkv{r['H_kv']}" if r.get("H_kv", r["H"]) != r["H"] else ""
    shape = f"B{r['B']} H{r['H']}{kv_heads} N{r['N']} D{r['D']}"
    return (case_name("plain_attention", name, r["mode"], shape), r["implementation"], r["gpu_ms"], r.get("tflops", ""),
            r["ratio"], r)


def _host_overhead_rows(r):
    """Two rows a measurement: the wall time per call and the CUDA-graph replay's (GPU time only)."""
    name = f"causal chain{r['chain']}"
    shape = f"B{r['B']} H{r['H']} N{r['N']} D{r['D']}" + _dtype(r)
    return [(case_name("bench_host_overhead", f"{name} {timing}", r["mode"], shape), r["method"],
             _ms(r[column]), "", "", r) for timing, column in (("wall", "wall_us"), ("gpu", "gpu_us"))]


def _candidate_row(r):
    shape = f"B{r['Z']} H{r['H']} Hkv{r['H_kv']} N{r['N']} D{r['D']}" + (" causal" if r["causal"] == "True" else "")
    return case_name("bench_candidates", r["model"], r["mode"], shape), r["candidate"], r["ms"], "", "", \
        dict(r, gpu=r["device"])


def _compile_time_row(r):
    """The first two steps' seconds (cold or warm caches) as milliseconds."""
    seconds = _number(r["first_two_steps_s"])
    return (case_name("bench_models_compile_time", r["model"], r["caches"], f"B{r['B']} N{r['N']}"), r["variant"],
            r["first_two_steps_s"] if seconds is None else f"{seconds * 1e3:.0f}", "", "", dict(r, gpu=r["device"]))


def _ms(us: str) -> str:
    value = _number(us)
    return us if value is None else f"{value / 1e3:.5f}"


def _converter(header):
    if "first_two_steps_s" in header:
        return _compile_time_row
    if "wall_us" in header and "chain" in header:
        return _host_overhead_rows
    if "candidate" in header and "ms" in header:
        return _candidate_row
    if "variant" in header and "method" in header:
        return _variant_row
    if "model" in header and "tokens_per_s" in header:
        return _model_row
    if "method" in header and "TF/s" in header:
        return _attention_row
    if "implementation" in header and "gpu_ms" in header:
        return _plain_row
    return None


def results_rows(path: str, commit: str) -> list[dict[str, str]]:
    """The measured rows of a tool's CSV as results rows (``commit`` the code that ran). The ratio of each of our rows
    (:func:`is_ours`) is the fastest peer's time in the same case (same date, GPU and versions) / ours, unless the
    tool wrote one (``plain_attention.csv``: cuDNN's)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        convert = _converter(reader.fieldnames or [])
        if convert is None:
            raise ValueError(f"{path}: not a CSV of bench_attention, bench_variants, bench_models (or its compile "
                             "times), bench_host_overhead, bench_candidates or plain_attention "
                             f"(columns {reader.fieldnames})")
        rows = []
        for record in reader:
            converted = convert(record)
            for case, implementation, ms, tflops, ratio, r in converted if isinstance(converted, list) else [converted]:
                if _number(ms) is None:  # "OOM", "error": nothing measured
                    continue
                rows.append({"date": r["date"], "commit": commit, "gpu": r["gpu"], "torch": r["torch"],
                             "triton": r["triton"], "case": case, "implementation": implementation, "ms": ms,
                             "tflops": tflops, "ratio": ratio})
    fastest_peer = {}
    for row in rows:
        key = tuple(row[c] for c in ("date", "gpu", "torch", "triton", "case"))
        if not is_ours(row["implementation"]):
            fastest_peer[key] = min(fastest_peer.get(key, float("inf")), float(row["ms"]))
    for row in rows:
        key = tuple(row[c] for c in ("date", "gpu", "torch", "triton", "case"))
        if is_ours(row["implementation"]) and not row["ratio"] and key in fastest_peer:
            row["ratio"] = f"{fastest_peer[key] / float(row['ms']):.3f}"
    return rows


def append_results(rows, path: str = RESULTS_PATH) -> None:
    """Append results rows (dicts keyed by :data:`RESULTS_COLUMNS`; a missing key an empty cell) to ``path``, its
    header written first where the file is new; a file with other columns is left alone (ValueError)."""
    if os.path.exists(path) and os.path.getsize(path):
        with open(path, newline="") as f:
            header = next(csv.reader(f), None)
        if header != RESULTS_COLUMNS:
            raise ValueError(f"{path} has columns {header}, not {RESULTS_COLUMNS}")
    with appending(path, RESULTS_COLUMNS, [], lineterminator="\n") as record:
        for row in rows:
            unknown = set(row) - set(RESULTS_COLUMNS)
            if unknown:
                raise ValueError(f"not results columns: {sorted(unknown)}")
            record([str(row.get(column, "")) for column in RESULTS_COLUMNS])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csvs", nargs="+", help="CSVs of bench_attention, bench_variants, bench_models, bench_host_overhead, "
                                            "bench_candidates, plain_attention")
    ap.add_argument("--commit", default=None, help="the code that ran (default: this checkout's HEAD)")
    ap.add_argument("--results", default=RESULTS_PATH)
    ap.add_argument("--dry-run", action="store_true", help="print the rows instead of appending them")
    args = ap.parse_args(argv)
    commit = current_commit() if args.commit is None else args.commit
    rows = [row for path in args.csvs for row in results_rows(path, commit)]
    if args.dry_run:
        writer = csv.DictWriter(sys.stdout, RESULTS_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    else:
        append_results(rows, args.results)
        print(f"{len(rows)} rows appended to {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
