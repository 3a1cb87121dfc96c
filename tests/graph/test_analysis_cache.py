"""The backend's analysis kept on disk (fuse_attn/analysis_cache.py): what its key answers to, the rewritten graph's
round trip, and what is never kept. (Two processes sharing it: tests/e2e/test_compile_cache.py.)"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from fuse_attn import analysis_cache
from fuse_attn.backend import _buffer_flags, _stored_or_analyzed, analyze_graph


class CausalAttention(torch.nn.Module):
    def __init__(self, length: int):
        super().__init__()
        self.register_buffer("keep", torch.ones(length, length, dtype=torch.bool).tril())

    def forward(self, q, k, v):
        w = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return torch.softmax(w.masked_fill(~self.keep, float("-inf")), -1) @ v


def _dynamo_graph(module, *inputs, dynamic=None):
    """Dynamo's graph of ``module`` and its example inputs, which placeholders are buffers noted on the graph as
    read in the backend (Dynamo drops the metadata that says so after the backend returns)."""
    captured = []

    def capture(gm, example_inputs, **_):
        gm.buffer_flags = _buffer_flags(gm)
        captured.append((gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(module, backend=capture, dynamic=dynamic)(*inputs)
    [(gm, example_inputs)] = captured
    return gm, example_inputs


def _inputs(length=17, requires_grad=False):
    return [torch.randn(1, 2, length, 16, requires_grad=requires_grad) for _ in range(3)]


def _key(gm, example_inputs, cuda_graphs=False, sources="sources"):
    return analysis_cache.analysis_key(gm, example_inputs, gm.buffer_flags, cuda_graphs=cuda_graphs, sources=sources)


@pytest.fixture
def cache_dir(monkeypatch):
    """The test's own directory of stored analyses (tests/conftest.py), the cache on."""
    monkeypatch.delenv("FUSE_ATTN_CACHE", raising=False)
    return Path(analysis_cache.directory())


