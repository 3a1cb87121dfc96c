"""Test-session setup shared by every test module.

Triton binds ``@triton.jit`` functions to its interpreter when they are defined, so ``TRITON_INTERPRET=1`` is set
before anything imports triton: CPU tensors then run the real kernels in the interpreter. Tests that exercise the
plain-PyTorch CPU path set ``TRITON_INTERPRET=0`` for the call (the op reads it at run time).
"""

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
tests = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [tests, os.path.dirname(tests)]  # test helpers, and examples/ from the repository root
