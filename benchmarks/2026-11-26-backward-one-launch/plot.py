"""The plot of BENCHMARKS.md's ninth-session section, from the numbers of this folder's logs (H100, bf16)."""
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

# one_launch.log: backward kernels without the preprocess (same in both), us; Flex: its backward kernel without its
# preprocess (window_scaling.log, perprog.log B4, conc_probe.log; other calls)
one = {"window 128": (559.1, 512.9, 412.6), "window 512": (845.4, 823.5, 674.7), "window 1024": (1177.5, 1165.9, 990.1),
       "causal": (2005.8, 1988.6, 1855.1), "full": (3947.6, 4071.1, None), "causal D64": (1078.1, 1147.6, None),
       "causal N1024 B16": (780.3, 734.8, None)}
# delta_ab.log (call 1) and delta_short_shapes.log (call 8): all backward kernels, us
delta = {"causal": (2041.6, 1984.1), "full": (3935.3, 3950.2), "causal D64": (1111.1, 1102.7),
         "window 1024": (1223.4, 1197.4), "causal N1024 B16": (825.3, 802.3), "BERT-like B32 H12 N512 D64": (307.9, 294.2),
         "GPT-2-like B8 H12 N1024 D64": (184.7, 199.1)}
fig, (a, b) = plt.subplots(1, 2, figsize=(15, 5))
names = list(one)
x = np.arange(len(names))
a.bar(x - 0.27, [one[n][0] / one[n][0] for n in names], 0.27, label="dQ + dK/dV kernels (as kept)")
a.bar(x, [one[n][1] / one[n][0] for n in names], 0.27, label="one launch (not kept)")
a.bar(x + 0.27, [(one[n][2] or np.nan) / one[n][0] for n in names], 0.27, label="FlexAttention's backward kernel")
a.set_xticks(x, names, rotation=20, fontsize=8)
a.set_ylabel("GPU time / two kernels' (lower is faster)")
a.set_title("Backward kernels, D128 B4 H16 N4096 unless named (preprocess left out)", fontsize=9)
a.axhline(1, color="gray", lw=0.5)
a.set_ylim(0.6, 1.12)
a.legend(fontsize=8, loc="lower right")
names = list(delta)
x = np.arange(len(names))
b.bar(x - 0.2, [1] * len(names), 0.4, label="preprocess + dK/dV + dQ")
b.bar(x + 0.2, [delta[n][1] / delta[n][0] for n in names], 0.4, label="dQ (writes delta) + dK/dV (kept)")
b.set_xticks(x, names, rotation=20, fontsize=8)
b.set_title("All backward kernels, D128 B4 H16 N4096 unless named", fontsize=9)
b.axhline(1, color="gray", lw=0.5)
b.set_ylim(0.8, 1.1)
b.legend(fontsize=8, loc="lower left")
fig.suptitle("H100 80GB HBM3, torch 2.11.0+cu130, triton 3.6.0, bf16, profiler GPU time (2026-11-26, ninth session)")
fig.tight_layout()
fig.savefig("plot.png", dpi=110)
