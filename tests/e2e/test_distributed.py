"""Distributed runs under torchrun with 2 processes on the CPU (gloo), the kernels in the Triton interpreter:
examples/train_distributed.py -- DDP with the GPT-2-shaped model, FSDP2 and tensor parallel with the LLaMA-shaped one
(GQA), tiny, fp32; the example checks that every attention was fused and that fuse_attn's losses stay within the 2x
rule of eager's -- tests/e2e/distributed_sharding.py, the fused op on DTensors sharded on heads or batch
(fuse_attn/kernels/sharding.py) and a tensor-parallel Hugging Face LLaMA compiled with the backend -- and
tests/e2e/distributed_context_parallel.py, the sequence sharded over the ranks (fuse_attn/context_parallel.py).

Every run is made by one torchrun of tests/e2e/distributed_examples.py (the ``distributed_runs`` fixture), once per
session, and each test checks its runs' outputs: a torchrun pays the start of three interpreters, the imports and
gloo's rendezvous, which one torchrun per test would pay three times."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock


ROOT = Path(__file__).resolve().parents[2]


def torchrun(script: Path, *arguments: str, cache: Path, interpret: str = "1") -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET=interpret, FUSE_ATTN_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))  # tests.support, examples
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
               *arguments]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)


ENGINES = [("ddp", "gpt2"), ("fsdp2", "llama"), ("tp", "llama")]
TRAINING = [f"train_distributed --device cpu --engine {engine} --model {model} --steps 4"
            + (" --profile" if engine == "fsdp2" else "") for engine, model in ENGINES]
SHARDING = ["tests.e2e.distributed_sharding"]
# The ring's pairs each get their own spec (so their own kernels): the interpreter would compile a dozen kernels per
# case; the op runs its blockwise path in the context-parallel cases (the lse gradient of every path: test_kernels.py).
CONTEXT_PARALLEL = ["TRITON_INTERPRET=0 tests.e2e.distributed_context_parallel",
                    "TRITON_INTERPRET=0 train_context_parallel --device cpu --steps 3"]
RUNS = TRAINING + SHARDING + CONTEXT_PARALLEL


def run_all(cache: Path) -> dict:
    run = torchrun(ROOT / "tests" / "e2e" / "distributed_examples.py", *RUNS, cache=cache)
    return {"returncode": run.returncode, "stdout": run.stdout, "stderr": run.stderr}


@pytest.fixture(scope="module")
def distributed_runs(tmp_path_factory) -> dict:
    """RUNS' torchrun: its exit status, stdout and stderr. Made once a session: under pytest-xdist the first worker to
    ask makes it and leaves it in the session's temporary directory, the others wait for it and read it there."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return run_all(tmp_path_factory.mktemp("distributed_cache"))
    shared = tmp_path_factory.getbasetemp().parent  # (the session's, above each worker's own)
    result = shared / "distributed_runs.json"
    with FileLock(str(result) + ".lock"):
        if not result.is_file():
            result.write_text(json.dumps(run_all(tmp_path_factory.mktemp("distributed_cache"))))
        return json.loads(result.read_text())


def run_outputs(distributed_runs: dict, runs: list) -> list:
    """The outputs of ``runs`` (some of RUNS) in the torchrun, after checking that each ran under its header and exited
    0."""
    stdout = distributed_runs["stdout"]
    sections = stdout.split("=== run ")[1:]
    outputs = []
    for argument in runs:
        i = RUNS.index(argument)
        failure = stdout[-3000:] + distributed_runs["stderr"][-3000:]
        assert len(sections) > 2 * i + 1, failure
        assert sections[2 * i].partition("\n")[0] == f"{i}: {argument}", failure
        assert sections[2 * i + 1].startswith(f"{i} exit 0"), sections[2 * i] + failure
        outputs.append(sections[2 * i])
    # the torchrun fails only where a run did (not, say, in the process group's teardown)
    every_run_exited_0 = len(sections) == 2 * len(RUNS) and all(
        section.startswith(f"{j} exit 0") for j, section in enumerate(sections[1::2]))
    assert distributed_runs["returncode"] == 0 or not every_run_exited_0, failure
    return outputs


def test_train_distributed_on_two_cpu_processes(distributed_runs):
    """The three engines' runs of the example, each checked as its own torchrun's output was: every attention fused,
    the losses within the 2x rule of eager's."""
    for (engine, model), out in zip(ENGINES, run_outputs(distributed_runs, TRAINING)):
        assert f"{model}, {engine} on 2 cpu processes" in out, out
        assert "not fused: 0" in out and "FAILED" not in out, out
        assert "loss vs eager: fuse_attn" in out, out
        if engine == "fsdp2":  # --profile; the causal mask reaches each block's graph as an input: its tiles classified
            assert "profile of fuse_attn" in out and "profile of sdpa+torch.compile" in out, out
            assert "s + bias0[Z,1,M,N]" in out and "tiles classified per call (bias0)" in out, out


def test_fused_op_on_dtensors_sharded_on_heads_or_batch(distributed_runs):
    (out,) = run_outputs(distributed_runs, SHARDING)
    lines = [line for line in out.splitlines() if " heads " in line]
    assert len(lines) == 8 and not any("FAILED" in line for line in lines), out
    assert "tensor parallel llama (heads over 2 ranks), compiled: fused 2 of 2 attentions" in out, out
    assert "softmax on DTensors, compiled: " in out, out
    assert "FAILED" not in out, out


def test_context_parallel_and_its_example_on_two_cpu_processes(distributed_runs):
    """tests/e2e/distributed_context_parallel.py's cases, then examples/train_context_parallel.py's training, each
    run's output checked on its own."""
    cases, example = run_outputs(distributed_runs, CONTEXT_PARALLEL)
    lines = [line for line in cases.splitlines() if line.startswith(("op ", "compiled ", "llama ", "uneven "))]
    assert len(lines) == 16 and not any("FAILED" in line for line in lines), cases
    assert "context parallel over 2 cpu processes" in example and "FAILED" not in example, example
    assert "attentions fused as rings: 2 of 2" in example and "loss distance" in example, example
