"""Launching the generated flash-attention kernels: argument binding, launch-config choice, and the launch itself.

Every launch goes through :func:`launch`, which has two ways to run a kernel:

* **traced** (a torch dispatch mode is active: Dynamo's fake propagation, AOTAutograd's functional trace of the
  ``triton_op`` in :mod:`fuse_attn.kernels.ops`, ``make_fx``): through ``torch.library.wrap_triton``, so the kernel
  and its launch become a ``triton_kernel_wrapper`` node that Inductor emits in its own output code. Everything
  computed here -- the generated module, the launch config, strides, grid, scalar arguments -- is computed once,
  while tracing, and baked into that code; the hot path is Inductor's launcher.
* **direct** (real tensors, no mode: the op called outside a compiled graph, or the CPU op under the Triton
  interpreter): ``kernel[grid](*args)`` with the arguments in the kernel's parameter order (positional binding is
  the cheaper one in Triton's launcher; Triton caches the compiled kernel per argument signature).

Launch configs (:mod:`fuse_attn.kernels.tuning`) are chosen per GPU and per shape: the in-process choice, else the
persistent cache, else tuning. Tuning never touches the caller's tensors: it runs on random real tensors with the
same (hinted) sizes, strides, dtypes and device (:func:`random_like`), with every dispatch mode switched off, so it
works the same while tracing fake tensors (a symbolic length tunes for its hint) and in eager.
"""

from __future__ import annotations

import functools
import logging
import math
import types
from typing import Callable, NamedTuple, Optional, Sequence

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from fuse_attn.kernels import plan
from fuse_attn.kernels.plan import size_hint
from fuse_attn import settings
from fuse_attn.kernels.score_program_eval import IntervalOps, Span, forward
from fuse_attn.score_program import MASKING_FILL_LIMIT, subprogram
from fuse_attn.spec import AttentionSpec
from fuse_attn.kernels import compile_workers, tuning
from fuse_attn.kernels.generated import access_analysis, codegen
from fuse_attn.kernels.positional_launch import PositionalLaunch

log = logging.getLogger("fuse_attn.kernels")


def pow2_at_least_16(n: int) -> int:
    # tl.arange needs a power of two and tl.dot an inner dim >= 16.
    return max(16, 1 << (n - 1).bit_length())


def _head_dim_parts(d: int) -> tuple[int, int]:
    """(first, tail): the column parts of head dim ``d`` in the attention kernels (the template's BLOCK_D and
    BLOCK_D_TAIL). One power of two >= 16 covering it, (that, 0); or, where two pad it less, the power of two below it
    and one >= 16 covering the rest: 80 = 64 + 16, 96 = 64 + 32, 48 = 32 + 16, 160 = 128 + 32 (112 stays 128:
    64 + 64 pads as much). A pad column costs a whole column of every matmul over that dim."""
    whole = pow2_at_least_16(d)
    first = whole // 2
    if first >= 16 and d > first:
        tail = pow2_at_least_16(d - first)
        if first + tail < whole:
            return first, tail
    return whole, 0


def _with_head_dim_parts(common: dict) -> dict:
    """``common`` for the attention kernels: their BLOCK_D / BLOCK_DV are a head dim's first part, BLOCK_D_TAIL /
    BLOCK_DV_TAIL its second (0: none). Elsewhere (the tuner's candidates, decoding) BLOCK_D / BLOCK_DV
    stay the head dims padded to one power of two."""
    (block_d, block_d_tail), (block_dv, block_dv_tail) = _head_dim_parts(common["D"]), _head_dim_parts(common["DV"])
    return dict(common, BLOCK_D=block_d, BLOCK_D_TAIL=block_d_tail, BLOCK_DV=block_dv, BLOCK_DV_TAIL=block_dv_tail)


def triton_cdiv(a, b: int):
    """ceil(a / b); symbolic when ``a`` is (a grid over a symbolic length stays symbolic)."""
    return (a + b - 1) // b


# ---- the launch ------------------------------------------------------------------------------------------------------
def _tracing() -> bool:
    """Whether a launch now must be recorded (wrap_triton) rather than run: a dispatch mode (fake, functional,
    proxy) is active and the op's eager backend has not turned wrap_triton off."""
    from torch._library.triton import is_wrap_triton_enabled
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return is_wrap_triton_enabled() and _get_current_dispatch_mode() is not None


# Inductor's output code defines a user kernel once per Python function (`id(kernel.fn)`) and non-tensor arguments,
# and launches every later use of that definition with the warps and stages of the first one (the cache key of
# `define_user_defined_triton_kernel` in torch/_inductor/codegen/wrapper.py leaves the launch config out, torch
# 2.11-2.13). A dynamic graph's length buckets launch one kernel with configs that can differ in warps or stages
# only, and another bucket's warps and stages can run a kernel 6x slower than its own tuned config (the dK/dV kernel
# above length 1024 with 4 warps and 1 stage, on an H100). So each (kernel, warps, stages) traces as its own
# JITFunction of its own copy of the Python function (same code, globals and source file): one definition per config.
_KERNEL_COPIES: dict = {}


def _kernel_of_config(kernel, cfg: Optional[tuning.KernelConfig]):
    from triton.runtime.jit import JITFunction

    if cfg is None or not isinstance(kernel, JITFunction):  # the interpreter's kernels are never traced by Inductor
        return kernel
    key = (kernel, cfg.num_warps, cfg.num_stages)
    copy = _KERNEL_COPIES.get(key)
    if copy is None:
        fn = kernel.fn
        fn_copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        # the annotations mark the constexpr parameters
        for attribute in ("__qualname__", "__module__", "__doc__", "__annotations__", "__kwdefaults__"):
            setattr(fn_copy, attribute, getattr(fn, attribute))
        copy = _KERNEL_COPIES[key] = JITFunction(
            fn_copy, do_not_specialize=kernel.do_not_specialize,
            do_not_specialize_on_alignment=kernel.do_not_specialize_on_alignment, debug=kernel.debug,
            noinline=kernel.noinline)
    return copy


def launch(kernel, grid: tuple, args: dict, cfg: Optional[tuning.KernelConfig] = None, warmup: bool = False) -> None:
    """Run ``kernel`` on ``grid`` with ``args`` (every parameter, constexprs included) and cfg's warps and stages:
    recorded for Inductor while traced (``wrap_triton``), else launched through the kernel's
    :class:`PositionalLaunch` (a specialization it ran before: its compiled kernel's positional run). ``warmup``:
    compile it only (the tuner compiles candidates concurrently before timing them), as every launch inside
    :func:`compile_workers.compile_launches_only`."""
    options = {} if cfg is None else dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if warmup or compile_workers.launches_compile_only():
        if not compile_workers.collect(kernel, grid, args, options):
            kernel.warmup(**args, **options, grid=grid)
    elif _tracing():
        torch.library.wrap_triton(access_analysis.remember(_kernel_of_config(kernel, cfg)))[grid](**args, **options)
    else:
        _positional(kernel)(grid, *[args[name] for name in kernel.arg_names], **options)


# Each kernel launched eagerly, with its launcher: a kernel launched again with a specialization it ran runs its
# compiled kernel positionally (the Gluon ops' classification of a packed-documents mask makes two launches a call).
_POSITIONAL: dict = {}


def _positional(kernel) -> PositionalLaunch:
    launcher = _POSITIONAL.get(id(kernel))
    if launcher is None:  # (the launcher holds the kernel: its id names no other while it is here)
        launcher = _POSITIONAL[id(kernel)] = PositionalLaunch(kernel)
    return launcher


# ---- arguments -------------------------------------------------------------------------------------------------------
def broadcast_strides(t: Tensor, read=lambda n: n) -> list:
    """Strides with 0 for size-1 dims: the kernels index a broadcast tensor without a dense copy. ``read``: how a size
    or stride is taken (as it is, symbolic ones too; :func:`hint` for a choice made without a guard)."""
    return [0 if read(size) == 1 else read(stride) for size, stride in zip(t.shape, t.stride())]


def batch_rows_innermost(spec) -> bool:
    """Whether the kernels' programs take a head's batch rows side by side (the template's ``_block_batch_head``, the
    Gluon kernels' ``_batch_and_head``): a score tensor read per (query, key) pair that is the same for every batch
    row, whose tiles those programs then read from L2."""
    return any(t.broadcast[0] and not t.broadcast[2] and not t.broadcast[3] for t in spec.score_tensors)


def _precision(dtype: torch.dtype) -> str:
    # fp32 inputs: full-precision dots unless the user opted into TF32 (as eager matmul does).
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 and not settings.interpreting():
        return "tf32"
    return "ieee"


def score_kwargs(score_tensors: Sequence[Tensor], only: Optional[Sequence[int]] = None) -> dict:
    """Each score tensor ``T<i>`` and its broadcast strides ``stride_t<i>_<z|h|m|n>``; ``only``: of those indices."""
    kw = {}
    for i, t in enumerate(score_tensors):
        if only is not None and i not in only:
            continue
        # bool masks as they are: Triton loads a bool pointer as bytes (a traced bool -> uint8 view is what Inductor
        # could not lower: "torch.bool is not supported by torch.iinfo", torch 2.11)
        kw[f"T{i}"] = t
        for d, stride in zip("zhmn", broadcast_strides(t)):
            kw[f"stride_t{i}_{d}"] = stride
    return kw


