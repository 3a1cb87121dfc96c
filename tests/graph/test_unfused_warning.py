"""An attention the backend leaves unfused is a WARNING of the ``fuse_attn`` logger without any log setting: once per
reason and process, pointing to ``fuse_attn.explain``. Fused attentions, softmaxes that are no attention and
``explain`` itself warn of nothing."""

from __future__ import annotations

import logging

import pytest
import torch

import fuse_attn
from fuse_attn.report import reset_unfused_warnings

from examples.attention_forms import NanoGPTAttention


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the fused op's plain-PyTorch CPU path
    reset_unfused_warnings()
    yield
    reset_unfused_warnings()


def attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


def fp32_scores_bf16_value(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2), -1).to(v.dtype) @ v


def qkv(dim=8, v_dtype=torch.float32):
    q, k, v = (torch.randn(1, 2, 4, dim) for _ in range(3))
    return q, k, v.to(v_dtype)


def compiled(fn, *args):
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend="fuse_attn")(*args)


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fuse_attn" and r.levelno == logging.WARNING]


HEAD_DIM_640 = "the head dim 640 is over 512"
MIXED_DTYPES = "q is torch.float32 but v is torch.bfloat16"


def test_an_unfused_attention_warns_once_per_reason(caplog):
    caplog.set_level(logging.WARNING, logger="fuse_attn")
    compiled(attention, *qkv(dim=640))
    compiled(attention, *qkv(dim=640))
    warnings = warnings_of(caplog)
    assert len(warnings) == 1, warnings
    assert HEAD_DIM_640 in warnings[0] and "fuse_attn.explain(model, *inputs)" in warnings[0], warnings[0]
    assert "test_unfused_warning.py:" in warnings[0], warnings[0]  # where the attention is


def test_two_reasons_warn_twice(caplog):
    caplog.set_level(logging.WARNING, logger="fuse_attn")
    compiled(attention, *qkv(dim=640))
    compiled(fp32_scores_bf16_value, *qkv(v_dtype=torch.bfloat16))
    compiled(attention, *qkv(dim=640))
    warnings = warnings_of(caplog)
    assert len(warnings) == 2, warnings
    assert HEAD_DIM_640 in warnings[0] and MIXED_DTYPES in warnings[1], warnings


def test_a_fused_attention_warns_nothing(caplog):
    caplog.set_level(logging.WARNING, logger="fuse_attn")
    compiled(NanoGPTAttention(width=16, heads=2, block_size=8), torch.randn(1, 8, 16))
    assert warnings_of(caplog) == []


def test_a_softmax_that_is_no_attention_warns_nothing(caplog):
    """A classifier's probabilities, and a softmax whose weights are used but never multiply a value (as in
    test_logging): both are reported not fused, neither is an attention."""
    caplog.set_level(logging.INFO, logger="fuse_attn")
    classifier = torch.nn.Linear(8, 5)
    compiled(lambda x: classifier(x).softmax(-1), torch.randn(3, 8))
    compiled(lambda x: x.softmax(-1) * x.sum(), torch.randn(2, 4, 4))
    assert warnings_of(caplog) == []
    infos = [r.getMessage() for r in caplog.records if r.name == "fuse_attn" and r.levelno == logging.INFO]
    assert len(infos) == 2 and all(line.startswith("not fused ") for line in infos), infos


def test_explain_warns_nothing(caplog):
    caplog.set_level(logging.WARNING, logger="fuse_attn")
    torch._dynamo.reset()
    report = fuse_attn.explain(attention, *qkv(dim=640))
    assert [v.reason for v in report.not_fused] == [HEAD_DIM_640]
    assert warnings_of(caplog) == []
    compiled(attention, *qkv(dim=640))  # explain remembered nothing: the compile still warns
    assert len(warnings_of(caplog)) == 1
