"""persistent_grid.png: the unmasked D128 forward on a persistent grid against one query block a CTA (left: speed-up,
two runs, calls 2 and 3) and both against SDPA cuDNN (right: cuDNN's GPU time / ours, call 3), H200. Run here."""
import csv
import io

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt


def rows(log, first):
    lines = open(log).read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


call2 = [r for r in rows("call2.log", "shape,variant") if r["variant"] == "persistent+TMA" and "D128 full" in r["shape"]]
call3 = [r for r in rows("call3.log", "shape,persistent") if r["shape"].startswith(("B16 H16/16", "B8 H16/16", "B4 H16/16 N4096", "B1 H16/16"))]
ns = [int(r["shape"].split("N")[1].split()[0]) for r in call3]
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
x = range(len(ns))
left.bar([i - 0.2 for i in x], [float(r["variant_vs_package"]) for r in call2], 0.4, label="run 1 (call 2)")
left.bar([i + 0.2 for i in x], [float(r["speed_up"]) for r in call3], 0.4, label="run 2 (call 3)")
left.axhline(1.0, color="k", lw=0.8)
left.axvline(1.5, color="grey", ls="--", lw=0.8)
left.text(1.55, 1.06, "persistent below 4096 keys", fontsize=8)
left.set_ylim(0.9, 1.1)
left.set_title("persistent / one block a CTA (GPU time)", fontsize=10)
right.bar([i - 0.2 for i in x], [float(r["one_block_vs_cudnn"]) for r in call3], 0.4, label="one block a CTA")
right.bar([i + 0.2 for i in x], [float(r["package_vs_cudnn"]) for r in call3], 0.4, label="persistent")
right.axhline(1.0, color="k", lw=0.8)
right.set_ylim(0.8, 1.1)
right.set_title("cuDNN time / ours (call 3)", fontsize=10)
for ax in (left, right):
    ax.set_xticks(list(x), [f"N{n}" for n in ns])
    ax.legend(fontsize=8)
fig.suptitle("Gluon forward, unmasked, head dim 128, B*N = 16384, H16, bf16, NVIDIA H200 (torch 2.11, triton 3.6)",
             fontsize=10)
fig.tight_layout()
fig.savefig("persistent_grid.png", dpi=110)
