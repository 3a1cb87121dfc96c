"""End to end: ``torch.compile(model, backend="fuse_attn")`` on small modules, inference and training, CPU.

Numerics rule: ``max|ours - ref| <= 2 * max|eager - ref| + floor`` with ``ref`` the module in fp64 and ``eager``
the module run eagerly in the working dtype (tests/support/compiled_modules.py's ``compile_and_compare``; the
``target`` fixture, where the fused op runs: tests/conftest.py).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch._inductor.utils import fresh_cache, run_and_get_code

from fuse_attn.report import collect_reports

from examples.attention_forms import NanoGPTAttention, PaddedEncoderAttention, TinyGPT
from tests.support.compiled_modules import INTERPRETER_SESSION, CausalTril, compile_and_compare

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BiasedBmm(torch.nn.Module):
    """3-D bmm spelling with a learned relative bias (needs a gradient) added to the scores."""

    def __init__(self, heads=2, length=17):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(heads, length, length))

    def forward(self, q, k, v):
        B, H, T, D = q.shape
        w = torch.bmm(q.reshape(B * H, T, D) * D**-0.5, k.reshape(B * H, T, D).transpose(1, 2)).view(B, H, T, T)
        p = torch.softmax(w + self.bias, -1).view(B * H, T, T)
        return torch.bmm(p, v.reshape(B * H, T, D)).view(B, H, T, D)


class EinsumHeadsLast(torch.nn.Module):
    """einsum spellings on [B, T, H, D] tensors: the permutes are folded into the fused op's strides."""

    def forward(self, q, k, v):
        w = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
        return torch.einsum("bhqk,bkhd->bhqd", torch.softmax(w, dim=-1), v)


class LearnedAlibi(torch.nn.Module):
    """ALiBi written out: a learned per-head slope times the key-query distance from ``arange`` (the kernel
    computes the distance; only the [H] slopes are read, and get a gradient)."""

    def __init__(self, heads=2):
        super().__init__()
        self.slopes = torch.nn.Parameter(-torch.rand(heads))

    def forward(self, q, k, v):
        M, N = q.shape[-2], k.shape[-2]
        distance = (torch.arange(N, device=q.device)[None, :] - torch.arange(M, device=q.device)[:, None]).abs()
        w = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + self.slopes[:, None, None] * distance
        return torch.softmax(w, -1) @ v


class SlidingWindowSoftcap(torch.nn.Module):
    """A Mistral-style sliding window from index comparisons, a Gemma-2 style softcap and a clamp."""

    def forward(self, q, k, v):
        i = torch.arange(q.shape[-2], device=q.device)[:, None]
        j = torch.arange(k.shape[-2], device=q.device)[None, :]
        w = torch.tanh(q @ k.transpose(-1, -2) / 30.0) * 30.0
        w = w.clamp(min=-20.0).masked_fill((j > i) | (j <= i - 5), torch.finfo(q.dtype).min)
        return torch.softmax(w, -1) @ v


class DropoutWeights(torch.nn.Module):
    """Dropout on the attention weights, on in training only (as nanoGPT / Hugging Face write it)."""

    def __init__(self, p=0.2):
        super().__init__()
        self.p = p

    def forward(self, q, k, v):
        w = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, -1)
        return torch.nn.functional.dropout(w, p=self.p, training=self.training) @ v


class MultiheadBlock(torch.nn.Module):
    """``nn.MultiheadAttention`` as users call it (weights computed, then dropped by the caller)."""

    def __init__(self, width=32, heads=2):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(width, heads, batch_first=True)

    def forward(self, x, causal, padding):
        out, _ = self.attention(x, x, x, attn_mask=causal, key_padding_mask=padding)
        return out


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_nanogpt_attention(target, train):
    torch.manual_seed(0)
    device, dtype = target
    compile_and_compare(NanoGPTAttention(width=32, heads=2, block_size=32), [torch.randn(2, 17, 32)], train=train, device=device, dtype=dtype)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_causal_tril_odd_length(target, train):
    torch.manual_seed(1)
    device, dtype = target
    compile_and_compare(CausalTril(), [torch.randn(1, 2, 97, 16) for _ in range(3)], train=train, device=device, dtype=dtype)


