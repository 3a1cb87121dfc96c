"""Triton's interpreter (``TRITON_INTERPRET=1``, 3.9) patches ``triton.language`` for the interpreter when a kernel
launch starts (``GridExecutor.__call__``: every builtin of ``tl``, ``tl.core``, ``tl.tensor`` and ``tl.math``
wrapped, ``range``, ``reduce`` and the like replaced) and restores it when the launch ends -- and patches it again on
every call of a ``@triton.jit`` helper from inside the kernel (``InterpretedFunction.__call__``), though the
launch's patch is still in place: ``inspect.getmembers`` over those four namespaces, per helper call, per program of
the grid. The kernels call helpers in their inner loops (the score program, masks, the online softmax), so this
re-patching took about a third of an interpreted kernel's time here (a key-padding test of tests/kernels/test_kernels.py:
18.0 s, 12.4 s without it, 2026-11-27, triton 3.9, a 2-core CPU).

:func:`skip_repatching_inside_a_launch` makes a helper's call skip it when the launch's patch already covers every
``triton.language`` module the helper's globals name (the interpreter asserts they name at least one); a helper that
names one the launch did not patch is patched as before. The re-patching sets each attribute to a fresh but equal
function (builtins already wrapped are no longer builtins and are left alone), so the kernels compute exactly what
they did: tests/support/test_interpreter_patching.py checks the op's outputs and gradients bit for bit with and without it.
Installed by tests/conftest.py and by the test scripts that run kernels in the interpreter under torchrun."""

from __future__ import annotations

import inspect
import threading


def supported() -> bool:
    """Whether this Triton's interpreter has the functions the skip replaces (3.6-3.9 do); elsewhere it is not
    installed and the interpreter patches as it always did, only slower."""
    from triton.runtime import interpreter

    return all(hasattr(interpreter, name) for name in ("_patch_lang", "_LangPatchScope", "GridExecutor"))


def skip_repatching_inside_a_launch() -> None:
    """Installs the skip where :func:`supported` (idempotent; :func:`undo` removes it)."""
    import triton.language as tl
    from triton.runtime import interpreter

    if not supported():
        return
    if getattr(interpreter._patch_lang, "skips_repatching", False):
        return
    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    state = threading.local()
    langs_of = {}  # function -> ids of the triton.language modules its globals name

    def langs(fn) -> frozenset:
        if fn not in langs_of:
            langs_of[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                     if inspect.ismodule(v) and v in (tl, tl.core))
        return langs_of[fn]

    def _patch_lang(fn):
        patched = getattr(state, "patched", None)
        if patched is not None and langs(fn) <= patched:
            return interpreter._LangPatchScope()  # the launch's patch is in place: nothing to do
        scope = patch_lang(fn)
        if patched is not None:
            state.patched = patched | langs(fn)
        return scope

    def __call__(self, *args, **kwargs):
        outer = getattr(state, "patched", None)
        state.patched = frozenset()  # filled by the launch's own _patch_lang, which patches before the grid runs
        try:
            return launch(self, *args, **kwargs)
        finally:
            state.patched = outer

    _patch_lang.skips_repatching = True
    _patch_lang.original = patch_lang
    __call__.original = launch
    interpreter._patch_lang = _patch_lang
    interpreter.GridExecutor.__call__ = __call__


def undo() -> None:
    """Restores the interpreter's own re-patching (for the test that compares the two)."""
    from triton.runtime import interpreter

    if getattr(interpreter._patch_lang, "skips_repatching", False):
        interpreter._patch_lang = interpreter._patch_lang.original
        interpreter.GridExecutor.__call__ = interpreter.GridExecutor.__call__.original
