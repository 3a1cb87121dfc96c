"""``F.scaled_dot_product_attention`` calls matched as attentions (fuse_attn/sdpa_calls.py): golden graphs and specs
of each mask form Hugging Face builds, what stays an SDPA call (with its reason), and the numerics of SDPA's own
semantics (a row with every key masked gives 0) through the compiled backend."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from expecttest import TestCase

from fuse_attn.report import collect_reports
from tests.support.graph_capture import fused_graph, fused_specs, rewrite_reports, verdict_lines


def qkv(batch=2, heads=4, kv_heads=None, length=6, dim=8, dtype=torch.float32, requires_grad=False):
    g = torch.Generator().manual_seed(0)
    kv_heads = kv_heads or heads
    shapes = [(batch, heads, length, dim), (batch, kv_heads, length, dim), (batch, kv_heads, length, dim)]
    return [torch.randn(*s, generator=g).to(dtype).requires_grad_(requires_grad) for s in shapes]


def left_padding(batch=2, length=6, pads=(0, 2)):
    """A Hugging Face [B, N] attention mask: 1 for tokens, 0 for the ``pads[b]`` padding tokens on the left."""
    mask = torch.ones(batch, length, dtype=torch.long)
    for b, pad in enumerate(pads):
        mask[b, :pad] = 0
    return mask


def hf_padding_causal_mask(padding, length):
    """transformers' SDPA mask: a bool [B, 1, N, N] from index comparisons and the padding vector."""
    i = torch.arange(length, device=padding.device)[:, None]
    j = torch.arange(length, device=padding.device)[None, :]
    return ((j <= i)[None, None] & padding[:, None, None, :].bool())


