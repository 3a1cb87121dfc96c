"""Draws plot.png from this folder's logs: the mask-input fwd+bwd (gqa_mask.log) and the DDP step times
(before/ and after/), before and after the tuner fix. python3 plot.py"""
import os
import re

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = os.path.dirname(os.path.abspath(__file__))
text = open(os.path.join(here, "gqa_mask.log")).read()
before, after = text.split("## after")
kernel = {}
for label, part in (("before", before), ("after", after)):
    for heads, ms in re.findall(r"kv heads (\d+) mask blocks 1: fwd\+bwd ([\d.]+) ms", part):
        kernel[("GQA 4" if heads == "4" else "no GQA", label)] = float(ms)
steps = {}
for label in ("before", "after"):
    for model in ("gpt2", "llama"):
        log = open(os.path.join(here, label, f"ddp_{model}.log")).read()
        m = re.search(r"fuse_attn ([\d.]+) ms, sdpa\+torch.compile ([\d.]+) ms", log)
        steps[(f"DDP {model}", label)] = (float(m.group(1)), float(m.group(2)))

fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
names = ["GQA 4", "no GQA"]
x = range(len(names))
a.bar([i - 0.2 for i in x], [kernel[(n, "before")] for n in names], 0.4, label="before")
a.bar([i + 0.2 for i in x], [kernel[(n, "after")] for n in names], 0.4, label="after")
a.set_xticks(list(x), names)
a.set_ylabel("ms")
a.set_title("compiled fwd+bwd, causal mask input\nB4 H16 N2048 D64, H200")
a.legend()
names = ["DDP gpt2", "DDP llama"]
x = range(len(names))
for offset, label in ((-0.2, "before"), (0.2, "after")):
    b.bar([i + offset for i in x], [steps[(n, label)][1] / steps[(n, label)][0] for n in names], 0.4, label=label)
b.axhline(1.0, color="gray", lw=0.8)
b.set_xticks(list(x), names)
b.set_ylabel("speed-up vs sdpa + torch.compile")
b.set_title("training step, two H200s\n(same run's sdpa + torch.compile)")
b.legend()
fig.tight_layout()
fig.savefig(os.path.join(here, "plot.png"), dpi=100)
