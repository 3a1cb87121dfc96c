"""Train a Hugging Face decoder (GPT-2- or LLaMA-shaped, eager attention) over several processes, data-parallel
under DDP or FSDP2 (``fully_shard`` per block) or tensor-parallel (LLaMA: ``parallelize_module``), compiled with
``backend="fuse_attn"``, against the same training in eager and with ``attn_implementation="sdpa"`` under
``torch.compile`` on the same engine.

    torchrun --nproc-per-node 2 examples/train_distributed.py --engine fsdp2 [--model llama] [--steps 12]
    torchrun --nproc-per-node 2 examples/train_distributed.py --device cpu    # gloo, a tiny model, fp32
    torchrun --nproc-per-node 2 examples/train_distributed.py --engine fsdp2 --profile  # and where a step's time goes
    torchrun --nproc-per-node 2 examples/train_distributed.py --engine tp --model llama

Every variant starts from the same weights and sees the same batches (each rank its own; tensor parallel: every rank
the same). Rank 0 prints the
attentions fuse_attn fused (each one's spec and the implementation it runs), the loss of every step for the three variants, checks fuse_attn's losses against
eager's (at most twice the distance of sdpa + torch.compile's from eager, plus a floor: the 2x rule on the loss
curve), and on a GPU the median step time against sdpa + torch.compile.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

if not __package__:  # run as a script: the repository root, for examples.common
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from examples.common import next_token_loss  # noqa: E402
from fuse_attn.kernels import plan
from fuse_attn.report import collect_reports  # noqa: E402

# Floors of the loss check: fp32 on a CPU agrees to rounding; bf16 losses of two implementations drift apart by
# about 1e-2 over a dozen AdamW steps (the kernels' rounding differs from eager's in every layer).
LOSS_FLOOR = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
PROFILED_STEPS = 2  # --profile: steps profiled after the timed ones, per compiled variant
# name -> (attention implementation, torch.compile backend or None for eager)
VARIANTS = {"eager": ("eager", None), "fuse_attn": ("eager", "fuse_attn"), "sdpa+torch.compile": ("sdpa", "inductor")}


def build_model(name: str, tiny: bool, attention: str, length: int):
    """GPT-2-shaped (6 layers of width 1024, 16 heads) or LLaMA-shaped (8 layers of width 1024, 16 heads sharing 4
    kv heads) from a config, random weights (seed 0); tiny: 2 layers of width 32, 4 heads (2 kv heads)."""
    import transformers

    torch.manual_seed(0)
    if name == "gpt2":
        size = dict(n_embd=32, n_head=4, n_layer=2, vocab_size=64) if tiny else dict(n_embd=1024, n_head=16, n_layer=6)
        config = transformers.GPT2Config(**size, n_positions=length, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                                         use_cache=False, bos_token_id=0, eos_token_id=0)
        config._attn_implementation = attention
        return transformers.GPT2LMHeadModel(config), config.n_layer
    size = (dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                 vocab_size=64) if tiny else
            dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, num_key_value_heads=4,
                 num_hidden_layers=8, vocab_size=32000))
    config = transformers.LlamaConfig(**size, max_position_embeddings=length, use_cache=False, bos_token_id=0,
                                      eos_token_id=0, pad_token_id=0)
    config._attn_implementation = attention
    return transformers.LlamaForCausalLM(config), config.num_hidden_layers


def blocks(model) -> list:
    """The transformer blocks (FSDP2 shards each on its own)."""
    return list(model.transformer.h) if hasattr(model, "transformer") else list(model.model.layers)


def wrap(model, engine: str, device: torch.device):
    if engine == "tp":  # Megatron's plan: heads and the MLP's hidden units over the ranks, the rest replicated
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        for block in blocks(model):
            parallelize_module(block.self_attn, mesh, {"q_proj": ColwiseParallel(), "k_proj": ColwiseParallel(),
                                                       "v_proj": ColwiseParallel(), "o_proj": RowwiseParallel()})
            parallelize_module(block.mlp, mesh, {"gate_proj": ColwiseParallel(), "up_proj": ColwiseParallel(),
                                                 "down_proj": RowwiseParallel()})
        return model
    if engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    for block in blocks(model):
        fully_shard(block)
    fully_shard(model)
    return model


def train(args, variant: str, device: torch.device, dtype: torch.dtype, batches: list) -> dict:
    """Losses (mean over ranks) of every step, what the backend fused while compiling (rank 0's), median step ms
    after warm-up."""
    attention, backend = VARIANTS[variant]
    torch._dynamo.reset()
    model, layers = build_model(args.model, args.tiny, attention, args.length)
    model = wrap(model.to(device=device, dtype=dtype), args.engine, device)
    # Under tp only the planned layers hold DTensors; AdamW's multi-tensor (foreach) step, CUDA's default, refuses a
    # mix of DTensors and plain tensors, so tp steps one parameter at a time.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False if args.engine == "tp" else None)
    run = model if backend is None else torch.compile(model, backend=backend)

    def step(tokens):
        loss = next_token_loss(run(input_ids=tokens).logits, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    losses, times, fused = [], [], None
    for i, tokens in enumerate(batches):
        start = time.perf_counter()
        if i == 0:
            with collect_reports() as reports:
                loss = step(tokens)
            fused = dict(fused=sum(len(r.fused) for r in reports), graphs=len(reports),
                         not_fused=[v.line() for r in reports for v in r.not_fused],
                         runs=collections.Counter(f"{v.description}; {v.runs or 'runs triton'}"
                                                  for r in reports for v in r.fused))
        else:
            loss = step(tokens)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
        dist.all_reduce(loss)
        losses.append(loss.item() / dist.get_world_size())
    warm = times[args.warmup:]
    profiled = None
    if args.profile and backend is not None:
        profiled = profile_steps(step, batches[-PROFILED_STEPS:], device)
    return dict(losses=losses, fused=fused, layers=layers, ms=statistics.median(warm) if warm else None,
                profile=profiled)


def profile_steps(step, batches: list, device: torch.device) -> dict:
    """Where a step's time goes, from ``torch.profiler`` over a few more steps (after the timed ones): wall ms per
    step, and per step the ms of the device's compute kernels and of its collectives (NCCL kernels, which run on
    their own streams beside the compute), with the table of the ops that took the most device (on a CPU: host)
    time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for tokens in batches:
            step(tokens)
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = (time.perf_counter() - start) * 1e3 / len(batches)
    events = prof.key_averages()
    # the kernels themselves: an op or a record_function range (Inductor names one after each kernel it launches)
    # reports its kernels' time as its own too, so summing every event would count each kernel twice
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    collective = sum(e.self_device_time_total for e in kernels if "nccl" in e.key.lower()) / 1e3 / len(batches)
    compute = sum(e.self_device_time_total for e in kernels) / 1e3 / len(batches) - collective
    table = events.table(sort_by="self_device_time_total" if device.type == "cuda" else "self_cpu_time_total",
                         row_limit=12, max_name_column_width=60)
    return dict(wall_ms=wall, compute_ms=compute, collective_ms=collective, table=table)


