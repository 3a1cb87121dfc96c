"""The tiles the Gluon kernels visit where a mask tensor of the heads (``[Z or 1, 1, M, N]``: a bias of 0 / at most
the fill, or a bool; :func:`fuse_attn.kernels.hopper.common.masks_by_a_summary`) hides scores, classified per call
on the device from the mask's values and listed in the tile-classes kernel's format
(:class:`fuse_attn.kernels.generated.launch.TileClasses`), so that the kernels' listed loops (``MASK_BLOCKS``) run
them: the full tiles plain, the rest through the spec's program (which loads the mask's tile).

The rule is the generated template's (``launch.mask_granules`` then ``launch.mask_block_args``), tile by tile: a tile
is full where the mask changes none of its entries (every position inside M x N, a bias of exactly 0 or a bool
keeping it), empty where it hides every entry (positions past M or N count as hidden) and every row of its query
block keeps a visible key somewhere (a row that keeps none is eager's uniform or NaN row: its hidden tiles must run),
and partial otherwise (a NaN in a bias is neither: its tiles stay partial and eager's NaN comes through). Per outer
block, the lists hold the full inner blocks, then the partial ones, then the empty ones, each ascending (as
``mask_block_args``'s); the counts, the first run of consecutive full blocks (the kernels visit it as a range) and how
many full and partial entries follow it.

The mask is read once, a tile a program (its summary: full, all hidden, and which rows keep a visible key in it);
then a program a query block classifies its tiles and writes its row of the lists (query-major, the forward's) or
of the classes, from which a program a key tile writes its row (key-major, the backward's).
:func:`reference_mask_tiles` is the rule in PyTorch (the template's own functions), what the tests check the kernels
against."""

from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from fuse_attn.kernels import plan, tuning
from fuse_attn.kernels.generated.launch import launch, listed_tile_args, mask_block_args, mask_granules
from fuse_attn.score_program import MASKING_FILL_LIMIT
from fuse_attn.spec import AttentionSpec

# A summarized mask's hiding value, as the kernels' HIDDEN constexpr (plan.MaskBlocks.hidden)
_HIDDEN_CODES = {"false": 0, "true": 1, "fill": 3}
# Keys of a tile's rows a program reads at once: a 128-row tile's 64 keys are 64 values a thread of 4 warps
_KEY_CHUNK = 64
# Key tiles of a query block's RowSeen a program reads at once (a 128-row block's: 32 values a thread of 4 warps)
_SEEN_TILES = 32


@triton.jit
def store_listed_row(row, counts, inner, inner_blocks, classes):
    """An outer block's row of the lists (its inner blocks by ``classes``, 0 full, 1 partial, 2 empty: the full ones,
    then the partial ones, then the empty ones, each ascending) and of the counts (the first run of consecutive full
    blocks, the full and partial entries after it). The kernels read the first two classes; the row holds every inner
    block all the same, so that no read past them meets an index that is no tile."""
    in_range = inner < inner_blocks
    full, partial = (classes == 0) & in_range, (classes == 1) & in_range
    empty = in_range & ~full & ~partial
    n_full = tl.sum(full.to(tl.int32), 0)
    n_partial = tl.sum(partial.to(tl.int32), 0)
    at = tl.where(full, tl.cumsum(full.to(tl.int32), 0) - 1,
                  tl.where(partial, n_full + tl.cumsum(partial.to(tl.int32), 0) - 1,
                           n_full + n_partial + tl.cumsum(empty.to(tl.int32), 0) - 1))
    tl.store(row + at, inner, mask=in_range)
    first_full = tl.min(tl.where(full, inner, inner_blocks), 0)
    after_run = tl.min(tl.where((inner > first_full) & ~full, inner, inner_blocks), 0)
    n_run = tl.where(n_full > 0, after_run - first_full, 0)
    tl.store(counts, n_run)
    tl.store(counts + 1, n_full - n_run + n_partial)


