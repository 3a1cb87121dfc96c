"""Decode benchmark: attention with one query row against a long KV cache, alone and inside ``model.generate``.

    PYTHONPATH=. python3 tools/bench_decode.py --out OUTDIR [--parts op generate] [--lengths 1024 ... 32768]
                                               [--batches 1 8] [--prompts 1024 4096 8192] [--new-tokens 128]
    PYTHONPATH=. python3 tools/bench_decode.py --device cpu --tiny        # smoke test: tiny sizes, fp32

Part ``op``: the fused op for q_len 1 (LLaMA-3-8B's attention: 32 query heads of 128, 8 kv heads, bf16) at each
cache length, with the op's own dispatch (split-K, ``fuse_attn/kernels/decode.py``) and with the ordinary
forward kernel, against ``scaled_dot_product_attention`` with each backend that runs (flash, cuDNN, efficient;
with ``enable_gqa=True``, else on kv heads expanded beforehand, which the table says). Timed with
``triton.testing.do_bench`` (median); GB/s counts the K and V bytes read once. Rows go to OUTDIR/bench_decode_op.csv.

Part ``generate``: tokens/s of Hugging Face ``model.generate`` on a LLaMA-style model built from a config (the
model benchmark's: TinyLlama-1.1B's widths, 16 heads of 128, 8 kv heads, 4 layers, random weights, bf16), greedy
(``do_sample=False``) with ``min_new_tokens = max_new_tokens`` so every run makes the same number of tokens, batch 1,
a random prompt of each length, HF's default dynamic KV cache. Variants:
  fuse_attn   eager attention, ``model.forward = torch.compile(model.forward, backend="fuse_attn")``
  inductor    eager attention, ``model.forward = torch.compile(model.forward)`` (default backend)
  sdpa        ``attn_implementation="sdpa"``, not compiled (eager PyTorch; SDPA picks its own kernel)
Compiling ``model.forward`` (not ``generate``, whose Python loop and cache bookkeeping Dynamo would only break up)
is how Hugging Face documents torch.compile with generate. The cache grows by one key per token, so the first
decode steps recompile until Dynamo's automatic dynamic shapes make the cache length symbolic; the table reports
how many graphs each variant compiled in the warm-up generate and in the timed one (0 means no recompiles while
timing). One warm-up generate compiles (and tunes), then each cell is timed as the median of ``--repeats``
generates (CUDA-synchronized wall time); ``decode tok/s`` subtracts a timed ``max_new_tokens=1`` generate (the
prefill and first token) to give the rate of the cached decode steps alone. ``same tokens`` counts the generated
tokens equal to the sdpa variant's up to the first difference (bf16 rounding differs between kernels, so greedy
paths of a random model can part after a while). Rows go to OUTDIR/bench_decode_generate.csv.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F
import triton
import triton.testing
from tabulate import tabulate

if __package__ in (None, ""):  # run as a script: the repository root holds fuse_attn
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fuse_attn.backend import fuse_attn_backend  # noqa: E402
from fuse_attn.kernels.generated import decode  # noqa: E402
from fuse_attn.kernels.generated.launch import triton_forward  # noqa: E402
from fuse_attn.kernels.ops import flash_attention  # noqa: E402
from fuse_attn.report import collect_reports  # noqa: E402
from fuse_attn.spec import AttentionSpec, dtype_name  # noqa: E402
from tools.bench_csv import appending, columns_clash  # noqa: E402
from tools.bench_models import model_and_config  # noqa: E402

# part op: cache lengths of the issue (1k-32k), LLaMA-3-8B's attention shape
DEFAULT_LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768]
DEFAULT_BATCHES = [1, 8]
OP_HEADS, OP_KV_HEADS, OP_HEAD_DIM = 32, 8, 128
# part generate: prompt lengths of the issue (1k-8k) and 128 new tokens
DEFAULT_PROMPTS = [1024, 4096, 8192]
DEFAULT_NEW_TOKENS = 128
DEFAULT_REPEATS = 3
# tiny: the model-zoo test's LLaMA (width 32, 4 heads, 2 kv heads, 2 layers); op part 4 heads of 16 over 2 kv heads
TINY_LENGTHS = [64]
TINY_BATCHES = [1]
TINY_OP_SHAPE = (4, 2, 16)
TINY_PROMPTS = [16]
TINY_NEW_TOKENS = 4
TINY_REPEATS = 1
SDPA_BACKENDS = {  # name -> torch.nn.attention.SDPBackend member
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
}
GENERATE_VARIANTS = {  # name -> (attention implementation, torch.compile backend or None)
    "fuse_attn": ("eager", "fuse_attn"),
    "inductor": ("eager", "inductor"),
    "sdpa": ("sdpa", None),
}
OP_COLUMNS = ["B", "H", "H_kv", "D", "N", "kernel", "note", "median_ms", "GB_per_s", "splits", "device", "torch",
              "triton", "transformers", "date"]
GENERATE_COLUMNS = ["B", "prompt", "new_tokens", "variant", "layers", "fused_attentions", "generate_s", "first_token_s",
                    "tokens_per_s", "decode_tokens_per_s", "graphs_compiled_warmup", "graphs_compiled_timed",
                    "same_tokens", "device", "torch", "triton", "transformers", "date"]


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def timed_ms(fn, device):
    """Median ms of ``fn``: do_bench on a GPU, one perf_counter call on a CPU (a smoke test)."""
    if device == "cuda":
        return triton.testing.do_bench(fn, return_mode="median")
    fn()
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


# ---- part op -------------------------------------------------------------------------------------------------------
def op_kernels(q, k, v, spec):
    """(name, callable, note, splits) of each kernel that runs for these inputs."""
    group = q.shape[1] // k.shape[1]
    kernels = [("fuse_attn", lambda: flash_attention(q, k, v, spec), "op dispatch",
                decode.dispatch_splits(q, k, spec) if q.is_cuda else 1)]
    if q.is_cuda:
        kernels.append(("fuse_attn_no_split", lambda: triton_forward(q, k, v, [], spec), "forward kernel", 1))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    expanded = None
    for name, member in SDPA_BACKENDS.items():
        backend = getattr(SDPBackend, member)
        for gqa in (True, False):
            if not gqa and expanded is None:
                expanded = (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
            kk, vv = (k, v) if gqa else expanded

            def run(kk=kk, vv=vv, backend=backend, gqa=gqa):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=gqa)

            try:
                run()
            except RuntimeError as e:  # this backend does not take these inputs
                print(f"  {name} enable_gqa={gqa}: not run ({str(e).strip().splitlines()[0][:120]})", flush=True)
                continue
            kernels.append((name, run, "enable_gqa" if gqa else "kv heads expanded", ""))
            break
    return kernels


def bench_op(args, record):
    """Rows of the op table; ``record`` gets each kernel's CSV values. Returns (rows, headers, every kernel ran)."""
    rows, ok = [], True
    H, H_kv, D = TINY_OP_SHAPE if args.tiny else (OP_HEADS, OP_KV_HEADS, OP_HEAD_DIM)
    spec = AttentionSpec(dtype=dtype_name(args.dtype), head_dim=D, head_dim_v=D, scale=D ** -0.5, gqa_group=H // H_kv)
    for B in args.batches:
        for N in args.lengths:
            g = torch.Generator(args.device).manual_seed(0)
            q = torch.randn(B, H, 1, D, device=args.device, dtype=args.dtype, generator=g)
            k = torch.randn(B, H_kv, N, D, device=args.device, dtype=args.dtype, generator=g)
            v = torch.randn(B, H_kv, N, D, device=args.device, dtype=args.dtype, generator=g)
            kv_bytes = 2 * k.numel() * k.element_size()
            times = {}
            for name, fn, note, splits in op_kernels(q, k, v, spec):
                try:
                    ms = timed_ms(fn, args.device)
                except Exception as e:  # report and go on
                    traceback.print_exc()
                    record([B, H, H_kv, D, N, name, note, "error", "", splits])
                    ok = False
                    print(f"  B={B} N={N} {name}: error {type(e).__name__}", flush=True)
                    continue
                times[name] = ms
                record([B, H, H_kv, D, N, name, note, f"{ms:.4f}", f"{kv_bytes / ms / 1e6:.1f}", splits])
                print(f"  B={B} N={N} {name} ({note}): {ms * 1e3:.1f} us, {kv_bytes / ms / 1e6:.0f} GB/s", flush=True)
            ours = times.get("fuse_attn")
            row = [B, N, *(f"{times[n] * 1e3:.1f}" if n in times else "-" for n in ("fuse_attn", "fuse_attn_no_split", *SDPA_BACKENDS))]
            row += [f"{times[n] / ours:.2f}x" if ours and n in times else "-" for n in SDPA_BACKENDS]
            rows.append(row)
    headers = ["B", "N", "fuse_attn us", "no split-K us", *(f"{n} us" for n in SDPA_BACKENDS),
               *(f"speed-up vs {n}" for n in SDPA_BACKENDS)]
    return rows, headers, ok


# ---- part generate -------------------------------------------------------------------------------------------------
def build_generator_model(attention, prompt, new_tokens, args):
    """The model benchmark's LLaMA (bench_models.model_and_config) with its KV cache on, random weights."""
    model_cls, config = model_and_config("llama", attention, args.tiny, prompt + new_tokens)
    config.use_cache = True
    torch.manual_seed(0)  # the same weights for every variant
    model = model_cls(config).to(args.device, args.dtype).eval()
    if model.config._attn_implementation != attention:
        raise RuntimeError(f"asked for attention {attention!r}, the model uses {model.config._attn_implementation!r}")
    return model


class CountingBackend:
    """A torch.compile backend that counts the graphs it compiles and hands them to ``inner``."""

    def __init__(self, inner):
        self.inner = inner
        self.graphs = 0

    def __call__(self, gm, example_inputs, **kwargs):
        self.graphs += 1
        return self.inner(gm, example_inputs, **kwargs)


def inductor_backend(gm, example_inputs, **kwargs):
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs)  # what torch.compile's default backend ("inductor") runs


