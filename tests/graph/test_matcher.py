"""Golden graphs of each supported form after the rewrite, and what must not be rewritten (with its reason)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from expecttest import TestCase

from examples.attention_forms import NanoGPTAttention
from tests.support.graph_capture import (fused_graph, fused_specs, graph_text, rewrite_reports, unfused_verdicts,
                                         verdict_lines)


def qkv(batch=2, heads=3, length=5, dim=8, dtype=torch.float32, k_length=None):
    k_length = k_length or length
    return (
        torch.randn(batch, heads, length, dim, dtype=dtype),
        torch.randn(batch, heads, k_length, dim, dtype=dtype),
        torch.randn(batch, heads, k_length, dim, dtype=dtype),
    )


def plain_attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


class TestGoldenGraphs(TestCase):
    def check(self, fn, *args):
        return fused_graph(fn, *args)

    def test_nanogpt_sliced_buffer_is_causal(self):
        text = self.check(NanoGPTAttention(width=16, heads=2, block_size=8), torch.randn(2, 6, 16))
        self.assertExpectedInline(text, """\
    def forward(self, arg0_1: "f32[2, 6, 16]", arg1_1: "f32[48, 16]", arg2_1: "f32[48]", arg3_1: "f32[1, 1, 8, 8]", arg4_1: "f32[16, 16]", arg5_1: "f32[16]"):
        linear: "f32[2, 6, 48]" = torch.ops.aten.linear.default(arg0_1, arg1_1, arg2_1)
        split = torch.ops.aten.split.Tensor(linear, 16, 2)
        getitem: "f32[2, 6, 16]" = split[0]
        getitem_1: "f32[2, 6, 16]" = split[1]
        getitem_2: "f32[2, 6, 16]" = split[2]
        view: "f32[2, 6, 2, 8]" = torch.ops.aten.view.default(getitem, [2, 6, 2, 8])
        transpose: "f32[2, 2, 6, 8]" = torch.ops.aten.transpose.int(view, 1, 2)
        view_1: "f32[2, 6, 2, 8]" = torch.ops.aten.view.default(getitem_1, [2, 6, 2, 8])
        transpose_1: "f32[2, 2, 6, 8]" = torch.ops.aten.transpose.int(view_1, 1, 2)
        view_2: "f32[2, 6, 2, 8]" = torch.ops.aten.view.default(getitem_2, [2, 6, 2, 8])
        transpose_2: "f32[2, 2, 6, 8]" = torch.ops.aten.transpose.int(view_2, 1, 2)
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(transpose, transpose_1, transpose_2, [], None, '{"causal": {"alignment": "top_left", "diagonal": 0, "window": null}, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 6, "num_heads": 2, "q_len": 6, "scale": 0.35355339059327373, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem_3: "f32[2, 2, 6, 8]" = flash_attention_default[0]
        transpose_4: "f32[2, 6, 2, 8]" = torch.ops.aten.transpose.int(getitem_3, 1, 2)
        contiguous: "f32[2, 6, 2, 8]" = torch.ops.aten.contiguous.default(transpose_4)
        view_3: "f32[2, 6, 16]" = torch.ops.aten.view.default(contiguous, [2, 6, 16])
        linear_1: "f32[2, 6, 16]" = torch.ops.aten.linear.default(view_3, arg4_1, arg5_1)
        return (linear_1,)""")

    def test_tril_masked_fill_and_division(self):
        def fn(q, k, v):
            T = q.shape[-2]
            w = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            w = w.masked_fill(torch.tril(torch.ones(T, T)) == 0, float("-inf"))
            return torch.softmax(w, -1) @ v

        self.assertExpectedInline(self.check(fn, *qkv()), """\
    def forward(self, arg0_1: "f32[2, 3, 5, 8]", arg1_1: "f32[2, 3, 5, 8]", arg2_1: "f32[2, 3, 5, 8]"):
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg0_1, arg1_1, arg2_1, [], None, '{"causal": {"alignment": "top_left", "diagonal": 0, "window": null}, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 3, "q_len": 5, "scale": 0.35355339059327373, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "f32[2, 3, 5, 8]" = flash_attention_default[0]
        return (getitem,)""")

    def test_arange_comparison_where_finfo_min(self):
        def fn(q, k, v):
            T = q.shape[-2]
            keep = torch.arange(T)[:, None] >= torch.arange(T)[None, :]
            w = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
            w = torch.where(keep, w, torch.finfo(w.dtype).min)
            return torch.matmul(torch.softmax(w, dim=-1), v)

        self.assertExpectedInline(self.check(fn, *qkv()), """\
    def forward(self, arg0_1: "f32[2, 3, 5, 8]", arg1_1: "f32[2, 3, 5, 8]", arg2_1: "f32[2, 3, 5, 8]"):
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg0_1, arg1_1, arg2_1, [], None, '{"causal": {"alignment": "top_left", "diagonal": 0, "window": null}, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 3, "q_len": 5, "scale": 0.3535533905932738, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "f32[2, 3, 5, 8]" = flash_attention_default[0]
        return (getitem,)""")

    def test_additive_padding_mask_input(self):
        def fn(q, k, v, mask):
            w = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + mask
            return torch.softmax(w, -1) @ v

        mask = torch.zeros(2, 1, 1, 5).masked_fill(torch.rand(2, 1, 1, 5) > 0.7, float("-inf"))
        self.assertExpectedInline(self.check(fn, *qkv(), mask), """\
    def forward(self, arg0_1: "f32[2, 3, 5, 8]", arg1_1: "f32[2, 3, 5, 8]", arg2_1: "f32[2, 1, 1, 5]", arg3_1: "f32[2, 3, 5, 8]"):
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg1_1, arg0_1, arg3_1, [arg2_1], None, '{"causal": null, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 3, "q_len": 5, "scale": 0.3535533905932738, "scale_head_dim_power": 0.0, "score_program": [{"args": [], "op": "score", "value": null}, {"args": [], "op": "load", "value": 0}, {"args": [0, 1], "op": "add", "value": null}], "score_tensors": [{"broadcast": [false, true, true, false], "dtype": "float32", "role": "bias"}]}')
        getitem: "f32[2, 3, 5, 8]" = flash_attention_default[0]
        return (getitem,)""")

    def test_scale_on_q_and_k(self):
        def fn(q, k, v):
            scale = q.shape[-1] ** -0.25
            return torch.softmax((q * scale) @ (k * scale).transpose(-1, -2), -1) @ v

        self.assertExpectedInline(self.check(fn, *qkv()), """\
    def forward(self, arg0_1: "f32[2, 3, 5, 8]", arg1_1: "f32[2, 3, 5, 8]", arg2_1: "f32[2, 3, 5, 8]"):
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg0_1, arg1_1, arg2_1, [], None, '{"causal": null, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 3, "q_len": 5, "scale": 0.35355339059327373, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "f32[2, 3, 5, 8]" = flash_attention_default[0]
        return (getitem,)""")

    def test_softmax_in_fp32_with_casts(self):
        def fn(q, k, v):
            w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.shape[-1])
            w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
            return torch.matmul(w, v)

        self.assertExpectedInline(self.check(fn, *qkv(dtype=torch.float16)), """\
    def forward(self, arg0_1: "f16[2, 3, 5, 8]", arg1_1: "f16[2, 3, 5, 8]", arg2_1: "f16[2, 3, 5, 8]"):
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg1_1, arg0_1, arg2_1, [], None, '{"causal": null, "dropout_p": 0.0, "dtype": "float16", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 3, "q_len": 5, "scale": 0.35355339059327373, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "f16[2, 3, 5, 8]" = flash_attention_default[0]
        return (getitem,)""")

    def test_bmm_with_reshapes_and_hf_additive_causal_mask(self):
        def fn(q, k, v):
            B, H, T, D = q.shape
            mask = torch.full((T, T), torch.finfo(q.dtype).min).triu(1)
            w = torch.bmm(q.reshape(B * H, T, D), k.reshape(B * H, T, D).transpose(1, 2)).view(B, H, T, T)
            w = (w + mask[None, None]) * D**-0.5
            p = torch.softmax(w, -1).view(B * H, T, T)
            return torch.bmm(p, v.reshape(B * H, T, D)).view(B, H, T, D)

        self.assertExpectedInline(self.check(fn, *qkv()), """\
    def forward(self, arg0_1: "f32[2, 3, 5, 8]", arg1_1: "f32[2, 3, 5, 8]", arg2_1: "f32[2, 3, 5, 8]"):
        reshape: "f32[6, 5, 8]" = torch.ops.aten.reshape.default(arg0_1, [6, 5, 8])
        reshape_1: "f32[6, 5, 8]" = torch.ops.aten.reshape.default(arg1_1, [6, 5, 8])
        reshape_2: "f32[6, 5, 8]" = torch.ops.aten.reshape.default(arg2_1, [6, 5, 8])
        unsqueeze_default: "f32[1, 6, 5, 8]" = torch.ops.aten.unsqueeze.default(reshape, 0)
        unsqueeze_default_1: "f32[1, 6, 5, 8]" = torch.ops.aten.unsqueeze.default(reshape_1, 0)
        unsqueeze_default_2: "f32[1, 6, 5, 8]" = torch.ops.aten.unsqueeze.default(reshape_2, 0)
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(unsqueeze_default, unsqueeze_default_1, unsqueeze_default_2, [], None, '{"causal": {"alignment": "top_left", "diagonal": 0, "window": null}, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 6, "q_len": 5, "scale": 0.3535533905932738, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "f32[1, 6, 5, 8]" = flash_attention_default[0]
        squeeze_dim: "f32[6, 5, 8]" = torch.ops.aten.squeeze.dim(getitem, 0)
        view_2: "f32[2, 3, 5, 8]" = torch.ops.aten.view.default(squeeze_dim, [2, 3, 5, 8])
        return (view_2,)""")

    def test_bottom_right_causal_with_shorter_queries(self):
        def fn(q, k, v):
            T, S = q.shape[-2], k.shape[-2]
            causal = torch.ones(S, S, dtype=torch.bool).tril()[S - T :, :]
            w = (q @ k.transpose(-1, -2)).masked_fill(~causal, float("-inf"))
            return torch.softmax(w, -1) @ v

        self.assertExpectedInline(self.check(fn, *qkv(length=3, k_length=7)), """\
    def forward(self, arg0_1: "f32[2, 3, 3, 8]", arg1_1: "f32[2, 3, 7, 8]", arg2_1: "f32[2, 3, 7, 8]"):
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg0_1, arg1_1, arg2_1, [], None, '{"causal": {"alignment": "top_left", "diagonal": 4, "window": null}, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 7, "num_heads": 3, "q_len": 3, "scale": 1.0, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "f32[2, 3, 3, 8]" = flash_attention_default[0]
        return (getitem,)""")

    def test_gqa_repeat_kv_is_folded_into_the_kernel(self):
        def repeat_kv(x, n_rep):
            b, h, n, d = x.shape
            return x[:, :, None, :, :].expand(b, h, n_rep, n, d).reshape(b, h * n_rep, n, d)

        def fn(q, k, v):
            k, v = repeat_kv(k, 2), repeat_kv(v, 2)
            w = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
            w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
            return torch.matmul(w, v)

        q = torch.randn(2, 4, 5, 8)
        k, v = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
        self.assertExpectedInline(self.check(fn, q, k, v), """\
    def forward(self, arg0_1: "f32[2, 2, 5, 8]", arg1_1: "f32[2, 2, 5, 8]", arg2_1: "f32[2, 4, 5, 8]"):
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg2_1, arg0_1, arg1_1, [], None, '{"causal": null, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 2, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 4, "q_len": 5, "scale": 0.3535533905932738, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "f32[2, 4, 5, 8]" = flash_attention_default[0]
        return (getitem,)""")

    def test_mqa_by_broadcasting_one_kv_head(self):
        def fn(q, k, v):
            return torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v

        q = torch.randn(2, 4, 5, 8)
        k, v = torch.randn(2, 1, 5, 8), torch.randn(2, 1, 5, 8)
        self.assertExpectedInline(self.check(fn, q, k, v), """\
    def forward(self, arg0_1: "f32[2, 1, 5, 8]", arg1_1: "f32[2, 4, 5, 8]", arg2_1: "f32[2, 1, 5, 8]"):
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg1_1, arg0_1, arg2_1, [], None, '{"causal": null, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 4, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 4, "q_len": 5, "scale": 0.25, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "f32[2, 4, 5, 8]" = flash_attention_default[0]
        return (getitem,)""")

    def test_baddbmm_alibi_and_in_place_scale(self):
        def fn(q, k, v, alibi):
            B, H, T, D = q.shape
            w = alibi.baddbmm(batch1=q.reshape(B * H, T, D), batch2=k.reshape(B * H, T, D).transpose(1, 2), beta=1.0, alpha=D**-0.5)
            w = w.view(B, H, T, T)
            w.div_(2.0)
            p = torch.softmax(w, -1).view(B * H, T, T)
            return torch.bmm(p, v.reshape(B * H, T, D)).view(B, H, T, D)

        alibi = torch.randn(2 * 3, 1, 5)
        self.assertExpectedInline(self.check(fn, *qkv(), alibi), """\
    def forward(self, arg0_1: "f32[2, 3, 5, 8]", arg1_1: "f32[6, 1, 5]", arg2_1: "f32[2, 3, 5, 8]", arg3_1: "f32[2, 3, 5, 8]"):
        reshape: "f32[6, 5, 8]" = torch.ops.aten.reshape.default(arg0_1, [6, 5, 8])
        reshape_1: "f32[6, 5, 8]" = torch.ops.aten.reshape.default(arg2_1, [6, 5, 8])
        reshape_2: "f32[6, 5, 8]" = torch.ops.aten.reshape.default(arg3_1, [6, 5, 8])
        unsqueeze_default: "f32[1, 6, 5, 8]" = torch.ops.aten.unsqueeze.default(reshape, 0)
        unsqueeze_default_1: "f32[1, 6, 5, 8]" = torch.ops.aten.unsqueeze.default(reshape_1, 0)
        unsqueeze_default_2: "f32[1, 6, 5, 8]" = torch.ops.aten.unsqueeze.default(reshape_2, 0)
        unsqueeze_default_3: "f32[1, 6, 1, 5]" = torch.ops.aten.unsqueeze.default(arg1_1, 0)
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(unsqueeze_default, unsqueeze_default_1, unsqueeze_default_2, [unsqueeze_default_3], None, '{"causal": null, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 6, "q_len": 5, "scale": 0.3535533905932738, "scale_head_dim_power": 0.0, "score_program": [{"args": [], "op": "score", "value": null}, {"args": [], "op": "load", "value": 0}, {"args": [0, 1], "op": "add", "value": null}, {"args": [], "op": "const", "value": 2.0}, {"args": [2, 3], "op": "div", "value": null}], "score_tensors": [{"broadcast": [true, false, true, false], "dtype": "float32", "role": "bias"}]}')
        getitem: "f32[1, 6, 5, 8]" = flash_attention_default[0]
        squeeze_dim: "f32[6, 5, 8]" = torch.ops.aten.squeeze.dim(getitem, 0)
        view_2: "f32[2, 3, 5, 8]" = torch.ops.aten.view.default(squeeze_dim, [2, 3, 5, 8])
        return (view_2,)""")

    def test_a_bias_with_strided_keys_is_copied_once_for_its_attentions(self):
        # T5's position bias: an embedding's [N, N, H] output permuted to [1, H, N, N] (keys H apart in memory), added
        # in every layer; one contiguous copy serves both attentions
        def fn(q, k, v, table, buckets):
            bias = F.embedding(buckets, table).permute(2, 0, 1).unsqueeze(0)
            h = torch.softmax(q @ k.transpose(-1, -2) + bias, -1) @ v
            return torch.softmax(h @ k.transpose(-1, -2) + bias, -1) @ v

        buckets = torch.randint(0, 4, (5, 5))
        self.assertExpectedInline(self.check(fn, *qkv(), torch.randn(4, 3), buckets), """\
    def forward(self, arg0_1: "i64[5, 5]", arg1_1: "f32[4, 3]", arg2_1: "f32[2, 3, 5, 8]", arg3_1: "f32[2, 3, 5, 8]", arg4_1: "f32[2, 3, 5, 8]"):
        embedding: "f32[5, 5, 3]" = torch.ops.aten.embedding.default(arg1_1, arg0_1)
        permute: "f32[3, 5, 5]" = torch.ops.aten.permute.default(embedding, [2, 0, 1])
        clone_default: "f32[3, 5, 5]" = torch.ops.aten.clone.default(permute, memory_format = torch.contiguous_format)
        unsqueeze_default: "f32[1, 3, 5, 5]" = torch.ops.aten.unsqueeze.default(clone_default, 0)
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg3_1, arg2_1, arg4_1, [unsqueeze_default], None, '{"causal": null, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 3, "q_len": 5, "scale": 1.0, "scale_head_dim_power": 0.0, "score_program": [{"args": [], "op": "score", "value": null}, {"args": [], "op": "load", "value": 0}, {"args": [0, 1], "op": "add", "value": null}], "score_tensors": [{"broadcast": [true, false, false, false], "dtype": "float32", "role": "bias"}]}')
        getitem: "f32[2, 3, 5, 8]" = flash_attention_default[0]
        unsqueeze_default_1: "f32[1, 3, 5, 5]" = torch.ops.aten.unsqueeze.default(clone_default, 0)
        flash_attention_default_1 = torch.ops.fuse_attn.flash_attention.default(getitem, arg2_1, arg4_1, [unsqueeze_default_1], None, '{"causal": null, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 3, "q_len": 5, "scale": 1.0, "scale_head_dim_power": 0.0, "score_program": [{"args": [], "op": "score", "value": null}, {"args": [], "op": "load", "value": 0}, {"args": [0, 1], "op": "add", "value": null}], "score_tensors": [{"broadcast": [true, false, false, false], "dtype": "float32", "role": "bias"}]}')
        getitem_1: "f32[2, 3, 5, 8]" = flash_attention_default_1[0]
        return (getitem_1,)""")

    def test_softcap_then_causal_mask(self):
        def fn(q, k, v):
            T = q.shape[-2]
            w = q @ k.transpose(-1, -2) * 0.125
            w = torch.tanh(w / 50.0) * 50.0
            w = w + torch.full((T, T), float("-inf")).triu(1)
            return torch.softmax(w, -1) @ v

        self.assertExpectedInline(self.check(fn, *qkv()), """\
    def forward(self, arg0_1: "f32[2, 3, 5, 8]", arg1_1: "f32[2, 3, 5, 8]", arg2_1: "f32[2, 3, 5, 8]"):
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg0_1, arg1_1, arg2_1, [], None, '{"causal": {"alignment": "top_left", "diagonal": 0, "window": null}, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 3, "q_len": 5, "scale": 0.0025, "scale_head_dim_power": 0.0, "score_program": [{"args": [], "op": "score", "value": null}, {"args": [0], "op": "tanh", "value": null}, {"args": [], "op": "const", "value": 50.0}, {"args": [1, 2], "op": "mul", "value": null}], "score_tensors": []}')
        getitem: "f32[2, 3, 5, 8]" = flash_attention_default[0]
        return (getitem,)""")

    def test_a_lifted_scale_and_softcap_are_read_at_run_time(self):
        """A scale and a softcap whose values changed since the first compile are graph inputs (0-d tensors read with
        ``.item()``): the kernels read each as a one-element fp32 tensor, made once (``ones * value``)."""

        def fn(q, k, v, scale, cap):
            w = torch.tanh(q @ k.transpose(-1, -2) * scale / cap) * cap
            return torch.softmax(w, -1) @ v

        reports = rewrite_reports(fn, *qkv(), 0.2, 30.0, earlier=[(*qkv(), 0.3, 50.0)])
        self.assertExpectedInline(verdict_lines(reports), """fused softmax: float32 D=8 M=5 N=5 scale=1 s -> tanh((s * bias0[1,1,1,1]) / bias1[1,1,1,1]) * bias1[1,1,1,1]""")
        self.assertExpectedInline(graph_text(reports[0]), """\
    def forward(self, arg0_1: "f32[2, 3, 5, 8]", arg1_1: "f32[2, 3, 5, 8]", arg2_1: "f64[]", arg3_1: "f64[]", arg4_1: "f32[2, 3, 5, 8]"):
        item: "Sym(zf)" = torch.ops.aten.item.default(arg2_1)
        full_default: "f32[1, 1, 1, 1]" = torch.ops.aten.full.default([1, 1, 1, 1], 1.0, dtype = torch.float32, device = device(type='cpu'))
        mul_tensor: "f32[1, 1, 1, 1]" = torch.ops.aten.mul.Tensor(full_default, item)
        item_1: "Sym(zf)" = torch.ops.aten.item.default(arg3_1)
        full_default_1: "f32[1, 1, 1, 1]" = torch.ops.aten.full.default([1, 1, 1, 1], 1.0, dtype = torch.float32, device = device(type='cpu'))
        mul_tensor_1: "f32[1, 1, 1, 1]" = torch.ops.aten.mul.Tensor(full_default_1, item_1)
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg1_1, arg0_1, arg4_1, [mul_tensor, mul_tensor_1], None, '{"causal": null, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 3, "q_len": 5, "scale": 1.0, "scale_head_dim_power": 0.0, "score_program": [{"args": [], "op": "score", "value": null}, {"args": [], "op": "load", "value": 0}, {"args": [0, 1], "op": "mul", "value": null}, {"args": [], "op": "load", "value": 1}, {"args": [2, 3], "op": "div", "value": null}, {"args": [4], "op": "tanh", "value": null}, {"args": [5, 3], "op": "mul", "value": null}], "score_tensors": [{"broadcast": [true, true, true, true], "dtype": "float32", "role": "bias"}, {"broadcast": [true, true, true, true], "dtype": "float32", "role": "bias"}]}')
        getitem: "f32[2, 3, 5, 8]" = flash_attention_default[0]
        return (getitem,)""")

    def test_einsum_on_heads_last_layout(self):
        def fn(q, k, v):
            w = torch.einsum("bqhd,bkhd->bhqk", q, k) / 4.0
            return torch.einsum("bhqk,bkhd->bhqd", torch.softmax(w, dim=-1), v)

        self.assertExpectedInline(self.check(fn, *(torch.randn(2, 5, 3, 8) for _ in range(3))), """\
    def forward(self, arg0_1: "f32[2, 5, 3, 8]", arg1_1: "f32[2, 5, 3, 8]", arg2_1: "f32[2, 5, 3, 8]"):
        permute_default: "f32[2, 3, 5, 8]" = torch.ops.aten.permute.default(arg0_1, [0, 2, 1, 3])
        permute_default_1: "f32[2, 3, 5, 8]" = torch.ops.aten.permute.default(arg1_1, [0, 2, 1, 3])
        permute_default_2: "f32[2, 3, 5, 8]" = torch.ops.aten.permute.default(arg2_1, [0, 2, 1, 3])
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(permute_default, permute_default_1, permute_default_2, [], None, '{"causal": null, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 3, "q_len": 5, "scale": 0.25, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "f32[2, 3, 5, 8]" = flash_attention_default[0]
        return (getitem,)""")

    def test_einsum_with_an_ellipsis_and_a_permuted_output(self):
        """LongT5's blocked local attention: each block of queries against its three blocks of keys, the batch dims an
        ellipsis, the heads between the rows and the head dim; the einsums read as permuted products."""

        def fn(q, k, v):  # q [B, blocks, 4, H, D], k / v [B, blocks, 12, H, D]
            w = torch.einsum("...qhd,...khd->...hqk", q, k)
            return torch.einsum("...hqk,...khd->...qhd", torch.softmax(w, dim=-1), v)

        q = torch.randn(2, 3, 4, 2, 8, dtype=torch.float64)
        k, v = (torch.randn(2, 3, 12, 2, 8, dtype=torch.float64) for _ in range(2))
        self.assertExpectedInline(self.check(fn, *(x.float() for x in (q, k, v))), """\
    def forward(self, arg0_1: "f32[2, 3, 4, 2, 8]", arg1_1: "f32[2, 3, 12, 2, 8]", arg2_1: "f32[2, 3, 12, 2, 8]"):
        permute_default: "f32[2, 3, 2, 4, 8]" = torch.ops.aten.permute.default(arg0_1, [0, 1, 3, 2, 4])
        permute_default_1: "f32[2, 3, 2, 8, 12]" = torch.ops.aten.permute.default(arg1_1, [0, 1, 3, 4, 2])
        permute_default_2: "f32[2, 3, 2, 12, 8]" = torch.ops.aten.permute.default(arg2_1, [0, 1, 3, 2, 4])
        flatten_using_ints: "f32[6, 2, 4, 8]" = torch.ops.aten.flatten.using_ints(permute_default, 0, 1)
        transpose_int: "f32[2, 3, 2, 12, 8]" = torch.ops.aten.transpose.int(permute_default_1, -2, -1)
        flatten_using_ints_1: "f32[6, 2, 12, 8]" = torch.ops.aten.flatten.using_ints(transpose_int, 0, 1)
        flatten_using_ints_2: "f32[6, 2, 12, 8]" = torch.ops.aten.flatten.using_ints(permute_default_2, 0, 1)
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(flatten_using_ints, flatten_using_ints_1, flatten_using_ints_2, [], None, '{"causal": null, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 12, "num_heads": 2, "q_len": 4, "scale": 1.0, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "f32[6, 2, 4, 8]" = flash_attention_default[0]
        view_default: "f32[2, 3, 2, 4, 8]" = torch.ops.aten.view.default(getitem, [2, 3, 2, 4, 8])
        permute_default_3: "f32[2, 3, 4, 2, 8]" = torch.ops.aten.permute.default(view_default, [0, 1, 3, 2, 4])
        return (permute_default_3,)""")
        expected = fn(q, k, v)
        torch._dynamo.reset()
        ours = torch.compile(fn, backend="fuse_attn")(*(x.float() for x in (q, k, v)))
        eager = fn(*(x.float() for x in (q, k, v)))
        self.assertLessEqual((ours - expected).abs().max().item(), 2 * (eager - expected).abs().max().item() + 1e-6)

    def test_an_einsum_summing_its_rows_away_is_left_as_it_is(self):
        """``bhmc,bhnc->bh`` (one contraction, then m and n summed) is no product the rewrite may permute: beside it the
        attention still fuses, and the einsum's value is einsum's."""

        def fn(q, k, v):
            return torch.softmax(q @ k.transpose(-1, -2), -1) @ v, torch.einsum("bhmc,bhnc->bh", q, k)

        self.assertExpectedInline(fused_specs(fn, *qkv()), """float32 D=8 M=5 N=5 scale=1""")
        q, k, v = qkv()
        torch._dynamo.reset()
        ours = torch.compile(fn, backend="fuse_attn")(q, k, v)[1]
        torch.testing.assert_close(ours, fn(q, k, v)[1])

    def test_dropout_in_training(self):
        """Training-mode dropout on the weights is the spec's dropout_p; a fresh seed is drawn before each call."""

        def fn(q, k, v):
            return F.dropout(torch.softmax(q @ k.transpose(-1, -2), -1), p=0.1, training=True) @ v

        self.assertExpectedInline(self.check(fn, *qkv()), """\
    def forward(self, arg0_1: "f32[2, 3, 5, 8]", arg1_1: "f32[2, 3, 5, 8]", arg2_1: "f32[2, 3, 5, 8]"):
        randint_low: "i64[]" = torch.ops.aten.randint.low(0, 4611686018427387904, [], dtype = torch.int64, device = device(type='cpu'))
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg1_1, arg0_1, arg2_1, [], randint_low, '{"causal": null, "dropout_p": 0.1, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 3, "q_len": 5, "scale": 1.0, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "f32[2, 3, 5, 8]" = flash_attention_default[0]
        return (getitem,)""")


    def test_q_and_k_upcast_to_fp32_in_bf16(self):
        """Mixed precision: q and k upcast for the scores, softmax in fp32, the weights cast back for P @ V in bf16.
        The upcasts are exact, so the kernel takes the bf16 q and k."""

        def fn(q, k, v):
            w = torch.matmul(q.float(), k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
            return torch.softmax(w, -1, dtype=torch.float32).to(q.dtype) @ v

        self.assertExpectedInline(self.check(fn, *qkv(dtype=torch.bfloat16)), """\
    def forward(self, arg0_1: "bf16[2, 3, 5, 8]", arg1_1: "bf16[2, 3, 5, 8]", arg2_1: "bf16[2, 3, 5, 8]"):
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg0_1, arg1_1, arg2_1, [], None, '{"causal": null, "dropout_p": 0.0, "dtype": "bfloat16", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 3, "q_len": 5, "scale": 0.3535533905932738, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "bf16[2, 3, 5, 8]" = flash_attention_default[0]
        return (getitem,)""")


class TestScorePrograms(TestCase):
    """Pointwise score changes become a program run in the kernel's tile loop; index-only masks never load."""

    def describe(self, fn, *args, dynamic=None):
        return fused_specs(fn, *args, dynamic=dynamic)

    def assert_compiled_equals_eager(self, fn, q, k, v, *rest):
        """Output and q/k/v gradients of ``fn`` compiled with fuse_attn against eager, fp32."""
        results = []
        for run in (fn, torch.compile(fn, backend="fuse_attn")):
            leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
            out = run(*leaves, *rest)
            out.backward(torch.ones_like(out))
            results.append([out, *(x.grad for x in leaves)])
        for eager, ours in zip(*results):
            torch.testing.assert_close(ours, eager, rtol=1e-4, atol=1e-5)

    def test_reads_of_the_scores_dtype_or_shape_are_no_other_use(self):
        # XLM's: a padding mask expanded as the scores, the weights cast back as them
        def fn(q, k, v, keep):
            scores = q @ k.transpose(-1, -2)
            scores = scores.masked_fill((keep == 0).view(2, 1, 1, 6).expand_as(scores), torch.finfo(scores.dtype).min)
            return torch.softmax(scores.float(), -1).type_as(scores) @ v

        keep = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
        self.assertExpectedInline(self.describe(fn, *qkv(length=6), keep), """float32 D=8 M=6 N=6 scale=1 s -> where(mask0[Z,1,1,N], -3.40282e+38, s) padded keys skipped (mask0)""")
        self.assert_compiled_equals_eager(fn, *qkv(length=6), keep)

    def test_a_bias_gathered_from_a_product_of_its_own(self):
        # Inkling's relative position bias: per-head logits of each query (a product), gathered by the distance
        def fn(q, k, v, relative, proj):
            M, N = q.shape[-2], k.shape[-2]
            logits = relative @ proj  # [Z, H, M, E]
            distance = torch.arange(M)[:, None] - torch.arange(N)[None, :]
            bias = logits.gather(-1, distance.clamp(0, proj.shape[-1] - 1).expand(*logits.shape[:2], -1, -1))
            return torch.softmax(q @ k.transpose(-1, -2) + bias.masked_fill(distance < 0, 0.0), -1) @ v

        relative, proj = torch.randn(2, 3, 5, 4), torch.randn(4, 3)
        self.assertExpectedInline(self.describe(fn, *qkv(), relative, proj), """float32 D=8 M=5 N=5 scale=1 s -> s + bias0[Z,H,M,N]""")
        self.assert_compiled_equals_eager(fn, *qkv(), relative, proj)

    def test_a_bias_behind_a_long_chain_of_ops(self):
        # LongT5's transient-global attention: its bias is T5's position buckets, tens of ops deep, and its scores are
        # cast before the softmax, so the cast's operand is told for the scores by a walk up both sides of the sum
        def fn(q, k, v, bias):
            for _ in range(40):
                bias = bias * 0.99 + 0.01
            scores = q @ k.transpose(-1, -2) + bias
            return torch.softmax(scores.float(), -1).type_as(scores) @ v

        self.assertExpectedInline(self.describe(fn, *qkv(), torch.randn(2, 3, 5, 5)), """float32 D=8 M=5 N=5 scale=1 s -> s + bias0[Z,H,M,N]""")
        self.assert_compiled_equals_eager(fn, *qkv(), torch.randn(2, 3, 5, 5))

    def test_a_scale_a_head_before_the_batch_is_split_for_a_mask(self):
        # Swin-v2's shifted windows: a logit scale a head, then the scores viewed as [B, windows, H, M, N] for the
        # windows' mask, and back
        def fn(q, k, v, scale, mask):
            s = (q @ k.transpose(-1, -2)) * scale
            s = s.view(2, 4, 3, 5, 5) + mask.unsqueeze(1).unsqueeze(0)
            return torch.softmax(s.view(-1, 3, 5, 5), -1) @ v

        scale, mask = torch.rand(3, 1, 1) + 0.5, torch.randn(4, 5, 5)
        self.assertExpectedInline(self.describe(fn, *qkv(batch=8), scale, mask), """float32 D=8 M=5 N=5 scale=1 s -> (s * bias0[1,H,1,1]) + bias1[Z,1,M,N]""")
        self.assert_compiled_equals_eager(fn, *qkv(batch=8), scale, mask)

    def test_alibi_from_arange_is_computed_in_the_kernel(self):
        def fn(q, k, v, slopes):
            M, N = q.shape[-2], k.shape[-2]
            distance = torch.arange(N)[None, :] - torch.arange(M)[:, None]
            w = q @ k.transpose(-1, -2) + slopes[:, None, None] * distance
            return torch.softmax(w, -1) @ v

        self.assertExpectedInline(self.describe(fn, *qkv(), torch.rand(3)), """float32 D=8 M=5 N=5 scale=1 s -> s + (bias0[1,H,1,1] * (kv_idx - q_idx))""")

    def test_sliding_window_mask_is_a_band(self):
        def fn(q, k, v):
            i = torch.arange(q.shape[-2])[:, None]
            j = torch.arange(k.shape[-2])[None, :]
            visible = (j <= i) & (j > i - 3)
            w = (q @ k.transpose(-1, -2)).masked_fill(~visible, torch.finfo(q.dtype).min)
            return torch.softmax(w, -1) @ v

        self.assertExpectedInline(self.describe(fn, *qkv(length=7)), """float32 D=8 M=7 N=7 scale=1 causal(top_left, diagonal=0, window=3)""")

    def test_padding_and_causal_from_a_graph_input_load_only_the_padding(self):
        """Hugging Face style: an [B, N] padding input and an arange causal mask, combined into an additive mask."""

        def fn(q, k, v, padding):
            M, N = q.shape[-2], k.shape[-2]
            causal = torch.arange(N)[None, :] <= torch.arange(M)[:, None]
            keep = causal[None, None] & padding[:, None, None, :].bool()
            mask = torch.where(keep, 0.0, torch.finfo(q.dtype).min)
            return torch.softmax(q @ k.transpose(-1, -2) + mask, -1) @ v

        padding = torch.ones(2, 5, dtype=torch.long)
        padding[1, :2] = 0
        self.assertExpectedInline(self.describe(fn, *qkv(), padding), """float32 D=8 M=5 N=5 scale=1 s -> s + where((kv_idx <= q_idx) & mask0[Z,1,1,N], 0, -3.40282e+38) padded keys and past the causal band skipped (mask0)""")

    def test_hf_to_4d_padding_and_triu_causal_load_only_the_padding(self):
        """Hugging Face's ``AttentionMaskConverter.to_4d``: a ``triu(full((N, N), finfo.min), 1)`` causal mask,
        ``masked_fill``ed where the inverted [B, N] padding is set; the triangle is an index comparison, so only the
        padding vector is loaded and both the padded keys and the keys past the band are skipped."""

        def fn(q, k, v, padding):
            n, low = q.shape[-2], torch.finfo(q.dtype).min
            causal = torch.triu(torch.full((n, n), low), diagonal=1)
            inverted = 1.0 - padding[:, None, None, :].to(q.dtype)
            mask = causal[None, None].masked_fill(inverted.bool(), low)
            return torch.softmax(q @ k.transpose(-1, -2) + mask, -1) @ v

        padding = torch.ones(2, 5, dtype=torch.long)
        padding[1, 3:] = 0
        self.assertExpectedInline(self.describe(fn, *qkv(), padding), """float32 D=8 M=5 N=5 scale=1 s -> s + where(mask0[Z,1,1,N], -3.40282e+38, where(kv_idx >= (q_idx + 1), -3.40282e+38, 0)) padded keys and past the causal band skipped (mask0)""")
        self.assert_compiled_equals_eager(fn, *qkv(), padding)

    def test_tril_of_a_full_tensor_is_computed_in_the_kernel(self):
        def fn(q, k, v, bias):
            n = q.shape[-2]
            visible = torch.tril(torch.full((n, n), True), diagonal=-1)
            return torch.softmax((q @ k.transpose(-1, -2) + bias).masked_fill(visible, -5.0), -1) @ v

        bias = torch.randn(5)
        self.assertExpectedInline(self.describe(fn, *qkv(), bias), """float32 D=8 M=5 N=5 scale=1 s -> where(kv_idx <= (q_idx - 1), -5, s + bias0[1,1,1,N])""")
        self.assert_compiled_equals_eager(fn, *qkv(), bias)

    def test_torch_max_of_the_scores_and_a_floor(self):
        """LLaMA's older form: ``torch.max(scores + mask, tensor(finfo.min))`` (two tensors: ``max.other``)."""

        def fn(q, k, v, mask):
            w = q @ k.transpose(-1, -2) + mask
            return torch.softmax(torch.max(w, torch.tensor(torch.finfo(q.dtype).min)), -1) @ v

        mask = torch.randn(2, 1, 5, 5)
        self.assertExpectedInline(self.describe(fn, *qkv(), mask), """float32 D=8 M=5 N=5 scale=1 s -> maximum(s + bias0[Z,1,M,N], -3.40282e+38) tiles classified per call (bias0)""")
        self.assert_compiled_equals_eager(fn, *qkv(), mask)

    def test_hf_packed_sequence_causal_mask_with_a_tensor_fill_is_a_band(self):
        """transformers 5.17's eager mask (GPT-2): causal & "same packed sequence" from position ids made in the
        graph (all one sequence), filled by ``where(keep, torch.tensor(0.0), finfo.min)``; ``torch.tensor`` traces to
        lift_fresh_copy + detach_, which the constant evaluation reads through."""

        def fn(q, k, v):
            M, N = q.shape[-2], k.shape[-2]
            position_ids = torch.arange(M)[None].expand(q.shape[0], -1)
            first = position_ids[:, :1] - 1
            packed = (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)
            b = torch.arange(q.shape[0])[:, None, None, None]
            i, j = torch.arange(M)[None, None, :, None], torch.arange(N)[None, None, None, :]
            keep = (j <= i) & (packed[b, i] == packed[b, j])
            mask = torch.where(keep, torch.tensor(0.0, dtype=q.dtype), torch.finfo(q.dtype).min)
            return torch.softmax(q @ k.transpose(-1, -2) + mask, -1) @ v

        self.assertExpectedInline(self.describe(fn, *qkv()), """float32 D=8 M=5 N=5 scale=1 causal(top_left, diagonal=0)""")

    def test_clamped_scores(self):
        def fn(q, k, v):
            return torch.softmax((q @ k.transpose(-1, -2)).clamp(-2.0, 3.0) * 0.5, -1) @ v

        self.assertExpectedInline(self.describe(fn, *qkv()), """float32 D=8 M=5 N=5 scale=1 s -> clamp_max(clamp_min(s, -2), 3) * 0.5""")

    def test_symbolic_lengths_arange_causal_mask_is_a_band(self):
        def fn(q, k, v):
            M, N = q.shape[-2], k.shape[-2]
            future = torch.arange(N, device=q.device)[None, :] > torch.arange(M, device=q.device)[:, None]
            w = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
            return torch.softmax(w.masked_fill(future, float("-inf")), -1) @ v

        self.assertExpectedInline(self.describe(fn, *qkv(), dynamic=True), """float32 D=? scale=1*D^-0.5 causal(top_left, diagonal=0)""")

    def test_symbolic_lengths_tril_of_ones_compared_to_zero_is_a_band(self):
        """nanoGPT's mask built in the forward, ``tril(ones(T, T)) == 0``, under symbolic lengths: the triangle is an
        index comparison choosing 1 or 0, so the comparison with 0 is a predicate of ``j - i``; a ``triu`` one that
        keeps every key past the diagonal is no band and stays in the program."""

        def masked(triangle):
            def fn(q, k, v):
                T = q.shape[-2]
                return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(triangle(torch.ones(T, T)) == 0, float("-inf")), -1) @ v

            return self.describe(fn, *qkv(), dynamic=True).removeprefix("float32 D=? scale=1 ")

        self.assertExpectedInline(masked(torch.tril), """causal(top_left, diagonal=0)""")
        self.assertExpectedInline(masked(lambda x: torch.triu(x, diagonal=-2)), """s -> where(where(kv_idx >= (q_idx - 2), 1, 0) == 0, -inf, s)""")

    def test_symbolic_lengths_distance_predicates(self):
        """Under symbolic lengths a mask is read from its index expression: a predicate of ``j - i`` alone that keeps
        a band in which every row keeps a key becomes ``causal``; anything else stays in the kernel's program."""

        def masked(cond):
            def fn(q, k, v):
                i = torch.arange(q.shape[-2], device=q.device)[:, None]
                j = torch.arange(k.shape[-2], device=q.device)[None, :]
                return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(cond(i, j), float("-inf")), -1) @ v

            return self.describe(fn, *qkv(), dynamic=True).removeprefix("float32 D=? scale=1 ")

        self.assertExpectedInline(masked(lambda i, j: (j - i) * 2 > 4), """causal(top_left, diagonal=2)""")
        self.assertExpectedInline(masked(lambda i, j: ~((j <= i) & (j > i - 3))), """causal(top_left, diagonal=0, window=3)""")
        # row 0 keeps no key: eager's NaN row, not the kernel's band
        self.assertExpectedInline(masked(lambda i, j: j >= i), """s -> where(kv_idx >= q_idx, -inf, s)""")
        # not a function of j - i
        self.assertExpectedInline(masked(lambda i, j: j > 2 * i), """s -> where(kv_idx > (q_idx * 2), -inf, s)""")
        # masking the diagonal alone is no band
        self.assertExpectedInline(masked(lambda i, j: j == i), """s -> where(kv_idx == q_idx, -inf, s)""")


    def test_symbolic_lengths_sliced_buffer_corner(self):
        """A constant mask sliced to the run-time lengths from its top-left corner is evaluated at full size: a band
        there is the band of every corner. A corner that is not a band, or a slice that does not start at 0 (its
        start depends on the lengths), stays a loaded mask."""

        class Sliced(torch.nn.Module):
            def __init__(self, mask, offset=False):
                super().__init__()
                self.register_buffer("mask", mask)
                self.offset = offset

            def forward(self, q, k, v):
                M, N = q.shape[-2], k.shape[-2]
                mask = self.mask[N - M:N, :N] if self.offset else self.mask[:M, :N]
                return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(mask == 0, float("-inf")), -1) @ v

        ones = torch.ones(16, 16)
        window = ones.tril() - ones.tril(-3)
        def describe(model, k_length=None):
            return self.describe(model, *qkv(k_length=k_length), dynamic=True).removeprefix("float32 D=? scale=1 ")

        self.assertExpectedInline(describe(Sliced(ones.tril())), """causal(top_left, diagonal=0)""")
        self.assertExpectedInline(describe(Sliced(window)), """causal(top_left, diagonal=0, window=3)""")
        not_a_band = ones.tril()
        not_a_band[9, 2] = 0
        self.assertExpectedInline(describe(Sliced(not_a_band)), """s -> where(mask0[1,1,M,N], -inf, s) tiles classified per call (mask0)""")
        # 5 queries, 7 keys: the rows start at N - M, a symbolic offset
        self.assertExpectedInline(describe(Sliced(ones.tril(), offset=True), k_length=7), """s -> where(mask0[1,1,M,N], -inf, s) tiles classified per call (mask0)""")


