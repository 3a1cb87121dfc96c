"""Plain-PyTorch attention as an :class:`~fuse_attn.spec.AttentionSpec` defines it: the naive reference the kernels are
tested against (:func:`reference_attention`, full score matrix) and the CPU blockwise path (:func:`blockwise_forward`
/ :func:`blockwise_backward`: a block of query rows at a time, never the full N x N matrix), which the op runs on CPU
tensors outside the interpreter and wherever the kernels cannot be generated, compiled or launched.

Nothing here launches a kernel: this module imports only the spec, the score program and the kernels' Philox
stream (so that dropout's keep-mask is the kernels' own).
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence

import torch
from torch import Tensor

from fuse_attn.spec import AttentionSpec
from fuse_attn.kernels import philox, score_program_eval

# Query rows per step of the CPU blockwise path: a [Z, H, 128, N] fp32 score block is 0.5 MiB per (z, h)
# at N = 1024 -- far below the N x N matrix, and large enough that matmuls dominate the Python overhead.
CPU_BLOCK_M = 128


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
    s = score_program_values(s, score_tensors, spec, 0, M, N)[-1]
    if spec.causal is not None:
        s = s.masked_fill(~causal_visible(0, M, M, N, spec, s.device), float("-inf"))
    p = softmax_of_spec(s, spec)
    if spec.dropout_p:
        p = _drop(p, _keep_mask(dropout_seed, spec, p.shape, M, 0), spec.dropout_p)
    return p @ v, torch.logsumexp(s, dim=-1).float()


def softmax_of_spec(s: Tensor, spec: AttentionSpec) -> Tensor:
    """``softmax(s, -1)``; with ``spec.empty_rows == "zero"``, 0 on rows whose every score is -inf (as
    ``aten._safe_softmax`` gives) instead of NaN."""
    p = torch.softmax(s, dim=-1)
    if spec.empty_rows == "zero":
        p = p.masked_fill(torch.isneginf(s).all(-1, keepdim=True), 0.0)
    return p


def _keep_mask(dropout_seed: Tensor, spec: AttentionSpec, block_shape, M: int, row0: int) -> Tensor:
    """The kernels' Philox keep-mask of a [Z, H, rows, N] block holding rows [row0, row0 + rows) of [Z, H, M, N]."""
    Z, H, rows, N = block_shape
    return philox.dropout_keep(dropout_seed, spec.dropout_p, Z, H, M, N, row0, rows)


def _drop(x: Tensor, keep: Tensor, dropout_p: float) -> Tensor:
    """``x * keep / (1 - p)`` as eager dropout computes it (the scale applied in x's compute precision; a dropped
    NaN stays NaN, as eager's multiplication by the mask leaves it)."""
    return x * (keep.to(x.dtype) * (1.0 / (1.0 - dropout_p)))


def score_program_values(s: Tensor, score_tensors: Sequence[Tensor], spec: AttentionSpec, row0: int, M: int, N: int) -> list:
    """The values of every node of the score program on the scores ``s`` of query rows [row0, row0 + rows) (the
    last one broadcast to ``s``'s shape); ``[s]`` for an empty program."""
    if not spec.score_program:
        return [s]
    Z, H, rows, _ = s.shape
    tensors = [t if t.shape[2] == 1 else t[:, :, row0:row0 + rows] for t in score_tensors]
    ops = score_program_eval.TorchOps(s, tensors, score_program_eval.torch_indices(row0, rows, Z, H, M, N, s.device))
    vals = score_program_eval.forward(spec.score_program, ops)
    vals[-1] = torch.broadcast_to(vals[-1], s.shape)
    return vals


def causal_visible(row0: int, rows: int, M: int, N: int, spec: AttentionSpec, device) -> Tensor:
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
    vals = score_program_values(s, score_tensors, spec, row0, M, N)
    s = vals[-1]
    if spec.causal is not None:
        s = s.masked_fill(~causal_visible(row0, rows, M, N, spec, s.device), float("-inf"))
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
        p = softmax_of_spec(s, spec)
        if spec.dropout_p:
            p = _drop(p, _keep_mask(dropout_seed, spec, p.shape, M, r0), spec.dropout_p)
        o = (p.reshape(Z, H // g, g * rows, N) @ v.to(p.dtype)).reshape(Z, H, rows, DV)
        out[:, :, r0:r0 + rows] = o.to(q.dtype)
        lse[:, :, r0:r0 + rows] = torch.logsumexp(s, dim=-1).float()
    return out, lse


def blockwise_backward(dout, q, k, v, score_tensors, out, lse, spec, needs_grad, block_m: int = CPU_BLOCK_M,
                       dropout_seed=None, dlse=None):
    """Gradients with P recomputed per block of query rows (each block holds whole rows, so P is the exact
    softmax of the block's scores; no N x N buffer). A row that saw only -inf (or a NaN) has P = NaN, as in eager
    (a row that saw only -inf has P = 0 and adds nothing under ``empty_rows="zero"``): dV of its kv head is NaN,
    and its dS passes through the score program's backward (where a masking ``where`` zeroes it, as eager's does).

    The score program is differentiated by :func:`.score_program_eval.backward` (the same derivative rules as the
    kernels) on the node values kept while the block's scores are recomputed: a few [Z, H, rows, N] tensors.
    torch.autograd cannot do this part: this runs as the implementation of a custom op, below the Autograd
    dispatch key, where ``torch.enable_grad()`` records nothing.

    ``dlse``: the gradient of the lse output ([Z, H, M], or None for zero): d lse_i / d s_ij = P_ij, so it is taken
    off each row's delta."""
    Z, H, M, D = q.shape
    N, DV = k.shape[2], v.shape[3]
    g = spec.gqa_group
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=ct, device=q.device)
    dv = torch.zeros(v.shape, dtype=ct, device=q.device)
    dts = {i: torch.zeros(t.shape, dtype=ct, device=q.device) for i, (t, need) in enumerate(zip(score_tensors, needs_grad)) if need}
    program = spec.score_program
    scores = score_program_eval.score_sources(program)
    bias_loads = {t: nodes for t, nodes in score_program_eval.bias_load_sources(program, spec.score_tensors).items() if t in dts}
    sources = scores.union(*bias_loads.values())
    kc, vc = k.to(ct), v.to(ct)
    scale = spec.scale_for(D)
    for r0 in range(0, M, block_m):
        s, vals = _blockwise_scores(q[:, :, r0:r0 + block_m], k, score_tensors, spec, r0, M, N)
        rows = s.shape[2]
        p = softmax_of_spec(s, spec)
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
        if dlse is not None:
            delta = delta - dlse[:, :, r0:r0 + rows, None].to(ct)
        ds = p * (dp - delta)
        if spec.causal is not None:  # masked_fill's backward: no gradient outside the band, even where P is NaN
            ds = ds.masked_fill(~causal_visible(r0, rows, M, N, spec, ds.device), 0.0)
        if program:
            ops = score_program_eval.TorchOps(ds, (), {})  # the reverse pass reads no leaves: only the dtype, device
            adj = score_program_eval.backward(program, spec.score_tensors, vals, ops, ds, sources)
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

