"""Property-based tests (hypothesis): random attentions -- sizes (1, primes, tile edges), head dims, dtypes, q/k/v
layouts (transposed, sliced, expanded), bias / bool / additive masks with every fill, softcap, ALiBi, index bands,
GQA, causal and sliding windows, dropout -- through the fused op and through ``torch.compile(backend="fuse_attn")``,
outputs and gradients against eager PyTorch under the 2x rule (tests/support/fuzz_cases.py).

Profiles (``FUSE_ATTN_FUZZ_PROFILE``):

* ``fast`` (default, CI): derandomized -- the same cases on every run -- and small: the op in Triton's interpreter
  and on the CPU blockwise path, and a few end-to-end compiles; well under a minute on 2 CPU cores.
* ``long``: random cases, larger sizes, ``FUSE_ATTN_FUZZ_CASES`` (default 10,000) through the op and
  ``FUSE_ATTN_FUZZ_COMPILED_CASES`` (default 100) through ``torch.compile``, on a GPU (``TRITON_INTERPRET=0``); on a
  CPU the same runs the blockwise path. A failing case does not stop the run: every failure is collected, then the
  test fails listing them.

With ``FUSE_ATTN_FUZZ_RECORD=path.md`` the result (date, device, versions, cases run and passed, failures) is
written into that file's fuzz table (docs/testing.md says how); with ``FUSE_ATTN_FUZZ_ACCUMULATE=1`` a
run adds its counts to the row of an earlier run of the same profile, device, versions and test (a long run split
over several calls), and with ``FUSE_ATTN_FUZZ_SECONDS=S`` a long run stops starting new cases after S seconds
(so a call with a wall-clock limit still records what it ran).
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from tests.support import fuzz_record
from tests.support.fuzz_cases import (GeneratedAttention, assert_matches_eager, cases, check_op, gluon_cases, gluon_op,
                                      module_inputs)
from fuse_attn import settings as fuse_attn_settings
from fuse_attn.kernels.generated import codegen
from fuse_attn.report import collect_reports

PROFILE = os.environ.get("FUSE_ATTN_FUZZ_PROFILE", "fast")
LONG = PROFILE == "long"
CUDA = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
LONG_CASES = int(os.environ.get("FUSE_ATTN_FUZZ_CASES", "10000"))
# Long profile on a GPU: kernel-defining choices from this many fixed combinations (fuzz_cases.cases), so the run
# compiles a bounded number of kernel families (each costs seconds of Triton compiles) and spends its time on cases.
LONG_SPEC_POOL = int(os.environ.get("FUSE_ATTN_FUZZ_SPECS", "24"))
# Long profile on a GPU, FUSE_ATTN_FUZZ_SHARD=i/n: this process draws only the combinations i, i + n, ... of that pool,
# so that n processes run at once, each compiling its share of the kernels (a Triton compile of one of these
# kernels takes tens of seconds, on one CPU core).
SHARD = tuple(int(x) for x in os.environ.get("FUSE_ATTN_FUZZ_SHARD", "0/1").split("/"))
# Each compiled case runs Dynamo, the rewrite and Inductor (seconds): fewer of them.
LONG_COMPILED_CASES = int(os.environ.get("FUSE_ATTN_FUZZ_COMPILED_CASES", "100"))
# Long profile: a test stops running new cases after this many seconds and records what it ran, so that a call with
# a wall-clock limit (the device tool's 10 minutes) still writes its counts; unset: no limit.
LONG_SECONDS = float(os.environ.get("FUSE_ATTN_FUZZ_SECONDS", "inf"))
# FUSE_ATTN_SPECIALIZE=0 (fuse_attn/kernels/codegen.py): one Triton compile per kernel, spec and launch config; the
# recorded rows name it, since those kernels lack the alignment hints of the shipped ones.
KERNELS = "GPU kernels" + ("" if fuse_attn_settings.specialized() else " (unspecialized)")

# The interpreter evaluates the padding rows of a tail block in numpy too; those rows are never stored.
pytestmark = [
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                               "ignore:divide by zero encountered:RuntimeWarning",
                               "ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.skipif(PROFILE not in ("fast", "long"), reason=f"unknown FUSE_ATTN_FUZZ_PROFILE {PROFILE!r}"),
]


def profile(examples: int, shrink: bool = True) -> settings:
    """Fast: the same ``examples`` cases every run (no example database, no deadline: the interpreter's first call
    of a new spec generates and loads its kernels), a failure shrunk to a small case unless ``shrink`` is False
    (each step of shrinking a compiled case compiles anew). Long: random cases, no shrinking (failures are
    collected)."""
    # function_scoped_fixture: the tests only set TRITON_INTERPRET through monkeypatch, the same for every example
    common = dict(deadline=None, database=None, suppress_health_check=[
        HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
    if LONG:
        return settings(max_examples=examples, phases=("generate",), **common)
    phases = ("explicit", "reuse", "generate", "target", "shrink") if shrink else ("explicit", "reuse", "generate", "target")
    return settings(max_examples=examples, derandomize=True, phases=phases, **common)


class Tally:
    """Cases run and passed by one test; in the long profile, failures are kept (and the run goes on)."""

    def __init__(self, name: str):
        self.name, self.run, self.passed, self.failures, self.start = name, 0, 0, [], time.perf_counter()
        self.exact_delta_passes = 0  # failures of fp16 / bf16 cases that pass with FUSE_ATTN_EXACT_DELTA=1

    def check(self, fn, case):
        if LONG and time.perf_counter() - self.start > LONG_SECONDS:
            return  # over the time budget: the case is drawn but neither run nor counted
        self.run += 1
        if LONG and self.run % 100 == 0:
            print(f"[fuzz] {self.name}: {self.run} cases, {len(self.failures)} failed, "
                  f"{time.perf_counter() - self.start:.0f} s"
                  + (f", {compiled_variants()} compiled kernel variants" if CUDA else ""), flush=True)
        try:
            fn(case)
        except Exception as e:
            if not LONG:
                raise
            failure = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} -- {case}"
            if passes_with_exact_delta(fn, case):
                self.exact_delta_passes += 1
                failure = f"{fuzz_record.EXACT_DELTA_MARK} {failure}"
            print(f"[fuzz] FAILED {failure}", flush=True)
            self.failures.append(failure)
            return
        self.passed += 1

    def finish(self):
        if LONG and CUDA:
            print(f"[fuzz] {self.name}: {compiled_variants()} compiled kernel variants", flush=True)
        fuzz_record.add(self.name, self.run, self.passed, self.failures, time.perf_counter() - self.start,
                        self.exact_delta_passes)
        assert not self.failures, f"{len(self.failures)} of {self.run} cases failed:\n" + "\n".join(self.failures[:20])


def passes_with_exact_delta(fn, case) -> bool:
    """Whether a failed fp16 / bf16 case passes when the kernels take delta = rowsum(P dP) from P and dP
    (``FUSE_ATTN_EXACT_DELTA=1``) instead of FlashAttention's rowsum(dO * O): the failure is then that known
    difference (docs/testing.md), O rounded to the input dtype. fp32 already takes the exact delta."""
    if case.dtype == "float32" or fuse_attn_settings.exact_delta_forced():
        return False
    os.environ["FUSE_ATTN_EXACT_DELTA"] = "1"
    try:
        fn(case)
    except Exception:
        return False
    finally:
        del os.environ["FUSE_ATTN_EXACT_DELTA"]
    return True


def compiled_variants() -> int:
    """Triton compiles held by the launched kernels of every generated module (each new specialization of a kernel
    is one); ``JITFunction.device_caches`` maps a device to (compiled kernels by key, ...) in triton 3.3 - 3.9."""
    total = 0
    for mod in codegen._modules.values():
        for fn in vars(mod).values():
            for caches in getattr(fn, "device_caches", {}).values():
                total += len(caches[0])
    return total


@pytest.fixture(scope="module", autouse=True)
def _record():
    yield
    fuzz_record.write(PROFILE, device())


def device() -> str:
    return torch.cuda.get_device_name() if CUDA else "CPU"


# ---- the op ------------------------------------------------------------------------------------------------------
# Interpreter cost grows with Z * H * M * N (each program is interpreted in numpy): bounded so that 12 cases run
# in ~20 s. fp32 only: the fp16 / bf16 kernels' known precision limit (a peaked softmax; docs/testing.md and
# tests/kernels/test_edge_semantics.py::test_fp16_peaked_softmax_gradient_limit) would fail the fast profile; the long
# profile fuzzes every dtype through the kernels and records what fails.
INTERPRETER_MAX_ELEMENTS = 3000


@pytest.mark.skipif(LONG or os.environ.get("TRITON_INTERPRET") != "1", reason="fast profile, Triton interpreter")
@profile(12)
@given(case=cases(dtypes=("float32",), max_elements=INTERPRETER_MAX_ELEMENTS))
def test_op_in_interpreter(case):
    tally = _tallies.setdefault("op, Triton interpreter", Tally("op, Triton interpreter"))
    tally.check(check_op, case)


@pytest.mark.skipif(LONG and CUDA, reason="the long profile on a GPU fuzzes the kernels instead")
@profile(LONG_CASES if LONG else 40)
@given(case=cases(long=LONG))
def test_op_blockwise(case, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    _tallies.setdefault("op, CPU blockwise", Tally("op, CPU blockwise")).check(check_op, case)


@pytest.mark.skipif(not CUDA, reason="needs a GPU and TRITON_INTERPRET=0")
@profile(LONG_CASES if LONG else 200)
@given(case=cases(long=LONG, spec_pool=LONG_SPEC_POOL, shard=SHARD))
def test_op_cuda(case):
    name = f"op, {KERNELS}"
    _tallies.setdefault(name, Tally(name)).check(lambda c: check_op(c, "cuda"), case)


# sm90 with Triton's compiler: the Gluon kernels run (their op elsewhere runs the generated forward)
HOPPER = CUDA and torch.cuda.get_device_capability() == (9, 0)


@profile(LONG_CASES if LONG else (200 if HOPPER else 4))
@given(case=gluon_cases(long=LONG))
def test_op_gluon(case, monkeypatch):
    """The Gluon ops on what they take (plain or ``s + bias``, causal or not, GQA, fp16 / bf16, D64 / D128, any q / k
    / v layout), each call through their launchers' cached positional launches (many shapes in one process: each
    specialization compiled once, then run positionally). Elsewhere the op runs on CPU tensors, where it runs the
    generated forward (a few cases: the wiring)."""
    if not HOPPER:
        monkeypatch.setenv("TRITON_INTERPRET", "0")  # (the blockwise path: the interpreter's kernels are fuzzed above)
    name = "Gluon op, " + (f"{KERNELS} (sm90)" if HOPPER else "its CPU path")
    _tallies.setdefault(name, Tally(name)).check(lambda c: check_op(c, "cuda" if HOPPER else "cpu", op=gluon_op), case)


_tallies: dict[str, Tally] = {}


@pytest.fixture(autouse=True)
def _finish_tallies():
    """Each test function runs its examples, then its tally is recorded (and fails on collected failures)."""
    _tallies.clear()
    yield
    for tally in _tallies.values():
        tally.finish()


# ---- end to end --------------------------------------------------------------------------------------------------
def check_compiled(case, device="cpu"):
    """``torch.compile(GeneratedAttention(case), backend="fuse_attn")``: the attention fused (exactly one), output
    and gradients of every input and parameter against the module run eagerly in the dtype and in fp64."""
    dtype = case.torch_dtype
    model = GeneratedAttention(case)
    models = {name: GeneratedAttention(case).to(device, d) for name, d in (("ours", dtype), ("eager", dtype), ("ref", torch.float64))}
    for m in models.values():
        m.load_state_dict({k: v.to(device) for k, v in model.state_dict().items()})
        for p in m.parameters():  # load_state_dict keeps each model's dtype
            p.requires_grad_(case.bias_grad)
    raw = module_inputs(case)
    ins = {name: [(x.to(device, d) if x.is_floating_point() else x.to(device)).requires_grad_(x.is_floating_point())
                  for x in raw] for name, d in (("ours", dtype), ("eager", dtype), ("ref", torch.float64))}
    torch._dynamo.reset()
    compiled = torch.compile(models["ours"], backend="fuse_attn")
    with collect_reports() as reports:
        out = compiled(*ins["ours"])
    verdicts = [v for r in reports for v in r.verdicts]
    assert [v.fused for v in verdicts] == [True], "not fused:\n" + "\n".join(v.line() for v in verdicts)
    outs = {"ours": out, "eager": models["eager"](*ins["eager"]), "ref": models["ref"](*ins["ref"])}
    assert_matches_eager("out", outs["ours"], outs["ref"], outs["eager"], dtype)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(case.seed + 3)).to(device)
    grads = {}
    for name in outs:
        leaves = [x for x in ins[name] if x.requires_grad] + [p for p in models[name].parameters() if p.requires_grad]
        grads[name] = torch.autograd.grad(outs[name], leaves, dout.to(outs[name].dtype))
    for i, (a, r, e) in enumerate(zip(grads["ours"], grads["ref"], grads["eager"])):
        assert_matches_eager(f"gradient {i}", a, r, e, dtype)


@profile(LONG_COMPILED_CASES if LONG else 4, shrink=False)
@given(case=cases(long=LONG, dtypes=("float32", "float16", "bfloat16") if CUDA else ("float32",), dropout=False,
                  max_elements=None if CUDA else INTERPRETER_MAX_ELEMENTS, compiled=True,
                  spec_pool=LONG_SPEC_POOL if CUDA else None, shard=SHARD if CUDA else (0, 1)))
def test_compiled_module(case, monkeypatch):
    if not CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "0")  # the interpreter's kernels are fuzzed through the op
    name = "torch.compile, " + (KERNELS if CUDA else "CPU blockwise")
    _tallies.setdefault(name, Tally(name)).check(lambda c: check_compiled(c, "cuda" if CUDA else "cpu"), case)
