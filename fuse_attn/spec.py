"""The one object matching and code generation share: a frozen description of one matched attention.

The matcher (``fuse_attn.matching``) builds an :class:`AttentionSpec` from FX nodes; the kernels
(``fuse_attn.kernels``) receive it -- as the JSON string argument of the fused op -- and never see a node.

Semantics, for q ``[Z, H, M, D]``, k ``[Z, H // gqa_group, N, D]``, v ``[Z, H // gqa_group, N, DV]`` and the
score tensors ``T[i]`` (4-D, broadcastable to ``[Z, H, M, N]``)::

    s = (q @ k^T) * scale                      # fp32, natural-log units
    for op in score_mods: s = op(s)            # ScaleScores / AddTensor / FillWhere / Tanh, in this order
    if causal: s = where(key <= query + causal.offset(M, N), s, -inf)
    out = softmax(s, dim=-1) @ v               # out in q's dtype; lse = logsumexp(s, -1) in fp32

Lengths M and N are run-time values (a spec may record them for display when they are static).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Literal, Optional, Union

SUPPORTED_DTYPES = ("float16", "bfloat16", "float32")
# Largest head dim the kernels take: a 256-wide fp32 accumulator tile is the most the register file of an
# SM (64K 32-bit registers) holds next to the score tile at the smallest block sizes (FA2/FA3 have the same cap).
MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class ScaleScores:
    """``s = s * factor`` (a multiplication that is not leading; leading ones are folded into ``scale``)."""

    factor: float
    kind: Literal["scale"] = "scale"


@dataclass(frozen=True)
class AddTensor:
    """``s = s + T[tensor]`` -- an additive bias or float mask, loaded per tile through broadcast strides."""

    tensor: int
    kind: Literal["add"] = "add"


@dataclass(frozen=True)
class FillWhere:
    """``s = where(T[tensor] == fill_when, value, s)`` -- ``masked_fill`` / ``where`` with a boolean tensor."""

    tensor: int
    value: float
    fill_when: bool
    kind: Literal["fill"] = "fill"


@dataclass(frozen=True)
class Tanh:
    """``s = tanh(s)`` -- with ScaleScores around it, a logit softcap ``tanh(s / c) * c`` (Gemma-2)."""

    kind: Literal["tanh"] = "tanh"


ScoreOp = Union[ScaleScores, AddTensor, FillWhere, Tanh]
_SCORE_OP_TYPES = {cls.__dataclass_fields__["kind"].default: cls for cls in (ScaleScores, AddTensor, FillWhere, Tanh)}


@dataclass(frozen=True)
class ScoreTensor:
    """A tensor read by the score mods. ``broadcast`` says, for (Z, H, M, N), which dims have size 1."""

    role: Literal["bias", "mask"]
    dtype: str
    broadcast: tuple[bool, bool, bool, bool]


@dataclass(frozen=True)
class CausalMask:
    """Key ``j`` is visible to query ``i`` iff ``j <= i + offset``.

    ``offset = diagonal`` for ``top_left`` alignment (``tril(ones(M, N), diagonal)``) and
    ``diagonal + N - M`` for ``bottom_right`` (the query block is the last M positions of the N keys).
    """

    diagonal: int = 0
    alignment: Literal["top_left", "bottom_right"] = "top_left"

    def offset(self, q_len: int, kv_len: int) -> int:
        return self.diagonal + (kv_len - q_len if self.alignment == "bottom_right" else 0)


@dataclass(frozen=True)
class AttentionSpec:
    dtype: str
    head_dim: int
    head_dim_v: int
    scale: float
    causal: Optional[CausalMask] = None
    score_mods: tuple[ScoreOp, ...] = ()
    score_tensors: tuple[ScoreTensor, ...] = ()
    gqa_group: int = 1
    dropout_p: float = 0.0
    # Display only (None when symbolic); not part of the kernel key.
    q_len: Optional[int] = None
    kv_len: Optional[int] = None
    num_heads: Optional[int] = None

    def __post_init__(self):
        problems = self.unsupported_reasons()
        if problems:
            raise UnsupportedSpec("; ".join(problems))

    def unsupported_reasons(self) -> list[str]:
        reasons = []
        if self.dtype not in SUPPORTED_DTYPES:
            reasons.append(f"dtype {self.dtype} is not supported (fp16, bf16, fp32 are)")
        for name, dim in (("head dim", self.head_dim), ("value head dim", self.head_dim_v)):
            if not 1 <= dim <= MAX_HEAD_DIM:
                reasons.append(f"{name} {dim} is outside 1..{MAX_HEAD_DIM}")
        if not math.isfinite(self.scale):
            reasons.append(f"scale {self.scale} is not finite")
        if self.gqa_group < 1:
            reasons.append(f"gqa_group {self.gqa_group} < 1")
        if self.dropout_p != 0.0:
            reasons.append("dropout inside the attention is not fused yet")
        for op in self.score_mods:
            if isinstance(op, (AddTensor, FillWhere)) and not 0 <= op.tensor < len(self.score_tensors):
                reasons.append(f"score op {op} names a missing tensor")
            if isinstance(op, AddTensor) and self.score_tensors[op.tensor].role != "bias":
                reasons.append(f"score op {op} adds a non-bias tensor")
            if isinstance(op, FillWhere) and self.score_tensors[op.tensor].role != "mask":
                reasons.append(f"score op {op} fills by a non-mask tensor")
        return reasons

    # ---- keys and serialization -------------------------------------------------------------------------
    def kernel_key(self) -> "AttentionSpec":
        """The spec without its display-only fields: two specs with the same kernel key share kernels."""
        return dataclasses.replace(self, q_len=None, kv_len=None, num_heads=None)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.kernel_key().to_json().encode()).hexdigest()[:16]

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def from_json(text: str) -> "AttentionSpec":
        raw = json.loads(text)
        raw["causal"] = CausalMask(**raw["causal"]) if raw["causal"] else None
        raw["score_mods"] = tuple(_SCORE_OP_TYPES[op["kind"]](**op) for op in raw["score_mods"])
        raw["score_tensors"] = tuple(
            ScoreTensor(role=t["role"], dtype=t["dtype"], broadcast=tuple(t["broadcast"])) for t in raw["score_tensors"]
        )
        return AttentionSpec(**raw)

    def describe(self) -> str:
        """One line for logs and dump_graph."""
        parts = [f"{self.dtype}", f"D={self.head_dim}" + (f"/Dv={self.head_dim_v}" if self.head_dim_v != self.head_dim else "")]
        if self.q_len is not None or self.kv_len is not None:
            parts.append(f"M={self.q_len if self.q_len is not None else '?'} N={self.kv_len if self.kv_len is not None else '?'}")
        parts.append(f"scale={self.scale:.6g}")
        if self.causal:
            parts.append(f"causal({self.causal.alignment}, diagonal={self.causal.diagonal})")
        for op in self.score_mods:
            if isinstance(op, ScaleScores):
                parts.append(f"*{op.factor:.6g}")
            elif isinstance(op, AddTensor):
                t = self.score_tensors[op.tensor]
                parts.append(f"+bias{op.tensor}[{_broadcast_text(t.broadcast)}]")
            elif isinstance(op, Tanh):
                parts.append("tanh")
            else:
                t = self.score_tensors[op.tensor]
                parts.append(f"fill(mask{op.tensor}[{_broadcast_text(t.broadcast)}]=={op.fill_when}, {op.value:.6g})")
        if self.gqa_group > 1:
            parts.append(f"gqa={self.gqa_group}")
        return " ".join(parts)


def _broadcast_text(broadcast: tuple[bool, bool, bool, bool]) -> str:
    return ",".join("1" if b else name for b, name in zip(broadcast, "ZHMN"))


class UnsupportedSpec(ValueError):
    """Raised for a spec or inputs the kernels cannot run; the backend turns it into 'not rewritten: ...'."""
