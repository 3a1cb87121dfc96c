"""Generated Triton flash-attention kernels behind one fused op.

* ``torch.ops.fuse_attn.flash_attention(q, k, v, score_tensors, dropout_seed, spec_json) -> (out, lse)``
* ``torch.ops.fuse_attn.flash_attention_backward(dout, q, k, v, score_tensors, dropout_seed, out, lse, spec_json,
  score_tensor_needs_grad, dlse=None) -> (dq, dk, dv, dscore_tensors)`` (``dropout_seed``: an int64 scalar tensor
  when the spec's dropout_p > 0, else None; ``dlse``: the gradient of lse, None for zero)
* ``torch.ops.fuse_attn.flash_attention_hopper(q, k, v, spec_json, bias=None) -> (out, lse)`` -- the forward of
  plain attention (or ``s + bias``, ``bias`` its score tensor) in Gluon for Hopper GPUs (:mod:`.hopper.forward`),
  whose backward is ``flash_attention_hopper_backward(dout, q, k, v, out, lse, spec_json, dlse=None, bias=None,
  bias_grad=False) -> (dq, dk, dv, dbias)`` (:mod:`.hopper.backward`, Gluon too; dbias empty without bias_grad)
* ``torch.ops.fuse_attn.table_lookup(weight, indices, padding_idx)`` -- an embedding lookup of a few-row table whose
  gradient ``table_gradient(grad, indices, rows, padding_idx)`` sums by programs, not atomics
  (:mod:`.embedding_backward`: T5's relative position bias)
* :func:`flash_attention` -- the same without torch.compile (differentiable in out and lse).
* :func:`generated_source` -- the Triton source generated for a spec.
"""

import torch

from fuse_attn.kernels import embedding_backward  # noqa: F401  (torch.ops.fuse_attn.table_lookup / table_gradient)
from fuse_attn.kernels.generated.codegen import generate_source
from fuse_attn.kernels.ops import flash_attention, generated_source
from fuse_attn.kernels.reference import blockwise_backward, blockwise_forward, reference_attention

try:  # torch.ops.fuse_attn.flash_attention_hopper(_backward): the Gluon forward and backward on Hopper (Triton 3.6 on)
    from fuse_attn.kernels import hopper  # noqa: F401
except ImportError:  # (dispatch.gluon_reasons says why it is no candidate)
    pass

if torch.distributed.is_available():
    from fuse_attn.kernels import sharding  # noqa: F401  (the ops' DTensor sharding rules)

__all__ = [
    "flash_attention",
    "generated_source",
    "generate_source",
    "reference_attention",
    "blockwise_forward",
    "blockwise_backward",
]