# (the mask's strides and N specialized: a row's keys contiguous, its start 16-byte aligned and N a multiple of 16 are
# what make each thread's loads 16-byte vectors -- the PTX's ld.global.v4; unspecialized, every value was a load of its
# own: a [4, 1, 4096, 4096] bf16 mask's key-major lists of 128 x 128 tiles took 289 us on an H200, 64 us with them)
@triton.jit(do_not_specialize=["M", "stride_bits_z", "stride_seen_z"])
def _mask_tile_summaries(Mask, stride_mz, stride_mm, stride_mn, Bits, RowSeen, stride_bits_z, stride_seen_z, M, N,
                         ROWS: tl.constexpr, COLS: tl.constexpr, HIDDEN: tl.constexpr, FILL_LIMIT: tl.constexpr,
                         CHUNK: tl.constexpr):
    # one program a tile of ROWS x COLS of a batch row of the mask: Bits[z, block, tile] (1: every entry inside M x N
    # and unchanged; 2: every entry hidden, positions past M or N counting as hidden; else 0) and RowSeen[z, tile, row]
    # (whether the row keeps a visible key in the tile)
    tile = tl.program_id(0)
    block = tl.program_id(1)
    off_z = tl.program_id(2).to(tl.int64)
    offs_m = block * ROWS + tl.arange(0, ROWS)
    rows_inside = offs_m < M
    mask_rows = Mask + off_z * stride_mz + offs_m.to(tl.int64)[:, None] * stride_mm
    seen = tl.zeros([ROWS], tl.int32)
    all_hidden = tl.full([], 1, tl.int32)
    all_unchanged = tl.full([], 1, tl.int32)
    for n0 in tl.static_range(0, COLS, CHUNK):
        offs_n = tile * COLS + n0 + tl.arange(0, CHUNK)
        inside = rows_inside[:, None] & (offs_n < N)[None, :]
        # (compared in fp32, which holds a bool, fp16 or bf16 value exactly: Triton's interpreter compared bf16
        # values with the fill limit wrongly)
        x = tl.load(mask_rows + offs_n.to(tl.int64)[None, :] * stride_mn, mask=inside, other=0).to(tl.float32)
        if HIDDEN == 0:
            hidden = x == 0
        elif HIDDEN == 1:
            hidden = x != 0
        else:
            hidden = x <= FILL_LIMIT
        if HIDDEN < 2:
            unchanged = ~hidden
        else:
            unchanged = x == 0
        # (int32, not bool: Triton's interpreter makes a scalar bool & a vector one int32, which a store's mask
        # refuses)
        hidden = (hidden | ~inside).to(tl.int32)
        seen = tl.maximum(seen, 1 - tl.min(hidden, 1))
        all_hidden = tl.minimum(all_hidden, tl.min(hidden))
        all_unchanged = tl.minimum(all_unchanged, tl.min((unchanged & inside).to(tl.int32)))
    n_tiles = (N + COLS - 1) // COLS
    bits = tl.where(all_unchanged > 0, 1, tl.where(all_hidden > 0, 2, 0)).to(tl.int8)
    tl.store(Bits + off_z * stride_bits_z + block * n_tiles + tile, bits)
    tl.store(RowSeen + off_z * stride_seen_z + tile * M + offs_m, seen.to(tl.int8), mask=rows_inside)


@triton.jit(do_not_specialize=["M", "N", "stride_bits_z", "stride_seen_z", "stride_lists_z", "stride_counts_z",
                               "stride_classes_z"])