def test_bias_gradient_through_bmm_spelling(target):
    torch.manual_seed(2)
    device, dtype = target
    compile_and_compare(BiasedBmm(), [torch.randn(2, 2, 17, 16) for _ in range(3)], train=True, device=device, dtype=dtype)


class LearnedTemperatureAndSoftcap(torch.nn.Module):
    """A learned temperature and softcap: 0-d parameters, read by the kernels as one-element score tensors."""

    def __init__(self):
        super().__init__()
        self.temperature = torch.nn.Parameter(torch.tensor(0.3))
        self.softcap = torch.nn.Parameter(torch.tensor(5.0))

    def forward(self, q, k, v):
        scores = q @ k.transpose(-1, -2) * self.temperature
        return torch.softmax(torch.tanh(scores / self.softcap) * self.softcap, -1) @ v


def test_learned_0d_temperature_and_softcap_get_their_gradients(target):
    torch.manual_seed(7)
    device, dtype = target
    compile_and_compare(LearnedTemperatureAndSoftcap(), [3 * torch.randn(2, 2, 17, 16) for _ in range(3)], train=True,
                        device=device, dtype=dtype)


def test_einsum_spelling(target):
    torch.manual_seed(6)
    device, dtype = target
    compile_and_compare(EinsumHeadsLast(), [torch.randn(2, 17, 3, 16) for _ in range(3)], train=True, device=device, dtype=dtype)


def test_learned_alibi_slopes_get_their_gradient(target):
    torch.manual_seed(7)
    device, dtype = target
    compile_and_compare(LearnedAlibi(), [torch.randn(2, 2, 17, 16) for _ in range(3)], train=True, device=device, dtype=dtype)


def test_sliding_window_softcap_and_clamp(target):
    torch.manual_seed(8)
    device, dtype = target
    compile_and_compare(SlidingWindowSoftcap(), [torch.randn(1, 2, 23, 16) for _ in range(3)], train=True, device=device, dtype=dtype)


def test_multihead_attention_module_with_masks(target):
    torch.manual_seed(9)
    device, dtype = target
    causal = torch.ones(11, 11, dtype=torch.bool).triu(1)
    padding = torch.zeros(2, 11, dtype=torch.bool)
    padding[1, 7:] = True
    compile_and_compare(MultiheadBlock(), [torch.randn(2, 11, 32), causal, padding], train=True, device=device, dtype=dtype)


def test_dropout_on_the_weights(target):
    """Training-mode dropout is fused (the kernels draw the keep-mask from a seed drawn per call). The mask
    differs from eager's, so training is checked in distribution. The query is one row repeated n times: each
    row of the output (and of dq) is then an independent draw (its own keep-mask row) whose mean is the eval-mode
    (no dropout) value, as both are linear in the mask scaled by 1 / (1 - p), whose mean is 1. The mean over the
    n draws is held to 6 standard errors estimated from the same draws (rows in one call: a handful of programs,
    cheap in the Triton interpreter)."""
    device, dtype = target
    torch.manual_seed(10)
    model = DropoutWeights(p=0.2)
    # eval mode: dropout is the identity; fused (dropout_p 0) and held to the 2x rule, output and gradients
    compile_and_compare(model.eval(), [torch.randn(2, 2, 7, 16), torch.randn(2, 2, 11, 16), torch.randn(2, 2, 11, 16)],
                        train=True, device=device, dtype=dtype)

    n = 96
    q1, k, v = (torch.randn(1, 2, length, 16, device=device, dtype=dtype) for length in (1, 11, 11))
    q = q1.repeat(1, 1, n, 1).requires_grad_(True)
    k.requires_grad_(True), v.requires_grad_(True)
    torch._dynamo.reset()
    compiled = torch.compile(model.train(), backend="fuse_attn")
    with collect_reports() as reports:
        compiled(q, k, v)
    verdicts = [v for r in reports for v in r.verdicts]
    assert [v.fused for v in verdicts] == [True], "\n".join(v.line() for v in verdicts)
    assert verdicts[0].spec.dropout_p == 0.2

    # torch.manual_seed governs the seed: the same seed, the same output; consecutive calls, other masks
    torch.manual_seed(123)
    out = compiled(q, k, v)
    torch.manual_seed(123)
    again = compiled(q, k, v)
    assert torch.equal(out, again)
    assert not torch.equal(again, compiled(q, k, v))

    dout1 = torch.randn_like(q1)
    grads = torch.autograd.grad(out, (q, k, v), dout1.expand_as(out))
    assert all(torch.isfinite(g).all() for g in grads)
    ref_in = [x.detach().requires_grad_(True) for x in (q1, k, v)]
    ref = model.eval()(*ref_in)
    (ref_dq,) = torch.autograd.grad(ref, ref_in[0], dout1)
    for name, draws, expected in (("out", out.detach(), ref.detach()), ("dq", grads[0], ref_dq)):
        mean, std_err = draws.mean(2, keepdim=True), draws.std(2, keepdim=True) / math.sqrt(n)
        assert (std_err > 0).all(), f"{name}: some elements do not vary over the draws"
        z = ((mean - expected).abs() / std_err).max().item()
        assert z <= 6, f"{name}: the mean over {n} draws is {z:.2f} standard errors from the eval-mode value"


