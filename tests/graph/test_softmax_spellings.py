"""Softmaxes spelled out (fuse_attn/graph/softmax_spellings.py): ``exp(s - max(s)) / sum(...)`` (shifted or not),
``exp(log_softmax(s))`` and ``exp(s - logsumexp(s))`` fused as the softmax, a sink joined by
``logsumexp(cat([s, sink]))`` or ``logaddexp(logsumexp(s), sink)`` as gpt-oss's sink, the scores' logsumexp read
besides their softmax (FlexAttention's sink: ``out * sigmoid(lse - sink)``) served by the fused op's lse (numerics
and gradients here and in tests/graph/test_attention_sinks.py), and the forms left as they are."""

from __future__ import annotations

import pytest
import torch
from expecttest import TestCase

from tests.graph.test_attention_sinks import SinkAttention, qkv
from tests.support.graph_capture import fused_graph, fused_specs, rewrite_reports, unfused_verdicts, verdict_lines
from tests.support.numerics import CUDA_BF16, check_close


def lse(x):
    return torch.logsumexp(x, -1, keepdim=True)


class TestFused(TestCase):
    def test_a_sink_joined_by_logaddexp(self):
        self.assertExpectedInline(fused_specs(SinkAttention(3, spelling="logaddexp"), *qkv()), """float32 D=8 M=5 N=5 scale=0.353553 empty rows 0 + sink (output x sigmoid(lse - sink))""")

    def test_the_softmax_spelled_exp_of_the_scores_less_their_logsumexp(self):
        def fn(q, k, v, mask):
            s = (q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(mask, float("-inf"))
            return torch.exp(s - lse(s)) @ v

        mask = torch.ones(5, 5, dtype=torch.bool).triu(1)
        self.assertExpectedInline(fused_specs(fn, *qkv(), mask), """float32 D=8 M=5 N=5 scale=0.353553 s -> where(mask0[1,1,M,N], -inf, s) tiles classified per call (mask0)""")

    def test_a_sink_joined_by_logaddexp_with_symbolic_lengths(self):
        def fn(q, k, v, sinks):
            s = q @ k.transpose(-1, -2)
            return torch.exp(s - torch.logaddexp(lse(s), sinks.reshape(1, -1, 1, 1))) @ v

        self.assertExpectedInline(fused_specs(fn, *qkv(M=7), torch.randn(3), dynamic=True), """float32 D=? scale=1 empty rows 0 + sink (output x sigmoid(lse - sink))""")

    def test_a_sink_added_to_the_denominator(self):
        module = SinkAttention(3, causal=True, spelling="denominator")
        self.assertExpectedInline(fused_specs(module, *qkv()), """float32 D=8 M=5 N=5 scale=0.353553 causal(top_left, diagonal=0) empty rows 0 + sink (output x sigmoid(lse - sink))""")

    def test_a_sink_added_to_the_denominator_unshifted_or_shifted_by_the_scores_max(self):
        def fn(q, k, v, sinks, shift):
            s = q @ k.transpose(-1, -2)
            m = s.amax(-1, keepdim=True) if shift else torch.zeros_like(s[..., :1])
            e = torch.exp(s - m) if shift else torch.exp(s)
            extra = torch.exp(sinks.reshape(1, -1, 1, 1) - m) if shift else torch.exp(sinks.reshape(1, -1, 1, 1))
            return (e / (extra + e.sum(-1, keepdim=True))) @ v

        for shift in (False, True):
            self.assertExpectedInline(fused_specs(fn, *qkv(), torch.randn(3), shift), """float32 D=8 M=5 N=5 scale=1 empty rows 0 + sink (output x sigmoid(lse - sink))""")

    def test_a_sink_joined_by_cat_then_logsumexp(self):
        module = SinkAttention(3, causal=True, spelling="logsumexp")
        self.assertExpectedInline(fused_specs(module, *qkv()), """float32 D=8 M=5 N=5 scale=0.353553 causal(top_left, diagonal=0) empty rows 0 + sink (output x sigmoid(lse - sink))""")


def quotient(s, shift="amax"):
    """The softmax written out: ``exp(s - max(s)) / sum`` (``shift``: "amax", "max" for ``.max(...).values``, None),
    or "log_softmax": ``exp(log_softmax(s))``, or "softmax": the softmax of the scores less their row max (MiMo-V2's
    layers without a sink)."""
    if shift == "log_softmax":
        return torch.log_softmax(s, -1).exp()
    if shift == "softmax":
        return torch.softmax(s - s.max(dim=-1, keepdim=True).values, dim=-1, dtype=s.dtype)
    if shift == "amax":
        s = s - s.amax(-1, keepdim=True)
    elif shift == "max":
        s = s - s.max(-1, keepdim=True).values
    e = torch.exp(s)
    return e / e.sum(-1, keepdim=True)


class TestQuotient(TestCase):
    def test_shifted_by_the_row_max_and_masked(self):
        def fn(q, k, v, mask):
            s = (q @ k.transpose(-1, -2) * 8 ** -0.5).masked_fill(mask, float("-inf"))
            return quotient(s, "max") @ v

        mask = torch.ones(5, 5, dtype=torch.bool).triu(1)
        self.assertExpectedInline(fused_specs(fn, *qkv(), mask), """float32 D=8 M=5 N=5 scale=0.353553 s -> where(mask0[1,1,M,N], -inf, s) tiles classified per call (mask0)""")

    def test_the_exponential_of_a_log_softmax(self):
        def fn(q, k, v):
            return quotient(q @ k.transpose(-1, -2), "log_softmax") @ v

        self.assertExpectedInline(fused_specs(fn, *qkv()), """float32 D=8 M=5 N=5 scale=1""")

    def test_the_verdict_names_the_node_whose_weights_the_softmax_replaced(self):
        def fn(q, k, v):
            return quotient(q @ k.transpose(-1, -2)) @ v

        self.assertExpectedInline(verdict_lines(rewrite_reports(fn, *qkv())), """fused div: float32 D=8 M=5 N=5 scale=1""")

    def test_the_softmax_of_the_scores_less_their_row_max(self):
        def fn(q, k, v):
            return quotient(q @ k.transpose(-1, -2), "softmax") @ v

        self.assertExpectedInline(fused_specs(fn, *qkv()), """float32 D=8 M=5 N=5 scale=1""")

    def test_unshifted(self):
        def fn(q, k, v):
            return quotient(q @ k.transpose(-1, -2), None) @ v

        self.assertExpectedInline(fused_specs(fn, *qkv()), """float32 D=8 M=5 N=5 scale=1""")


@pytest.mark.parametrize("device, dtype", [("cpu", torch.float32), ("cpu", torch.bfloat16), CUDA_BF16])
@pytest.mark.parametrize("shift, M, N, D", [("amax", 17, 17, 16), ("max", 97, 97, 80), (None, 1, 300, 16),
                                             ("log_softmax", 17, 17, 16), ("softmax", 17, 17, 16)])
def test_quotient_matches_fp64_with_gradients(shift, M, N, D, device, dtype):
    """The softmax written out, causal, fused: output and gradients against fp64 under the 2x rule."""
    def fn(q, k, v):
        s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(s.shape[-1] - s.shape[-2])
        return quotient(s.masked_fill(~keep, float("-inf")), shift) @ v

    inputs = [t.to(device) for t in qkv(M=M, N=N, D=D)]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="fuse_attn")
    results = {}
    for name, call, run_dtype in (("ours", compiled, dtype), ("eager", fn, dtype), ("ref", fn, torch.float64)):
        x = [t.to(run_dtype).requires_grad_() for t in inputs]
        out = call(*x)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(device)
        results[name] = [out, *torch.autograd.grad(out, x, weights.to(run_dtype))]
    for what, ours, eager, ref in zip(("out", "dq", "dk", "dv"), *results.values()):
        check_close(ours, eager, ref, dtype, what)


