"""Real models as their authors wrote them: small Hugging Face models built from configs (random weights, eager
attention), compiled with ``backend="fuse_attn"`` on the CPU. For each: every attention layer is fused, and the
output and every parameter gradient of a training step match eager under the 2x rule against fp64."""

from __future__ import annotations

import copy

import pytest
import torch

from fuse_attn.kernels import plan
import fuse_attn
from fuse_attn.report import collect_reports
from tests.support.compiled_modules import INTERPRETER_SESSION, packed_position_ids
from tests.support.numerics import FLOOR, max_error  # FLOOR: the 2x rule's absolute floors

transformers = pytest.importorskip("transformers")
T = transformers

HIDDEN, HEADS, LAYERS, VOCAB, SEQ = 32, 4, 2, 64, 9
# bf16 draws of the weights per model (the test's docstring says why: 4 draws were measured too few for T5)
BF16_SEEDS = 16


def ids(batch=2, seq=SEQ):
    return torch.randint(3, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(0))


def features(*shape):
    """Fixed random inputs: the global generator's state would depend on which tests ran before."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def decoder(config_cls, **extra):
    config = config_cls(hidden_size=HIDDEN, num_attention_heads=HEADS, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
                        vocab_size=VOCAB, attention_dropout=0.0, **extra)
    return config


def gpt2():
    config = T.GPT2Config(n_embd=HIDDEN, n_head=HEADS, n_layer=LAYERS, vocab_size=VOCAB, n_positions=32,
                          attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    return T.GPT2LMHeadModel, config, dict(input_ids=ids()), LAYERS


def bert():
    config = T.BertConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
                          vocab_size=VOCAB, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    padding = torch.ones(2, SEQ, dtype=torch.long)
    padding[1, 6:] = 0
    return T.BertModel, config, dict(input_ids=ids(), attention_mask=padding), LAYERS


def t5():
    config = T.T5Config(d_model=HIDDEN, d_kv=HIDDEN // HEADS, num_heads=HEADS, d_ff=2 * HIDDEN, num_layers=LAYERS,
                        vocab_size=VOCAB, dropout_rate=0.0)
    return T.T5EncoderModel, config, dict(input_ids=ids()), LAYERS


def longt5_local():
    """LongT5's local attention: the sequence in blocks of ``local_radius + 1``, each block of queries against its own
    and its two neighbours' keys (einsums over an ellipsis, heads between rows and head dim), T5's relative position
    bias and the padding mask added per block."""
    config = T.LongT5Config(d_model=HIDDEN, d_kv=HIDDEN // HEADS, num_heads=HEADS, d_ff=2 * HIDDEN, num_layers=LAYERS,
                            vocab_size=VOCAB, local_radius=3, encoder_attention_type="local", dropout_rate=0.0)
    padding = torch.ones(2, SEQ, dtype=torch.long)
    padding[1, 6:] = 0
    return T.LongT5EncoderModel, config, dict(input_ids=ids(), attention_mask=padding), LAYERS


def longt5_transient_global():
    """LongT5's transient-global attention: each block of queries against its own and its neighbours' keys and one
    side key per global block of the sequence (the block's tokens summed, repeated for every block), with T5's bias
    of relative buckets for each part and the side keys' segment mask."""
    config = T.LongT5Config(d_model=HIDDEN, d_kv=HIDDEN // HEADS, num_heads=HEADS, d_ff=2 * HIDDEN, num_layers=LAYERS,
                            vocab_size=VOCAB, local_radius=3, global_block_size=4,
                            encoder_attention_type="transient-global", dropout_rate=0.0)
    padding = torch.ones(2, SEQ, dtype=torch.long)
    padding[1, 6:] = 0
    return T.LongT5EncoderModel, config, dict(input_ids=ids(), attention_mask=padding), LAYERS


def vit():
    config = T.ViTConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
                         image_size=16, patch_size=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return T.ViTModel, config, dict(pixel_values=features(2, 3, 16, 16)), LAYERS


def swinv2():
    """Shifted windows: a logit scale a head, a relative position bias from a small MLP, and the windows' mask added
    with the scores viewed per image and window."""
    config = T.Swinv2Config(image_size=16, patch_size=2, embed_dim=HIDDEN, depths=[2], num_heads=[HEADS], window_size=4,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0)
    return T.Swinv2Model, config, dict(pixel_values=features(2, 3, 16, 16)), 2


def whisper():
    config = T.WhisperConfig(d_model=HIDDEN, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_layers=1,
                             decoder_layers=1, encoder_ffn_dim=2 * HIDDEN, decoder_ffn_dim=2 * HIDDEN, num_mel_bins=8,
                             max_source_positions=6, vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                             decoder_start_token_id=1, dropout=0.0, attention_dropout=0.0)
    inputs = dict(input_features=features(2, 8, 12), decoder_input_ids=ids(seq=5))
    return T.WhisperModel, config, inputs, 3  # encoder self, decoder self (causal), decoder cross (M != N)


def bloom():
    config = T.BloomConfig(hidden_size=HIDDEN, n_head=HEADS, n_layer=LAYERS, vocab_size=VOCAB, attention_dropout=0.0, hidden_dropout=0.0)
    return T.BloomForCausalLM, config, dict(input_ids=ids()), LAYERS


def falcon():
    config = T.FalconConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, num_hidden_layers=LAYERS, vocab_size=VOCAB,
                            multi_query=True, new_decoder_architecture=False, attention_dropout=0.0, hidden_dropout=0.0)
    return T.FalconForCausalLM, config, dict(input_ids=ids()), LAYERS


