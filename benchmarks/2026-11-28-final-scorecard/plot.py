"""Issue 17's final scorecard on the H200 as one figure (scorecard.png): left, plain attention as the product launches
it against SDPA cuDNN (cuDNN's CUDA-graph GPU time / ours, call3.log's product_rows lines: at N1024 / 2048 the mean of
its two runs, each run a marker), forward and forward+backward; right, each variant row against its fastest peer
(bench_variants.csv) and the generated template alone against cuDNN at N4096 (bench_attention.csv). A line at 1.0.
Run here (needs matplotlib):  python3 plot.py"""
import collections
import csv
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = ("flex", "sdpa_mask", "cudnn", "torch_compile")
# product_rows.py's lines: shape,"config",what,ours_gpu_ms,cudnn_gpu_ms,cudnn/ours,...
ROW = re.compile(r"B\d+ H16 N(\d+) D(\d+) (full|causal),\(.*\),(fwd|fwd\+bwd),[\d.]+,[\d.]+,([\d.]+),")


def plain_rows():
    """{(D, mask, what): {N: [ratio, ...]}} from the product_rows lines of call3.log."""
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    with open(os.path.join(HERE, "call3.log")) as f:
        for line in f:
            match = ROW.match(line)
            if match:
                n, d, mask, what, ratio = match.groups()
                rows[int(d), mask, what][int(n)].append(float(ratio))
    return rows


def variant_ratios():
    """[(label, fwd ratio, fwd+bwd ratio)]: the fastest peer's time / ours per variant, then the template alone's."""
    cells = {}
    with open(os.path.join(HERE, "bench_variants.csv")) as f:
        for r in csv.DictReader(f):
            if r["median_ms"] not in ("OOM", "error"):
                cells[r["variant"], r["mode"], r["method"]] = float(r["median_ms"])
    out = []
    for variant in dict.fromkeys(v for v, _, _ in cells):
        ratios = []
        for mode in ("fwd", "fwd+bwd"):
            peer = min(cells[variant, mode, m] for m in PEERS if (variant, mode, m) in cells)
            ratios.append(peer / cells[variant, mode, "fuse_attn"])
        out.append((variant, *ratios))
    template = {}
    with open(os.path.join(HERE, "bench_attention.csv")) as f:
        for r in csv.DictReader(f):
            template[r["D"], r["causal"], r["mode"], r["method"]] = float(r["median_ms"])
    for D in ("64", "128"):
        for causal, name in (("0", "unmasked"), ("1", "causal")):
            out.append((f"template alone D{D} {name}",
                        *(template[D, causal, mode, "SDPA cuDNN"] / template[D, causal, mode, "ours"]
                          for mode in ("fwd", "fwd+bwd"))))
    return out


def main():
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [1, 1.6]})
    for (D, mask, what), by_n in sorted(plain_rows().items()):
        ns = sorted(by_n)
        style = "-" if what == "fwd" else "--"
        line, = left.plot(ns, [sum(by_n[n]) / len(by_n[n]) for n in ns], style, marker="o",
                          label=f"D{D} {mask} {what}")
        for n in ns:
            left.scatter([n] * len(by_n[n]), by_n[n], s=10, color=line.get_color())
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_xscale("log", base=2)
    left.set_xlabel("N (B * N = 16384, H16, bf16)")
    left.set_ylabel("cuDNN GPU time / ours")
    left.set_title("plain attention, our kernels as launched, against SDPA cuDNN")
    left.legend(fontsize=7, ncol=2)
    rows = variant_ratios()
    xs = range(len(rows))
    for i, mode in enumerate(("fwd", "fwd+bwd")):
        bars = right.bar([x + (i - 0.5) * 0.4 for x in xs], [r[1 + i] for r in rows], 0.4, label=mode)
        right.bar_label(bars, fmt="%.2f", fontsize=6)
    right.axhline(1.0, color="black", linewidth=0.8)
    right.set_xticks(list(xs), [r[0] for r in rows], rotation=35, ha="right", fontsize=7)
    right.set_ylabel("fastest peer's time / ours")
    right.set_title("variants (B4 H16 N4096 D128) against the fastest peer; the template alone against cuDNN (N4096)")
    right.legend(fontsize=8)
    fig.suptitle("issue 17's scorecard, NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0, 2026-11-28")
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "scorecard.png"), dpi=110)


if __name__ == "__main__":
    main()
