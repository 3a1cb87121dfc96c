"""Inference with BERT (a batch of padded sequences and its attention mask) and ViT from Hugging Face transformers
(built from configs: random weights, eager attention), compiled with ``backend="fuse_attn"``.

    python examples/encoder_inference.py                 # GPU: BERT-base (32 x 512 tokens), ViT-B/16 (64 images of 224 x 224), bf16
    python examples/encoder_inference.py --device cpu    # CPU: tiny models, fp32

Prints what was fused (BERT's padding mask becomes a per-key bias the kernel reads from the [B, 1, 1, N] mask),
checks the outputs against eager (2x rule against fp64), and on a GPU times a forward against torch.compile's
default backend.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

if not __package__:  # run as a script: the repository root, for examples.common
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from examples.common import Checks, parse_setup, print_speedup, run_variant  # noqa: E402


def bert(setup):
    import transformers

    # full: BERT-base (BertConfig's defaults); tiny: width 32, 4 heads of 8, 2 layers
    size = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2, vocab_size=64) if setup.tiny else {}
    config = transformers.BertConfig(**size, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    batch, length = (2, 9) if setup.tiny else (32, 512)
    input_ids = torch.randint(0, config.vocab_size, (batch, length), device=setup.device)
    # sequences of different lengths, padded to the longest: each row keeps a random number of tokens (at least half)
    kept = torch.randint(length // 2, length + 1, (batch, 1), device=setup.device)
    kept[0] = length
    attention_mask = (torch.arange(length, device=setup.device) < kept).long()
    return transformers.BertModel, config, dict(input_ids=input_ids, attention_mask=attention_mask), batch * length, "tokens"


def vit(setup):
    import transformers

    # full: ViT-B/16 at 224 x 224 (ViTConfig's defaults); tiny: 16 x 16 images in 4 x 4 patches, width 32, 2 layers
    size = (dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2, image_size=16,
                 patch_size=4) if setup.tiny else {})
    config = transformers.ViTConfig(**size, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    batch = 2 if setup.tiny else 64
    pixels = torch.randn(batch, 3, config.image_size, config.image_size, device=setup.device)
    return transformers.ViTModel, config, dict(pixel_values=pixels), batch, "images"


def check_model(setup, checks, name, make):
    model_cls, config, inputs, items, unit = make(setup)
    config._attn_implementation = "eager"  # the attention as written in the model's file, which fuse_attn rewrites
    torch.manual_seed(0)
    model = model_cls(config, add_pooling_layer=False).to(setup.device).eval()

    def prepare(dtype):
        def build(backend):
            copy_ = copy.deepcopy(model).to(dtype)
            run_model = copy_ if backend is None else torch.compile(copy_, backend=backend)
            cast = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
            return lambda: run_model(**cast).last_hidden_state
        return build

    with torch.no_grad():
        ours = run_variant(setup, "fuse_attn", "fuse_attn", prepare(setup.dtype))
        baselines = [run_variant(setup, "eager", None, prepare(setup.dtype))]
        reference = run_variant(setup, "fp64", None, prepare(torch.float64))
        if setup.cuda:
            baselines.append(run_variant(setup, "torch.compile default", "inductor", prepare(setup.dtype)))
    checks.fused(name, ours.reports, config.num_hidden_layers)
    checks.close(f"{name} output", ours.result, [b.result for b in baselines], reference.result)
    if setup.cuda:
        print_speedup(f"{name} forward", ours, baselines[1], items, unit)


def main(argv=None) -> int:
    setup, _ = parse_setup(__doc__, argv)
    checks = Checks(setup)
    check_model(setup, checks, "BERT", bert)
    check_model(setup, checks, "ViT", vit)
    return checks.exit_code()


if __name__ == "__main__":
    sys.exit(main())
