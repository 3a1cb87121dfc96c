"""Export a Hugging Face GPT-2 (eager attention) with ``torch.export``, fuse its attentions with
``fuse_attn.fuse_exported``, and on a GPU compile it into an AOTInductor package whose attention runs the generated
kernels, then load the package and run it without re-tracing.

    python examples/export_aoti.py                 # GPU: GPT-2 small, batch 8 x 1024, bf16: package, load, run, time
    python examples/export_aoti.py --device cpu    # CPU: a tiny GPT-2, fp32: the fused program, saved and loaded

Prints what was fused, checks the package's (on a CPU: the saved and reloaded program's) logits against eager (2x
rule against fp64), and on a GPU checks that the package's code launches the generated kernels (where the
attentions run them) and times the package against the package of the unfused program. If loading a package
segfaults in ``std::regex`` (a system g++ other than torch's own), compile with ``-fvisibility-inlines-hidden``
through ``CXX``: see the README, "Exported and AOT-compiled models".
"""

from __future__ import annotations

import copy
import re
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

if not __package__:  # run as a script: the repository root, for examples.common
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import fuse_attn  # noqa: E402
from fuse_attn.kernels import dispatch  # noqa: E402
from examples.common import Checks, median_ms, parse_setup  # noqa: E402


def main(argv=None) -> int:
    import transformers

    setup, _ = parse_setup(__doc__, argv)
    size = dict(n_embd=32, n_head=4, n_layer=2, vocab_size=64) if setup.tiny else {}
    batch, length = (2, 9) if setup.tiny else (8, 1024)
    config = transformers.GPT2Config(**size, n_positions=length, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                                     use_cache=False, bos_token_id=0, eos_token_id=0)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    tokens = torch.randint(0, config.vocab_size, (batch, length), device=setup.device)
    checks = Checks(setup)

    def logits(run):
        with torch.no_grad():
            out = run(input_ids=tokens)
        return out.logits if hasattr(out, "logits") else out[0]

    reference = logits(copy.deepcopy(model).double().to(setup.device))
    model = model.to(device=setup.device, dtype=setup.dtype)
    eager = logits(model)
    with torch.no_grad():
        exported = torch.export.export(model, (), {"input_ids": tokens})
        plain = copy.deepcopy(exported)
        with fuse_attn.collect_reports() as reports:
            fused = fuse_attn.fuse_exported(exported)
    checks.fused("export", reports, config.n_layer)

    with tempfile.TemporaryDirectory() as folder:
        if setup.cuda:
            from torch._inductor import aoti_compile_and_package, aoti_load_package

            path = aoti_compile_and_package(fused, package_path=f"{folder}/fused.pt2")
            on_generated = sum(v.fused and (v.runs is None or v.runs.startswith(f"runs {dispatch.TRITON}:"))
                               for r in reports for v in r.verdicts)
            kernels = generated_kernels(path)
            print(f"package: {on_generated} attention(s) run the generated kernels; its code launches "
                  f"{', '.join(kernels) or 'none of them'}")
            if on_generated and not kernels:
                checks.fail("the package's code launches none of the generated kernels")
            package = aoti_load_package(path)
            unfused = aoti_load_package(aoti_compile_and_package(plain, package_path=f"{folder}/plain.pt2"))
            checks.close("AOTInductor package logits", logits(package), [eager], reference)
            ours, theirs = (median_ms(lambda run=run: logits(run)) for run in (package, unfused))
            print(f"package of the fused program {ours:.2f} ms, of the unfused one {theirs:.2f} ms; "
                  f"speed-up {theirs / ours:.2f}x")
        else:  # AOTInductor's CPU packages cannot run the fused op's Python CPU path: the program itself
            torch.export.save(fused, f"{folder}/fused.pt2")
            loaded = torch.export.load(f"{folder}/fused.pt2")
            calls = sum(node.target is torch.ops.fuse_attn.flash_attention.default for node in loaded.graph.nodes)
            print(f"reloaded program: {calls} call(s) of the fused op")
            if calls != config.n_layer:
                checks.fail(f"the reloaded program calls the fused op {calls} times, expected {config.n_layer}")
            checks.close("saved and reloaded program logits", logits(loaded.module()), [eager], reference)
    return checks.exit_code()


def generated_kernels(package_path: str) -> list[str]:
    """The generated forward kernels (``_attn_fwd`` of the template) that an AOTInductor package's C++ code names."""
    with zipfile.ZipFile(package_path) as archive:
        sources = [name for name in archive.namelist() if name.endswith(".cpp")]
        code = " ".join(archive.read(name).decode(errors="replace") for name in sources)
    return sorted(set(re.findall(r"\b_attn_fwd\w*", code)))


if __name__ == "__main__":
    sys.exit(main())
