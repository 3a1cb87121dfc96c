"""Test-session setup shared by every test module.

Triton binds ``@triton.jit`` functions to its interpreter when they are defined, so ``TRITON_INTERPRET=1`` is set
before anything imports triton: CPU tensors then run the real kernels in the interpreter. Tests that exercise the
plain-PyTorch CPU path set ``TRITON_INTERPRET=0`` for the call (the op reads it at run time).

On a GPU, compiled attentions run the generated kernels (``FUSE_ATTN_CANDIDATES=triton``): the tests check those,
not whichever of SDPA's kernels the GPU would time faster; ``test_dispatch`` opts into the choice itself.

The interpreter's fp32 -> bf16 conversion truncates where the GPU rounds to nearest even; it is patched to round
(``interpreter_rounding.py``), so bf16 kernels tested here are as far from fp64 as on the GPU, not up to twice as far.
The interpreter's re-patching of ``triton.language`` on every helper call inside a launch is skipped
(``interpreter_patching.py``: the same bits, a third less time).

Kernel configs tuned during the session (on a GPU) go to a temporary cache directory, not the user's, unless
``FUSE_ATTN_CACHE_DIR`` names one; each test keeps the backend's stored analyses in a directory of its own.
"""

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("FUSE_ATTN_CANDIDATES", "triton")
import torch  # noqa: E402
from tests.support.interpreter_patching import skip_repatching_inside_a_launch  # noqa: E402
from tests.support.interpreter_rounding import round_bf16_to_nearest_even  # noqa: E402

round_bf16_to_nearest_even()  # the interpreter's fp32 -> bf16 as the GPU's (interpreter_rounding.py says why)
skip_repatching_inside_a_launch()  # a third of an interpreted kernel's time, the same bits (interpreter_patching.py)
# Gluon binds triton.language's helpers when imported and refuses interpreter-bound ones unless TRITON_INTERPRET=1
# then: importing the kernels here, not inside a test that has set TRITON_INTERPRET=0, lets any test run alone.
import fuse_attn.kernels  # noqa: E402,F401
from fuse_attn import analysis_cache  # noqa: E402
from fuse_attn.kernels import compile_workers, tuning  # noqa: E402

from tests.support.compiled_modules import INTERPRETER_SESSION  # noqa: E402
from tests.support.tuning import FakeMachine  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _autotune_cache_in_tmp(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        if not os.environ.get("FUSE_ATTN_CACHE_DIR"):
            mp.setenv("FUSE_ATTN_CACHE_DIR", str(tmp_path_factory.mktemp("fuse_attn_cache")))
        yield


@pytest.fixture(autouse=True)
def _analysis_cache_of_the_test(tmp_path, monkeypatch):
    """Each test stores the backend's analyses (fuse_attn/analysis_cache.py) in a directory of its own: a graph a test
    compiles is analysed under that test's patches and settings, never served from another test's entry."""
    monkeypatch.setattr(analysis_cache, "directory", lambda: str(tmp_path / "analysis_cache"))


@pytest.fixture(params=["cpu-blockwise", "cpu-interpreter", "cuda"])
def target(request, monkeypatch):
    """(device, dtype) for an end-to-end run. On a CPU the fused op runs the plain-PyTorch blockwise path, or the
    Triton kernels in the interpreter; on a GPU (bf16) the compiled kernels."""
    if request.param == "cuda":
        if not torch.cuda.is_available() or INTERPRETER_SESSION:
            pytest.skip("needs a GPU and TRITON_INTERPRET=0")
        return "cuda", torch.bfloat16
    if request.param == "cpu-interpreter" and not INTERPRETER_SESSION:
        pytest.skip("the Triton interpreter must be chosen before triton is imported (TRITON_INTERPRET=1)")
    monkeypatch.setenv("TRITON_INTERPRET", "1" if request.param == "cpu-interpreter" else "0")
    return "cpu", torch.float32


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """The kernel tuner on a fake GPU (tests/support/tuning.py), with an empty cache directory of its own."""
    m = FakeMachine()
    monkeypatch.setenv("FUSE_ATTN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FUSE_ATTN_CACHE", raising=False)
    monkeypatch.delenv("FUSE_ATTN_AUTOTUNE", raising=False)
    monkeypatch.setattr(tuning, "_chosen", {})
    monkeypatch.setattr(tuning, "_unwritable_dirs", set())
    monkeypatch.setattr(tuning, "device_identity", lambda device: (m.gpu, m.capability))
    monkeypatch.setattr(tuning, "software_versions", lambda: (m.triton, m.torch))
    monkeypatch.setattr(tuning, "_time_config", m.time_config)
    monkeypatch.setattr(compile_workers, "worker_pool", lambda: None)  # (its kernels compile in this process)
    return m
