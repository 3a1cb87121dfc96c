"""Triton source for one AttentionSpec: the template with its named insertion points filled in.

Only the spec is read here (never an FX node). Each distinct ``spec.kernel_key()`` gets one generated module,
written to the cache dir (``$FUSE_ATTN_CACHE_DIR``, else ``~/.cache/fuse_attn/kernels``) as
``<spec digest>_<source hash>.py`` -- Triton's ``@jit`` reads the source of a real file -- and imported once per
process (and per interpreter mode, since ``TRITON_INTERPRET`` changes what ``triton.jit`` builds).

How a new pointwise score mod plugs in (ALiBi, sliding windows; Tanh is a worked example): add an op to the spec
and one branch to :func:`_score_mod_lines` (its forward, on ``s`` in log2 units -- convert with ``s * LN2`` /
``* LOG2E`` around a non-linear function; keep any value the derivative needs in a ``<name>_{k}`` variable), one
to :func:`_score_mod_bwd_lines` (its derivative applied to ``ds``), or, for a pure visibility predicate, one to
:func:`_mask_mod_lines`. The kernels do not change.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
import os
import re
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from ..spec import AddTensor, AttentionSpec, FillWhere, ScaleScores, Tanh

TEMPLATE_DIR = Path(__file__).parent / "templates"
TEMPLATE_NAME = "flash_attention.py.tmpl"
# Largest finite fp32 (torch.finfo(torch.float32).max), the clamp for finite fill values in log2 units.
_FLT_MAX = 3.4028234663852886e38
_DIMS = ("z", "h", "m", "n")

_modules: dict[tuple[str, bool], ModuleType] = {}
_lock = threading.Lock()


# ---- insertion points -----------------------------------------------------------------------------------------
def _score_params(spec: AttentionSpec) -> str:
    return "".join(f"T{i}, " + "".join(f"stride_t{i}_{d}, " for d in _DIMS) for i in range(len(spec.score_tensors)))


def _bias_indices(spec: AttentionSpec) -> list[int]:
    return [i for i, t in enumerate(spec.score_tensors) if t.role == "bias"]


def _dscore_params(spec: AttentionSpec, annotate: bool) -> str:
    out = []
    for i in _bias_indices(spec):
        out.append(f"DT{i}, " + "".join(f"stride_dt{i}_{d}, " for d in _DIMS))
        out.append(f"NEED_DT{i}: tl.constexpr, " if annotate else f"NEED_DT{i}, ")
    return "".join(out)


def _tile_ptrs(prefix: str, i: int) -> str:
    """Pointers of one [BLOCK_M, BLOCK_N] tile of score tensor i (broadcast dims have stride 0)."""
    return (
        f"{prefix}{i} + off_z * stride_{prefix.lower()}{i}_z + off_h * stride_{prefix.lower()}{i}_h"
        f" + offs_m[:, None] * stride_{prefix.lower()}{i}_m + offs_n[None, :] * stride_{prefix.lower()}{i}_n"
    )


def _literal(x: float) -> str:
    if math.isnan(x):
        return 'float("nan")'
    if math.isinf(x):
        return 'float("inf")' if x > 0 else 'float("-inf")'
    return repr(float(x))


def _fill_value_log2(value: float) -> float:
    """A fill value in log2 units; finite values stay finite (finfo.min * log2 e would overflow to -inf)."""
    if not math.isfinite(value):
        return value
    return max(-_FLT_MAX, min(_FLT_MAX, value * math.log2(math.e)))


def _score_mod_lines(spec: AttentionSpec) -> list[str]:
    """SCORE_MOD: the spec's score_mods, in order, applied to ``s`` (log2 units)."""
    lines = []
    for k, op in enumerate(spec.score_mods):
        if isinstance(op, ScaleScores):
            lines.append(f"s = s * {_literal(op.factor)}  # score_mods[{k}]: ScaleScores")
        elif isinstance(op, AddTensor):
            lines.append(f"# score_mods[{k}]: AddTensor(T{op.tensor}), loaded through its broadcast strides")
            lines.append(f"bias_{k} = tl.load({_tile_ptrs('T', op.tensor)}, mask=tile_mask, other=0.0).to(tl.float32)")
            lines.append(f"s = s + _to_log2(bias_{k})")
        elif isinstance(op, FillWhere):
            cmp = "!=" if op.fill_when else "=="
            lines.append(f"# score_mods[{k}]: FillWhere(T{op.tensor} == {op.fill_when}, {op.value!r}); bool read as uint8")
            lines.append(f"fill_{k} = tl.load({_tile_ptrs('T', op.tensor)}, mask=tile_mask, other=0) {cmp} 0")
            lines.append(f"s = tl.where(fill_{k}, {_literal(_fill_value_log2(op.value))}, s)")
        elif isinstance(op, Tanh):
            lines.extend(_tanh_lines(k))
        else:  # pragma: no cover - the spec rejects unknown ops
            raise NotImplementedError(op)
    return lines or ["# (no score mods)"]


