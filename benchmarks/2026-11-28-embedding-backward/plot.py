"""Draws embedding_backward.png: the table gradient's GPU time against eager's and Inductor's at T5's shapes
(table_gradient_call2.csv), and T5-small's training step before and after (t5_train_call2.csv and the twenty-first
session's call 5). Run from this folder: python plot.py"""
import csv

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METHODS = [("fuse_attn op under torch.compile", "fuse_attn (compiled)"),
           ("eager embedding_dense_backward", "eager (sort + segment sums)"),
           ("torch.compile (Inductor's atomics)", "torch.compile (atomic adds)")]

rows = list(csv.DictReader(open("table_gradient_call2.csv")))
cases = list(dict.fromkeys(r["case"] for r in rows))
fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
width = 0.27
for i, (method, label) in enumerate(METHODS):
    times = [float(next(r["gpu_us"] for r in rows if r["case"] == c and r["method"] == method)) / 1e3 for c in cases]
    left.bar([x + (i - 1) * width for x in range(len(cases))], times, width, label=label)
left.set_yscale("log")
left.set_xticks(range(len(cases)), cases, fontsize=8)
left.set_ylabel("GPU ms a call (CUDA-graph replay, log scale)")
left.set_title("gradient of a [32, H] table looked up at N^2 positions (bf16)")
left.set_ylim(top=5e3)
left.legend(fontsize=8, ncol=3, loc="upper center")

t5 = {r["variant"]: float(r["tokens_per_s"]) for r in csv.DictReader(open("t5_train_call2.csv"))}
before = float(next(r["tokens_per_s"] for r in csv.DictReader(open(
    "../2026-11-28-gluon-bias-tma/t5_bench_models_call5.csv")) if r["variant"] == "fuse_attn" and r["mode"] == "train"))
labels = ["fuse_attn\n(before)", "fuse_attn\n(now)", "torch.compile\ndefault", "sdpa +\ntorch.compile"]
values = [before, t5["fuse_attn"], t5["inductor"], t5["sdpa+inductor"]]
bars = right.bar(labels, [v / 1e3 for v in values], color=["#9ecae1", "#3182bd", "#fd8d3c", "#fdae6b"])
for bar, v in zip(bars, values):
    right.text(bar.get_x() + bar.get_width() / 2, v / 1e3, f"{v / 1e3:,.0f}k", ha="center", va="bottom", fontsize=8)
right.set_ylabel("tokens / s (thousands)")
right.set_title("T5-small training step, B4 N4096 bf16")
fig.suptitle("NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, triton 3.6.0, 2026-11-28", fontsize=9)
fig.tight_layout()
fig.savefig("embedding_backward.png", dpi=110)
