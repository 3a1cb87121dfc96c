"""Plain attention on this session's kernels against SDPA cuDNN (CUDA-graph GPU time, H100; product_rows_final.log,
call 7), bars, with the sixteenth session's ratios (../2026-11-27-row-blocks/product_rows.log) as dots.

    python plot_product_rows.py   (writes product_rows_vs_cudnn.png beside it)
"""
import csv
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = os.path.dirname(os.path.abspath(__file__))


def ratios(path):
    """{(shape, "fwd" or "fwd+bwd"): cuDNN time / ours} (the config column holds commas: counted from the end)."""
    with open(path) as f:
        lines = [line for line in f if "," in line and not line.startswith("NVIDIA")]
    return {(r[0], r[-6]): float(r[-3]) for r in csv.reader(lines[1:])}


now = ratios(os.path.join(HERE, "product_rows_final.log"))
before = ratios(os.path.join(HERE, "..", "2026-11-27-row-blocks", "product_rows.log"))
shapes = list(dict.fromkeys(shape for shape, _ in now))
fig, ax = plt.subplots(figsize=(13, 4))
for offset, mode, label in ((-0.2, "fwd", "forward"), (0.2, "fwd+bwd", "forward+backward")):
    xs = [i + offset for i in range(len(shapes))]
    ax.bar(xs, [now[s, mode] for s in shapes], 0.4, label=f"{label}, this session")
    ax.plot(xs, [before[s, mode] for s in shapes], "k.", label="sixteenth session" if mode == "fwd" else None)
ax.axhline(1.0, color="black", linewidth=0.8)
ax.set_xticks(range(len(shapes)), [s.split(" ", 2)[2].replace(" ", "\n") for s in shapes], fontsize=7)
ax.set_ylim(0.8, 1.12)
ax.set_ylabel("cuDNN time / ours")
ax.set_title("Gluon kernels vs SDPA cuDNN, H100, bf16, B*N=16384, H16 (CUDA-graph GPU time), 2026-11-27, 17th session")
ax.legend(fontsize=8, ncol=3)
fig.tight_layout()
fig.savefig(os.path.join(HERE, "product_rows_vs_cudnn.png"), dpi=110)
