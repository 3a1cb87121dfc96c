"""GPU correctness sweep and speed/memory table of the fused attention kernel against PyTorch's attentions.

    PYTHONPATH=. python3 tools/bench_attention.py --out OUTDIR [--shapes 8,16,1024,64 ...] [--mods none bias softcap]
                                                  [--skip-check] [--skip-speed] [--plot]
    PYTHONPATH=. python3 tools/bench_attention.py --out OUTDIR --skip-check --plot \
        --lengths 1024 2048 4096 8192 16384 --batch-tokens 16384 --heads 16 --head-dims 64 128

1. Correctness: bf16 / fp16 / fp32 at larger sizes, causal and not, bias, mask, softcap, ALiBi, sliding windows,
   GQA, dropout (the reference draws the kernels' keep-mask from the same seed); forward and gradients, each held
   to ``max|ours - ref64| <= 2 * max|eager_same_dtype - ref64| + floor``.
2. Speed: TF/s = 4*B*H*N^2*D / time (halved when causal; fwd+bwd counts 3.5x the forward FLOPs), median of
   ``triton.testing.do_bench``, and the peak memory a call allocates beyond its inputs, for ours, eager,
   ``torch.compile`` default, SDPA flash, SDPA cuDNN and FlexAttention (compiled, causal as a block mask built
   once per length, scale passed), in ``--dtype`` (bf16 by default), on random (never zero) inputs; with
   ``--mods`` also with a score program: a [1, H, N, N] bias added (``bias``; ``bias_grad``: a learned one, as
   T5's or Swin's relative position bias, whose gradient the backward computes too), or a Gemma-2 softcap
   ``tanh(s / 50) * 50`` (FlexAttention as a score_mod; SDPA has no softcap, and its flash / cuDNN kernels take no
   bias here: those cells are "-").
Rows are printed and appended to OUTDIR/bench_attention.csv as they are measured, each with the GPU's name, the
torch and triton versions and the date. ``--plot`` then draws every row of that CSV (several runs into one OUTDIR
add up; for a repeated case the last row wins) into OUTDIR/bench_attention.png: TF/s against N, one subplot per
head dim, mask, mode and score program, one line per implementation (needs matplotlib: ``pip install -e ".[bench]"``).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import os
import sys
import time
import traceback
from unittest import mock

import torch
import triton
import triton.testing
from tabulate import tabulate

if __package__ in (None, ""):  # run as a script: the repository root holds fuse_attn and tools
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fuse_attn.kernels import flash_attention, reference_attention  # noqa: E402
from fuse_attn.kernels import tuning  # noqa: E402
from fuse_attn.spec import AttentionSpec, CausalMask
from fuse_attn.score_program import ScoreProgramBuilder, ScoreTensor  # noqa: E402
from tools.bench_csv import appending, attention_flops  # noqa: E402

DEFAULT_SHAPES = [(8, 16, 1024, 64), (4, 16, 4096, 64), (4, 16, 4096, 128), (1, 16, 16384, 128)]
# --lengths defaults: 16 heads as in DEFAULT_SHAPES, B*N = 16384 tokens as in its N=4096 and N=16384 rows
DEFAULT_BATCH_TOKENS, DEFAULT_HEADS, DEFAULT_HEAD_DIMS = 16384, 16, (64, 128)
# Gemma-2's attention logit softcap (config.attn_logit_softcapping).
SOFTCAP = 50.0
NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
FLOOR = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


# ---- correctness ---------------------------------------------------------------------------------------------------
def alibi_slopes(heads: int, device=None):
    """Bloom's ALiBi slopes 2^(-8 h / H), h = 1..H."""
    return 2.0 ** (-8.0 * torch.arange(1, heads + 1, device=device) / heads)


def _err(a, b):
    a, b = a.double(), b.double()
    ok = ~(torch.isnan(a) | torch.isnan(b))
    if not torch.equal(torch.isnan(a), torch.isnan(b)):
        return float("inf")
    return (a[ok] - b[ok]).abs().max().item() if ok.any() else 0.0


