"""The one object matching and code generation share: a frozen description of one matched attention.

The matcher (``fuse_attn.graph.matching``) builds an :class:`AttentionSpec` from FX nodes; the kernels
(``fuse_attn.kernels``) receive it -- as the JSON string argument of the fused op -- and never see a node.

Semantics, for q ``[Z, H, M, D]``, k ``[Z, H // gqa_group, N, D]``, v ``[Z, H // gqa_group, N, DV]`` and the
score tensors ``T[i]`` (4-D, broadcastable to ``[Z, H, M, N]``)::

    s = (q @ k^T) * scale                      # fp32, natural-log units
    s = score_program(s, z, h, i, j, T[.][z, h, i, j])  # a pointwise program (ScoreNode list), computed in fp32
    if causal: s = where(causal.visible(i, j), s, -inf)
    out = softmax(s, dim=-1) @ v               # out in q's dtype; lse = logsumexp(s, -1) in fp32

A row whose every score is -inf (an "empty" row: every key masked) is NaN in ``softmax``; with
``empty_rows="zero"`` its output and gradients are 0 instead, as ``aten._safe_softmax`` and
``scaled_dot_product_attention`` give. Its lse is -inf either way.

With ``dropout_p > 0`` each probability is kept with probability ``1 - dropout_p`` and scaled by
``1 / (1 - dropout_p)``, else zeroed, before the product with v (``dropout(softmax(s), p, training=True) @ v``);
lse stays that of the undropped scores. The keep-mask is Philox noise from an int64 seed tensor the op receives
(``fuse_attn.kernels.philox``).

Lengths M and N are run-time values (a spec may record them for display when they are static).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Literal, Optional

from fuse_attn.score_program import INT_DTYPES, ScoreNode, ScoreTensor, UnsupportedSpec, node_kinds, program_text

SUPPORTED_DTYPES = ("float16", "bfloat16", "float32")
# Largest head dim the kernels take: Gemma-4's global layers' 512. The generated kernels hold a 512-wide fp32
# accumulator in 16-64 rows (tuning._WIDEST_FWD and its kin, from a timed sweep); the Gluon kernels and SDPA's flash
# and cuDNN kernels stop at 256.
MAX_HEAD_DIM = 512


@dataclass(frozen=True)
class CausalMask:
    """Key ``j`` is visible to query ``i`` iff ``j <= i + offset`` -- and, with a sliding ``window``, also
    ``j > i + offset - window`` (the ``window`` most recent keys, Mistral style).

    ``offset = diagonal`` for ``top_left`` alignment (``tril(ones(M, N), diagonal)``) and
    ``diagonal + N - M`` for ``bottom_right`` (the query block is the last M positions of the N keys).
    Both bounds are index-only: the kernels skip blocks outside them and never load a mask tensor.
    """

    diagonal: int = 0
    alignment: Literal["top_left", "bottom_right"] = "top_left"
    window: Optional[int] = None

    def offset(self, q_len: int, kv_len: int) -> int:
        return self.diagonal + (kv_len - q_len if self.alignment == "bottom_right" else 0)


@dataclass(frozen=True)
class AttentionSpec:
    dtype: str
    head_dim: Optional[int]  # None: symbolic, taken from q at run time (the kernels are specialized per head dim)
    head_dim_v: Optional[int]
    scale: float  # the scores are (q @ k^T) * scale * head_dim ** scale_head_dim_power
    causal: Optional[CausalMask] = None
    # The scores after ``scale``, as a pointwise program (empty: unchanged); its last node is the new score.
    score_program: tuple[ScoreNode, ...] = ()
    score_tensors: tuple[ScoreTensor, ...] = ()
    gqa_group: int = 1
    dropout_p: float = 0.0
    # What a row with every score at -inf gives: NaN (``softmax``) or 0 (``_safe_softmax``, SDPA).
    empty_rows: Literal["nan", "zero"] = "nan"
    # Nonzero for a scale written in terms of a symbolic head dim (``q.size(-1) ** -0.5`` under dynamic shapes).
    scale_head_dim_power: float = 0.0
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
            if dim is not None and not 1 <= dim <= MAX_HEAD_DIM:
                reasons.append(f"{name} {dim} is outside 1..{MAX_HEAD_DIM}")
        if not math.isfinite(self.scale):
            reasons.append(f"scale {self.scale} is not finite")
        if self.gqa_group < 1:
            reasons.append(f"gqa_group {self.gqa_group} < 1")
        if not 0.0 <= self.dropout_p < 1.0:
            reasons.append(f"dropout_p {self.dropout_p} is outside [0, 1)")
        if self.empty_rows not in ("nan", "zero"):
            reasons.append(f"empty_rows {self.empty_rows!r} is neither 'nan' nor 'zero'")
        if self.causal is not None and self.causal.window is not None and self.causal.window < 1:
            reasons.append(f"sliding window {self.causal.window} < 1")
        if self.score_program:
            try:
                kinds = node_kinds(self.score_program, self.score_tensors)
            except UnsupportedSpec as e:
                reasons.append(str(e))
            else:
                if kinds[-1] != "float":
                    reasons.append(f"the score program ends in a {kinds[-1]}, not a float score")
        for i, t in enumerate(self.score_tensors):
            if t.role == "int" and t.dtype not in INT_DTYPES:
                reasons.append(f"score tensor {i} is an int tensor of dtype {t.dtype} (the kernels read "
                               f"{', '.join(INT_DTYPES)})")
        loaded = {n.value for n in self.score_program if n.op == "load"}
        if loaded != set(range(len(self.score_tensors))):
            reasons.append(f"score tensors {sorted(set(range(len(self.score_tensors))) - loaded)} are not loaded by the program")
        return reasons

    def scale_for(self, head_dim: int) -> float:
        """The score scale for q's actual head dim."""
        return self.scale * head_dim**self.scale_head_dim_power if self.scale_head_dim_power else self.scale

    # ---- keys and serialization -------------------------------------------------------------------------
    def kernel_key(self) -> "AttentionSpec":
        """The spec without the fields its kernels take as launch arguments (head dims, scale) or not at all (the
        display-only lengths and heads): two specs with the same kernel key share kernels and tuned configs. So the
        graph compiled with ``dynamic=True`` (symbolic head dim, scale ``D ** -0.5``) and the one compiled per shape
        (head dim 64, scale 0.125) run the same kernels with the same configs."""
        return dataclasses.replace(self, head_dim=None, head_dim_v=None, scale=1.0, scale_head_dim_power=0.0,
                                   q_len=None, kv_len=None, num_heads=None)

    def to_json(self) -> str:
        """The spec as the ops take it. Made once an instance (the instance is frozen): ``dataclasses.asdict`` copies
        every field, ~60 us a call on a CPU, which an eager call of an op paid each time."""
        text = self.__dict__.get("_json")
        if text is None:
            text = json.dumps(dataclasses.asdict(self), sort_keys=True)
            object.__setattr__(self, "_json", text)
        return text

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.kernel_key().to_json().encode()).hexdigest()[:16]

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def from_json(text: str) -> "AttentionSpec":
        raw = json.loads(text)
        raw["causal"] = CausalMask(**raw["causal"]) if raw["causal"] else None
        raw["score_program"] = tuple(ScoreNode(n["op"], tuple(n["args"]), n["value"]) for n in raw["score_program"])
        raw["score_tensors"] = tuple(
            ScoreTensor(role=t["role"], dtype=t["dtype"], broadcast=tuple(t["broadcast"])) for t in raw["score_tensors"]
        )
        return AttentionSpec(**raw)

    def describe(self) -> str:
        """One line for logs and dump_graph."""
        dims = [("?" if d is None else str(d)) for d in (self.head_dim, self.head_dim_v)]
        parts = [f"{self.dtype}", f"D={dims[0]}" + (f"/Dv={dims[1]}" if dims[1] != dims[0] else "")]
        if self.q_len is not None or self.kv_len is not None:
            parts.append(f"M={self.q_len if self.q_len is not None else '?'} N={self.kv_len if self.kv_len is not None else '?'}")
        power = f"*D^{self.scale_head_dim_power:.6g}" if self.scale_head_dim_power else ""
        parts.append(f"scale={self.scale:.6g}{power}")
        if self.causal:
            window = f", window={self.causal.window}" if self.causal.window is not None else ""
            parts.append(f"causal({self.causal.alignment}, diagonal={self.causal.diagonal}{window})")
        if self.score_program:
            parts.append(f"s -> {program_text(self.score_program, self.score_tensors)}")
        if self.gqa_group > 1:
            parts.append(f"gqa={self.gqa_group}")
        if self.dropout_p:
            parts.append(f"dropout={self.dropout_p:.6g}")
        if self.empty_rows == "zero":
            parts.append("empty rows 0")
        return " ".join(parts)


def dtype_name(dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: how specs and reports name a dtype."""
    return str(dtype).replace("torch.", "")
