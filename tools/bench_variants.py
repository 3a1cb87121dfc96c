"""Attention variants written the way model code writes them: fuse_attn against the fastest peer (issue 17).

    PYTHONPATH=. python3 tools/bench_variants.py --out OUTDIR [--variants softcap_causal gqa_causal ...]
        [--modes fwd fwd+bwd] [--methods fuse_attn flex sdpa_mask cudnn torch_compile]
        [--batch B] [--heads H] [--seq N] [--head-dim D] [--check]
    PYTHONPATH=. python3 tools/bench_variants.py --out OUTDIR --plot-only     # bars of OUTDIR/bench_variants.csv

Each variant is a small ``nn.Module`` whose ``forward`` takes q, k, v ([B, H, N, D], bf16) and computes attention
in eager PyTorch as models do (``q @ k.transpose(-2, -1) * scale``, the variant's mask or bias,
``softmax(dim=-1, dtype=float32).to(q.dtype)``, ``@ v``):

* ``softcap_causal``: Gemma-2's tanh softcap 50 and a causal ``triu`` mask (B4 H16 N4096 D128, the default size);
  ``softcap_causal_d256``: the same at head dim 256 (B4 H8: Gemma-2 2B's 8 heads of 256, B*H*D as the default's);
* ``window_causal``: a 1024-key sliding window and causal, from ``arange`` index comparisons (Mistral / HF);
* ``gqa_causal``: 32 query heads on 8 kv heads expanded by ``repeat_kv`` (LLaMA-3 8B's heads), causal (B2: B*H as
  the default's);
* ``alibi_causal_precomputed``: ALiBi as a precomputed [1, H, N, N] buffer, causal; ``alibi_from_slopes``: ALiBi
  computed in the forward from the slopes and ``arange`` positions, causal;
* ``dense_bias``: a learned [1, H, N, N] bias (an ``nn.Parameter``: fwd+bwd computes its gradient), no mask;
* ``padding_causal``: a [B, N] ``attention_mask`` input (lengths N, 3N/4, N/2, N/3), turned into Hugging Face's
  additive ``finfo.min`` padding + causal mask in the graph.
* ``padding_causal_mask_input``: the same mask built outside and passed in as a [B, 1, N, N] bf16 tensor, as each
  block's graph receives it under FSDP2 or DDP (its tiles classified per call; ``FUSE_ATTN_MASK_BLOCKS=0`` for the
  dense path).

Methods: ``fuse_attn`` (``torch.compile(module, backend="fuse_attn")``, the generated kernels only:
``FUSE_ATTN_CANDIDATES=triton``, or our kernels with the Gluon ones on Hopper where the caller sets
``FUSE_ATTN_CANDIDATES=triton,gluon``; the row says how many attentions were fused and what runs them), ``flex``
(compiled ``flex_attention``: block mask built once, the variant's score program as a score_mod, ``enable_gqa``),
``sdpa_mask`` (``scaled_dot_product_attention`` with the mask a Hugging Face "sdpa" model passes, materialized once,
or ``is_causal``), ``cudnn`` (the same SDPA call under SDPA's cuDNN backend, where it needs no mask; with
``enable_gqa`` where this torch's cuDNN path takes it, else kv heads expanded in the call) and ``torch_compile``
(Inductor's default on the same module); a cell is "-" where the method cannot state the variant.
For each, forward (under ``torch.no_grad()``) and forward+backward (gradients of q, k, v and the learned bias):
the median of ``triton.testing.do_bench`` over back-to-back calls (wall time: where the host cannot issue a call's
kernels as fast as the GPU runs them, the GPU idles and this grows), the GPU time of the call's kernels alone (the
call captured once in a CUDA graph and replayed, as ``tools/bench_host_overhead.py`` does; "-" where a method cannot
be captured), and the peak memory one call allocates beyond its inputs. Inputs are random normal. After each variant
a row is printed: each method's time and memory, the fastest peer and the speed-up ``peer ms / fuse_attn ms``; a
table at the end. Rows are appended to OUTDIR/bench_variants.csv with the GPU's name, the torch and triton versions
and the date.
``--check`` first compiles every variant with fuse_attn at a small size in fp32 and holds its output and gradients
to the 2x rule (``max|ours - fp64| <= 2 * max|eager fp32 - fp64| + floor``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import os
import sys
from typing import Callable
from unittest import mock

import torch
import torch.nn.functional as F
import triton
from tabulate import tabulate

if __package__ in (None, ""):  # run as a script: the repository root holds fuse_attn and tools
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What is measured is our kernels: a fused attention must not run SDPA's kernel instead
# (fuse_attn.kernels.dispatch), whatever this GPU would time faster. The generated template by default;
# FUSE_ATTN_CANDIDATES=triton,gluon set by the caller lets the Gluon kernels of plain attention on Hopper compete.
if os.environ.get("FUSE_ATTN_CANDIDATES") != "triton,gluon":
    os.environ["FUSE_ATTN_CANDIDATES"] = "triton"
from fuse_attn.report import collect_reports  # noqa: E402
from tools.bench_attention import FLOOR, NAMES, SOFTCAP, _err, alibi_slopes, measure  # noqa: E402
from tools.bench_csv import appending, columns_clash  # noqa: E402
from tools.bench_host_overhead import graph_time_ms, random_inputs  # noqa: E402
from tools.bench_models import packed_position_ids  # noqa: E402

# the dtype models train and serve in (and tools/bench_attention.py's default)
DTYPE = torch.bfloat16
# Gemma-3's sliding_window (its local layers).
WINDOW = 1024
# Key lengths of the padded batch rows, as fractions of N (cycled over the batch), as issue 17 sets them.
PADDING_FRACTIONS = (1, 3 / 4, 1 / 2, 1 / 3)
DOCUMENTS = 16  # documents packed into a row of the packed-documents variants (the case: N 32k, 16 documents)
# --check: several kernel blocks (64 or 128 rows) at each variant's head dim, and a window (N / 4) shorter than N.
CHECK_SEQ = 256


@dataclasses.dataclass(frozen=True)
class Size:
    """A variant's sizes (and the sliding window's width, which only ``window_causal`` reads)."""

    batch: int
    heads: int
    kv_heads: int
    seq: int
    head_dim: int
    window: int = WINDOW
    value_head_dim: int | None = None  # v's head dim where it is not q's and k's (MLA)

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def v_dim(self) -> int:
        return self.value_head_dim or self.head_dim

    @property
    def dims(self) -> str:
        """The head dims as the CSV's D column writes them: D, or D/Dv where v's differs."""
        return f"{self.head_dim}/{self.v_dim}" if self.v_dim != self.head_dim else str(self.head_dim)

    def __str__(self) -> str:
        heads = f"{self.heads}/{self.kv_heads}" if self.group > 1 else str(self.heads)
        return f"{self.batch},{heads},{self.seq},{self.dims}"


def resized(size: Size, batch=None, heads=None, seq=None, head_dim=None) -> Size:
    """``size`` with the given fields replaced; the kv heads keep the variant's GQA group (heads // group)."""
    heads = heads or size.heads
    return Size(batch or size.batch, heads, heads // size.group, seq or size.seq, head_dim or size.head_dim,
                size.window, None if head_dim else size.value_head_dim)


