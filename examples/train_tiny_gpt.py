"""Train a small GPT-2-shaped model on random tokens with ``backend="fuse_attn"``.

    python examples/train_tiny_gpt.py            # tiny on a CPU, larger on a GPU

Prints what was fused, checks the compiled model's loss and gradients against eager on the same weights, and on a
GPU times a training step against ``torch.compile``'s default backend.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from examples.attention_forms import TinyGPT  # noqa: E402
from fuse_attn.report import collect_reports  # noqa: E402


def train_step(model, optimizer, tokens):
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def seconds_per_step(model, tokens, steps):
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(3):
        train_step(model, optimizer, tokens)  # compile and warm up
    if tokens.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        train_step(model, optimizer, tokens)
    if tokens.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    size = dict(width=768, heads=12, layers=4, block_size=1024) if cuda else dict(width=64, heads=4, layers=2, block_size=64)
    seq = size["block_size"]
    torch.manual_seed(0)
    eager = TinyGPT(vocab=2048, **size).to(device, dtype)
    fused = copy.deepcopy(eager)
    tokens = torch.randint(0, 2048, (8 if cuda else 2, seq + 1), device=device)

    compiled = torch.compile(fused, backend="fuse_attn")
    with collect_reports() as reports:
        loss = torch.nn.functional.cross_entropy(compiled(tokens[:, :-1]).flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    eager_loss = torch.nn.functional.cross_entropy(eager(tokens[:, :-1]).flatten(0, 1).float(), tokens[:, 1:].flatten())
    eager_loss.backward()
    fused_count = sum(len(r.fused) for r in reports)
    print(f"device: {torch.cuda.get_device_name() if cuda else 'cpu'}, dtype {dtype}, seq {seq}")
    print(f"attentions fused: {fused_count} of {size['layers']} layers")
    for report in reports:
        for verdict in report.verdicts:
            print("  " + verdict.line())
    grad_diff = max((a.grad - b.grad).abs().max().item() for a, b in zip(fused.parameters(), eager.parameters()))
    print(f"loss: compiled {loss.item():.5f}, eager {eager_loss.item():.5f}; max |grad difference| {grad_diff:.3g}")

    if cuda:
        ours = seconds_per_step(compiled, tokens, args.steps)
        default = seconds_per_step(torch.compile(copy.deepcopy(eager)), tokens, args.steps)
        print(f"training step: fuse_attn {ours * 1e3:.1f} ms, torch.compile default {default * 1e3:.1f} ms, speed-up {default / ours:.2f}x")


if __name__ == "__main__":
    main()
