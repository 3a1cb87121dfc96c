"""Train a GPT-2 from Hugging Face transformers (built from a config: random weights, eager attention) on random
tokens with AdamW, compiled with ``backend="fuse_attn"``.

    python examples/train_gpt2.py                 # GPU: GPT-2 small (12 layers), batch 8 x 1024 tokens, bf16
    python examples/train_gpt2.py --device cpu    # CPU: a tiny GPT-2, fp32

Prints what was fused, checks the first step's loss and gradients against eager (2x rule against fp64), prints a
few steps' losses, and on a GPU times a training step against torch.compile's default backend.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

if not __package__:  # run as a script: the repository root, for examples.common
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from examples.common import Checks, compare_training, next_token_loss, parse_setup  # noqa: E402


def main(argv=None) -> int:
    import transformers

    setup, args = parse_setup(__doc__, argv, lambda p: p.add_argument("--steps", type=int, default=3))
    # full: GPT-2 small (124M: GPT2Config's defaults); tiny: width 32, 4 heads of 8, 2 layers, vocabulary 64
    size = dict(n_embd=32, n_head=4, n_layer=2, vocab_size=64) if setup.tiny else {}
    batch, length = (2, 9) if setup.tiny else (8, 1024)  # tiny: the sizes of tests/e2e/test_model_zoo.py
    config = transformers.GPT2Config(**size, n_positions=length, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                                     use_cache=False, bos_token_id=0, eos_token_id=0)
    config._attn_implementation = "eager"  # the attention as written in modeling_gpt2.py, which fuse_attn rewrites
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).to(setup.device)
    tokens = torch.randint(0, config.vocab_size, (batch, length), device=setup.device)

    checks = Checks(setup)
    compare_training(setup, checks, model, lambda m: next_token_loss(m(input_ids=tokens).logits, tokens), steps=args.steps,
                     tokens_per_step=batch * length, layers=config.n_layer)
    return checks.exit_code()


if __name__ == "__main__":
    sys.exit(main())
