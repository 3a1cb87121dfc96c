"""Forward+backward of plain attention against cuDNN (CUDA-graph GPU time, H100): the fourteenth session's final
kernels (../2026-11-27-gluon-forward-configs/peeled_bwd_ab.log) and this session's (product_rows.log, call 4).

    python plot_fwd_bwd.py   (writes fwd_bwd_vs_cudnn.png beside it)
"""
import csv
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = os.path.dirname(os.path.abspath(__file__))


def rows(path, keep):
    with open(path) as f:
        lines = [line for line in f if "," in line and not line.startswith("NVIDIA")]
    return {r[0]: float(r[-1]) for r in csv.reader(lines[1:]) if keep(r)}


def product(path):
    with open(path) as f:
        lines = [line for line in f if "," in line and not line.startswith("NVIDIA")]
    # (the config column holds commas: count from the end)
    return {r[0]: float(r[-3]) for r in csv.reader(lines[1:]) if r[-6] == "fwd+bwd"}


before = rows(os.path.join(HERE, "..", "2026-11-27-gluon-forward-configs", "peeled_bwd_ab.log"), lambda r: True)
after = product(os.path.join(HERE, "product_rows.log"))
shapes = [s for s in after if s in before]
labels = [s.split(" ", 2)[2].replace(" ", "\n") for s in shapes]
x = range(len(shapes))
fig, ax = plt.subplots(figsize=(12, 4))
ax.bar([i - 0.2 for i in x], [before[s] for s in shapes], 0.4, label="fourteenth session (dQ by an adder partition)")
ax.bar([i + 0.2 for i in x], [after[s] for s in shapes], 0.4, label="fifteenth session (dQ by TMA reduce-adds)")
ax.axhline(1.0, color="black", linewidth=0.8)
ax.set_xticks(list(x), labels, fontsize=8)
ax.set_ylim(0.85, 1.1)
ax.set_ylabel("cuDNN time / ours (fwd+bwd)")
ax.set_title("Gluon forward+backward vs SDPA cuDNN, H100, bf16, B*N=16384, H16 (CUDA-graph GPU time)")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(HERE, "fwd_bwd_vs_cudnn.png"), dpi=110)
