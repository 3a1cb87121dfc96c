"""DTensor sharding rules of the fused ops: tensor parallel (and data parallel on DTensors) runs the kernels on each
rank's shard.

Attention is independent across batch rows and across heads, so the forward and backward ops accept q, k, v sharded
on the batch dim (0) or the head dim (1) -- each rank attends over its own rows or heads, with no communication --
besides all replicated. Sharding heads keeps GQA groups whole: it is offered only when the query heads and the kv
heads both divide evenly over the mesh, so each rank holds whole groups. Score tensors follow the dim they share with
q (sharded where they have it, replicated where it is broadcast); a bias broadcast over the sharded dim gets a
``Partial`` gradient (each rank's share, summed by DTensor). A spec whose score program reads the batch or head
index (``batch_idx`` / ``head_idx``: a rank's local index is not the global one) is not sharded on that dim, nor a
spec with dropout (the keep-mask is drawn from local indices: two ranks would drop the same entries of other heads).

Where no sharded rule applies (heads not divisible by the mesh, say) DTensor gathers the inputs and runs the op
replicated: correct, with the communication that costs; the reason is logged once per spec and shapes.
Registered through ``torch.distributed.tensor.experimental.register_sharding`` when torch has distributed support.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.experimental import register_sharding

from fuse_attn.kernels import plan
from fuse_attn.kernels.ops import parse_spec

log = logging.getLogger("fuse_attn.kernels")

_INDEX_LEAF = {0: "batch_idx", 1: "head_idx"}  # the score-program leaf that reads the global index of each dim
_DIM_NAME = {0: "batch", 1: "head"}


def _placement(shape, dim: int, full_size) -> object:
    """The placement of a score tensor (or the 0-dim dropout seed) of ``shape`` when q is sharded on ``dim`` of size
    ``full_size``: sharded there if it has that dim, else replicated."""
    return Shard(dim) if len(shape) > dim and shape[dim] == full_size != 1 else Replicate()


def _shardable_dims(q_shape, k_shape, ranks: int, spec) -> list[int]:
    """The dims (0: batch, 1: heads) q, k, v can be sharded on over ``ranks``; the reason for each other dim is
    logged."""
    dims = []
    for dim in (0, 1):
        sizes = (q_shape[dim], k_shape[dim])
        if spec.dropout_p:
            # the keep-mask is drawn per local (batch row, head): ranks would draw the same masks for other heads
            reason = "dropout: each rank would draw its shard's keep-masks from the same local indices"
        elif any(node.op == _INDEX_LEAF[dim] for node in spec.score_program):
            reason = f"its score program reads {_INDEX_LEAF[dim]}"
        elif any(size % ranks for size in sizes):
            reason = f"{_DIM_NAME[dim]} sizes {sizes} (q, k) do not divide over {ranks} ranks"
        else:
            dims.append(dim)
            continue
        _log_unsharded(plan.describe(spec), _DIM_NAME[dim], reason)
    return dims


@functools.lru_cache(maxsize=256)
def _log_unsharded(spec_text: str, dim_name: str, reason: str) -> None:  # once per spec, dim and reason
    log.info("fuse_attn: %s is not sharded on its %s dim (%s)", spec_text, dim_name, reason)


@register_sharding(torch.ops.fuse_attn.flash_attention.default)
def _forward_shardings(q, k, v, score_tensors, dropout_seed, spec):
    s = parse_spec(spec)
    seed = [] if dropout_seed is None else [Replicate()]
    strategies = [([Replicate(), Replicate()], [Replicate()] * (3 + len(score_tensors)) + seed)]
    for dim in _shardable_dims(q.shape, k.shape, q.mesh.size(), s):
        scores = [_placement(t.shape, dim, q.shape[dim]) for t in score_tensors]
        strategies.append(([Shard(dim), Shard(dim)], [Shard(dim)] * 3 + scores + seed))
    return strategies


def _sharded_backward(op_call, args: tuple, kwargs: dict):
    """The backward op on DTensors. ``register_sharding`` cannot describe its list output (the score tensors'
    gradients), so it runs as DTensor's own handlers of such ops do (``aten.convolution_backward``'s): every input
    redistributed to q's placement where that placement is one of the rules above (else replicated), the op on the
    local tensors, the outputs wrapped with that placement -- a bias gradient ``Partial`` where the bias is replicated
    over a sharded dim."""
    from torch.distributed.tensor import DTensor

    bound = torch.ops.fuse_attn.flash_attention_backward.default._schema.arguments
    values = dict(zip((a.name for a in bound), args), **kwargs)
    q, k = values["q"], values["k"]
    mesh = q.device_mesh
    allowed = set(_shardable_dims(q.shape, k.shape, mesh.size(), parse_spec(values["spec"])))
    if all(isinstance(p, Replicate) or (isinstance(p, Shard) and p.dim in allowed) for p in q.placements):
        target = list(q.placements)
    else:
        target = [Replicate()] * mesh.ndim

    def placements_of(t, like_q: bool):
        return target if like_q else [_placement(t.shape, p.dim, q.shape[p.dim]) if isinstance(p, Shard)
                                      else Replicate() for p in target]

    def local(t, like_q=True):
        if not isinstance(t, DTensor):
            return t
        return t.redistribute(mesh, placements_of(t, like_q)).to_local()

    scores = values["score_tensors"]
    dq, dk, dv, dscores = op_call(
        local(values["dout"]), local(q), local(k), local(values["v"]), [local(t, like_q=False) for t in scores],
        local(values["dropout_seed"], like_q=False) if values["dropout_seed"] is not None else None,
        local(values["out"]), local(values["lse"]), values["spec"], values["score_tensor_needs_grad"],
        local(values.get("dlse")))

    def wrap(local_tensor, like, placements):
        return DTensor.from_local(local_tensor, mesh, placements, run_check=False, shape=like.shape, stride=like.stride())

    needing = [t for t, need in zip(scores, values["score_tensor_needs_grad"]) if need]
    grads = [wrap(g, t, [Partial() if isinstance(tp, Replicate) and isinstance(qp, Shard) else tp
                         for tp, qp in zip(placements_of(t, False), target)]) for g, t in zip(dscores, needing)]
    return wrap(dq, q, target), wrap(dk, k, target), wrap(dv, values["v"], target), grads


def _register_backward_handler() -> None:
    from torch.distributed.tensor import DTensor

    # private in torch 2.11-2.13 (DTensor's table of ops handled outside sharding propagation)
    DTensor._op_dispatcher._custom_op_handlers[torch.ops.fuse_attn.flash_attention_backward.default] = _sharded_backward


_register_backward_handler()
