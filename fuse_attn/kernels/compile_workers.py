"""Compiling the tuner's candidate kernels in Inductor's compile-worker processes.

A cold tuning compiles every candidate config of a kernel before timing any (:func:`fuse_attn.kernels.tuning.tune`).
On a thread pool those compiles mostly take turns: Triton's front end and its MLIR passes hold the GIL, so on an
H200 host 10 forward candidates of BERT's padded attention took 8.5-9 s on 10 threads, about what they take one by
one. Here each candidate's compile is a job for Inductor's compile workers -- the processes that compile Inductor's
own kernels, started by ``torch.compile`` with this process's ``sys.path`` -- which write the compiled kernel to
Triton's disk cache, where this process's launches of it load it from.

A job is Triton's own record of a compile it was asked for (the ``specialization_data`` its ``jit_cache_hook``
receives: the signature, the specialization of every argument, constexprs, options), taken while the compile is
skipped here, and compiled in the worker by ``JITFunction.preload`` for this process's GPU target. The workers are
forked and may not touch CUDA, so there Triton's driver is replaced, for the job, by one that names that target
(``preload`` asks the driver for the device and the target only). Triton's cache key names the ptxas that compiles
(its version), and Inductor's workers point Triton at the ptxas bundled with torch (``TRITON_PTXAS_PATH``, set as they
start) where this process may use Triton's own: on an H200 host the workers' ptxas of CUDA 13.0 against this
process's 12.8 gave every worker compile another key, so none was found here. A job therefore carries this process's
ptxas and its backend's hash (read again where Inductor has since pointed this process at torch's ptxas:
:func:`_submitters_ptxas_and_key`), compiles with that ptxas, and fails where the hash still differs. The workers are an
optimization: a job that fails, or a kernel that does not load from the cache, is compiled in this process as before.

Inductor's workers take about 8 s to start on an H200 host, from the backend's first call, and the forward's tuning
comes before that (BERT's 10 forward candidates then compiled here in 8 s). Until they are ready, a batch of jobs runs
in processes forked from this one for it (:func:`start_in_forked_processes`): a fork inherits every loaded module,
and two forked from a process with torch, Triton and this package loaded answered a first job 45-50 ms later on a
2-core CPU host.

Jobs are submitted as a :class:`Batch`, which the tuner waits for a part at a time: the candidates of several kernels
compile in one batch, a kernel's once the kernel timed before it has its own (stages), each kernel's tuning waiting for
its own. The first job of each kernel in a batch also builds the kernel's launcher where Triton builds one for each
signature (Triton 3.6's C launcher), so the launching process loads it instead of compiling it. Inside :func:`compile_launches_only` this package's
launchers only compile their kernels (a job each inside :func:`collecting`): how a whole step's kernels -- an
implementation candidate's forward and backward -- become jobs before the step is timed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import logging
import multiprocessing
import sys
import threading
import time
import warnings
from concurrent.futures import Future
from typing import Any, Optional, Sequence

log = logging.getLogger("fuse_attn.kernels.tuning")


@dataclasses.dataclass(frozen=True)
class CompileJob:
    """One kernel compile, picklable: the kernel's module (by name and file) and name, Triton's specialization data
    of the compile, the GPU target, the submitting process's ptxas (None on a backend without one) and backend
    hash (the part of Triton's cache key that names the compiler), and whether the job also builds the kernel's
    launcher (:func:`_build_launcher`: one job a kernel of a batch does)."""

    module_name: str
    module_file: str
    kernel_name: str
    specialization_data: str
    target: Any  # triton.backends.compiler.GPUTarget
    ptxas: Optional[str]
    backend_hash: str
    builds_launcher: bool = False


_collected: Optional[list] = None


@contextlib.contextmanager
def collecting(jobs: list):
    """Within it, :func:`collect` appends the compiles it is given to ``jobs`` instead of compiling them."""
    global _collected
    outer, _collected = _collected, jobs
    try:
        yield jobs
    finally:
        _collected = outer


_compile_only_depth = 0  # > 0 inside compile_launches_only()


@contextlib.contextmanager
def compile_launches_only():
    """Within it every kernel launch of this package's launchers only compiles its kernel (Triton's ``warmup``; a job
    for :func:`collect` inside :func:`collecting`) and runs nothing: a step's launches compiled before the step is
    timed. Their outputs are then whatever the allocator held."""
    global _compile_only_depth
    _compile_only_depth += 1
    try:
        yield
    finally:
        _compile_only_depth -= 1


def launches_compile_only() -> bool:
    """Whether a launch now only compiles its kernel (:func:`compile_launches_only`)."""
    return _compile_only_depth > 0


def collect(kernel, grid: tuple, args: dict, options: dict) -> bool:
    """Whether the compile of ``kernel`` with ``args`` was taken as a job, or needs none (compiled in this process
    already); False where it must be compiled here: outside :func:`collecting`, or a kernel that is not its module's
    attribute of its name (a worker could not find it)."""
    if _collected is None:
        return False
    fn = getattr(kernel, "fn", None)
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    module_file = getattr(module, "__file__", None)
    if fn is None or module_file is None or getattr(module, fn.__name__, None) is not kernel:
        return False
    from triton import knobs
    from triton.runtime import driver

    asked = []

    def skip_the_compile(*, compile, **_):
        asked.append(compile["specialization_data"])
        return True  # (Triton then compiles nothing and launches nothing)

    previous, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, skip_the_compile
    try:
        with _functions_recorded_by_name():
            kernel.warmup(**args, **options, grid=grid)
    finally:
        knobs.runtime.jit_cache_hook = previous
    if asked and not any((job.module_file, job.kernel_name, job.specialization_data) == (module_file, fn.__name__,
                                                                                          asked[0])
                         for job in _collected):  # (a step may launch one specialization twice: one job)
        target = driver.active.get_current_target()
        _collected.append(CompileJob(module.__name__, module_file, fn.__name__, asked[0], target,
                                     *_submitters_ptxas_and_key(target)))
    return True


# A job's record of a constexpr that is a JIT function: ``{_FUNCTION: [module name, module file, function name]}``
_FUNCTION = "fuse_attn_jit_function"
_recording_lock = threading.Lock()


@contextlib.contextmanager
def _functions_recorded_by_name():
    """Within it, Triton's record of a compile (``serialize_specialization_data``) names each constexpr that is a
    ``@triton.jit`` or ``@gluon.jit`` function by its module and name, which :func:`compile_job` loads back. Triton
    3.6 records such a constexpr as it is and 3.9 a Gluon one (3.9 names a plain one for its own registry), which JSON
    refuses: the Gluon kernels' generated score programs (packed documents, key padding, softcaps, ALiBi from slopes)
    compiled only when first timed, one after another, never as jobs."""
    from triton.runtime import jit

    with _recording_lock:
        record = jit.serialize_specialization_data

        def by_name(name, signature, constants, *rest):
            return record(name, signature, {key: _named(value) for key, value in constants.items()}, *rest)

        jit.serialize_specialization_data = by_name
        try:
            yield
        finally:
            jit.serialize_specialization_data = record


def _named(value):
    """A constexpr as :func:`_functions_recorded_by_name` records it: a JIT function of a module with a file by name,
    anything else as it is."""
    from triton.runtime.jit import JITFunction

    module = sys.modules.get(value.fn.__module__) if isinstance(value, JITFunction) else None
    if getattr(module, "__file__", None) is None or getattr(module, value.fn.__name__, None) is not value:
        return value
    return {_FUNCTION: [module.__name__, module.__file__, value.fn.__name__]}


def _preloaded(kernel, specialization_data: str):
    """(In a worker.) ``kernel.preload`` of a job's record, each constexpr it names a function of
    (:func:`_functions_recorded_by_name`) that function: Triton's ``preload`` passes such a record's value on as it
    is, to the compile (``_do_compile``, one signature in Triton 3.6-3.9) that this replaces it in."""
    compile_kernel = kernel._do_compile

    def with_functions(key, signature, device, constexprs, *rest, **options):
        loaded = {path: getattr(_module(*value[_FUNCTION][:2]), value[_FUNCTION][2])
                  if isinstance(value, dict) and _FUNCTION in value else value for path, value in constexprs.items()}
        return compile_kernel(key, signature, device, loaded, *rest, **options)

    kernel._do_compile = with_functions
    try:
        return kernel.preload(specialization_data)
    finally:
        del kernel._do_compile


# The ptxas whose version (part of Triton's key) this module last had Triton read, by target arch
_ptxas_of_the_key: dict[int, str] = {}


def _submitters_ptxas_and_key(target) -> tuple[Optional[str], str]:
    """The ptxas Triton compiles ``target``'s kernels with now, and the key it compiles them under: its backend's
    hash, the ptxas version in it read again where the ptxas is not the one it was read from. Inductor points
    ``TRITON_PTXAS_PATH`` at torch's own ptxas as it first compiles a kernel in a process
    (``torch/_inductor/runtime/compile_tasks.py``: ``_set_triton_ptxas_path``), after Triton may have cached the
    version of its own: Triton then compiles with one ptxas under the other's key, and a worker given that ptxas
    computes another key and refuses the job (on an H200 with torch 2.11+cu130, every forked job of a training step's
    backward: its 23 candidates then compiled one after another in the launching process, 17.6 s)."""
    ptxas = _ptxas(target)
    if ptxas is not None and _ptxas_of_the_key.get(target.arch) != ptxas:
        from triton.backends.nvidia.compiler import get_ptxas_version

        get_ptxas_version.cache_clear()
        _ptxas_of_the_key[target.arch] = ptxas
    return ptxas, _backend_hash(target)


def _ptxas(target) -> Optional[str]:
    if target.backend != "cuda":
        return None
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(target.arch).path


def _backend_hash(target) -> str:
    from triton.compiler.compiler import make_backend

    return make_backend(target).hash()


class Batch:
    """Jobs compiling elsewhere -- on Inductor's workers or in processes forked for them -- that the submitter waits
    for a part at a time (:meth:`wait`): the tuner submits the candidates of several kernels at once and waits for each
    kernel's when it is about to time them. ``stop`` (the forked processes' end) runs once every job was waited for,
    or when a wait runs out of time (:data:`FORKED_BATCH_TIMEOUT_S`)."""

    def __init__(self, jobs: Sequence[CompileJob], waits: Sequence, place: str, where: str, stop=None):
        """``place``: where one job runs ("in a worker"), ``where``: where the batch runs, for the logs."""
        self.jobs, self.place, self.where = list(jobs), place, where
        self._waits, self._stop = list(waits), stop
        self._waited: set[int] = set()
        self._lock = threading.Lock()

    def wait(self, indices: Optional[Sequence[int]] = None) -> bool:
        """Whether the jobs ``indices`` (default: all) compiled, once they are done."""
        indices = range(len(self.jobs)) if indices is None else indices
        with self._lock:
            try:
                compiled = _each_compiled([self.jobs[i] for i in indices], [self._waits[i] for i in indices],
                                          self.place)
            except multiprocessing.TimeoutError:
                log.info("fuse_attn: compiling %s took over %.0f s; compiling here", self.where, FORKED_BATCH_TIMEOUT_S)
                self._stopped()
                return False
            self._waited.update(indices)
            if len(self._waited) == len(self.jobs):
                self._stopped()
            return compiled

    def stop(self) -> None:
        """End the processes compiling, whatever they are doing (the jobs not yet waited for then fail)."""
        with self._lock:
            self._stopped()

    def _stopped(self) -> None:
        stop, self._stop = self._stop, None
        if stop is not None:
            stop()


def start_in_workers(pool, jobs: Sequence[CompileJob], stages: Optional[Sequence[Sequence[int]]] = None) -> Batch:
    """``jobs`` submitted to ``pool`` (:func:`worker_pool`'s), a stage at a time (:func:`_in_stages`); a job the pool
    does not take fails (and is compiled here)."""
    from triton import knobs

    jobs = _launchers_built_once(jobs)

    def submit(i: int, outcome: Future) -> None:
        pool.submit(compile_job, jobs[i], knobs.cache.dir).add_done_callback(lambda done: _copy_outcome(done, outcome))

    futures = _in_stages(submit, len(jobs), stages)
    return Batch(jobs, [future.result for future in futures], "in a worker",
                 f"on Inductor's compile workers ({len(jobs)} jobs)")


def _in_stages(submit, count: int, stages: Optional[Sequence[Sequence[int]]], deadline: Optional[float] = None
               ) -> list[Future]:
    """A future of the outcome of each of ``count`` jobs, ``submit(i, future)`` starting job i: every job at once where
    ``stages`` is None, else a stage (a list of job indices; the stages cover every job) once every job of the stages
    before it ended -- the first one here, the others from a thread of their own, which submits no more after
    ``deadline`` (``time.monotonic()``; the jobs not submitted then never end). The tuner's stages are each kernel's
    candidates in the order the kernels are timed, so the one timed first has the CPUs to itself: on an H200 host (16
    cores) BERT's forward waited 4.1 and 5.0 s for its 10 candidates compiled in forked processes before the backward's
    23, against 4.8 and 5.8 s beside them (two runs each, alternated, one machine; Triton's source digest computed
    before the fork in the first). A job whose submission fails fails."""
    futures = [Future() for _ in range(count)]
    stages = [range(count)] if stages is None else [list(stage) for stage in stages]

    def submitted(stage) -> None:
        for i in stage:
            try:
                submit(i, futures[i])
            except Exception as e:  # noqa: BLE001 -- (a pool ended meanwhile) the job fails: compiled here
                futures[i].set_exception(e)

    def later_stages() -> None:
        for before, stage in zip(stages, stages[1:]):
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            if concurrent.futures.wait([futures[i] for i in before], timeout).not_done:
                return
            submitted(stage)

    submitted(stages[0])
    if len(stages) > 1:
        threading.Thread(target=later_stages, name="fuse_attn compile stages", daemon=True).start()
    return futures


def _copy_outcome(done: Future, outcome: Future) -> None:
    error = done.exception()
    if error is None:
        outcome.set_result(done.result())
    else:
        outcome.set_exception(error)


def _launchers_built_once(jobs: Sequence[CompileJob]) -> list[CompileJob]:
    """``jobs`` with the first of each kernel's building its launcher: a kernel's candidates differ in constexprs
    and options only, which its launcher does not take, so they share one."""
    kernels = set()
    out = []
    for job in jobs:
        kernel = (job.module_file, job.kernel_name)
        out.append(dataclasses.replace(job, builds_launcher=kernel not in kernels))
        kernels.add(kernel)
    return out


def _each_compiled(jobs: Sequence[CompileJob], waits: Sequence, place: str) -> bool:
    """Whether every job compiled: ``waits[i]()`` waits for job i and raises its error, which is logged (the kernel is
    then compiled here, where an error is reported); ``multiprocessing.TimeoutError`` is left to the caller."""
    compiled = True
    for job, wait in zip(jobs, waits):
        try:
            wait()
        except multiprocessing.TimeoutError:
            raise
        except Exception as e:  # noqa: BLE001 -- compiled here instead, where an error is reported
            compiled = False
            log.info("fuse_attn: compiling %s %s failed (%s)", job.kernel_name, place, _last_line(e))
    return compiled


def _last_line(error: Exception) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1].strip() if lines else ''}"


def worker_pool():
    """Inductor's compile workers, where they are ready; else None: ``compile_threads`` of 1, a daemonic process, a
    pool still starting (the backend starts it at its first call on CUDA inputs, about 8 s before it is ready on an
    H200 host; jobs would wait for it), or an Inductor without the pool's interface."""
    try:
        from torch._inductor.async_compile import AsyncCompile

        if not AsyncCompile.use_process_pool():
            return None
        return AsyncCompile.process_pool()
    except Exception as e:  # noqa: BLE001 -- a private interface of Inductor's: without it, compile here
        log.info("fuse_attn: no Inductor compile workers (%s: %s)", type(e).__name__, e)
        return None


# How long the processes forked for a batch of jobs may take, in all. A candidate compiles in about 1 s on an H200 host
# (BERT's forward: 10 in 8 s one after the other), and each process takes one or two; processes still busy after this
# long are taken to be stuck (a lock some other thread of this process held at the fork) and are killed, and this
# process compiles what they did not.
FORKED_BATCH_TIMEOUT_S = 60.0


def processes_to_fork() -> int:
    """How many processes forked from this one may compile jobs: Inductor's ``compile_threads`` (the parallelism a
    user allows Inductor's own compiles; 1 -- ``TORCHINDUCTOR_COMPILE_THREADS=1`` -- and none are forked), where the
    platform forks and this process is no daemon (which may have no children); else 0."""
    try:
        from torch._inductor import config

        threads = config.compile_threads if config.compile_threads is not None else config.decide_compile_threads()
    except Exception:  # noqa: BLE001 -- an Inductor without these: no processes of ours either
        return 0
    if threads < 2 or "fork" not in multiprocessing.get_all_start_methods() or multiprocessing.current_process().daemon:
        return 0
    return threads


def start_in_forked_processes(jobs: Sequence[CompileJob], processes: int,
                              stages: Optional[Sequence[Sequence[int]]] = None) -> Optional[Batch]:
    """``jobs`` running in ``processes`` forked from this one (at most one a job), a stage at a time
    (:func:`_in_stages`), for the time Inductor's workers are not ready; None where no process could be forked. The
    processes never touch CUDA -- :func:`compile_job` compiles with the compile-only driver -- as DataLoader workers
    forked after CUDA is initialized do not. A job not done :data:`FORKED_BATCH_TIMEOUT_S` after the submission
    fails, and the processes are ended then at the latest (a timer ends them where nobody waits for the last jobs)."""
    from triton import knobs
    from triton.runtime.cache import triton_key

    jobs = _launchers_built_once(jobs)
    # The digest of Triton's sources in every compile's cache key, kept once a process: 1.1 s of an H200 host's time,
    # which each process forked before it would spend again (this process computes it for its own compiles anyway).
    triton_key()
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            # (Python 3.12 warns of any fork of a process with threads: the children here run one job each and
            # exit, and take no lock another thread could have held)
            warnings.simplefilter("ignore", DeprecationWarning)
            pool = multiprocessing.get_context("fork").Pool(min(len(jobs), processes))
    except Exception as e:  # noqa: BLE001 -- no processes: compile here
        log.info("fuse_attn: no processes forked for compiling (%s: %s)", type(e).__name__, e)
        return None
    log.info("fuse_attn: forked %d processes for compiling in %.2f s", min(len(jobs), processes),
             time.perf_counter() - start)

    def submit(i: int, outcome: Future) -> None:
        pool.apply_async(compile_job, (jobs[i], knobs.cache.dir), callback=outcome.set_result,
                         error_callback=outcome.set_exception)

    deadline = time.monotonic() + FORKED_BATCH_TIMEOUT_S
    futures = _in_stages(submit, len(jobs), stages, deadline)

    def waiting_until_the_deadline(future: Future):
        def wait():
            try:
                return future.result(max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                raise multiprocessing.TimeoutError from None
        return wait

    timer = threading.Timer(FORKED_BATCH_TIMEOUT_S, lambda: batch.stop())
    timer.daemon = True

    def stop():
        timer.cancel()
        pool.terminate()

    batch = Batch(jobs, [waiting_until_the_deadline(future) for future in futures], "in a forked process",
                  f"in processes forked from this one ({len(jobs)} jobs; Inductor's compile workers not ready)", stop)
    timer.start()
    return batch


class CompileOnlyDriver:
    """Triton's driver for compiling, not launching: device 0 and the given target, no CUDA. Set with
    ``triton.runtime.driver.set_active``."""

    def __init__(self, target):
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Optional[int] = None) -> int:
        return 0

    def get_current_target(self):
        return self.target


@contextlib.contextmanager
def compiling_only_for(target):
    """Triton's driver is a :class:`CompileOnlyDriver` of ``target`` within it; after it, the driver before it. (The
    one before is read from Triton's ``DriverConfig._active``, None until a driver is first used: its public
    ``active`` and ``reset_active`` would create Triton's default driver, which asks torch for CUDA.)"""
    from triton.runtime import driver

    previous = getattr(driver, "_active", None)
    driver.set_active(CompileOnlyDriver(target))
    try:
        yield
    finally:
        driver.set_active(previous)


def compile_job(job: CompileJob, cache_dir: str) -> None:
    """(In a worker.) Compile ``job`` into Triton's cache at ``cache_dir``, the submitting process's."""
    from triton import knobs

    kernel = getattr(_module(job.module_name, job.module_file), job.kernel_name)
    previous, knobs.cache.dir = knobs.cache.dir, cache_dir
    try:
        with compiling_only_for(job.target), compiling_with_ptxas(job.ptxas):
            backend_hash = _backend_hash(job.target)
            if backend_hash != job.backend_hash:
                raise RuntimeError(f"this worker's Triton compiles under another key ({backend_hash!r}, the "
                                   f"submitter's {job.backend_hash!r}); its compile would not be found there")
            compiled = _preloaded(kernel, job.specialization_data)
            if job.builds_launcher and compiled is not None:
                _build_launcher(compiled, job.target)
    finally:
        knobs.cache.dir = previous


def _build_launcher(compiled, target) -> None:
    """(In a worker, within the job's cache.) Build the launcher of ``compiled`` (a ``CompiledKernel``) into Triton's
    cache where Triton builds one for each signature: Triton 3.6's CUDA launcher is C source compiled by the host's C
    compiler, 1 s of the launching process's time for each of BERT's three attention kernels on an H200 host; that
    process then loads it from the cache. Triton 3.9 launches every kernel through one launcher: nothing to build.
    Only an optimization: where it fails, the launching process builds it as before."""
    if target.backend != "cuda":
        return
    from triton.backends.nvidia import driver as nvidia_driver

    if not hasattr(nvidia_driver, "make_launcher"):
        return
    try:
        nvidia_driver.CudaLauncher(compiled.src, compiled.metadata)
    except Exception:  # noqa: BLE001 -- (no C compiler, no libcuda here) the launching process builds it
        pass


@contextlib.contextmanager
def compiling_with_ptxas(path: Optional[str]):
    """(In a worker.) Triton's NVIDIA backend compiles with the ptxas at ``path`` within it (None: with its own
    choice). Its ``get_ptxas`` is replaced -- the one function through which the backend finds ptxas, whose knob
    differs between Triton versions (``ptxas`` or ``ptxas_blackwell`` for sm90) -- and the cached version of the
    ptxas, part of the cache key, is dropped on entry and exit."""
    if path is None:
        yield
        return
    from triton import knobs
    from triton.backends.nvidia import compiler as nvidia

    tool = knobs.NvidiaTool.from_path(path)
    if tool is None:
        raise RuntimeError(f"the submitter's ptxas {path} does not run here")
    previous = nvidia.get_ptxas
    nvidia.get_ptxas = lambda arch: tool
    nvidia.get_ptxas_version.cache_clear()
    try:
        yield
    finally:
        nvidia.get_ptxas = previous
        nvidia.get_ptxas_version.cache_clear()


@functools.lru_cache(maxsize=None)
def _module(name: str, file: str) -> Any:
    """The module ``name`` of ``file``: imported where it is importable by name (this package's kernels), else
    loaded from the file (generated kernels)."""
    try:
        module = importlib.import_module(name)
        if getattr(module, "__file__", None) == file:
            return module
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
