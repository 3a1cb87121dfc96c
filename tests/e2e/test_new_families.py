"""Newer Hugging Face families, built small from their configs: every attention fused through the backend's compile
path, and ``fuse_attn.explain`` reporting the same verdicts (gpt-oss's sinks, DeepSeek-V3's MLA with q/k and v head dims
apart, ModernBERT's local and global layers, Gemma-3 / Cohere-2 / Exaone-4 sliding windows, Llama-4's chunked attention,
SmolLM3, Phi-3, GLM-4, Granite-SWA's and MiMo-V2-Flash's sinks, Inkling's relative position bias, Gemma-4 with its
global layers' head dim of 512, JetMoE's mixture of attention heads, and a Llama on packed documents: position ids restarting at 0, no mask), on the eager
and the sdpa attention paths. Training mode with gradients on, as a fine-tuning step compiles them. Inductor itself is left out
(its compile of each graph is what the rest of the suite tests); the model zoo (tests/e2e/test_model_zoo.py) checks
numerics."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import transformers as T

import fuse_attn
from fuse_attn import backend
from tests.support.compiled_modules import packed_position_ids

HIDDEN, HEADS, LAYERS, VOCAB, SEQ = 32, 4, 2, 64, 9
TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
ALTERNATING = ["sliding_attention", "full_attention"]


def decoder(config_cls, **extra):
    return config_cls(hidden_size=HIDDEN, num_attention_heads=HEADS, intermediate_size=2 * HIDDEN,
                      num_hidden_layers=LAYERS, vocab_size=VOCAB, attention_dropout=0.0, **TOKENS, **extra)


FAMILIES = {
    "gpt-oss": lambda: (T.GptOssForCausalLM, decoder(
        T.GptOssConfig, num_key_value_heads=2, head_dim=8, num_local_experts=2, num_experts_per_tok=1,
        sliding_window=4, layer_types=ALTERNATING)),
    "deepseek-v3-mla": lambda: (T.DeepseekV3ForCausalLM, decoder(
        T.DeepseekV3Config, num_key_value_heads=HEADS, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4,
        qk_nope_head_dim=8, v_head_dim=8, n_routed_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
        first_k_dense_replace=1, n_group=1, topk_group=1)),
    "modernbert": lambda: (T.ModernBertModel, T.ModernBertConfig(
        hidden_size=HIDDEN, num_attention_heads=HEADS, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
        vocab_size=VOCAB, global_attn_every_n_layers=2, local_attention=4, **TOKENS, cls_token_id=1, sep_token_id=2)),
    "gemma3": lambda: (T.Gemma3ForCausalLM, decoder(
        T.Gemma3TextConfig, num_key_value_heads=2, head_dim=8, sliding_window=4, layer_types=ALTERNATING)),
    "cohere2": lambda: (T.Cohere2ForCausalLM, decoder(
        T.Cohere2Config, num_key_value_heads=2, sliding_window=4, layer_types=ALTERNATING)),
    "exaone4": lambda: (T.Exaone4ForCausalLM, decoder(
        T.Exaone4Config, num_key_value_heads=2, sliding_window=4, layer_types=ALTERNATING)),
    "llama4-chunked": lambda: (T.Llama4ForCausalLM, decoder(
        T.Llama4TextConfig, num_key_value_heads=2, head_dim=8, intermediate_size_mlp=2 * HIDDEN, num_local_experts=2,
        num_experts_per_tok=1, attention_chunk_size=4, no_rope_layers=[1, 0])),
    "smollm3": lambda: (T.SmolLM3ForCausalLM, decoder(T.SmolLM3Config, num_key_value_heads=2)),
    "phi3": lambda: (T.Phi3ForCausalLM, decoder(T.Phi3Config, num_key_value_heads=2)),
    "glm4": lambda: (T.Glm4ForCausalLM, decoder(T.Glm4Config, num_key_value_heads=2, head_dim=8)),
    "llama-packed-documents": lambda: (T.LlamaForCausalLM, decoder(T.LlamaConfig, num_key_value_heads=2)),
    # sinks as (softmax(s) @ v) * sigmoid(logsumexp(s, -1) - sink)
    "granite-swa": lambda: (T.GraniteSWAForCausalLM, decoder(
        T.GraniteSWAConfig, num_key_value_heads=2, sliding_window=4, layer_types=ALTERNATING)),
    # gpt-oss's sinks on the sliding layers, the scores less their row max on the others
    "mimo-v2-flash": lambda: (T.MiMoV2FlashForCausalLM, decoder(
        T.MiMoV2FlashConfig, num_key_value_heads=2, head_dim=8, v_head_dim=8, sliding_window=4,
        layer_types=ALTERNATING)),
    # a relative position bias gathered from a product of its own
    "inkling": lambda: (T.InklingForCausalLM, decoder(T.InklingTextConfig, num_key_value_heads=2)),
    # the real models' global head dim (512) beside a small sliding one
    "gemma4": lambda: (T.Gemma4ForCausalLM, decoder(
        T.Gemma4TextConfig, num_key_value_heads=2, head_dim=8, global_head_dim=512, sliding_window=4,
        layer_types=ALTERNATING, hidden_size_per_layer_input=0, vocab_size_per_layer_input=VOCAB)),
    # mixture of attention heads; on the sdpa path the output's transpose is viewed as [B, N, top_k, -1], which holds
    # only in the layout SDPA's kernels return
    "jetmoe": lambda: (T.JetMoeForCausalLM, T.JetMoeConfig(
        hidden_size=HIDDEN, num_key_value_heads=2, kv_channels=HIDDEN // HEADS, intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS, vocab_size=VOCAB, num_local_experts=2, num_experts_per_tok=1, attention_dropout=0.0,
        **TOKENS)),
}
# the position ids of the families run on packed documents: three documents (4, 3 and 2 tokens) in each row
PACKED_POSITIONS = {"llama-packed-documents": packed_position_ids((4, 3, 2), 2)}
# transformers gives these no sdpa path (their sinks): ValueError at the model's construction
NO_SDPA = {"gpt-oss", "granite-swa", "mimo-v2-flash"}
# on the eager path the attention weights are live at the graph break that the experts' routing makes after the
# attention (Dynamo returns them from the graph: "the attention weights ... are used by matmul_1, output")
WEIGHTS_LIVE_AT_A_GRAPH_BREAK = {"jetmoe"}


def _attentions(verdicts) -> tuple[list[str], list[str]]:
    """(fused lines, lines of softmaxes left unfused that are attentions)."""
    return ([v.line() for v in verdicts if v.fused],
            [v.line() for v in verdicts if not v.fused and v.attention is not False])


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_attention_is_fused_and_explain_says_the_same(name, attention):
    if attention == "sdpa" and name in NO_SDPA:
        pytest.skip(f"transformers gives {name} no sdpa attention")
    if attention == "eager" and name in WEIGHTS_LIVE_AT_A_GRAPH_BREAK:
        pytest.skip(f"{name}'s eager attention weights are an output of its graph")
    model_cls, config = FAMILIES[name]()
    config._attn_implementation = attention
    torch.manual_seed(0)
    model = model_cls(config).train()
    assert model.config._attn_implementation == attention
    inputs = dict(input_ids=torch.randint(3, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0)))
    if name in PACKED_POSITIONS:  # (no cache: transformers reads packed documents from position ids only without one)
        inputs.update(position_ids=PACKED_POSITIONS[name], use_cache=False)

    torch._dynamo.reset()
    explained = fuse_attn.explain(model, **inputs)
    torch._dynamo.reset()
    with fuse_attn.collect_reports() as reports, \
            mock.patch.object(backend, "compile_fx", lambda gm, example_inputs, **kwargs: gm.forward):
        torch.compile(model, backend="fuse_attn")(**inputs)
    fused, unfused = _attentions([v for r in reports for v in r.verdicts])
    assert len(fused) == LAYERS and not unfused, "\n".join(fused + unfused)
    assert _attentions(explained.fused + explained.not_fused) == (fused, unfused), str(explained)
