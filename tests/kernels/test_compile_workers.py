"""The tuner's candidate compiles on Inductor's compile workers (fuse_attn/kernels/compile_workers.py).

On the CPU, each in a fresh process, with Triton compiling for an sm90 target and no GPU (its driver replaced by the
compile-only one): a compile asked for while collecting becomes a job and compiles nothing; the job, pickled and run
in a forked process (as Inductor's workers are), leaves the kernel in Triton's disk cache, from which the same
compile here then loads (no new cache entry; another config makes one); the tuner compiles its candidates on the
workers and then here; without ready workers, in processes forked for the batch (stuck ones killed), and with one
compile thread here only; the backward's candidates compile ahead into the binaries launched. On a GPU: the same
through Inductor's real workers and through processes forked after CUDA started, then launched.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import pickle
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
import triton

from fuse_attn.kernels import compile_workers, tuning
from fuse_attn.kernels.compile_workers import compile_job
from fuse_attn.kernels.generated import launch
from fuse_attn.kernels.tuning import KernelConfig
from tests.support import compile_job_kernel
from tests.support.compile_job_kernel import copy_kernel
from tests.support.numerics import needs_cuda
from tests.support.sm90_compiles import compile_for_sm90, in_a_fresh_process, sm90

CONFIGS = [KernelConfig(64, 64, 4, 2), KernelConfig(64, 64, 8, 3)]


def _args(device="cpu"):
    return {"X": torch.randn(64, device=device).bfloat16(), "Y": torch.zeros(64, device=device), "n": 64, "BLOCK": 64}


def _compiled_entries(cache_dir) -> set:
    return {path.parent.name for path in cache_dir.rglob("copy_kernel.json")}


def _fresh_cache(cache_dir: str) -> Path:
    """(In a scenario's process.) Triton compiles for sm90 into ``cache_dir``, with no GPU."""
    triton.knobs.cache.dir = cache_dir
    compile_for_sm90()
    return Path(cache_dir)


def _in_a_fresh_process(scenario: str, tmp_path) -> None:
    in_a_fresh_process(__name__, scenario, str(tmp_path))


def _jobs(configs):
    jobs = []
    with compile_workers.collecting(jobs):
        for cfg in configs:
            launch.launch(copy_kernel, (1,), _args(), cfg, warmup=True)
    return jobs


def asked_compile_is_a_job(cache_dir):
    cache = _fresh_cache(cache_dir)
    [job] = _jobs(CONFIGS[:1])
    data = json.loads(job.specialization_data)
    assert (job.kernel_name, job.module_name, job.target) == ("copy_kernel", compile_job_kernel.__name__, sm90())
    assert data["name"].endswith("copy_kernel") and data["options"]["num_warps"] == 4
    assert _compiled_entries(cache) == set()
    assert not compile_workers.collect(copy_kernel, (1,), _args(), {})  # outside collecting(): compiled by the caller


def test_a_compile_asked_for_while_collecting_is_a_job_and_compiles_nothing(tmp_path):
    _in_a_fresh_process("asked_compile_is_a_job", tmp_path)


def test_a_kernel_a_worker_cannot_find_is_compiled_by_the_caller():
    from triton.runtime.jit import JITFunction

    jobs = []
    with compile_workers.collecting(jobs):
        assert not compile_workers.collect(JITFunction(compile_job_kernel.copy_kernel.fn), (1,), _args(), {})
    assert jobs == []


class _ForkingPool:
    """Inductor's worker pool, as a forked process a job: each job after a pickling round trip; ``worker_env`` is
    set in the worker before the job, as Inductor's workers set ``TRITON_PTXAS_PATH`` as they start."""

    def __init__(self, worker_env=None):
        self.jobs = []
        self.worker_env = worker_env or {}

    def submit(self, fn, *args):
        fn, args = pickle.loads(pickle.dumps((fn, args)))
        self.jobs.append(args[0])

        def worker(*args):
            from triton.backends.nvidia.compiler import get_ptxas_version

            os.environ.update(self.worker_env)
            get_ptxas_version.cache_clear()
            fn(*args)

        process = multiprocessing.get_context("fork").Process(target=worker, args=args)
        process.start()
        process.join(120)
        future = Future()
        if process.exitcode == 0:
            future.set_result(None)
        else:
            future.set_exception(RuntimeError(f"exit code {process.exitcode}"))
        return future


def worker_compile_loads_here(cache_dir):
    cache = _fresh_cache(cache_dir)
    first, second = _jobs(CONFIGS)
    _ForkingPool().submit(compile_workers.compile_job, first, cache_dir).result()
    compiled = _compiled_entries(cache)
    assert len(compiled) == 1
    launch.launch(copy_kernel, (1,), _args(), CONFIGS[0], warmup=True)  # the same compile here: loaded
    assert _compiled_entries(cache) == compiled
    launch.launch(copy_kernel, (1,), _args(), CONFIGS[1], warmup=True)  # one no worker compiled: a new entry
    assert len(_compiled_entries(cache)) == 2


def test_a_job_compiled_in_a_forked_worker_is_loaded_here_from_the_cache(tmp_path):
    _in_a_fresh_process("worker_compile_loads_here", tmp_path)


def _another_ptxas(directory: Path) -> str:
    """A ptxas that reports another version (part of Triton's cache key) and compiles as the real one."""
    from triton.backends.nvidia.compiler import get_ptxas

    path = directory / "ptxas"
    path.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "Cuda compilation tools, release 12.1, V12.1.0"; '
                    f'else exec {get_ptxas(90).path} "$@"; fi\n')
    path.chmod(0o755)
    return str(path)


