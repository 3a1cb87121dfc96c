"""Clean fallbacks: a kernel that cannot be generated, compiled or launched never crashes the user's model -- the
op runs the same attention in plain PyTorch (the blockwise path) and says why, once; the backend's off switches.

A failing config during tuning is dropped with a logged reason: tests/kernels/test_tuning.py
(test_tuning_logs_progress_and_dropped_configs, and the error naming the first failure when none works).
"""

from __future__ import annotations

import logging
import os

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import importlib
from fuse_attn.kernels import tuning
from fuse_attn.kernels.generated import codegen
from fuse_attn.kernels.tuning import KernelConfig
from fuse_attn.report import collect_reports
from fuse_attn.spec import AttentionSpec, CausalMask

from tests.support.compiled_modules import CausalTril

fa = importlib.import_module("fuse_attn.kernels.ops")

pytestmark = [
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="injects failures into the interpreter's kernels"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]
SPEC = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, causal=CausalMask())


@pytest.fixture(autouse=True)
def _fresh_failures(monkeypatch):
    monkeypatch.setattr(fa, "_kernel_failures", set())


def run(q, k, v):
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
    out = fa.flash_attention(*leaves, SPEC)
    return out, torch.autograd.grad(out, leaves, torch.ones_like(out))


def blockwise_result(q, k, v, monkeypatch):
    with monkeypatch.context() as m:
        m.setenv("TRITON_INTERPRET", "0")
        return run(q, k, v)


@pytest.mark.parametrize("failure", ["launch", "generation"])
def test_failing_kernels_fall_back_to_plain_pytorch_and_warn_once(failure, monkeypatch, caplog):
    q, k, v = (torch.randn(1, 2, 19, 16) for _ in range(3))
    expected = blockwise_result(q, k, v, monkeypatch)
    if failure == "launch":
        # a config Triton rejects (tl.arange needs a power of two): every kernel launch fails, as when no
        # candidate config of a GPU compiles
        bad = KernelConfig(24, 16, 4, 1)
        monkeypatch.setattr(tuning, "INTERPRETER_CONFIGS", {"fwd": bad, "bwd_dq": bad, "bwd_dkdv": bad})
        reason = "power of 2"
    else:
        def broken(spec):
            raise RuntimeError("the template did not render")
        monkeypatch.setattr(codegen, "load_module", broken)
        reason = "RuntimeError: the template did not render"
    with caplog.at_level(logging.WARNING, logger="fuse_attn"):
        for _ in range(2):
            out, grads = run(q, k, v)
            assert torch.equal(out, expected[0]) and all(torch.equal(a, b) for a, b in zip(grads, expected[1]))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # forward and backward, once each over both calls
    for direction, message in zip(("forward", "backward"), warnings):
        assert direction in message and "causal" in message and reason in message and "plain PyTorch" in message


def test_compiled_model_survives_failing_kernels(monkeypatch, caplog):
    bad = KernelConfig(24, 16, 4, 1)
    monkeypatch.setattr(tuning, "INTERPRETER_CONFIGS", {"fwd": bad, "bwd_dq": bad, "bwd_dkdv": bad})
    q, k, v = (torch.randn(1, 2, 9, 16, requires_grad=True) for _ in range(3))
    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING, logger="fuse_attn"), collect_reports() as reports:
        out = torch.compile(CausalTril(), backend="fuse_attn")(q, k, v)
        out.sum().backward()
    assert [v.fused for r in reports for v in r.verdicts] == [True]
    assert any("plain PyTorch" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(out, CausalTril()(q, k, v))


@pytest.mark.parametrize("switch", ["env", "option"])
def test_backend_off_switches_compile_the_graph_unchanged(switch, monkeypatch):
    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))
    options = {}
    if switch == "env":
        monkeypatch.setenv("FUSE_ATTN_DISABLE", "1")
    else:
        options["fuse_attn.enabled"] = False
    torch._dynamo.reset()
    with collect_reports() as reports:
        out, code = run_and_get_code(torch.compile(CausalTril(), backend="fuse_attn", options=options), q, k, v)
    assert reports == [] and "fuse_attn" not in "\n".join(code)
    torch.testing.assert_close(out, CausalTril()(q, k, v))
