"""three_ctas.png from call2.log (three_ctas_ab.py's rows): left, cuDNN's time / ours for the plain causal D64 forward
at two and three CTAs an SM; right, three CTAs' speed-up over two for every row, plain and with a bias. Run from this
folder: python plot.py"""
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

# (the bias column holds commas unquoted: "bf16 [1,H,N,N]"; it lies between the shape and the quoted config)
header, *lines = [l for l in open("call2.log").read().splitlines() if l.startswith(("shape,bias", "B"))]
rows = []
for line in lines:
    shape, rest = line.split(",", 1)
    bias, rest = rest.split(',"', 1)
    config, rest = rest.split('",', 1)
    rows.append(dict(zip(header.split(","), [shape, bias, config, *rest.split(",")])))
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
plain = [r for r in rows if r["bias"] == "None"]
x = range(len(plain))
left.bar([i - 0.2 for i in x], [float(r["2ctas_vs_cudnn"]) for r in plain], 0.4, label="two CTAs an SM (before)")
left.bar([i + 0.2 for i in x], [float(r["3ctas_vs_cudnn"]) for r in plain], 0.4, label="three CTAs an SM")
left.axhline(1.0, color="k", lw=0.8)
left.set_xticks(list(x), [r["shape"].split(" D")[0] for r in plain])
left.set_ylim(0.6, 1.1)
left.set_ylabel("cuDNN time / ours")
left.set_title("causal forward, head dim 64, bf16")
left.legend(loc="lower right")
labels = [f"{r['shape'].split(' ')[2]} {'plain' if r['bias'] == 'None' else r['bias']}" for r in rows]
right.barh(range(len(rows)), [float(r["3_vs_2"]) for r in rows], color="tab:orange")
right.axvline(1.0, color="k", lw=0.8)
right.set_yticks(range(len(rows)), labels, fontsize=8)
right.set_xlim(0.9, 1.2)
right.set_xlabel("three CTAs an SM: speed-up over two")
right.invert_yaxis()
fig.suptitle("Gluon forward, one-consumer config at head dim 64: NVIDIA H200, torch 2.11, triton 3.6 (CUDA-graph time)")
fig.tight_layout()
fig.savefig("three_ctas.png", dpi=110)