def worker_with_another_ptxas_compiles_with_ours(cache_dir):
    cache = _fresh_cache(cache_dir)
    [job] = _jobs(CONFIGS[:1])
    other = _another_ptxas(cache)
    worker_env = {"TRITON_PTXAS_PATH": other, "TRITON_PTXAS_BLACKWELL_PATH": other}  # (sm90's knob in Triton 3.9)
    _ForkingPool(worker_env).submit(compile_workers.compile_job, job, cache_dir).result()
    compiled = _compiled_entries(cache)
    assert len(compiled) == 1
    launch.launch(copy_kernel, (1,), _args(), CONFIGS[0], warmup=True)
    assert _compiled_entries(cache) == compiled


def test_a_worker_pointed_at_another_ptxas_compiles_with_the_submitters(tmp_path):
    _in_a_fresh_process("worker_with_another_ptxas_compiles_with_ours", tmp_path)


def submitter_pointed_at_another_ptxas_after_its_first_key(cache_dir):
    cache = _fresh_cache(cache_dir)
    _jobs(CONFIGS[:1])  # (Triton keeps the version of the ptxas it found first)
    other = _another_ptxas(cache)
    # what Inductor does in this process as it first compiles a kernel here (compile_tasks._set_triton_ptxas_path)
    os.environ.update({"TRITON_PTXAS_PATH": other, "TRITON_PTXAS_BLACKWELL_PATH": other})
    [job] = _jobs(CONFIGS[1:])
    assert job.ptxas == other
    _ForkingPool().submit(compile_workers.compile_job, job, cache_dir).result()
    compiled = _compiled_entries(cache)
    assert len(compiled) == 1
    launch.launch(copy_kernel, (1,), _args(), CONFIGS[1], warmup=True)  # the worker's compile: loaded
    assert _compiled_entries(cache) == compiled


def test_a_job_asked_for_after_inductor_pointed_this_process_at_its_ptxas_compiles_in_a_worker(tmp_path):
    """Inductor points ``TRITON_PTXAS_PATH`` at torch's ptxas in the process that compiles (after Triton may have
    cached the version of its own ptxas, part of its key): the job carries the ptxas and the key Triton compiles with
    from then on, so that the worker's compile is the one this process loads."""
    _in_a_fresh_process("submitter_pointed_at_another_ptxas_after_its_first_key", tmp_path)


def function_constexpr_compiles_in_a_worker(cache_dir):
    from tests.support import compile_job_gluon_kernel as gluon_kernels

    cache = _fresh_cache(cache_dir)
    args = {**_args(), "SCALE": gluon_kernels.doubled}
    jobs = []
    with compile_workers.collecting(jobs):
        launch.launch(gluon_kernels.scaled_copy_kernel, (1,), args, CONFIGS[0], warmup=True)
    [job] = jobs
    _ForkingPool().submit(compile_workers.compile_job, job, cache_dir).result()
    compiled = {path.parent.name for path in cache.rglob("scaled_copy_kernel.json")}
    assert len(compiled) == 1
    launch.launch(gluon_kernels.scaled_copy_kernel, (1,), args, CONFIGS[0], warmup=True)  # the worker's: loaded
    assert {path.parent.name for path in cache.rglob("scaled_copy_kernel.json")} == compiled