def small_size(size: Size, seq: int, head_dim: int) -> Size:
    """A check size: two batch rows, 4 kv heads (of the variant's group), a window of N / 4, head dim ``head_dim``
    (v's scaled with it where it differs)."""
    value_head_dim = size.value_head_dim and size.value_head_dim * head_dim // size.head_dim
    return Size(2, 4 * size.group, 4, seq, head_dim, seq // 4, value_head_dim)


# ---- the variants: model code (forward) and how each peer states the same attention ---------------------------------
def attend(scores, v):
    """The end every variant shares: softmax in fp32 (as Gemma-2's and LLaMA's eager attention), cast back, ``@ v``."""
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype) @ v


def repeat_kv(x, heads: int):
    """[B, H_kv, N, D] kv heads repeated to ``heads`` (each kv head serving heads // H_kv query heads in a row):
    Hugging Face's ``repeat_kv``, an expand and a reshape."""
    B, kv_heads, N, D = x.shape
    return x[:, :, None].expand(B, kv_heads, heads // kv_heads, N, D).reshape(B, heads, N, D)


def causal_masked(scores):
    """The scores with the keys after each query at -inf: a ``triu(1)`` bool mask, as LLaMA-style model code."""
    n = scores.shape[-2]
    future = torch.ones(n, n, dtype=torch.bool, device=scores.device).triu(1)
    return scores.masked_fill(future, float("-inf"))


def alibi_bias(slopes, n: int):
    """[H, N, N] ALiBi bias ``slopes[h] * (j - i)``, as Bloom-style model code computes it."""
    positions = torch.arange(n, device=slopes.device)
    return slopes[:, None, None] * (positions[None, :] - positions[:, None])


def causal_keep(n: int, device):
    """[1, 1, N, N] bool: True where the key is visible to the query (j <= i), SDPA's bool-mask convention."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()[None, None]


def causal_mask_mod(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def softcap_score_mod(score, b, h, q_idx, kv_idx):
    return torch.tanh(score / SOFTCAP) * SOFTCAP


def alibi_score_mod(slopes):
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)
    return score_mod


class VariantAttention(torch.nn.Module):
    """``forward(q, k, v, *extra_inputs())`` is the model code. ``flex_mods`` gives FlexAttention's (score_mod,
    mask_mod) and ``sdpa_arguments`` SDPA's mask arguments for the same attention, or None where that method cannot
    state it."""

    def __init__(self, size: Size):
        super().__init__()
        self.size = size

    def extra_inputs(self, device) -> tuple:
        return ()


class SoftcapCausal(VariantAttention):
    """Gemma-2's eager attention: the scores softcapped by ``tanh(s / 50) * 50``, then a causal ``triu`` mask."""

    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        return attend(causal_masked(torch.tanh(scores / SOFTCAP) * SOFTCAP), v)

    def flex_mods(self, device, extra):
        return softcap_score_mod, causal_mask_mod

    def sdpa_arguments(self, device, extra):
        return None  # SDPA has no softcap (Hugging Face runs Gemma-2's softcap with eager attention)