def stride_args(prefix: str, t: Tensor) -> dict:
    return {f"stride_{prefix}{d}": s for d, s in zip("zhmd" if prefix in ("q", "o", "do", "dq") else "zhnd", t.stride())}


def common_kernel_args(q, k, v, spec) -> dict:
    Z, H, M, D = q.shape
    N, DV = k.shape[2], v.shape[3]
    D, DV = int(D), int(DV)  # constexprs: a symbolic head dim specializes (a guard), lengths stay symbolic
    padding = plan.key_padding(spec)
    return dict(
        Z=Z, H=H, M=M, N=N,
        BATCH_INNER=batch_rows_innermost(spec),
        # the causal band's offset: the spec's, or that of a band written into the program with a key padding vector
        causal_offset=(spec.causal.offset(M, N) if spec.causal else
                       padding.band if padding is not None and padding.band is not None else 0),
        qk_scale=spec.scale_for(D) * math.log2(math.e),
        D=D, DV=DV, BLOCK_D=pow2_at_least_16(D), BLOCK_DV=pow2_at_least_16(DV),
        GQA_GROUP=spec.gqa_group, CAUSAL=spec.causal is not None,
        WINDOW=spec.causal.window if spec.causal is not None and spec.causal.window is not None else 0,
        PRECISION=_precision(q.dtype), INTERPRETED=settings.interpreting(),
        # qk_scale and dropout_p are constexprs: both are fixed by the spec (and head dim), which the generated module is
        # already specific to; as run-time floats, Inductor would pass them as fp64.
        DROPOUT=spec.dropout_p > 0, dropout_p=spec.dropout_p,
        ZERO_EMPTY_ROWS=spec.empty_rows == "zero",
    )


def kernel_grid(blocks, Z, heads) -> tuple:
    """The kernels' grid: one dimension over (blocks, batch rows, heads), which the template's _block_batch_head
    reads in the order its BATCH_INNER says."""
    return (blocks * Z * heads,)


# Programs of one config resident on an SM at once, by its warps: the 8-warp configs the tuner picks on an H100 hold
# one program per SM (shared memory), the 4-warp ones two. What the launch order is sized by (_head_group).
_PROGRAMS_PER_SM = {4: 2, 8: 1}