def test_a_kernel_taking_a_function_as_a_constexpr_compiles_in_a_worker(tmp_path):
    """Triton's record of such a compile holds the function itself (Triton 3.6; 3.9 names a plain JIT function by its
    registry, a Gluon one not at all), which JSON refuses: the job names it by its module and name, and the worker
    loads it (the Gluon kernels' generated score programs: packed documents, key padding, softcaps)."""
    _in_a_fresh_process("function_constexpr_compiles_in_a_worker", tmp_path)


def worker_under_another_key_compiles_nothing(cache_dir):
    cache = _fresh_cache(cache_dir)
    [job] = _jobs(CONFIGS[:1])
    with pytest.raises(RuntimeError, match="compiles under another key"):
        compile_workers.compile_job(dataclasses.replace(job, backend_hash="another"), cache_dir)
    assert _compiled_entries(cache) == set()


def test_a_worker_whose_compiles_would_have_another_key_refuses_the_job(tmp_path):
    _in_a_fresh_process("worker_under_another_key_compiles_nothing", tmp_path)


def _tuner_compiles() -> str:
    return tuning._compile_concurrently(CONFIGS, lambda cfg: launch.launch(copy_kernel, (1,), _args(), cfg,
                                                                          warmup=True))


def tuner_uses_the_workers(cache_dir):
    cache = _fresh_cache(cache_dir)
    pool = _ForkingPool()
    compile_workers.worker_pool = lambda: pool
    compiled_here = []
    real_compile = triton.compiler.compile

    def compile_here(src, target=None, options=None, **kw):
        compiled_here.append(options["num_warps"])
        return real_compile(src, target=target, options=options, **kw)

    triton.compiler.compile = compile_here  # (what a kernel's binder takes as its compile)
    assert _tuner_compiles() == "on Inductor's compile workers (2 jobs)"
    assert [json.loads(job.specialization_data)["options"]["num_warps"] for job in pool.jobs] == [4, 8]
    if tuning.AsyncCompileMode is not None:  # then each compiled here: loaded from the workers' entries, none new
        assert sorted(compiled_here) == [4, 8]
    assert len(_compiled_entries(cache)) == 2


def test_the_tuner_compiles_candidates_on_the_workers_then_loads_them_here(tmp_path):
    _in_a_fresh_process("tuner_uses_the_workers", tmp_path)


def tuner_forks_while_the_workers_are_not_ready(cache_dir):
    cache = _fresh_cache(cache_dir)
    compile_workers.worker_pool = lambda: None
    assert _tuner_compiles() == ("in processes forked from this one (2 jobs; Inductor's compile workers "
                                          "not ready)")
    assert len(_compiled_entries(cache)) == 2  # (then loaded here by the thread pass, none compiled anew)


def test_while_the_workers_are_not_ready_the_tuner_compiles_in_forked_processes(tmp_path):
    _in_a_fresh_process("tuner_forks_while_the_workers_are_not_ready", tmp_path)


# (forked processes' jobs: module-level, as a job's function is pickled by name)
def stuck_compile_job(job, cache_dir):
    time.sleep(600)


def stuck_with_one_warp(job, cache_dir):
    if json.loads(job.specialization_data)["options"]["num_warps"] == 1:
        time.sleep(600)
    compile_job(job, cache_dir)


def stuck_forked_processes_are_killed(cache_dir):
    cache = _fresh_cache(cache_dir)
    compile_workers.worker_pool = lambda: None
    compile_workers.FORKED_BATCH_TIMEOUT_S = 2.0
    compile_workers.compile_job = stuck_compile_job
    start = time.monotonic()
    where = _tuner_compiles()
    assert time.monotonic() - start < 60
    threads = tuning.AsyncCompileMode is not None
    assert where == ("here (a job failed in a forked process)" if threads else "(when timed)")
    entries = sorted(str(path.relative_to(cache)) for path in cache.rglob("*") if path.is_file())
    assert len(_compiled_entries(cache)) == (2 if threads else 0), entries  # (what the cache holds, where it fails)


def test_stuck_forked_processes_are_killed_and_the_candidates_compile_here(tmp_path):
    _in_a_fresh_process("stuck_forked_processes_are_killed", tmp_path)


