"""Draws bwd_vs_cudnn.png from bench_1k.log and bench_4k16k.log (bwd_probe.py bench) and prints the table
BENCHMARKS.md quotes: per shape, GPU time against SDPA cuDNN of the Gluon backward, the template's backward, and
forward + backward with both Gluon kernels.

    python3 plot_bwd.py
"""
import csv
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def rows():
    for name in ("bench_1k.log", "bench_4k16k.log"):
        with open(os.path.join(HERE, name)) as f:
            lines = [line for line in f if line.count(",") == 6 and not line.startswith("shape,")]
        yield from csv.reader(lines)


def main():
    ratio = {}  # (D, mask, N) -> {method: ratio to cuDNN}
    for shape, _, method, gpu, wall, _, vs in rows():
        _, _, n, d, mask = shape.split()
        ratio.setdefault((int(d[1:]), mask, int(n[1:])), {})[method] = (float(vs), float(gpu), float(wall))
    print("| D, mask | N | bwd: template | bwd: Gluon | fwd+bwd: Gluon fwd + Gluon bwd | GPU ms (Gluon fwd+bwd / cuDNN) |")
    print("|---|---|---|---|---|---|")
    for (d, mask, n), r in sorted(ratio.items()):
        print(f"| D{d} {mask} | {n} | {r['template bwd'][0]:.2f}x | {r['gluon bwd'][0]:.2f}x | "
              f"{r['gluon fwd+bwd'][0]:.2f}x | {r['gluon fwd+bwd'][1]:.3f} / {r['cuDNN'][1]:.3f} |")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, d in zip(axes, (64, 128)):
        for mask, style in (("full", "-"), ("causal", "--")):
            keys = sorted(k for k in ratio if k[0] == d and k[1] == mask)
            ns = [k[2] for k in keys]
            for method, color in (("template bwd", "tab:gray"), ("gluon bwd", "tab:blue"), ("gluon fwd+bwd", "tab:green")):
                ax.plot(ns, [ratio[k][method][0] for k in keys], style, color=color, marker="o",
                        label=f"{method}, {mask}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length N (B*N = 16384, H16, bf16)")
        ax.set_title(f"head dim {d}")
    axes[0].set_ylabel("speed vs SDPA cuDNN (GPU time)")
    axes[1].legend(fontsize=7, loc="upper right", ncol=2)
    fig.suptitle("Plain attention backward on an H100: Gluon and template against cuDNN (2026-11-27)")
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "bwd_vs_cudnn.png"), dpi=110)


if __name__ == "__main__":
    main()