def _head_group(q: Tensor, blocks, cfg: tuning.KernelConfig):
    """The template's ``head_group`` (_block_batch_head): how many (batch row, head) pairs run their blocks side by
    side -- about one wave of programs. A sweep of 1, 4 and 8 pairs over 21 tuned kernels on an H100 (132 SMs) put
    this rule within 2% of the best on 19: 4 where 32 blocks of an 8-warp config fill the SMs, 8 where 4-warp
    configs or 16 blocks do. Off it: the D64 causal forward (8 warps, but two programs may fit an SM) runs 4.5%
    faster at 8 pairs than at the 4 picked here; the D256 dK/dV kernel (64 blocks of 8 warps) gets 2, outside the
    sweep (4 and 8 tie there)."""
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 132  # (an H100's)
    wave = sms * _PROGRAMS_PER_SM.get(cfg.num_warps, 1)
    return torch.sym_max(1, (wave + blocks // 2) // blocks)


def _seed_arg(dropout_seed: Optional[Tensor], placeholder: Tensor) -> Tensor:
    # Without dropout the kernels never read Seed (DROPOUT is a constexpr); any pointer fills the parameter.
    return placeholder if dropout_seed is None else dropout_seed


def key_range_args(spec: AttentionSpec, score_tensors: Sequence[Tensor], Z, N, placeholder: Tensor,
                    full_tiles: bool = True) -> dict:
    """``KeyRange``, ``KEY_RANGE``, ``KEY_BAND`` and ``KEY_FULL`` of the forward, dQ and dK/dV kernels. With a key
    padding vector (:func:`fuse_attn.kernels.plan.key_padding`): int32 ``[Z, 4]``, per batch row the range of keys
    to visit and the run of keys proven visible, computed on the device from the vector -- traced into the graph
    under torch.compile, where Inductor fuses it into one small reduction -- so the kernels skip the key blocks
    outside the first and run the program of visible keys (``plan.visible_spec``, ``KEY_FULL``) without loading the
    vector on the tiles inside the second.

    The range: -inf kinds: first visible key .. one past the last (0, 0 for a row with none); the "masking" kind: the
    same, but from key 0 under a causal mask, and every key for a row with none visible. With a band in the program
    (``KEY_BAND`` 1 for the -inf kind, 2 for the masking kind) the range is the visible keys' for both, and the
    kernels narrow it per query block (the band's end; the masking kind only where every row of the block keeps a
    visible key). The proven run: first visible key .. one past the last where every key between them is visible (no
    hole) and, for a bias, exactly 0 there (what the visible program takes it to be); else empty, and every tile runs
    the whole program. ``full_tiles``: False where the vector needs a gradient (it has one in the full tiles too).
    Without a padding vector any tensor fills the parameter (not read)."""
    padding = plan.key_padding(spec)
    if padding is None:
        return dict(KeyRange=placeholder, KEY_RANGE=False, KEY_BAND=0, KEY_FULL=False)
    keys = score_tensors[padding.tensor][:, 0, 0, :]  # [Z or 1, N]
    visible = {"false": lambda: keys, "true": lambda: ~keys, "-inf": lambda: keys != float("-inf"),
               "fill": lambda: keys > MASKING_FILL_LIMIT}[padding.hidden]()
    visible = visible.to(torch.int32)
    positions = torch.arange(1, N + 1, device=keys.device, dtype=torch.int32)
    end = (visible * positions).amax(-1)  # 0 for a row with none
    first = torch.minimum(torch.argmax(visible, -1).to(torch.int32), end)  # argmax: the first maximum; [0, 0) if none
    exact = visible if keys.dtype == torch.bool else (keys == 0).to(torch.int32)  # where the visible program holds
    proven = exact.sum(-1, dtype=torch.int32) == end - first
    full_first, full_end = torch.where(proven, first, 0), torch.where(proven, end, 0)
    band = 0 if padding.band is None else 1 if padding.kind == "-inf" else 2
    if padding.kind == "masking" and not band:
        none_visible = end == 0
        first = torch.zeros_like(first) if spec.causal is not None else torch.where(none_visible, 0, first)
        end = torch.where(none_visible, positions[-1], end)  # N, not as a scalar operand (it may be symbolic)
    key_range = torch.stack([first, end, full_first, full_end], -1).expand(Z, 4).contiguous()
    return dict(KeyRange=key_range, KEY_RANGE=True, KEY_BAND=band,
                KEY_FULL=full_tiles and plan.visible_spec(spec) is not None)


# tile classes of a mask summary, in the order the block lists hold them
_FULL, _PARTIAL, _EMPTY = 0, 1, 2


class _MaskGranules(NamedTuple):
    """A summarized mask (:func:`fuse_attn.kernels.plan.mask_blocks`) read once: per query row and per granule of
    ``granule`` consecutive keys, whether the mask hides every entry (``hidden``) and whether it changes none
    (``unchanged``: a bias of 0, a bool mask all visible), ``[Zm, M, ceil(N / granule)]`` (``Zm``: the mask's batch,
    1 or Z), and per query row whether it keeps a visible key (``keeps_visible``, ``[Zm, M]``). Each is a proof:
    False where it is not known (a predicate's bounds). Keys past N count as hidden and changed. Every kernel of one
    op call (forward; dQ and dK/dV) derives its tile classes from these small tensors -- its key blocks are whole
    granules -- so an op call reads the mask once. A NaN in a bias is neither hidden nor unchanged, so its tiles stay
    partial (and eager's NaN comes through)."""
    hidden: Tensor
    unchanged: Tensor
    keeps_visible: Tensor
    granule: int


def mask_granules(spec: AttentionSpec, score_tensors: Sequence[Tensor], M, N, granule: int,
                  row_granule: int = 1) -> Optional[_MaskGranules]:
    """The granules of ``spec``'s summarized mask (None where it has none or ``FUSE_ATTN_MASK_BLOCKS=0``), computed
    on the device -- traced into the graph under torch.compile, like the key range. (A predicate's are the reference
    of :func:`predicate_block_args`, which the launchers call instead: with ``row_granule`` its tiles' rows, the
    bounds it proves.)"""
    summarized = plan.mask_blocks(spec) if settings.mask_blocks_enabled() else None
    if summarized is None:
        return None
    if summarized.predicate is not None:
        return _predicate_granules(spec, summarized, score_tensors, M, N, granule, row_granule)
    mask = score_tensors[summarized.tensor][:, 0]  # [Zm, M, N]
    if summarized.hidden == "fill":
        hidden, unchanged = mask <= MASKING_FILL_LIMIT, mask == 0
    else:
        hidden = mask if summarized.hidden == "true" else ~mask
        unchanged = ~hidden
    granules = triton_cdiv(N, granule)
    pad = (0, granules * granule - N)
    shape = (mask.shape[0], mask.shape[1], granules, granule)
    hidden = torch.nn.functional.pad(hidden, pad, value=True).view(shape).all(3)
    return _MaskGranules(hidden, torch.nn.functional.pad(unchanged, pad, value=False).view(shape).all(3),
                         ~hidden.all(-1), granule)


def _predicate_granules(spec: AttentionSpec, summarized: plan.MaskBlocks, score_tensors: Sequence[Tensor], M, N,
                        granule: int, row_granule: int = 1) -> _MaskGranules:
    """The plain-PyTorch reference of :func:`predicate_block_args`' kernel (what the launchers call): the granules of
    a predicate of integer vectors (:attr:`plan.MaskBlocks.predicate`), from its bounds over each granule's keys and
    each ``row_granule`` rows (``IntervalOps``; rows past M read as row M - 1 and keys past N as key N - 1, so a
    granule's bounds are its real rows' and keys', and a granule reaching past N is never unchanged), given to each
    of its rows. A row keeps a visible key where the predicate keeps its own position as a key (packed documents'
    tokens see themselves; each row a point) or a whole granule. No N x N tensor is made: the largest is
    ``[Zm, M, ceil(N / granule)]``."""
    program = subprogram(spec.score_program, summarized.predicate)
    device = score_tensors[0].device
    granules = triton_cdiv(N, granule)
    first = torch.arange(granules, device=device) * granule
    keys = torch.arange(granules * granule, device=device).clamp(max=N - 1).view(granules, granule)
    row_granules = triton_cdiv(M, row_granule)
    row_first = torch.arange(row_granules, device=device) * row_granule
    row_spans = torch.arange(row_granules * row_granule, device=device).clamp(max=M - 1).view(row_granules, row_granule)
    rows = torch.arange(M, device=device)
    own = rows.clamp(max=N - 1)  # each row's own position as a key (a row past the last key has none: excluded)
    per_granule: dict[int, Span] = {}
    on_own_key: dict[int, Span] = {}
    for i in plan.predicate_loads(spec):
        values = score_tensors[i][:, 0].to(torch.int64)  # [Zt, M or 1, N or 1]
        if spec.score_tensors[i].broadcast[3] and spec.score_tensors[i].broadcast[2]:  # one for all
            per_granule[i] = on_own_key[i] = Span(values, values)
        elif spec.score_tensors[i].broadcast[3]:  # one value per row
            read = values[:, row_spans, 0]  # [Zt, row granules, row granule]
            per_granule[i] = Span(read.amin(-1)[..., None], read.amax(-1)[..., None])
            on_own_key[i] = Span(values, values)
        else:
            read = values[:, 0, keys]  # [Zt, granules, granule]
            per_granule[i] = Span(read.amin(-1)[:, None], read.amax(-1)[:, None])
            at_own = values[:, 0, own][..., None]
            on_own_key[i] = Span(at_own, at_own)
    query = Span(rows[:, None], rows[:, None])
    row_granule_rows = Span(row_first[:, None], (row_first + row_granule - 1).clamp(max=M - 1)[:, None])
    granule_keys = Span(first, (first + granule - 1).clamp(max=N - 1))
    bounds = forward(program, IntervalOps({"q_idx": row_granule_rows, "kv_idx": granule_keys}, per_granule, device))[-1]
    # each row granule's bounds given to its rows (a bound the rows do not change stays broadcast)
    bounds = type(bounds)(*(torch.repeat_interleave(t, row_granule, dim=-2)[..., :M, :]
                            if t.dim() >= 2 and t.shape[-2] > 1 else t for t in bounds))
    at_own_key = forward(program, IntervalOps({"q_idx": query, "kv_idx": Span(own[:, None], own[:, None])},
                                              on_own_key, device))[-1]
    hides_where_false = summarized.hidden == "false"  # ("true": it hides where it is true)
    may_hide = "may_be_false" if hides_where_false else "may_be_true"
    may_keep = "may_be_true" if hides_where_false else "may_be_false"
    shape = (max(span.lo.shape[0] for span in per_granule.values()), M, granules)
    hidden = (~getattr(bounds, may_keep)).expand(shape)
    unchanged = (~getattr(bounds, may_hide) & (first + granule <= N)).expand(shape)
    keeps_own_key = ~getattr(at_own_key, may_hide)[..., 0] & (rows < N)
    return _MaskGranules(hidden, unchanged, (keeps_own_key | unchanged.any(-1)).expand(shape[:2]), granule)


def mask_block_args(granules: Optional[_MaskGranules], M, N, rows: int, cols: int, key_major: bool,
                     placeholder: Tensor) -> dict:
    """``BlockList``, ``BlockCounts``, their batch strides and ``MASK_BLOCKS`` of a kernel whose tiles are ``rows``
    queries by ``cols`` keys (a multiple of the granule), from a mask's granules (None: no block lists). Each tile is
    full (nothing hidden, nothing changed), empty (every entry hidden, and every row of its query block keeping a
    visible key) or partial; then, per query block (key block when ``key_major``, the dK/dV kernel's loop), int32
    lists of the other axis's blocks, full ones first, then partial ones, then the skipped empty ones, each class in
    ascending order, ``[Zm, R, C]``; and ``[Zm, R, 2]`` counts (stride 0 on ``Zm`` when 1): the first run of
    consecutive full blocks, which the kernels visit as a range of blocks (the next tile's address is then no load:
    read from the list per tile, it makes the forward 1.6x slower at 3 pipeline stages on an H100), and the entries
    after it that are not empty -- the other full blocks, run with the predicate like the partial ones. A tile with
    positions past M or N is never full (its predicate must run) and is empty when its real part is."""
    if granules is None:
        return dict(BlockList=placeholder, BlockCounts=placeholder, stride_blist_z=0, stride_bcount_z=0,
                    MASK_BLOCKS=False)
    assert cols % granules.granule == 0, (cols, granules.granule)
    per_tile = cols // granules.granule
    hidden, unchanged = granules.hidden, granules.unchanged
    row_blocks, col_blocks = triton_cdiv(M, rows), triton_cdiv(N, cols)
    pad = (0, col_blocks * per_tile - hidden.shape[2], 0, row_blocks * rows - M)
    keeps_visible = torch.nn.functional.pad(granules.keeps_visible, pad[2:], value=True)  # [Zm, rows padded]
    tiles = (hidden.shape[0], row_blocks, rows, col_blocks, per_tile)
    empty = torch.nn.functional.pad(hidden, pad, value=True).view(tiles).all(4).all(2)
    empty &= keeps_visible.view(tiles[:3]).all(2)[:, :, None]
    full = torch.nn.functional.pad(unchanged, pad, value=False).view(tiles).all(4).all(2)
    classes = torch.where(full, _FULL, torch.where(empty, _EMPTY, _PARTIAL)).to(torch.int32)
    if key_major:
        classes = classes.transpose(1, 2)
    lists = torch.argsort(classes, dim=-1, stable=True).to(torch.int32).contiguous()
    n_full, n_partial = (classes == _FULL).sum(-1), (classes == _PARTIAL).sum(-1)
    # the full entries ascend without repeats, so entry p is in the first run iff it is the run's start + p
    step = torch.arange(lists.shape[-1], device=lists.device, dtype=torch.int32)
    n_run = ((lists - step == lists[..., :1]) & (step < n_full[..., None])).sum(-1)
    counts = torch.stack([n_run, n_full - n_run + n_partial], -1).to(torch.int32).contiguous()
    return listed_tile_args(lists, counts, batched=hidden.shape[0] != 1)


def listed_tile_args(lists: Tensor, counts: Tensor, batched: bool) -> dict:
    """The kernels' arguments of block lists and their counts (``MASK_BLOCKS``): their batch strides 0 where one row
    serves the whole batch (``batched`` False)."""
    return dict(BlockList=lists, BlockCounts=counts, stride_blist_z=lists.stride(0) if batched else 0,
                stride_bcount_z=counts.stride(0) if batched else 0, MASK_BLOCKS=True)


# Tiles of the other axis the tile-classes kernel classifies a step (CHUNK spans of keys, or of rows where KEY_MAJOR,
# against one), the steps a program takes, its warps, and the blocks of rows and of keys a program of the summaries
# takes. A sweep on an H200 (16 packed documents a row, N 8k and 32k; tiles 128x64, 128x128 query-major and 64x128,
# 128x64 key-major; the two launches' GPU time in a CUDA graph; CHUNK 8, 32 x steps 1, 2, 4 x 1, 4 warps, then
# summaries of 1, 4, 16 blocks a program): 32 tiles, 4 steps, one warp and one block ran fastest or within 10% of it
# in every case, 12.8-14.5 us at 8k and 15.2-18.0 us at 32k (4 blocks: 16-19 and 18-22; 16 blocks: 21-24 and 24-28),
# where the classification that read every row and key of each tile took 15.2-36.1 and 59.8-185.7 us.
_CLASS_CHUNK = 32
_CLASS_STEPS = 4
_CLASS_WARPS = 1
# the summaries' warps: as many as give each thread at most this many of a block's values of a vector
_SUMMARY_VALUES_PER_THREAD = 16
_LIST_CHUNK = 256
_SUMMARY_BLOCKS = 1


def predicate_block_args(spec: AttentionSpec, score_tensors: Sequence[Tensor], M, N, rows: int, cols: int,
                         key_major: bool) -> dict:
    """:func:`mask_block_args` of a predicate of integer vectors (``plan.mask_blocks(spec).predicate``) for tiles of
    ``rows`` x ``cols``, from the generated tile-classes kernels (templates/tile_classes.py.tmpl: the vectors' block
    summaries, then the tiles, two launches): each tile's rows one span and its keys another, and a query block's tiles
    skipped as empty only where each of its rows keeps its own key, or (query-major) where the block has a full tile.
    Its plain-PyTorch reference, ``mask_block_args(_predicate_granules(..., granule=cols, row_granule=rows), ...)``,
    gives the same lists wherever every row keeps its own key (packed documents: a token sees itself); where one does
    not, the reference proves each row visible from any whole granule it keeps, this kernel only from a full tile of its
    block, and only query-major: it leaves the other query blocks' hidden tiles partial (read and masked: the same
    results)."""
    return TileClasses(spec, score_tensors, M, N, rows, cols, key_major)(score_tensors)


class TileClasses:
    """:func:`predicate_block_args` of one call signature -- a spec, its vectors' shapes, strides and dtypes, the
    lengths, the tile and its order -- with what every call repeats worked out once: the generated module, the
    grids, the sizes, the launch configs. A call allocates the lists and the kernels' scratch and makes the two
    launches (eagerly, each a compiled kernel's positional run once its specialization ran: :func:`launch`). The Gluon
    ops keep one in the call of each signature they meet (:class:`.hopper.forward.ForwardCall`,
    :class:`.hopper.backward.BackwardCall`)."""

    def __init__(self, spec: AttentionSpec, score_tensors: Sequence[Tensor], M, N, rows: int, cols: int,
                 key_major: bool):
        self.module = codegen.load_module(spec, codegen.TILE_CLASSES_TEMPLATE_NAME)
        self.loads = plan.predicate_loads(spec)
        batched = [i for i in self.loads if not spec.score_tensors[i].broadcast[0]]  # the vectors of a batch row each
        self.batched = bool(batched)
        batch = score_tensors[batched[0]].shape[0] if batched else 1
        rows_blocks, cols_blocks = triton_cdiv(M, rows), triton_cdiv(N, cols)
        outer, inner = (cols_blocks, rows_blocks) if key_major else (rows_blocks, cols_blocks)
        self.lists_shape, self.counts_shape = (batch, outer, inner), (batch, outer, 2)
        self.arrivals_shape = (batch, outer)
        blocks = torch.sym_max(rows_blocks, cols_blocks)  # (of either axis: the summaries' width and programs)
        # (the kernels' scratch too: a slot per vector along rows or keys, and one of the query blocks' SeesKey)
        self.summaries_shape = (batch, codegen.tile_summary_slots(spec), 2 * blocks)
        self.sizes = dict(M=M, N=N, ROWS=rows, COLS=cols)
        self.summaries_grid = (triton_cdiv(blocks, _SUMMARY_BLOCKS), batch)
        self.classes_grid = (outer, batch, triton_cdiv(inner, _CLASS_CHUNK * _CLASS_STEPS))
        # (the vectors' strides are the signature's: only their tensors change between calls)
        strides = {name: value for name, value in score_kwargs(score_tensors, only=self.loads).items()
                   if name.startswith("stride_")}
        self.constants = dict(outer_blocks=outer, BLOCKS=_SUMMARY_BLOCKS, STEPS=_CLASS_STEPS, CHUNK=_CLASS_CHUNK,
                              LIST_CHUNK=_LIST_CHUNK, KEY_MAJOR=key_major, **strides)
        # (a config is what names a kernel's copy when Inductor traces it)
        self.summaries_config = tuning.KernelConfig(rows, cols, num_warps=max(1, _SUMMARY_BLOCKS * max(rows, cols) // (
            32 * _SUMMARY_VALUES_PER_THREAD)), num_stages=1)
        self.classes_config = tuning.KernelConfig(rows, cols, num_warps=_CLASS_WARPS, num_stages=1)

    def __call__(self, score_tensors: Sequence[Tensor]) -> dict:
        device = score_tensors[self.loads[0]].device
        lists = torch.empty(self.lists_shape, dtype=torch.int32, device=device)
        counts = torch.empty(self.counts_shape, dtype=torch.int32, device=device)
        classes = torch.empty(self.lists_shape, dtype=torch.int8, device=device)  # (the kernels' scratch)
        arrivals = torch.empty(self.arrivals_shape, dtype=torch.int32, device=device)  # (their scratch too)
        summaries = torch.empty(self.summaries_shape, dtype=torch.int64, device=device)
        args = dict(Lists=lists, Counts=counts, Classes=classes, Arrivals=arrivals, Summaries=summaries,
                    stride_lists_z=lists.stride(0), stride_counts_z=counts.stride(0),
                    stride_summaries_z=summaries.stride(0), stride_summaries_slot=summaries.stride(1), **self.sizes,
                    **self.constants, **{f"T{i}": score_tensors[i] for i in self.loads})
        for kernel, grid, config in ((self.module._tile_summaries, self.summaries_grid, self.summaries_config),
                                     (self.module._tile_classes, self.classes_grid, self.classes_config)):
            launch(kernel, grid, {name: args[name] for name in kernel.arg_names}, config)
        return listed_tile_args(lists, counts, self.batched)


class _MaskBlocks:
    """The block lists of one set of tensors' summarized mask, each computed once per granule and tile shape: an op
    call computes what its kernels use, and the tuner, which launches many configs on one set of tuning tensors,
    computes them once, outside the timed launches (the summary's eager torch ops take more host time than a short
    kernel's GPU time: inside the timed launches, every candidate would time alike). ``summarize``: False for none
    (a mask that needs a gradient has one in its full tiles too). ``predicate_kernel``: a predicate's lists from
    :func:`predicate_block_args` (True: an op call's) or from its PyTorch reference (False: the tuner's, whose
    candidates' many tile shapes would each compile the tile-classes kernel, 0.7-0.8 s apiece for sm90 on a CPU,
    for lists that need not be the real ones' -- its random ids leave every tile partial either way)."""

    def __init__(self, spec: AttentionSpec, score_tensors: Sequence[Tensor], M, N, placeholder: Tensor,
                 summarize: bool = True, predicate_kernel: bool = True):
        self.spec, self.score_tensors, self.M, self.N, self.placeholder = spec, score_tensors, M, N, placeholder
        self.summarize, self.predicate_kernel = summarize, predicate_kernel
        self._granules: dict[int, Optional[_MaskGranules]] = {}
        self._args: dict[tuple, dict] = {}

    def args(self, granule: int, rows: int, cols: int, key_major: bool) -> dict:
        """``mask_block_args`` of tiles of ``rows`` x ``cols`` from the mask's granules of ``granule`` keys; of a
        predicate of integer vectors, from :func:`predicate_block_args` (no granules)."""
        key = (granule, rows, cols, key_major)
        if key in self._args:
            return self._args[key]
        summarized = plan.mask_blocks(self.spec) if self.summarize and settings.mask_blocks_enabled() else None
        if summarized is not None and summarized.predicate is not None and self.predicate_kernel:
            self._args[key] = predicate_block_args(self.spec, self.score_tensors, self.M, self.N, rows, cols,
                                                   key_major)
        else:
            if granule not in self._granules:
                self._granules[granule] = (mask_granules(self.spec, self.score_tensors, self.M, self.N, granule)
                                           if self.summarize else None)
            self._args[key] = mask_block_args(self._granules[granule], self.M, self.N, rows, cols, key_major,
                                               self.placeholder)
        return self._args[key]


def _blocks(cfg: tuning.KernelConfig) -> dict:
    return dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n)