def timed_job(job, cache_dir):
    """(A forked process's job.) Writes when it started and ended to ``cache_dir``/<its kernel's name>."""
    start = time.time()
    time.sleep(0.5)
    Path(cache_dir, job.kernel_name).write_text(f"{start} {time.time()}")


def _timed_jobs(tmp_path, monkeypatch, stages) -> dict:
    monkeypatch.setattr(compile_workers, "compile_job", timed_job)
    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path))  # (the jobs' cache_dir)
    jobs = [compile_workers.CompileJob("m", "f", f"{name}_{len(os.listdir(tmp_path))}", "{}", None, None, "")
            for name in "abc"]
    assert compile_workers.start_in_forked_processes(jobs, 3, stages).wait()
    return {job.kernel_name[0]: [float(t) for t in Path(tmp_path, job.kernel_name).read_text().split()]
            for job in jobs}


def test_a_batchs_stages_start_one_after_another_in_the_forked_processes(tmp_path, monkeypatch):
    spans = _timed_jobs(tmp_path, monkeypatch, [[0, 1], [2]])
    assert spans["c"][0] >= max(spans["a"][1], spans["b"][1])  # the second stage after the first's end
    assert spans["a"][0] < spans["b"][1] and spans["b"][0] < spans["a"][1]  # a stage's jobs together
    spans = _timed_jobs(tmp_path, monkeypatch, None)  # one stage: every job together
    assert spans["c"][0] < min(spans["a"][1], spans["b"][1])


@pytest.mark.parametrize("staged", [True, False])
def test_candidates_compiled_ahead_go_a_kernel_a_stage_or_all_at_once(monkeypatch, staged):
    """``compile_ahead``'s batch holds every kernel's jobs in the order given; staged, a kernel's start once the ones
    before it compiled, else all together (the implementation choice's and the template's tunings)."""
    from tests.support.tuning import key, new_process

    monkeypatch.setenv("FUSE_ATTN_CACHE", "0")
    monkeypatch.setattr(tuning, "device_identity", lambda device: ("NVIDIA H200", "9.0"))  # (the keys' device)
    new_process(monkeypatch)
    monkeypatch.setattr(compile_workers, "worker_pool", lambda: None)
    monkeypatch.setattr(compile_workers, "processes_to_fork", lambda: 4)
    started = []

    def start(jobs, processes, stages=None):
        started.append((list(jobs), stages))
        return compile_workers.Batch(jobs, [lambda: None] * len(jobs), "nowhere", "(recorded)")

    monkeypatch.setattr(compile_workers, "start_in_forked_processes", start)

    def compile_only(cand):  # (a job per candidate: the candidate itself, where collect() would put a compile)
        compile_workers._collected.append(cand)

    first, second = key("first"), key("second")
    tuning.compile_ahead([(first, CONFIGS, lambda: compile_only), (second, CONFIGS[::-1], lambda: compile_only)],
                         staged=staged)
    [(jobs, stages)] = started
    assert jobs == CONFIGS + CONFIGS[::-1]
    assert stages == ([[0, 1], [2, 3]] if staged else None)
    assert set(tuning._ahead) == {first, second}


def test_the_first_job_of_each_kernel_in_a_batch_builds_its_launcher():
    jobs = [compile_workers.CompileJob("m", "f", name, "{}", None, None, "") for name in ("x", "x", "y", "x")]
    assert [job.builds_launcher for job in compile_workers._launchers_built_once(jobs)] == [True, False, True, False]


