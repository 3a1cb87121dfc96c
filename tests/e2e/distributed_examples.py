"""(Run by tests/e2e/test_distributed.py under torchrun, 2 CPU processes, gloo.) Several runs in one torchrun: each
argument is one run, a distributed example's name and its command line
("train_distributed --device cpu --engine ddp --model gpt2 --steps 4"), or a dotted module of these tests
("tests.e2e.distributed_context_parallel"), after any ``NAME=VALUE`` settings of the environment that hold for that
run only ("TRITON_INTERPRET=0 tests.e2e.distributed_context_parallel": the op's blockwise path, which the op reads at
run time; the process starts with the kernels bound to the interpreter, as the test session does). The process group
is made once and each run's ``main(argv)`` runs in it (the examples and these modules keep a group they did not make);
each run starts from Dynamo's reset caches, as the example resets them for each of its variants. Rank 0 prints a line
``=== run i: <argument>`` before each run and ``=== run i exit <status> (<seconds> s)`` after it; exits 1 if any run
failed.

One torchrun instead of one per run: each torchrun pays the start of three interpreters (the launcher and two ranks),
the imports of torch, transformers and fuse_attn, and gloo's rendezvous, and each process its first compile's
warm-up. The interpreter's re-patching of triton.language is skipped as in the test session (interpreter_patching.py:
the same bits)."""

import importlib
import itertools
import os
import shlex
import sys
import time
from unittest import mock
from pathlib import Path

import torch
import torch.distributed as dist

from tests.support.interpreter_patching import skip_repatching_inside_a_launch


def main(runs: list) -> int:
    skip_repatching_inside_a_launch()
    dist.init_process_group("gloo")
    rank, statuses = dist.get_rank(), []
    for i, run in enumerate(runs):
        words = shlex.split(run)
        settings = dict(w.split("=", 1) for w in itertools.takewhile(lambda w: "=" in w, words))
        name, *argv = words[len(settings):]
        if rank == 0:
            print(f"=== run {i}: {run}", flush=True)
        torch._dynamo.reset()
        start = time.perf_counter()
        with mock.patch.dict(os.environ, settings):
            status = importlib.import_module(name if "." in name else f"examples.{name}").main(argv)
        dist.barrier()
        if rank == 0:
            print(f"=== run {i} exit {status} ({time.perf_counter() - start:.1f} s)", flush=True)
        statuses.append(status)
    dist.destroy_process_group()
    return 0 if not any(statuses) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