class WindowCausal(VariantAttention):
    """Mistral's sliding window as Hugging Face builds it: index comparisons of ``arange`` positions."""

    def forward(self, q, k, v):
        n = q.shape[-2]
        q_idx = torch.arange(n, device=q.device)[:, None]
        kv_idx = torch.arange(n, device=q.device)[None, :]
        visible = (kv_idx <= q_idx) & (kv_idx > q_idx - self.size.window)
        scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        return attend(torch.where(visible, scores, float("-inf")), v)

    def flex_mods(self, device, extra):
        window = self.size.window

        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & (kv_idx > q_idx - window)
        return None, mask_mod

    def sdpa_arguments(self, device, extra):
        positions = torch.arange(self.size.seq, device=device)
        q_idx, kv_idx = positions[:, None], positions[None, :]
        return {"attn_mask": ((kv_idx <= q_idx) & (kv_idx > q_idx - self.size.window))[None, None]}


class GqaCausal(VariantAttention):
    """LLaMA's grouped-query attention: kv heads repeated by ``repeat_kv`` (expand + reshape), causal mask."""

    def forward(self, q, k, v):
        B, H, N, D = q.shape
        k, v = repeat_kv(k, H), repeat_kv(v, H)
        return attend(causal_masked(q @ k.transpose(-2, -1) * D ** -0.5), v)

    def flex_mods(self, device, extra):
        return None, causal_mask_mod

    def sdpa_arguments(self, device, extra):
        return {"is_causal": True}


class AlibiCausalPrecomputed(VariantAttention):
    """ALiBi precomputed once into a [1, H, N, N] buffer, added to the scores; causal mask."""

    def __init__(self, size: Size):
        super().__init__(size)
        self.register_buffer("alibi", alibi_bias(alibi_slopes(size.heads), size.seq)[None])

    def forward(self, q, k, v):
        return attend(causal_masked(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5 + self.alibi), v)

    def flex_mods(self, device, extra):
        # FlexAttention states ALiBi from the slopes however the model computes it (no [H, N, N] read)
        return alibi_score_mod(alibi_slopes(self.size.heads, device).to(self.alibi.dtype)), causal_mask_mod

    def sdpa_arguments(self, device, extra):
        return {"attn_mask": self.alibi.masked_fill(~causal_keep(self.size.seq, device), float("-inf"))}


class AlibiFromSlopes(VariantAttention):
    """ALiBi computed in the forward from per-head slopes and ``arange`` positions; causal mask."""

    def __init__(self, size: Size):
        super().__init__(size)
        self.register_buffer("slopes", alibi_slopes(size.heads))

    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5 + alibi_bias(self.slopes, q.shape[-2])
        return attend(causal_masked(scores), v)

    def flex_mods(self, device, extra):
        return alibi_score_mod(self.slopes), causal_mask_mod

    def sdpa_arguments(self, device, extra):
        alibi = alibi_bias(self.slopes, self.size.seq)[None]
        return {"attn_mask": alibi.masked_fill(~causal_keep(self.size.seq, device), float("-inf"))}


class DenseBias(VariantAttention):
    """A learned dense [1, H, N, N] bias added to the scores (T5 / Swin's relative bias, fully materialized)."""

    def __init__(self, size: Size):
        super().__init__(size)
        self.bias = torch.nn.Parameter(torch.randn(1, size.heads, size.seq, size.seq))

    def forward(self, q, k, v):
        return attend(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5 + self.bias, v)

    def flex_mods(self, device, extra):
        bias = self.bias

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + bias[0, h, q_idx, kv_idx]
        return score_mod, None

    def sdpa_arguments(self, device, extra):
        return {"attn_mask": self.bias}


