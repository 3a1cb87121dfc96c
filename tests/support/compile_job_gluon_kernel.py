"""A Gluon kernel taking a Gluon function as a constexpr, as the Hopper kernels take their generated score programs,
for the compile-worker tests (imported only in a scenario's process, without ``TRITON_INTERPRET``: Gluon refuses the
interpreter's bindings of Triton's language); at the module's top level under its own name, as a worker finds it."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def doubled(x):
    return x * 2


@gluon.jit
def scaled_copy_kernel(X, Y, n, BLOCK: gl.constexpr, SCALE: gl.constexpr):
    offsets = gl.arange(0, BLOCK, layout=gl.BlockedLayout([1], [32], [4], [0]))
    gl.store(Y + offsets, SCALE(gl.load(X + offsets, mask=offsets < n)), mask=offsets < n)
