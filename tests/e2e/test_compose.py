"""The backend composed with the rest of torch.compile: ``fullgraph=True``, activation checkpointing, autocast,
``no_grad`` / ``inference_mode``, ``mode="max-autotune"`` and ``mode="reduce-overhead"`` (CUDA graphs). Each: the
attention is fused and the results hold the 2x rule against fp64 (tests/support/compiled_modules.py's helpers).

The CUDA graph tests need a GPU: ``TRITON_INTERPRET=0 python -m pytest -q tests/e2e/test_compose.py -k cuda``.
"""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code
from torch.utils.checkpoint import checkpoint

from fuse_attn.kernels import tuning
from fuse_attn.report import collect_reports
from fuse_attn.spec import AttentionSpec

from examples.attention_forms import NanoGPTAttention
from tests.support.compiled_modules import INTERPRETER_SESSION, compile_and_compare, compiled_kernels_or_blockwise
from tests.support.numerics import check_close
from tests.support.tuning import CANDIDATES, FASTEST, key, new_process

fa = importlib.import_module("fuse_attn.kernels.ops")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETER_SESSION, reason="needs a GPU and TRITON_INTERPRET=0")


class Checkpointed(torch.nn.Module):
    """A module wrapped in ``torch.utils.checkpoint`` (non-reentrant), as large-model training wraps its blocks."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        return checkpoint(self.inner, *args, use_reentrant=False)


def test_activation_checkpointing_fuses_inside_the_region(target):
    """The attention inside a checkpointed region is fused (its causal buffer mask recognized), outputs and
    gradients are right, and on the blockwise path the fused forward really runs again in the backward."""
    device, dtype = compiled_kernels_or_blockwise(target)
    torch.manual_seed(0)
    model = Checkpointed(NanoGPTAttention(width=32, heads=2, block_size=32))
    compile_and_compare(model, [torch.randn(2, 16, 32)], train=True, device=device, dtype=dtype)
    if device != "cpu":
        return
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return blockwise_forward(*args, **kwargs)

    blockwise_forward = fa.blockwise_forward
    x = torch.randn(2, 16, 32, requires_grad=True)
    torch._dynamo.reset()
    with collect_reports() as reports, pytest.MonkeyPatch.context() as mp:
        mp.setattr(fa, "blockwise_forward", counted)
        out = torch.compile(model, backend="fuse_attn")(x)
        forward_calls = len(calls)
        out.sum().backward()
    assert [v.spec.causal is not None for r in reports for v in r.fused] == [True]
    assert (forward_calls, len(calls)) == (1, 2), "the region's attention runs again in the backward"


class DropoutAttention(torch.nn.Module):
    def forward(self, q, k, v):
        weights = torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1)
        return torch.nn.functional.dropout(weights, 0.3, training=True) @ v


def test_dropout_inside_a_checkpointed_region_recomputes_its_mask(target):
    """The backward recomputes the region's forward, which must drop the same weights. With v the identity the
    output is the dropped, rescaled weights themselves, so it shows the keep-mask the forward used; output and
    gradients must be those of attention with that mask (2x rule against fp64)."""
    device, dtype = compiled_kernels_or_blockwise(target)
    torch.manual_seed(7)
    q, k = (torch.randn(1, 2, 13, 16, device=device, dtype=dtype) for _ in range(2))
    v = torch.eye(13, 16, device=device, dtype=dtype).expand(1, 2, 13, 16).contiguous()
    torch._dynamo.reset()
    ours_in = [t.clone().requires_grad_(True) for t in (q, k, v)]
    with collect_reports() as reports:
        out = torch.compile(Checkpointed(DropoutAttention()), backend="fuse_attn")(*ours_in)
    assert [v.spec.dropout_p for r in reports for v in r.fused] == [0.3]
    keep = out.detach()[..., :13] != 0  # out[..., j] is key j's weight (13 keys: none near underflow)
    assert 0 < keep.sum() < keep.numel()
    grad = torch.randn_like(out)
    ours = (out, *torch.autograd.grad(out, ours_in, grad))

    def with_the_mask(inputs):
        q, k, v = inputs
        weights = torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1)
        out = (weights * keep / 0.7) @ v
        return (out, *torch.autograd.grad(out, inputs, grad.to(out.dtype)))

    eager = with_the_mask([t.clone().requires_grad_(True) for t in (q, k, v)])
    ref = with_the_mask([t.double().requires_grad_(True) for t in (q, k, v)])
    for name, o, e, r in zip(("output", "dq", "dk", "dv"), ours, eager, ref):
        check_close(o, e, r, dtype, name)


def test_softmax_outside_the_checkpointed_regions_is_reported():
    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inside, self.outside = NanoGPTAttention(32, 2, 16), NanoGPTAttention(32, 2, 16)

        def forward(self, x):
            return self.outside(checkpoint(self.inside, x, use_reentrant=False))  # one region, one softmax outside

    model, x = Mixed(), torch.randn(2, 16, 32)
    torch._dynamo.reset()
    with collect_reports() as reports:
        out = torch.compile(model, backend="fuse_attn")(x)
    torch.testing.assert_close(out, model(x))
    verdicts = [v for r in reports for v in r.verdicts]
    assert [v.fused for v in verdicts] == [True, False]
    assert "outside the activation-checkpointed regions" in verdicts[1].reason


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_fp32_model_under_bf16_autocast(target, train):
    """Autocast makes q, k, v bf16 (the linear layers run in bf16): the attention is fused as a bf16 attention and
    held to the 2x rule of eager under the same autocast, against the fp64 model."""
    device, _ = target
    torch.manual_seed(1)
    model = NanoGPTAttention(width=32, heads=2, block_size=32).to(device)
    ref_model = copy.deepcopy(model).double()
    x = torch.randn(2, 17, 32, device=device)
    ours_in, eager_in, ref_in = (x.detach().to(dt, copy=True).requires_grad_(train) for dt in (torch.float32, torch.float32, torch.float64))
    ours_model = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(ours_model, backend="fuse_attn")
    with torch.set_grad_enabled(train), torch.autocast(device, dtype=torch.bfloat16):
        with collect_reports() as reports:
            ours = compiled(ours_in)
        eager = model(eager_in)
    ref = ref_model(ref_in)
    assert [v.spec.dtype for r in reports for v in r.verdicts if v.fused] == ["bfloat16"]
    check_close(ours, eager, ref, torch.bfloat16, "output")
    if train:
        grad = torch.randn_like(ref)
        for out in (ours, eager, ref):
            out.backward(grad.to(out.dtype))
        check_close(ours_in.grad, eager_in.grad, ref_in.grad, torch.bfloat16, "grad of x")
        for (name, o), e, r in zip(ours_model.named_parameters(), model.parameters(), ref_model.parameters()):
            check_close(o.grad, e.grad, r.grad, torch.bfloat16, f"grad of {name}")


def test_no_grad_and_inference_mode(target):
    """Parameters that require grad, called under ``no_grad`` and under ``inference_mode`` (each its own graph:
    Dynamo guards on the grad mode): fused both times, no autograd graph built, results right."""
    device, dtype = compiled_kernels_or_blockwise(target)
    torch.manual_seed(2)
    model = NanoGPTAttention(width=32, heads=2, block_size=32).to(device, dtype)
    ref_model = copy.deepcopy(model).double()
    x = torch.randn(2, 17, 32, device=device, dtype=dtype)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="fuse_attn")
    with collect_reports() as reports:
        with torch.no_grad():
            under_no_grad = compiled(x)
            eager = model(x)
            ref = ref_model(x.double())
        with torch.inference_mode():
            under_inference_mode = compiled(x)
    assert under_no_grad.grad_fn is None and under_inference_mode.is_inference()
    assert [[v.fused for v in r.verdicts] for r in reports] == [[True], [True]]
    for out, what in ((under_no_grad, "no_grad"), (under_inference_mode, "inference_mode")):
        check_close(out, eager, ref, dtype, what)


def test_fullgraph(target):
    """``fullgraph=True``: the rewrite adds no graph break (one graph, the attention fused)."""
    device, dtype = compiled_kernels_or_blockwise(target)
    torch.manual_seed(3)
    model = NanoGPTAttention(width=32, heads=2, block_size=32).to(device, dtype)
    x = torch.randn(2, 17, 32, device=device, dtype=dtype, requires_grad=True)
    torch._dynamo.reset()
    with collect_reports() as reports:
        out = torch.compile(model, backend="fuse_attn", fullgraph=True)(x)
    out.sum().backward()
    assert [[v.fused for v in r.verdicts] for r in reports] == [[True]]
    check_close(out, model(x), copy.deepcopy(model).double()(x.double()), dtype, "output")


def test_max_autotune_keeps_the_fused_op(target):
    """``mode="max-autotune"`` (Inductor tunes its own GEMMs; on a GPU it also enables CUDA graphs): the fused
    op is still called, outputs and gradients right."""
    device, dtype = compiled_kernels_or_blockwise(target)
    torch.manual_seed(4)
    model = NanoGPTAttention(width=32, heads=2, block_size=32).to(device, dtype)
    x = torch.randn(2, 17, 32, device=device, dtype=dtype, requires_grad=True)
    torch._dynamo.reset()
    with collect_reports() as reports:
        out, code = run_and_get_code(torch.compile(model, backend="fuse_attn", mode="max-autotune"), x)
    # on a GPU Inductor's code holds and launches the generated kernels; on a CPU it calls the CPU op
    assert ("def _attn_fwd(" if device == "cuda" else "fuse_attn.flash_attention_cpu") in "\n".join(code)
    assert [[v.fused for v in r.verdicts] for r in reports] == [[True]]
    ref_model = copy.deepcopy(model).double()
    x64 = x.detach().double().requires_grad_(True)
    ref, eager = ref_model(x64), model(x)
    check_close(out, eager, ref, dtype, "output")
    grad = torch.randn_like(ref)
    (ours_dx,) = torch.autograd.grad(out, x, grad.to(dtype))
    (eager_dx,) = torch.autograd.grad(eager, x, grad.to(dtype))
    (ref_dx,) = torch.autograd.grad(ref, x64, grad)
    check_close(ours_dx, eager_dx, ref_dx, dtype, "grad of x")


# ---- CUDA graphs ---------------------------------------------------------------------------------------------------
def test_tuning_never_runs_inside_a_cuda_graph_capture(machine, monkeypatch):
    """A key first met during a capture launches nothing and times nothing (either would be recorded or would
    break the capture): the stored config if any, else the first candidate, not remembered, so the next call
    outside a capture tunes."""
    capturing = [True]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    launched = []

    def launch(cfg):
        launched.append(cfg)

    k = key()
    assert tuning.tune(k, CANDIDATES, launch) == CANDIDATES[0]
    assert launched == [] and machine.timed == [] and tuning.cached(k) is None
    capturing[0] = False
    assert tuning.tune(k, CANDIDATES, launch) == FASTEST  # tuned (and stored) outside the capture
    assert machine.timed == CANDIDATES
    new_process(monkeypatch)
    capturing[0] = True
    assert tuning.tune(k, CANDIDATES, launch) == FASTEST  # a stored config is used inside a capture too
    assert machine.timed == CANDIDATES and tuning.cached(k) == FASTEST


@pytest.fixture
def untuned(monkeypatch):
    """No tuned config in memory or on disk: the next launches tune."""
    monkeypatch.setattr(tuning, "_chosen", {})
    monkeypatch.setenv("FUSE_ATTN_CACHE", "0")


@needs_cuda
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_cuda_graphs_training_step(untuned, monkeypatch, mode):
    """Inductor's CUDA graph modes, in training, with the tuner starting empty: CUDA graph trees run each new
    shape once before recording it, so every key is tuned there and none is first met inside a capture; the
    graphs are recorded (nothing skipped) and replayed with new inputs, outputs and gradients right, at two
    lengths in two tuning buckets under reduce-overhead (a recompile and a new recording), one under max-autotune
    (whose own GEMM tuning is slow)."""
    met_in_capture = []
    untimed = tuning._untimed_for_now

    def untimed_noting_captures(key, candidates):
        if tuning._capturing():
            met_in_capture.append(key)
        return untimed(key, candidates)

    monkeypatch.setattr(tuning, "_untimed_for_now", untimed_noting_captures)
    torch.manual_seed(5)
    dtype = torch.bfloat16
    model = NanoGPTAttention(width=128, heads=2, block_size=256).to("cuda", dtype)
    ref_model = copy.deepcopy(model).double()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="fuse_attn", mode=mode)
    lengths = (100, 100, 100, 200, 200, 200) if mode == "reduce-overhead" else (100, 100, 100)
    with collect_reports() as reports:
        for length in lengths:
            x = torch.randn(2, length, 128, device="cuda", dtype=dtype, requires_grad=True)
            x64 = x.detach().double().requires_grad_(True)
            out = compiled(x)
            eager, ref = model(x), ref_model(x64)
            check_close(out, eager, ref, dtype, f"output at length {length}")
            grad = torch.randn_like(ref)
            (ours_dx,) = torch.autograd.grad(out, x, grad.to(dtype))
            (eager_dx,) = torch.autograd.grad(eager, x, grad.to(dtype))
            (ref_dx,) = torch.autograd.grad(ref, x64, grad)
            check_close(ours_dx, eager_dx, ref_dx, dtype, f"grad of x at length {length}")
    assert reports and all(v.fused for r in reports for v in r.verdicts)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert tuning.chosen_configs() and met_in_capture == []


@needs_cuda
def test_op_captured_in_a_cuda_graph_by_hand(untuned):
    """``torch.cuda.graph`` around the fused op, warmed up at another tuning bucket only (so the captured launch
    meets an untuned key): the capture succeeds and replays right on new inputs, forward and backward."""
    torch.manual_seed(6)
    dtype = torch.bfloat16
    spec = AttentionSpec(dtype="bfloat16", head_dim=64, head_dim_v=64, scale=0.125)

    def inputs(length):
        return [torch.randn(1, 2, length, 64, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3)]

    def step(q, k, v, dout):
        out = fa.flash_attention(q, k, v, spec)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    warm = inputs(40)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as torch.cuda.graph's documentation asks
        step(*warm, torch.randn_like(warm[0]))
    torch.cuda.current_stream().wait_stream(stream)
    static = inputs(300)
    static_dout = torch.randn_like(static[0])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_results = step(*static, static_dout)
    fresh = inputs(300)
    fresh_dout = torch.randn_like(fresh[0])
    with torch.no_grad():
        for s, f in zip((*static, static_dout), (*fresh, fresh_dout)):
            s.copy_(f)
    graph.replay()
    fresh64 = [t.detach().double().requires_grad_(True) for t in fresh]
    eager = step_eager(fresh, fresh_dout, spec)
    reference = step_eager(fresh64, fresh_dout.double(), spec)
    for name, ours, e, r in zip(("out", "dq", "dk", "dv"), static_results, eager, reference):
        check_close(ours, e, r, dtype, name)


def step_eager(qkv, dout, spec):
    """Eager attention as the spec defines it (in the inputs' dtype) and its gradients."""
    q, k, v = qkv
    w = torch.softmax((q @ k.transpose(-1, -2)) * spec.scale, -1)
    out = w @ v
    return (out, *torch.autograd.grad(out, (q, k, v), dout))
