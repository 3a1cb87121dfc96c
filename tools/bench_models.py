"""Model-level benchmark: Hugging Face models built from configs (random weights), a training step and an inference
forward, with the attention compiled five ways. Models: ``gpt2`` and ``llama`` (4-layer decoders, below),
``gpt2-small`` (GPT-2 small), ``bert-padded`` (BERT-base, masked-LM, batches padded to lengths N, 3N/4, N/2, N/3),
``bert-d128`` (BERT's encoder with 16 heads of 128, 8 layers, unpadded: unmasked attention at head dim 128),
``llama-1b`` (Llama-3.2-1B's shape: 16 layers, 32 heads of 64, GQA 4), ``mistral-window`` (the ``llama`` decoder's
sizes as a Mistral with a sliding window of N/4), ``t5`` (T5-small's encoder-decoder, whose relative position bias
is one learned ``[1, H, N, N]`` tensor shared by the batch; input ids also as decoder input ids), ``gemma2``
(Gemma-2-2B's layers, 4 of them: head dim 256, a tanh softcap on the scores; eager attention only: transformers'
sdpa path drops the softcap)
and ``phi3`` (Phi-3-mini's layers, 4 of them: 32 heads of 96, a head dim the kernels take in two column parts);
``llama-packed``: the ``llama`` decoder on packed documents, as Hugging Face's padding-free collator feeds them --
each row of N tokens holds 16 documents, told apart by position ids that restart at 0, no attention mask (the same
tokens run as separate sequences: ``--models llama --lengths N/16 --batch-tokens B*N``); ``deepseek-mla``
(DeepSeek-V2-Lite's multi-head latent attention, 4 dense layers: 16 heads, q/k head dim 192, v head dim 128) and
``gpt-oss`` (gpt-oss-20b's layers, 4 of them: 64 heads of 64 on 8 kv heads, learned sinks, sliding-window and full
layers alternating, a small MoE; eager attention only in transformers, so its comparisons are ``inductor`` and
``flex+inductor``); ``llama-padded-blocks``: the ``llama`` decoder on ``bert-padded``'s padded batches with each
decoder layer compiled on its own and the rest of the model eager, as FSDP2 users compile a model (a graph a
block): the padding + causal mask the model builds outside the blocks is an input of each block's graph, whose
values the backend never sees while compiling; ``gemma4`` (6 layers of Gemma-4's text decoder: five sliding layers
with heads of 256, one global with heads of 512).

    PYTHONPATH=. python3 tools/bench_models.py --out OUTDIR [--models gpt2 llama] [--lengths 1024 2048 4096 8192]
                                               [--modes train infer]
                                               [--variants fuse_attn inductor sdpa+inductor sdpa+fuse_attn]
                                               [--eager] [--batch-tokens 16384] [--compile-mode reduce-overhead]
    PYTHONPATH=. python3 tools/bench_models.py --out OUTDIR --compile-time [--models gpt2] [--compile-time-length 4096]
                                               [--variants fuse_attn inductor sdpa+inductor sdpa+fuse_attn]
    PYTHONPATH=. python3 tools/bench_models.py --device cpu --tiny        # smoke test: tiny configs, N=32, fp32

Variants (the model's ``config._attn_implementation`` and the ``torch.compile`` backend):
  fuse_attn      eager attention, ``backend="fuse_attn"`` (the entry point's function, so a checkout runs it)
  inductor       eager attention, ``torch.compile`` default
  sdpa+inductor  ``attn_implementation="sdpa"``, ``torch.compile`` default
  sdpa+fuse_attn ``attn_implementation="sdpa"`` (Hugging Face's default), ``backend="fuse_attn"``
  sdpa+fuse_attn:triton  the same with ``FUSE_ATTN_CANDIDATES=triton`` while compiling: the generated kernels
                 wherever SDPA's would have been timed faster (not in the default set)
  sdpa+fuse_attn:ours    the same with ``FUSE_ATTN_CANDIDATES=triton,gluon``: our kernels only, the Gluon forward
                 on Hopper included where it times faster (not in the default set)
  flex+inductor  ``attn_implementation="flex_attention"``, ``torch.compile`` default: Hugging Face's FlexAttention
                 path, its block mask built in the step (packed documents: from the position ids; not in the default
                 set)
  eager          eager attention, not compiled (with ``--eager``)

``--compile-mode reduce-overhead`` compiles every variant with ``mode="reduce-overhead"`` (Inductor's CUDA graph trees:
a step replays recorded graphs, so no Python launcher runs on it, and fuse_attn then offers the Gluon kernels at every
size); each step starts with ``torch.compiler.cudagraph_mark_step_begin()``, and the CSV's variant names carry
``@reduce-overhead``.

A training step is forward + Hugging Face's own loss (cross entropy of the logits against the random input ids as
labels) + backward, gradients set to None between steps (no optimizer); inference is a forward under
``torch.no_grad()``. bf16 on a GPU, B = max(1, batch_tokens // N), dropout off. Each cell is compiled (and
tuned) by one untimed step, then timed with ``triton.testing.do_bench`` (median); on a CPU by one
``time.perf_counter`` step. The table gives tokens/s (B*N per step), the speed-up of fuse_attn over the other
two compiled variants, and of sdpa+fuse_attn over sdpa+inductor (the same model, the user's switch of backend); the
fused columns count the attentions each fuse_attn variant fused (``fuse_attn.collect_reports``).
Rows are appended to OUTDIR/bench_models.csv with the device's name, the torch, triton and transformers
versions and the date.

``--compile-time`` measures instead, in fresh subprocesses, the time a user waits for the first two training
steps (Dynamo, the rewrite, tuning, Inductor, the steps: a second step can recompile) of each variant (both
attention paths, each under fuse_attn and under Inductor default): cold (empty fuse_attn, Inductor and Triton
caches: FUSE_ATTN_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR in a new temporary folder per variant) and
warm (a second subprocess with the caches the first left). The table gives each fuse_attn variant's time over
Inductor's on the same attention path; the CSV also where fuse_attn's part of it went
(``fuse_attn.backend.compile_seconds``: its analysis of the graphs, of it the trace; tuning, of it compiling
candidates), and, for every variant, AOTAutograd's and Inductor's (:data:`INDUCTOR_PHASES`, Dynamo's timers: the
joint graph's trace, the lowering, the code generation, the wait for the kernels' compiles). Rows go to
OUTDIR/bench_models_compile_time.csv.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import gc
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from unittest import mock

import torch
import triton
import triton.testing
from tabulate import tabulate

if __package__ in (None, ""):  # run as a script: the repository root holds fuse_attn
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fuse_attn.backend import compile_seconds, fuse_attn_backend  # noqa: E402
from fuse_attn.report import collect_reports  # noqa: E402
from tools.bench_csv import appending, columns_clash  # noqa: E402

DEFAULT_LENGTHS = [1024, 2048, 4096, 8192]
TINY_LENGTH = 32
TINY_BATCH_TOKENS = 2 * TINY_LENGTH  # batch 2, as the model-zoo test
# the target: >= 2x torch.compile default on the eager-attention model at N=4k in training
TARGET_LENGTH = 4096
# B*N per step: 16 sequences of 1024 (the kernel benchmark's B*N at N=4096 and N=16384)
DEFAULT_BATCH_TOKENS = 16384
# do_bench's rep: about a second of steps per cell, so the median is over several steps even when one takes
# a few hundred ms (an eager-attention training step at N=8192)
TIMED_MS = 1000
# compile-time targets: fuse_attn's first two steps over Inductor default's on the same attention path, with cold
# caches and in a second process with warm ones (a user pays the first on a new machine, the second on every run)
COMPILE_TIME_TARGETS = {"cold": 1.5, "warm": 1.1}
# name -> (attention implementation, backend (None: not compiled), FUSE_ATTN_CANDIDATES while compiling (None: the
# default, every candidate))
VARIANTS = {
    "fuse_attn": ("eager", "fuse_attn", None),
    "inductor": ("eager", "inductor", None),
    "sdpa+inductor": ("sdpa", "inductor", None),
    "sdpa+fuse_attn": ("sdpa", "fuse_attn", None),
    "sdpa+fuse_attn:triton": ("sdpa", "fuse_attn", "triton"),  # the generated kernels only: their share of the speed
    "sdpa+fuse_attn:ours": ("sdpa", "fuse_attn", "triton,gluon"),  # ... and the Gluon forward (Hopper)
    "flex+inductor": ("flex_attention", "inductor", None),
    "eager": ("eager", None, None),
}
COMPILED_VARIANTS = ["fuse_attn", "inductor", "sdpa+inductor", "sdpa+fuse_attn", "sdpa+fuse_attn:triton",
                     "sdpa+fuse_attn:ours", "flex+inductor"]
DEFAULT_VARIANTS = COMPILED_VARIANTS[:4]
FUSED_VARIANTS = [name for name, (_, backend, _) in VARIANTS.items() if backend == "fuse_attn"]  # they count fusions
# (ours, the other): the speed-up columns of the table, those whose two variants run
RATIOS = [("fuse_attn", "inductor"), ("fuse_attn", "sdpa+inductor"), ("sdpa+fuse_attn", "sdpa+inductor"),
          ("sdpa+fuse_attn:triton", "sdpa+inductor"), ("sdpa+fuse_attn:ours", "sdpa+inductor"),
          ("fuse_attn", "flex+inductor"), ("sdpa+fuse_attn", "flex+inductor")]
MODEL_NAMES = ["gpt2", "llama", "gpt2-small", "bert-padded", "bert-d128", "llama-1b", "mistral-window", "t5", "gemma2", "phi3",
               "llama-packed", "deepseek-mla", "gpt-oss", "llama-padded-blocks", "gemma4"]
# models whose decoder layers are compiled one by one (the rest of the model eager) instead of the whole model
COMPILED_BY_BLOCK = ("llama-padded-blocks",)
# models run on padded batches (make_inputs)
PADDED = ("bert-padded", "llama-padded-blocks")
# documents in each row of "llama-packed" (issue 59's case: 16 documents in a row of 32k tokens)
PACKED_DOCUMENTS = 16
MODES = ["train", "infer"]
# torch.compile's modes a run may take for all its compiled variants
DEFAULT_COMPILE_MODE = "default"
COMPILE_MODES = [DEFAULT_COMPILE_MODE, "reduce-overhead"]
FIRST_STEPS_MARK = "first steps:"  # the line a --first-steps subprocess prints its result on
# (fuse_attn variant, Inductor's variant on the same attention path): the compile-time table's ratios
COMPILE_TIME_RATIOS = [("fuse_attn", "inductor"), ("sdpa+fuse_attn", "sdpa+inductor"),
                       ("sdpa+fuse_attn:triton", "sdpa+inductor"), ("sdpa+fuse_attn:ours", "sdpa+inductor")]
SPEED_COLUMNS = ["model", "mode", "B", "N", "variant", "layers", "fused_attentions", "median_ms", "tokens_per_s",
                 "peak_bytes", "device", "torch", "triton", "transformers", "date"]
# fuse_attn's parts of a first compile (fuse_attn.backend.compile_seconds; they overlap: see there)
COMPILE_PARTS = ["analysis", "trace", "tuning", "compiling candidates"]
# Where AOTAutograd's and Inductor's part of a first compile went, for every variant (Dynamo's timers,
# torch._dynamo.utils.compilation_time_metrics, summed over the graphs): a CSV column and the timer it reads
INDUCTOR_PHASES = {"joint_trace": "aot_trace_joint_graph", "lowering": "GraphLowering.run",
                   "codegen": "GraphLowering.codegen", "kernel_compile_wait": "async_compile.wait"}
COMPILE_COLUMNS = ["model", "B", "N", "variant", "caches", "first_two_steps_s", "first_step_s", "fused_attentions",
                   "analysis_s", "trace_s", "tuning_s", "compiling_candidates_s",
                   *(f"{phase}_s" for phase in INDUCTOR_PHASES), "device", "torch", "triton", "transformers", "date"]


def model_and_config(name, attention, tiny, length):
    """A model of ``name`` with ``attention`` ("eager" / "sdpa"), random weights, dropout off, no KV cache.

    GPT-2: GPT-2 medium's width (1024, 16 heads of 64) with 4 layers. LLaMA: TinyLlama-1.1B's hidden and MLP
    sizes (2048, 5632) with LLaMA's head dim (16 heads of 128), 8 kv heads (GQA 2), 4 layers. Tiny: the model-zoo
    test's sizes (width 32, 4 heads, 2 layers, vocabulary 64).
    """
    import transformers as T

    if name == "gpt2-small":  # GPT-2 small: 12 layers, width 768, 12 heads of 64
        size = dict(n_embd=32, n_head=4, n_layer=2, vocab_size=64) if tiny else dict(n_embd=768, n_head=12, n_layer=12)
        config = T.GPT2Config(**size, n_positions=length, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                              use_cache=False)
        model_cls = T.GPT2LMHeadModel
    elif name in ("bert-padded", "bert-d128"):
        # bert-padded: BERT-base (12 layers, width 768, 12 heads), run with padded batches (make_inputs); bert-d128:
        # BERT's encoder with heads of 128 (width 2048, 16 heads, MLP 8192, 8 layers), no padding: unmasked attention
        # at head dim 128, the attention of diffusion transformers' blocks (DiT, Flux)
        if tiny:
            size = dict(hidden_size=32, num_attention_heads=4 if name == "bert-padded" else 2, num_hidden_layers=2,
                        intermediate_size=64, vocab_size=64)
        else:
            size = ({} if name == "bert-padded" else
                    dict(hidden_size=2048, num_attention_heads=16, num_hidden_layers=8, intermediate_size=8192))
        config = T.BertConfig(**size, max_position_embeddings=max(512, length), hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0)
        model_cls = T.BertForMaskedLM
    elif name == "llama-1b":  # Llama-3.2-1B's shape: width 2048, 32 heads of 64, 8 kv heads (GQA 4), 16 layers
        size = (dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=1,
                     num_hidden_layers=2, vocab_size=64) if tiny else
                dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
                     num_hidden_layers=16))
        config = T.LlamaConfig(**size, max_position_embeddings=length, attention_dropout=0.0, use_cache=False)
        model_cls = T.LlamaForCausalLM
    elif name == "mistral-window":  # the "llama" sizes, each query seeing its last N/4 keys (Mistral's window)
        config = T.MistralConfig(**_llama_sizes(tiny), max_position_embeddings=length, sliding_window=length // 4,
                                 attention_dropout=0.0, use_cache=False)
        model_cls = T.MistralForCausalLM
    elif name == "t5":  # T5-small: width 512, 8 heads of 64, 6 encoder and 6 decoder layers
        size = (dict(d_model=32, d_kv=8, d_ff=64, num_heads=4, num_layers=2, vocab_size=64) if tiny else
                dict(d_model=512, d_kv=64, d_ff=2048, num_heads=8, num_layers=6))
        config = T.T5Config(**size, dropout_rate=0.0, use_cache=False)
        model_cls = T.T5ForConditionalGeneration
    elif name == "gemma2":  # Gemma-2-2B's layers (width 2304, 8 heads of 256 on 4 kv heads, tanh softcap 50 on the
        # scores, sliding and global layers alternating) with 4 of its 26 layers and a 32k vocabulary (its 256k one
        # would make the step mostly the output layer); run on eager attention: transformers' sdpa path for Gemma-2
        # (integrations/sdpa_attention.py) ignores the softcap, so it computes another model
        size = (dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     num_hidden_layers=2, vocab_size=64) if tiny else
                dict(hidden_size=2304, intermediate_size=9216, num_attention_heads=8, num_key_value_heads=4,
                     head_dim=256, num_hidden_layers=4, vocab_size=32000))
        config = T.Gemma2Config(**size, max_position_embeddings=length, attention_dropout=0.0, use_cache=False)
        model_cls = T.Gemma2ForCausalLM
    elif name == "phi3":  # Phi-3-mini's layers (width 3072, 32 heads of 96, MLP 8192, vocabulary 32064), 4 of its 32
        size = (dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
                     num_hidden_layers=2, vocab_size=64) if tiny else
                dict(hidden_size=3072, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=32,
                     num_hidden_layers=4, vocab_size=32064))
        config = T.Phi3Config(**size, max_position_embeddings=length, attention_dropout=0.0, resid_pdrop=0.0,
                              embd_pdrop=0.0, use_cache=False, pad_token_id=0)
        model_cls = T.Phi3ForCausalLM
    elif name == "deepseek-mla":
        # DeepSeek-V2-Lite's multi-head latent attention (deepseek-ai/DeepSeek-V2-Lite's config.json: width 2048, 16
        # heads, kv_lora_rank 512, no q_lora_rank, qk_nope_head_dim 128 + qk_rope_head_dim 64 = a q/k head dim of
        # 192, v_head_dim 128, MLP 10944) in transformers' DeepSeek-V3 classes, 4 of its 27 layers. All layers dense
        # (first_k_dense_replace = the layers): the MoE layers' routing would break the graph and time the experts,
        # not the attention. A 32k vocabulary (its 102400 would make the step mostly the output layer); RoPE without
        # its YaRN scaling (the attention's shapes are the same). Tiny: q/k head dim 12, v head dim 8.
        size = (dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, kv_lora_rank=16, qk_nope_head_dim=8,
                     qk_rope_head_dim=4, v_head_dim=8, num_hidden_layers=2, vocab_size=64) if tiny else
                dict(hidden_size=2048, intermediate_size=10944, num_attention_heads=16, kv_lora_rank=512,
                     qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_hidden_layers=4, vocab_size=32000))
        config = T.DeepseekV3Config(**size, num_key_value_heads=size["num_attention_heads"], q_lora_rank=None,
                                    first_k_dense_replace=size["num_hidden_layers"], max_position_embeddings=length,
                                    attention_dropout=0.0, use_cache=False)
        model_cls = T.DeepseekV3ForCausalLM
    elif name == "gpt-oss":
        # gpt-oss-20b's attention (openai/gpt-oss-20b's config.json: width 2880, 64 heads of 64 on 8 kv heads, a
        # learned sink per head, sliding-window (128) and full layers alternating, YaRN RoPE: the config's defaults
        # and its max_position_embeddings, which sizes no tensor) with 4 of its 24 layers and a 32k vocabulary (its
        # 201088 would make the step mostly the output layer). Its MoE kept but smaller (4 experts of 2880, 2 a token,
        # against its 32 and 4) to fit a training step at N=4096, with transformers' default experts implementation
        # (grouped_mm: one grouped matmul, which torch.compile traces; "eager" loops over the experts hit, shapes
        # that depend on the data). transformers gives gpt-oss no SDPA attention (eager, flex, flash).
        # Tiny: a window of 8 so that N=32 is cut by it, and "batched_mm" experts (a bmm over each token's gathered
        # expert weights; no data-dependent shapes either, cheap at these widths): under torch.compile grouped_mm
        # takes bf16 only, and for fp32 (the CPU's) transformers falls back to a custom op whose backward reads the
        # experts' offsets (.tolist()), which AOTAutograd cannot trace: a graph break in every layer, under Inductor
        # too. At full size batched_mm would copy a 2880x5760 weight per token.
        size = (dict(hidden_size=32, intermediate_size=32, head_dim=8, num_attention_heads=4, num_key_value_heads=2,
                     num_hidden_layers=2, sliding_window=8, vocab_size=64) if tiny else
                dict(hidden_size=2880, intermediate_size=2880, head_dim=64, num_attention_heads=64,
                     num_key_value_heads=8, num_hidden_layers=4, sliding_window=128, vocab_size=32000))
        config = T.GptOssConfig(**size, num_local_experts=4, num_experts_per_tok=2, attention_dropout=0.0,
                                use_cache=False, experts_implementation="batched_mm" if tiny else "grouped_mm")
        model_cls = T.GptOssForCausalLM
    elif name == "gemma4":
        # Gemma-4's text decoder as transformers' Gemma4TextConfig defaults give it (width 2304, 8 heads on 4 kv heads;
        # sliding layers' heads of 256 with a window of 512, every sixth layer global with heads of 512), 6 of its 30
        # layers (five sliding, one global) and a 32k vocabulary (its 262k one would make the step mostly the output
        # layer), no per-layer input embeddings (another 262k-row table)
        size = (dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                     global_head_dim=16, sliding_window=8, num_hidden_layers=2, vocab_size=64,
                     layer_types=["sliding_attention", "full_attention"]) if tiny else
                dict(num_hidden_layers=6, vocab_size=32000))
        config = T.Gemma4TextConfig(**size, hidden_size_per_layer_input=0, max_position_embeddings=length,
                                    attention_dropout=0.0, use_cache=False)
        model_cls = T.Gemma4ForCausalLM
    elif name == "gpt2":
        size = dict(n_embd=32, n_head=4, n_layer=2, vocab_size=64) if tiny else dict(n_embd=1024, n_head=16, n_layer=4)
        config = T.GPT2Config(**size, n_positions=length, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                              use_cache=False)
        model_cls = T.GPT2LMHeadModel
    else:  # "llama", "llama-packed", "llama-padded-blocks"
        config = T.LlamaConfig(**_llama_sizes(tiny), max_position_embeddings=length, attention_dropout=0.0,
                               use_cache=False)
        model_cls = T.LlamaForCausalLM
    config._attn_implementation = attention
    return model_cls, config


def _llama_sizes(tiny) -> dict:
    """The ``llama`` decoder's sizes (``model_and_config``'s docstring), or the tiny ones."""
    if tiny:
        return dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                    num_hidden_layers=2, vocab_size=64)
    return dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=16, num_key_value_heads=8,
                num_hidden_layers=4)


def build(name, attention, tiny, length, device, dtype, train):
    if name == "gemma2" and attention == "sdpa":  # (model_and_config's gemma2 branch says why)
        raise ValueError("transformers' sdpa path ignores Gemma-2's softcap: not the model, not timed")
    model_cls, config = model_and_config(name, attention, tiny, length)
    torch.manual_seed(0)  # the same weights for every variant
    model = model_cls(config).to(device, dtype).train(train)
    if model.config._attn_implementation != attention:
        raise RuntimeError(f"{name}: asked for attention {attention!r}, the model uses {model.config._attn_implementation!r}")
    return model


def make_inputs(name, vocab, batch, length, device) -> dict:
    """Random input ids (for "t5" also as the decoder's); for :data:`PADDED` models also the attention mask of a padded
    batch: the sequences' lengths cycle through N, 3N/4, N/2, N/3 (the padding the model's mask utilities turn into an
    additive mask); for "llama-packed" the position ids of :data:`PACKED_DOCUMENTS` documents of equal length in each
    row (the last takes the remainder), restarting at 0 (Hugging Face builds the documents' mask from them)."""
    gen = torch.Generator(device).manual_seed(0)
    inputs = {"input_ids": torch.randint(0, vocab, (batch, length), device=device, generator=gen)}
    if name == "t5":  # an encoder-decoder: the decoder reads the same ids (teacher forcing on the labels)
        inputs["decoder_input_ids"] = inputs["input_ids"]
    if name in PADDED:
        lengths = torch.tensor([(length, 3 * length // 4, length // 2, length // 3)[i % 4] for i in range(batch)],
                               device=device)
        inputs["attention_mask"] = (torch.arange(length, device=device)[None, :] < lengths[:, None]).long()
    if name == "llama-packed":
        inputs["position_ids"] = packed_position_ids(batch, length, PACKED_DOCUMENTS, device)
    return inputs


def packed_position_ids(batch: int, length: int, documents: int, device) -> torch.Tensor:
    """[batch, length] position ids of ``documents`` packed documents of equal length in each row (the last takes the
    remainder), restarting at 0 at each: what Hugging Face's padding-free collator gives a model."""
    lengths = [length // documents] * documents
    lengths[-1] += length - sum(lengths)
    positions = torch.cat([torch.arange(n, device=device) for n in lengths if n])
    return positions[None].expand(batch, -1).contiguous()


def make_step(model, inputs, train, cuda_graphs=False):
    """One training step or inference forward; with ``cuda_graphs``, each begins a new step of CUDA graph trees (the
    last step's outputs are not read again)."""
    def step():
        if cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        if train:
            model(**inputs, labels=inputs["input_ids"]).loss.backward()
        else:
            with torch.no_grad():
                model(**inputs)
    return step


def labelled(variant, compile_mode):
    """The variant's name in the CSV and the printed lines: with the compile mode where it is not the default."""
    return variant if compile_mode == DEFAULT_COMPILE_MODE else f"{variant}@{compile_mode}"


def compiled(name, model, variant, compile_mode):
    """``model`` under the variant's backend: the whole of it, or for :data:`COMPILED_BY_BLOCK` models each decoder
    layer (compiled in place)."""
    backend = VARIANTS[variant][1]
    if backend is None:
        return model
    options = dict(backend=fuse_attn_backend if backend == "fuse_attn" else backend,
                   mode=None if compile_mode == DEFAULT_COMPILE_MODE else compile_mode)
    if name in COMPILED_BY_BLOCK:
        for layer in model.model.layers:
            layer.compile(**options)
        return model
    return torch.compile(model, **options)


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def measure(name, variant, mode, length, batch, args):
    """Compile (untimed, reports collected), then time one cell: (median ms, peak bytes or None, fused count)."""
    train = mode == "train"
    model = build(name, VARIANTS[variant][0], args.tiny, length, args.device, args.dtype, train)
    vocab = model.config.vocab_size
    cuda_graphs = args.compile_mode == "reduce-overhead" and VARIANTS[variant][1] is not None
    step = make_step(compiled(name, model, variant, args.compile_mode),
                     make_inputs(name, vocab, batch, length, args.device), train, cuda_graphs)
    params = list(model.parameters())

    def drop_grads():
        for p in params:
            p.grad = None

    candidates = VARIANTS[variant][2]  # FUSE_ATTN_CANDIDATES for the compiling first step, when the variant sets it
    environment = contextlib.nullcontext() if candidates is None else \
        mock.patch.dict(os.environ, {"FUSE_ATTN_CANDIDATES": candidates})
    with collect_reports() as reports, environment:
        step()
    drop_grads()
    fused = sum(len(r.fused) for r in reports)
    for report in reports:
        for verdict in report.not_fused:
            print(f"  {name} {variant} {mode}: {verdict.line()}", flush=True)
    runs = collections.Counter(v.implementation for r in reports for v in r.fused if v.runs)
    if runs:  # which implementation the fused attentions run, where candidates were timed
        print(f"  {name} {variant} {mode}: " + ", ".join(f"{n} attention(s) runs {what}" for what, n in runs.items()),
              flush=True)
    if args.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        drop_grads()
        ms = triton.testing.do_bench(step, rep=TIMED_MS, grad_to_none=params if train else None, return_mode="median")
    else:
        start = time.perf_counter()
        step()
        ms = (time.perf_counter() - start) * 1e3
        peak = None
    return ms, peak, fused


def speed(args, record):
    """Every (model, mode, length) row: tokens/s per variant; ``record`` gets each cell's CSV values.
    Returns (rows, headers, whether every cell ran; out of memory counts as a result)."""
    rows, ok = [], True
    for name in args.models:
        for mode in args.modes:
            for length in args.lengths:
                batch = max(1, args.batch_tokens // length)
                layers = model_and_config(name, "eager", args.tiny, length)[1].num_hidden_layers
                rates, cells, fused = {}, {}, {variant: "-" for variant in FUSED_VARIANTS}
                for variant in args.variants:
                    label = labelled(variant, args.compile_mode)
                    torch._dynamo.reset()
                    t0 = time.time()
                    try:
                        ms, peak, count = measure(name, variant, mode, length, batch, args)
                        rates[variant] = batch * length / (ms * 1e-3)
                        cells[variant] = f"{rates[variant]:,.0f}"
                        if variant in fused:
                            fused[variant] = count
                        record([name, mode, batch, length, label, layers, count if variant in fused else "",
                                f"{ms:.3f}", f"{rates[variant]:.1f}", "" if peak is None else peak])
                    except torch.cuda.OutOfMemoryError:
                        cells[variant] = "OOM"
                        record([name, mode, batch, length, label, layers, "", "OOM", "", ""])
                    except Exception as e:  # report and go on: one failure must not hide the rest
                        traceback.print_exc()
                        cells[variant] = f"error: {type(e).__name__}"
                        ok = False
                        record([name, mode, batch, length, label, layers, "", "error", "", ""])
                    gc.collect()
                    if args.device == "cuda":
                        torch.cuda.empty_cache()
                    print(f"  {name} {mode} N={length} {label}: {cells[variant]} tokens/s ({time.time() - t0:.1f}s)",
                          flush=True)
                ratios = [f"{rates[ours] / rates[other]:.2f}x" if ours in rates and other in rates else "-"
                          for ours, other in ratio_columns(args.variants)]
                rows.append([name, mode, f"{batch}x{length}", layers, fused["fuse_attn"], fused["sdpa+fuse_attn"],
                             *(cells[v] for v in args.variants), *ratios])
    headers = ["model", "mode", "BxN", "layers", "fused", "sdpa fused",
               *(f"{labelled(v, args.compile_mode)} tok/s" for v in args.variants),
               *(f"{ours} / {other}" for ours, other in ratio_columns(args.variants))]
    return rows, headers, ok


def ratio_columns(variants) -> list[tuple[str, str]]:
    """The speed-up columns (:data:`RATIOS`) of a run of ``variants``: those whose two variants it runs."""
    return [(ours, other) for ours, other in RATIOS if ours in variants and other in variants]


def marked_result(stdout: str, mark: str):
    """The JSON a subprocess of these tools printed last on a line starting with ``mark``; None if it printed none."""
    marked = [line[len(mark):] for line in stdout.splitlines() if line.startswith(mark)]
    return json.loads(marked[-1]) if marked else None


def first_steps(args):
    """(--first-steps, in a subprocess) Print the seconds of the first two training steps of one compiled variant."""
    name, length, variant = args.models[0], args.compile_time_length, args.first_steps
    batch = max(1, args.batch_tokens // length)
    model = build(name, VARIANTS[variant][0], args.tiny, length, args.device, args.dtype, train=True)
    inputs = make_inputs(name, model.config.vocab_size, batch, length, args.device)
    candidates = VARIANTS[variant][2]
    environment = contextlib.nullcontext() if candidates is None else \
        mock.patch.dict(os.environ, {"FUSE_ATTN_CANDIDATES": candidates})
    synchronize(args.device)
    start = time.perf_counter()
    with collect_reports() as reports, environment:
        step = make_step(compiled(name, model, variant, DEFAULT_COMPILE_MODE), inputs, train=True)
        step()
        synchronize(args.device)
        first = time.perf_counter() - start
        for p in model.parameters():
            p.grad = None
        step()
        synchronize(args.device)
    seconds = time.perf_counter() - start
    timers = torch._dynamo.utils.compilation_time_metrics
    phases = {phase: sum(timers.get(timer, ())) for phase, timer in INDUCTOR_PHASES.items()}
    print(FIRST_STEPS_MARK, json.dumps({"seconds": seconds, "first": first, "fused": sum(len(r.fused) for r in reports),
                                        "parts": compile_seconds(), "phases": phases}), flush=True)


def compile_times(args, record):
    """Cold and warm seconds of the first two steps of every variant, each in fresh subprocesses.
    Returns (rows, headers, whether every subprocess succeeded)."""
    length = args.compile_time_length
    batch = max(1, args.batch_tokens // length)
    variants = [v for v in args.variants if VARIANTS[v][1] is not None]
    rows, ok = [], True
    for name in args.models:
        seconds = {}
        for variant in variants:
            with tempfile.TemporaryDirectory(prefix="bench_models_caches_") as caches:
                # One hash seed for both processes: Gemma-4's forward loops over a set of layer-type strings
                # (transformers 5.24, Gemma4TextModel.forward), so with Python's per-process hash randomization the
                # traced graph's op and input order differ between two processes half the time, and the warm one
                # then misses every cache (fuse_attn's analysis, AOTAutograd's and Inductor's alike)
                env = dict(os.environ, FUSE_ATTN_CACHE_DIR=os.path.join(caches, "fuse_attn"),
                           TORCHINDUCTOR_CACHE_DIR=os.path.join(caches, "inductor"),
                           TRITON_CACHE_DIR=os.path.join(caches, "triton"), PYTHONHASHSEED="0")
                for caches_state in ("cold", "warm"):
                    command = [sys.executable, os.path.abspath(__file__), "--first-steps", variant, "--models", name,
                               "--compile-time-length", str(length), "--batch-tokens", str(args.batch_tokens),
                               "--device", args.device] + (["--tiny"] if args.tiny else [])
                    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
                    result = marked_result(done.stdout, FIRST_STEPS_MARK)
                    if done.returncode or result is None:
                        print(f"{name} {variant} {caches_state} failed (exit {done.returncode}):\n{done.stderr[-3000:]}",
                              flush=True)
                        ok = False
                        failed = [name, batch, length, variant, caches_state, "error"]  # (the rest left empty)
                        record(failed + [""] * (COMPILE_COLUMNS.index("device") - len(failed)))
                        continue
                    seconds[variant, caches_state] = result["seconds"]
                    ours = VARIANTS[variant][1] == "fuse_attn"
                    parts = [f"{result['parts'][part]:.2f}" if ours else "" for part in COMPILE_PARTS]
                    phases = [f"{result['phases'][phase]:.2f}" for phase in INDUCTOR_PHASES]
                    record([name, batch, length, variant, caches_state, f"{result['seconds']:.2f}",
                            f"{result['first']:.2f}", result["fused"] if ours else "", *parts, *phases])
                    where = " (" + ", ".join(
                        [f"{part} {result['parts'][part]:.1f}s" for part in COMPILE_PARTS if ours]
                        + [f"{phase.replace('_', ' ')} {result['phases'][phase]:.1f}s" for phase in INDUCTOR_PHASES]) + ")"
                    print(f"  {name} {variant} {caches_state}: {result['seconds']:.1f}s{where}", flush=True)
        for caches_state in ("cold", "warm"):
            cells = [f"{seconds[v, caches_state]:.1f}" if (v, caches_state) in seconds else "error" for v in variants]
            ratios = [f"{seconds[ours, caches_state] / seconds[other, caches_state]:.2f}x"
                      if (ours, caches_state) in seconds and (other, caches_state) in seconds else "-"
                      for ours, other in COMPILE_TIME_RATIOS if ours in variants and other in variants]
            rows.append([name, f"{batch}x{length}", caches_state, *cells, *ratios])
    headers = ["model", "BxN", "caches", *(f"{v} s" for v in variants),
               *(f"{ours} / {other}" for ours, other in COMPILE_TIME_RATIOS if ours in variants and other in variants)]
    return rows, headers, ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--models", nargs="*", default=MODEL_NAMES, choices=MODEL_NAMES)
    ap.add_argument("--modes", nargs="*", default=MODES, choices=MODES)
    ap.add_argument("--lengths", nargs="*", type=int, default=None,
                    help=f"sequence lengths (default {DEFAULT_LENGTHS}, {TINY_LENGTH} with --tiny)")
    ap.add_argument("--batch-tokens", type=int, default=None,
                    help=f"B*N per step, B = max(1, this // N) (default {DEFAULT_BATCH_TOKENS}, {TINY_BATCH_TOKENS} with --tiny)")
    ap.add_argument("--variants", nargs="*", default=DEFAULT_VARIANTS, choices=COMPILED_VARIANTS)
    ap.add_argument("--eager", action="store_true", help="also time the uncompiled eager-attention model")
    ap.add_argument("--compile-mode", default=DEFAULT_COMPILE_MODE, choices=COMPILE_MODES,
                    help="torch.compile's mode for every compiled variant (reduce-overhead: CUDA graph trees)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="tiny configs (a smoke test)")
    ap.add_argument("--compile-time", action="store_true",
                    help="measure the first two training steps' time, cold and warm caches, instead")
    ap.add_argument("--compile-time-length", type=int, default=None,
                    help=f"N of the compile-time runs (default {TARGET_LENGTH}, {TINY_LENGTH} with --tiny)")
    ap.add_argument("--first-steps", choices=COMPILED_VARIANTS, help=argparse.SUPPRESS)  # --compile-time's subprocess
    args = ap.parse_args(argv)
    if importlib.util.find_spec("transformers") is None:
        print("transformers is not installed: this benchmark builds Hugging Face models from their configs "
              '(pip install transformers, or pip install -e ".[bench]")', file=sys.stderr, flush=True)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU, or --device cpu --tiny for a smoke test", file=sys.stderr, flush=True)
        return 2
    import transformers

    args.dtype = torch.bfloat16 if args.device == "cuda" else torch.float32  # fp32 on a CPU, as the tests
    args.lengths = args.lengths or ([TINY_LENGTH] if args.tiny else DEFAULT_LENGTHS)
    args.compile_time_length = args.compile_time_length or (TINY_LENGTH if args.tiny else TARGET_LENGTH)
    args.batch_tokens = args.batch_tokens or (TINY_BATCH_TOKENS if args.tiny else DEFAULT_BATCH_TOKENS)
    args.variants = args.variants + (["eager"] if args.eager else [])
    if args.first_steps:
        first_steps(args)
        return 0
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"device: {device_name}, torch {torch.__version__}, triton {triton.__version__}, "
          f"transformers {transformers.__version__}", flush=True)
    run_info = [device_name, torch.__version__, triton.__version__, transformers.__version__,
                datetime.date.today().isoformat()]
    os.makedirs(args.out, exist_ok=True)
    if args.compile_time:
        path = os.path.join(args.out, "bench_models_compile_time.csv")
        if columns_clash(path, COMPILE_COLUMNS):
            return 2
        with appending(path, COMPILE_COLUMNS, run_info) as record:
            rows, headers, ok = compile_times(args, record)
        print(tabulate(rows, headers=headers, tablefmt="github"), flush=True)
        print("targets: fuse_attn over Inductor on the same attention path, " +
              ", ".join(f"{state} caches <= {ratio}x" for state, ratio in COMPILE_TIME_TARGETS.items()), flush=True)
        return 0 if ok else 1
    path = os.path.join(args.out, "bench_models.csv")
    if columns_clash(path, SPEED_COLUMNS):
        return 2
    with appending(path, SPEED_COLUMNS, run_info) as record:
        rows, headers, ok = speed(args, record)
    print(tabulate(rows, headers=headers, tablefmt="github"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
