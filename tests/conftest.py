"""Test-session setup shared by every test module.

Triton binds ``@triton.jit`` functions to its interpreter when they are defined, so ``TRITON_INTERPRET=1`` is set
before anything imports triton: CPU tensors then run the real kernels in the interpreter. Tests that exercise the
plain-PyTorch CPU path set ``TRITON_INTERPRET=0`` for the call (the op reads it at run time).

On a GPU, compiled attentions run the generated kernels (``FUSE_ATTN_CANDIDATES=triton``): the tests check those,
not whichever of SDPA's kernels the GPU would time faster; ``test_implementations`` opts into the choice itself.

Kernel configs tuned during the session (on a GPU) go to a temporary cache directory, not the user's, unless
``FUSE_ATTN_CACHE_DIR`` names one.
"""

import os
import sys

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("FUSE_ATTN_CANDIDATES", "triton")
tests = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [tests, os.path.dirname(tests)]  # test helpers, and examples/ from the repository root


@pytest.fixture(autouse=True, scope="session")
def _autotune_cache_in_tmp(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        if not os.environ.get("FUSE_ATTN_CACHE_DIR"):
            mp.setenv("FUSE_ATTN_CACHE_DIR", str(tmp_path_factory.mktemp("fuse_attn_cache")))
        yield
