"""The plot of BENCHMARKS.md's tenth-session section: dK/dV and dQ kernel GPU time before and after each change
(kernels_tail_first.log, kernels_final.log, kernels_masked_first_dq.log for window 128)."""
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

TAIL_FIRST = {  # dK/dV us: 3f05387 -> 62a5f2d (kernels_tail_first.log)
    "full D128": (2675.8, 2266.8), "BERT-like\nfull D64": (183.4, 168.9), "causal D128": (1265.5, 1241.2),
    "causal D64": (728.3, 697.3), "window 1024": (745.1, 711.3)}
ONE_MASKED_LOOP = {  # dK/dV us: 62a5f2d -> eadf0c8 (kernels_final.log; window 128: kernels_masked_first_dq.log)
    "window 128": (325.1, 262.8), "window 1024": (711.2, 624.8), "GPT-2-like\ncausal D64": (120.4, 98.7),
    "causal D128": (1281.5, 1279.1), "BERT-like\nfull D64": (168.1, 167.7)}
DQ_WINDOW = {"window 128": (250.9, 228.0), "window 1024": (446.2, 424.2)}  # dQ us with the merged loop

fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), gridspec_kw={"width_ratios": [5, 5, 2]})
for ax, (title, data) in zip(axes, [("dK/dV: masked tail loop first (62a5f2d)", TAIL_FIRST),
                                    ("dK/dV: one masked loop (eadf0c8)", ONE_MASKED_LOOP),
                                    ("dQ, windows: one masked loop", DQ_WINDOW)]):
    names = list(data)
    before = [data[n][0] / data[n][0] for n in names]
    after = [data[n][1] / data[n][0] for n in names]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], before, 0.4, label="before")
    ax.bar([i + 0.2 for i in x], after, 0.4, label="after")
    for i, n in enumerate(names):
        ax.text(i + 0.2, after[i] + 0.01, f"{data[n][1]:.0f} us", ha="center", fontsize=7)
    ax.set_xticks(list(x), names, fontsize=8)
    ax.set_ylim(0, 1.15)
    ax.set_title(title, fontsize=10)
axes[0].set_ylabel("kernel GPU time, relative to before")
axes[0].legend()
fig.suptitle("Backward kernels, H100 80GB HBM3, torch 2.11, triton 3.6, bf16, B4 H16 N4096 D128 unless named")
fig.tight_layout()
fig.savefig(__file__.replace("plot.py", "plot.png"), dpi=110)