def generate_once(model, input_ids, new_tokens, device):
    """(seconds, generated token ids) of one greedy generate of exactly ``new_tokens`` tokens."""
    synchronize(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    synchronize(device)
    return time.perf_counter() - start, out[:, input_ids.shape[1]:]


def measure_generate(variant, prompt, args):
    attention, backend = GENERATE_VARIANTS[variant]
    model = build_generator_model(attention, prompt, args.new_tokens, args)
    counter = None
    if backend is not None:
        counter = CountingBackend(fuse_attn_backend if backend == "fuse_attn" else inductor_backend)
        model.forward = torch.compile(model.forward, backend=counter)
    g = torch.Generator(args.device).manual_seed(0)
    input_ids = torch.randint(0, model.config.vocab_size, (1, prompt), device=args.device, generator=g)
    with collect_reports() as reports:
        generate_once(model, input_ids, args.new_tokens, args.device)  # compiles (and tunes)
        generate_once(model, input_ids, 1, args.device)
    compiled_warmup = counter.graphs if counter else 0
    fused = sum(len(r.fused) for r in reports)
    full = [generate_once(model, input_ids, args.new_tokens, args.device) for _ in range(args.repeats)]
    first = [generate_once(model, input_ids, 1, args.device)[0] for _ in range(args.repeats)]
    compiled_timed = (counter.graphs if counter else 0) - compiled_warmup
    return dict(seconds=statistics.median(s for s, _ in full), first=statistics.median(first), tokens=full[0][1],
                fused=fused, warmup=compiled_warmup, timed=compiled_timed, layers=model.config.num_hidden_layers)


def bench_generate(args, record):
    """Rows of the generate table; ``record`` gets each cell's CSV values. Returns (rows, headers, every cell ran)."""
    rows, ok = [], True
    for prompt in args.prompts:
        results, reference = {}, None
        for variant in args.variants:
            torch._dynamo.reset()
            t0 = time.time()
            try:
                res = measure_generate(variant, prompt, args)
            except Exception as e:  # report and go on: one failure must not hide the rest
                traceback.print_exc()
                record([1, prompt, args.new_tokens, variant, "", "", "error"] + [""] * 6)
                ok = False
                print(f"  prompt {prompt} {variant}: error {type(e).__name__}", flush=True)
                continue
            finally:
                gc.collect()
                if args.device == "cuda":
                    torch.cuda.empty_cache()
            results[variant] = res
            if variant == "sdpa":
                reference = res["tokens"]
            rate = args.new_tokens / res["seconds"]
            decode = (args.new_tokens - 1) / (res["seconds"] - res["first"]) if res["seconds"] > res["first"] else float("nan")
            res.update(rate=rate, decode=decode)
            print(f"  prompt {prompt} {variant}: {rate:.1f} tok/s, decode {decode:.1f} tok/s, graphs compiled "
                  f"{res['warmup']} (warm-up) + {res['timed']} (timed) ({time.time() - t0:.1f}s)", flush=True)
        for variant, res in results.items():
            same = same_prefix(res["tokens"], reference) if reference is not None else ""
            record([1, prompt, args.new_tokens, variant, res["layers"], res["fused"] if variant == "fuse_attn" else "",
                    f"{res['seconds']:.4f}", f"{res['first']:.4f}", f"{res['rate']:.2f}", f"{res['decode']:.2f}",
                    res["warmup"], res["timed"], same])
            rows.append([prompt, variant, res["fused"] if variant == "fuse_attn" else "", f"{res['rate']:.1f}",
                         f"{res['decode']:.1f}", f"{res['warmup']} + {res['timed']}", same])
        for other in ("inductor", "sdpa"):
            if "fuse_attn" in results and other in results:
                rows.append([prompt, f"fuse_attn / {other}", "", f"{results['fuse_attn']['rate'] / results[other]['rate']:.2f}x",
                             f"{results['fuse_attn']['decode'] / results[other]['decode']:.2f}x", "", ""])
    headers = ["prompt", "variant", "fused", "tok/s", "decode tok/s", "graphs compiled (warm-up + timed)",
               "same tokens as sdpa"]
    return rows, headers, ok


def same_prefix(tokens, reference):
    """How many leading tokens of ``tokens`` equal ``reference``'s."""
    differ = (tokens[0] != reference[0]).nonzero()
    return int(differ[0]) if len(differ) else tokens.shape[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--parts", nargs="*", default=["op", "generate"], choices=["op", "generate"])
    ap.add_argument("--lengths", nargs="*", type=int, default=None, help=f"op: cache lengths (default {DEFAULT_LENGTHS})")
    ap.add_argument("--batches", nargs="*", type=int, default=None, help=f"op: batch sizes (default {DEFAULT_BATCHES})")
    ap.add_argument("--prompts", nargs="*", type=int, default=None, help=f"generate: prompt lengths (default {DEFAULT_PROMPTS})")
    ap.add_argument("--new-tokens", type=int, default=None, help=f"generate: tokens per generate (default {DEFAULT_NEW_TOKENS})")
    ap.add_argument("--repeats", type=int, default=None, help=f"generate: timed generates per cell (default {DEFAULT_REPEATS})")
    ap.add_argument("--variants", nargs="*", default=list(GENERATE_VARIANTS), choices=list(GENERATE_VARIANTS))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (a smoke test)")
    args = ap.parse_args(argv)
    if "generate" in args.parts and importlib.util.find_spec("transformers") is None:
        print("transformers is not installed: the generate part builds a Hugging Face model from its config "
              '(pip install transformers, or pip install -e ".[bench]")', file=sys.stderr, flush=True)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU, or --device cpu --tiny for a smoke test", file=sys.stderr, flush=True)
        return 2
    import transformers

    args.dtype = torch.bfloat16 if args.device == "cuda" else torch.float32  # fp32 on a CPU, as the tests
    args.lengths = args.lengths or (TINY_LENGTHS if args.tiny else DEFAULT_LENGTHS)
    args.batches = args.batches or (TINY_BATCHES if args.tiny else DEFAULT_BATCHES)
    args.prompts = args.prompts or (TINY_PROMPTS if args.tiny else DEFAULT_PROMPTS)
    args.new_tokens = args.new_tokens or (TINY_NEW_TOKENS if args.tiny else DEFAULT_NEW_TOKENS)
    args.repeats = args.repeats or (TINY_REPEATS if args.tiny else DEFAULT_REPEATS)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"device: {device_name}, torch {torch.__version__}, triton {triton.__version__}, "
          f"transformers {transformers.__version__}", flush=True)
    run_info = [device_name, torch.__version__, triton.__version__, transformers.__version__,
                datetime.date.today().isoformat()]
    os.makedirs(args.out, exist_ok=True)
    ok = True
    for part, columns, bench in (("op", OP_COLUMNS, bench_op), ("generate", GENERATE_COLUMNS, bench_generate)):
        if part not in args.parts:
            continue
        path = os.path.join(args.out, f"bench_decode_{part}.csv")
        if columns_clash(path, columns):
            return 2
        with appending(path, columns, run_info) as record:
            rows, headers, part_ok = bench(args, record)
        ok = ok and part_ok
        print(tabulate(rows, headers=headers, tablefmt="github"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
