"""The fused attention ops: ``torch.ops.fuse_attn.flash_attention`` and ``flash_attention_backward``, their autograd
wiring, and :func:`flash_attention` (the op without torch.compile).

Both are ``torch.library.triton_op``\\ s. Under torch.compile (our backend, or any graph that calls the op), AOTAutograd
traces *into* them: their Python body -- spec parsing, validation, launch-config choice (tuned at compile time),
argument binding -- runs once, on fake tensors, and records each kernel launch as a ``wrap_triton`` node, so the
generated kernels are Inductor's kernels, launched from its output code with no Python of ours on the hot path.
Called outside a compiled graph, the same body runs eagerly and launches the kernels directly
(:mod:`.generated.launch`).

What runs (:func:`runs_kernels`, :func:`execution_path`): CUDA tensors -> the generated Triton kernels. CPU tensors ->
the opaque custom ops ``fuse_attn::flash_attention_cpu`` / ``flash_attention_backward_cpu`` (a traced ``wrap_triton``
launch cannot run under the Triton interpreter), which run the same kernels through the interpreter under
``TRITON_INTERPRET=1`` and :func:`.reference.blockwise_forward` / ``blockwise_backward`` (plain PyTorch, a block of
query rows at a time) otherwise. Both routes run :func:`forward_op` / :func:`_backward_op` (validation, empty
inputs, then the kernels or the blockwise path). If the kernels cannot be generated, compiled or launched (no launch
config works), the op warns once and runs the blockwise path instead, on any device (traced into the graph when
compiling).
"""

from __future__ import annotations

import functools
import logging
from typing import Optional, Sequence

import torch
from torch import Tensor

from fuse_attn.kernels import compile_workers, plan
from fuse_attn.spec import MAX_HEAD_DIM, AttentionSpec
from fuse_attn.score_program import UnsupportedSpec
from fuse_attn.kernels.generated import codegen, decode, launch
from fuse_attn import settings
from fuse_attn.kernels.generated.launch import empty_outputs, triton_backward, triton_forward
from fuse_attn.kernels.reference import blockwise_backward, blockwise_forward

log = logging.getLogger("fuse_attn.kernels")
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_BIAS_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@functools.lru_cache(maxsize=1024)
def parse_spec(text: str) -> AttentionSpec:
    """The spec of the op's JSON argument (memoized: the eager op parses it on every call)."""
    return AttentionSpec.from_json(text)


