"""The scorecard figure (benchmarks/scorecard.png) from benchmarks/results.csv.

    python3 benchmarks/plot.py [--results benchmarks/results.csv] [--out benchmarks/scorecard.png]

Top: plain attention (``plain_attention/...`` rows), TF/s against the sequence length N per implementation, one
panel per head dim and mode (TF/s = 4 * B * H * N^2 * D / time, halved when causal, forward+backward counted as 3.5
forwards, as tools/bench_attention.py counts them). Bottom left: the same rows as cuDNN's time / ours (the rows'
``ratio``; a marker per run, the line through their mean). Bottom right: each variant (``bench_variants/...``)
against its fastest peer, and the generated template alone (``bench_attention/...``, implementation ``fuse_attn
template``) against cuDNN. Of each case and implementation only the rows of its latest date are drawn.
Needs matplotlib (``pip install -e ".[bench]"``).
"""

from __future__ import annotations

import argparse
import collections
import csv
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPE = re.compile(r"B(\d+) H(\d+)(?: Hkv\d+)? N(\d+) D(\d+)")
MODES = ("fwd", "fwd+bwd")


def latest_rows(path):
    """The rows of results.csv, of each (case, implementation) only those of its latest date."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    latest = {}
    for row in rows:
        key = row["case"], row["implementation"]
        latest[key] = max(latest.get(key, ""), row["date"])
    return [row for row in rows if row["date"] == latest[row["case"], row["implementation"]]]


def split_case(case):
    """``tool/name/mode/shape`` -> (tool, name, mode, shape)."""
    tool, name, mode, shape = case.split("/")
    return tool, name, mode, shape


def tflops(row):
    """The row's TF/s: its own where the tool wrote one, else from its time and shape."""
    if row["tflops"]:
        return float(row["tflops"])
    _, name, mode, shape = split_case(row["case"])
    B, H, N, D = (int(x) for x in SHAPE.match(shape).groups())
    flops = 4 * B * H * N * N * D * (0.5 if name.startswith("causal") else 1.0) * (3.5 if mode == "fwd+bwd" else 1.0)
    return flops / (float(row["ms"]) * 1e-3) / 1e12


def plain_series(rows):
    """{(D, mode): {(implementation, mask): {N: [TF/s, ...]}}} and {(D, mask, mode): {N: [ratio, ...]}}."""
    speed = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    ratios = collections.defaultdict(lambda: collections.defaultdict(list))
    for row in rows:
        tool, mask, mode, shape = split_case(row["case"])
        if tool != "plain_attention":
            continue
        _, _, N, D = (int(x) for x in SHAPE.match(shape).groups())
        speed[D, mode][row["implementation"], mask][N].append(tflops(row))
        if row["ratio"]:
            ratios[D, mask, mode][N].append(float(row["ratio"]))
    return speed, ratios


def bar_ratios(rows):
    """[(label, fwd ratio, fwd+bwd ratio)]: each variant's fuse_attn row, then the template alone's (mean of reruns)."""
    cells = collections.defaultdict(list)
    for row in rows:
        tool, name, mode, shape = split_case(row["case"])
        if row["ratio"] and (tool, row["implementation"]) in (("bench_variants", "fuse_attn"),
                                                             ("bench_attention", "fuse_attn template")):
            label = name if tool == "bench_variants" else f"template alone D{SHAPE.match(shape).group(4)} {name}"
            cells[label, mode].append(float(row["ratio"]))
    labels = sorted(dict.fromkeys(label for label, _ in cells), key=lambda label: label.startswith("template"))
    return [(label, *(sum(cells[label, m]) / len(cells[label, m]) if cells[label, m] else 0.0 for m in MODES))
            for label in labels]


def draw(rows, out):
    try:
        import matplotlib
    except ImportError:
        print('matplotlib is not installed: pip install matplotlib (or pip install -e ".[bench]")', file=sys.stderr)
        return 2
    matplotlib.use("Agg")  # no display on a benchmark machine
    import matplotlib.pyplot as plt

    speed, ratios = plain_series(rows)
    fig = plt.figure(figsize=(18, 10))
    grid = fig.add_gridspec(2, 4, height_ratios=[1, 1.15])
    colours = {"unmasked": "C0", "causal": "C1"}
    for i, (D, mode) in enumerate(sorted(speed)):
        ax = fig.add_subplot(grid[0, i % 4])
        lengths = sorted({n for by_n in speed[D, mode].values() for n in by_n})
        for (implementation, mask), by_n in sorted(speed[D, mode].items()):
            ns = sorted(by_n)
            ax.plot(ns, [sum(by_n[n]) / len(by_n[n]) for n in ns], "-" if "fuse_attn" in implementation else "--",
                    marker="o", color=colours.get(mask, "C2"), label=f"{implementation} {mask}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.minorticks_off()
        ax.set_title(f"plain attention D{D} {mode}")
        ax.set_xlabel("N (B * N = 16384, H16, bf16)")
        ax.set_ylabel("TF/s (CUDA-graph GPU time)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    left = fig.add_subplot(grid[1, :2])
    for (D, mask, mode), by_n in sorted(ratios.items()):
        ns = sorted(by_n)
        line, = left.plot(ns, [sum(by_n[n]) / len(by_n[n]) for n in ns], "-" if mode == "fwd" else "--", marker="o",
                          label=f"D{D} {mask} {mode}")
        for n in ns:
            left.scatter([n] * len(by_n[n]), by_n[n], s=10, color=line.get_color())
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_xscale("log", base=2)
    lengths = sorted({n for by_n in ratios.values() for n in by_n})
    left.set_xticks(lengths, [str(n) for n in lengths])
    left.minorticks_off()
    left.set_xlabel("N (B * N = 16384, H16, bf16)")
    left.set_ylabel("cuDNN GPU time / ours")
    left.set_title("plain attention, our kernels as launched, against SDPA cuDNN")
    left.legend(fontsize=7, ncol=2)
    right = fig.add_subplot(grid[1, 2:])
    bars = bar_ratios(rows)
    xs = range(len(bars))
    for i, mode in enumerate(MODES):
        drawn = right.bar([x + (i - 0.5) * 0.4 for x in xs], [b[1 + i] for b in bars], 0.4, label=mode)
        right.bar_label(drawn, fmt="%.2f", fontsize=6)
    right.axhline(1.0, color="black", linewidth=0.8)
    right.set_xticks(list(xs), [b[0] for b in bars], rotation=35, ha="right", fontsize=7)
    right.set_ylabel("fastest peer's time / ours")
    right.set_title("variants (B4 H16 N4096 D128) vs the fastest peer; the template alone vs cuDNN (N4096)")
    right.legend(fontsize=8)
    runs = sorted({(row["gpu"], row["torch"], row["triton"], row["commit"]) for row in rows})
    fig.suptitle("fuse_attn scorecard: " + "; ".join(f"{g}, torch {t}, triton {tr}, commit {c}"
                                                     for g, t, tr, c in runs))
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(HERE, "results.csv"))
    ap.add_argument("--out", default=os.path.join(HERE, "scorecard.png"))
    args = ap.parse_args(argv)
    return draw(latest_rows(args.results), args.out)


if __name__ == "__main__":
    sys.exit(main())
