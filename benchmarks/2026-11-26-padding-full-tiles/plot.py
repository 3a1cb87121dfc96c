"""Bar chart of this session's two variant rows (H200): before / after against the fastest peer, from the CSVs of
bench_variants in this folder and in ../2026-11-26-wide-heads. Run from the repository root."""
import csv
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

here, wide = "benchmarks/2026-11-26-padding-full-tiles", "benchmarks/2026-11-26-wide-heads"


def times(path):
    with open(path) as f:
        return {(r["variant"], r["mode"], r["method"]): float(r["median_ms"]) for r in csv.DictReader(f)}


pad_before, pad_after = times(f"{here}/before.csv"), times(f"{here}/after.csv")
cap_before, cap_after = times(f"{wide}/bench_variants_before.csv"), times(f"{wide}/bench_variants_sweep_candidates.csv")
groups = []
for mode in ("fwd", "fwd+bwd"):
    groups.append((f"padding + causal\n{mode}", pad_before["padding_causal", mode, "fuse_attn"],
                   pad_after["padding_causal", mode, "fuse_attn"], "Flex", pad_after["padding_causal", mode, "flex"]))
    peers = {m: cap_after["softcap_causal_d256", mode, m] for m in ("flex", "torch_compile")}
    best = min(peers, key=peers.get)
    groups.append((f"softcap D256\n{mode}", cap_before["softcap_causal_d256", mode, "fuse_attn"],
                   cap_after["softcap_causal_d256", mode, "fuse_attn"], {"flex": "Flex", "torch_compile": "torch.compile"}[best],
                   peers[best]))
fig, ax = plt.subplots(figsize=(9, 4))
width = 0.27
for i, (label, before, after, peer, peer_ms) in enumerate(groups):
    for j, (value, name, color) in enumerate(((before, "before", "#bbbbbb"), (after, "after", "#1f77b4"),
                                               (peer_ms, "fastest peer", "#ff7f0e"))):
        ax.bar(i + (j - 1) * width, value, width, color=color, label=name if i == 0 else None)
        ax.text(i + (j - 1) * width, value, f"{value:.2f}", ha="center", va="bottom", fontsize=7)
    ax.text(i + width, 0, peer, ha="center", va="bottom", fontsize=6, rotation=90, color="white")
ax.set_xticks(range(len(groups)), [g[0] for g in groups], fontsize=8)
ax.set_ylabel("ms per call (lower is better)")
ax.set_title("fuse_attn before / after this session's changes, H200, bf16, B4 N4096 (torch 2.11, triton 3.6)", fontsize=9)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(f"{here}/plot.png", dpi=120)