def _mask_tile_classes(Bits, RowSeen, stride_bits_z, stride_seen_z, Lists, Counts, Classes, stride_lists_z,
                       stride_counts_z, stride_classes_z, M, N, ROWS: tl.constexpr, COLS: tl.constexpr,
                       INNER: tl.constexpr, KEY_MAJOR: tl.constexpr, SEEN_TILES: tl.constexpr):
    # one program a query block of ROWS rows of a batch row: its tiles' classes from _mask_tile_summaries' Bits and
    # RowSeen -- full, empty (every entry hidden and every row of the block keeping a visible key somewhere),
    # partial -- and (query-major) its row of Lists and Counts, else (KEY_MAJOR) Classes[z, block, tile] for
    # _mask_tile_lists; INNER: a power of two at least the key tiles; SEEN_TILES: RowSeen's tiles read at once
    block = tl.program_id(0)
    off_z = tl.program_id(1).to(tl.int64)
    offs_m = block * ROWS + tl.arange(0, ROWS)
    n_tiles = (N + COLS - 1) // COLS
    keeps = (offs_m >= M).to(tl.int32)  # (rows past M count as keeping one)
    for t0 in range(0, n_tiles, SEEN_TILES):
        offs_t = t0 + tl.arange(0, SEEN_TILES)
        seen = tl.load(RowSeen + off_z * stride_seen_z + offs_t[:, None] * M + offs_m[None, :],
                       mask=(offs_t < n_tiles)[:, None] & (offs_m < M)[None, :], other=0)
        keeps = tl.maximum(keeps, tl.max(seen.to(tl.int32), 0))
    tiles = tl.arange(0, INNER)
    bits = tl.load(Bits + off_z * stride_bits_z + block * n_tiles + tiles, mask=tiles < n_tiles, other=0)
    empty = (bits == 2) & (tiles * 0 + tl.min(keeps, 0) > 0)
    classes = tl.where(bits == 1, 0, tl.where(empty, 2, 1))
    if KEY_MAJOR:
        tl.store(Classes + off_z * stride_classes_z + block * n_tiles + tiles, classes.to(tl.int8),
                 mask=tiles < n_tiles)
    else:
        store_listed_row(Lists + off_z * stride_lists_z + block * n_tiles, Counts + off_z * stride_counts_z + block * 2,
                         tiles, n_tiles, classes)


@triton.jit(do_not_specialize=["M", "N", "stride_lists_z", "stride_counts_z", "stride_classes_z"])
def _mask_tile_lists(Lists, Counts, Classes, stride_lists_z, stride_counts_z, stride_classes_z, M, N,
                     ROWS: tl.constexpr, COLS: tl.constexpr, INNER: tl.constexpr):
    # one program a key tile of a batch row: its row of Lists and Counts (the query blocks that visit it) from the
    # classes _mask_tile_classes wrote; INNER: a power of two at least the query blocks
    tile = tl.program_id(0)
    off_z = tl.program_id(1).to(tl.int64)
    blocks = tl.arange(0, INNER)
    n_blocks = (M + ROWS - 1) // ROWS
    n_tiles = (N + COLS - 1) // COLS
    classes = tl.load(Classes + off_z * stride_classes_z + blocks * n_tiles + tile, mask=blocks < n_blocks, other=2)
    store_listed_row(Lists + off_z * stride_lists_z + tile * n_blocks, Counts + off_z * stride_counts_z + tile * 2,
                     blocks, n_blocks, classes)