class TestLogsumexpBesideTheSoftmax(TestCase):
    """The softmax input's logsumexp over the keys, read besides the softmax, served by the fused op's lse."""

    def test_flexattentions_form_of_a_sink(self):
        self.assertExpectedInline(fused_graph(SinkAttention(3, spelling="flex"), *qkv()), """\
    def forward(self, arg0_1: "f32[2, 3, 5, 8]", arg1_1: "f32[2, 3, 5, 8]", arg2_1: "f32[3]", arg3_1: "f32[2, 3, 5, 8]"):
        reshape: "f32[1, 3, 1, 1]" = torch.ops.aten.reshape.default(arg2_1, [1, -1, 1, 1])
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg1_1, arg0_1, arg3_1, [], None, '{"causal": null, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 3, "q_len": 5, "scale": 0.3535533905932738, "scale_head_dim_power": 0.0, "score_program": [], "score_tensors": []}')
        getitem: "f32[2, 3, 5, 8]" = flash_attention_default[0]
        getitem_1: "f32[2, 3, 5]" = flash_attention_default[1]
        unsqueeze_default: "f32[2, 3, 5, 1]" = torch.ops.aten.unsqueeze.default(getitem_1, -1)
        _to_copy_default: "f32[2, 3, 5, 1]" = torch.ops.aten._to_copy.default(unsqueeze_default, dtype = torch.float32)
        sub: "f32[2, 3, 5, 1]" = torch.ops.aten.sub.Tensor(_to_copy_default, reshape)
        sigmoid: "f32[2, 3, 5, 1]" = torch.ops.aten.sigmoid.default(sub)
        to_1: "f32[2, 3, 5, 1]" = torch.ops.aten.to.dtype(sigmoid, torch.float32)
        mul_1: "f32[2, 3, 5, 8]" = torch.ops.aten.mul.Tensor(getitem, to_1)
        return (mul_1,)""")

    def test_over_another_dim_it_is_one_more_reader_of_the_scores(self):
        def fn(q, k, v):
            s = q @ k.transpose(-1, -2)
            return torch.softmax(s, -1) @ v, torch.logsumexp(s, -2, keepdim=True)

        self.assertExpectedInline(unfused_verdicts(fn, *qkv()), """not fused softmax: the scores matmul are also used by logsumexp""")


