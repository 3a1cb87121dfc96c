"""Draws bias_gradient.png: forward + backward time and memory of an ``s + bias`` attention whose bias needs a
gradient, four methods (call3.log's table, bias_gradient_bench.py on an H200). Run from this folder: python plot.py"""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METHODS = ["gluon + dS stores", "gluon fwd + template bwd", "flex", "gluon, no bias gradient"]


def table(path):
    """The rows of the log's last table (the one with a header): case -> method -> (fwd+bwd ms, MiB)."""
    lines = open(path).read().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("case ") and "fwd+bwd ms" in line)
    out = {}
    for line in lines[start + 2:]:
        if not line.strip() or line.startswith("case"):
            break
        method = next(m for m in METHODS if f"  {m}  " in line)
        case = line.split("  ")[0]
        numbers = line.split(method)[1].split()
        out.setdefault(case, {})[method] = (float(numbers[1]), float(numbers[3]))
    return out


rows = table("call3.log")
cases = list(rows)
fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
width = 0.2
for i, method in enumerate(METHODS):
    xs = [x + (i - 1.5) * width for x in range(len(cases))]
    left.bar(xs, [rows[c][method][0] for c in cases], width, label=method)
    right.bar(xs, [rows[c][method][1] for c in cases], width, label=method)
for ax, label in ((left, "forward + backward, ms (do_bench)"), (right, "MiB allocated by the step")):
    ax.set_xticks(range(len(cases)), [f"{c}\n(D{64 if c in ('T5-small encoder', 'per-row bias') else 128})"
                                      for c in cases], fontsize=8)
    ax.set_ylabel(label)
left.set_title("a bias that needs a gradient, bf16, H200")
right.set_title("memory (D64 rows: the template's backward runs since call 4)")
left.legend(fontsize=8)
fig.tight_layout()
fig.savefig("bias_gradient.png", dpi=110)