def opt():
    config = T.OPTConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, ffn_dim=2 * HIDDEN, num_hidden_layers=LAYERS,
                         vocab_size=VOCAB, word_embed_proj_dim=HIDDEN, dropout=0.0, attention_dropout=0.0)
    return T.OPTForCausalLM, config, dict(input_ids=ids()), LAYERS


def gpt_oss():
    """Attention sinks (a learned logit a head joined to the softmax), a sliding window on alternate layers, GQA."""
    config = decoder(T.GptOssConfig, num_key_value_heads=2, head_dim=HIDDEN // HEADS, num_local_experts=2,
                     num_experts_per_tok=1, sliding_window=4, layer_types=["sliding_attention", "full_attention"])
    config._experts_implementation = "eager"  # (the default, grouped_mm, takes no fp64: the reference model's dtype)
    padding = torch.ones(2, SEQ, dtype=torch.long)
    padding[1, :3] = 0  # left padding: those query rows see no key, and the sink takes their whole weight
    return T.GptOssForCausalLM, config, dict(input_ids=ids(), attention_mask=padding), LAYERS


def deepseek_mla():
    """Multi-head latent attention (DeepSeek-V3): q and k 12 wide (8 without rotary + 4 with), v 8; MoE layers whose
    tokens each take both experts: with one of two, a token whose router scores nearly tie takes the other expert in
    bf16 than in fp64, and that expert's weight gradient then differs by the token's whole share: a test of the
    routing's ties, not of the attention (on an H200, top-1 of 2, an expert's gradient erred 0.121 against eager's
    bound 0.0455)."""
    config = decoder(T.DeepseekV3Config, num_key_value_heads=HEADS, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4,
                     qk_nope_head_dim=8, v_head_dim=8, n_routed_experts=2, num_experts_per_tok=2, moe_intermediate_size=16,
                     first_k_dense_replace=1, n_group=1, topk_group=1)
    config._experts_implementation = "eager"  # (as gpt-oss's: the default, grouped_mm, takes no fp64)
    return T.DeepseekV3ForCausalLM, config, dict(input_ids=ids()), LAYERS


def gemma4():
    """Gemma-4: the global layers' head dim of 512 (the real models' `global_head_dim`) beside a sliding layer's small
    one; GQA, a sliding window."""
    config = decoder(T.Gemma4TextConfig, num_key_value_heads=2, head_dim=8, global_head_dim=512, sliding_window=4,
                     layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=0,
                     vocab_size_per_layer_input=VOCAB)
    return T.Gemma4ForCausalLM, config, dict(input_ids=ids()), LAYERS


