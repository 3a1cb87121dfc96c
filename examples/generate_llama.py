"""Greedy ``generate`` with a LLaMA-style model from Hugging Face transformers (built from a config: random weights,
eager attention, grouped-query attention, a KV cache), its ``forward`` compiled with ``backend="fuse_attn"``.

    python examples/generate_llama.py                 # GPU: 4 layers of TinyLlama's width, prompt 1024, 128 new tokens, bf16
    python examples/generate_llama.py --device cpu    # CPU: a tiny model, fp32

The prompt (prefill: causal attention over the prompt) and every decoding step (one query row against the cache,
whose length grows by one per token, so Dynamo recompiles once with a dynamic length) run through the fused op;
which kernel runs is the backend's choice. Prints what was fused, checks the first step's logits against eager (2x
rule against fp64) and the generated tokens (on a CPU in fp32: equal to eager's; on a GPU in bf16 greedy decoding
may take another path after a near-tie, so the length of the common prefix is printed), and on a GPU times
``generate`` against torch.compile's default backend on the same model and on its SDPA attention
(``attn_implementation="sdpa"``, what a Hugging Face user runs by default), the three timed in alternating rounds.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

if not __package__:  # run as a script: the repository root, for examples.common
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from examples.common import Checks, parse_setup, print_speedup, retime_alternating, run_variant  # noqa: E402

# Rounds of alternating timing (examples.common.retime_alternating): 3 gives a median that one slow round cannot move.
ALTERNATING_ROUNDS = 3


def arguments(parser):
    parser.add_argument("--batch", type=int, help="prompts (default: 1 on a GPU, 2 on a CPU)")
    parser.add_argument("--prompt-length", type=int, help="tokens per prompt (default: 1024 on a GPU, 8 on a CPU)")
    parser.add_argument("--new-tokens", type=int, help="tokens generated (default: 128 on a GPU, 4 on a CPU)")


def main(argv=None) -> int:
    import transformers

    setup, args = parse_setup(__doc__, argv, arguments)
    # full: TinyLlama-1.1B's width and MLP (2048, 5632), LLaMA's head dim 128 (16 heads, 8 kv heads), 4 layers;
    # tiny: width 32, 4 heads of 8, 2 kv heads, 2 layers
    size = (dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                 vocab_size=64) if setup.tiny else
            dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=16, num_key_value_heads=8, num_hidden_layers=4))
    batch = args.batch or (2 if setup.tiny else 1)
    prompt_length = args.prompt_length or (8 if setup.tiny else 1024)
    new_tokens = args.new_tokens or (4 if setup.tiny else 128)
    config = transformers.LlamaConfig(**size, max_position_embeddings=prompt_length + new_tokens, attention_dropout=0.0,
                                      bos_token_id=0, eos_token_id=None, pad_token_id=0)
    config._attn_implementation = "eager"  # the attention as written in modeling_llama.py, which fuse_attn rewrites
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(setup.device).eval()
    prompts = torch.randint(1, config.vocab_size, (batch, prompt_length), device=setup.device)
    generation = dict(attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                      do_sample=False, output_logits=True, return_dict_in_generate=True)

    def prepare(dtype, attn_implementation="eager"):
        def build(backend):
            copy_ = copy.deepcopy(model).to(dtype)
            copy_.config._attn_implementation = attn_implementation  # the copy's modules share its config
            if backend is not None:
                # generate() calls forward once per token: compile that (compiling the module would leave generate's
                # own calls uncompiled)
                copy_.forward = torch.compile(copy_.forward, backend=backend)
            return lambda: copy_.generate(prompts, **generation)
        return build

    with torch.no_grad():
        ours = run_variant(setup, "fuse_attn", "fuse_attn", prepare(setup.dtype))
        eager = run_variant(setup, "eager", None, prepare(setup.dtype))
        reference = run_variant(setup, "fp64", None, prepare(torch.float64))
        baselines = [eager]
        if setup.cuda:
            default = run_variant(setup, "torch.compile default", "inductor", prepare(setup.dtype))
            # what a Hugging Face user runs by default: the model's SDPA attention under torch.compile
            sdpa = run_variant(setup, "sdpa + torch.compile default", "inductor", prepare(setup.dtype, "sdpa"))
            baselines += [default, sdpa]

    checks = Checks(setup)
    # prefill, and decoding (recompiled once for a dynamic cache length)
    checks.fused("generate", ours.reports, config.num_hidden_layers)
    checks.close("first step's logits", ours.result.logits[0], [b.result.logits[0] for b in baselines],
                 reference.result.logits[0])
    tokens, eager_tokens = ours.result.sequences[:, prompt_length:], eager.result.sequences[:, prompt_length:]
    print(f"generated (fuse_attn): {tokens.tolist()}")
    if setup.dtype == torch.float32:
        checks.equal("tokens of fuse_attn and eager", tokens, eager_tokens)
    else:
        differs = (tokens != eager_tokens).any(dim=0).nonzero()
        common = differs[0].item() if len(differs) else new_tokens
        print(f"tokens of fuse_attn and eager: the first {common} of {new_tokens} equal")
    if setup.cuda:
        with torch.no_grad():
            retime_alternating([ours, default, sdpa], ALTERNATING_ROUNDS)
        for baseline in (default, sdpa):
            print_speedup(f"generate ({batch} x {prompt_length} prompt tokens, {new_tokens} new)", ours, baseline,
                          batch * new_tokens, "new tokens")
    return checks.exit_code()


if __name__ == "__main__":
    sys.exit(main())
