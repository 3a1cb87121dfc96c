"""The fused attention op: ``torch.ops.fuse_attn.flash_attention`` (+ ``_backward``), its launchers, its CPU path
and the plain-PyTorch reference it is tested against.

Dispatch: CUDA tensors -> the generated Triton kernels; CPU tensors with ``TRITON_INTERPRET=1`` -> the same
kernels through the Triton interpreter; other CPU tensors -> :func:`blockwise_forward` / :func:`blockwise_backward`
(plain PyTorch, a block of query rows at a time, never the full N x N matrix). If the kernels cannot be generated,
compiled or launched (no launch config works), the op warns once and runs the blockwise path instead, on any device.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..spec import AttentionSpec, UnsupportedSpec
from . import autotune, codegen, philox, score_program

log = logging.getLogger("fuse_attn.kernels")
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_BIAS_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Query rows per step of the CPU blockwise path: a [Z, H, 128, N] fp32 score block is 0.5 MiB per (z, h)
# at N = 1024 -- far below the N x N matrix, and large enough that matmuls dominate the Python overhead.
CPU_BLOCK_M = 128


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _pow2_at_least_16(n: int) -> int:
    # tl.arange needs a power of two and tl.dot an inner dim >= 16.
    return max(16, 1 << (n - 1).bit_length())


# ---- validation ----------------------------------------------------------------------------------------------------
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
    if D > 256 or DV > 256:
        problems.append(f"head dims {D}/{DV} exceed 256")
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


def _bcast_strides(t: Tensor) -> list[int]:
    """Strides with 0 for size-1 dims: the kernels index a broadcast tensor without a dense copy."""
    return [0 if size == 1 else stride for size, stride in zip(t.shape, t.stride())]


# ---- reference (naive, full score matrix) -------------------------------------------------------------------------
def reference_attention(q: Tensor, k: Tensor, v: Tensor, score_tensors: Sequence[Tensor], spec: AttentionSpec,
                        dropout_seed: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Eager attention as the spec defines it, in q's dtype (run it on fp64 copies for a reference).
    Materializes the [Z, H, M, N] scores: for tests only. Returns (out, lse in fp32). With dropout, the keep-mask
    is the kernels' own (drawn from ``dropout_seed``), so results compare exactly."""
    g = spec.gqa_group
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    s = (q @ k.transpose(-2, -1)) * spec.scale_for(q.shape[3])
    Z, H, M, N = s.shape
    s = _score_mod(s, score_tensors, spec, 0, M, N)[-1]
    if spec.causal is not None:
        s = s.masked_fill(~_causal_visible(0, M, M, N, spec, s.device), float("-inf"))
    p = torch.softmax(s, dim=-1)
    if spec.dropout_p:
        p = _drop(p, _keep_mask(dropout_seed, spec, p.shape, M, 0), spec.dropout_p)
    return p @ v, torch.logsumexp(s, dim=-1).float()


def _keep_mask(dropout_seed: Tensor, spec: AttentionSpec, block_shape, M: int, row0: int) -> Tensor:
    """The kernels' Philox keep-mask of a [Z, H, rows, N] block holding rows [row0, row0 + rows) of [Z, H, M, N]."""
    Z, H, rows, N = block_shape
    return philox.dropout_keep(dropout_seed, spec.dropout_p, Z, H, M, N, row0, rows)


def _drop(x: Tensor, keep: Tensor, dropout_p: float) -> Tensor:
    """``x * keep / (1 - p)`` as eager dropout computes it (the scale applied in x's compute precision; a dropped
    NaN stays NaN, as eager's multiplication by the mask leaves it)."""
    return x * (keep.to(x.dtype) * (1.0 / (1.0 - dropout_p)))


def _score_mod(s: Tensor, score_tensors: Sequence[Tensor], spec: AttentionSpec, row0: int, M: int, N: int) -> list:
    """The values of every node of the score program on the scores ``s`` of query rows [row0, row0 + rows) (the
    last one broadcast to ``s``'s shape); ``[s]`` for an empty program."""
    if not spec.score_mod:
        return [s]
    Z, H, rows, _ = s.shape
    tensors = [t if t.shape[2] == 1 else t[:, :, row0:row0 + rows] for t in score_tensors]
    ops = score_program.TorchOps(s, tensors, score_program.torch_indices(row0, rows, Z, H, M, N, s.device))
    vals = score_program.forward(spec.score_mod, ops)
    vals[-1] = torch.broadcast_to(vals[-1], s.shape)
    return vals


