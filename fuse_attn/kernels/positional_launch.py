"""The launcher of a kernel whose launches repeat one signature: :class:`PositionalLaunch`, which after the first call
of a specialization runs the compiled kernel's positional ``run`` instead of Triton's binding and specializing launch.
The Gluon ops (:mod:`.hopper`) launch through it, and the generated kernels launched eagerly
(:func:`.generated.launch.launch`: the tile-classes kernels of the Gluon ops' lists among them)."""

from __future__ import annotations

import torch
from torch import Tensor
from triton import knobs
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from fuse_attn.kernels import compile_workers

# Triton specializes a pointer argument on whether its address is a multiple of 16 bytes
ALIGNMENT_SPECIALIZED = 16


class PositionalLaunch:
    """Launches of one kernel (Gluon, or Triton's JIT) whose host work a call, after the first call of a
    specialization, is the compiled kernel's positional ``run``. ``kernel[grid](*args)`` binds and specializes every
    argument on each call: 39-45 us of an H200 host's time for the Gluon forward's 31 arguments, where the compiled
    kernel's ``run`` takes 15 us. The key here is what Triton specializes a kernel on: each constexpr's value; each
    other int's class (1, a multiple of 16, its i32 / i64 / u64 type); each tensor's dtype and 16-byte alignment;
    each TMA descriptor's dtype, block and layout; the options (``num_warps``, ``maxnreg``); the current device. A new
    key launches through ``kernel[grid]``, which compiles (or finds) the kernel Triton would run; so does every call
    while Triton's launch hooks are set (a profiler such as proton observes each launch), and under Triton's
    interpreter."""

    def __init__(self, kernel):
        self.kernel = kernel
        params = getattr(kernel, "params", None)  # (None: Triton's interpreter, which compiles nothing to keep)
        self.constexprs = None if params is None else frozenset(p.num for p in params if p.is_constexpr)
        self.compiled = {}

    def specialization(self, args: tuple, options: dict) -> tuple | None:
        """What Triton specializes a launch of these arguments and options on (None: an argument of a kind not
        listed, which always launches through Triton's JIT). A caller whose calls differ only where Triton does
        not specialize (a tensor's address within its alignment, a float's value) computes it once and launches
        with :meth:`launch_as`."""
        key = [*options.items()]
        for i, a in enumerate(args):
            if i in self.constexprs:
                key.append(a)
            elif isinstance(a, Tensor):
                key.append((a.dtype, a.data_ptr() % ALIGNMENT_SPECIALIZED == 0))
            elif type(a) is int:  # (Triton's int types: i32 within 32 bits, u64 from 2^63, else i64)
                key.append((a == 1, a % 16 == 0, "i32" if -2**31 <= a < 2**31 else "u64" if a >= 2**63 else "i64"))
            elif isinstance(a, TensorDescriptor):
                key.append((a.base.dtype, tuple(a.block_shape), a.layout, a.padding))
            elif a is None or type(a) in (bool, float):
                key.append(type(a))
            else:
                return None
        return tuple(key)

    def __call__(self, grid: tuple, *args, **options) -> None:
        self.launch_as(None if self.constexprs is None else self.specialization(args, options), grid, *args,
                       **options)

    def launch_kept(self, kept: dict, pointers: tuple, grid: tuple, *args, **options) -> None:
        """The launch of ``args`` with the specialization ``kept`` holds for the alignment of ``pointers`` (the tensor
        arguments whose address may change between the calls of one prepared signature), computed at the first such
        launch. ``kept``: a prepared call's (:class:`.hopper.forward.ForwardCall`,
        :class:`.hopper.backward.BackwardCall`)."""
        key = (self, *(t.data_ptr() % ALIGNMENT_SPECIALIZED == 0 for t in pointers))
        specialization = kept.get(key)
        if specialization is None and self.constexprs is not None:
            specialization = kept[key] = self.specialization(args, options)
        self.launch_as(specialization, grid, *args, **options)

    def launch_as(self, specialization: tuple | None, grid: tuple, *args, **options) -> None:
        """The launch of ``args`` whose :meth:`specialization` is the one given; its compile only inside
        :func:`compile_workers.compile_launches_only` (a compile job inside :func:`compile_workers.collecting`)."""
        if compile_workers.launches_compile_only():
            if not compile_workers.collect(self.kernel, grid, dict(zip(self.kernel.arg_names, args)), options):
                self.kernel.warmup(*args, grid=grid, **options)
            return
        # (before CUDA is initialized, no kernel was launched: the first launch initializes it)
        jit = (specialization is None or _launch_hooks_set() or self.constexprs is None
               or not torch.cuda.is_initialized())
        device = None if jit else torch.cuda.current_device()
        key = None if jit else (device, specialization)
        compiled = self.compiled.get(key)
        if compiled is None:
            compiled = self.kernel[grid](*args, **options)
            if key is not None and compiled is not None:
                self.compiled[key] = compiled
            return
        compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                     torch._C._cuda_getCurrentRawStream(device), compiled.function, compiled.packed_metadata, None,
                     None, None, *args)  # (no hooks: no metadata)


def _launch_hooks_set() -> bool:
    """Whether a launch hook of Triton's is set: a chain of hooks (Triton 3.6-3.9; empty, Triton's launch still calls
    it) with one in it, or a hook itself (older)."""
    hook = knobs.runtime.launch_enter_hook
    return hook is not None and bool(getattr(hook, "calls", True))