class PaddingCausal(VariantAttention):
    """Hugging Face's eager padding + causal mask, built in the graph from a [B, N] ``attention_mask`` input:
    ``_expand_mask``'s inverted mask and ``AttentionMaskConverter.to_4d``'s ``finfo.min`` causal mask."""

    def extra_inputs(self, device) -> tuple:
        lengths = [round(self.size.seq * PADDING_FRACTIONS[b % len(PADDING_FRACTIONS)]) for b in range(self.size.batch)]
        positions = torch.arange(self.size.seq, device=device)
        return ((positions[None, :] < torch.tensor(lengths, device=device)[:, None]).long(),)

    def forward(self, q, k, v, attention_mask):
        n = q.shape[-2]
        min_value = torch.finfo(q.dtype).min
        causal = torch.triu(torch.full((n, n), min_value, dtype=q.dtype, device=q.device), diagonal=1)
        padded = 1.0 - attention_mask[:, None, None, :].to(q.dtype)
        mask = causal[None, None].masked_fill(padded.bool(), min_value)
        scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        return attend(scores + mask, v)

    def flex_mods(self, device, extra):
        lengths = extra[0].sum(-1)

        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & (kv_idx < lengths[b])
        return None, mask_mod

    def sdpa_arguments(self, device, extra):  # Hugging Face's "sdpa" mask: bool [B, 1, N, N]
        return {"attn_mask": causal_keep(self.size.seq, device) & extra[0].bool()[:, None, None, :]}


class PaddingCausalMaskInput(PaddingCausal):
    """The same padding + causal mask, built outside and passed in as a [B, 1, N, N] ``finfo.min`` tensor: what each
    transformer block's graph receives when a graph break (FSDP2's per-block hooks, DDP's buckets) separates it from
    the mask's construction. Its values are unknown at compile time: fuse_attn classifies its tiles per call."""

    def extra_inputs(self, device) -> tuple:
        (attention_mask,) = super().extra_inputs(device)
        keep = causal_keep(self.size.seq, device) & attention_mask.bool()[:, None, None, :]
        return (torch.zeros(keep.shape, dtype=DTYPE, device=device).masked_fill(~keep, torch.finfo(DTYPE).min),)

    def forward(self, q, k, v, mask):
        return attend(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5 + mask, v)

    def flex_mods(self, device, extra):
        lengths = (extra[0][:, 0, -1] == 0).sum(-1)  # the last query row sees every unpadded key

        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & (kv_idx < lengths[b])
        return None, mask_mod

    def sdpa_arguments(self, device, extra):
        return {"attn_mask": extra[0] == 0}


class PackedDocuments(VariantAttention):
    """Packed documents as Hugging Face's mask functions build the mask (``masking_utils``: ``packed_sequence_overlay``
    and ``causal_mask_function`` over index grids): position ids restarting at 0 at each document and no attention
    mask, document ids their restarts' cumsum, gathered per (batch row, query) and per (batch row, key), with a causal
    comparison; the ``[B, 1, N, N]`` bool mask applied with ``finfo.min``. fuse_attn reads the ``[B, N]`` vectors
    only and classifies the tiles per call; Flex's block mask comes from the same document ids."""

    def extra_inputs(self, device) -> tuple:
        return (packed_position_ids(self.size.batch, self.size.seq, DOCUMENTS, device),)

    @staticmethod
    def documents(position_ids):
        return (position_ids == 0).cumsum(-1)

    def visible(self, position_ids):
        """[B, 1, N, N] bool, True where the key is in the query's document and not after it."""
        documents, n = self.documents(position_ids), position_ids.shape[-1]
        batch = torch.arange(position_ids.shape[0], device=position_ids.device)[:, None, None, None]
        q_idx = torch.arange(n, device=position_ids.device)[None, None, :, None]
        kv_idx = torch.arange(n, device=position_ids.device)[None, None, None, :]
        return (documents[batch, q_idx] == documents[batch, kv_idx]) & (kv_idx <= q_idx)

    def forward(self, q, k, v, position_ids):
        scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        return attend(scores.masked_fill(~self.visible(position_ids), torch.finfo(scores.dtype).min), v)

    def flex_mods(self, device, extra):
        documents = self.documents(extra[0])

        def mask_mod(b, h, q_idx, kv_idx):
            return (documents[b, q_idx] == documents[b, kv_idx]) & (kv_idx <= q_idx)
        return None, mask_mod

    def sdpa_arguments(self, device, extra):
        return {"attn_mask": self.visible(extra[0])}