def _causal_visible(row0: int, rows: int, M: int, N: int, spec: AttentionSpec, device) -> Tensor:
    i = torch.arange(row0, row0 + rows, device=device)[:, None]
    j = torch.arange(N, device=device)[None, :]
    offset = spec.causal.offset(M, N)
    visible = j <= i + offset
    if spec.causal.window is not None:
        visible &= j > i + offset - spec.causal.window
    return visible


# ---- CPU blockwise path --------------------------------------------------------------------------------------------
def _blockwise_scores(q_blk, k, score_tensors, spec, row0, M, N) -> tuple[Tensor, list]:
    """fp32 (or fp64) modified and masked scores of one block of query rows, [Z, H, rows, N], and the values of
    the score program's nodes (for the backward)."""
    g = spec.gqa_group
    Z, H, rows, D = q_blk.shape
    ct = torch.float64 if q_blk.dtype == torch.float64 else torch.float32
    qg = q_blk.to(ct).reshape(Z, H // g, g * rows, D)  # the g query heads of one kv head share its keys
    s = (qg @ k.to(ct).transpose(-2, -1)).reshape(Z, H, rows, N) * spec.scale_for(D)
    vals = _score_mod(s, score_tensors, spec, row0, M, N)
    s = vals[-1]
    if spec.causal is not None:
        s = s.masked_fill(~_causal_visible(row0, rows, M, N, spec, s.device), float("-inf"))
    return s, vals


def blockwise_forward(q, k, v, score_tensors, spec, block_m: int = CPU_BLOCK_M, dropout_seed=None) -> tuple[Tensor, Tensor]:
    Z, H, M, _ = q.shape
    N, DV = k.shape[2], v.shape[3]
    g = spec.gqa_group
    out = torch.empty((Z, H, M, DV), dtype=q.dtype, device=q.device)
    lse = torch.empty((Z, H, M), dtype=torch.float32, device=q.device)
    for r0 in range(0, M, block_m):
        s, _ = _blockwise_scores(q[:, :, r0:r0 + block_m], k, score_tensors, spec, r0, M, N)
        rows = s.shape[2]
        p = torch.softmax(s, dim=-1)
        if spec.dropout_p:
            p = _drop(p, _keep_mask(dropout_seed, spec, p.shape, M, r0), spec.dropout_p)
        o = (p.reshape(Z, H // g, g * rows, N) @ v.to(p.dtype)).reshape(Z, H, rows, DV)
        out[:, :, r0:r0 + rows] = o.to(q.dtype)
        lse[:, :, r0:r0 + rows] = torch.logsumexp(s, dim=-1).float()
    return out, lse


def blockwise_backward(dout, q, k, v, score_tensors, out, lse, spec, needs_grad, block_m: int = CPU_BLOCK_M,
                       dropout_seed=None):
    """Gradients with P recomputed per block of query rows (each block holds whole rows, so P is the exact
    softmax of the block's scores; no N x N buffer). A row that saw only -inf (or a NaN) has P = NaN, as in eager:
    dV of its kv head is NaN, and its dS passes through the score program's backward (where a masking ``where``
    zeroes it, as eager's does).

    The score program is differentiated by :func:`.score_program.backward` (the same derivative rules as the
    kernels) on the node values kept while the block's scores are recomputed: a few [Z, H, rows, N] tensors.
    torch.autograd cannot do this part: this runs as the implementation of a custom op, below the Autograd
    dispatch key, where ``torch.enable_grad()`` records nothing."""
    Z, H, M, D = q.shape
    N, DV = k.shape[2], v.shape[3]
    g = spec.gqa_group
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=ct, device=q.device)
    dv = torch.zeros(v.shape, dtype=ct, device=q.device)
    dts = {i: torch.zeros(t.shape, dtype=ct, device=q.device) for i, (t, need) in enumerate(zip(score_tensors, needs_grad)) if need}
    program = spec.score_mod
    scores = score_program.score_sources(program)
    bias_loads = {t: nodes for t, nodes in score_program.bias_load_sources(program, spec.score_tensors).items() if t in dts}
    sources = scores.union(*bias_loads.values())
    kc, vc = k.to(ct), v.to(ct)
    scale = spec.scale_for(D)
    for r0 in range(0, M, block_m):
        s, vals = _blockwise_scores(q[:, :, r0:r0 + block_m], k, score_tensors, spec, r0, M, N)
        rows = s.shape[2]
        p = torch.softmax(s, dim=-1)
        do = dout[:, :, r0:r0 + rows].to(ct)
        # dropout: dV from the dropped, rescaled P; dP through the same keep-mask and scale
        keep = _keep_mask(dropout_seed, spec, p.shape, M, r0) if spec.dropout_p else None
        pv = _drop(p, keep, spec.dropout_p) if spec.dropout_p else p
        dog = do.reshape(Z, H // g, g * rows, DV)
        dv += pv.reshape(Z, H // g, g * rows, N).transpose(-2, -1) @ dog
        dp = (dog @ vc.transpose(-2, -1)).reshape(Z, H, rows, N)
        if spec.dropout_p:
            dp = _drop(dp, keep, spec.dropout_p)
        # rowsum(P * dP) (= rowsum(dO * O) with dropout's factor on dP): from P itself, not from the output rounded to
        # q's dtype, so that dS is as exact as eager's (a row with one key gets dS = 0 exactly, as in eager)
        delta = (p * dp).sum(-1, keepdim=True)
        ds = p * (dp - delta)
        if spec.causal is not None:  # masked_fill's backward: no gradient outside the band, even where P is NaN
            ds = ds.masked_fill(~_causal_visible(r0, rows, M, N, spec, ds.device), 0.0)
        if program:
            ops = score_program.TorchOps(ds, (), {})  # the reverse pass reads no leaves: only the dtype, device
            adj = score_program.backward(program, spec.score_tensors, vals, ops, ds, sources)
            for t, nodes in bias_loads.items():
                for node in nodes:
                    if node in adj:
                        part = torch.broadcast_to(adj[node], ds.shape)
                        shape = score_tensors[t].shape
                        part = part.sum_to_size(shape[0], shape[1], rows if shape[2] != 1 else 1, shape[3])
                        if shape[2] == 1:
                            dts[t] += part
                        else:
                            dts[t][:, :, r0:r0 + rows] += part
            score_adj = [torch.broadcast_to(adj[i], ds.shape) for i in sorted(scores) if i in adj]
            ds = functools.reduce(torch.add, score_adj) if score_adj else torch.zeros_like(ds)
        dsg = ds.reshape(Z, H // g, g * rows, N)
        dq[:, :, r0:r0 + rows] = ((dsg @ kc).reshape(Z, H, rows, D) * scale).to(q.dtype)
        dk += dsg.transpose(-2, -1) @ q[:, :, r0:r0 + rows].to(ct).reshape(Z, H // g, g * rows, D) * scale
    dscores = [dts[i].to(score_tensors[i].dtype) for i in sorted(dts)]
    return dq, dk.to(k.dtype), dv.to(v.dtype), dscores


# ---- Triton launchers ----------------------------------------------------------------------------------------------
def _precision(dtype: torch.dtype) -> str:
    # fp32 inputs: full-precision dots unless the user opted into TF32 (as eager matmul does).
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 and not _interpret():
        return "tf32"
    return "ieee"


def _score_kwargs(score_tensors: Sequence[Tensor]) -> dict:
    kw = {}
    for i, t in enumerate(score_tensors):
        kw[f"T{i}"] = t.view(torch.uint8) if t.dtype == torch.bool else t
        for d, stride in zip("zhmn", _bcast_strides(t)):
            kw[f"stride_t{i}_{d}"] = stride
    return kw


def _strides(prefix: str, t: Tensor) -> dict:
    return {f"stride_{prefix}{d}": s for d, s in zip("zhmd" if prefix in ("q", "o", "do", "dq") else "zhnd", t.stride())}


def _common(q, k, v, spec) -> dict:
    Z, H, M, D = q.shape
    N, DV = k.shape[2], v.shape[3]
    return dict(
        H=H, M=M, N=N,
        causal_offset=spec.causal.offset(M, N) if spec.causal else 0,
        qk_scale=spec.scale_for(D) * math.log2(math.e),
        D=D, DV=DV, BLOCK_D=_pow2_at_least_16(D), BLOCK_DV=_pow2_at_least_16(DV),
        GQA_GROUP=spec.gqa_group, CAUSAL=spec.causal is not None,
        WINDOW=spec.causal.window if spec.causal is not None and spec.causal.window is not None else 0,
        PRECISION=_precision(q.dtype), UPCAST=_interpret(),
        # dropout_p is a run-time fp32 argument (not a constexpr): the compiled kernel does not depend on p.
        DROPOUT=spec.dropout_p > 0, dropout_p=spec.dropout_p,
    )


def _pick(kind: str, q: Tensor, kernel_id: str, common: dict, candidates_fn, launcher: "_Launcher", reset=None):
    if _interpret() or not q.is_cuda:
        return autotune.INTERPRETER_CONFIGS[kind]
    key = autotune.tuning_key(kind, q.device, kernel_id, q.dtype, common["D"], common["DV"], common["M"], common["N"])
    cfg = autotune.cached(key)  # the hot path: no candidate list, no device queries
    if cfg is not None:
        return cfg
    cands = candidates_fn(common["BLOCK_D"], common["BLOCK_DV"], q.element_size(), common["CAUSAL"],
                          autotune.max_shared_memory(q.device))
    return autotune.choose(key, cands, launcher.launch, reset, launcher.compile_only)


def _launch_kwargs(cfg: autotune.KernelConfig) -> dict:
    return dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


class _Launcher:
    """One generated kernel with its arguments bound: ``launch(cfg)`` runs it with cfg's blocks on the grid
    ``grid(cfg)``; ``compile_only(cfg)`` compiles that variant without running it (for the tuner)."""

    def __init__(self, kernel, grid, kwargs: dict):
        self.kernel, self.grid, self.kwargs = kernel, grid, kwargs

    def launch(self, cfg: autotune.KernelConfig) -> None:
        self.kernel[self.grid(cfg)](**self.kwargs, **_launch_kwargs(cfg))

    def compile_only(self, cfg: autotune.KernelConfig) -> None:
        self.kernel.warmup(**self.kwargs, **_launch_kwargs(cfg), grid=self.grid(cfg))


def triton_forward(q, k, v, score_tensors, spec, dropout_seed=None) -> tuple[Tensor, Tensor]:
    mod = codegen.load_module(spec)
    Z, H, M, _ = q.shape
    DV = v.shape[3]
    out = torch.empty((Z, H, M, DV), dtype=q.dtype, device=q.device)
    lse = torch.empty((Z, H, M), dtype=torch.float32, device=q.device)
    common = _common(q, k, v, spec)
    kw = dict(Q=q, K=k, V=v, Out=out, Lse=lse, Seed=_seed_arg(dropout_seed, lse), **_score_kwargs(score_tensors), **_strides("q", q), **_strides("k", k),
              **_strides("v", v), **_strides("o", out), **common)

    fwd = _Launcher(mod._attn_fwd, lambda cfg: (triton_cdiv(M, cfg.block_m), Z * H), kw)
    fwd.launch(_pick("fwd", q, mod.KERNEL_ID, common, autotune.forward_candidates, fwd))
    return out, lse


def _seed_arg(dropout_seed: Optional[Tensor], placeholder: Tensor) -> Tensor:
    # Without dropout the kernels never read Seed (DROPOUT is a constexpr); any pointer fills the parameter.
    return placeholder if dropout_seed is None else dropout_seed


def exact_delta_forced() -> bool:
    """``FUSE_ATTN_EXACT_DELTA=1``: the kernels' backward takes delta = rowsum(P * dP) from P and dP for fp16 / bf16
    too (as for fp32), at the cost of one more pass over K and V in the dQ kernel (two more matmuls per tile)."""
    return os.environ.get("FUSE_ATTN_EXACT_DELTA", "0") == "1"


def triton_backward(dout, q, k, v, score_tensors, out, lse, spec, needs_grad, dropout_seed=None):
    mod = codegen.load_module(spec)
    Z, H, M, D = q.shape
    N, DV = k.shape[2], v.shape[3]
    common = _common(q, k, v, spec)
    delta = torch.empty((Z, H, M), dtype=torch.float32, device=q.device)
    # fp32 inputs (and every dtype under FUSE_ATTN_EXACT_DELTA=1): the dQ kernel recomputes each row's softmax
    # statistics (row max, 1 / row sum) and delta = rowsum(P * dP) itself (one more pass over K and V)
    # and runs first, so dS rows sum to 0 up to rounding and one-key rows get dS = 0 exactly, as in eager; fp16 /
    # bf16 take FlashAttention's rowsum(dO * O) and the forward's lse, whose difference from it is below their
    # precision except for nearly one-hot rows, where O's rounding to the input dtype shows (TESTING.md, known
    # differences).
    exact_delta = q.dtype == torch.float32 or exact_delta_forced()
    # the row statistics the dQ kernel stores for the dK/dV kernel (log2-unit row max, 1 / row sum); not read without
    # the exact delta, when any pointer fills the parameters
    row_max, row_scale = (torch.empty_like(lse), torch.empty_like(lse)) if exact_delta else (lse, lse)
    if not exact_delta:
        mod._attn_bwd_preprocess[(triton_cdiv(M, autotune.PREPROCESS_BLOCK_M), Z * H)](
            out, dout, delta, *out.stride(), *dout.stride(), H, M, DV=DV,
            BLOCK_M=autotune.PREPROCESS_BLOCK_M, BLOCK_DV=common["BLOCK_DV"],
        )
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=q.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=q.device)
    base = dict(Q=q, K=k, V=v, DO=dout, Lse=lse, RowMax=row_max, RowScale=row_scale, Delta=delta,
                EXACT_DELTA=exact_delta, Seed=_seed_arg(dropout_seed, lse), **_score_kwargs(score_tensors),
                **_strides("q", q), **_strides("k", k), **_strides("v", v), **_strides("do", dout),
                sm_scale=spec.scale_for(D), **common)

    # d(bias) buffers: fp32, the bias's shape, accumulated with atomics (stride 0 on its broadcast dims), by the dQ
    # kernel with the exact delta (from the P and dP of delta) and by the dK/dV kernel otherwise (faster there).
    dbufs = {}
    dkw, dq_needs, kv_needs = {}, {}, {}
    for i, (t, st) in enumerate(zip(score_tensors, spec.score_tensors)):
        if st.role != "bias":
            continue
        need = bool(needs_grad[i])
        buf = torch.zeros(t.shape, dtype=torch.float32, device=q.device) if need else t
        if need:
            dbufs[i] = buf
        dkw[f"DT{i}"] = buf
        for d, stride in zip("zhmn", _bcast_strides(buf) if need else (0, 0, 0, 0)):
            dkw[f"stride_dt{i}_{d}"] = stride
        dq_needs[f"NEED_DT{i}"] = need and exact_delta
        kv_needs[f"NEED_DT{i}"] = need and not exact_delta

    kv_kw = dict(base, DK=dk, DVout=dv, **dkw, **kv_needs,
                 **{f"stride_dk{d}": s for d, s in zip("zhnd", dk.stride())},
                 **{f"stride_dv{d}": s for d, s in zip("zhnd", dv.stride())})

    dkdv = _Launcher(mod._attn_bwd_dkdv, lambda cfg: (triton_cdiv(N, cfg.block_n), Z * (H // spec.gqa_group)), kv_kw)

    def reset_dbias():
        for buf in dbufs.values():
            buf.zero_()

    dq_launcher = _Launcher(mod._attn_bwd_dq, lambda cfg: (triton_cdiv(M, cfg.block_m), Z * H),
                            dict(base, DQ=dq, **dkw, **dq_needs, **_strides("dq", dq)))
    # a forced exact delta makes other dQ and dK/dV kernels for fp16 / bf16: tuned apart from the default ones
    bwd_id = mod.KERNEL_ID + ("+exact_delta" if exact_delta and q.dtype != torch.float32 else "")
    if exact_delta:  # dQ writes delta and the row statistics, which dK/dV reads
        dq_launcher.launch(_pick("bwd_dq", q, bwd_id, common, autotune.dq_candidates, dq_launcher, reset_dbias))
    dkdv.launch(_pick("bwd_dkdv", q, bwd_id, common, autotune.dkdv_candidates, dkdv, None if exact_delta else reset_dbias))
    if not exact_delta:
        dq_launcher.launch(_pick("bwd_dq", q, bwd_id, common, autotune.dq_candidates, dq_launcher))
    # A row whose lse is not finite has P = NaN (eager's softmax of it), so eager's dV = P^T dO is NaN for every
    # key of its kv head -- also the keys of blocks the dK/dV kernel skips as invisible to that row.
    nan_rows = ~torch.isfinite(lse).reshape(Z, H // spec.gqa_group, spec.gqa_group * M).all(-1)
    dv.masked_fill_(nan_rows[:, :, None, None], float("nan"))
    dscores = [dbufs[i].to(score_tensors[i].dtype) for i in sorted(dbufs)]
    return dq, dk, dv, dscores


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


# ---- the ops -------------------------------------------------------------------------------------------------------
def _use_triton(q: Tensor) -> bool:
    return q.is_cuda or (q.device.type == "cpu" and _interpret())


# (spec digest, "forward" / "backward", head dims) whose kernels failed in this process: they run the blockwise
# path from then on, without trying (and warning) again.
_kernel_failures: set[tuple] = set()


def _with_fallback(direction: str, spec: AttentionSpec, q: Tensor, v: Tensor, kernels, blockwise):
    """``kernels()`` -- or, if generating, compiling or launching them fails (no launch config works, a Triton
    error), ``blockwise()``: the same attention in plain PyTorch, on any device. The user's model never crashes
    because of a kernel; the first failure per spec, direction and head dims logs a warning saying why."""
    key = (codegen.spec_digest(spec), direction, q.shape[3], v.shape[3])
    if key not in _kernel_failures:
        try:
            return kernels()
        except Exception as e:
            _kernel_failures.add(key)
            lines = str(e).strip().splitlines()
            log.warning("fuse_attn: the %s kernels for %s (head dims %d/%d) failed (%s: %s); this attention's %s runs "
                        "in plain PyTorch (blockwise, slower) from now on", direction, spec.describe(), q.shape[3],
                        v.shape[3], type(e).__name__, lines[0] if lines else "", direction)
            log.debug("fuse_attn: %s kernel failure", direction, exc_info=e)
    return blockwise()


@torch.library.custom_op("fuse_attn::flash_attention", mutates_args=())
def flash_attention_op(q: Tensor, k: Tensor, v: Tensor, score_tensors: list[Tensor], dropout_seed: Optional[Tensor],
                       spec: str) -> tuple[Tensor, Tensor]:
    s = AttentionSpec.from_json(spec)
    validate(q, k, v, score_tensors, s, dropout_seed)
    Z, H, M, _ = q.shape
    N, DV = k.shape[2], v.shape[3]
    if Z * H * M == 0 or N == 0:
        # softmax over zero keys @ v is zeros in eager; the logsumexp of nothing is -inf.
        return (torch.zeros((Z, H, M, DV), dtype=q.dtype, device=q.device),
                torch.full((Z, H, M), float("-inf"), dtype=torch.float32, device=q.device))

    def blockwise():
        return blockwise_forward(q, k, v, score_tensors, s, dropout_seed=dropout_seed)

    if _use_triton(q):
        from . import flash_decoding  # here, not at the top: flash_decoding imports this module

        def kernels():
            splits = flash_decoding.dispatch_splits(q, k, s)  # few query rows, many keys: split-K over the keys
            if splits > 1:
                return flash_decoding.triton_forward(q, k, v, score_tensors, s, splits)
            return triton_forward(q, k, v, score_tensors, s, dropout_seed)

        return _with_fallback("forward", s, q, v, kernels, blockwise)
    return blockwise()


@flash_attention_op.register_fake
def _(q, k, v, score_tensors, dropout_seed, spec):
    s = AttentionSpec.from_json(spec)
    validate(q, k, v, score_tensors, s, dropout_seed)
    Z, H, M, _ = q.shape
    return q.new_empty((Z, H, M, v.shape[3])), q.new_empty((Z, H, M), dtype=torch.float32)


@torch.library.custom_op("fuse_attn::flash_attention_backward", mutates_args=())
def flash_attention_backward_op(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, score_tensors: list[Tensor], dropout_seed: Optional[Tensor],
    out: Tensor, lse: Tensor, spec: str, score_tensor_needs_grad: list[bool],
) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    s = AttentionSpec.from_json(spec)
    validate(q, k, v, score_tensors, s, dropout_seed)
    needs = _check_needs(score_tensors, s, score_tensor_needs_grad)
    Z, H, M, _ = q.shape
    N = k.shape[2]
    if Z * H * M == 0 or N == 0:
        return (torch.zeros(q.shape, dtype=q.dtype, device=q.device), torch.zeros(k.shape, dtype=k.dtype, device=k.device),
                torch.zeros(v.shape, dtype=v.dtype, device=v.device),
                [torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t, n in zip(score_tensors, needs) if n])
    def blockwise():
        return blockwise_backward(dout, q, k, v, score_tensors, out, lse, s, needs, dropout_seed=dropout_seed)

    if _use_triton(q):
        return _with_fallback("backward", s, q, v,
                              lambda: triton_backward(dout, q, k, v, score_tensors, out, lse, s, needs, dropout_seed), blockwise)
    return blockwise()


def _check_needs(score_tensors, spec: AttentionSpec, needs: Sequence[bool]) -> list[bool]:
    if len(needs) != len(score_tensors):
        raise UnsupportedSpec(f"score_tensor_needs_grad has {len(needs)} flags for {len(score_tensors)} score tensors")
    for i, (n, st) in enumerate(zip(needs, spec.score_tensors)):
        if n and st.role != "bias":
            raise UnsupportedSpec(f"score tensor {i} is a {st.role}; only bias tensors get a gradient")
    return list(needs)


@flash_attention_backward_op.register_fake
def _(dout, q, k, v, score_tensors, dropout_seed, out, lse, spec, score_tensor_needs_grad):
    s = AttentionSpec.from_json(spec)
    validate(q, k, v, score_tensors, s, dropout_seed)
    needs = _check_needs(score_tensors, s, score_tensor_needs_grad)
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            [t.new_empty(t.shape) for t, n in zip(score_tensors, needs) if n])


def _setup_context(ctx, inputs, output):
    q, k, v, score_tensors, dropout_seed, spec = inputs
    out, lse = output
    ctx.spec = spec
    ctx.num_scores = len(score_tensors)
    ctx.needs = [bool(t.requires_grad and t.is_floating_point()) for t in score_tensors]
    # the seed (a scalar) is all the backward needs to regenerate the keep-mask
    ctx.save_for_backward(q, k, v, out, lse, dropout_seed, *score_tensors)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, dropout_seed, *score_tensors = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv, dscores = torch.ops.fuse_attn.flash_attention_backward(
        dout, q, k, v, score_tensors, dropout_seed, out, lse, ctx.spec, ctx.needs)
    it = iter(dscores)
    grads = [next(it) if n else None for n in ctx.needs]
    return dq, dk, dv, grads, None, None


flash_attention_op.register_autograd(_backward, setup_context=_setup_context)


def flash_attention(q: Tensor, k: Tensor, v: Tensor, spec, score_tensors: Sequence[Tensor] = (),
                    dropout_seed: Optional[Tensor] = None, return_lse: bool = False):
    """Fused attention without torch.compile: ``out`` (differentiable), or ``(out, lse)`` with ``return_lse``.

    ``spec`` is an :class:`AttentionSpec` or its JSON. q ``[Z, H, M, D]``, k ``[Z, H // g, N, D]``,
    v ``[Z, H // g, N, DV]`` with any strides; score tensors 4-D, broadcastable to ``[Z, H, M, N]``.
    ``dropout_seed``: with ``spec.dropout_p > 0``, the 0-dim int64 tensor on q's device that the kernels draw the
    keep-mask from (the same seed gives the same mask); if None, one is drawn from torch's generator for q's
    device (``torch.manual_seed`` governs it, no host sync). Must be None when dropout_p is 0."""
    text = spec.to_json() if isinstance(spec, AttentionSpec) else spec
    if dropout_seed is None and AttentionSpec.from_json(text).dropout_p:
        dropout_seed = torch.randint(torch.iinfo(torch.int64).max, (), dtype=torch.int64, device=q.device)
    out, lse = torch.ops.fuse_attn.flash_attention(q, k, v, list(score_tensors), dropout_seed, text)
    return (out, lse) if return_lse else out


def generated_source(spec) -> str:
    """The generated Triton source for a spec (AttentionSpec or its JSON)."""
    spec = AttentionSpec.from_json(spec) if isinstance(spec, str) else spec
    return codegen.generate_source(spec)