class TestGoldenGraphs(TestCase):
    def test_is_causal(self):
        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        self.assertExpectedInline(fused_graph(fn, *qkv()), """\
    def forward(self, arg0_1: "f32[2, 4, 6, 8]", arg1_1: "f32[2, 4, 6, 8]", arg2_1: "f32[2, 4, 6, 8]"):
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg0_1, arg1_1, arg2_1, [], None, '{"causal": {"alignment": "top_left", "diagonal": 0, "window": null}, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "zero", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 6, "num_heads": 4, "q_len": 6, "scale": 0.3535533905932738, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "f32[2, 4, 6, 8]" = flash_attention_default[0]
        return (getitem,)""")

    def test_the_output_is_laid_out_as_sdpas(self):
        # SDPA's kernels return [B, H, M, D] with the heads inside each row, so the trace drops the copy of
        # `.transpose(1, 2).contiguous()` and a `.view` of the transpose holds (JetMoE's); the fused output is copied
        # to that layout
        def fn(x, wq, wk, wv):
            q, k, v = ((x @ w).view(2, 5, 3, 8).transpose(1, 2) for w in (wq, wk, wv))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return out.transpose(1, 2).contiguous().view(2, 5, 1, -1)

        g = torch.Generator().manual_seed(0)
        x, *ws = torch.randn(2, 5, 24, generator=g), *(torch.randn(24, 24, generator=g) for _ in range(3))
        self.assertExpectedInline(fused_graph(fn, x, *ws), """\
    def forward(self, arg0_1: "f32[2, 5, 24]", arg1_1: "f32[24, 24]", arg2_1: "f32[24, 24]", arg3_1: "f32[24, 24]"):
        matmul: "f32[2, 5, 24]" = torch.ops.aten.matmul.default(arg0_1, arg1_1)
        view: "f32[2, 5, 3, 8]" = torch.ops.aten.view.default(matmul, [2, 5, 3, 8])
        transpose: "f32[2, 3, 5, 8]" = torch.ops.aten.transpose.int(view, 1, 2)
        matmul_1: "f32[2, 5, 24]" = torch.ops.aten.matmul.default(arg0_1, arg2_1)
        view_1: "f32[2, 5, 3, 8]" = torch.ops.aten.view.default(matmul_1, [2, 5, 3, 8])
        transpose_1: "f32[2, 3, 5, 8]" = torch.ops.aten.transpose.int(view_1, 1, 2)
        matmul_2: "f32[2, 5, 24]" = torch.ops.aten.matmul.default(arg0_1, arg3_1)
        view_2: "f32[2, 5, 3, 8]" = torch.ops.aten.view.default(matmul_2, [2, 5, 3, 8])
        transpose_2: "f32[2, 3, 5, 8]" = torch.ops.aten.transpose.int(view_2, 1, 2)
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(transpose, transpose_1, transpose_2, [], None, '{"causal": {"alignment": "top_left", "diagonal": 0, "window": null}, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "zero", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 3, "q_len": 5, "scale": 0.3535533905932738, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "f32[2, 3, 5, 8]" = flash_attention_default[0]
        permute_default: "f32[2, 5, 3, 8]" = torch.ops.aten.permute.default(getitem, [0, 2, 1, 3])
        clone_default: "f32[2, 5, 3, 8]" = torch.ops.aten.clone.default(permute_default, memory_format = torch.contiguous_format)
        permute_default_1: "f32[2, 3, 5, 8]" = torch.ops.aten.permute.default(clone_default, [0, 2, 1, 3])
        transpose_3: "f32[2, 5, 3, 8]" = torch.ops.aten.transpose.int(permute_default_1, 1, 2)
        view_3: "f32[2, 5, 1, 24]" = torch.ops.aten.view.default(transpose_3, [2, 5, 1, -1])
        return (view_3,)""")
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(fn, backend="fuse_attn")(x, *ws), fn(x, *ws))

    def test_enable_gqa_shares_kv_heads_in_the_kernel(self):
        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        self.assertExpectedInline(fused_graph(fn, *qkv(kv_heads=2)), """\
    def forward(self, arg0_1: "f32[2, 4, 6, 8]", arg1_1: "f32[2, 2, 6, 8]", arg2_1: "f32[2, 2, 6, 8]"):
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg0_1, arg1_1, arg2_1, [], None, '{"causal": {"alignment": "top_left", "diagonal": 0, "window": null}, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "zero", "gqa_group": 2, "head_dim": 8, "head_dim_v": 8, "kv_len": 6, "num_heads": 4, "q_len": 6, "scale": 0.3535533905932738, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "f32[2, 4, 6, 8]" = flash_attention_default[0]
        return (getitem,)""")

    def test_dropout_and_scale(self):
        """SDPA's dropout_p is the spec's (a fresh seed per call), its scale the spec's scale."""

        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, scale=0.2)

        self.assertExpectedInline(fused_graph(fn, *qkv()), """\
    def forward(self, arg0_1: "f32[2, 4, 6, 8]", arg1_1: "f32[2, 4, 6, 8]", arg2_1: "f32[2, 4, 6, 8]"):
        randint_low: "i64[]" = torch.ops.aten.randint.low(0, 4611686018427387904, [], dtype = torch.int64, device = device(type='cpu'))
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg0_1, arg1_1, arg2_1, [], randint_low, '{"causal": null, "dropout_p": 0.1, "dtype": "float32", "empty_rows": "zero", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 6, "num_heads": 4, "q_len": 6, "scale": 0.2, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "f32[2, 4, 6, 8]" = flash_attention_default[0]
        return (getitem,)""")


