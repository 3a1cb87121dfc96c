"""The tiles the Gluon kernels visit where a key padding vector hides keys (:func:`fuse_attn.kernels.plan.key_padding`:
Hugging Face's padded batches, BERT's ``s + bias[Z, 1, 1, N]`` and a decoder's padding and causal band written as one
mask), listed per call on the device in one launch, in the tile-classes kernel's format
(:class:`fuse_attn.kernels.generated.launch.TileClasses`), so that the kernels' listed loops (``MASK_BLOCKS``) run
them: the full tiles plain, the rest through the spec's program (which loads the vector and applies the band).

Which tiles: the generated template's rule (``launch.key_range_args`` and the template's ``_clamp_to_key_range``),
tile by tile. Per batch row, the visible keys span [first, end) (0, 0: none), and [full_first, full_end) is that span
where no key inside it is hidden and, for a bias, every value there is exactly 0 (else empty). A query block of rows
[r0, r1) visits the keys

* without a band: [first, end); of the "masking" kind (hidden at a finite fill), every key where the batch row has
  no visible key (each row is then uniform over all of them, as eager's softmax makes it);
* with the band ``kv_idx <= q_idx``: [first, min(end, r1)); of the "masking" kind only where every row of the block
  keeps a visible key (end > 0 and r0 >= first), else every key (a row that keeps none is uniform over all of them,
  the band's hidden keys too).

Outside those keys every probability is exactly 0. A query block that sees no key (of the "-inf" kind: a batch
row with none visible, or every row of the block before the first visible one under the band) still lists its first
tile, partial: the forward runs a block's first tile unconditionally, and the program hides its every key there (the
rows' output is 0). Full, run plain: the key tiles wholly inside [full_first, full_end) and, with the band, wholly at
or below the block's first row. The backward lists, per key tile, the query
blocks that visit it (full where the tile is full for the block) from the same rule, so both visit the same tiles.
:func:`reference_key_range_tiles` is the rule in PyTorch, what the tests check the kernel against."""

from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from fuse_attn.kernels import plan, tuning
from fuse_attn.kernels.generated.launch import key_range_args, launch, listed_tile_args
from fuse_attn.kernels.hopper.mask_tiles import store_listed_row
from fuse_attn.score_program import MASKING_FILL_LIMIT
from fuse_attn.spec import AttentionSpec

# A key padding vector's hiding value, as the kernel's HIDDEN constexpr (plan.KeyPadding.hidden)
_HIDDEN_CODES = {"false": 0, "true": 1, "-inf": 2, "fill": 3}
_VECTOR_CHUNK = 1024  # keys of the vector a program reduces at once (every program reads its batch row's vector)


@triton.jit
def _visible_keys(Vector, stride_vn, N, HIDDEN: tl.constexpr, FILL_LIMIT: tl.constexpr, CHUNK: tl.constexpr):
    """The batch row's visible keys [first, end) (0, 0 for none) and the run of them proven exact [full_first,
    full_end): no hidden key inside [first, end) and (a bias) exactly 0 at each key, else (0, 0)."""
    first = tl.full([], 0, tl.int32) + N
    end = tl.full([], 0, tl.int32)
    exact_keys = tl.full([], 0, tl.int32)
    for n0 in range(0, N, CHUNK):
        offs = n0 + tl.arange(0, CHUNK)
        inside = offs < N
        # (compared in fp32, which holds a bool, fp16 or bf16 value exactly: Triton's interpreter compared bf16 values
        # with the fill limit wrongly)
        x = tl.load(Vector + offs.to(tl.int64) * stride_vn, mask=inside, other=0).to(tl.float32)
        if HIDDEN == 0:
            visible = x != 0
        elif HIDDEN == 1:
            visible = x == 0
        elif HIDDEN == 2:
            visible = x != float("-inf")
        else:
            visible = x > FILL_LIMIT
        visible = visible & inside
        if HIDDEN < 2:
            exact = visible
        else:
            exact = (x == 0) & inside
        first = tl.minimum(first, tl.min(tl.where(visible, offs, N), 0))
        end = tl.maximum(end, tl.max(tl.where(visible, offs + 1, 0), 0))
        exact_keys += tl.sum(exact.to(tl.int32), 0)
    first = tl.minimum(first, end)
    proven = exact_keys == end - first
    return first, end, tl.where(proven, first, 0), tl.where(proven, end, 0)


