"""causal_persistent.png: the causal Gluon forward on a persistent grid of items of two blocks against one query block
a CTA and against paired blocks (left: even numbers of blocks a head, calls 2 and 7; middle: odd numbers, call 7,
heads 2 g and 2 g + 1's items side by side), and the product's plain causal rows against SDPA cuDNN before (the last
session's call 5) and after (call 7) (right), H200. Run here."""
import csv
import io

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt


def rows(log, first):
    lines = open(log).read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    out = []
    for line in lines[start + 1:]:
        if not line.startswith("B"):
            break
        out.append(line)
    if "(" in out[0] and '"' not in out[0]:  # product_rows.py's lines: the config unquoted, "(64, 128, 3, 3)"
        out = [line.replace(",(", ',"(').replace("),", ')",') for line in out]
    return list(csv.DictReader(io.StringIO("\n".join([lines[start]] + out))))


def label(row):
    b, h, n, d = row["shape"].split()[:4]
    return f"{d} {n}\n{b} {h.split('/')[0]}"


EVEN = ("B16 H16/16 N1024 D64", "B8 H16/16 N2048 D64", "B16 H16/16 N1024 D128", "B8 H16/16 N2048 D128")
call2 = {r["shape"].rsplit(" ", 1)[0]: r for r in rows("call2.log", "shape,config,waves")}
call7 = {r["shape"].rsplit(" ", 1)[0]: r for r in rows("call7.log", "shape,config,waves")}
odd = [r for s, r in call7.items() if s not in EVEN]
fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2), gridspec_kw={"width_ratios": [4, 7, 4]})
x = range(len(EVEN))
left.bar([i - 0.2 for i in x], [float(call2[s]["persistent_vs_one"]) for s in EVEN], 0.4, label="vs one block (call 2)")
left.bar([i + 0.2 for i in x], [float(call7[s]["persistent_vs_one"]) for s in EVEN], 0.4, label="vs one block (call 7)")
left.plot(list(x), [float(call7[s]["persistent_vs_paired"]) for s in EVEN], "kx", label="vs paired (call 7)")
left.set_xticks(list(x), [label(call7[s]) for s in EVEN], fontsize=8)
left.set_title("even blocks a head: persistent speed-up", fontsize=10)
xo = range(len(odd))
middle.bar(list(xo), [float(r["persistent_vs_one"]) for r in odd], 0.5, label="vs one block (call 7)")
middle.plot(list(xo), [float(r["persistent_vs_paired"]) for r in odd], "kx", label="vs paired (call 7)")
middle.set_xticks(list(xo), [label(r) + ("\n(2048: even)" if "N2048" in r["shape"] else "") for r in odd], fontsize=8)
middle.set_title("odd blocks a head (middle blocks of two heads an item)", fontsize=10)
before = {(r["shape"], r["what"]): r for r in rows("../2026-11-28-short-unmasked-forward/call5.log", "shape,config,what")}
after = {(r["shape"], r["what"]): r for r in rows("call7.log", "shape,config,what")}
keys = [k for k in after if "causal" in k[0] and k[1] == "fwd"]
xr = range(len(keys))
right.bar([i - 0.2 for i in xr], [float(before[k]["gpu_vs_cudnn"]) for k in keys], 0.4, label="before (25th, call 5)")
right.bar([i + 0.2 for i in xr], [float(after[k]["gpu_vs_cudnn"]) for k in keys], 0.4, label="now (call 7)")
right.set_xticks(list(xr), [" ".join(k[0].split()[2:4]) for k in keys], fontsize=8)
right.set_title("causal forward: cuDNN time / ours", fontsize=10)
for ax, low in ((left, 0.9), (middle, 0.9), (right, 0.85)):
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylim(low, 1.12)
    ax.legend(fontsize=8)
fig.suptitle("Gluon forward, causal, bf16, CUDA-graph GPU time, NVIDIA H200 (torch 2.11, triton 3.6)", fontsize=10)
fig.tight_layout()
fig.savefig("causal_persistent.png", dpi=110)