def init_distributed(device_type: str) -> tuple[torch.device, torch.dtype]:
    """The process group (NCCL on GPUs, gloo on CPUs; kept as it is where the caller has made it already, as
    tests/e2e/distributed_examples.py does to run several trainings in one torchrun), this process's device (torchrun's
    LOCAL_RANK) and the dtype the examples train in there (bf16 on a GPU, fp32 on a CPU)."""
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    if device_type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        return device, torch.bfloat16
    return torch.device("cpu"), torch.float32


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["ddp", "fsdp2", "tp"], default="fsdp2",
                        help="tp: tensor parallel (heads and MLP units over the ranks; --model llama)")
    parser.add_argument("--model", choices=["gpt2", "llama"], default="gpt2")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the timing (compiling, tuning)")
    parser.add_argument("--profile", action="store_true",
                        help=f"then profile {PROFILED_STEPS} more steps of each compiled variant: where a step's time "
                             "goes")
    args = parser.parse_args(argv)
    if args.engine == "tp" and args.model != "llama":
        parser.error("--engine tp shards separate q/k/v projections: --model llama (GPT-2's are one fused c_attn)")
    args.tiny = args.device == "cpu"
    args.length, batch = (16, 2) if args.tiny else (2048, 4)

    owns_group = not dist.is_initialized()
    device, dtype = init_distributed(args.device)
    rank = dist.get_rank()
    vocab = 64 if args.tiny else (50257 if args.model == "gpt2" else 32000)
    # each rank its own data (tensor parallel: the same on every rank), the same for every variant
    generator = torch.Generator().manual_seed(1000 + (0 if args.engine == "tp" else rank))
    batches = [torch.randint(0, vocab, (batch, args.length), generator=generator).to(device) for _ in range(args.steps)]

    results = {variant: train(args, variant, device, dtype, batches) for variant in VARIANTS}
    if rank == 0:
        print(f"{args.model}, {args.engine} on {dist.get_world_size()} {args.device} processes, "
              f"{str(dtype).removeprefix('torch.')}, batch {batch} x {args.length} per rank, torch {torch.__version__}")
    ok = report(args, results, dtype) if rank == 0 else True
    if owns_group:
        dist.destroy_process_group()
    return 0 if ok else 1


