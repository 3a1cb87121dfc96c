"""The ``fuse_attn`` logger: one INFO line per fused attention and per softmax left alone (with the reason), switched
on the way torch's own logs are: ``TORCH_LOGS=fuse_attn`` (INFO) or ``TORCH_LOGS=+fuse_attn`` (DEBUG), which
also covers the child loggers (``fuse_attn.kernels.tuning``'s tuning progress)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import torch

from examples.attention_forms import NanoGPTAttention

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class AttentionAndPlainSoftmax(torch.nn.Module):
    """One attention that is fused, and a softmax of an activation that is no attention (its input has other users)."""

    def __init__(self):
        super().__init__()
        self.attention = NanoGPTAttention(width=16, heads=2, block_size=8)

    def forward(self, x):
        return self.attention(x) * x.softmax(dim=-1)


def compile_and_run():
    torch._dynamo.reset()
    torch.manual_seed(0)
    with torch.no_grad():
        torch.compile(AttentionAndPlainSoftmax(), backend="fuse_attn")(torch.randn(1, 8, 16))


# What a subprocess runs: the compile above, with whatever TORCH_LOGS its environment holds.
COMPILE_SCRIPT = "from tests.graph.test_logging import compile_and_run; compile_and_run()"
# What a subprocess prints: the effective levels of the package's logger and of the tuner's.
LEVELS_SCRIPT = ("import logging, torch; print(logging.getLogger('fuse_attn').getEffectiveLevel(), "
                 "logging.getLogger('fuse_attn.kernels.tuning').getEffectiveLevel())")


def run_python(code, torch_logs):
    env = dict(os.environ, TRITON_INTERPRET="0",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("TORCH_LOGS", None)
    if torch_logs is not None:
        env["TORCH_LOGS"] = torch_logs
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_one_line_per_fused_attention_and_per_softmax_left_alone(caplog, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the op's plain-PyTorch CPU path
    with caplog.at_level(logging.INFO, logger="fuse_attn"):
        compile_and_run()
    lines = [r.getMessage() for r in caplog.records if r.name == "fuse_attn"]
    assert len(lines) == 2, lines
    fused, not_fused = sorted(lines)
    assert fused.startswith("fused softmax (attention_forms.py:") and "causal" in fused, fused
    assert not_fused.startswith("not fused softmax_1 (test_logging.py:"), not_fused
    assert not_fused.endswith("x.softmax(dim=-1)`): the scores arg0_1 are also used by linear"), not_fused


def test_torch_logs_turns_the_lines_on():
    stderr = run_python(COMPILE_SCRIPT, "fuse_attn").stderr
    # torch's log format: level letter, time, process, file:line, then the message
    lines = [line for line in stderr.splitlines() if "report.py" in line]
    assert len(lines) == 2, stderr
    assert any(line.startswith("I") and "] fused softmax (attention_forms.py:" in line for line in lines), stderr
    assert any(line.startswith("I") and "] not fused softmax_1 (test_logging.py:" in line
               and line.endswith(": the scores arg0_1 are also used by linear") for line in lines), stderr


def test_torch_logs_levels_cover_the_tuner():
    def levels(torch_logs):
        return [int(level) for level in run_python(LEVELS_SCRIPT, torch_logs).stdout.split()]

    assert levels(None) == [logging.WARNING, logging.WARNING]  # off by default: INFO lines are not printed
    assert levels("fuse_attn") == [logging.INFO, logging.INFO]
    assert levels("+fuse_attn") == [logging.DEBUG, logging.DEBUG]