def test_padding_mask_encoder_fp16_inference():
    torch.manual_seed(3)
    padding = torch.ones(2, 13)
    padding[1, 8:] = 0
    compile_and_compare(PaddedEncoderAttention(width=32, heads=2), [torch.randn(2, 13, 32), padding], train=False, dtype=torch.float16)


class UpcastScores(torch.nn.Module):
    """Mixed precision as some models write it: q and k upcast to fp32 for the scores and the softmax, the weights
    cast back to v's half precision for P @ V."""

    def forward(self, q, k, v):
        w = torch.matmul(q.float(), k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
        w = w.masked_fill(torch.ones(w.shape[-2:], dtype=torch.bool, device=w.device).triu(1), float("-inf"))
        return torch.softmax(w, -1, dtype=torch.float32).to(v.dtype) @ v


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_q_and_k_upcast_in_bf16_is_fused(device, monkeypatch):
    """The upcast pattern in bf16 runs the bf16 kernels (CPU: the blockwise path), output and gradients held to the
    2x rule against eager bf16 (which does the upcast)."""
    if device == "cuda" and (not torch.cuda.is_available() or INTERPRETER_SESSION):
        pytest.skip("needs a GPU and TRITON_INTERPRET=0")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    torch.manual_seed(12)
    compile_and_compare(UpcastScores(), [torch.randn(2, 2, 33, 16) for _ in range(3)], train=True, device=device,
                        dtype=torch.bfloat16)


def test_two_layer_model_fuses_every_layer(target):
    torch.manual_seed(4)
    device, dtype = target
    if device == "cpu" and os.environ["TRITON_INTERPRET"] == "1":
        pytest.skip("covered by the blockwise path on a CPU; the interpreter runs the same kernels above")
    model = TinyGPT(vocab=64, width=32, heads=2, layers=2, block_size=16)
    compile_and_compare(model, [torch.randint(0, 64, (2, 16))], train=True, device=device, dtype=dtype, expect_fused=2)


def test_weights_returned_are_not_fused_and_still_right():
    torch.manual_seed(5)
    padding = torch.ones(2, 9)
    model = PaddedEncoderAttention(width=32, heads=2, return_weights=True)
    torch._dynamo.reset()
    with collect_reports() as reports:
        out, weights = torch.compile(model, backend="fuse_attn")(torch.randn(2, 9, 32), padding)
    assert [v.fused for r in reports for v in r.verdicts] == [False]
    assert "used by" in reports[0].verdicts[0].reason


def test_options_disable_and_log_only():
    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))
    for options, expect_call in (({}, True), ({"fuse_attn.enabled": False}, False), ({"fuse_attn.log_only": True}, False)):
        torch._dynamo.reset()
        with collect_reports() as reports:
            out, code = run_and_get_code(torch.compile(CausalTril(), backend="fuse_attn", options=options), q, k, v)
        assert ("fuse_attn.flash_attention" in "\n".join(code)) == expect_call, options
        assert len(reports) == (0 if options.get("fuse_attn.enabled") is False else 1), options
        torch.testing.assert_close(out, CausalTril()(q, k, v))


def test_fx_graph_cache_hit_still_calls_the_op():
    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))
    with fresh_cache():
        for _ in range(2):  # the second compile is served from Inductor's FX graph cache
            torch._dynamo.reset()
            out, code = run_and_get_code(torch.compile(CausalTril(), backend="fuse_attn"), q, k, v)
            assert "fuse_attn.flash_attention" in "\n".join(code)
            torch.testing.assert_close(out, CausalTril()(q, k, v))