def test_the_key_answers_to_the_graph_its_inputs_buffers_and_grad_mode(cache_dir):
    module = CausalAttention(17)
    gm, inputs = _dynamo_graph(module, *_inputs())
    key = _key(gm, inputs)
    assert key is not None and key == _key(*_dynamo_graph(module, *_inputs()))  # another trace of the same
    assert _key(*_dynamo_graph(CausalAttention(19), *_inputs(19))) != key  # other shapes
    with torch.no_grad():
        assert _key(gm, inputs) != key
    assert _key(gm, inputs, cuda_graphs=True) != key
    with sdpa_kernel([SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        assert _key(gm, inputs) != key  # one candidate fewer for the implementation choice
    changed = CausalAttention(17)
    changed.keep[0, 1] = True  # a buffer's values: the masks the rewrite evaluates
    assert _key(*_dynamo_graph(changed, *_inputs())) != key
    assert _key(gm, inputs, sources="other") != key


def test_nothing_is_kept_with_the_cache_off_or_symbolic_sizes(cache_dir, monkeypatch):
    gm, inputs = _dynamo_graph(CausalAttention(17), *_inputs())
    monkeypatch.setenv("FUSE_ATTN_CACHE", "0")
    assert _key(gm, inputs) is None
    monkeypatch.delenv("FUSE_ATTN_CACHE")

    assert _key(*_dynamo_graph(CausalAttention(17), *_inputs(), dynamic=True)) is None


def test_the_rewritten_graph_comes_back_as_it_was_and_is_compiled_so_in_both_processes(cache_dir):
    gm, inputs = _dynamo_graph(CausalAttention(17), *_inputs(requires_grad=True))
    rewritten, report = analyze_graph(gm, inputs, apply=True, buffers=gm.buffer_flags)
    key = _key(gm, inputs)
    compiled_here = analysis_cache.stored(key, rewritten, report)
    loaded, loaded_report = analysis_cache.load(key)
    assert loaded.code == rewritten.code == compiled_here.code
    assert loaded_report == report and [v.fused for v in loaded_report.verdicts] == [True]
    assert [n.meta.get("stack_trace") for n in loaded.graph.nodes] == [
        n.meta.get("stack_trace") for n in rewritten.graph.nodes]
    q, k, v = (x.detach() for x in inputs[:3])
    torch.testing.assert_close(loaded(q, k, v, *inputs[3:])[0], rewritten(q, k, v, *inputs[3:])[0])


class HeadBiasedAttention(torch.nn.Module):
    """A per-head bias written as a literal: the trace makes it a tensor constant of the graph."""

    def forward(self, q, k, v):
        w = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return torch.softmax(w + torch.tensor([0.5, -0.25]).view(1, 2, 1, 1), -1) @ v


class RotatedQueryAttention(torch.nn.Module):
    """Queries scaled by a table computed under ``torch.no_grad()``, as rotary embeddings are: the trace switches grad
    mode off and on around it (calls of ``torch._C._set_grad_enabled``), and computes the table under CPU autocast
    switched off (``_enter_autocast`` / ``_exit_autocast``)."""

    def forward(self, q, k, v):
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            table = torch.arange(q.shape[-2], dtype=q.dtype).cos()
        w = (q * table[:, None]) @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return torch.softmax(w, -1) @ v


@pytest.mark.parametrize("module, made_by_the_trace", [
    (HeadBiasedAttention(), {"get_attr"}),
    (RotatedQueryAttention(), {"_set_grad_enabled", "_enter_autocast", "_exit_autocast"}),
])
def test_a_graph_with_constants_and_mode_switches_comes_back_as_it_was(cache_dir, module, made_by_the_trace):
    gm, inputs = _dynamo_graph(module, *_inputs(requires_grad=True))
    rewritten, report = analyze_graph(gm, inputs, apply=True, buffers=gm.buffer_flags)
    assert made_by_the_trace <= {n.op if n.op == "get_attr" else getattr(n.target, "__name__", "")
                                 for n in rewritten.graph.nodes} and report.changed
    key = _key(gm, inputs)
    analysis_cache.stored(key, rewritten, report)
    loaded, _ = analysis_cache.load(key)
    assert loaded.code == rewritten.code
    torch.testing.assert_close(loaded(*inputs)[0], rewritten(*inputs)[0], rtol=0, atol=0)
    torch.testing.assert_close(loaded(*inputs)[0], gm(*inputs)[0])  # (Dynamo's graph, unfused)


def test_a_graph_calling_anything_but_operators_is_not_kept(cache_dir):
    gm, inputs = _dynamo_graph(CausalAttention(17), *_inputs())
    rewritten, report = analyze_graph(gm, inputs, apply=True, buffers=gm.buffer_flags)
    first = next(n for n in rewritten.graph.nodes if n.op == "call_function")
    with rewritten.graph.inserting_after(first):
        rewritten.graph.call_function(torch.nn.functional.relu, (first,))
    key = _key(gm, inputs)
    assert analysis_cache.stored(key, rewritten, report) is rewritten
    assert analysis_cache.load(key) is None and not cache_dir.exists()


def test_a_corrupt_entry_is_ignored_with_a_warning_and_replaced(cache_dir, caplog):
    gm, inputs = _dynamo_graph(CausalAttention(17), *_inputs())
    key = _key(gm, inputs)
    cache_dir.mkdir()
    (cache_dir / f"{key}.pickle").write_bytes(b"not a pickle")
    with caplog.at_level(logging.WARNING, logger="fuse_attn"):
        assert analysis_cache.load(key) is None
    assert "ignoring the stored analysis" in caplog.text
    rewritten, report = analyze_graph(gm, inputs, apply=True, buffers=gm.buffer_flags)
    analysis_cache.stored(key, rewritten, report)
    assert analysis_cache.load(key)[0].code == rewritten.code


def test_the_backend_loads_a_stored_analysis_instead_of_tracing(cache_dir, monkeypatch):
    gm, inputs = _dynamo_graph(CausalAttention(17), *_inputs())
    first, first_report = _stored_or_analyzed(gm, inputs, apply=True, context_parallel=None, cuda_graphs=False)
    import fuse_attn.backend as backend

    monkeypatch.setattr(backend, "analyze_graph", lambda *a, **k: pytest.fail("analysed again"))
    again, again_report = _stored_or_analyzed(gm, inputs, apply=True, context_parallel=None, cuda_graphs=False)
    assert again.code == first.code and again_report == first_report