# ---- launch configs --------------------------------------------------------------------------------------------------
def _size_expr(x):
    """A size's sympy expression (an int for a static size): what identifies one symbolic length across tensors."""
    return x.node.expr if isinstance(x, torch.SymInt) else int(x)


def random_like(t: Optional[Tensor], lengths: Optional[dict] = None) -> Optional[Tensor]:
    """A real tensor with ``t``'s (hinted) sizes, strides, dtype and device, filled with random values (normal
    floats, mostly-true masks, any integers: a seed, document ids): what the tuner times candidates on. Zeros would
    time faster than real data on tensor cores, and a mask of all False would skip nothing the real one skips.

    ``lengths`` ({symbolic length's expression: int}): the dims of that length get that size instead of their hint
    (a length bucket's tuning inputs), laid out densely in ``t``'s order of strides, broadcast dims kept broadcast."""
    if t is None:
        return None
    size = [size_hint(s) for s in t.shape]
    stride = [size_hint(s) for s in t.stride()]
    if lengths:
        resized = [lengths.get(_size_expr(s), n) for s, n in zip(t.shape, size)]
        if resized != size:
            order = sorted(range(t.dim()), key=lambda d: -stride[d])  # outermost first (a stable sort)
            stored = [resized[d] if stride[d] else 1 for d in order]
            dense = _random_values(math.prod(stored), t).view(stored).permute([order.index(d) for d in range(t.dim())])
            return dense.expand(resized)
    extent = 1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(size) else 0
    return _random_values(extent, t).as_strided(size, stride)


