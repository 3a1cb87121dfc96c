"""Small models that spell attention the ways real code does; each builder returns ``(model, args)``.

Used by ``python -m tools.dump_graph examples.attention_forms:<builder>`` and by the demo.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class NanoGPTAttention(torch.nn.Module):
    """nanoGPT's CausalSelfAttention (slow path): a registered tril buffer, masked_fill(== 0, -inf)."""

    def __init__(self, width: int = 64, heads: int = 4, block_size: int = 128):
        super().__init__()
        self.heads = heads
        self.c_attn = torch.nn.Linear(width, 3 * width)
        self.c_proj = torch.nn.Linear(width, width)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int, block_size: int):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(width)
        self.attn = NanoGPTAttention(width, heads, block_size)
        self.ln_2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(torch.nn.Module):
    """A GPT-2-shaped decoder built from nanoGPT blocks."""

    def __init__(self, vocab: int = 512, width: int = 64, heads: int = 4, layers: int = 2, block_size: int = 128):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Embedding(block_size, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads, block_size) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class PaddedEncoderAttention(torch.nn.Module):
    """BERT-style: an additive mask from a padding mask, scale by division, the weights returned when asked."""

    def __init__(self, width: int = 64, heads: int = 4, return_weights: bool = False):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.return_weights = return_weights

    def forward(self, x, padding_mask):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        extended = (1.0 - padding_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(C // self.heads) + extended
        weights = scores.softmax(dim=-1)
        out = torch.matmul(weights, v).transpose(1, 2).reshape(B, T, C)
        return (out, weights) if self.return_weights else out


def nanogpt_block():
    return NanoGPTAttention(), (torch.randn(2, 16, 64),)


def tiny_gpt():
    return TinyGPT(), (torch.randint(0, 512, (2, 32)),)


def padded_encoder():
    padding = torch.ones(2, 12)
    padding[1, 9:] = 0
    return PaddedEncoderAttention(), (torch.randn(2, 12, 64), padding)


def padded_encoder_returning_weights():
    model, args = padded_encoder()
    model.return_weights = True
    return model, args
