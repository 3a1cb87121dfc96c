"""The gradient of an embedding table with few rows looked up at many positions -- T5's relative position bias (32
buckets x heads, looked up at every (query, key) pair: N^2 indices) -- as partial sums a program, not one atomic add
per index and column.

Inductor decomposes ``aten.embedding_dense_backward`` into an accumulating index_put, which it compiles to one
``atomic_add`` per (index, column); when the table has few rows those atomics queue at a few addresses. T5-small's
training step at B4 N4096 adds 134M values into a 32 x 8 table twice (encoder, decoder): 179 ms a call that way,
88% of the step, on an H100. Here each program walks a grid-stride share of the positions, ``BLOCK_P`` at a time,
and adds ``one_hot(indices)^T @ grad`` into a ``[ROWS, BLOCK_C]`` fp32 accumulator held in registers (a ``tl.dot``:
the one-hot is exact in any dtype, so the products are exact and the sums fp32, like the decomposition's, which sums
in fp32 too); it stores the accumulator once, and the programs' partial tables are summed after it --
deterministic, no atomics.

The rewrite (``fuse_attn.graph.rewrite``) replaces each embedding lookup whose table :func:`handles` says fits, and
whose table needs a gradient, with ``fuse_attn::table_lookup``: the same lookup, whose registered backward is
``fuse_attn::table_gradient`` (this kernel, traced into the backward graph as the attention kernels are). Other
embeddings keep Inductor's decomposition. :func:`reference_table_gradient` is the plain-PyTorch definition.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from fuse_attn.kernels.generated.decode import sm_count
from fuse_attn import settings
from fuse_attn.kernels.generated.launch import pow2_at_least_16, launch

aten = torch.ops.aten

# The accumulator a program holds: ROWS x BLOCK_C fp32 values, at most 64 x 64 = 4096 -- 32 registers a thread at
# Triton's default 4 warps (128 threads), beside the tile of grad in flight. So a table of at most 64 rows (padded to
# a power of two, 16 at least: tl.dot's smallest dim); columns come in blocks of BLOCK_C.
MAX_ROWS = 64
MAX_BLOCK_C = 64
# Launch settings, the fastest of a sweep of 64 on an H100: positions a loop step, and programs an SM along the
# positions (a grid-stride loop: the partial tables stay small whatever the length); warps and stages are Triton's
# defaults (4, 3). T5-small's encoder table at N4096 (16.8M positions x 8 heads, bf16): 228 us (4 programs an SM:
# 234, 1 an SM: 602); at N1024 25 us (the fastest setting there: 23).
BLOCK_P = 256
PROGRAMS_PER_SM = 8
# Under the interpreter (no SMs to fill) a few programs, so the grid-stride loop and the sum over partials run.
INTERPRETER_PROGRAMS = 3
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _table_gradient_partials(
    G, I, PARTIALS, positions, columns, padding_idx, stride_gp, stride_gc, programs,
    ROWS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):
    """PARTIALS[program, r, c] = sum of G[p, c] over this program's positions p with I[p] == r != padding_idx."""
    pid = tl.program_id(0)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    rows = tl.arange(0, ROWS)
    acc = tl.zeros([ROWS, BLOCK_C], dtype=tl.float32)
    for start in range(pid * BLOCK_P, positions, programs * BLOCK_P):
        offs_p = start + tl.arange(0, BLOCK_P)
        in_range = offs_p < positions
        # -1 (outside the range) and the padding row match no row; an index >= the table's rows matches a padded
        # row at most, which the caller drops
        index = tl.load(I + offs_p, mask=in_range, other=-1)
        index = tl.where(index == padding_idx, -1, index)
        g = tl.load(G + offs_p.to(tl.int64)[:, None] * stride_gp + offs_c.to(tl.int64)[None, :] * stride_gc,
                    mask=in_range[:, None] & (offs_c[None, :] < columns), other=0.0)
        one_hot = tl.where(rows[:, None] == index[None, :], 1.0, 0.0)
        if DOT_IN_FP32:
            acc += tl.dot(one_hot, g.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(one_hot.to(g.dtype), g)
    table_columns = tl.num_programs(1) * BLOCK_C
    tl.store(PARTIALS + (pid * ROWS + rows[:, None]) * table_columns + offs_c[None, :], acc)


def handles(weight: Tensor, scale_grad_by_freq: bool = False, sparse: bool = False) -> bool:
    """Whether a lookup of ``weight`` gets its gradient from :func:`table_gradient`: a 2-D table of at most MAX_ROWS
    rows (a size known at compile time), a floating dtype of the kernel, dense and unscaled gradients, on a device
    where the kernel runs (CUDA, or the CPU under the Triton interpreter)."""
    return (weight.dim() == 2 and isinstance(weight.shape[0], int) and 0 < weight.shape[0] <= MAX_ROWS
            and isinstance(weight.shape[1], int) and weight.dtype in DTYPES and not scale_grad_by_freq
            and not sparse and (weight.device.type == "cuda" or (weight.device.type == "cpu" and settings.interpreting())))


def _programs(device: torch.device, column_blocks: int) -> int:
    sms = sm_count(device)
    if sms is None:
        return INTERPRETER_PROGRAMS
    return max(1, PROGRAMS_PER_SM * sms // column_blocks)


def partials_launch(grad: Tensor, indices: Tensor, rows: int, padding_idx: int) -> tuple[tuple, dict, Tensor]:
    """(grid, kernel arguments, partial tables) of a launch of :func:`_table_gradient_partials`: the partials are
    fp32 ``[programs, ROWS, column blocks x BLOCK_C]``, padded rows and columns included."""
    positions, columns = grad.shape
    padded_rows = pow2_at_least_16(rows)
    block_c = min(MAX_BLOCK_C, pow2_at_least_16(columns))
    column_blocks = triton.cdiv(columns, block_c)
    programs = _programs(grad.device, column_blocks)
    partials = torch.empty((programs, padded_rows, column_blocks * block_c), dtype=torch.float32, device=grad.device)
    args = dict(G=grad, I=indices, PARTIALS=partials, positions=positions, columns=columns, padding_idx=padding_idx,
                stride_gp=grad.stride(0), stride_gc=grad.stride(1), programs=programs, ROWS=padded_rows,
                BLOCK_C=block_c, BLOCK_P=BLOCK_P,
                # fp32 gradients: TF32 would round them; the interpreter's tl.dot multiplies bf16 bit patterns
                DOT_IN_FP32=grad.dtype == torch.float32 or settings.interpreting())
    return (programs, column_blocks), args, partials


def _table_gradient(grad: Tensor, indices: Tensor, rows: int, padding_idx: int) -> Tensor:
    grid, args, partials = partials_launch(grad, indices, rows, padding_idx)
    launch(_table_gradient_partials, grid, args)  # Triton's default warps and stages
    return partials.sum(0)[:rows, :grad.shape[1]].contiguous()


@torch.library.triton_op("fuse_attn::table_gradient", mutates_args=())
def table_gradient(grad: Tensor, indices: Tensor, rows: int, padding_idx: int) -> Tensor:
    """fp32 ``[rows, C]``: the sum of ``grad[p]`` (``[P, C]``) over the positions p with ``indices[p] == r``, for
    every row r but ``padding_idx`` (-1: none), whose row is 0 -- ``embedding_dense_backward`` of a 2-D table.
    CUDA tensors: the kernel, traced into the caller's graph; CPU tensors: the opaque ``table_gradient_cpu``."""
    if grad.device.type != "cuda":
        return torch.ops.fuse_attn.table_gradient_cpu(grad, indices, rows, padding_idx)
    return _table_gradient(grad, indices, rows, padding_idx)


@torch.library.custom_op("fuse_attn::table_gradient_cpu", mutates_args=())
def table_gradient_cpu(grad: Tensor, indices: Tensor, rows: int, padding_idx: int) -> Tensor:
    """:func:`table_gradient` on CPU tensors: the kernel under the Triton interpreter, plain PyTorch otherwise."""
    if settings.interpreting():
        return _table_gradient(grad, indices, rows, padding_idx)
    return reference_table_gradient(grad, indices, rows, padding_idx)


@table_gradient_cpu.register_fake
def _(grad, indices, rows, padding_idx):
    return grad.new_empty((rows, grad.shape[1]), dtype=torch.float32)


def reference_table_gradient(grad: Tensor, indices: Tensor, rows: int, padding_idx: int) -> Tensor:
    """The definition in plain PyTorch: fp32 sums (fp64 for fp64 inputs) by index_add, the padding row zero."""
    acc_dtype = torch.float64 if grad.dtype == torch.float64 else torch.float32
    out = torch.zeros((rows, grad.shape[1]), dtype=acc_dtype, device=grad.device)
    keep = (indices >= 0) & (indices < rows) & (indices != padding_idx)
    return out.index_add_(0, indices[keep], grad[keep].to(acc_dtype))


@torch.library.triton_op("fuse_attn::table_lookup", mutates_args=())
def table_lookup(weight: Tensor, indices: Tensor, padding_idx: int) -> Tensor:
    """``embedding(weight, indices, padding_idx)``, whose weight's gradient is :func:`table_gradient`'s (the
    rewrite puts it where :func:`handles` says so); Inductor compiles the lookup itself as any embedding."""
    return aten.embedding.default(weight, indices, padding_idx)


def _lookup_setup_context(ctx, inputs, output):
    weight, indices, padding_idx = inputs
    ctx.save_for_backward(indices)
    ctx.rows, ctx.padding_idx = weight.shape[0], padding_idx


def _lookup_backward(ctx, grad):
    (indices,) = ctx.saved_tensors
    table = torch.ops.fuse_attn.table_gradient(grad.reshape(-1, grad.shape[-1]), indices.reshape(-1), ctx.rows,
                                               ctx.padding_idx)
    return table.to(grad.dtype), None, None


table_lookup.register_autograd(_lookup_backward, setup_context=_lookup_setup_context)