class TestLeftAlone(TestCase):
    """Forms that are no softmax over the keys, or not one alone: the graph keeps them as written."""

    def assert_left(self, fn, *args):
        reports = rewrite_reports(fn, *args)
        assert all("aten.exp" in r.after and "aten._softmax" not in r.after for r in reports), [r.after for r in reports]
        self.assertEqual(unfused_verdicts(fn, *args), "")  # (no softmax in the graph: nothing to report)

    def test_over_the_query_dim(self):
        def fn(q, k, v):
            s = q @ k.transpose(-1, -2)
            return torch.exp(s - torch.logsumexp(s, -2, keepdim=True)) @ v

        self.assert_left(fn, *qkv())

    def test_of_other_scores(self):
        def fn(q, k, v):
            s = q @ k.transpose(-1, -2)
            return torch.exp(s - lse(s * 2)) @ v

        self.assert_left(fn, *qkv())

    def test_the_logsumexp_used_again(self):
        def fn(q, k, v):
            s = q @ k.transpose(-1, -2)
            total = lse(s)
            return torch.exp(s - total) @ v, total

        self.assert_left(fn, *qkv())

    def test_a_denominator_plus_a_tensor_wider_than_a_column(self):
        def fn(q, k, v, other):
            e = torch.exp(q @ k.transpose(-1, -2))
            return (e / (e.sum(-1, keepdim=True) + torch.exp(other))) @ v

        self.assert_left(fn, *qkv(), torch.randn(2, 3, 5, 5))

    def test_logaddexp_of_a_tensor_wider_than_a_column(self):
        def fn(q, k, v, other):
            s = q @ k.transpose(-1, -2)
            return torch.exp(s - torch.logaddexp(lse(s), other)) @ v

        self.assert_left(fn, *qkv(), torch.randn(2, 3, 5, 5))

    def test_a_quotient_over_another_dim(self):
        def fn(q, k, v):
            e = torch.exp(q @ k.transpose(-1, -2))
            return (e / e.sum(-2, keepdim=True)) @ v

        self.assert_left(fn, *qkv())

    def test_a_quotient_of_other_exponentials(self):
        def fn(q, k, v):
            s = q @ k.transpose(-1, -2)
            return (torch.exp(s) / torch.exp(s * 2).sum(-1, keepdim=True)) @ v

        self.assert_left(fn, *qkv())

    def test_the_exponential_of_a_log_softmax_widened(self):
        def fn(q, k, v):
            return torch.log_softmax(q @ k.transpose(-1, -2), -1, dtype=torch.float32).exp().to(v.dtype) @ v

        self.assert_left(fn, *(t.to(torch.bfloat16) for t in qkv()))

    def test_weights_that_meet_no_product(self):
        def fn(s):
            return torch.exp(s - lse(s)).sum(-1)

        self.assert_left(fn, torch.randn(2, 5, 7))

