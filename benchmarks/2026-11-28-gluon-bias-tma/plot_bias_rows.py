"""The session's plot from its CSVs: issue 17's bias rows against FlexAttention (compiled, call 3) and T5-small's
step against torch.compile default (calls 4 and 5). Run from this folder: ``python plot_bias_rows.py``."""
import csv

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


variants = rows("bench_variants_call3.csv")
ms = {(r["variant"], r["mode"], r["method"]): float(r["median_ms"]) for r in variants}
labels, speedups = [], []
for variant, mode in sorted({(v, m) for v, m, _ in ms}):
    name = {"alibi_causal_precomputed": "ALiBi precomputed,\ncausal", "dense_bias": "dense learned\nbias"}[variant]
    labels.append(f"{name}\n{mode}")
    speedups.append(ms[variant, mode, "flex"] / ms[variant, mode, "fuse_attn"])

t5_before, t5_after = rows("t5_bench_models.csv"), rows("t5_bench_models_call5.csv")
tok = {}
for when, table in (("before", t5_before), ("after", t5_after)):
    for r in table:
        tok[when, r["mode"], r["variant"]] = float(r["tokens_per_s"])

fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
left.bar(range(len(labels)), speedups, color="tab:blue")
left.axhline(1.0, color="black", linewidth=0.8)
left.set_xticks(range(len(labels)), labels, fontsize=7)
left.set_ylabel("FlexAttention time / fuse_attn time")
left.set_title("bias rows, B4 H16 N4096 D128 (H100, compiled)", fontsize=9)
modes = ["train", "infer"]
width = 0.2
series = [("fuse_attn, call 4", "before", "fuse_attn"), ("fuse_attn, call 5", "after", "fuse_attn"),
          ("sdpa + torch.compile", "after", "sdpa+inductor")]
for i, (name, when, variant) in enumerate(series):
    right.bar([m + (i - 1) * width for m in range(len(modes))],
              [tok[when, mode, variant] / tok["after", mode, "inductor"] for mode in modes], width, label=name)
right.axhline(1.0, color="black", linewidth=0.8)
right.set_xticks(range(len(modes)), modes)
right.set_ylabel("tokens/s / torch.compile default's")
right.set_title("T5-small, B4 N4096 bf16 (H100)", fontsize=9)
right.legend(fontsize=7)
fig.tight_layout()
fig.savefig("bias_rows_and_t5.png", dpi=110)
