"""Many models compiled in one process -- a notebook, a sweep, a train model and its eval copy, a teacher and a
student -- with Dynamo never reset between them.

Once a float attribute has a new value in a later model (``rms_norm_eps``, an attention's ``scaling``, a softcap),
Dynamo stops specializing it: it becomes a 0-d tensor input read with ``.item()``. Every attention still runs fused,
every time: a float read only by other ops passes through, and a scale or softcap becomes a run-time argument of the
kernels, so one compiled graph serves every later value. "Fused" is counted where the attention runs (the blockwise
path's calls on a CPU, the kernels' launches on a GPU), since a model that reuses a compiled graph triggers no new
report. Each test resets Dynamo once at its start, not between its models.
"""

from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch

import fuse_attn
from fuse_attn.kernels import ops
from fuse_attn.report import collect_reports

from tests.support.compiled_modules import compiled_kernels_or_blockwise
from tests.support.numerics import check_close

LAYERS = 2


class ScaledAttention(torch.nn.Module):
    """Self-attention whose scale (and softcap, Gemma-2 style: ``tanh(s / cap) * cap``) are float attributes."""

    def __init__(self, scaling: float, softcap: float | None = None, heads: int = 2, dim: int = 8):
        super().__init__()
        self.scaling, self.softcap, self.heads, self.dim = scaling, softcap, heads, dim
        self.qkv = torch.nn.Linear(heads * dim, 3 * heads * dim)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.dim).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) * self.scaling
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        return torch.softmax(scores, dim=-1) @ v


def _llama(eps: float):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                                      num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=eps,
                                      max_position_embeddings=64, attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


@contextlib.contextmanager
def fused_runs(device: str, monkeypatch):
    """Counts the attentions that run fused inside the block: the blockwise path's forward calls on a CPU, the
    generated forward kernel's launches on a GPU (read from the profiler)."""
    count = [0]
    if device == "cpu":
        def counting(*args, **kwargs):
            count[0] += 1
            return blockwise_forward(*args, **kwargs)

        blockwise_forward = ops.blockwise_forward
        monkeypatch.setattr(ops, "blockwise_forward", counting)
        try:
            yield count
        finally:
            monkeypatch.setattr(ops, "blockwise_forward", blockwise_forward)
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        yield count
        torch.cuda.synchronize()
    count[0] = sum(1 for e in prof.events() if e.name.startswith("_attn_fwd"))


def _every_attention_fused(reports, expected_per_graph: int):
    for report in reports:
        lines = "\n".join(v.line() for v in report.verdicts)
        assert len(report.fused) == expected_per_graph and not report.not_fused, lines


def _run(model, inputs, train: bool, output=lambda out: out):
    with torch.set_grad_enabled(train):
        out = output(model(*inputs))
        if train:
            out.float().square().mean().backward()
    return out