def candidates_compiled_ahead(cache_dir):
    from tests.support.tuning import key

    cache = _fresh_cache(cache_dir)
    tuning.device_identity = lambda device: ("NVIDIA H200", "9.0")  # (no GPU here: the tuning keys' device)
    os.environ["FUSE_ATTN_CACHE"] = "0"  # (no choice stored by another run)
    compile_workers.worker_pool = lambda: None
    compile_workers.FORKED_BATCH_TIMEOUT_S = 20.0
    compile_workers.compile_job = stuck_with_one_warp
    batches = []
    start = compile_workers.start_in_forked_processes
    compile_workers.start_in_forked_processes = lambda *args: batches.append(start(*args)) or batches[-1]

    def compile_only(cfg):
        launch.launch(copy_kernel, (1,), _args(), cfg, warmup=True)

    slow = [KernelConfig(64, 64, 1, 2), KernelConfig(64, 64, 1, 3)]
    first, second, third = key("first"), key("second"), key("third")
    tuning.compile_ahead([(first, CONFIGS, lambda: compile_only), (second, slow, lambda: compile_only),
                          (third, CONFIGS[:1], lambda: compile_only)])  # (one candidate: not timed, not compiled)
    [batch] = batches
    assert len(batch.jobs) == 4 and set(tuning._ahead) == {first, second}
    started = time.monotonic()
    where = tuning._compile_concurrently(CONFIGS, compile_only, [first])
    assert where == (
        "ahead, in processes forked from this one (4 jobs; Inductor's compile workers not ready)")
    assert time.monotonic() - started < 15  # its own jobs only, not the second kernel's stuck ones
    assert len(_compiled_entries(cache)) == 2 and set(tuning._ahead) == {second}
    # the second kernel's jobs are stuck: its wait ends at the batch's deadline, the processes are ended and its
    # candidates compile here
    threads = tuning.AsyncCompileMode is not None
    where = tuning._compile_concurrently(slow, compile_only, [second])
    assert where == ("here (a job failed in a forked process)" if threads else "(when timed)")
    assert time.monotonic() - started < 40 and batch._stop is None and not tuning._ahead
    assert len(_compiled_entries(cache)) == (4 if threads else 2)


def test_candidates_compiled_ahead_are_waited_for_by_their_own_tuning_only(tmp_path):
    _in_a_fresh_process("candidates_compiled_ahead", tmp_path)


def tuner_with_one_compile_thread(cache_dir):
    from torch._inductor import config

    cache = _fresh_cache(cache_dir)
    compile_workers.worker_pool = lambda: None
    config.compile_threads = 1  # (TORCHINDUCTOR_COMPILE_THREADS=1: no processes)
    threads = tuning.AsyncCompileMode is not None
    assert _tuner_compiles() == ("here (Inductor's compile workers not ready)" if threads else "(when timed)")
    assert len(_compiled_entries(cache)) == (2 if threads else 0)


def test_with_one_compile_thread_the_tuner_compiles_here(tmp_path):
    _in_a_fresh_process("tuner_with_one_compile_thread", tmp_path)


def test_a_failed_job_is_reported_and_left_to_this_process(caplog):
    class FailingPool:
        def submit(self, fn, *args):
            future = Future()
            future.set_exception(RuntimeError("An exception occurred in a subprocess:\n...\nRuntimeError: no ptxas"))
            return future

    job = compile_workers.CompileJob(compile_job_kernel.__name__, compile_job_kernel.__file__, "copy_kernel", "{}",
                                     None, None, "")
    with caplog.at_level("INFO", logger="fuse_attn.kernels.tuning"):
        assert not compile_workers.start_in_workers(FailingPool(), [job]).wait()
    assert "compiling copy_kernel in a worker failed (RuntimeError: RuntimeError: no ptxas)" in caplog.text


@needs_cuda
def test_candidates_compile_on_inductors_workers_and_launch_here(tmp_path, monkeypatch):
    import time

    from torch._inductor.async_compile import AsyncCompile

    AsyncCompile.process_pool()
    start = time.monotonic()
    while not AsyncCompile.use_process_pool():
        if time.monotonic() - start > 120:
            pytest.skip("Inductor's compile workers did not start")
        time.sleep(0.2)
    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path))
    copy_kernel.device_caches.clear()
    args = _args("cuda")
    jobs = []
    with compile_workers.collecting(jobs):
        for cfg in CONFIGS:
            launch.launch(copy_kernel, (1,), args, cfg, warmup=True)
    assert len(jobs) == len(CONFIGS) and compile_workers.start_in_workers(compile_workers.worker_pool(), jobs).wait()
    _each_config_launches_from_the_cache(tmp_path, args)


def _each_config_launches_from_the_cache(cache_dir, args) -> None:
    """Every one of CONFIGS compiled once into ``cache_dir`` elsewhere; launched here, each copies, compiling nothing."""
    compiled = _compiled_entries(cache_dir)
    assert len(compiled) == len(CONFIGS)
    for cfg in CONFIGS:
        args["Y"].zero_()
        launch.launch(copy_kernel, (1,), args, cfg)
        torch.testing.assert_close(args["Y"], args["X"].float(), rtol=0, atol=0)
    assert _compiled_entries(cache_dir) == compiled


