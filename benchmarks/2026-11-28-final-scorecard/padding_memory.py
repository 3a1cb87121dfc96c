"""What the padding rows' forward+backward allocates beyond its inputs (issue 17's memory column: ours 80-130 KB over
FlexAttention's 258 MiB): the peak as tools/bench_variants.py measures it, then the CUDA caching allocator's record of
the call (torch.cuda.memory._record_memory_history) -- the blocks live at the peak, largest first, each with the
Python frames that allocated it. FlexAttention's block mask (built once, outside the measured call) is sized beside.
Run from the repository root on an H100/H200:  python3 padding_memory.py"""
import os
import sys

os.environ.setdefault("FUSE_ATTN_CANDIDATES", "triton,gluon")
import torch  # noqa: E402

sys.path.insert(0, os.getcwd())
from tools import bench_variants as bv  # noqa: E402

FRAMES = 6


def live_at_peak(run):
    """(peak bytes above the start, the blocks alive at that peak: (size, frames))."""
    torch.cuda.memory._record_memory_history(max_entries=200000)
    try:
        run()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    live, current, peak, at_peak = {}, 0, 0, {}
    for event in snapshot["device_traces"][0]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
            current += event["size"]
            if current > peak:
                peak, at_peak = current, dict(live)
        elif event["action"] in ("free_requested", "free_completed") and event["addr"] in live:
            current -= live.pop(event["addr"])["size"]
    return peak, sorted(at_peak.values(), key=lambda e: -e["size"])


def frames(event) -> str:
    useful = [f for f in event.get("frames", []) if f["filename"].endswith(".py") and "/torch/" not in f["filename"]
              or "output_code" in f["filename"] or "/tmp/" in f["filename"]]
    return " <- ".join(f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}" for f in useful[:FRAMES])


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    for name in ("padding_causal", "padding_causal_mask_input"):
        size = bv.VARIANTS[name].default
        torch._dynamo.reset()
        torch.manual_seed(0)
        with torch.device("cuda"):
            module = bv.VARIANTS[name].module(size).to(bv.DTYPE)
        q, k, v, dout = bv.random_inputs(size.batch, size.heads, size.seq, size.head_dim, bv.DTYPE, True)
        extra = module.extra_inputs(q.device)
        methods = bv.make_methods(module, q, k, v, extra)
        for method in ("fuse_attn", "flex"):
            fn = methods[method]

            def run():
                out = fn(q, k, v)
                out.backward(dout)
            for _ in range(3):  # compile, tune, warm
                run()
            q.grad = k.grad = v.grad = None
            torch.cuda.synchronize()
            ms, measured = bv.measure(fn, q, k, v, dout, True, [])
            q.grad = k.grad = v.grad = None
            peak, blocks = live_at_peak(run)
            q.grad = k.grad = v.grad = None
            print(f"\n{name} {method}: bench_variants' peak {measured / 2**20:.3f} MiB ({measured} B), {ms:.3f} ms; "
                  f"traced peak {peak / 2**20:.3f} MiB ({peak} B), {len(blocks)} blocks live", flush=True)
            for event in blocks[:14]:
                print(f"  {event['size']:>11} B  {frames(event)}", flush=True)
            small = [e for e in blocks if e["size"] < 2**20]
            print(f"  blocks under 1 MiB: {len(small)}, {sum(e['size'] for e in small)} B", flush=True)
        if name == "padding_causal":
            from torch.nn.attention.flex_attention import create_block_mask
            _, mask_mod = module.flex_mods(q.device, extra)
            before = torch.cuda.memory_allocated()
            block_mask = create_block_mask(mask_mod, size.batch, None, size.seq, size.seq, device=q.device)
            tensors = [t for t in vars(block_mask).values() if isinstance(t, torch.Tensor)]
            print(f"  flex's block mask (built once, outside): {sum(t.numel() * t.element_size() for t in tensors)} B "
                  f"in {len(tensors)} tensors; allocated {torch.cuda.memory_allocated() - before} B", flush=True)


if __name__ == "__main__":
    main()
