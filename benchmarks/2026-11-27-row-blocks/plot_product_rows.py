"""Plain attention on the current kernels against SDPA cuDNN (CUDA-graph GPU time, H100, product_rows.log, call 6):
forward and forward+backward per shape.

    python plot_product_rows.py   (writes product_rows_vs_cudnn.png beside it)
"""
import csv
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "product_rows.log")) as f:
    lines = [line for line in f if "," in line and not line.startswith("NVIDIA")]
# (the config column holds commas: count from the end)
ratio = {(r[0], r[-6]): float(r[-3]) for r in csv.reader(lines[1:])}
shapes = list(dict.fromkeys(shape for shape, _ in ratio))
labels = [s.split(" ", 2)[2].replace(" ", "\n") for s in shapes]
x = range(len(shapes))
fig, ax = plt.subplots(figsize=(13, 4))
ax.bar([i - 0.2 for i in x], [ratio[s, "fwd"] for s in shapes], 0.4, label="forward")
ax.bar([i + 0.2 for i in x], [ratio[s, "fwd+bwd"] for s in shapes], 0.4, label="forward+backward")
ax.axhline(1.0, color="black", linewidth=0.8)
ax.set_xticks(list(x), labels, fontsize=7)
ax.set_ylim(0.8, 1.12)
ax.set_ylabel("cuDNN time / ours")
ax.set_title("Gluon kernels vs SDPA cuDNN, H100, bf16, B*N=16384, H16 (CUDA-graph GPU time), 2026-11-27")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(HERE, "product_rows_vs_cudnn.png"), dpi=110)