@needs_cuda
def test_candidates_compile_in_processes_forked_after_cuda_started_and_launch_here(tmp_path, monkeypatch):
    torch.zeros(1, device="cuda")  # (CUDA started in this process, as in any training process)
    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path))
    monkeypatch.setattr(compile_workers, "worker_pool", lambda: None)  # (Inductor's workers not ready)
    copy_kernel.device_caches.clear()
    args = _args("cuda")
    where = tuning._compile_concurrently(CONFIGS, lambda cfg: launch.launch(copy_kernel, (1,), args, cfg, warmup=True))
    assert where == f"in processes forked from this one ({len(CONFIGS)} jobs; Inductor's compile workers not ready)"
    built_here = []
    build = triton.runtime.build._build
    monkeypatch.setattr(triton.runtime.build, "_build", lambda name, *rest: built_here.append(name) or build(name, *rest))
    _each_config_launches_from_the_cache(tmp_path, args)
    assert built_here == []  # (a Triton that builds a launcher a signature: built by the batch's first job)


def _uncompiled_case(tmp_path, monkeypatch, length: int):
    """(q, k, v, spec) of a plain bf16 attention on the GPU whose generated kernels this process has not compiled, the
    tuner's choices and Triton's cache empty (in ``tmp_path``): a test that counts compiles."""
    from fuse_attn.kernels.generated import codegen
    from tests.support.cases import make_case

    monkeypatch.setenv("FUSE_ATTN_CACHE_DIR", str(tmp_path / "tuning"))
    monkeypatch.setattr(tuning, "_chosen", {})
    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path / "triton"))
    q, k, v, _, spec = make_case(Z=2, H=4, M=length, N=length, D=64, dtype=torch.bfloat16)
    mod = codegen.load_module(spec)
    for kernel in (mod._attn_fwd, mod._attn_bwd_dq, mod._attn_bwd_dkdv):
        kernel.device_caches.clear()  # (compiled by other tests)
    return q.cuda(), k.cuda(), v.cuda(), spec


@needs_cuda
def test_the_backwards_dq_and_dkdv_candidates_compile_in_one_batch(tmp_path, monkeypatch):
    # A fresh tuning of the generated backward: one batch compiles both kernels' candidates (dK/dV's binary does not
    # depend on dQ's config), and timing them afterwards compiles nothing more.
    q, k, v, spec = _uncompiled_case(tmp_path, monkeypatch, 256)

    def binaries() -> int:
        return len(_entries(tmp_path / "triton"))

    batches, real = [], tuning._compile_concurrently

    def counted(candidates, compile_only, keys=()):
        where = real(candidates, compile_only, keys)
        batches.append((len(candidates), binaries()))
        return where

    monkeypatch.setattr(tuning, "_compile_concurrently", counted)
    out, lse = launch.triton_forward(q, k, v, [], spec)
    dq, dk, dv, _ = launch.triton_backward(torch.randn_like(out), q, k, v, [], out, lse, spec, [])
    common = launch.common_kernel_args(q, k, v, spec)
    backward = [len(fn(common["BLOCK_D"], common["BLOCK_DV"], 2, common["CAUSAL"], tuning.shared_memory(q.device)))
                for fn in (tuning.dq_candidates, tuning.dkdv_candidates)]
    together = next(i for i, (n, _) in enumerate(batches) if n == sum(backward))
    assert [n for n, _ in batches[together + 1:]] == backward  # each tuning's own pass, after the batch
    assert batches[-1][1] == batches[together][1]  # ... which compiled nothing
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))


DQ_CONFIGS = [KernelConfig(64, 32, 4, 2), KernelConfig(128, 32, 8, 3)]


def _tuned_as_on_an_h200() -> None:
    """(In a scenario's process.) The generated kernels' configs are tuned as on a GPU, the tuner's device queries
    answered as an H200's (no GPU here)."""
    tuning.device_identity = lambda device: ("NVIDIA H200", "9.0")
    tuning.shared_memory = lambda device: tuning.SharedMemory(232448, wgmma=True)
    launch._tuned_on = lambda q: True


def _candidates(dq, dkdv, fwd=None) -> None:
    """(In a scenario's process.) The tuner's candidate configs of the backward's kernels (and the forward's)."""
    if fwd is not None:
        tuning.forward_candidates = lambda *_: fwd
    tuning.dq_candidates = lambda *_: dq
    tuning.dkdv_candidates = lambda *_: dkdv