class TestMaskForms(TestCase):
    """Each mask an SDPA call receives is read back to how the graph built it."""

    def test_padding_bool_mask_loads_only_the_padding_vector(self):
        def fn(q, k, v, padding):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=padding[:, None, None, :].bool())

        self.assertExpectedInline(fused_specs(fn, *qkv(), left_padding()), """float32 D=8 M=6 N=6 scale=0.353553 s -> where(mask0[Z,1,1,N], -inf, s) empty rows 0 padded keys skipped (mask0)""")

    def test_padding_and_causal_bool_mask(self):
        def fn(q, k, v, padding):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=hf_padding_causal_mask(padding, q.shape[-2]))

        self.assertExpectedInline(fused_specs(fn, *qkv(), left_padding()), """float32 D=8 M=6 N=6 scale=0.353553 s -> where(logical_not((kv_idx <= q_idx) & mask0[Z,1,1,N]), -inf, s) empty rows 0 padded keys and past the causal band skipped (mask0)""")

    def test_additive_padding_mask(self):
        def fn(q, k, v, padding):
            mask = (1.0 - padding[:, None, None, :].to(q.dtype)) * torch.finfo(q.dtype).min
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        self.assertExpectedInline(fused_specs(fn, *qkv(), left_padding()), """float32 D=8 M=6 N=6 scale=0.353553 s -> s + bias0[Z,1,1,N] empty rows 0 padded keys skipped (bias0)""")

    def test_sliding_window_bool_mask_is_a_band(self):
        def fn(q, k, v):
            i = torch.arange(q.shape[-2])[:, None]
            j = torch.arange(k.shape[-2])[None, :]
            return F.scaled_dot_product_attention(q, k, v, attn_mask=(j <= i) & (j > i - 3))

        self.assertExpectedInline(fused_specs(fn, *qkv()), """float32 D=8 M=6 N=6 scale=0.353553 causal(top_left, diagonal=0, window=3) empty rows 0""")

    # torch 2.11 specializes the head dim of these calls under dynamic=True, so their spec text differs there (the
    # scale is then a plain number: test_scale_of_a_specialized_head_dim_is_a_constant); the golden text is torch
    # 2.13's, the version CI runs
    @pytest.mark.skipif(torch.__version__ < (2, 13), reason="golden spec of torch 2.13 (2.11 specializes the head dim)")
    def test_is_causal_with_symbolic_lengths(self):
        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        self.assertExpectedInline(fused_specs(fn, *qkv(), dynamic=True), """float32 D=? scale=1*D^-0.5 causal(top_left, diagonal=0) empty rows 0""")

    @pytest.mark.skipif(torch.__version__ < (2, 13), reason="golden spec of torch 2.13 (2.11 specializes the head dim)")
    def test_enable_gqa_with_symbolic_head_counts_specializes_the_group(self):
        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        self.assertExpectedInline(fused_specs(fn, *qkv(kv_heads=2), dynamic=True), """float32 D=? scale=1*D^-0.5 gqa=2 empty rows 0""")

    def test_scale_of_a_specialized_head_dim_is_a_constant(self):
        """torch 2.11 specializes a dynamic graph's head dim in SDPA's expansion: ``sym_size`` of it is a plain int
        and the expansion's ``D ** -0.5`` a plain float (seen on the GPU machine). Such a node is read as the
        constant its value is: the scale folds (it failed there with "pow_1 is not a tensor or a constant")."""
        import operator

        from fuse_attn.graph.score_reader import ConstantEvaluator, MatchContext

        graph = torch.fx.Graph()
        q = graph.placeholder("q")
        size = graph.call_function(torch.ops.aten.sym_size.int, (q, 3))
        scale = graph.call_function(operator.pow, (size, -0.5))
        q.meta["val"], size.meta["val"], scale.meta["val"] = torch.empty(2, 4, 6, 8), 8, 8 ** -0.5
        self.assertEqual(ConstantEvaluator(MatchContext()).try_scalar(scale), 8 ** -0.5)

    def test_head_dim_512_is_fused(self):
        """Gemma-4's global layers: every SDPA kernel takes longer at this head dim than the generated kernels (the
        memory-efficient one's forward+backward over 3x: docs/performance.md)."""

        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        self.assertExpectedInline(fused_specs(fn, *qkv(dim=512)), """float32 D=512 M=6 N=6 scale=0.0441942 causal(top_left, diagonal=0) empty rows 0""")

    def test_mask_from_a_graph_input_is_loaded(self):
        """A mask of unknown structure still runs fused, as a loaded tensor."""

        def fn(q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        mask = torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(1)) > 0.3
        self.assertExpectedInline(fused_specs(fn, *qkv(), mask), """float32 D=8 M=6 N=6 scale=0.353553 s -> where(mask0[Z,1,M,N], -inf, s) empty rows 0 tiles classified per call (mask0)""")


