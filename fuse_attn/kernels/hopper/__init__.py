"""Gluon kernels for Hopper GPUs: ``torch.ops.fuse_attn.flash_attention_hopper`` (:mod:`.forward`) and its backward
(:mod:`.backward`), what both share in :mod:`.common`. Importing this package registers both ops; it raises
ImportError where Triton has no Gluon."""

from fuse_attn.kernels.hopper import backward, forward  # noqa: F401
