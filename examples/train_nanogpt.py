"""Train a GPT-2-shaped model of hand-written nanoGPT blocks (``examples/attention_forms.py``: attention as
``masked_fill(tril == 0, -inf)`` over a registered buffer, then softmax) on random tokens with AdamW, compiled with
``backend="fuse_attn"``.

    python examples/train_nanogpt.py                 # GPU: 4 blocks of width 768 (12 heads), batch 8 x 1024 tokens, bf16
    python examples/train_nanogpt.py --device cpu    # CPU: 2 blocks of width 32, fp32

Prints what was fused (the tril mask becomes the kernel's causal flag), checks the first step's loss and gradients
against eager (2x rule against fp64), prints a few steps' losses, and on a GPU times a training step against
torch.compile's default backend.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

if not __package__:  # run as a script: the repository root, for examples.common
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from examples.attention_forms import TinyGPT  # noqa: E402
from examples.common import Checks, compare_training, next_token_loss, parse_setup  # noqa: E402


def main(argv=None) -> int:
    setup, args = parse_setup(__doc__, argv, lambda p: p.add_argument("--steps", type=int, default=3))
    vocab = 64 if setup.tiny else 2048
    size = dict(width=32, heads=4, layers=2, block_size=16) if setup.tiny else dict(width=768, heads=12, layers=4, block_size=1024)
    batch = 2 if setup.tiny else 8
    torch.manual_seed(0)
    model = TinyGPT(vocab=vocab, **size).to(setup.device)
    tokens = torch.randint(0, vocab, (batch, size["block_size"]), device=setup.device)

    checks = Checks(setup)
    compare_training(setup, checks, model, lambda m: next_token_loss(m(tokens), tokens), steps=args.steps, tokens_per_step=batch * size["block_size"],
                     layers=size["layers"])
    return checks.exit_code()


if __name__ == "__main__":
    sys.exit(main())