class MaskTiles:
    """The lists of one call signature (a spec :func:`.common.masks_by_a_summary` accepts, its mask's shape and
    strides, the lengths, the tile and its order), as ``launch.TileClasses`` gives them: a call allocates them and
    makes two launches (query-major) or three (``key_major``). ``rows`` x ``cols``: the kernels' query blocks and key
    tiles; ``key_major``: a key tile's query blocks (the backward's), else a query block's key tiles (the forward's).
    Every call reads its mask again: two calls on one tensor may see different values (a kernel may have written it
    in between without a version counter seeing it)."""

    def __init__(self, spec: AttentionSpec, score_tensors: Sequence[Tensor], M, N, rows: int, cols: int,
                 key_major: bool):
        summarized = plan.mask_blocks(spec)
        self.tensor = summarized.tensor
        mask = score_tensors[self.tensor]  # [Z or 1, 1, M or 1, N or 1]
        self.batch = mask.shape[0] if mask.stride(0) else 1
        self.key_major = key_major
        row_blocks, col_blocks = triton.cdiv(M, rows), triton.cdiv(N, cols)
        outer, inner = (col_blocks, row_blocks) if key_major else (row_blocks, col_blocks)
        self.lists_shape, self.counts_shape = (self.batch, outer, inner), (self.batch, outer, 2)
        self.bits_shape, self.seen_shape = (self.batch, row_blocks, col_blocks), (self.batch, col_blocks, M)
        self.summaries_grid = (col_blocks, row_blocks, self.batch)
        self.classes_grid, self.lists_grid = (row_blocks, self.batch), (col_blocks, self.batch)
        sizes = dict(M=M, N=N, ROWS=rows, COLS=cols)
        self.summaries_constants = dict(sizes, HIDDEN=_HIDDEN_CODES[summarized.hidden], FILL_LIMIT=MASKING_FILL_LIMIT,
                                        CHUNK=min(_KEY_CHUNK, cols))
        self.classes_constants = dict(sizes, INNER=triton.next_power_of_2(col_blocks), KEY_MAJOR=key_major,
                                      SEEN_TILES=min(_SEEN_TILES, triton.next_power_of_2(col_blocks)))
        self.lists_constants = dict(sizes, INNER=triton.next_power_of_2(row_blocks))
        # (a tile or a block's few thousand summaries a program: one warpgroup, no pipelining)
        self.config = tuning.KernelConfig(rows, cols, num_warps=4, num_stages=1)

    def __call__(self, score_tensors: Sequence[Tensor]) -> dict:
        mask = score_tensors[self.tensor]
        device = mask.device
        lists = torch.empty(self.lists_shape, dtype=torch.int32, device=device)
        counts = torch.empty(self.counts_shape, dtype=torch.int32, device=device)
        bits = torch.empty(self.bits_shape, dtype=torch.int8, device=device)  # (the kernels' scratch)
        seen = torch.empty(self.seen_shape, dtype=torch.int8, device=device)
        # (the classes only the key-major lists read; query-major, a placeholder)
        classes = torch.empty(self.bits_shape if self.key_major else (1,), dtype=torch.int8, device=device)
        scratch = dict(Bits=bits, RowSeen=seen, stride_bits_z=bits.stride(0), stride_seen_z=seen.stride(0))
        launch(_mask_tile_summaries, self.summaries_grid,
               dict(Mask=mask, stride_mz=mask.stride(0) if self.batch > 1 else 0, stride_mm=mask.stride(2),
                    stride_mn=mask.stride(3), **scratch, **self.summaries_constants), self.config)
        lists_args = dict(Lists=lists, Counts=counts, Classes=classes, stride_lists_z=lists.stride(0),
                          stride_counts_z=counts.stride(0), stride_classes_z=classes.stride(0) if self.key_major else 0)
        launch(_mask_tile_classes, self.classes_grid, dict(**scratch, **lists_args, **self.classes_constants),
               self.config)
        if self.key_major:
            launch(_mask_tile_lists, self.lists_grid, dict(**lists_args, **self.lists_constants), self.config)
        return listed_tile_args(lists, counts, batched=self.batch > 1)


def reference_mask_tiles(spec: AttentionSpec, score_tensors: Sequence[Tensor], M: int, N: int, rows: int, cols: int,
                         key_major: bool) -> tuple[Tensor, Tensor]:
    """The module's rule in PyTorch: the generated template's lists and counts of the mask (``launch.mask_granules``
    at a granule of ``cols`` keys, then ``launch.mask_block_args``), ``[Zm, outer, inner]`` and ``[Zm, outer, 2]``."""
    granules = mask_granules(spec, score_tensors, M, N, cols)
    listed = mask_block_args(granules, M, N, rows, cols, key_major, score_tensors[0])
    return listed["BlockList"], listed["BlockCounts"]
