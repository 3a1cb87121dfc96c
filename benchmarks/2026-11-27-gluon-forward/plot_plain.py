"""Plot plain_vs_cudnn_*.log: GPU time against SDPA cuDNN's (CUDA-graph replay), per length, for the template and the
Gluon forward (with the template's backward), forward and forward+backward, D64 / D128, causal and not.

    python plot_plain.py        (writes plain_vs_cudnn.png and prints the table BENCHMARKS.md quotes)"""
import csv
import glob
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
rows = []
for path in sorted(glob.glob(os.path.join(here, "plain_vs_cudnn_*.log"))):
    with open(path) as f:
        lines = [line for line in f if line.startswith("B")]
    rows += list(csv.reader(lines))
data = {}  # (D, mask, mode, method) -> {N: (gpu ratio, wall ratio, gpu ms)}
for shape, mode, method, gpu, wall, gpu_ratio, wall_ratio in rows:
    b, h, n, d, mask = shape.split()
    data.setdefault((int(d[1:]), mask, mode, method), {})[int(n[1:])] = (float(gpu_ratio), float(wall_ratio), float(gpu))

fig, axes = plt.subplots(2, 4, figsize=(16, 7), sharey=True)
for col, (D, mask) in enumerate((d, m) for d in (64, 128) for m in ("full", "causal")):
    for row, mode in enumerate(("fwd", "fwd+bwd")):
        ax = axes[row][col]
        for method, style in (("template", "o--"), ("gluon fwd", "s-")):
            points = sorted(data[(D, mask, mode, method)].items())
            ax.plot([n for n, _ in points], [r[0] for _, r in points], style, label=method)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"D{D} {mask} {mode}")
        ax.set_xlabel("N (B*N = 16384, H16)")
        if col == 0:
            ax.set_ylabel("speed vs SDPA cuDNN (GPU time)")
axes[0][0].legend()
fig.suptitle("Plain attention, our kernels against cuDNN (H100, torch 2.11, triton 3.6, bf16, 2026-11-27)")
fig.tight_layout()
fig.savefig(os.path.join(here, "plain_vs_cudnn.png"), dpi=90)

print("| D, mask | N | fwd: template | fwd: Gluon | fwd+bwd: template | fwd+bwd: Gluon fwd + template bwd |")
print("|---|---|---|---|---|---|")
for D in (64, 128):
    for mask in ("full", "causal"):
        for n in sorted(data[(D, mask, "fwd", "template")]):
            cells = [f"{data[(D, mask, mode, m)][n][0]:.2f}x" for mode in ("fwd", "fwd+bwd") for m in ("template", "gluon fwd")]
            print(f"| D{D} {mask} | {n} | " + " | ".join(cells) + " |")
