"""Paired / unpaired forward GPU time against the waves one query block a CTA fills (H100, 132 SMs), causal calls,
from paired_ab_call1.log and paired_boundary_ab.log; the pairing rule's bound (8 waves) and configs marked.

    python3 plot_pairing.py    (writes pairing_vs_waves.png)
"""
import re
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

SMS = 132
CONFIGS = {64: ((4096, 64, 1), (192, 3)), 128: ((2048, 64, 1), (128, 2))}  # head dim: (below rows: rows, consumers), else


def waves(B, H, N, D):
    below, rows, consumers = CONFIGS[D][0]
    if N < below:
        return B * H * -(-N // rows) / (2 * SMS), consumers
    rows, consumers = CONFIGS[D][1]
    return B * H * -(-N // rows) / SMS, consumers


points = {}
for log in ("paired_ab_call1.log", "paired_boundary_ab.log"):
    for line in open(log):
        m = re.match(r"B(\d+) H(\d+)/\d+ N(\d+) D(\d+) causal,", line)
        if m:
            B, H, N, D = map(int, m.groups())
            w, consumers = waves(B, H, N, D)
            points.setdefault((D, consumers), []).append((w, float(line.split(",")[7])))
fig, ax = plt.subplots(figsize=(7, 4))
for (D, consumers), xy in sorted(points.items()):
    ax.scatter(*zip(*xy), label=f"D{D}, {consumers} consumer{'s' if consumers > 1 else ''}")
ax.axhline(1.0, color="gray", lw=0.8)
ax.axvline(8, color="black", ls="--", lw=0.8, label="rule: pair up to 8 waves (1-2 consumers)")
ax.set_xscale("log", base=2)
ax.set_xlabel("waves of CTAs, one query block a CTA")
ax.set_ylabel("paired speed-up (unpaired / paired time)")
ax.set_title("Causal Gluon forward, two query blocks a CTA (H100, CUDA-graph GPU time)")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig("pairing_vs_waves.png", dpi=120)
