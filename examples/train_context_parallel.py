"""Train a LLaMA-shaped Hugging Face model (eager attention) on a long sequence sharded over the ranks (context
parallel: fuse_attn's ring), against the same training on the whole sequence in each process.

    torchrun --nproc-per-node 2 examples/train_context_parallel.py [--length 32768] [--steps 8]
    torchrun --nproc-per-node 2 examples/train_context_parallel.py --device cpu    # gloo, a tiny model, fp32

Both variants are compiled with ``backend="fuse_attn"`` from the same weights and see the same batch (one sequence,
the same on every rank). The sharded one gets its tokens, labels, position ids and an all-ones padding mask through
``fuse_attn.graph.context_parallel.shard_sequence``, sums its loss and gradients over the ranks, and steps AdamW on the
result. Rank 0 prints the attentions fused as rings, the losses of both variants (the sharded one's within
train_distributed's loss floor of the whole-sequence run's: 1e-4 in fp32, 2e-2 in bf16, two implementations'
rounding drifting over the AdamW steps), and on a GPU the median step time and peak memory of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

if not __package__:  # run as a script: the repository root, for examples.common
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from examples.train_distributed import LOSS_FLOOR, build_model, init_distributed  # noqa: E402
from fuse_attn.graph.context_parallel import ContextParallel, shard_sequence  # noqa: E402
from fuse_attn.report import collect_reports  # noqa: E402


def summed_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum", ignore_index=-100)


def train(args, device, dtype, tokens, cp) -> dict:
    """Losses (mean per token over the whole sequence), rings fused, median step ms and peak memory of one variant:
    ``cp`` None -- the whole sequence in this process -- or the sequence sharded as ``cp`` says."""
    torch._dynamo.reset()
    model, layers = build_model("llama", args.tiny, "eager", args.length)
    model = model.to(device=device, dtype=dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    options = {} if cp is None else {"fuse_attn.context_parallel": cp}
    run = torch.compile(model, backend="fuse_attn", options=options)
    labels = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], -100)], 1)  # the next token; none for the last
    positions = torch.arange(args.length, device=device).expand_as(tokens)
    inputs = dict(input_ids=tokens, position_ids=positions, attention_mask=torch.ones_like(tokens))
    if cp is not None:
        inputs = {name: shard_sequence(t, 1, cp) for name, t in inputs.items()}
        labels = shard_sequence(labels, 1, cp)
    count = tokens.numel() - tokens.shape[0]

    losses, times, rings = [], [], None
    for step in range(args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with collect_reports() as reports:
            loss = summed_loss(run(**inputs).logits, labels)
        if step == 0:
            rings = sum(1 for r in reports for v in r.verdicts if v.fused and v.runs and "context parallel" in v.runs)
        loss.backward()
        loss = loss.detach()
        if cp is not None:  # each rank holds a share of the tokens: the loss and the gradients are sums over ranks
            dist.all_reduce(loss)
            for p in model.parameters():
                dist.all_reduce(p.grad)
        for p in model.parameters():
            p.grad /= count
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
        losses.append(loss.item() / count)
        if dist.get_rank() == 0:  # progress as it goes: the first steps compile and tune for minutes at 32k
            variant = "whole sequence" if cp is None else "context parallel"
            print(f"  {variant} step {step}: loss {losses[-1]:.5f}, {times[-1]:.0f} ms", file=sys.stderr, flush=True)
    warm = times[args.warmup:]
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return dict(losses=losses, rings=rings, layers=layers, ms=statistics.median(warm) if warm else None,
                memory=memory)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--length", type=int, default=None, help="the whole sequence (default: 32768; cpu: 32)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the timing (compiling, tuning)")
    args = parser.parse_args(argv)
    args.tiny = args.device == "cpu"
    args.length = args.length or (32 if args.tiny else 32768)

    owns_group = not dist.is_initialized()
    device, dtype = init_distributed(args.device)
    vocab = 64 if args.tiny else 32000
    tokens = torch.randint(0, vocab, (1, args.length), generator=torch.Generator().manual_seed(0)).to(device)

    results = {}
    for name, cp in (("whole sequence", None), ("context parallel", ContextParallel())):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        results[name] = train(args, device, dtype, tokens, cp)
    ok = report(args, results, dtype) if dist.get_rank() == 0 else True
    if owns_group:
        dist.destroy_process_group()
    return 0 if ok else 1


def report(args, results: dict, dtype) -> bool:
    whole, sharded = results["whole sequence"], results["context parallel"]
    world = dist.get_world_size()
    print(f"llama, 1 x {args.length} tokens, context parallel over {world} {args.device} processes "
          f"({args.length // world} tokens each), {str(dtype).removeprefix('torch.')}, torch {torch.__version__}")
    fused_ok = sharded["rings"] == sharded["layers"]
    print(f"attentions fused as rings: {sharded['rings']} of {sharded['layers']}{'' if fused_ok else ' -- FAILED'}")
    print("step | whole sequence | context parallel")
    for i, (a, b) in enumerate(zip(whole["losses"], sharded["losses"])):
        print(f"{i:4d} | {a:.5f} | {b:.5f}")
    distance = max(abs(a - b) for a, b in zip(whole["losses"], sharded["losses"]))
    allowed = LOSS_FLOOR[dtype]
    loss_ok = distance <= allowed
    print(f"loss distance {distance:.3g} (allowed {allowed:.3g}){'' if loss_ok else ' -- FAILED'}")
    if args.device == "cuda":
        print("median step: " + ", ".join(f"{n} {r['ms']:.1f} ms, peak {r['memory']:.1f} GiB" for n, r in results.items()))
    return fused_ok and loss_ok


if __name__ == "__main__":
    sys.exit(main())