def llama_packed():
    """Packed documents as the padding-free collator gives them: position ids restarting at 0 (three documents of 4, 3
    and 2 tokens a row), no attention mask; the mask transformers derives from them is evaluated in the kernels. No
    cache: with one, transformers ignores the documents and masks causally only."""
    positions = packed_position_ids((4, 3, 2), 2)
    config = decoder(T.LlamaConfig, num_key_value_heads=2, use_cache=False)
    return T.LlamaForCausalLM, config, dict(input_ids=ids(), position_ids=positions), LAYERS


# the models whose attention masks come from integer vectors (document ids from the position ids), evaluated in the
# kernels: each fused attention reads only such vectors, no N x N mask
VECTOR_MASKS = {"llama-packed-documents"}


MODELS = {
    "gpt2": gpt2,
    "llama-gqa": lambda: (T.LlamaForCausalLM, decoder(T.LlamaConfig, num_key_value_heads=2), dict(input_ids=ids()), LAYERS),
    "mistral-sliding-window": lambda: (T.MistralForCausalLM, decoder(T.MistralConfig, num_key_value_heads=2, sliding_window=4),
                                       dict(input_ids=ids()), LAYERS),
    "qwen2": lambda: (T.Qwen2ForCausalLM, decoder(T.Qwen2Config, num_key_value_heads=2), dict(input_ids=ids()), LAYERS),
    "gemma2-softcap": lambda: (T.Gemma2ForCausalLM, decoder(T.Gemma2Config, num_key_value_heads=2, head_dim=HIDDEN // HEADS),
                               dict(input_ids=ids()), LAYERS),
    "phi": lambda: (T.PhiForCausalLM, decoder(T.PhiConfig, resid_pdrop=0.0, embd_pdrop=0.0), dict(input_ids=ids()), LAYERS),
    "bert-padding": bert,
    "t5-relative-bias": t5,
    "longt5-local": longt5_local,
    "longt5-transient-global": longt5_transient_global,
    "vit": vit,
    "swinv2-shifted-windows": swinv2,
    "whisper-self-and-cross": whisper,
    "bloom-alibi": bloom,
    "falcon-mqa": falcon,
    "opt": opt,
    "gpt-oss-sinks": gpt_oss,
    "deepseek-v3-mla": deepseek_mla,
    "gemma4-head-dim-512": gemma4,
    "llama-packed-documents": llama_packed,
}


def first_tensor(output):
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


# Bloom's GELU is a custom autograd.Function whose backward is an approximation: it stays one node of the traced
# graph, so the fused model's gradients are those of that backward. Inference is run too for this one.
TRAINING_AND_INFERENCE = {"bloom-alibi"}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("train", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("name", list(MODELS))
def test_model_fuses_every_attention_and_matches_eager(name, attention, train, device, monkeypatch):
    """On a CPU in fp32 through the op's plain-PyTorch path (the kernels are tested on their own); on a GPU in
    bf16 through the Triton kernels. ``attention``: the model's attention implementation, written out ("eager") or
    Hugging Face's default, a ``scaled_dot_product_attention`` call with the mask it builds ("sdpa").

    In bf16 the rest of the model is compiled by Inductor, which by default keeps fp32 intermediates where eager
    rounds to bf16. That alone moves gradients by more than 2x eager's error on some models (T5: ``torch.compile``
    default's embedding gradient 0.415 off fp64 where eager's is 0.063; with the sdpa attention, the last FFN
    weight's 2.27 against eager's 0.19, on the CPU through the interpreter), so in bf16 the fused model and the
    ``torch.compile`` baseline are compiled with Inductor's ``emulate_precision_casts``: Inductor then rounds as
    eager does, and what is left of the difference is the attention. The same-dtype baseline is the worse of eager
    and ``torch.compile`` default, in fp32 too: Inductor's reordering of the rest of the model alone moves fp32
    gradients by up to 2x eager's error (ViT, sdpa: ``torch.compile`` default's worst gradient at 0.40-1.09x its
    bound against eager, six draws at two threads, three at one and at eight), and
    CI's machine failed the fused ViT at 1.08x that bound (``layers.1.mlp.fc2.bias``) where this 2-core machine's
    runs were at 0.78x (0.89x with the inputs fixed below). The baseline is
    compiled only where our error exceeds eager's bound (the same verdict): on the CPU, Inductor's compile of a
    training step costs more than the rest of the test (this file's CPU tests in 473 s with it always run, 179 s
    without, two workers).

    One draw of bf16 weights gives a noisy max error: on T5 through the interpreter, the worst parameter's error
    over its bound ranged from 0.62 to 2.26 across six weight seeds, with our errors summed over all parameters at
    0.67-1.40x eager's. So in bf16 the errors compared are means over ``BF16_SEEDS`` draws of the weights and of the
    output's gradient weights (the compiled models are reused: new weights, no recompile); fp32 takes one draw.
    Four draws were still too few for T5: with its attention computed exactly (fp64, rounded to bf16 only at its
    output and input gradients), block 0's ``layer_norm.weight`` gradient was 0.473 off fp64 against eager's 0.192
    over draws 0-3 -- a perfect attention failed the rule -- and 0.294 against 0.317 over 16 draws.
    """
    if device == "cuda" and (not torch.cuda.is_available() or INTERPRETER_SESSION):
        pytest.skip("needs a GPU and TRITON_INTERPRET=0")
    if device == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    if not train and name not in TRAINING_AND_INFERENCE:
        pytest.skip("inference is covered by the training run (same forward graph rewrite)")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model_cls, config, inputs, attention_layers = MODELS[name]()
    config._attn_implementation = attention
    seeds = range(BF16_SEEDS if dtype == torch.bfloat16 else 1)

    def weights(seed):
        torch.manual_seed(seed)
        return model_cls(config).to(device, dtype).state_dict()

    # transformers has no SDPA path for Bloom or gpt-oss (a ValueError); Gemma-2's runs, but without the score
    # softcap, which its sdpa path ignores: on that path the zoo tests its sliding window and GQA, on eager its softcap
    try:
        states = [weights(seed) for seed in seeds]
    except ValueError as e:
        pytest.skip(f"{name} has no {attention} attention in transformers {T.__version__}: {e}")
    torch.manual_seed(0)
    model = model_cls(config).train(train).to(device, dtype)
    inputs = {k: v.to(device, dtype) if v.is_floating_point() else v.to(device) for k, v in inputs.items()}
    ref_model = copy.deepcopy(model).double()
    eager_model, compiled_model = copy.deepcopy(model), copy.deepcopy(model)

    seed_verdicts = []  # the fused model's rewrite verdicts, a list per seed

    def run_seeds(module, call, cast):
        """[(output, {parameter name: gradient})] of one step per seed, ``module`` holding that seed's weights."""
        results = []
        for seed, state in zip(seeds, states):
            module.load_state_dict(state)
            module.zero_grad(set_to_none=True)
            with collect_reports() as reports:  # (the backward's graph is compiled at its first call)
                with torch.set_grad_enabled(train):
                    out = first_tensor(call(**{k: cast(v) for k, v in inputs.items()}))
                if train:
                    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1 + seed), dtype=torch.float64)
                    (out * grad.to(out.device, out.dtype)).sum().backward()
            if module is model:
                seed_verdicts.append([v for r in reports for v in r.verdicts])
            results.append((out.detach(), {n: p.grad for n, p in module.named_parameters()}))
        return results

    same = lambda v: v  # noqa: E731
    rounding_as_eager = torch._inductor.config.patch(emulate_precision_casts=dtype != torch.float32)
    torch._dynamo.reset()
    with rounding_as_eager:
        ours = run_seeds(model, torch.compile(model, backend="fuse_attn"), same)
    verdicts = seed_verdicts[0]
    assert sum(v.fused for v in verdicts) == attention_layers, "\n".join(v.line() for v in verdicts)
    if name in VECTOR_MASKS:
        for v in verdicts:
            assert v.spec.score_tensors and {t.role for t in v.spec.score_tensors} == {"int"}, v.line()
    # Later seeds may compile a frame again (an MoE layer's routing takes another path with other weights): each
    # softmax then has the first step's verdict
    fused_sources = {v.source for v in verdicts if v.fused}
    for later in seed_verdicts[1:]:
        for v in later:
            assert v.fused == (v.source in fused_sources), f"recompiled with another verdict: {v.line()}"
    ref = run_seeds(ref_model, ref_model, lambda v: v.double() if v.is_floating_point() else v)
    eager = run_seeds(eager_model, eager_model, same)
    compiled = []  # torch.compile default's results, run where eager's bound alone is exceeded (docstring)

    def mean_error(results, what):
        """Mean over the seeds of the max error against fp64 of the output (``what`` None) or a gradient."""
        pick = (lambda res: res[0]) if what is None else (lambda res: res[1][what])
        return sum(max_error(pick(a), pick(r)) for a, r in zip(results, ref)) / len(ref)

    gradients = [n for n, g in ref[0][1].items() if g is not None]
    worst = ("", 0.0, 0.0)  # (what, our error, allowed) with the highest our/allowed ratio, printed for reports
    for what in [None] + gradients:
        label = "output" if what is None else f"grad of {what}"
        assert what is None or all(res[1][what] is not None for res in ours), f"{label} is missing"
        error = mean_error(ours, what)
        allowed = 2 * mean_error(eager, what) + FLOOR[dtype]
        if error > allowed:
            if not compiled:
                torch._dynamo.reset()
                with rounding_as_eager:
                    compiled.extend(run_seeds(compiled_model, torch.compile(compiled_model), same))
            allowed = max(allowed, 2 * mean_error(compiled, what) + FLOOR[dtype])
        assert error <= allowed, f"{name} {label}: {error:.3g} > {allowed:.3g}"
        if error / allowed >= worst[1] / max(worst[2], 1e-30):
            worst = (label, error, allowed)
    print(f"\nZOO {name} {device} {dtype} train={train}: fused {sum(v.fused for v in verdicts)}/{len(verdicts)} softmaxes; "
          f"output error {mean_error(ours, None):.3g}; closest to its bound: {worst[0]} {worst[1]:.3g} <= {worst[2]:.3g}"
          f" (means over {len(ref)} draw(s) of the weights)")


