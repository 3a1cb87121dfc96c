"""Each example runs at its tiny CPU size (what ``python examples/<name>.py`` does on a machine without a GPU): every
attention fused, results equal to eager under the 2x rule (generated tokens identical), exit status 0."""

from __future__ import annotations

import importlib
import zipfile

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


def test_export_aoti_finds_the_generated_kernels_a_package_launches(tmp_path):
    """On a GPU, export_aoti fails unless the package's C++ code names the generated forward kernel (where the
    attentions run it); the names are read from the package's .cpp sources only."""
    from examples.export_aoti import generated_kernels

    package = tmp_path / "fused.pt2"
    with zipfile.ZipFile(package, "w") as archive:
        archive.writestr("fused/data/aotinductor/model/c1.wrapper.cpp",
                         'kernels_.get_kernel("_attn_fwd_0", ...); kernels_.get_kernel("triton_poi_fused_add_1", ...);')
        archive.writestr("fused/data/aotinductor/model/c1.wrapper_metadata.json", '{"_attn_fwd_7": 1}')
    assert generated_kernels(str(package)) == ["_attn_fwd_0"]
    with zipfile.ZipFile(package, "w") as archive:
        archive.writestr("fused/data/aotinductor/model/c1.wrapper.cpp",
                         'kernels_.get_kernel("triton_poi_fused_add_1");')
    assert generated_kernels(str(package)) == []