class TestNotRewritten(TestCase):
    def verdicts(self, fn, *args):
        return unfused_verdicts(fn, *args)

    def test_weights_also_returned(self):
        def fn(q, k, v):
            p = torch.softmax(q @ k.transpose(-1, -2), -1)
            return p @ v, p

        self.assertExpectedInline(self.verdicts(fn, *qkv()), """not fused softmax: the attention weights softmax are used by matmul_1, output, not by one P @ V product""")

    def test_einsum_broadcasting_its_ellipsis_dims(self):
        # (the ellipsis of k and v broadcast over q's first dim: not one batched product of equal batch dims)
        def fn(q, k, v):
            w = torch.einsum("...qhd,...khd->...hqk", q, k)
            return torch.einsum("...hqk,...khd->...qhd", torch.softmax(w, dim=-1), v)

        q = torch.randn(2, 3, 4, 2, 8)
        k, v = (torch.randn(1, 3, 12, 2, 8) for _ in range(2))
        self.assertExpectedInline(self.verdicts(fn, q, k, v), """not fused softmax: einsum: einsum '...qhd,...khd->...hqk' is not one batched product of equal batch dims (one contraction; an ellipsis the same dims on both operands)""")

    def test_softmax_over_another_dim(self):
        def fn(q, k, v):
            return torch.softmax(q @ k.transpose(-1, -2), dim=-2) @ v

        self.assertExpectedInline(self.verdicts(fn, *qkv()), """not fused softmax: the softmax is not over the last dim""")

    def test_non_pointwise_op_between_product_and_softmax(self):
        def fn(q, k, v):
            return torch.softmax((q @ k.transpose(-1, -2)).cumsum(-1), -1) @ v

        self.assertExpectedInline(self.verdicts(fn, *qkv()), """not fused softmax: cumsum (cumsum.default) between q @ k^T and the softmax is not a pointwise score change""")

    def test_two_score_products_added(self):
        def fn(q, k, v):
            return torch.softmax(q @ k.transpose(-1, -2) + k @ q.transpose(-1, -2), -1) @ v

        self.assertExpectedInline(self.verdicts(fn, *qkv()), """not fused softmax: add: cannot tell the scores from the other operand""")

    def test_scores_used_twice(self):
        def fn(q, k, v):
            w = q @ k.transpose(-1, -2)
            return torch.softmax(w - w.mean(-1, keepdim=True), -1) @ v

        self.assertExpectedInline(self.verdicts(fn, *qkv()), """not fused softmax: the scores matmul are also used by mean""")

    def test_float64_is_left_alone(self):
        self.assertExpectedInline(self.verdicts(plain_attention, *qkv(dtype=torch.float64)), """not fused softmax: dtype float64 is not supported (fp16, bf16, fp32 are)""")

    def test_head_dim_over_512(self):  # (512: Gemma-4's global layers)
        self.assertExpectedInline(self.verdicts(plain_attention, *qkv(dim=640)), """not fused softmax: the head dim 640 is over 512""")

    def test_value_of_another_dtype(self):
        def fn(q, k, v):
            return torch.softmax(q @ k.transpose(-1, -2), -1).float() @ v.float()

        self.assertExpectedInline(self.verdicts(fn, *qkv(dtype=torch.float16)), """not fused softmax: q is torch.float16 but v is torch.float32""")

    def test_fp32_q_and_k_with_a_bf16_value(self):
        """Only an upcast of half-precision q and k is folded: real fp32 q and k stay unfused."""

        def fn(q, k, v):
            return torch.softmax(q @ k.transpose(-1, -2), -1).to(v.dtype) @ v

        q, k, v = qkv()
        self.assertExpectedInline(self.verdicts(fn, q, k, v.bfloat16()), """not fused softmax: q is torch.float32 but v is torch.bfloat16""")

    def test_zero_length_sequence(self):
        self.assertExpectedInline(self.verdicts(plain_attention, *qkv(length=0)), """not fused softmax: the query length is 0""")

    def test_graph_break_between_product_and_softmax(self):
        def fn(q, k, v):
            w = q @ k.transpose(-1, -2)
            torch._dynamo.graph_break()
            return torch.softmax(w, -1) @ v

        self.assertExpectedInline(self.verdicts(fn, *qkv()), """not fused softmax: no q @ k^T product before the softmax: the scores come from placeholder arg0_1""")

    def test_causal_mask_from_a_graph_input_stays_a_tensor(self):
        def fn(q, k, v, keep):
            w = (q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf"))
            return torch.softmax(w, -1) @ v

        reports = rewrite_reports(fn, *qkv(), torch.ones(5, 5, dtype=torch.bool).tril())
        self.assertExpectedInline(verdict_lines(reports), """fused softmax: float32 D=8 M=5 N=5 scale=1 s -> where(mask0[1,1,M,N], -inf, s) tiles classified per call (mask0)""")

    def test_verdicts_name_the_users_source_line(self):
        def fn(q, k, v):
            weights = torch.softmax(q @ k.transpose(-1, -2), -1)
            return weights @ v, weights

        (verdict,) = rewrite_reports(fn, *qkv())[0].verdicts
        self.assertEqual(verdict.source, f"test_matcher.py:{fn.__code__.co_firstlineno + 1} `weights = torch.softmax(q @ k.transpose(-1, -2), -1)`")

    def test_causal_mask_before_tanh_is_not_a_band(self):
        """tanh(-inf) = -1: a mask applied before a softcap does not mask, so it must not become 'causal'."""

        def fn(q, k, v):
            T = q.shape[-2]
            w = (q @ k.transpose(-1, -2)).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            return torch.softmax(torch.tanh(w / 50.0) * 50.0, -1) @ v

        reports = rewrite_reports(fn, *qkv())
        self.assertExpectedInline(verdict_lines(reports), """fused softmax: float32 D=8 M=5 N=5 scale=1 s -> tanh(where(kv_idx >= (q_idx + 1), -inf, s) / 50) * 50""")