def validate(q: Tensor, k: Tensor, v: Tensor, score_tensors: Sequence[Tensor], spec: AttentionSpec,
             dropout_seed: Optional[Tensor] = None) -> None:
    """Raise UnsupportedSpec for inputs the kernels cannot run (before anything is launched)."""
    problems = []
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            problems.append(f"{name} must be 4-D [Z, H, L, D], got shape {tuple(t.shape)}")
    if problems:
        raise UnsupportedSpec("; ".join(problems))
    if q.dtype not in _DTYPES.values():
        problems.append(f"dtype {q.dtype} is not supported (float16, bfloat16, float32 are)")
    if not (q.dtype == k.dtype == v.dtype):
        problems.append(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if _DTYPES.get(spec.dtype) != q.dtype:
        problems.append(f"spec dtype {spec.dtype} does not match q dtype {q.dtype}")
    devices = {t.device for t in (q, k, v, *score_tensors)}
    if len(devices) > 1:
        problems.append(f"tensors are on different devices: {sorted(map(str, devices))}")
    Z, H, M, D = q.shape
    N, DV = k.shape[2], v.shape[3]
    if D > MAX_HEAD_DIM or DV > MAX_HEAD_DIM:
        problems.append(f"head dims {D}/{DV} exceed {MAX_HEAD_DIM}")
    if spec.head_dim is not None and D != spec.head_dim or k.shape[3] != D:
        problems.append(f"head dim: spec {spec.head_dim}, q {D}, k {k.shape[3]}")
    if spec.head_dim_v is not None and DV != spec.head_dim_v:
        problems.append(f"value head dim: spec {spec.head_dim_v}, v {DV}")
    if H % spec.gqa_group:
        problems.append(f"{H} query heads are not a multiple of gqa_group {spec.gqa_group}")
    kv_shape = (Z, H // spec.gqa_group, N)
    if tuple(k.shape[:3]) != kv_shape or tuple(v.shape[:3]) != kv_shape:
        problems.append(f"k {tuple(k.shape)} / v {tuple(v.shape)} do not match q {tuple(q.shape)} with gqa_group {spec.gqa_group}")
    if len(score_tensors) != len(spec.score_tensors):
        problems.append(f"spec names {len(spec.score_tensors)} score tensors, {len(score_tensors)} given")
    else:
        full = (Z, H, M, N)
        for i, (t, st) in enumerate(zip(score_tensors, spec.score_tensors)):
            if t.dim() != 4:
                problems.append(f"score tensor {i} must be 4-D, got shape {tuple(t.shape)}")
                continue
            if st.role == "mask" and t.dtype != torch.bool:
                problems.append(f"mask tensor {i} must be bool, got {t.dtype}")
            if st.role == "bias" and t.dtype not in _BIAS_DTYPES:
                problems.append(f"bias tensor {i} has unsupported dtype {t.dtype}")
            if str(t.dtype).removeprefix("torch.") != st.dtype:
                problems.append(f"score tensor {i} dtype {t.dtype} != spec {st.dtype}")
            for d, (size, want, bc) in enumerate(zip(t.shape, full, st.broadcast)):
                if bc and size != 1 or not bc and size != want:
                    problems.append(f"score tensor {i} shape {tuple(t.shape)} does not broadcast to {full} as the spec says ({st.broadcast})")
                    break
    problems += _seed_problems(q, spec, dropout_seed)
    if problems:
        raise UnsupportedSpec("; ".join(problems))


def _seed_problems(q: Tensor, spec: AttentionSpec, dropout_seed: Optional[Tensor]) -> list[str]:
    """The dropout seed is an int64 scalar tensor on q's device when dropout_p > 0, else None."""
    if not spec.dropout_p:
        return [] if dropout_seed is None else ["a dropout seed was given but the spec's dropout_p is 0"]
    if dropout_seed is None:
        return [f"dropout_p {spec.dropout_p} needs a dropout seed tensor"]
    if dropout_seed.dtype != torch.int64 or dropout_seed.dim() != 0 or dropout_seed.device != q.device:
        return [f"the dropout seed must be a 0-dim int64 tensor on {q.device}, got {dropout_seed.dtype} "
                f"{tuple(dropout_seed.shape)} on {dropout_seed.device}"]
    return []


def _check_needs(score_tensors, spec: AttentionSpec, needs: Sequence[bool]) -> list[bool]:
    if len(needs) != len(score_tensors):
        raise UnsupportedSpec(f"score_tensor_needs_grad has {len(needs)} flags for {len(score_tensors)} score tensors")
    for i, (n, st) in enumerate(zip(needs, spec.score_tensors)):
        if n and st.role != "bias":
            raise UnsupportedSpec(f"score tensor {i} is a {st.role}; only bias tensors get a gradient")
    return list(needs)


# ---- one definition of the semantics, for both routes ----------------------------------------------------------------
def is_empty(q: Tensor, k: Tensor) -> bool:
    Z, H, M, _ = q.shape
    return Z * H * M == 0 or k.shape[2] == 0


def empty_forward(q: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    # softmax over zero keys @ v is zeros in eager; the logsumexp of nothing is -inf.
    Z, H, M, _ = q.shape
    return (torch.zeros((Z, H, M, v.shape[3]), dtype=q.dtype, device=q.device),
            torch.full((Z, H, M), float("-inf"), dtype=torch.float32, device=q.device))


def empty_backward(q, k, v, score_tensors, needs):
    return (torch.zeros(q.shape, dtype=q.dtype, device=q.device), torch.zeros(k.shape, dtype=k.dtype, device=k.device),
            torch.zeros(v.shape, dtype=v.dtype, device=v.device),
            [torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t, n in zip(score_tensors, needs) if n])


def runs_kernels(device: torch.device) -> bool:
    """Whether the op runs the generated kernels on tensors of ``device``: CUDA tensors, and CPU tensors under
    Triton's interpreter (``TRITON_INTERPRET=1``); elsewhere it runs the blockwise PyTorch path."""
    return device.type == "cuda" or (device.type == "cpu" and settings.interpreting())


def execution_path(device: torch.device) -> str:
    """What the op runs on tensors of ``device``, for logs (as :func:`runs_kernels` decides)."""
    if device.type == "cuda":
        return "the generated Triton kernels"
    if runs_kernels(device):
        return "the generated Triton kernels under the Triton interpreter"
    return "blockwise PyTorch on the CPU" if device.type == "cpu" else f"blockwise PyTorch on {device.type}"


# (spec digest, "forward" / "backward", head dims) whose kernels failed in this process: they run the blockwise
# path from then on, without trying (and warning) again.
_kernel_failures: set[tuple] = set()


def _with_fallback(direction: str, spec: AttentionSpec, q: Tensor, v: Tensor, kernels, blockwise):
    """``kernels()`` -- or, if generating, compiling or launching them fails (no launch config works, a Triton
    error), ``blockwise()``: the same attention in plain PyTorch, on any device. The user's model never crashes
    because of a kernel; the first failure per spec, direction and head dims logs a warning saying why."""
    key = (codegen.spec_digest(spec), direction, int(q.shape[3]), int(v.shape[3]))
    if not runs_kernels(q.device):
        return blockwise()
    if compile_workers.launches_compile_only():
        return kernels()  # (compiling for the tuner: an error is the tuner's to report, no reason to fall back)
    if key not in _kernel_failures:
        try:
            return kernels()
        except Exception as e:
            _kernel_failures.add(key)
            lines = str(e).strip().splitlines()
            log.warning("fuse_attn: the %s kernels for %s (head dims %d/%d) failed (%s: %s); this attention's %s runs "
                        "in plain PyTorch (blockwise, slower) from now on", direction, plan.describe(spec), key[2],
                        key[3], type(e).__name__, lines[0] if lines else "", direction)
            log.debug("fuse_attn: %s kernel failure", direction, exc_info=e)
    return blockwise()


def compile_candidates_ahead(q: Tensor, k: Tensor, v: Tensor, score_tensors: Sequence[Tensor], spec: AttentionSpec,
                             score_grads: Sequence[bool], training: bool, timed_first: Optional[tuple] = None) -> None:
    """Start compiling the tuning candidates of the generated kernels that the op will run for these operands (fake
    while compiling), after ``timed_first``'s (a tuning timed before them):
    :func:`fuse_attn.kernels.generated.launch.compile_candidates_ahead`, where the op runs them (a GPU, static
    lengths -- a symbolic one tunes a config per length bucket --, no split-K decode, keys to attend to). An
    optimization: never raises, adds no guard."""
    if (not runs_kernels(q.device) or any(isinstance(n, torch.SymInt) for t in (q, k) for n in t.shape)
            or is_empty(q, k) or decode.dispatch_splits(q, k, spec) > 1):
        return
    try:
        launch.compile_candidates_ahead(q, k, v, score_tensors, spec, score_grads, training, timed_first)
    except Exception as e:  # noqa: BLE001 -- each tuning then compiles its own candidates, as without it
        log.info("fuse_attn: compiling the candidates of %s ahead failed (%s: %s)", plan.describe(spec),
                 type(e).__name__, e)


def _forward(q, k, v, score_tensors, dropout_seed, spec: AttentionSpec) -> tuple[Tensor, Tensor]:
    """(out, lse) of validated, non-empty inputs: the kernels (split-K for few rows and many keys) or blockwise."""
    def kernels():
        splits = decode.dispatch_splits(q, k, spec)
        if splits > 1:
            return decode.triton_forward(q, k, v, score_tensors, spec, splits)
        return triton_forward(q, k, v, score_tensors, spec, dropout_seed)

    return _with_fallback("forward", spec, q, v, kernels,
                          lambda: blockwise_forward(q, k, v, score_tensors, spec, dropout_seed=dropout_seed))


def _backward_impl(dout, q, k, v, score_tensors, dropout_seed, out, lse, spec: AttentionSpec, needs, dlse):
    return _with_fallback(
        "backward", spec, q, v,
        lambda: triton_backward(dout, q, k, v, score_tensors, out, lse, spec, needs, dropout_seed, dlse),
        lambda: blockwise_backward(dout, q, k, v, score_tensors, out, lse, spec, needs, dropout_seed=dropout_seed,
                                   dlse=dlse))


# ---- the ops ---------------------------------------------------------------------------------------------------------
def forward_op(q, k, v, score_tensors, dropout_seed, spec: str, cpu_op: bool):
    """Either op's forward: validated, empty inputs answered, then the CPU op (``cpu_op``) or the kernels."""
    s = parse_spec(spec)
    validate(q, k, v, score_tensors, s, dropout_seed)
    if is_empty(q, k):
        return empty_forward(q, v)
    if cpu_op:
        return torch.ops.fuse_attn.flash_attention_cpu(q, k, v, score_tensors, dropout_seed, spec)
    return _forward(q, k, v, score_tensors, dropout_seed, s)


def _backward_op(dout, q, k, v, score_tensors, dropout_seed, out, lse, spec: str, score_tensor_needs_grad, dlse,
                 cpu_op: bool):
    """Either op's backward, as :func:`forward_op`."""
    s = parse_spec(spec)
    validate(q, k, v, score_tensors, s, dropout_seed)
    needs = _check_needs(score_tensors, s, score_tensor_needs_grad)
    if dlse is not None and (dlse.shape != lse.shape or dlse.dtype != torch.float32):
        raise UnsupportedSpec(f"dlse {dlse.dtype} {tuple(dlse.shape)} does not match lse {lse.dtype} {tuple(lse.shape)}")
    if is_empty(q, k):
        return empty_backward(q, k, v, score_tensors, needs)
    if cpu_op:
        return torch.ops.fuse_attn.flash_attention_backward_cpu(dout, q, k, v, score_tensors, dropout_seed, out, lse,
                                                                spec, score_tensor_needs_grad, dlse)
    # the kernels index dlse as lse, [Z, H, M] contiguous
    return _backward_impl(dout, q, k, v, score_tensors, dropout_seed, out, lse, s, needs,
                          None if dlse is None else dlse.contiguous())


@torch.library.triton_op("fuse_attn::flash_attention", mutates_args=())
def flash_attention_op(q: Tensor, k: Tensor, v: Tensor, score_tensors: list[Tensor], dropout_seed: Optional[Tensor],
                       spec: str) -> tuple[Tensor, Tensor]:
    return forward_op(q, k, v, score_tensors, dropout_seed, spec, cpu_op=q.device.type != "cuda")


@torch.library.custom_op("fuse_attn::flash_attention_cpu", mutates_args=())
def flash_attention_cpu_op(q: Tensor, k: Tensor, v: Tensor, score_tensors: list[Tensor], dropout_seed: Optional[Tensor],
                           spec: str) -> tuple[Tensor, Tensor]:
    """The forward on CPU tensors, opaque to tracing: the kernels through the Triton interpreter, or blockwise."""
    return forward_op(q, k, v, score_tensors, dropout_seed, spec, cpu_op=False)


@flash_attention_cpu_op.register_fake
def _(q, k, v, score_tensors, dropout_seed, spec):
    validate(q, k, v, score_tensors, parse_spec(spec), dropout_seed)
    return empty_outputs(q, v)


@torch.library.triton_op("fuse_attn::flash_attention_backward", mutates_args=())
def flash_attention_backward_op(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, score_tensors: list[Tensor], dropout_seed: Optional[Tensor],
    out: Tensor, lse: Tensor, spec: str, score_tensor_needs_grad: list[bool], dlse: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    return _backward_op(dout, q, k, v, score_tensors, dropout_seed, out, lse, spec, score_tensor_needs_grad, dlse,
                        cpu_op=q.device.type != "cuda")


@torch.library.custom_op("fuse_attn::flash_attention_backward_cpu", mutates_args=())
def flash_attention_backward_cpu_op(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, score_tensors: list[Tensor], dropout_seed: Optional[Tensor],
    out: Tensor, lse: Tensor, spec: str, score_tensor_needs_grad: list[bool], dlse: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    """The backward on CPU tensors, opaque to tracing (as :func:`flash_attention_cpu_op`)."""
    return _backward_op(dout, q, k, v, score_tensors, dropout_seed, out, lse, spec, score_tensor_needs_grad, dlse,
                        cpu_op=False)


@flash_attention_backward_cpu_op.register_fake
def _(dout, q, k, v, score_tensors, dropout_seed, out, lse, spec, score_tensor_needs_grad, dlse=None):
    s = parse_spec(spec)
    validate(q, k, v, score_tensors, s, dropout_seed)
    needs = _check_needs(score_tensors, s, score_tensor_needs_grad)
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            [t.new_empty(t.shape) for t, n in zip(score_tensors, needs) if n])


# ---- autograd --------------------------------------------------------------------------------------------------------
def autograd_setup_context(ctx, inputs, output):
    q, k, v, score_tensors, dropout_seed, spec = inputs
    out, lse = output
    ctx.spec = spec
    ctx.needs = [bool(t.requires_grad and t.is_floating_point()) for t in score_tensors]
    # the seed (a scalar) is all the backward needs to regenerate the keep-mask
    ctx.save_for_backward(q, k, v, out, lse, dropout_seed, *score_tensors)
    # an unused lse (or out) gets None, not a materialized zero gradient: the kernels then skip dlse
    ctx.set_materialize_grads(False)


def autograd_backward(ctx, dout, dlse):
    """Gradients of ``out`` and of ``lse`` (differentiable too: context parallelism merges partial outputs by their
    lse, :mod:`fuse_attn.graph.context_parallel`)."""
    q, k, v, out, lse, dropout_seed, *score_tensors = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv, dscores = torch.ops.fuse_attn.flash_attention_backward(
        dout, q, k, v, score_tensors, dropout_seed, out, lse, ctx.spec, ctx.needs, dlse)
    it = iter(dscores)
    grads = [next(it) if n else None for n in ctx.needs]
    return dq, dk, dv, grads, None, None


flash_attention_op.register_autograd(autograd_backward, setup_context=autograd_setup_context)


def flash_attention(q: Tensor, k: Tensor, v: Tensor, spec, score_tensors: Sequence[Tensor] = (),
                    dropout_seed: Optional[Tensor] = None, return_lse: bool = False):
    """Fused attention without torch.compile: ``out`` (differentiable), or ``(out, lse)`` with ``return_lse``.

    ``spec`` is an :class:`AttentionSpec` or its JSON. q ``[Z, H, M, D]``, k ``[Z, H // g, N, D]``,
    v ``[Z, H // g, N, DV]`` with any strides; score tensors 4-D, broadcastable to ``[Z, H, M, N]``.
    ``dropout_seed``: with ``spec.dropout_p > 0``, the 0-dim int64 tensor on q's device that the kernels draw the
    keep-mask from (the same seed gives the same mask); if None, one is drawn from torch's generator for q's
    device (``torch.manual_seed`` governs it, no host sync). Must be None when dropout_p is 0."""
    text = spec.to_json() if isinstance(spec, AttentionSpec) else spec
    if dropout_seed is None and parse_spec(text).dropout_p:
        dropout_seed = torch.randint(torch.iinfo(torch.int64).max, (), dtype=torch.int64, device=q.device)
    out, lse = torch.ops.fuse_attn.flash_attention(q, k, v, list(score_tensors), dropout_seed, text)
    return (out, lse) if return_lse else out


def generated_source(spec) -> str:
    """The generated Triton source for a spec (AttentionSpec or its JSON)."""
    spec = AttentionSpec.from_json(spec) if isinstance(spec, str) else spec
    return codegen.generate_source(spec)