def compile_once() -> tuple[int, int]:
    """Compile a causal attention afresh: (FX graph cache hits, misses)."""
    from torch._dynamo.utils import counters

    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))
    torch._dynamo.reset()
    counters.clear()
    torch.compile(CausalTril(), backend="fuse_attn")(q, k, v)
    return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]


def test_changed_sources_miss_the_fx_graph_cache(monkeypatch):
    import fuse_attn.backend

    with fresh_cache():
        assert compile_once() == (0, 1)
        assert compile_once() == (1, 0)
        monkeypatch.setattr(fuse_attn.backend, "source_digest", lambda: "a changed kernel or matcher")
        assert compile_once() == (0, 1)


def test_changed_settings_miss_the_fx_graph_cache(monkeypatch):
    # FUSE_ATTN_* settings change what the ops trace on CUDA (here: the per-call tile summaries of a mask), not the
    # rewritten graph; a graph compiled under other settings must not be served from the cache
    monkeypatch.delenv("FUSE_ATTN_MASK_BLOCKS", raising=False)
    with fresh_cache():
        assert compile_once() == (0, 1)
        monkeypatch.setenv("FUSE_ATTN_MASK_BLOCKS", "0")
        assert compile_once() == (0, 1)
        assert compile_once() == (1, 0)
        monkeypatch.delenv("FUSE_ATTN_MASK_BLOCKS")
        assert compile_once() == (1, 0)


def test_another_cache_directory_hits_the_fx_graph_cache(monkeypatch, tmp_path):
    # where fuse_attn's caches live is no setting of the compiled code: a process with a directory of its own (a
    # test session, a benchmark's subprocess) is served Inductor's entries like any other
    with fresh_cache():
        monkeypatch.setenv("FUSE_ATTN_CACHE_DIR", str(tmp_path / "one"))
        assert compile_once() == (0, 1)
        monkeypatch.setenv("FUSE_ATTN_CACHE_DIR", str(tmp_path / "another"))
        assert compile_once() == (1, 0)


def run_fresh_python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd="/").stdout


def test_backend_registered_through_entry_point_without_import():
    out = run_fresh_python(
        "import sys, torch._dynamo\n"
        "assert 'fuse_attn' not in sys.modules\n"
        "print('fuse_attn' in torch._dynamo.list_backends())"
    )
    assert out.strip() == "True"


def test_no_generic_top_level_module_is_installed():
    # Only fuse_attn is installed: a top-level `kernels` (a PyPI package transformers probes for) or `tools` would
    # shadow or clash with other projects' modules.
    out = run_fresh_python("import importlib.util, fuse_attn.kernels, fuse_attn.dump_graph\n"
                           "print([importlib.util.find_spec(name) for name in ('kernels', 'tools')])")
    assert out.strip() == "[None, None]"


def test_dump_graph_prints_rewrites_and_reasons():
    # the installed command (its sys.path[0] is its own directory, not the current one), then the checkout's module
    command = shutil.which("fuse-attn-dump-graph", path=os.path.dirname(sys.executable))
    assert command, "fuse-attn-dump-graph is not installed next to this python (pip install -e .)"
    result = subprocess.run(
        [command, "examples.attention_forms:padded_encoder_returning_weights"],
        check=True, capture_output=True, text=True, cwd=REPO,
    )
    assert "--- before ---" in result.stdout and "--- after ---" in result.stdout
    assert "not fused" in result.stdout and "used by" in result.stdout
    fused = subprocess.run(
        [sys.executable, "-m", "tools.dump_graph", "examples.attention_forms:nanogpt_block", "--kernel-source", "--no-graphs"],
        check=True, capture_output=True, text=True, cwd=REPO,
    )
    assert "fused softmax" in fused.stdout and "causal" in fused.stdout and "@triton.jit" in fused.stdout