class SinksWindow(VariantAttention):
    """gpt-oss's eager attention: a learned logit a head (the sink) joined to the scores as one more column, the row
    max subtracted, softmax, the column dropped; causal, within a sliding window on its local layers (``window``
    None: its full layers). FlexAttention states it with its lse: the output times ``sigmoid(lse - sink)``."""

    def __init__(self, size: Size, window: bool = True):
        super().__init__(size)
        self.window = size.window if window else None
        self.sinks = torch.nn.Parameter(torch.randn(size.heads))

    def visible(self, q_idx, kv_idx):
        causal = kv_idx <= q_idx
        return causal if self.window is None else causal & (kv_idx > q_idx - self.window)

    def forward(self, q, k, v):
        B, H, N, D = q.shape
        k, v = repeat_kv(k, H), repeat_kv(v, H)
        positions = torch.arange(N, device=q.device)
        scores = q @ k.transpose(-2, -1) * D ** -0.5
        scores = torch.where(self.visible(positions[:, None], positions[None, :]), scores, float("-inf"))
        joined = torch.cat([scores, self.sinks.reshape(1, -1, 1, 1).expand(B, -1, N, -1).to(scores.dtype)], dim=-1)
        joined = joined - joined.max(dim=-1, keepdim=True).values
        return torch.softmax(joined, dim=-1, dtype=joined.dtype)[..., :-1].to(v.dtype) @ v

    def flex_mods(self, device, extra):
        return None, lambda b, h, q_idx, kv_idx: self.visible(q_idx, kv_idx)

    def flex_epilogue(self, out, lse):
        share = torch.sigmoid(lse.unsqueeze(-1) - self.sinks.float().reshape(1, -1, 1, 1))
        return (out.float() * share).to(out.dtype)

    def sdpa_arguments(self, device, extra):
        return None  # SDPA's public call returns no lse (Hugging Face runs gpt-oss with eager attention)


class MultiHeadLatent(VariantAttention):
    """DeepSeek-V3's eager attention after its latent up-projections (multi-head latent attention, MLA): each head's
    query and key 192 wide, the model's join of a 128-wide part without rotary embedding and a 64-wide rotary part
    (the key's shared by the heads), the value 128 wide; scale 192 ** -0.5; causal, or (``causal`` False) every key
    seen, as an encoder's or a prefill over a cache would."""

    def __init__(self, size: Size, causal: bool = True):
        super().__init__(size)
        self.causal = causal

    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        return attend(causal_masked(scores) if self.causal else scores, v)

    def flex_mods(self, device, extra):
        return None, causal_mask_mod if self.causal else None

    def sdpa_arguments(self, device, extra):
        return {"is_causal": self.causal}


@dataclasses.dataclass(frozen=True)
class Variant:
    module: Callable[[Size], VariantAttention]
    default: Size


DEFAULT_SIZE = Size(batch=4, heads=16, kv_heads=16, seq=4096, head_dim=128)
# gpt-oss-20b's 64 query / 8 kv heads of 64 and its local layers' window of 128; B2 keeps B*H*D equal to the default's
GPT_OSS_SIZE = Size(batch=2, heads=64, kv_heads=8, seq=4096, head_dim=64, window=128)
VARIANTS = {
    "softcap_causal": Variant(SoftcapCausal, DEFAULT_SIZE),
    # Gemma-2 2B's 8 query heads of 256; B4 keeps B*H*D (q/k/v bytes, FLOPs) equal to the default's
    "softcap_causal_d256": Variant(SoftcapCausal, dataclasses.replace(DEFAULT_SIZE, heads=8, kv_heads=8, head_dim=256)),
    "window_causal": Variant(WindowCausal, DEFAULT_SIZE),
    # LLaMA-3 8B's 32 query / 8 kv heads; B2 keeps B*H (query rows, FLOPs) equal to the default's
    "gqa_causal": Variant(GqaCausal, dataclasses.replace(DEFAULT_SIZE, batch=2, heads=32, kv_heads=8)),
    "alibi_causal_precomputed": Variant(AlibiCausalPrecomputed, DEFAULT_SIZE),
    "alibi_from_slopes": Variant(AlibiFromSlopes, DEFAULT_SIZE),
    "dense_bias": Variant(DenseBias, DEFAULT_SIZE),
    "padding_causal": Variant(PaddingCausal, DEFAULT_SIZE),
    "padding_causal_mask_input": Variant(PaddingCausalMaskInput, DEFAULT_SIZE),
    "packed_documents_8k": Variant(PackedDocuments, dataclasses.replace(DEFAULT_SIZE, batch=1, seq=8192)),
    "packed_documents_32k": Variant(PackedDocuments, dataclasses.replace(DEFAULT_SIZE, batch=1, seq=32768)),
    "sinks_window": Variant(SinksWindow, GPT_OSS_SIZE),
    "sinks_causal": Variant(lambda size: SinksWindow(size, window=False), GPT_OSS_SIZE),
    # DeepSeek-V3's head dims (q / k 192 = 128 + 64 rotary, v 128); B * N and H as the default's
    "mla_causal_4k": Variant(MultiHeadLatent, dataclasses.replace(DEFAULT_SIZE, head_dim=192, value_head_dim=128)),
    "mla_causal_16k": Variant(MultiHeadLatent, dataclasses.replace(DEFAULT_SIZE, batch=1, seq=16384, head_dim=192,
                                                                   value_head_dim=128)),
    "mla_4k": Variant(lambda size: MultiHeadLatent(size, causal=False),
                      dataclasses.replace(DEFAULT_SIZE, head_dim=192, value_head_dim=128)),
    # Gemma-4's global layers: heads of 512, GQA 4; B2 H8 keeps B*H*D equal to the default's
    "gqa_causal_d512": Variant(GqaCausal, dataclasses.replace(DEFAULT_SIZE, batch=2, heads=8, kv_heads=2, head_dim=512)),
}