def report(args, results: dict, dtype: torch.dtype) -> bool:
    # Graphs are counted as compiled: under FSDP2 Dynamo compiles a block once and runs that graph for every block
    # (the blocks' code is the same), so the fused count can be below the number of layers with every one fused.
    fused, layers = results["fuse_attn"]["fused"], results["fuse_attn"]["layers"]
    ok = fused["fused"] > 0 and not fused["not_fused"]
    print(f"fuse_attn fused {fused['fused']} attention(s) in {fused['graphs']} compiled graph(s) of a {layers}-layer "
          f"model; not fused: {len(fused['not_fused'])}{'' if ok else ' -- FAILED: expected every attention fused'}")
    for line in fused["not_fused"]:
        print("  " + line)
    for runs, count in fused["runs"].items():  # each fused attention's spec and the implementation it runs
        print(f"  {count} x {runs}")
    print("step | " + " | ".join(VARIANTS))
    for i in range(args.steps):
        print(f"{i:4d} | " + " | ".join(f"{results[v]['losses'][i]:.5f}" for v in VARIANTS))
    eager = results["eager"]["losses"]
    ours = max(abs(a - b) for a, b in zip(results["fuse_attn"]["losses"], eager))
    peer = max(abs(a - b) for a, b in zip(results["sdpa+torch.compile"]["losses"], eager))
    allowed = 2 * peer + LOSS_FLOOR[dtype]
    loss_ok = ours <= allowed
    print(f"loss vs eager: fuse_attn {ours:.3g}, sdpa+torch.compile {peer:.3g} (allowed {allowed:.3g})"
          f"{'' if loss_ok else ' -- FAILED'}")
    if args.device == "cuda":
        ms = {v: results[v]["ms"] for v in VARIANTS}
        print("median step: " + ", ".join(f"{v} {t:.1f} ms" for v, t in ms.items())
              + f"; fuse_attn vs sdpa+torch.compile {ms['sdpa+torch.compile'] / ms['fuse_attn']:.2f}x")
    for variant in VARIANTS:
        profiled = results[variant]["profile"]
        if profiled is not None:
            on_device = (f", of which device compute kernels {profiled['compute_ms']:.1f} ms and collectives "
                         f"{profiled['collective_ms']:.1f} ms (on their own streams)" if args.device == "cuda" else "")
            print(f"profile of {variant} (rank 0, {PROFILED_STEPS} steps): {profiled['wall_ms']:.1f} ms a step"
                  f"{on_device}\n{profiled['table']}")
    return ok and loss_ok


if __name__ == "__main__":
    sys.exit(main())