def _random_values(count: int, t: Tensor) -> Tensor:
    g = tuning_generator(t.device)
    if t.dtype == torch.bool:
        return torch.rand(count, device=t.device, generator=g) < 0.9
    if t.dtype == torch.int64:
        return torch.randint(2**62, (count,), dtype=torch.int64, device=t.device, generator=g)
    if not t.dtype.is_floating_point:  # an "int" score tensor: the kernels' work does not depend on its values
        return torch.randint(torch.iinfo(t.dtype).max, (count,), dtype=t.dtype, device=t.device, generator=g)
    return torch.randn(count, dtype=t.dtype, device=t.device, generator=g)


_TUNING_GENERATORS: dict[torch.device, torch.Generator] = {}


def tuning_generator(device) -> torch.Generator:
    """The random stream of the tuner's inputs on ``device``, its own: drawing them from torch's default generator
    would move the user's stream, so that a model's dropout masks and initial weights after its first compile
    would depend on whether the tuning cache was warm. Seeded alike in every process."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    g = _TUNING_GENERATORS.get(device)
    if g is None:
        g = _TUNING_GENERATORS[device] = torch.Generator(device=device).manual_seed(0)
    return g


# The keys each batch row of the tuner's key padding vector keeps, as fractions of N cycling over the rows: a batch
# padded to its longest sequence (tools/bench_variants.py's padding rows have the same lengths)
PADDING_TUNING_FRACTIONS = (1, 3 / 4, 1 / 2, 1 / 3)


def realistic_tuning_masks(spec: AttentionSpec, tuning_tensors: list) -> None:
    """Overwrite the tuner's random copy of a mask that decides which tiles run -- a summarized mask
    (:func:`fuse_attn.kernels.plan.mask_blocks`), a key padding vector (:func:`fuse_attn.kernels.plan.key_padding`)
    -- with one as models give them, in its convention (0 / finfo.min or -inf, or bool): the summarized mask causal
    (bottom-right aligned), the padding vector a batch padded on the right (:data:`PADDING_TUNING_FRACTIONS`).
    Random values leave every tile partial and no run of visible keys, while the masks that reach the kernels --
    Hugging Face's causal and padding masks -- have mostly full and empty tiles: the configs and implementations are
    timed on the loops those run."""
    summarized, padding = plan.mask_blocks(spec), plan.key_padding(spec)
    if summarized is not None and summarized.predicate is None:
        t, hidden = tuning_tensors[summarized.tensor], summarized.hidden
        M, N = t.shape[-2:]
        keep = torch.ones(M, N, dtype=torch.bool, device=t.device).tril(N - M)
    elif summarized is None and padding is not None:
        t, hidden = tuning_tensors[padding.tensor], padding.hidden
        Z, N = (t.shape[0] if t.stride(0) else 1), t.shape[-1]  # (a vector the batch shares: one row stored)
        lengths = torch.tensor([max(1, round(N * PADDING_TUNING_FRACTIONS[z % len(PADDING_TUNING_FRACTIONS)]))
                                for z in range(Z)], device=t.device)
        keep = (torch.arange(N, device=t.device)[None, :] < lengths[:, None])[:, None, None, :]
    else:
        return  # (a predicate of integer vectors is timed on the random vectors: its tiles partial)
    if hidden in ("fill", "-inf"):
        fill = torch.finfo(t.dtype).min if hidden == "fill" else float("-inf")
        pattern = torch.zeros(keep.shape, dtype=t.dtype, device=t.device).masked_fill(~keep, fill)
    else:
        pattern = keep if hidden == "false" else ~keep
    write_stored(t, pattern)


def write_stored(t: Tensor, values: Tensor) -> None:
    """Write ``values`` (broadcastable to ``t``, of size 1 along its stride-0 dims) into a tuning tensor ``t``:
    each stored element once, through the first index of each broadcast dim (copying into the broadcast view itself
    would write one element many times, which torch refuses)."""
    stored = t
    for dim, stride in enumerate(t.stride()):
        if stride == 0:
            stored = stored.narrow(dim, 0, 1)
    stored.copy_(values.expand(stored.shape))


class RealInputs:
    """Context: every dispatch mode off (fake, functional, proxy), no autograd -- so that the tuner makes real
    tensors and launches kernels directly, also in the middle of a trace."""

    def __enter__(self):
        from torch.utils._python_dispatch import _disable_current_modes

        self._modes = _disable_current_modes()
        self._modes.__enter__()
        self._grad = torch.no_grad()
        self._grad.__enter__()

    def __exit__(self, *exc):
        self._grad.__exit__(*exc)
        return self._modes.__exit__(*exc)


def choose_kernel_config(kind: str, q: Tensor, kernel_id: str, common: dict, candidates: Callable[[], list],
                         bind: Callable[[], Callable[[tuning.KernelConfig, bool], None]], m=None,
                         n=None) -> tuning.KernelConfig:
    """The config of one kernel: the interpreter's; else the in-process choice for its tuning key (lengths ``m``
    and ``n``, by default M and N by their hints); else (stored or tuned) from :func:`fuse_attn.kernels.tuning.tune`.
    ``bind()`` is called only when timing may be needed, with every mode off: it builds random inputs and returns
    ``run(cfg, warmup)``, which launches (or only compiles) the kernel on them."""
    if not _tuned_on(q):
        return tuning.INTERPRETER_CONFIGS[kind]
    key = _kernel_tuning_key(kind, q, kernel_id, common, m, n)
    cfg = tuning.cached(key)  # hot path in eager: no candidate list, no device queries, no tensors
    if cfg is not None:
        return cfg
    if compile_workers.launches_compile_only():  # (nothing to time: no inputs)
        return tuning.tune(key, candidates(), launch=lambda cfg: None)
    with RealInputs():
        run = bind()
        return tuning.tune(key, candidates(), lambda c: run(c, False), None, lambda c: run(c, True))


def _tuned_on(q: Tensor) -> bool:
    """Whether launch configs are tuned for ``q``'s kernels: compiled kernels on a GPU (the interpreter takes fixed
    ones)."""
    return not settings.interpreting() and q.is_cuda


def _kernel_tuning_key(kind: str, q: Tensor, kernel_id: str, common: dict, m=None, n=None) -> tuning.TuningKey:
    return tuning.tuning_key(kind, q.device, kernel_id, q.dtype, common["D"], common["DV"],
                             size_hint(common["M"] if m is None else m), size_hint(common["N"] if n is None else n))


def _candidates(fn, q: Tensor, common: dict) -> Callable[[], list]:
    return lambda: fn(common["BLOCK_D"], common["BLOCK_DV"], q.element_size(), common["CAUSAL"],
                      tuning.shared_memory(q.device))


# ---- symbolic lengths: a launch config per length bucket, chosen by the generated code ----------------------------
# The bucket tops a symbolic length's configs are tuned at: powers of two, as the tuning key's buckets
# (tuning.length_bucket). From 128: at or below it a row is one key tile of most candidates and a call is host-bound
# (B1 H32 N256 D128, causal: 7 us of GPU time per forward on an H100), so shorter lengths take 128's config. Up to
# 32768, the longest length the benchmarks time; longer lengths take its config.
_LENGTH_BUCKET_TOPS = tuple(1 << e for e in range(7, 16))
# The tuning inputs of one bucket top may take at most this fraction of the GPU's free memory (the model's own tensors
# are alive while it compiles); the tops beyond that take the last tunable top's config. The estimate counts each input
# three times: the backward's tuning adds the gradients and the forward's outputs.
_TUNING_MEMORY_FRACTION = 0.25


class _LengthBuckets:
    """The symbolic length of a traced call -- the key length N, else the query length M -- and the choice of a launch
    config (or a set of them) per length bucket. While tracing, :meth:`run` tunes the choice at each bucket top and
    records a chain of ``cond`` operators on the length (``if N <= 128: ... else: if N <= 256: ...`` in Inductor's
    output code), each branch launching the kernels with its bucket's configs; buckets whose choices agree share a
    branch, and one choice for every bucket records no condition at all. Without a symbolic length (static shapes,
    eager calls) it launches with the one choice for the call's lengths.

    Where cond cannot serve (operands that share memory, as q, k, v split from one projection), the graph keeps one
    choice for every length, that of the traced lengths."""

    def __init__(self, q: Tensor, k: Tensor, backward: bool = False):
        self.backward = backward
        self.length_of = None  # (q, k) -> the bucketed length, re-read from each branch's own operands
        if _tracing() and q.is_cuda:
            for length_of in (lambda q, k: k.shape[2], lambda q, k: q.shape[2]):
                if isinstance(length_of(q, k), torch.SymInt):
                    self.length_of = length_of
                    break

    def run(self, choose_at: Callable, launch_with: Callable, operands: tuple, shapes: list) -> tuple:
        """``launch_with(choice, *operands)`` -> a tuple of new contiguous tensors of ``shapes``, ``choice`` being
        ``choose_at(lengths)`` for the call's length bucket; ``operands`` start with q and k. ``lengths``: None for
        the call's own (hinted) lengths, else {length's expression: bucket top}, the sizes that ``random_like``
        gives the tuning inputs."""
        if self.length_of is None:
            return launch_with(choose_at(None), *operands)
        length = self.length_of(*operands[:2])
        buckets = []  # [(top, choice)]: the lengths above the previous top and up to this one run choice
        for top in self._tunable_tops(length, operands):
            choice = choose_at({_size_expr(length): top})
            if buckets and buckets[-1][1] == choice:
                buckets[-1] = (top, choice)
            else:
                buckets.append((top, choice))
        if not buckets:  # no top is possible or fits: the hinted lengths' choice for every length
            return launch_with(choose_at(None), *operands)
        if len(buckets) == 1:
            return launch_with(buckets[0][1], *operands)
        # cond takes a flat tuple of tensors: the operands' leaves without the Nones (a dropout seed may be None)
        leaves, tree = pytree.tree_flatten(operands)
        tensors = tuple(leaf for leaf in leaves if leaf is not None)
        try:
            flat_outputs = self._chain(buckets, launch_with, (tree, [leaf is None for leaf in leaves]), tensors)
        except RuntimeError as error:
            # cond refuses operands that share memory (q, k and v split from one projection, as GPT-2's c_attn); it
            # checks its branches before recording anything, so the trace goes on with one choice for every length
            if "aliasing" not in str(error):
                raise
            log.info("fuse_attn: one launch config for every length of this dynamic graph: %s", error)
            return launch_with(choose_at(None), *operands)
        return tuple(flat.view(shape) for flat, shape in zip(flat_outputs, shapes))

    def _chain(self, buckets, launch_with, structure, tensors: tuple) -> tuple:
        """The outputs of the launches for the buckets' lengths, each flattened to 1-D: cond wants outputs whose
        strides are products of sizes, which a contiguous tensor's symbolic strides need not be written as (for a
        query length that may be 0 they hold ``Max(1, M)``)."""
        (top, choice), longer = buckets[0], buckets[1:]
        tree, none_at = structure
        rest = iter(tensors)
        operands = pytree.tree_unflatten([None if none else next(rest) for none in none_at], tree)
        if not longer:
            return tuple(out.reshape(-1) for out in launch_with(choice, *operands))
        # The cond operator itself, not torch.cond: that one first compiles the call with Dynamo, which cannot trace the
        # launchers; the operator is what Dynamo records, and every trace mode (fake, functional, proxy) handles it.
        # Each branch reads the length from its own operands: a traced branch cannot use the outer trace's symbols.
        from torch._higher_order_ops.cond import cond_op

        return cond_op(self._shorter_than(self.length_of(*operands[:2]), top),
                       lambda *ts: self._chain(buckets[:1], launch_with, structure, ts),
                       lambda *ts: self._chain(longer, launch_with, structure, ts), tensors)

    def _shorter_than(self, length, top: int):
        """Whether ``length <= top`` -- in the backward, traced as a node of the backward graph. AOTAutograd's
        partitioner would otherwise compute the condition (it depends on the forward's inputs only) in the forward
        graph and pass the SymBool to the backward graph: a graph input that torch 2.11's Inductor cannot take
        ("Unsupported inductor graph input type: LessThan"). The partitioner keeps a node tagged
        "must_be_in_backward" there; the backward graph then takes the length itself, a SymInt, and computes the
        condition."""
        # The backward writes it `length < top + 1`: as the same expression as the forward's condition, CSE would make
        # them one node of the joint graph, which the forward needs.
        condition = length < top + 1 if self.backward else length <= top
        if self.backward:
            from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot

            mode = get_proxy_mode()
            traced = get_proxy_slot(condition, mode.tracer, None) if mode is not None else None
            if traced is not None:  # a thunk that records the node on first use (the cond below)
                traced.force().node.meta["partitioner_tag"] = "must_be_in_backward"
        return condition

    def _tunable_tops(self, length, operands) -> list[int]:
        """The bucket tops that the length can reach (by what the shape environment knows of its range) and whose
        tuning inputs fit in memory."""
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        tops = []
        free = torch.cuda.mem_get_info(operands[0].device)[0]
        lengths = {}
        for top in _LENGTH_BUCKET_TOPS:
            if statically_known_true(length <= top // 2):  # the length's range (e.g. mark_dynamic's max) ends below
                break
            lengths[_size_expr(length)] = top
            inputs = [t for t in pytree.tree_leaves(operands) if isinstance(t, Tensor)]
            if 3 * sum(_bytes_at(t, lengths) for t in inputs) > _TUNING_MEMORY_FRACTION * free:
                break
            if not statically_known_true(length > top):
                tops.append(top)
        return tops


def _bytes_at(t: Tensor, lengths: dict) -> int:
    """Bytes of ``random_like(t, lengths)``'s storage."""
    sizes = [lengths.get(_size_expr(s), size_hint(s)) if size_hint(st) else 1 for s, st in zip(t.shape, t.stride())]
    return math.prod(sizes) * t.element_size()


def _tuning_lengths(common: dict, lengths: Optional[dict]) -> dict:
    """``choose_kernel_config``'s m and n for ``lengths`` (see :meth:`_LengthBuckets.run`)."""
    if not lengths:
        return {}
    return dict(m=lengths.get(_size_expr(common["M"]), size_hint(common["M"])),
                n=lengths.get(_size_expr(common["N"]), size_hint(common["N"])))


# ---- forward ---------------------------------------------------------------------------------------------------------
def _launch_forward(mod, cfg, common, q, k, v, score_tensors, dropout_seed, out, lse, key_range,
                    mask_blocks: _MaskBlocks, warmup=False) -> None:
    """``common``, ``key_range`` and ``mask_blocks``: ``common_kernel_args``, ``key_range_args`` and the ``_MaskBlocks`` of
    these tensors (made once by the caller: a tuner launches many times on one set)."""
    Z, H, M, _ = q.shape
    args = dict(Q=q, K=k, V=v, Out=out, Lse=lse, Seed=_seed_arg(dropout_seed, lse), **score_kwargs(score_tensors),
                **key_range, **mask_blocks.args(cfg.block_n, cfg.block_m, cfg.block_n, False),
                **stride_args("q", q), **stride_args("k", k), **stride_args("v", v), **stride_args("o", out),
                **_with_head_dim_parts(common), head_group=_head_group(q, triton_cdiv(M, cfg.block_m), cfg), **_blocks(cfg))
    launch(mod._attn_fwd, kernel_grid(triton_cdiv(M, cfg.block_m), Z, H), args, cfg, warmup)


def empty_outputs(q: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    Z, H, M, _ = q.shape
    return (torch.empty((Z, H, M, v.shape[3]), dtype=q.dtype, device=q.device),
            torch.empty((Z, H, M), dtype=torch.float32, device=q.device))


def _forward_config(mod, common, q, k, v, score_tensors, spec, dropout_seed, lengths=None) -> tuning.KernelConfig:
    """``lengths``: see :meth:`_LengthBuckets.run`."""
    return choose_kernel_config("fwd", q, mod.KERNEL_ID, common, _candidates(tuning.forward_candidates, q, common),
                                _forward_binder(mod, q, k, v, score_tensors, spec, dropout_seed, lengths),
                                **_tuning_lengths(common, lengths))


def _forward_binder(mod, q, k, v, score_tensors, spec, dropout_seed, lengths):
    """The forward's ``bind`` (:func:`choose_kernel_config`)."""
    def bind():
        rq, rk, rv, seed, *rs = (random_like(t, lengths) for t in (q, k, v, dropout_seed, *score_tensors))
        realistic_tuning_masks(spec, rs)
        out, lse = empty_outputs(rq, rv)
        real, key_range = common_kernel_args(rq, rk, rv, spec), key_range_args(spec, rs, rq.shape[0], rk.shape[2], lse)
        mask_blocks = _MaskBlocks(spec, rs, rq.shape[2], rk.shape[2], lse, predicate_kernel=False)
        return lambda cfg, warmup: _launch_forward(mod, cfg, real, rq, rk, rv, rs, seed, out, lse, key_range,
                                                   mask_blocks, warmup)

    return bind


def triton_forward(q, k, v, score_tensors, spec: AttentionSpec, dropout_seed=None) -> tuple[Tensor, Tensor]:
    """(out, lse) of validated inputs (N > 0) from the generated forward kernel."""
    mod = codegen.load_module(spec)
    common = common_kernel_args(q, k, v, spec)

    def config_at(lengths):
        return _forward_config(mod, common, q, k, v, score_tensors, spec, dropout_seed, lengths)

    def launch_with(cfg, q, k, v, dropout_seed, score_tensors):
        out, lse = empty_outputs(q, v)
        _launch_forward(mod, cfg, common_kernel_args(q, k, v, spec), q, k, v, score_tensors, dropout_seed, out, lse,
                        key_range_args(spec, score_tensors, q.shape[0], k.shape[2], lse),
                        _MaskBlocks(spec, score_tensors, q.shape[2], k.shape[2], lse))
        return out, lse

    Z, H, M, _ = q.shape
    return _LengthBuckets(q, k).run(config_at, launch_with, (q, k, v, dropout_seed, list(score_tensors)),
                                    [(Z, H, M, v.shape[3]), (Z, H, M)])


# ---- backward --------------------------------------------------------------------------------------------------------
def _uses_exact_delta(q: Tensor) -> bool:
    # fp32 inputs (and every dtype under FUSE_ATTN_EXACT_DELTA=1): the dQ kernel recomputes each row's softmax
    # statistics (row max, 1 / row sum) and delta = rowsum(P * dP) itself (one more pass over K and V)
    # and runs first, so dS rows sum to 0 up to rounding and one-key rows get dS = 0 exactly, as in eager; fp16 /
    # bf16 take FlashAttention's rowsum(dO * O) and the forward's lse, whose difference from it is below their
    # precision except for nearly one-hot rows, where O's rounding to the input dtype shows (docs/testing.md, known
    # differences).
    return q.dtype == torch.float32 or settings.exact_delta_forced()


_MIN_ROW_BLOCK = 16


class _BackwardBuffers:
    """The backward's outputs and scratch for one set of inputs: dq, dk, dv, delta, the row statistics of the
    exact delta, the fp32 gradient buffers of the bias tensors that need one (accumulated with atomics), and the
    kernels' key range arguments and mask block lists (computed once: the tuner launches many times on one set)."""

    def __init__(self, q, k, v, lse, score_tensors, spec, needs_grad, exact_delta: bool, predicate_kernel: bool = True):
        self.dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        self.dk = torch.empty(k.shape, dtype=k.dtype, device=q.device)
        self.dv = torch.empty(v.shape, dtype=v.dtype, device=q.device)
        self.delta = torch.empty(lse.shape, dtype=torch.float32, device=q.device)
        # one int32 flag per block of forward rows whose lse is not finite, written by the backward's first kernel
        # for the dK/dV kernel; sized for blocks of 16 rows, the smallest row block of any kernel (tl.dot's minimum)
        self.lse_flags = torch.empty(lse.shape[0] * lse.shape[1] * triton_cdiv(lse.shape[2], _MIN_ROW_BLOCK),
                                     dtype=torch.int32, device=q.device)
        # the row statistics the dQ kernel stores for the dK/dV kernel (log2-unit row max, 1 / row sum): of every
        # row with the exact delta, else of the rows whose lse is imprecise (the template's IMPRECISE_LSE)
        self.row_max, self.row_scale = torch.empty_like(lse), torch.empty_like(lse)
        self.dbias = {i: torch.zeros(t.shape, dtype=torch.float32, device=q.device)
                      for i, (t, st, need) in enumerate(zip(score_tensors, spec.score_tensors, needs_grad))
                      if st.role == "bias" and need}
        # a mask that needs a gradient has one in its full tiles too: no visible program, no summary then
        padding = plan.key_padding(spec)
        self.key_range = key_range_args(spec, score_tensors, q.shape[0], k.shape[2], lse,
                                         full_tiles=padding is None or padding.tensor not in self.dbias)
        summarized = plan.mask_blocks(spec)
        self.mask_blocks = _MaskBlocks(spec, score_tensors, q.shape[2], k.shape[2], lse,
                                       summarize=summarized is None or summarized.tensor not in self.dbias,
                                       predicate_kernel=predicate_kernel)


def _launch_backward(mod, cfgs: dict, common, dout, q, k, v, score_tensors, out, lse, spec, dropout_seed,
                     bufs: _BackwardBuffers, exact_delta: bool, only: Optional[str] = None, warmup: bool = False,
                     dlse: Optional[Tensor] = None):
    """The backward's launches in order: dQ first (it writes delta, the lse flags and, with the exact delta, the row
    statistics that dK/dV reads), then dK/dV. ``only``: launch just that step ("bwd_dq" or "bwd_dkdv"; the
    tuner's). ``common``: ``common_kernel_args`` of these q, k, v. ``dlse``: the gradient of the forward's lse (None: zero),
    taken off delta by the dQ kernel, which writes delta."""
    Z, H, M, _ = q.shape
    N = k.shape[2]
    base = dict(Q=q, K=k, V=v, DO=dout, Lse=lse, RowMax=bufs.row_max, RowScale=bufs.row_scale, Delta=bufs.delta,
                LseFlags=bufs.lse_flags,
                EXACT_DELTA=exact_delta, Seed=_seed_arg(dropout_seed, lse), **score_kwargs(score_tensors),
                **bufs.key_range,
                **stride_args("q", q), **stride_args("k", k), **stride_args("v", v), **stride_args("do", dout),
                sm_scale=spec.scale_for(common["D"]), **_with_head_dim_parts(common))
    # d(bias) buffers: fp32, the bias's shape, accumulated with atomics (stride 0 on its broadcast dims), by the dQ
    # kernel with the exact delta (from the P and dP of delta) and by the dK/dV kernel otherwise (faster there).
    # Only the launch that accumulates gets the buffer; the others get the bias itself in its place, never written:
    # Inductor takes a buffer that two user kernels receive as written by both, and zeroes a copy of it for the
    # second (a learned [1, 16, 4096, 4096] bias: 0.32 ms a fill on an H100).
    def dscore_args(accumulates: bool) -> dict:
        args = {}
        for i, (t, st) in enumerate(zip(score_tensors, spec.score_tensors)):
            if st.role != "bias":
                continue
            buf = bufs.dbias.get(i) if accumulates else None
            args[f"DT{i}"] = t if buf is None else buf
            for d, stride in zip("zhmn", (0, 0, 0, 0) if buf is None else broadcast_strides(buf)):
                args[f"stride_dt{i}_{d}"] = stride
            args[f"NEED_DT{i}"] = buf is not None
        return args

    lse_grad = dict(DLse=lse if dlse is None else dlse, HAS_DLSE=dlse is not None)

    order = [only] if only is not None else ["bwd_dq", "bwd_dkdv"]
    # the mask read once for both kernels, at a granule that divides both key blocks
    granule = math.gcd(*(cfgs[step].block_n for step in order))

    def dq():
        cfg = cfgs["bwd_dq"]
        blocks = bufs.mask_blocks.args(granule, cfg.block_m, cfg.block_n, False)
        launch(mod._attn_bwd_dq, kernel_grid(triton_cdiv(M, cfg.block_m), Z, H),
               dict(base, DQ=bufs.dq, Out=out, **stride_args("o", out), **lse_grad, **dscore_args(exact_delta), **blocks,
                    **stride_args("dq", bufs.dq), head_group=_head_group(q, triton_cdiv(M, cfg.block_m), cfg),
                    **_blocks(cfg)), cfg, warmup)

    def dkdv():
        cfg = cfgs["bwd_dkdv"]
        flag_rows = cfgs["bwd_dq"].block_m  # the lse flags' rows per block: the dQ kernel's (launched first)
        blocks = bufs.mask_blocks.args(granule, cfg.block_m, cfg.block_n, True)
        key_blocks = triton_cdiv(N, cfg.block_n)
        grid = kernel_grid(key_blocks, Z, H // spec.gqa_group)
        args = dict(base, DK=bufs.dk, DVout=bufs.dv, flag_rows=flag_rows, **blocks,
                    **{f"stride_dk{d}": s for d, s in zip("zhnd", bufs.dk.stride())},
                    **{f"stride_dv{d}": s for d, s in zip("zhnd", bufs.dv.stride())},
                    head_group=_head_group(q, key_blocks, cfg), **_blocks(cfg))
        # one launch computing both, or dV and then dK (the bias gradients, from dS, with dK)
        parts = [(True, True)] if cfg.dkdv_launches == 1 else [(False, True), (True, False)]
        for compute_dk, compute_dv in parts:
            dscore = dscore_args(compute_dk and not exact_delta)
            launch(mod._attn_bwd_dkdv, grid, dict(args, **dscore, COMPUTE_DK=compute_dk, COMPUTE_DV=compute_dv), cfg,
                   warmup)

    steps = {"bwd_dq": dq, "bwd_dkdv": dkdv}
    for step in order:
        steps[step]()


def _backward_configs(mod, kernel_id, common, dout, q, k, v, score_tensors, spec, needs_grad, dropout_seed,
                      exact_delta, lengths=None) -> dict:
    """``lengths``: see :meth:`_LengthBuckets.run`."""
    tuned = {}

    def random_inputs():
        # real forward outputs of random inputs: P, delta and the row statistics then look like a model's
        return _backward_inputs(q, k, v, dout, score_tensors, spec, needs_grad, dropout_seed, exact_delta, lengths,
                                run_forward=lambda rq, rk, rv, rs, seed: triton_forward(rq, rk, rv, rs, spec, seed))

    def bind(kind):
        def bound():
            args = random_inputs()
            if kind == "bwd_dkdv":  # delta, the lse flags (and row statistics) from dQ, once
                _launch_backward(mod, tuned, *args, only="bwd_dq")
            return lambda cfg, warmup: _launch_backward(mod, {**tuned, kind: cfg}, *args, only=kind, warmup=warmup)
        return bound

    at_lengths = _tuning_lengths(common, lengths)
    # (dK/dV, tuned last, chosen: both are -- the eager hot path then builds no candidate list)
    if _tuned_on(q) and tuning.cached(_kernel_tuning_key("bwd_dkdv", q, kernel_id, common, **at_lengths)) is None:
        with RealInputs():
            tuning.compile_together(_backward_kernels(mod, kernel_id, common, dout, q, k, v, score_tensors, spec,
                                                      needs_grad, dropout_seed, exact_delta, lengths))
    # dQ is tuned first: the dK/dV kernel's inputs come from it
    for kind, candidates in (("bwd_dq", tuning.dq_candidates), ("bwd_dkdv", tuning.dkdv_candidates)):
        tuned[kind] = choose_kernel_config(kind, q, kernel_id, common, _candidates(candidates, q, common), bind(kind),
                                           **at_lengths)
    return tuned


def _backward_inputs(q, k, v, dout, score_tensors, spec, needs_grad, dropout_seed, exact_delta, lengths,
                     run_forward=None) -> tuple:
    """Random inputs of the backward's kernels (after ``_launch_backward``'s ``mod`` and ``cfgs``), out and lse from
    ``run_forward(q, k, v, score_tensors, dropout_seed)`` on them, or, with none, left empty (for compiles only)."""
    rq, rk, rv, rdo, seed, *rs = (random_like(t, lengths) for t in (q, k, v, dout, dropout_seed, *score_tensors))
    realistic_tuning_masks(spec, rs)
    out, lse = empty_outputs(rq, rv) if run_forward is None else run_forward(rq, rk, rv, rs, seed)
    bufs = _BackwardBuffers(rq, rk, rv, lse, rs, spec, needs_grad, exact_delta, predicate_kernel=False)
    return (common_kernel_args(rq, rk, rv, spec), rdo, rq, rk, rv, rs, out, lse, spec, seed, bufs, exact_delta)


def _backward_kernels(mod, kernel_id, common, dout, q, k, v, score_tensors, spec, needs_grad, dropout_seed,
                      exact_delta, lengths=None) -> list:
    """The backward's dQ and dK/dV kernels as :func:`tuning.compile_together` takes them, compiled on one set of
    inputs (made once, freed when both are compiled): the dK/dV binary does not depend on dQ's config, which the
    dK/dV candidates are compiled with a stand-in for."""
    inputs = functools.cache(lambda: _backward_inputs(q, k, v, dout, score_tensors, spec, needs_grad, dropout_seed,
                                                      exact_delta, lengths))
    at_lengths = _tuning_lengths(common, lengths)
    dq_list = _candidates(tuning.dq_candidates, q, common)()

    def compile_only(kind):
        def bind():
            configs = {"bwd_dq": dq_list[0]}
            return lambda cfg: _launch_backward(mod, {**configs, kind: cfg}, *inputs(), only=kind, warmup=True)
        return bind

    return [(_kernel_tuning_key("bwd_dq", q, kernel_id, common, **at_lengths), dq_list, compile_only("bwd_dq")),
            (_kernel_tuning_key("bwd_dkdv", q, kernel_id, common, **at_lengths),
             _candidates(tuning.dkdv_candidates, q, common)(), compile_only("bwd_dkdv"))]


def template_tunings(q: Tensor, k: Tensor, v: Tensor, score_tensors: Sequence[Tensor], spec: AttentionSpec,
                     score_grads: Sequence[bool], training: bool) -> list:
    """The generated kernels' tunings this attention will run -- the forward's, and the backward's when ``training``
    -- as :func:`tuning.compile_ahead` takes them (none where this device tunes none). ``q``, ``k``, ``v`` and the
    score tensors: the fused op's operands (fake while compiling), of static lengths (a symbolic length tunes a
    config per length bucket)."""
    if not _tuned_on(q):
        return []
    mod = codegen.load_module(spec)
    common = common_kernel_args(q, k, v, spec)
    # (a seed's value is no part of a compile: any int64 scalar stands in for the one drawn per call)
    seed = q.new_empty((), dtype=torch.int64) if spec.dropout_p else None
    forward_bind = _forward_binder(mod, q, k, v, score_tensors, spec, seed, None)
    kernels = [(_kernel_tuning_key("fwd", q, mod.KERNEL_ID, common), _candidates(tuning.forward_candidates, q, common)(),
                lambda: functools.partial(forward_bind(), warmup=True))]
    if training:
        exact_delta = _uses_exact_delta(q)
        kernel_id = _backward_kernel_id(mod, q, exact_delta)
        dout = q.new_empty((*q.shape[:3], v.shape[3]))
        kernels += _backward_kernels(mod, kernel_id, common, dout, q, k, v, score_tensors, spec, list(score_grads),
                                     seed, exact_delta)
    return kernels


def compile_candidates_ahead(q: Tensor, k: Tensor, v: Tensor, score_tensors: Sequence[Tensor], spec: AttentionSpec,
                             score_grads: Sequence[bool], training: bool, timed_first: Optional[tuple] = None) -> None:
    """Start compiling the candidate configs of :func:`template_tunings` in one batch elsewhere (Inductor's compile
    workers, or processes forked for it), without waiting (:func:`tuning.compile_ahead`): the forward's tuning then
    waits for its own candidates only, and the backward's compile while the forward is timed and AOTAutograd traces
    the joint graph, up to the backward's first call (on an H200, BERT's 23 backward candidates took 5.1 s on the
    workers when the trace reached them). ``timed_first``: a tuning timed before them (the implementation choice's,
    as ``compile_ahead`` takes it), whose candidates go first in the batch, every job submitted at once: while its
    slowest candidates (the Gluon kernels') compile, the CPUs they leave compile the template's configs."""
    kernels = ([timed_first] if timed_first else []) + template_tunings(q, k, v, score_tensors, spec, score_grads,
                                                                         training)
    with RealInputs():
        tuning.compile_ahead(kernels, staged=timed_first is None)


def _backward_kernel_id(mod, q: Tensor, exact_delta: bool) -> str:
    # a forced exact delta makes other dQ and dK/dV kernels for fp16 / bf16: tuned apart from the default ones
    return mod.KERNEL_ID + ("+exact_delta" if exact_delta and q.dtype != torch.float32 else "")


def triton_backward(dout, q, k, v, score_tensors, out, lse, spec: AttentionSpec, needs_grad, dropout_seed=None,
                    dlse: Optional[Tensor] = None):
    """(dq, dk, dv, [gradient of each bias tensor that needs one]) of validated inputs (N > 0); ``dlse``: the
    gradient of the lse output, or None."""
    mod = codegen.load_module(spec)
    exact_delta = _uses_exact_delta(q)
    kernel_id = _backward_kernel_id(mod, q, exact_delta)
    common = common_kernel_args(q, k, v, spec)

    def configs_at(lengths):
        return _backward_configs(mod, kernel_id, common, dout, q, k, v, score_tensors, spec, needs_grad, dropout_seed,
                                 exact_delta, lengths)

    def launch_with(cfgs, q, k, dout, v, score_tensors, out, lse, dropout_seed, dlse):
        bufs = _BackwardBuffers(q, k, v, lse, score_tensors, spec, needs_grad, exact_delta)
        _launch_backward(mod, cfgs, common_kernel_args(q, k, v, spec), dout, q, k, v, score_tensors, out, lse, spec, dropout_seed,
                         bufs, exact_delta, dlse=dlse)
        return (bufs.dq, bufs.dk, bufs.dv, *(bufs.dbias[i].to(score_tensors[i].dtype) for i in sorted(bufs.dbias)))

    dq, dk, dv, *dscores = _LengthBuckets(q, k, backward=True).run(
        configs_at, launch_with, (q, k, dout, v, list(score_tensors), out, lse, dropout_seed, dlse),
        [q.shape, k.shape, v.shape, *(t.shape for t, need in zip(score_tensors, needs_grad) if need)])
    return dq, dk, dv, list(dscores)