def _compile_sequence(models, inputs, *, train, target, monkeypatch, attentions, output=lambda out: out):
    """Compiles each model in turn with the backend, in this process; each must run every attention fused, give
    eager's numbers (2x rule: output and, trained, every parameter's gradient) and be explained the same way.
    ``inputs(device, dtype)``: the models' inputs."""
    device, dtype = compiled_kernels_or_blockwise(target)
    torch._dynamo.reset()
    for i, model in enumerate(models):
        ref_model = copy.deepcopy(model).to(device, torch.float64)
        eager_model = copy.deepcopy(model).to(device, dtype)
        ours_model = copy.deepcopy(model).to(device, dtype)
        compiled = torch.compile(ours_model, backend="fuse_attn")
        with collect_reports() as reports:
            out = _run(compiled, inputs(device, dtype), train, output)
        _every_attention_fused(reports, attentions)
        eager = _run(eager_model, inputs(device, dtype), train, output)
        ref = _run(ref_model, inputs(device, torch.float64), train, output)
        check_close(out, eager, ref, dtype, f"model {i}: output")
        if train:
            for (name, r), o, e in zip(ref_model.named_parameters(), ours_model.parameters(), eager_model.parameters()):
                check_close(o.grad, e.grad, r.grad, dtype, f"model {i}: grad of {name}")
        # counted on a second call: the first one's compile also launches the kernels while tuning them
        with fused_runs(device, monkeypatch) as runs:
            _run(compiled, inputs(device, dtype), train, output)
        assert runs[0] == attentions, f"model {i}: {runs[0]} of {attentions} attentions ran fused"
        explained = fuse_attn.explain(ours_model, *inputs(device, dtype))
        assert len(explained.fused) == attentions and not explained.not_fused, str(explained)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_llama_configs_differing_in_rms_norm_eps(target, train, monkeypatch):
    """Three LLaMA configs that differ only in ``rms_norm_eps``: from the second on, the eps is a graph input."""
    ids = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(0))
    _compile_sequence([_llama(eps) for eps in (1e-5, 1e-6, 1e-4)], lambda device, dtype: [ids.to(device)],
                      train=train, target=target, monkeypatch=monkeypatch, attentions=LAYERS,
                      output=lambda out: out.logits)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_a_scale_attribute_that_changes_between_instances(target, train, monkeypatch):
    """The attention's own scale lifted to an input: the kernels read it at run time (a third value reuses the
    second's compiled graph)."""
    x = torch.randn(2, 17, 16, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    models = [ScaledAttention(s) for s in (0.3, 1 / math.sqrt(8), 0.9)]
    _compile_sequence(models, lambda device, dtype: [x.to(device, dtype)], train=train, target=target,
                      monkeypatch=monkeypatch, attentions=1)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_a_softcap_attribute_that_changes_between_instances(target, train, monkeypatch):
    x = 3 * torch.randn(2, 17, 16, generator=torch.Generator().manual_seed(0))  # scores reaching the cap
    torch.manual_seed(0)
    models = [ScaledAttention(0.35, softcap=c) for c in (5.0, 2.0, 1.0)]
    _compile_sequence(models, lambda device, dtype: [x.to(device, dtype)], train=train, target=target,
                      monkeypatch=monkeypatch, attentions=1)


@pytest.mark.parametrize("scaling", [0.0, float("inf"), float("nan")], ids=["zero", "inf", "nan"])
def test_a_lifted_scale_of_zero_or_not_finite_gives_eagers_answer(target, scaling, monkeypatch):
    """After a finite scale, 0 gives eager's uniform weights; inf and NaN give eager's answer (NaN rows): Dynamo
    specializes a float that is not finite, which the rewrite then leaves unfused with a reason."""
    device, dtype = compiled_kernels_or_blockwise(target)
    x = torch.randn(2, 17, 16, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    torch._dynamo.reset()
    torch.manual_seed(0)
    first, second = ScaledAttention(0.3).to(device, dtype), ScaledAttention(scaling).to(device, dtype)
    second.load_state_dict(first.state_dict())
    torch.compile(first, backend="fuse_attn")(x)
    with torch.no_grad():
        ours = torch.compile(second, backend="fuse_attn")(x)
        eager = second(x)
    assert torch.equal(ours.isnan(), eager.isnan())
    finite = ~eager.isnan()
    torch.testing.assert_close(ours[finite], eager[finite], atol=2e-2 if dtype == torch.bfloat16 else 1e-5, rtol=0)


def test_explain_called_past_dynamos_recompile_limit_leaves_compiling_intact(monkeypatch):
    """``explain()`` shares one backend across calls: called more often than Dynamo's recompile limit (8 graphs a
    function), it neither stops reporting nor leaves the model to run uncompiled when it is compiled afterwards."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the blockwise path, whose calls fused_runs counts
    torch._dynamo.reset()
    x = torch.randn(2, 17, 16)
    model = ScaledAttention(0.3)
    for _ in range(torch._dynamo.config.recompile_limit + 2):
        assert len(fuse_attn.explain(model, x).fused) == 1
    with fused_runs("cpu", monkeypatch) as runs:
        torch.compile(model, backend="fuse_attn")(x)
    assert runs[0] == 1


def test_a_graph_that_cannot_be_traced_reports_each_softmax_in_one_line(monkeypatch, caplog):
    """A graph the backend cannot trace compiles unfused with a reason on each softmax: one WARNING line, no
    traceback, and explain() lists the same reason."""
    import fuse_attn.backend as backend
    from fuse_attn.report import reset_unfused_warnings

    def failing_trace(*args, **kwargs):
        raise RuntimeError("tracing failed here\nsecond line")

    monkeypatch.setattr(backend, "trace_pre_autograd", failing_trace)
    reset_unfused_warnings()
    torch._dynamo.reset()
    x = torch.randn(2, 17, 16)
    model = ScaledAttention(0.3)
    with caplog.at_level("WARNING", logger="fuse_attn"), collect_reports() as reports:
        torch.testing.assert_close(torch.compile(model, backend="fuse_attn")(x), model(x))
    [report] = reports
    [verdict] = report.not_fused
    assert "could not be traced or rewritten (RuntimeError: tracing failed here)" in verdict.reason
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].exc_info is None and "\n" not in warnings[0].getMessage()
    assert [v.reason for v in fuse_attn.explain(model, x).not_fused] == [verdict.reason]


def _fused_every_call(calls, device, monkeypatch, attentions, **compile_kwargs):
    """Each ``(model, inputs)`` of ``calls`` compiled with the backend in turn: every attention runs fused on a
    second call (the first one compiles), and the output matches eager's."""
    for i, (model, inputs) in enumerate(calls):
        compiled = torch.compile(model, backend="fuse_attn", **compile_kwargs)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*inputs), model(*inputs), atol=1e-5, rtol=1e-5)
            with fused_runs(device, monkeypatch) as runs:
                compiled(*inputs)
        assert runs[0] == attentions, f"call {i}: {runs[0]} of {attentions} attentions ran fused"