def _tanh_lines(k: int) -> list[str]:
    """Forward of Tanh on a log2-unit tile: ``tanh_{k}`` is tanh of the natural-unit score (kept for the backward)."""
    return [
        f"# score_mods[{k}]: Tanh, on natural units: tanh(x) = 2 / (1 + exp(-2x)) - 1 with exp(-2x) = exp2(-2 * s)",
        "# for x = s * LN2 (no unit round trip before the exp). Triton has no tanh that works on 3.6-3.9 and in the",
        "# interpreter alike (libdevice/tl.math paths moved between versions). Error: a few ulp of 1.0 (~2e-7",
        "# absolute, the cancellation near 0), which is what the softmax sees; exact limits: -inf -> -1 (as",
        "# torch.tanh, so -inf scores before a Tanh become finite like in eager), +inf -> 1, NaN -> NaN.",
        f"tanh_{k} = 2.0 / (1.0 + tl.math.exp2(-2.0 * s)) - 1.0",
        f"s = tanh_{k} * LOG2E",
    ]


def _dscore_accumulate_lines(spec: AttentionSpec, i: int) -> list[str]:
    """Add ``ds`` into the fp32 gradient buffer of bias i, summing first over the tile axes it broadcasts over."""
    bz, bh, bm, bn = spec.score_tensors[i].broadcast
    base = f"DT{i} + off_z * stride_dt{i}_z + off_h * stride_dt{i}_h"
    if bm and bn:
        return [f"tl.atomic_add({base}, tl.sum(tl.sum(ds, 1), 0), sem=\"relaxed\")"]
    if bm:
        return [f"tl.atomic_add({base} + offs_n * stride_dt{i}_n, tl.sum(ds, 0), mask=offs_n < N, sem=\"relaxed\")"]
    if bn:
        return [f"tl.atomic_add({base} + offs_m * stride_dt{i}_m, tl.sum(ds, 1), mask=offs_m < M, sem=\"relaxed\")"]
    return [f"tl.atomic_add({_tile_ptrs('DT', i)}, ds, mask=tile_mask, sem=\"relaxed\")"]


def _score_mod_bwd_lines(spec: AttentionSpec, with_dscore: bool) -> list[str]:
    """SCORE_MOD_BWD: ``ds`` through the score mods in reverse order (the chain rule of each op)."""
    lines = []
    for k in reversed(range(len(spec.score_mods))):
        op = spec.score_mods[k]
        if isinstance(op, ScaleScores):
            lines.append(f"ds = ds * {_literal(op.factor)}  # score_mods[{k}]: ScaleScores")
        elif isinstance(op, AddTensor):
            if with_dscore:
                lines.append(f"if NEED_DT{op.tensor}:  # score_mods[{k}]: d(T{op.tensor}) = ds")
                lines.extend("    " + line for line in _dscore_accumulate_lines(spec, op.tensor))
        elif isinstance(op, FillWhere):
            lines.append(f"ds = tl.where(fill_{k}, 0.0, ds)  # score_mods[{k}]: filled scores get no gradient")
        elif isinstance(op, Tanh):
            lines.append(f"ds = ds * (1.0 - tanh_{k} * tanh_{k})  # score_mods[{k}]: Tanh, d tanh(x)/dx = 1 - tanh(x)^2")
    return lines or ["# (no score mods)"]


