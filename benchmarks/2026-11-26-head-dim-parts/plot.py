"""Plain attention by head dim, B4 H16 N4096 bf16, H100: the generated kernels with head dims padded to one power of
two (before_head_dims.csv) and in two column parts (final_head_dims.csv), against SDPA cuDNN (same calls)."""
import csv
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

def rows(path):
    return list(csv.DictReader(open(path)))

before, after = rows("before_head_dims.csv"), rows("final_head_dims.csv")
fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
for (i, causal), (j, mode) in [((i, c), (j, m)) for i, c in enumerate("01") for j, m in enumerate(("fwd", "fwd+bwd"))]:
    ax = axes[i][j]
    for data, method, label, style in ((before, "ours", "fuse_attn, padded to 128 (before)", "o--"),
                                       (after, "ours", "fuse_attn, two parts (after)", "o-"),
                                       (before, "SDPA cuDNN", "SDPA cuDNN (before's call)", "s:"),
                                       (after, "SDPA cuDNN", "SDPA cuDNN (after's call)", "s-")):
        pts = sorted((int(r["D"]), float(r["TF/s"])) for r in data
                     if r["method"] == method and r["causal"] == causal and r["mode"] == mode)
        ax.plot([d for d, _ in pts], [t for _, t in pts], style, label=label)
    ax.set_title(f"{'causal' if causal == '1' else 'full'}, {mode}")
    ax.set_xticks([64, 80, 96, 112, 128])
    ax.set_ylabel("TF/s")
    ax.grid(alpha=0.3)
axes[1][0].set_xlabel("head dim")
axes[1][1].set_xlabel("head dim")
axes[0][0].legend(fontsize=7)
fig.suptitle("B4 H16 N4096 bf16, NVIDIA H100 80GB HBM3, torch 2.11, triton 3.6, 2026-11-26")
fig.tight_layout()
fig.savefig("plot.png", dpi=110)
