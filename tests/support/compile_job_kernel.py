"""A JIT kernel (a real ``JITFunction`` even under ``TRITON_INTERPRET=1``) for the compile-worker tests: defined at
a module's top level under its own name, as a worker finds a kernel."""

import triton.language as tl
from triton.runtime.jit import JITFunction


def copy_kernel(X, Y, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(Y + offsets, tl.load(X + offsets, mask=offsets < n), mask=offsets < n)


copy_kernel = JITFunction(copy_kernel)