# ---- correctness --------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Check:
    fused: int  # attentions fuse_attn fused
    verdicts: list[str]  # each softmax's verdict: fused with its spec, or why not
    comparisons: list[str]  # "name err_ours/err_eager" against fp64, " FAIL" where the 2x rule breaks
    ok: bool


def check_variant(variant: Variant, size: Size, device) -> Check:
    """Compile the variant with fuse_attn in fp32; its output and the gradients of q, k, v and its parameters
    against the eager module's in fp32, each measured against an fp64 copy (the 2x rule, tools/bench_attention.py)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    with torch.device(device):
        module = variant.module(size)
        q, k, v, dout = (torch.randn(size.batch, heads, size.seq, dim) for heads, dim in
                         ((size.heads, size.head_dim), (size.kv_heads, size.head_dim), (size.kv_heads, size.v_dim),
                          (size.heads, size.v_dim)))
    extra = module.extra_inputs(device)

    def run(dtype, compile_model):
        model = copy.deepcopy(module).to(dtype)
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        out = compile_model(model)(*leaves, *extra)
        out.backward(dout.to(dtype))
        return [out] + [x.grad for x in leaves] + [p.grad for p in model.parameters()]

    reference = run(torch.float64, lambda model: model)
    eager = run(torch.float32, lambda model: model)
    # one config per kernel: the check is of numerics, and tuning every fp32 candidate of the backward at head dim
    # 128 compiles for minutes (over 5 on an H200's host)
    with mock.patch.dict(os.environ, {"FUSE_ATTN_AUTOTUNE": "0"}), collect_reports() as reports:
        ours = run(torch.float32, lambda model: torch.compile(model, backend="fuse_attn"))
    names = ["out", "dq", "dk", "dv"] + [f"d{name}" for name, _ in module.named_parameters()]
    comparisons, ok = [], True
    for name, a, e, r in zip(names, ours, eager, reference):
        err, err_eager = _err(a, r), _err(e, r)
        passed = err <= 2 * err_eager + FLOOR[torch.float32] * max(1.0, r.abs().max().item())
        ok &= passed
        comparisons.append(f"{name} {err:.2e}/{err_eager:.2e}{'' if passed else ' FAIL'}")
    verdicts = [verdict.line() for report in reports for verdict in report.verdicts]
    return Check(sum(len(report.fused) for report in reports), verdicts, comparisons, ok)


# ---- speed ---------------------------------------------------------------------------------------------------------
METHOD_NAMES = ("fuse_attn", "flex", "sdpa_mask", "cudnn", "torch_compile")
PEERS = METHOD_NAMES[1:]
CSV_COLUMNS = ["variant", "B", "H", "H_kv", "N", "D", "dtype", "mode", "method", "median_ms", "gpu_ms",
               "peak_bytes_above_inputs", "fused_attentions", "gpu", "torch", "triton", "date"]


def make_methods(module: VariantAttention, q, k, v, extra) -> dict[str, Callable]:
    """Each method that can state the module's attention, as a callable of (q, k, v)."""
    from torch.backends.cuda import SDPAParams, can_use_cudnn_attention
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    size, device = module.size, q.device
    gqa = size.group > 1
    fuse_attn, inductor = torch.compile(module, backend="fuse_attn"), torch.compile(module)
    methods = {"fuse_attn": lambda q, k, v: fuse_attn(q, k, v, *extra),
               "torch_compile": lambda q, k, v: inductor(q, k, v, *extra)}

    flex_compiled = torch.compile(flex_attention)
    score_mod, mask_mod = module.flex_mods(device, extra)
    block_mask = None
    if mask_mod is not None:  # built once, outside the timed calls
        block_mask = create_block_mask(mask_mod, size.batch, None, size.seq, size.seq, device=device)
    epilogue = getattr(module, "flex_epilogue", None)  # (attention sinks: the output corrected with the lse)
    if epilogue is None:
        methods["flex"] = lambda q, k, v: flex_compiled(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                                        enable_gqa=gqa)
    else:
        methods["flex"] = lambda q, k, v: epilogue(*flex_compiled(q, k, v, score_mod=score_mod,
                                                                  block_mask=block_mask, enable_gqa=gqa,
                                                                  return_lse=True))

    sdpa = module.sdpa_arguments(device, extra)
    if sdpa is not None:
        methods["sdpa_mask"] = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa, **sdpa)
    if sdpa is not None and "attn_mask" not in sdpa:  # cuDNN only where the SDPA call takes no mask tensor
        # enable_gqa where this torch's cuDNN path takes it, else kv heads expanded first (Hugging Face's repeat_kv)
        takes_gqa = can_use_cudnn_attention(SDPAParams(q, k, v, None, 0.0, sdpa["is_causal"], gqa))

        def cudnn(q, k, v):
            if gqa and not takes_gqa:
                k, v = k.repeat_interleave(size.group, 1), v.repeat_interleave(size.group, 1)
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa and takes_gqa, **sdpa)
        methods["cudnn"] = cudnn
    return methods


