"""Bar chart of plain_n4096/bench_attention.csv: TF/s of the generated kernels against SDPA cuDNN per case."""
import csv, pathlib
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = pathlib.Path(__file__).parent
rows = list(csv.DictReader(open(here / "plain_n4096" / "bench_attention.csv")))
cases = sorted({(r["D"], r["causal"], r["mode"]) for r in rows}, key=lambda c: (int(c[0]), c[1], c[2] != "fwd"))
tfs = {(r["D"], r["causal"], r["mode"], r["method"]): float(r["TF/s"]) for r in rows}
labels = [f"D{d} {'causal' if c == '1' else 'full'}\n{m}" for d, c, m in cases]
x = range(len(cases))
fig, ax = plt.subplots(figsize=(10, 4))
for i, (method, name) in enumerate((("ours", "fuse_attn (generated kernels only)"), ("SDPA cuDNN", "SDPA cuDNN"))):
    ax.bar([j + 0.4 * i - 0.2 for j in x], [tfs[c + (method,)] for c in cases], width=0.4, label=name)
for j, c in zip(x, cases):
    ax.text(j, tfs[c + ("SDPA cuDNN",)] + 8, f"{tfs[c + ('ours',)] / tfs[c + ('SDPA cuDNN',)]:.2f}x", ha="center", fontsize=8)
ax.set_xticks(list(x), labels, fontsize=8)
ax.set_ylabel("TF/s")
ax.set_title(f"B4 H16 N4096 bf16, {rows[0]['gpu']}, torch {rows[0]['torch']}, triton {rows[0]['triton']}, {rows[0]['date']}")
ax.legend(loc="upper left", fontsize=8)
fig.tight_layout()
fig.savefig(here / "plain_n4096" / "plot.png", dpi=110)