class DropoutAttention(ScaledAttention):
    def __init__(self, scaling: float, p: float = 0.1):
        super().__init__(scaling)
        self.p = p

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.dim).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-1, -2) * self.scaling, dim=-1)
        return torch.nn.functional.dropout(weights, self.p, self.training) @ v


def test_process_conditions(monkeypatch):
    """What else a real process does: ``dynamic=True`` with a float attribute (lifted from the first compile) and
    changing lengths; ``specialize_float=True`` (a graph per value, each fused); a model recompiled after ``eval()``
    and again after ``train()``; a dropout probability that changes between instances (the kernels take it at
    compile time: the graph is guarded on its value, a graph per value); two model families whose code shares
    helper functions."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.randn(2, 17, 16, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)

    torch._dynamo.reset()
    _fused_every_call([(ScaledAttention(s), [x[:, :n]]) for s, n in ((0.3, 17), (0.2, 9), (0.7, 13))], "cpu",
                      monkeypatch, 1, dynamic=True)

    torch._dynamo.reset()
    with torch._dynamo.config.patch(specialize_float=True):
        _fused_every_call([(ScaledAttention(s), [x]) for s in (0.3, 0.2, 0.7)], "cpu", monkeypatch, 1)

    torch._dynamo.reset()
    model = DropoutAttention(0.3)
    for mode in ("eval", "train", "eval"):
        getattr(model, mode)()
        if mode == "eval":
            _fused_every_call([(model, [x])], "cpu", monkeypatch, 1)
        else:  # dropout: compare the fused runs only
            with fused_runs("cpu", monkeypatch) as runs:
                torch.compile(model, backend="fuse_attn")(x)
            assert runs[0] == 1

    torch._dynamo.reset()
    for p in (0.1, 0.2, 0.3):
        with fused_runs("cpu", monkeypatch) as runs:
            torch.compile(DropoutAttention(0.3, p), backend="fuse_attn")(x)
        assert runs[0] == 1, p

    transformers = pytest.importorskip("transformers")
    torch._dynamo.reset()
    gemma = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, attn_implementation="eager", sliding_window=8))
    ids = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(0))
    calls = [(Logits(model), [ids]) for model in (_llama(1e-5), gemma, _llama(1e-6))]
    _fused_every_call(calls, "cpu", monkeypatch, LAYERS)


class Logits(torch.nn.Module):
    """A Hugging Face causal LM returning its logits as a tensor."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(ids).logits