def without_grad(fn):
    def call(q, k, v):
        with torch.no_grad():
            return fn(q, k, v)
    return call


def kernels_ms(fn, q, k, v, dout, backward, learned=()) -> float | None:
    """GPU ms of one call's kernels alone (a CUDA graph of it replayed), or None where the call cannot be captured.
    The call takes fresh leaves (views of q, k and v): a leaf's AccumulateGrad node made on the default stream by an
    earlier call and kept alive by that call's autograd graph would make the captured backward wait on the default
    stream, which breaks the capture ("operation would make the legacy stream depend on a capturing blocking
    stream") and every CUDA call of the process after it."""
    leaves = [t.detach().requires_grad_(t.requires_grad) for t in (q, k, v)]

    def step():
        out = fn(*leaves)
        if backward:
            out.backward(dout)

    try:
        return graph_time_ms(step)
    except Exception as e:  # (a method that syncs or allocates outside the graph's pool)
        print(f"  no CUDA graph of the call: {first_line(e)}", flush=True)
        return None
    finally:
        for t in (q, k, v, *learned):
            t.grad = None


def first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def bench_variant(name: str, size: Size, mode: str, methods_filter, record) -> list:
    """Time every method on one variant and mode; ``record`` gets each measured cell's CSV values. Returns the row."""
    backward = mode == "fwd+bwd"
    torch._dynamo.reset()  # each variant and mode compiles its own graphs, and fuse_attn's report is collected anew
    torch.manual_seed(0)
    with torch.device("cuda"):
        module = VARIANTS[name].module(size).to(DTYPE)
    q, k, v, dout = random_inputs(size.batch, size.heads, size.seq, size.head_dim, DTYPE, backward)
    if size.v_dim != size.head_dim:  # v and the output's gradient at v's head dim
        v, dout = (x[..., :size.v_dim].detach().clone().normal_() for x in (v, dout))
        v.requires_grad_(backward)
    if size.group > 1:  # k and v of the kv heads only
        k, v = (x[:, :size.kv_heads].detach().clone().requires_grad_(backward) for x in (k, v))
    extra = module.extra_inputs(q.device)
    learned = list(module.parameters())  # the dense bias: its gradient is part of fwd+bwd
    methods = make_methods(module, q, k, v, extra)
    prefix = [name, size.batch, size.heads, size.kv_heads, size.seq, size.dims, NAMES[DTYPE], mode]
    times, cells, fused, implementations = {}, [], "-", set()
    for method in METHOD_NAMES:
        fn = methods.get(method)
        if fn is None or methods_filter and method not in methods_filter:
            cells.append("-")
            continue
        try:
            call = fn if backward else without_grad(fn)
            with collect_reports() as reports:
                ms, peak = measure(call, q, k, v, dout, backward, learned)
            gpu_ms = kernels_ms(call, q, k, v, dout, backward, learned)
            if method == "fuse_attn":
                fused = sum(len(report.fused) for report in reports)
                implementations = {v.implementation for report in reports for v in report.fused if v.implementation}
                for report in reports:  # what the kernel computes (and loads), or why a softmax was left alone
                    for verdict in report.verdicts:
                        print(f"  {name} {mode}: {verdict.line()}", flush=True)
            times[method] = ms
            gpu_cell = "-" if gpu_ms is None else f"{gpu_ms:.3f}"
            cells.append(f"{ms:.3f} ms (GPU {gpu_cell}), {peak / 2**20:.0f} MiB")
            record(prefix + [method, f"{ms:.4f}", "" if gpu_ms is None else f"{gpu_ms:.4f}", peak,
                             fused if method == "fuse_attn" else ""])
        except torch.cuda.OutOfMemoryError:
            cells.append("OOM")
            record(prefix + [method, "OOM", "", "", ""])
        except Exception as e:  # one method's failure must not hide the others' numbers
            print(f"  {name} {mode} {method} failed: {first_line(e)}", flush=True)
            cells.append("err")
            record(prefix + [method, "error", "", "", ""])
        for t in (q, k, v, *learned):
            t.grad = None
        torch.cuda.empty_cache()
    peers = {method: ms for method, ms in times.items() if method in PEERS}
    fastest = min(peers, key=peers.get) if peers else None
    fastest_cell = f"{fastest} {peers[fastest]:.3f} ms" if fastest else "-"
    speedup = f"{peers[fastest] / times['fuse_attn']:.2f}x" if fastest and "fuse_attn" in times else "-"
    # (which of our implementations the fused attentions run: the generated kernels, Gluon's, ...)
    fused_cell = f"{fused} NOT FUSED" if fused == 0 else f"{fused} ({', '.join(sorted(implementations))})"
    row = [name, str(size), mode, fused_cell, *cells, fastest_cell, speedup]
    print(row, flush=True)
    if fused == 0:
        print(f"  WARNING: {name} {mode}: fuse_attn fused no attention; its time is Inductor's on the unfused graph",
              flush=True)
    return row