def _mask_mod_lines(spec: AttentionSpec) -> list[str]:
    """MASK_MOD: extra visibility predicates (none in this spec version; causal is handled by the template)."""
    return ["# (no mask mods)"]


# ---- rendering ----------------------------------------------------------------------------------------------------
def _fill(template: str, blocks: dict[str, list[str]], inline: dict[str, str]) -> str:
    out = []
    for line in template.splitlines():
        stripped = line.strip()
        m = re.fullmatch(r"\{\{(\w+)\}\}", stripped)
        if m and m.group(1) in blocks:
            indent = line[: len(line) - len(line.lstrip())]
            out.extend(indent + b if b else "" for b in blocks[m.group(1)])
            continue
        if m and m.group(1) in inline and not inline[m.group(1)]:
            continue  # an empty parameter list: drop the line
        for name, text in inline.items():
            line = line.replace("{{" + name + "}}", text)
        out.append(line)
    text = "\n".join(out) + "\n"
    left = re.findall(r"\{\{\w+\}\}", text)
    if left:
        raise RuntimeError(f"unfilled insertion points in {TEMPLATE_NAME}: {sorted(set(left))}")
    return text


def generate_source(spec: AttentionSpec) -> str:
    """The Triton source of every kernel (forward, backward preprocess, dK/dV, dQ) for this spec."""
    key = spec.kernel_key()
    template = (TEMPLATE_DIR / TEMPLATE_NAME).read_text()
    blocks = {
        "SCORE_MOD": _score_mod_lines(key),
        "MASK_MOD": _mask_mod_lines(key),
        "SCORE_MOD_BWD": _score_mod_bwd_lines(key, with_dscore=False),
        "SCORE_MOD_BWD_AND_DSCORE": _score_mod_bwd_lines(key, with_dscore=True),
    }
    score_params = _score_params(key)
    inline = {
        "SPEC_DIGEST": key.digest,
        "SPEC_DESCRIPTION": key.describe(),
        "SCORE_PARAMS": score_params,
        "SCORE_ARGS": score_params,
        "DSCORE_PARAMS": _dscore_params(key, annotate=True),
        "DSCORE_ARGS": _dscore_params(key, annotate=False),
    }
    return _fill(template, blocks, inline)


def cache_dir() -> Path:
    env = os.environ.get("FUSE_ATTN_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "fuse_attn" / "kernels"


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def spec_digest(spec: AttentionSpec) -> str:
    """``spec.digest``, memoized (it hashes the spec's JSON; launchers ask for it on every call)."""
    return spec.digest


def load_module(spec: AttentionSpec) -> ModuleType:
    """The imported generated module for ``spec`` (cached in-process per kernel key and interpreter mode)."""
    key = (spec_digest(spec), _interpret())
    mod = _modules.get(key)
    if mod is not None:
        return mod
    with _lock:
        mod = _modules.get(key)
        if mod is not None:
            return mod
        source = generate_source(spec)
        src_hash = hashlib.sha256(source.encode()).hexdigest()[:12]
        directory = cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{spec.digest}_{src_hash}.py"
        if not path.exists() or path.read_text() != source:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{spec.digest}.", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(source)
            os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one, never half
        name = f"fuse_attn_generated_{spec.digest}_{src_hash}_{'interp' if key[1] else 'jit'}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = mod
        module_spec.loader.exec_module(mod)
        _modules[key] = mod
        return mod