def backwards_candidates_compile_ahead_into_the_binaries_launched(_):
    compile_for_sm90()
    from fuse_attn.kernels.generated import codegen
    from tests.support.cases import make_case

    dq_configs, dkdv_configs = DQ_CONFIGS, CONFIGS
    _candidates(dq=dq_configs, dkdv=dkdv_configs)
    _tuned_as_on_an_h200()
    compile_workers.worker_pool = lambda: None
    launch.triton_forward = lambda q, k, v, score_tensors, spec, seed=None: launch.empty_outputs(q, v)

    class TimingStarted(Exception):
        pass

    def timing(*_, **__):
        raise TimingStarted  # (only compiled kernels here: nothing is launched)

    launch.choose_kernel_config = timing
    q, k, v, tensors, spec = make_case(Z=2, H=4, M=256, N=256, D=64, dtype=torch.bfloat16)
    mod = codegen.load_module(spec)
    common = launch.common_kernel_args(q, k, v, spec)
    try:
        launch._backward_configs(mod, mod.KERNEL_ID, common, torch.randn_like(q), q, k, v, [], spec, [], None, False)
    except TimingStarted:
        pass

    def binaries(kernel) -> int:
        return sum(len(cache[0]) for cache in kernel.device_caches.values())

    assert (binaries(mod._attn_bwd_dq), binaries(mod._attn_bwd_dkdv)) == (len(dq_configs), len(dkdv_configs))
    # the binaries the tuner then launches: each dK/dV candidate after the other dQ config, compiling nothing new
    out, lse = launch.empty_outputs(q, v)
    bufs = launch._BackwardBuffers(q, k, v, lse, [], spec, [], False)
    for cfg in dkdv_configs:
        launch._launch_backward(mod, {"bwd_dq": dq_configs[1], "bwd_dkdv": cfg}, common, torch.randn_like(q), q, k, v,
                                [], out, lse, spec, None, bufs, False, only="bwd_dkdv", warmup=True)
    assert binaries(mod._attn_bwd_dkdv) == len(dkdv_configs)


def attention_candidates_compile_ahead(cache_dir):
    cache = _fresh_cache(cache_dir)
    from fuse_attn.kernels.generated import codegen
    from tests.support.cases import make_case

    os.environ["FUSE_ATTN_CACHE"] = "0"  # (no choice stored by another run)
    fwd_configs, dq_configs, dkdv_configs = CONFIGS, DQ_CONFIGS, CONFIGS
    _candidates(fwd=fwd_configs, dq=dq_configs, dkdv=dkdv_configs)
    _tuned_as_on_an_h200()
    compile_workers.worker_pool = lambda: None
    q, k, v, tensors, spec = make_case(Z=2, H=4, M=256, N=256, D=64, dtype=torch.bfloat16)
    launch.compile_candidates_ahead(q, k, v, [], spec, [], training=True)
    assert sorted(key.kind for key in tuning._ahead) == ["bwd_dkdv", "bwd_dq", "fwd"]
    [batch] = {batch for batch, _ in tuning._ahead.values()}
    assert len(batch.jobs) == 6 and batch.wait()
    compiled_ahead = _entries(cache)
    # what the tunings then launch loads from those entries: the forward's candidates, dQ's, and dK/dV's after any dQ
    mod = codegen.load_module(spec)
    common = launch.common_kernel_args(q, k, v, spec)
    run = launch._forward_binder(mod, q, k, v, [], spec, None, None)()
    for cfg in fwd_configs:
        run(cfg, True)
    out, lse = launch.empty_outputs(q, v)
    bufs = launch._BackwardBuffers(q, k, v, lse, [], spec, [], False)
    for dq_cfg in dq_configs:
        for kind, configs in (("bwd_dq", dq_configs), ("bwd_dkdv", dkdv_configs)):
            for cfg in configs:
                launch._launch_backward(mod, {"bwd_dq": dq_cfg, kind: cfg}, common, torch.randn_like(q), q, k, v, [],
                                        out, lse, spec, None, bufs, False, only=kind, warmup=True)
    assert _entries(cache) == compiled_ahead and len(compiled_ahead) == 6


def _entries(cache_dir) -> set:
    return {path.parent.name for path in Path(cache_dir).rglob("*.cubin")}