def plot(csv_path: str, png_path: str) -> None:
    """Bars of ``fastest peer ms / fuse_attn ms`` per variant, forward and forward+backward, from every row of the
    CSV (for a repeated cell the last row wins); a line at 1.0, where fuse_attn ties the fastest peer."""
    import csv

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path, newline="") as f:
        cells = {(r["variant"], r["mode"], r["method"]): float(r["median_ms"]) for r in csv.DictReader(f)
                 if r["median_ms"] not in ("OOM", "error")}
    variants = list(dict.fromkeys(v for v, _, _ in cells))
    modes = ["fwd", "fwd+bwd"]
    fig, ax = plt.subplots(figsize=(1.2 * len(variants) + 2, 4))
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        speedups = []
        for v in variants:
            peers = [cells[(v, mode, m)] for m in PEERS if (v, mode, m) in cells]
            ours = cells.get((v, mode, "fuse_attn"))
            speedups.append(min(peers) / ours if peers and ours else 0.0)
        bars = ax.bar([x + (i - (len(modes) - 1) / 2) * width for x in range(len(variants))], speedups, width, label=mode)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(variants)), variants, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("fastest peer time / fuse_attn time")
    # two lines: one is wider than the figure of a few variants
    ax.set_title("fuse_attn against the fastest of\nFlexAttention, SDPA (HF mask), cuDNN, torch.compile", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--modes", nargs="*", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    ap.add_argument("--methods", nargs="*", default=None, choices=METHOD_NAMES, help="subset of the methods timed")
    ap.add_argument("--batch", type=int, help="B of every variant (default: each variant's)")
    ap.add_argument("--heads", type=int, help="query heads of every variant (gqa_causal keeps 4 per kv head)")
    ap.add_argument("--seq", type=int, help=f"N of every variant (the window stays {WINDOW} keys)")
    ap.add_argument("--head-dim", type=int, help="D of every variant")
    ap.add_argument("--check", action="store_true",
                    help=f"first compare fuse_attn with eager in fp32 at N={CHECK_SEQ} (2x rule against fp64)")
    ap.add_argument("--plot-only", action="store_true",
                    help="draw OUTDIR/bench_variants.csv into OUTDIR/bench_variants.png (needs matplotlib), time nothing")
    args = ap.parse_args(argv)
    if args.plot_only:
        plot(os.path.join(args.out, "bench_variants.csv"), os.path.join(args.out, "bench_variants.png"))
        return 0
    gpu = torch.cuda.get_device_name()
    print(f"device: {gpu}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    ok = True
    if args.check:
        for name in args.variants:
            default = VARIANTS[name].default
            result = check_variant(VARIANTS[name], small_size(default, CHECK_SEQ, default.head_dim), "cuda")
            passed = result.ok and result.fused > 0
            ok &= passed
            print(f"check {name}: {'PASS' if passed else 'FAIL'}, {result.fused} fused; "
                  + "; ".join(result.comparisons), flush=True)
            for verdict in result.verdicts:
                print(f"  {verdict}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    run_info = [gpu, torch.__version__, triton.__version__, datetime.date.today().isoformat()]
    rows = []
    path = os.path.join(args.out, "bench_variants.csv")
    if columns_clash(path, CSV_COLUMNS):
        return 2
    with appending(path, CSV_COLUMNS, run_info) as record:
        for name in args.variants:
            size = resized(VARIANTS[name].default, args.batch, args.heads, args.seq, args.head_dim)
            for mode in args.modes:
                rows.append(bench_variant(name, size, mode, args.methods, record))
    print(f"\n{gpu}, torch {torch.__version__}, triton {triton.__version__}, {NAMES[DTYPE]}; per call: median ms of "
          "back-to-back calls (the kernels' own GPU ms), peak MiB beyond the inputs; speed-up = fastest peer ms / "
          "fuse_attn ms")
    print(tabulate(rows, headers=["variant", "B,H,N,D", "mode", "fused", *METHOD_NAMES, "fastest peer", "speed-up"],
                   tablefmt="github"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