def test_dynamic_lengths_compile_once_with_the_sliced_buffer_as_a_band(monkeypatch):
    """With symbolic lengths the sliced mask cannot be evaluated at its size; its buffer is, at full size, and its
    top-left corners are the same causal band for every length."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    model = NanoGPTAttention(width=32, heads=2, block_size=32)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="fuse_attn", dynamic=True)
    with collect_reports() as reports:
        for length in (9, 13, 20):
            x = torch.randn(2, length, 32)
            torch.testing.assert_close(compiled(x), model(x))
    assert len(reports) == 1
    assert [v.spec.describe() for v in reports[0].verdicts] == ["float32 D=16 scale=0.25 causal(top_left, diagonal=0)"]


def test_symbolic_head_dim_and_lengths_compile_once(monkeypatch):
    """``dynamic=True`` makes every size symbolic, the head dim too: the scale ``D ** -0.5`` is kept as a power of
    the run-time head dim, the arange causal mask is computed in the kernel."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")

    def attention(q, k, v):
        M, N = q.shape[-2], k.shape[-2]
        future = torch.arange(N)[None, :] > torch.arange(M)[:, None]
        w = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).masked_fill(future, float("-inf"))
        return torch.softmax(w, -1) @ v

    torch._dynamo.reset()
    compiled = torch.compile(attention, backend="fuse_attn", dynamic=True)
    with collect_reports() as reports:
        for length, dim in ((9, 16), (13, 8), (20, 32)):
            q, k, v = (torch.randn(2, 3, length, dim) for _ in range(3))
            torch.testing.assert_close(compiled(q, k, v), attention(q, k, v))
    assert len(reports) == 1 and [v.fused for v in reports[0].verdicts] == [True]


class ScaledGradient(torch.autograd.Function):
    """Identity forward, doubled backward: a custom backward that is not the derivative of the forward."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad


class AttentionAfterCustomFunction(torch.nn.Module):
    def forward(self, q, k, v):
        return CausalTril()(ScaledGradient.apply(q), k, v)


def test_custom_autograd_function_keeps_its_backward_in_training(monkeypatch):
    """The attention after a custom Function is fused, and the Function's own (doubled) backward still runs: its
    call stays one node of the traced graph, with its two bodies."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = (torch.randn(1, 2, 9, 16, requires_grad=True) for _ in range(3))
    torch._dynamo.reset()
    with collect_reports() as reports:
        out = torch.compile(AttentionAfterCustomFunction(), backend="fuse_attn")(q, k, v)
    (ours,) = torch.autograd.grad(out.sum(), q)
    (expected,) = torch.autograd.grad(AttentionAfterCustomFunction()(q, k, v).sum(), q)
    torch.testing.assert_close(ours, expected)
    assert [v.fused for r in reports for v in r.verdicts] == [True]
    with torch.no_grad(), collect_reports() as reports:
        torch._dynamo.reset()
        torch.compile(AttentionAfterCustomFunction(), backend="fuse_attn")(q, k, v)
    assert [v.fused for r in reports for v in r.verdicts] == [True]


def test_explain_names_what_is_fused_and_why_not():
    import fuse_attn

    report = fuse_attn.explain(PaddedEncoderAttention(width=32, heads=2, return_weights=True), torch.randn(2, 9, 32), torch.ones(2, 9))
    assert len(report.fused) == 0 and len(report.not_fused) == 1
    assert "used by" in report.not_fused[0].reason and "softmax" in str(report)
    report = fuse_attn.explain(TinyGPT(vocab=64, width=32, heads=2, layers=3, block_size=16), torch.randint(0, 64, (1, 16)))
    assert [v.spec.causal is not None for v in report.fused] == [True, True, True]


def _saved_shapes(fn, x):
    """Shapes of every tensor autograd saves for the backward while ``fn(x)`` runs (compiled graphs save through
    their autograd.Function, so the hooks see them too)."""
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x).sum().backward()
    return shapes


def test_backward_saves_no_score_sized_tensor(monkeypatch):
    """What a fused training step keeps for its backward grows linearly in the sequence length: no saved tensor has
    both a query and a key axis of length T (eager saves its [B, H, T, T] softmax output; checked too, so the test
    can tell them apart)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    T = 48  # longer than the width (32), so a [*, T, T] tensor is told apart from activations [B, T, width]
    model = NanoGPTAttention(width=32, heads=2, block_size=T)
    x = torch.randn(2, T, 32, requires_grad=True)

    def score_sized(shapes):
        return [s for s in shapes if len(s) >= 2 and s[-1] == T and s[-2] == T]

    assert score_sized(_saved_shapes(model, x)), "eager saves its softmax output"
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="fuse_attn")
    compiled(x)  # compile outside the hooks
    shapes = _saved_shapes(compiled, x)
    assert shapes and not score_sized(shapes), shapes