def test_output_attentions_keeps_the_weights_path_and_stays_right():
    model_cls, config, inputs, _ = bert()
    config._attn_implementation = "eager"
    model = model_cls(config).eval()
    torch._dynamo.reset()
    with collect_reports() as reports:
        out = torch.compile(model, backend="fuse_attn")(**inputs, output_attentions=True)
    verdicts = [v for r in reports for v in r.verdicts]
    assert verdicts and not any(v.fused for v in verdicts)
    assert all("used by" in v.reason for v in verdicts)
    expected = model(**inputs, output_attentions=True)
    torch.testing.assert_close(out.last_hidden_state, expected.last_hidden_state)
    for got, want in zip(out.attentions, expected.attentions):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["bert-padding", "llama-padding"])
def test_padding_masks_run_the_bare_score_on_full_tiles(name, attention):
    """Hugging Face's padding masks, as BERT (padding alone) and LLaMA (padding + causal in one mask) build them with
    either attention: every attention's spec names the padding vector, and its program where the vector (and the
    band) keep the key is the score alone -- what the kernels run, without loading the vector, on the tiles inside
    a batch row's run of visible keys (``spec.visible_spec``)."""
    if name == "bert-padding":
        model_cls, config, inputs, layers = bert()
    else:
        config = decoder(T.LlamaConfig, num_key_value_heads=2)
        padding = torch.ones(2, SEQ, dtype=torch.long)
        padding[1, 6:] = 0
        model_cls, inputs, layers = T.LlamaModel, dict(input_ids=ids(), attention_mask=padding), LAYERS
    config._attn_implementation = attention
    torch.manual_seed(0)
    torch._dynamo.reset()
    with torch.no_grad():
        report = fuse_attn.explain(model_cls(config).eval(), **inputs)
    assert len(report.fused) == layers, str(report)
    for verdict in report.fused:
        assert plan.key_padding(verdict.spec) is not None, verdict.line()
        assert plan.visible_spec(verdict.spec).score_program == (), verdict.line()