def check_case(dtype, Z, H, M, N, D, DV=None, causal=None, bias=None, mask=None, softcap=None, alibi=False, gqa=1,
               dropout_p=0.0, dev="cuda"):
    """Score program, in order: + bias, + ALiBi (slopes[h] * (kv_idx - q_idx), the slopes a [1, H, 1, 1] bias),
    softcap ``tanh(s / c) * c``, ``where(mask, s, finfo.min)``."""
    DV = DV or D
    q = torch.randn(Z, H, M, D, device=dev, dtype=dtype)
    k = torch.randn(Z, H // gqa, N, D, device=dev, dtype=dtype)
    v = torch.randn(Z, H // gqa, N, DV, device=dev, dtype=dtype)
    b = ScoreProgramBuilder()
    x = b.add("score")
    infos, tensors = [], []

    def load(role, shape, tensor):
        infos.append(ScoreTensor(role, NAMES[dtype] if role == "bias" else "bool", tuple(n == 1 for n in shape)))
        tensors.append(tensor)
        return b.add("load", value=len(tensors) - 1)

    if bias is not None:
        x = b.add("add", x, load("bias", bias, torch.randn(*bias, device=dev, dtype=dtype)))
    if alibi:
        slopes = alibi_slopes(H, dev)
        distance = b.add("sub", b.add("kv_idx"), b.add("q_idx"))
        x = b.add("add", x, b.add("mul", load("bias", (1, H, 1, 1), slopes.view(1, H, 1, 1).to(dtype)), distance))
    if softcap is not None:
        x = b.add("mul", b.add("tanh", b.add("div", x, b.const(softcap))), b.const(softcap))
    if mask is not None:
        keep = load("mask", mask, torch.rand(*mask, device=dev) > 0.2)
        x = b.add("where", keep, x, b.const(torch.finfo(dtype).min))  # eager must represent it too
    spec = AttentionSpec(dtype=NAMES[dtype], head_dim=D, head_dim_v=DV, scale=D ** -0.5, causal=causal,
                         score_program=b.program(x), score_tensors=tuple(infos), gqa_group=gqa, dropout_p=dropout_p)
    # the reference draws the kernels' own keep-mask from the same seed
    seed = torch.randint(torch.iinfo(torch.int64).max, (), device=dev) if dropout_p else None

    def leaves(cast):
        xs = [t.detach().to(cast if cast and t.is_floating_point() else t.dtype) for t in (q, k, v, *tensors)]
        for x in xs:
            if x.is_floating_point():
                x.requires_grad_(True)
        return xs

    ours, ref, eag = leaves(None), leaves(torch.float64), leaves(None)
    o = flash_attention(*ours[:3], spec, ours[3:], dropout_seed=seed)
    r, _ = reference_attention(*ref[:3], ref[3:], spec, seed)
    e, _ = reference_attention(*eag[:3], eag[3:], spec, seed)
    dout = torch.randn_like(o)
    idx = [i for i, x in enumerate(ours) if x.requires_grad]
    go = torch.autograd.grad(o, [ours[i] for i in idx], dout)
    gr = torch.autograd.grad(r, [ref[i] for i in idx], dout.double())
    ge = torch.autograd.grad(e, [eag[i] for i in idx], dout)
    names = ["out"] + [["dq", "dk", "dv"][i] if i < 3 else f"dscore{i - 3}" for i in idx]
    worst = []
    ok = True
    for name, a, b, c in zip(names, [o, *go], [r, *gr], [e, *ge]):
        err, err_e = _err(a, b), _err(c, b)
        floor = FLOOR[dtype] * max(1.0, b.abs().max().item())
        passed = err <= 2 * err_e + floor
        ok &= passed
        worst.append(f"{name} {err:.2e}/{err_e:.2e}{'' if passed else ' FAIL'}")
    return ok, spec.describe(), "; ".join(worst)


@mock.patch.dict(os.environ, {"FUSE_ATTN_AUTOTUNE": "0"})  # one config per kernel: the sweep checks numerics, not speed
def correctness_sweep():
    # Seeded so that a failure can be rerun. One sample per case: the ALiBi slope gradient is a sum over the whole
    # score matrix with heavy cancellation, and across 9 seeds on an H200 our error / eager's ranged
    # 0.5-2.4 (eager's own error 6-30), so that entry can fail the 2x rule by chance on some seeds.
    torch.manual_seed(0)
    cases = [
        (torch.bfloat16, dict(Z=2, H=4, M=1000, N=1000, D=64)),
        (torch.bfloat16, dict(Z=2, H=4, M=1000, N=1000, D=64, causal=CausalMask())),
        (torch.bfloat16, dict(Z=1, H=4, M=777, N=1031, D=128, causal=CausalMask(0, "bottom_right"), bias=(1, 4, 777, 1031))),
        (torch.float16, dict(Z=2, H=8, M=513, N=700, D=80, gqa=2, bias=(2, 1, 1, 700), mask=(2, 1, 513, 700))),
        (torch.float16, dict(Z=1, H=2, M=300, N=300, D=256, causal=CausalMask())),
        (torch.float32, dict(Z=1, H=4, M=333, N=555, D=96, DV=64, causal=CausalMask(3, "top_left"), bias=(1, 1, 333, 555))),
        (torch.bfloat16, dict(Z=1, H=8, M=2048, N=2048, D=128, gqa=4, causal=CausalMask())),
        (torch.bfloat16, dict(Z=2, H=4, M=1000, N=1000, D=64, causal=CausalMask(), bias=(1, 4, 1000, 1000),
                              softcap=SOFTCAP)),
        (torch.float16, dict(Z=1, H=8, M=700, N=1111, D=64, alibi=True, causal=CausalMask(0, "bottom_right"))),
        (torch.bfloat16, dict(Z=1, H=8, M=1500, N=1500, D=128, gqa=2, causal=CausalMask(window=300))),
        (torch.float16, dict(Z=2, H=4, M=333, N=1000, D=64, causal=CausalMask(0, "bottom_right", window=100),
                             mask=(2, 1, 333, 1000))),
        (torch.bfloat16, dict(Z=2, H=4, M=1000, N=1000, D=64, causal=CausalMask(), dropout_p=0.1)),
        (torch.float16, dict(Z=2, H=8, M=513, N=700, D=80, gqa=2, bias=(2, 1, 1, 700), dropout_p=0.3)),
    ]
    rows, all_ok = [], True
    for dtype, kw in cases:
        t0 = time.time()
        try:
            ok, desc, detail = check_case(dtype, **kw)
        except Exception as e:  # report and go on: one failure must not hide the rest
            traceback.print_exc()
            ok, desc, detail = False, str(kw), f"{type(e).__name__}: {e}"
        all_ok &= ok
        shape = f"Z={kw['Z']} H={kw['H']} M={kw['M']} N={kw['N']}"
        rows.append(["PASS" if ok else "FAIL", desc, shape, detail, f"{time.time() - t0:.1f}s"])
        print(rows[-1], flush=True)
    print(tabulate(rows, headers=["", "spec", "shape", "max err ours/eager vs fp64", "time"]), flush=True)
    return all_ok


# (head dim, M, N, causal, GQA group) of the backward config sweep: odd lengths, M != N, head dims in two column parts
# (80, 96), and at head dim 256 (whose candidates include dK and dV in two launches) causal and GQA shapes too
BACKWARD_CONFIG_SHAPES = [(64, 1000, 1000, True, 1), (64, 1000, 1000, False, 1), (128, 1000, 1000, True, 1),
                          (64, 1024, 1024, True, 1), (64, 97, 1000, True, 1), (80, 333, 517, True, 1),
                          (96, 300, 300, True, 2), (256, 300, 300, False, 1), (256, 333, 517, True, 1),
                          (256, 300, 300, True, 2)]


def backward_config_sweep(head_dims=None):
    """Every dK/dV and dQ candidate config on a few odd shapes (of ``head_dims`` only, if given), each held to the
    2x rule (dq, dk, dv).

    Guards the tuner's config space: a config that computes a wrong gradient must never be a candidate.
    """
    import importlib

    launcher = importlib.import_module("fuse_attn.kernels.generated.launch")
    shapes = [shape for shape in BACKWARD_CONFIG_SHAPES if head_dims is None or shape[0] in head_dims]
    failures, total = [], 0
    for D, M, N, causal, group in shapes:
        spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                             causal=CausalMask() if causal else None, gqa_group=group)
        q = torch.randn(2, 4, M, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(2, 4 // group, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        dout = torch.randn(2, 4, M, D, device="cuda", dtype=torch.bfloat16)

        def grads(dtype, fn):
            leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
            fn(*leaves).backward(dout.to(dtype))
            return [x.grad for x in leaves]

        ref = grads(torch.float64, lambda *a: reference_attention(*a, [], spec)[0])
        eager = grads(torch.bfloat16, lambda *a: reference_attention(*a, [], spec)[0])
        common = launcher.common_kernel_args(q, k, v, spec)
        smem = tuning.shared_memory(q.device)
        for kind, candidates in (("bwd_dkdv", tuning.dkdv_candidates), ("bwd_dq", tuning.dq_candidates)):
            key = tuning.tuning_key(kind, q.device, launcher.codegen.load_module(spec).KERNEL_ID, q.dtype, D, D, M, N)
            for cfg in candidates(common["BLOCK_D"], common["BLOCK_DV"], 2, causal, smem):
                tuning._chosen[key] = cfg  # force this config for the kernel under test
                ours = grads(torch.bfloat16, lambda *a: flash_attention(*a, spec))
                total += 1
                errors = [(_err(o, r), _err(e, r)) for o, e, r in zip(ours, eager, ref)]
                if any(err > 2 * err_e + FLOOR[torch.bfloat16] for err, err_e in errors):
                    failures.append([f"D={D} M={M} N={N} causal={causal} GQA {group}", kind, str(cfg),
                                     "; ".join(f"{n} {a:.2e}/{b:.2e}" for n, (a, b) in zip(("dq", "dk", "dv"), errors))])
            tuning._chosen.pop(key, None)
    print(f"backward config sweep: {len(failures)} of {total} config runs broke the 2x rule", flush=True)
    if failures:
        print(tabulate(failures, headers=["shape", "kernel", "config", "err ours/eager"]), flush=True)
    return not failures


# ---- speed ---------------------------------------------------------------------------------------------------------
def _eager(q, k, v, scale, causal_mask, bias=None, softcap=None):
    s = (q @ k.transpose(-2, -1)) * scale
    if bias is not None:
        s = s + bias
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if causal_mask is not None:
        s = s.masked_fill(causal_mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def flex_method(N, scale, causal, bias, softcap, device):
    """FlexAttention with the same math as ``_eager``: the score program as a score_mod, causal as a block mask."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention)
    block_mask = None
    if causal:
        block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, N, N, device=device)
    if bias is not None:
        def score_mod(score, b, h, q_idx, kv_idx):
            return score + bias[0, h, q_idx, kv_idx]
    elif softcap is not None:
        def score_mod(score, b, h, q_idx, kv_idx):
            return torch.tanh(score / softcap) * softcap
    else:
        score_mod = None
    return lambda q, k, v: compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


def make_methods(B, H, N, D, causal, mod="none", dtype=torch.bfloat16):
    """The attentions timed for one row, and the score tensors whose gradients they compute; ``mod``: "none",
    "bias" (a random [1, H, N, N] bias added to the scores), "bias_grad" (the same, requiring its gradient) or
    "softcap" (``tanh(s / SOFTCAP) * SOFTCAP``)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    scale = D ** -0.5
    b = ScoreProgramBuilder()
    x = b.add("score")
    tensors, infos = [], []
    if mod in ("bias", "bias_grad"):
        tensors.append(torch.randn(1, H, N, N, device="cuda", dtype=dtype).requires_grad_(mod == "bias_grad"))
        infos.append(ScoreTensor("bias", NAMES[dtype], (True, False, False, False)))
        x = b.add("add", x, b.add("load", value=0))
    elif mod == "softcap":
        x = b.add("mul", b.add("tanh", b.add("div", x, b.const(SOFTCAP))), b.const(SOFTCAP))
    spec = AttentionSpec(dtype=NAMES[dtype], head_dim=D, head_dim_v=D, scale=scale, causal=CausalMask() if causal else None,
                         score_program=b.program(x), score_tensors=tuple(infos))
    bias = tensors[0] if tensors else None
    softcap = SOFTCAP if mod == "softcap" else None
    learned = [t for t in tensors if t.requires_grad]
    compiled = torch.compile(_eager)
    mask_holder = {}

    def causal_mask():
        if causal and "m" not in mask_holder:
            mask_holder["m"] = torch.ones(N, N, dtype=torch.bool, device="cuda").triu(1)
        return mask_holder.get("m")

    def sdpa(backend):
        def f(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        return f

    methods = {
        "ours": lambda q, k, v: flash_attention(q, k, v, spec, tensors),
        "eager": lambda q, k, v: _eager(q, k, v, scale, causal_mask(), bias, softcap),
        "torch.compile": lambda q, k, v: compiled(q, k, v, scale, causal_mask(), bias, softcap),
        "FlexAttention": flex_method(N, scale, causal, bias, softcap, "cuda"),
    }
    if mod == "none":
        methods["SDPA flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
        methods["SDPA cuDNN"] = sdpa(SDPBackend.CUDNN_ATTENTION)
    return methods, learned


def measure(fn, q, k, v, dout, backward, learned=()):
    def step():
        out = fn(q, k, v)
        if backward:
            out.backward(dout)
        return out

    step()  # compile / tune outside the timing
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    ms = triton.testing.do_bench(step, warmup=25, rep=100, grad_to_none=[q, k, v, *learned] if backward else None,
                                 return_mode="median")
    return ms, peak


METHOD_NAMES = ("ours", "eager", "torch.compile", "SDPA flash", "SDPA cuDNN", "FlexAttention")
TABLE_NAMES = {"torch.compile": "torch.compile default"}
CSV_COLUMNS = ["B", "H", "N", "D", "causal", "score_program", "mode", "dtype", "method", "median_ms", "TF/s",
               "peak_bytes_above_inputs", "gpu", "torch", "triton", "date"]


def speed(shapes, methods_filter, record, mods=("none",), dtype=torch.bfloat16):
    """Time every method on every case; ``record(values)`` gets one CSV row's measured columns per method."""
    rows = []
    for (B, H, N, D), mod in ((shape, mod) for shape in shapes for mod in mods):
        for causal in (False, True):
            torch._dynamo.reset()  # each shape gets its own torch.compile graph (not the recompile limit's fallback)
            methods, learned = make_methods(B, H, N, D, causal, mod, dtype)
            for mode in ("fwd", "fwd+bwd"):
                backward = mode == "fwd+bwd"
                gen = torch.Generator(device="cuda").manual_seed(0)
                # randn is never all-zero; scaled to keep softmax away from one-hot.
                q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype, generator=gen).requires_grad_(backward)
                           for _ in range(3))
                dout = torch.randn(B, H, N, D, device="cuda", dtype=dtype, generator=gen)
                flops = attention_flops(B, H, N, D, causal, backward)
                row = [f"{B},{H},{N},{D}", ("causal" if causal else "full") + ("" if mod == "none" else f"+{mod}"), mode,
                       NAMES[dtype]]
                for name in METHOD_NAMES:
                    fn = methods.get(name)
                    if fn is None or methods_filter and name not in methods_filter:
                        row.append("-")
                        continue
                    t0 = time.time()
                    try:
                        ms, peak = measure(fn, q, k, v, dout, backward, learned)
                        cell = f"{flops / (ms * 1e-3) / 1e12:.0f} TF/s, {peak / 2**20:.0f} MiB"
                        record([B, H, N, D, int(causal), mod, mode, NAMES[dtype], name, f"{ms:.4f}",
                                f"{flops / (ms * 1e-3) / 1e12:.2f}", peak])
                    except torch.cuda.OutOfMemoryError:
                        cell = "OOM"
                        record([B, H, N, D, int(causal), mod, mode, NAMES[dtype], name, "OOM", "", ""])
                    except Exception as e:
                        cell = f"error: {type(e).__name__}"
                        print(f"{name} failed: {e}", flush=True)
                        record([B, H, N, D, int(causal), mod, mode, NAMES[dtype], name, "error", "", ""])
                    for t in (q, k, v, *learned):
                        t.grad = None
                    torch.cuda.empty_cache()
                    row.append(cell)
                    print(f"  {row[:3]} {name}: {cell} ({time.time() - t0:.1f}s)", flush=True)
                rows.append(row)
                del q, k, v, dout
                torch.cuda.empty_cache()
    return rows


def plot(csv_path, png_path):
    """TF/s against N from every row of the CSV: one subplot per (D, mask, mode, score program), one line per
    method (colours fixed per method across subplots); for a case measured more than once the last row wins."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a benchmark machine
    import matplotlib.pyplot as plt

    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    series = {}  # (D, causal, mode, score_mod, dtype) -> method -> N -> TF/s
    for row in rows:
        if not row["TF/s"]:  # OOM or error
            continue
        case = (int(row["D"]), row["causal"] == "1", row["mode"], row["score_program"], row["dtype"])
        series.setdefault(case, {}).setdefault(row["method"], {})[int(row["N"])] = float(row["TF/s"])
    if not series:
        print(f"no measured rows in {csv_path}: no plot", flush=True)
        return
    # a plot row per head dim and score program (plain first), its columns full/causal x fwd/fwd+bwd
    cases = sorted(series, key=lambda c: (c[4], c[0], c[3] != "none", c[3], c[1], c[2]))
    columns = min(4, len(cases))
    plot_rows = -(-len(cases) // columns)
    fig, axes = plt.subplots(plot_rows, columns, figsize=(4.5 * columns, 3.5 * plot_rows), squeeze=False)
    colours = {name: f"C{i}" for i, name in enumerate(METHOD_NAMES)}
    for ax, case in zip(axes.flat, cases):
        D, causal, mode, mod, dtype = case
        lengths = sorted({n for by_n in series[case].values() for n in by_n})
        for name in METHOD_NAMES:
            by_n = series[case].get(name)
            if by_n:
                ns = sorted(by_n)
                ax.plot(ns, [by_n[n] for n in ns], marker="o", color=colours[name], label=TABLE_NAMES.get(name, name))
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.minorticks_off()
        ax.set_title(f"{dtype} D={D} {'causal' if causal else 'full'}{'' if mod == 'none' else '+' + mod} {mode}")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("TF/s")
        ax.grid(True, alpha=0.3)
    for ax in axes.flat[len(cases):]:
        ax.set_visible(False)
    handles = {}
    for ax in axes.flat[:len(cases)]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles))
    runs = sorted({f"{r['gpu']}, torch {r['torch']}, triton {r['triton']}, {r['date']}" for r in rows})
    fig.suptitle("fused attention: " + "; ".join(runs))
    fig.tight_layout(rect=(0, 0.06, 1, 1))  # leave the bottom for the legend
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    print(f"plot: {png_path}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    shapes_group = ap.add_mutually_exclusive_group()
    shapes_group.add_argument("--shapes", nargs="*", help="B,H,N,D ...", default=None)
    shapes_group.add_argument("--lengths", nargs="*", type=int, default=None,
                              help="sequence lengths N: shapes (B, --heads, N, D) for each of --head-dims, "
                                   "B = max(1, --batch-tokens // N)")
    ap.add_argument("--batch-tokens", type=int, default=DEFAULT_BATCH_TOKENS, help="B*N with --lengths")
    ap.add_argument("--heads", type=int, default=DEFAULT_HEADS, help="H with --lengths")
    ap.add_argument("--head-dims", nargs="*", type=int, default=list(DEFAULT_HEAD_DIMS), help="D values with --lengths")
    ap.add_argument("--methods", nargs="*", default=None, choices=METHOD_NAMES, help="subset of the methods timed")
    ap.add_argument("--dtype", default="bfloat16", choices=list(NAMES.values()), help="of q, k, v and the bias (speed)")
    ap.add_argument("--mods", nargs="*", default=["none"], choices=["none", "bias", "bias_grad", "softcap"],
                    help="score programs timed per shape (default: none)")
    ap.add_argument("--plot", action="store_true", help="draw OUTDIR/bench_attention.csv into OUTDIR/bench_attention.png")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--check-backward-configs", action="store_true", help="run every backward candidate config on odd shapes")
    ap.add_argument("--backward-config-head-dims", nargs="*", type=int, default=None,
                    help="with --check-backward-configs: only the shapes of these head dims (default: all)")
    args = ap.parse_args(argv)
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # said before measuring, not after
        print('matplotlib is not installed: no plot will be written (pip install -e ".[bench]")', flush=True)
        args.plot = False
    if not (args.skip_check and args.skip_speed) or args.check_backward_configs:  # else only --plot: no GPU needed
        props = torch.cuda.get_device_properties(0)
        print(f"device: {props.name} (sm_{props.major}{props.minor}), torch {torch.__version__}, triton {triton.__version__}", flush=True)
    ok = True
    if not args.skip_check:
        t0 = time.time()
        ok = correctness_sweep()
        print(f"correctness sweep: {'PASS' if ok else 'FAIL'} in {time.time() - t0:.0f}s", flush=True)
    if args.check_backward_configs:
        ok &= backward_config_sweep(args.backward_config_head_dims)
    path = os.path.join(args.out, "bench_attention.csv")
    if not args.skip_speed:
        if args.lengths:
            shapes = [(max(1, args.batch_tokens // N), args.heads, N, D) for D in args.head_dims for N in args.lengths]
        elif args.shapes:
            shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes]
        else:
            shapes = DEFAULT_SHAPES
        os.makedirs(args.out, exist_ok=True)
        if os.path.exists(path) and os.path.getsize(path):
            with open(path, newline="") as f:
                header = next(csv.reader(f), None)
            if header != CSV_COLUMNS:
                print(f"{path} has other columns ({header}): choose another --out", flush=True)
                return 2
        run_info = [props.name, torch.__version__, triton.__version__, datetime.date.today().isoformat()]
        with appending(path, CSV_COLUMNS, run_info) as record:
            rows = speed(shapes, args.methods, record, args.mods, getattr(torch, args.dtype))
        headers = ["B,H,N,D", "mask", "mode", "dtype"] + [TABLE_NAMES.get(name, name) for name in METHOD_NAMES]
        print(tabulate(rows, headers=headers, tablefmt="github"), flush=True)
        for key, cfg in tuning.chosen_configs().items():
            print("tuned:", key, "->", cfg, flush=True)
    if args.plot:
        if os.path.exists(path):
            plot(path, os.path.join(args.out, "bench_attention.png"))
        else:
            print(f"no {path} to plot", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