def test_an_attentions_candidates_compile_ahead_into_the_binaries_its_tunings_launch(tmp_path):
    # the forward's and the backward's candidates, submitted in one batch before either tuning: what the tunings
    # then launch loads from what that batch compiled (sm90 compiles, no GPU)
    _in_a_fresh_process("attention_candidates_compile_ahead", tmp_path)


def test_backwards_candidates_compile_ahead_into_the_binaries_launched():
    # dQ's and dK/dV's candidates compile in one batch before dQ is chosen, with a stand-in for dQ's config: the
    # dK/dV binaries are those launched after any dQ config (sm90 compiles, no GPU)
    in_a_fresh_process(__name__, "backwards_candidates_compile_ahead_into_the_binaries_launched", "")


@needs_cuda
def test_an_attentions_candidates_compile_ahead_and_its_tunings_compile_nothing_more(tmp_path, monkeypatch, caplog):
    # Candidates submitted ahead (forward and backward, in processes forked after CUDA started): each tuning waits for
    # its own, and every binary the tunings launch is one the batch compiled.
    from fuse_attn.kernels import ops

    monkeypatch.setattr(tuning, "_ahead", {})
    monkeypatch.setattr(compile_workers, "worker_pool", lambda: None)
    q, k, v, spec = _uncompiled_case(tmp_path, monkeypatch, 384)
    ops.compile_candidates_ahead(q, k, v, [], spec, [], training=True)
    assert sorted(key.kind for key in tuning._ahead) == ["bwd_dkdv", "bwd_dq", "fwd"]
    [batch] = {batch for batch, _ in tuning._ahead.values()}
    with caplog.at_level("INFO", logger="fuse_attn.kernels.tuning"):
        out, lse = launch.triton_forward(q, k, v, [], spec)
        dq, dk, dv, _ = launch.triton_backward(torch.randn_like(out), q, k, v, [], out, lse, spec, [])
    assert not tuning._ahead and batch._stop is None  # every job waited for, the processes ended
    compiled = [line for line in caplog.text.splitlines() if "compiled" in line and "candidates for" in line]
    assert len(compiled) == 3 and all(", in processes forked from this one" in line for line in compiled), compiled
    assert len(_entries(tmp_path / "triton")) == len(batch.jobs)
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))


def steps_compile_only(cache_dir):
    cache = _fresh_cache(cache_dir)
    from fuse_attn.kernels.hopper import backward as hopper_backward, forward as hopper_forward
    from fuse_attn.spec import AttentionSpec, CausalMask

    os.environ["FUSE_ATTN_CACHE"] = "0"  # (no choice stored by another run)
    _tuned_as_on_an_h200()
    spec = AttentionSpec(dtype="bfloat16", head_dim=64, head_dim_v=64, scale=0.125, causal=CausalMask(), gqa_group=2)
    q = torch.randn(2, 4, 200, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 200, 64, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(2, 4, 200)

    def steps():  # each implementation's forward and backward, as a candidate's step launches them
        out, template_lse = launch.triton_forward(q, k, v, [], spec)
        launch.triton_backward(torch.randn_like(out), q, k, v, [], out, template_lse, spec, [])
        hopper_forward.hopper_forward(q, k, v, spec)
        hopper_backward.hopper_backward(q.clone(), q, k, v, q.clone(), lse, spec)

    jobs = []
    with tuning.untimed(), compile_workers.compile_launches_only(), compile_workers.collecting(jobs):
        steps()
    names = {job.kernel_name for job in jobs}
    assert {"_attn_fwd", "_attn_bwd_dq", "_attn_bwd_dkdv", "_hopper_attn_fwd", "_hopper_attn_bwd"} <= names, names
    assert _entries(cache) == set() and not tuning.chosen_configs()  # nothing compiled here, no choice remembered
    for job in jobs:
        compile_job(job, cache_dir)
    compiled = _entries(cache)
    assert len(compiled) == len(jobs)
    with tuning.untimed(), compile_workers.compile_launches_only():  # the steps' compiles now find every binary
        steps()
    assert _entries(cache) == compiled


def test_a_steps_launches_compile_only_as_jobs_and_their_binaries_are_the_ones_it_launches(tmp_path):
    # The implementation choice compiles each candidate's step before timing any: inside compile_launches_only() the
    # template's and the Gluon kernels' launches become compile jobs, and launching nothing, remember no choice; the
    # step's compiles afterwards find what the jobs compiled (sm90 compiles, no GPU)
    _in_a_fresh_process("steps_compile_only", tmp_path)
