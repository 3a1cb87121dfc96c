"""Each example runs at its tiny CPU size (what ``python examples/<name>.py`` does on a machine without a GPU): every
attention fused, results equal to eager under the 2x rule (generated tokens identical), exit status 0."""

from __future__ import annotations

import importlib

import pytest

pytest.importorskip("transformers")

# Arguments beyond the tiny size, to keep the file's time down. Two generated tokens compile two graphs (the prompt
# and one decoding step); this leaves out the third graph the example's default compiles from the second decoding
# step on, the one with a dynamic cache length.
EXAMPLES = {
    "train_nanogpt": ["--steps", "2"],
    "train_gpt2": ["--steps", "2"],
    "generate_llama": ["--new-tokens", "2"],
    "encoder_inference": [],
    "export_aoti": [],
}


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_runs_on_cpu_and_passes_its_checks(name, monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the op's plain-PyTorch CPU path, as outside the test session
    example = importlib.import_module(f"examples.{name}")
    status = example.main(["--device", "cpu", "--size", "tiny", *EXAMPLES[name]])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "fuse_attn fused" in out and "not fused" not in out, out
    assert out.rstrip().endswith("all checks passed"), out