class TestLeftAsSdpa(TestCase):
    """Calls that stay SDPA calls, unchanged, each with its reason."""

    def verdicts(self, fn, *args, dynamic=None):
        reports = rewrite_reports(fn, *args, dynamic=dynamic)
        for report in reports:
            self.assertNotIn("fuse_attn.flash_attention", report.after)
            self.assertIn("aten.scaled_dot_product_attention.default", report.after)
            self.assertNotIn("_safe_softmax", report.after)  # the expansion is gone again
        return verdict_lines(reports)

    @staticmethod
    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    def test_float64(self):
        self.assertExpectedInline(self.verdicts(self.sdpa, *qkv(dtype=torch.float64)), """not fused scaled_dot_product_attention: dtype float64 is not supported (fp16, bf16, fp32 are)""")

    def test_head_dim_over_512_is_not_fused(self):
        self.assertExpectedInline(self.verdicts(self.sdpa, *qkv(dim=640)), """not fused scaled_dot_product_attention: the head dim 640 is over 512""")

    def test_other_ops_of_the_graph_are_untouched(self):
        def fn(q, k, v):
            return F.scaled_dot_product_attention(q.double(), k.double(), v.double()).sum(-1)

        self.assertExpectedInline(self.verdicts(fn, *qkv()), """not fused scaled_dot_product_attention: dtype float64 is not supported (fp16, bf16, fp32 are)""")


# ---- numerics through the compiled backend: SDPA's semantics, fully masked rows included ----------------------------
@pytest.mark.parametrize("route", ["blockwise", "interpreter", "cuda"])
@pytest.mark.parametrize("form", ["bool", "additive"])
def test_left_padding_and_causal_match_sdpa_with_gradients(route, form, monkeypatch):
    """Left padding + causal leaves the padded query rows with no key: SDPA gives them 0 (and no gradient); so does
    the fused op. Compared with SDPA in fp64 under the 2x rule, output and gradients (fp32; on a GPU the kernels)."""
    interpreter_session = os.environ.get("TRITON_INTERPRET") == "1"
    if route == "interpreter" and not interpreter_session:
        pytest.skip("needs a TRITON_INTERPRET=1 session")
    if route == "cuda" and (interpreter_session or not torch.cuda.is_available()):
        pytest.skip("needs a GPU and TRITON_INTERPRET=0")
    if route != "cuda":
        monkeypatch.setenv("TRITON_INTERPRET", "1" if route == "interpreter" else "0")
    from tests.support.numerics import assert_close_2x

    device = "cuda" if route == "cuda" else "cpu"
    padding = left_padding(length=9, pads=(0, 3)).to(device)

    def fn(q, k, v, padding):
        keep = hf_padding_causal_mask(padding, q.shape[-2])
        mask = keep if form == "bool" else torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill(~keep, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v = (t.detach().to(device).requires_grad_() for t in qkv(length=9, dim=16))
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    eager_in = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    torch._dynamo.reset()
    with collect_reports() as reports:
        out = torch.compile(fn, backend="fuse_attn")(q, k, v, padding)
    assert [v.fused for r in reports for v in r.verdicts] == [True]
    ref, eager = fn(*ref_in, padding), fn(*eager_in, padding)
    assert (out[1, :, :3] == 0).all() and not out.isnan().any()
    assert_close_2x("out", out, ref, eager, torch.float32)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(device)
    for name, a, b, c in zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), dout),
                             torch.autograd.grad(ref, ref_in, dout.double()), torch.autograd.grad(eager, eager_in, dout)):
        assert not a.isnan().any(), name
        assert_close_2x(name, a, b, c, torch.float32)
