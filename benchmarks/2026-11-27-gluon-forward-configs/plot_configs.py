"""Draws d64_configs.png from configs_run2.log (fwd_configs.py check bench, after the n_full cap) and prints the
table BENCHMARKS.md quotes: the Gluon forward at head dim 64, per config, GPU time against SDPA cuDNN.

    python3 plot_configs.py
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    with open(os.path.join(HERE, "configs_run2.log")) as f:
        lines = [line for line in f if line.startswith("B") and " D64 " in line]
    ratio = {}  # (mask, N) -> {config: ratio to cuDNN}
    for line in lines:  # the config is a tuple with commas: split from both ends
        shape, rest = line.split(",", 1)
        config, gpu, _, vs = rest.strip().rsplit(",", 3)
        _, _, n, _, mask = shape.split()
        if config != "cuDNN":
            ratio.setdefault((mask, int(n[1:])), {})[config] = float(vs)
    configs = list(next(iter(ratio.values())))
    print("| D64 | N | " + " | ".join(configs) + " |")
    print("|---|---|" + "---|" * len(configs))
    for (mask, n), r in sorted(ratio.items()):
        print(f"| {mask} | {n} | " + " | ".join(f"{r[c]:.2f}x" for c in configs) + " |")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, mask in zip(axes, ("full", "causal")):
        ns = sorted(n for m, n in ratio if m == mask)
        for config in configs:
            ax.plot(ns, [ratio[mask, n][config] for n in ns], marker="o", label=config)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_title(f"D64 {mask}, B*N = 16384, H16, bf16")
        ax.set_xlabel("N")
    axes[0].set_ylabel("GPU time: cuDNN / Gluon forward")
    axes[1].legend(title="(rows a warpgroup, key tile, stages, consumers)", fontsize=8)
    fig.suptitle("The Gluon forward's configs at head dim 64 against SDPA cuDNN (H100, torch 2.11, triton 3.6)")
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "d64_configs.png"), dpi=110)


if __name__ == "__main__":
    main()
