"""Head-dim-256 rows before and after dK/dV in two launches (H100): fwd+bwd ms of fuse_attn before / after and of
the fastest peer, from variants_old/ and variants_new/ bench_variants.csv (one call) and gemma2_*/bench_models.csv.

    python3 benchmarks/2026-11-26-split-dkdv/plot.py   # writes plot.png beside this file
"""
import csv
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = os.path.dirname(os.path.abspath(__file__))


def rows(path):
    with open(os.path.join(HERE, path), newline="") as f:
        return list(csv.DictReader(f))


old, new = rows("variants_old/bench_variants.csv"), rows("variants_new/bench_variants.csv")
labels, before, after, peer, peer_names = [], [], [], [], []
for variant, title in (("softcap_causal_d256", "softcap + causal\nB4 H8 N4096 D256"),
                       ("gqa_causal", "GQA 16/4 + causal\nB2 N4096 D256")):
    ms = lambda table, method: float(next(r["median_ms"] for r in table if r["variant"] == variant  # noqa: E731
                                          and r["mode"] == "fwd+bwd" and r["method"] == method))
    others = {r["method"]: float(r["median_ms"]) for r in new if r["variant"] == variant and r["mode"] == "fwd+bwd"
              and r["method"] != "fuse_attn"}
    best = min(others, key=others.get)
    labels.append(title)
    before.append(ms(old, "fuse_attn"))
    after.append(ms(new, "fuse_attn"))
    peer.append(others[best])
    peer_names.append(best)
models_old, models_new = rows("gemma2_old/bench_models.csv"), rows("gemma2_new/bench_models.csv")
labels.append("Gemma-2-shaped training step\n4 layers, B4 N4096 (ms / 10)")
before.append(float(models_old[0]["median_ms"]) / 10)
after.append(float(next(r["median_ms"] for r in models_new if r["variant"] == "fuse_attn")) / 10)
peer.append(float(next(r["median_ms"] for r in models_new if r["variant"] == "inductor")) / 10)
peer_names.append("torch.compile")

fig, ax = plt.subplots(figsize=(8, 4))
x = range(len(labels))
width = 0.27
for i, (values, name) in enumerate(((before, "fuse_attn before"), (after, "fuse_attn after"), (peer, "fastest peer"))):
    bars = ax.bar([j + (i - 1) * width for j in x], values, width, label=name)
    ax.bar_label(bars, fmt="%.2f", fontsize=7)
for j, name in zip(x, peer_names):
    ax.text(j + width, 0.1, name, rotation=90, fontsize=7, ha="center", va="bottom", color="white")
ax.set_xticks(list(x), labels, fontsize=8)
ax.set_ylabel("forward + backward, ms (lower is better)")
ax.set_title("dK and dV in two launches at head dim 256 (H100, bf16, torch 2.11, triton 3.6)", fontsize=9)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(HERE, "plot.png"), dpi=120)