@triton.jit
def _block_tiles(r0, M, N, first, end, full_first, full_end, ROWS: tl.constexpr, COLS: tl.constexpr,
                 BAND: tl.constexpr, MASKING: tl.constexpr):
    """The key tiles [t_lo, t_hi) that the query block of rows [r0, r0 + ROWS) visits, and those of them run plain,
    [f_lo, f_hi) (the module's rule; r0 a scalar or a vector of blocks)."""
    r1 = tl.minimum(r0 + ROWS, M)
    if BAND:
        if MASKING:
            narrowed = (end > 0) & (r0 >= first)
        else:
            narrowed = r0 >= 0
        lo = tl.where(narrowed, first, 0)
        hi = tl.where(narrowed, tl.minimum(end, r1), N)
        full_hi = tl.minimum(full_end, r0 + 1)
    else:
        lo = first
        hi = end
        if MASKING:
            lo = tl.where(end > 0, lo, 0)
            hi = tl.where(end > 0, hi, N)
        full_hi = full_end
    t_lo = lo // COLS
    t_hi = tl.where(hi > lo, (hi + COLS - 1) // COLS, t_lo)
    f_lo = tl.minimum(tl.maximum((full_first + COLS - 1) // COLS, t_lo), t_hi)
    f_hi = tl.minimum(tl.maximum(full_hi // COLS, f_lo), t_hi)
    return t_lo, t_hi, f_lo, f_hi


@triton.jit(do_not_specialize=["M", "N", "stride_vz", "stride_vn", "stride_lists_z", "stride_counts_z"])
def _key_range_tiles(Vector, stride_vz, stride_vn, Lists, Counts, stride_lists_z, stride_counts_z, M, N,
                     ROWS: tl.constexpr, COLS: tl.constexpr, INNER: tl.constexpr, HIDDEN: tl.constexpr,
                     FILL_LIMIT: tl.constexpr, BAND: tl.constexpr, MASKING: tl.constexpr, KEY_MAJOR: tl.constexpr,
                     CHUNK: tl.constexpr):
    # one program an outer block (a query block of ROWS rows; KEY_MAJOR: a key tile of COLS keys) of a batch row:
    # its row of Lists (the inner blocks it visits, full ones first, then the rest, then those it skips, each
    # ascending) and of Counts (its full ones, a run; how many more it visits); INNER: a power of two at least the
    # inner blocks
    outer = tl.program_id(0)
    off_z = tl.program_id(1).to(tl.int64)
    first, end, full_first, full_end = _visible_keys(Vector + off_z * stride_vz, stride_vn, N, HIDDEN, FILL_LIMIT,
                                                     CHUNK)
    inner = tl.arange(0, INNER)
    if KEY_MAJOR:
        inner_blocks = (M + ROWS - 1) // ROWS
        t_lo, t_hi, f_lo, f_hi = _block_tiles(inner * ROWS, M, N, first, end, full_first, full_end, ROWS, COLS, BAND,
                                              MASKING)
        # (the outer tile as a vector: without a band the bounds are scalars, and Triton's interpreter makes a scalar
        # bool & a vector one int32, which a store's mask refuses)
        tile = outer + inner * 0
        visited = (t_lo <= tile) & (tile < t_hi) & (inner < inner_blocks)
        full = visited & (f_lo <= tile) & (tile < f_hi)
    else:
        inner_blocks = (N + COLS - 1) // COLS
        t_lo, t_hi, f_lo, f_hi = _block_tiles(outer * ROWS, M, N, first, end, full_first, full_end, ROWS, COLS, BAND,
                                              MASKING)
        t_hi = tl.maximum(t_hi, t_lo + 1)  # (a block that sees no key: see the module's docstring)
        visited = (t_lo <= inner) & (inner < t_hi)
        full = visited & (f_lo <= inner) & (inner < f_hi)
    store_listed_row(Lists + off_z * stride_lists_z + outer * inner_blocks,
                     Counts + off_z * stride_counts_z + outer * 2, inner, inner_blocks,
                     tl.where(full, 0, tl.where(visited, 1, 2)))


class KeyRangeTiles:
    """The lists of one call signature (a spec :func:`.common.pads_keys` accepts, its lengths, the tile and its
    order), as ``launch.TileClasses`` gives them: a call allocates them and makes one launch. ``rows`` x ``cols``: the
    kernels' query blocks and key tiles; ``key_major``: a key tile's query blocks (the backward's), else a query
    block's key tiles (the forward's)."""

    def __init__(self, spec: AttentionSpec, score_tensors: Sequence[Tensor], M, N, rows: int, cols: int,
                 key_major: bool):
        padding = plan.key_padding(spec)
        self.tensor = padding.tensor
        vector = score_tensors[padding.tensor]  # [Z or 1, 1, 1, N]
        self.batch = vector.shape[0]
        rows_blocks, cols_blocks = triton.cdiv(M, rows), triton.cdiv(N, cols)
        outer, inner = (cols_blocks, rows_blocks) if key_major else (rows_blocks, cols_blocks)
        self.lists_shape, self.counts_shape = (self.batch, outer, inner), (self.batch, outer, 2)
        self.grid = (outer, self.batch)
        self.constants = dict(M=M, N=N, ROWS=rows, COLS=cols, INNER=triton.next_power_of_2(inner),
                              HIDDEN=_HIDDEN_CODES[padding.hidden], FILL_LIMIT=MASKING_FILL_LIMIT,
                              BAND=padding.band is not None, MASKING=padding.kind == "masking", KEY_MAJOR=key_major,
                              CHUNK=min(_VECTOR_CHUNK, triton.next_power_of_2(N)))
        # (a few thousand elements a program: one warpgroup, no pipelining)
        self.config = tuning.KernelConfig(rows, cols, num_warps=4, num_stages=1)

    def __call__(self, score_tensors: Sequence[Tensor]) -> dict:
        vector = score_tensors[self.tensor]
        lists = torch.empty(self.lists_shape, dtype=torch.int32, device=vector.device)
        counts = torch.empty(self.counts_shape, dtype=torch.int32, device=vector.device)
        args = dict(Vector=vector, stride_vz=vector.stride(0) if self.batch > 1 else 0, stride_vn=vector.stride(3),
                    Lists=lists, Counts=counts, stride_lists_z=lists.stride(0), stride_counts_z=counts.stride(0),
                    **self.constants)
        launch(_key_range_tiles, self.grid, args, self.config)
        return listed_tile_args(lists, counts, batched=self.batch > 1)


def reference_key_range_tiles(spec: AttentionSpec, vector: Tensor, M: int, N: int, rows: int, cols: int,
                              key_major: bool) -> list[list[tuple[list[int], list[int]]]]:
    """The module's rule in PyTorch: per batch row of ``vector`` ([Z or 1, 1, 1, N]) and outer block, the full inner
    blocks and the rest it visits, each ascending. Each batch row's keys are the generated template's
    (``launch.key_range_args``: the visible span, every key for a row of none under the "masking" kind without a band,
    and the run proven exact)."""
    padding = plan.key_padding(spec)
    score_tensors = [vector if i == padding.tensor else None for i in range(len(spec.score_tensors))]
    key_range = key_range_args(spec, score_tensors, vector.shape[0], N, vector)["KeyRange"]
    masking, band = padding.kind == "masking", padding.band is not None
    result = []
    for first, end, full_first, full_end in key_range.tolist():
        def tiles(r0):
            r1 = min(r0 + rows, M)
            if band:
                narrowed = not masking or (end > 0 and r0 >= first)
                lo, hi = (first, min(end, r1)) if narrowed else (0, N)
                full_hi = min(full_end, r0 + 1)
            else:
                lo, hi, full_hi = first, end, full_end
            visited = set(range(lo // cols, -(-hi // cols))) if hi > lo else set()
            if not visited and not key_major:
                visited = {lo // cols}
            full = {t for t in visited if t * cols >= full_first and (t + 1) * cols <= full_hi}
            return visited, full

        per_block = [tiles(r0) for r0 in range(0, M, rows)]
        if key_major:
            rows_of = [([b for b, (_, full) in enumerate(per_block) if t in full],
                        [b for b, (visited, full) in enumerate(per_block) if t in visited - full])
                       for t in range(-(-N // cols))]
        else:
            rows_of = [(sorted(full), sorted(visited - full)) for visited, full in per_block]
        result.append(rows_of)
    return result
