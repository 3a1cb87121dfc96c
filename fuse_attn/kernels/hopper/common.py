"""What the Gluon forward (:mod:`.forward`) and backward (:mod:`.backward`) share: which attentions they take
(:func:`hopper_reasons`), the TMA descriptors and bias views they read through, the Gluon helpers both kernels call,
the shared memory and SMs their launch rules count, which bias gradients the backward computes
(:func:`dscore_kv_heads`), and the op library both ops are defined on."""

from __future__ import annotations

import functools
import math
from typing import Sequence

import torch
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import tma, warpgroup_mma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from fuse_attn.kernels import ops, plan
from fuse_attn.kernels.generated import codegen
from fuse_attn.kernels.generated.decode import sm_count
from fuse_attn.kernels.generated.launch import TileClasses, broadcast_strides
from fuse_attn.kernels.hopper.key_range_tiles import KeyRangeTiles
from fuse_attn.kernels.hopper.mask_tiles import MaskTiles
from fuse_attn.kernels.plan import size_hint
from fuse_attn.spec import AttentionSpec

# The TMA copies' names: async_load / async_store in Triton 3.9, async_copy_global_to_shared /
# async_copy_shared_to_global in 3.6 (the GPU machine's).
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

LOG2E = math.log2(math.e)  # the kernels' softmax runs in log2 units: exp2(s * scale * LOG2E)
# The (q / k, v) head dims the kernels are tuned for: each has a config for each (forward._CONFIGS, backward._CONFIGS,
# by q's head dim), DeepSeek-V3's multi-head latent attention too, q / k 192 wide and v 128, in 64-column parts
# (:func:`head_dim_part`); a bias only at 64 and 128 (forward._BIAS_TMA_CONFIGS; the backward's bias tiles and dS
# stores are written for whole-width tiles).
HEAD_DIMS = ((64, 64), (128, 128), (192, 128))
BIAS_HEAD_DIMS = ((64, 64), (128, 128))
_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
_TILE_DTYPES = {**_DTYPES, torch.float32: gl.float32}  # (fp32: the backward's dQ accumulator)
TMA_ALIGN_BYTES = 16  # a TMA descriptor's base address and every stride but the last: multiples of 16 bytes
# The 228 KiB of shared memory an SM of sm90, of which CUDA reserves 1 KiB a resident CTA: one CTA may use 227 KiB
# (cudaDevAttrMaxSharedMemoryPerBlockOptin), each of two 113 KiB. Beyond its tiles a kernel takes its mbarriers and
# the compiler's scratch: 236-280 bytes in the configs compiled for sm90 (test_gpu_compile.py), 1 KiB allowed.
_SHARED_MEMORY_AN_SM = 228 * 1024
_RESERVED_A_CTA = 1024
_BEYOND_THE_TILES = 1024
# The least head dim whose backward stores dS for a bias's gradient (:func:`dscore_kv_heads`). At 64 a tile's dS
# stores twice the bytes a matmul FLOP that 128's do: T5-small's encoder attention (B4 H8 N4096, a [1, 8, N, N] bias)
# ran slower so than with the template's backward for the bias; at 128 faster, unmasked and causal (H200).
_DS_MIN_HEAD_DIM = 128


# ---- which attentions ------------------------------------------------------------------------------------------------
def hopper_reasons(spec: AttentionSpec, q: Tensor, k: Tensor) -> list[str]:
    """Why the Gluon kernels (forward and backward: they take the same attentions) cannot compute the attention
    (empty: they can). q ``[Z, H, M, D]``, k ``[Z, H // g, N, D]``, possibly fake with symbolic lengths."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    reasons = []
    scored = scores_by_a_program(spec)
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device) != (9, 0):
        reasons.append("the Gluon kernels are written for Hopper (sm90) wgmma and TMA")
    if q.dtype not in _DTYPES:
        reasons.append(f"the Gluon kernels take fp16/bf16, not {q.dtype}")
    listed = lists_tiles(spec)
    if spec.score_program and not adds_a_bias(spec) and not listed and not scored:
        reasons.append("the Gluon kernels compute plain attention, add one bias tensor, mask the plain scores by a "
                       f"predicate of at most {MAX_VECTORS} integer vectors, by a key padding vector (with the "
                       "causal band or none) or by a mask tensor of the heads', or change every score by arithmetic, "
                       f"tanh and sigmoid of it, its indices and at most {MAX_VECTORS} float tensors (no other score "
                       "program or mask)")
    elif not listed and adds_a_bias(spec) and (plan.key_padding(spec) is not None
                                               or plan.mask_blocks(spec) is not None):
        reasons.append("the bias hides keys by its values, which the generated kernels skip per call where the Gluon "
                       "kernels would compute them")
    if spec.dropout_p:
        reasons.append("the Gluon kernels have no dropout")
    dims = (spec.head_dim, spec.head_dim_v)
    if dims not in HEAD_DIMS:
        reasons.append(f"the Gluon kernels are tuned for head dims "
                       f"{', '.join(f'{d}/{dv}' for d, dv in HEAD_DIMS)}, not {spec.head_dim}/{spec.head_dim_v}")
    elif spec.score_program and dims not in BIAS_HEAD_DIMS:
        reasons.append(f"the Gluon kernels add no bias and run no score program at head dims "
                       f"{spec.head_dim}/{spec.head_dim_v}")
    if spec.causal is not None and (spec.causal.diagonal != 0 or not statically_known_true(q.shape[2] == k.shape[2])):
        reasons.append("the Gluon kernels' causal mask is the plain diagonal of equal lengths")
    if causal_window(spec) and spec.score_program and not scored:
        reasons.append("the Gluon kernels take a sliding window only over the plain scores or a score program's")
    return reasons


def causal_window(spec: AttentionSpec, keys: int | None = None) -> int:
    """The spec's sliding window (keys a query sees, its own the latest), 0 where it has none or (``keys`` given) it
    spans them all: an argument of both kernels, which visit only the key tiles of each row's window."""
    if spec.causal is None or spec.causal.window is None or keys is not None and spec.causal.window >= keys:
        return 0
    return spec.causal.window


def head_dim_part(head_dim: int) -> int:
    """The columns of a part of the q, k, dQ and dK tiles: their head dim where a power of two, else 64 (a TMA box and
    a tile are a power of two wide; 192 = 3 x 64: a wgmma's K a part, the 128-byte swizzle of a 64-column bf16
    row)."""
    return head_dim if head_dim & (head_dim - 1) == 0 else 64


# The score tensors a program may read in the Gluon kernels (their slots V0-V3): Hugging Face's packed documents' mask
# reads two integer vectors (document ids per query and per key) or four (and the position ids, which transformers
# compares from 5.24); ALiBi from slopes one float tensor
MAX_VECTORS = 4


def masks_by_a_predicate(spec: AttentionSpec) -> bool:
    """Whether the spec's score program masks the plain score by a predicate of integer vectors
    (:func:`fuse_attn.kernels.plan.mask_blocks`: packed documents), its score tensors those vectors, at most
    :data:`MAX_VECTORS`: the Gluon kernels then visit the tiles the tile-classes kernel lists per call
    (``MASK_BLOCKS``) and evaluate the program, generated (codegen's ``gluon_score_program``), in the partial ones."""
    summarized = plan.mask_blocks(spec)
    return (summarized is not None and summarized.predicate is not None
            and spec.score_program[summarized.unmasked].op == "score" and len(spec.score_tensors) <= MAX_VECTORS
            and all(t.role == "int" for t in spec.score_tensors))


def pads_keys(spec: AttentionSpec) -> bool:
    """Whether a key padding vector (:func:`fuse_attn.kernels.plan.key_padding`: Hugging Face's padded batches) is
    what masks the spec's scores, with the causal band ``kv_idx <= q_idx`` written into the program or no band (no
    causal mask or window of the spec's own), and the plain score is what it leaves of the program where it keeps a
    key (:func:`fuse_attn.kernels.plan.visible_spec`): the Gluon kernels then visit the tiles that
    :class:`.key_range_tiles.KeyRangeTiles` lists per call (``MASK_BLOCKS``), the full ones plain, the rest through
    the spec's program, generated as for :func:`masks_by_a_predicate`, of the vector."""
    padding = plan.key_padding(spec)
    if padding is None or spec.causal is not None or padding.band not in (None, 0):
        return False
    visible = plan.visible_spec(spec)
    return visible is not None and not visible.score_program


def masks_by_a_summary(spec: AttentionSpec) -> bool:
    """Whether the spec's scores are the plain ones masked by a mask tensor of the heads' (``[Z or 1, 1, M, N]``, a
    bias of 0 / at most the fill, or a bool) whose tiles are classified per call from its values
    (:func:`fuse_attn.kernels.plan.mask_blocks`: a mask built before a graph break, as FSDP's and DDP's blocks
    receive Hugging Face's): the Gluon kernels then visit the tiles :class:`.mask_tiles.MaskTiles` lists, the full
    ones plain, the rest through the spec's program, which loads the mask's tile."""
    summarized = plan.mask_blocks(spec)
    return (summarized is not None and summarized.tensor is not None and len(spec.score_tensors) == 1
            and spec.score_program[summarized.unmasked].op == "score")


def lists_tiles(spec: AttentionSpec) -> bool:
    """Whether the Gluon kernels visit the tiles a kernel lists per call (``MASK_BLOCKS``): a predicate's mask, a key
    padding vector or a mask tensor summarized per call (:func:`tile_lists`)."""
    return masks_by_a_predicate(spec) or pads_keys(spec) or masks_by_a_summary(spec)


def tile_lists(spec: AttentionSpec, vectors: Sequence[Tensor], M, N, rows: int, cols: int, key_major: bool):
    """What lists the tiles of a call of one signature (:func:`lists_tiles` specs; None for others): the tile-classes
    kernel of a predicate's mask, :class:`.key_range_tiles.KeyRangeTiles` of a key padding vector, or
    :class:`.mask_tiles.MaskTiles` of a mask tensor; ``rows`` x ``cols`` the kernels' query blocks and key tiles,
    ``key_major`` the backward's order."""
    if masks_by_a_predicate(spec):
        return TileClasses(spec, vectors, M, N, rows, cols, key_major)
    if pads_keys(spec):
        return KeyRangeTiles(spec, vectors, M, N, rows, cols, key_major)
    return MaskTiles(spec, vectors, M, N, rows, cols, key_major) if masks_by_a_summary(spec) else None


# The ops of a score program the Gluon kernels apply to every score (SCORED): arithmetic, tanh and sigmoid of the score,
# its indices, finite constants and float tensors; none hides a key (no comparison, where, exp or log), so every row
# keeps a finite maximum, as the plain scores' rows do.
_PROGRAM_OPS = frozenset({"score", "q_idx", "kv_idx", "batch_idx", "head_idx", "const", "load", "neg", "abs", "tanh",
                          "sigmoid", "to_float", "add", "sub", "mul", "div", "maximum", "minimum", "clamp_min",
                          "clamp_max"})


def scores_by_a_program(spec: AttentionSpec) -> bool:
    """Whether the spec's score program changes every score by ops of :data:`_PROGRAM_OPS` alone (a divisor a
    nonzero constant), of at most :data:`MAX_VECTORS` float score tensors broadcast over the query rows or the keys
    (slopes a head, a vector a key), and is no ``s + bias``
    (:func:`adds_a_bias`, loaded by its own path): the Gluon kernels then evaluate the program, generated (codegen's
    ``gluon_score_program``), in every tile (``SCORED``: ALiBi from slopes, a tanh softcap)."""
    nodes = spec.score_program
    if not nodes or adds_a_bias(spec) or len(spec.score_tensors) > MAX_VECTORS:
        return False
    # (float tensors broadcast over the rows or the keys: a row or a column a tile, loaded within the lengths)
    if any(t.role != "bias" or not (t.broadcast[2] or t.broadcast[3]) for t in spec.score_tensors):
        return False
    for node in nodes:
        if node.op not in _PROGRAM_OPS or node.op == "const" and not math.isfinite(node.value):
            return False
        if node.op == "div" and (nodes[node.args[1]].op != "const" or nodes[node.args[1]].value == 0):
            return False
    return True


def vector_slots(vectors: Sequence[Tensor], stand_in: Tensor) -> tuple:
    """The kernels' V0-V3 arguments: each score tensor's pointer (a predicate's integer vectors, a score program's
    float tensors) and (z, h, m, n) strides (0 where broadcast), in the spec's order; ``stand_in`` with zero strides
    in the slots past them (never read)."""
    slots = []
    for i in range(MAX_VECTORS):
        slots += [vectors[i], *broadcast_strides(vectors[i])] if i < len(vectors) else [stand_in, 0, 0, 0, 0]
    return tuple(slots)


def score_program_functions(spec: AttentionSpec):
    """The generated Gluon ``(program, program_grad)`` of a spec :func:`lists_tiles` or :func:`scores_by_a_program`
    accepts (the kernels' ``PROGRAM`` and ``PROGRAM_GRAD``), ``(None, None)`` for another (plain attention, a bias
    loaded by its own path)."""
    if not (lists_tiles(spec) or scores_by_a_program(spec)):
        return None, None
    mod = codegen.load_module(spec, codegen.GLUON_SCORE_PROGRAM_TEMPLATE_NAME)
    return mod.program, mod.program_grad


@gluon.jit
def listed_tiles(block_lists, z, outer, inner_blocks):
    """Outer block ``outer``'s row of the tile-classes kernel's lists (``launch.predicate_block_args``;
    ``block_lists``: the lists, the counts and their batch strides; a query block's key tiles for the forward, a key
    tile's query tiles for the backward, ``inner_blocks`` a row): the row's address, its first run of full tiles, and
    the tiles to visit (the run, then the rest, masked)."""
    lists, counts, stride_lists_z, stride_counts_z = block_lists
    row = lists + z * stride_lists_z + outer * inner_blocks
    n_run = gl.load(counts + z * stride_counts_z + outer * 2)
    return row, n_run, n_run + gl.load(counts + z * stride_counts_z + outer * 2 + 1)


def adds_a_bias(spec: AttentionSpec) -> bool:
    """Whether the spec's score program is ``s + bias``: the scaled score plus its one score tensor, a float bias of
    any broadcast, which the Gluon kernels load in each tile (``HAS_BIAS``)."""
    nodes = spec.score_program
    if len(nodes) != 3 or len(spec.score_tensors) != 1 or spec.score_tensors[0].role != "bias":
        return False
    return nodes[-1].op == "add" and sorted(nodes[a].op for a in nodes[-1].args) == ["load", "score"]


def checked_call(op_name: str, q: Tensor, k: Tensor, v: Tensor, spec: str, bias: Tensor | None, prepare, *others,
                 vectors: Sequence[Tensor] = ()):
    """What ``prepare(spec, q, k, v, bias, vectors)`` makes of a Gluon op's call -- the parsed :class:`AttentionSpec`,
    or a launch worked out for the call's sizes -- after its inputs were validated as the template's op validates
    them (shapes, dtypes, devices); a ValueError naming ``fuse_attn::<op_name>`` where :func:`hopper_reasons`
    refuses them. It is remembered with what the checks and ``prepare`` read (the spec, each input's shape, strides,
    dtype and device, the bias's alignment, the integer vectors' layouts, and ``others``: more tensors' layouts or
    values ``prepare`` reads): a model calls the op with the same few signatures on every step, and the checks cost
    10-14 us of the host's time a call."""
    signature = (op_name, spec, _layout(q), _layout(k), _layout(v),
                 None if bias is None else (*_layout(bias), bias.data_ptr() % TMA_ALIGN_BYTES == 0),
                 tuple(_layout(t) for t in vectors), *(_layout(x) if isinstance(x, Tensor) else x for x in others))
    call = _checked.get(signature)
    if call is None:
        s = ops.parse_spec(spec)
        ops.validate(q, k, v, op_score_tensors(bias, vectors), s)
        reasons = hopper_reasons(s, q, k)
        if reasons:
            raise ValueError(f"fuse_attn::{op_name} cannot run {plan.describe(s)}: {'; '.join(reasons)}")
        if len(_checked) >= _CHECKED_SIGNATURES:
            _checked.clear()
        call = _checked[signature] = prepare(s, q, k, v, bias, vectors)
    return call


def parsed_spec(spec: AttentionSpec, *inputs) -> AttentionSpec:
    """The ``prepare`` of :func:`checked_call` that keeps only the spec."""
    return spec


def _layout(t: Tensor) -> tuple:
    return t.shape, t.stride(), t.dtype, t.device


_checked: dict[tuple, object] = {}  # what checked_call prepared, by the signatures it passed
_CHECKED_SIGNATURES = 4096  # (a bound: a process calling the ops with ever new shapes starts over past it)


# ---- TMA descriptors and the bias's views ----------------------------------------------------------------------------
def reads_in_place(t: Tensor) -> bool:
    """Whether TMA can read ``t``'s layout where it lies (unit last stride, the others multiples of 16 bytes, none 0:
    a broadcast dim), its base's alignment aside."""
    size = t.element_size()
    return t.stride(-1) == 1 and all(s > 0 and s * size % TMA_ALIGN_BYTES == 0 for s in t.stride()[:-1])


def tma_ready(t: Tensor) -> Tensor:
    """``t`` if TMA can read it where it lies (:func:`reads_in_place`, a 16-byte aligned base), else a contiguous copy
    (a new allocation: ``contiguous()`` would return a contiguous ``t`` of a misaligned base as it is)."""
    if reads_in_place(t) and t.data_ptr() % TMA_ALIGN_BYTES == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


@functools.lru_cache(maxsize=None)
def _tile_layout(rows: int, head_dim: int, dtype: torch.dtype) -> "gl.NVMMASharedLayout":
    """The shared-memory layout of a ``[1, 1, rows, head_dim]`` TMA tile (the same for every call of a shape)."""
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim], _TILE_DTYPES[dtype])


@functools.lru_cache(maxsize=4096)
def descriptor_fields(shape: tuple, strides: tuple, rows: int, cols: int, dtype: torch.dtype) -> dict:
    """A TMA descriptor's fields but its base, for every tensor of this layout: validated once (Triton's constructor
    checks the block, the strides' alignment and the dtype on each call, 3 us of the host's time a descriptor)."""
    validated = TensorDescriptor(torch.empty(0, dtype=dtype), list(shape), list(strides), [1, 1, rows, cols],
                                 _tile_layout(rows, cols, dtype))
    fields = dict(vars(validated))
    del fields["base"]
    return fields


def in_place_fields(t: Tensor, rows: int, cols: int | None = None) -> dict | None:
    """The fields of a descriptor of ``rows`` x ``cols``-tiles (default: every column) over ``t``'s layout where TMA
    reads it in place (:func:`reads_in_place`), for :func:`described`; else None."""
    if not reads_in_place(t):
        return None
    return descriptor_fields(tuple(t.shape), t.stride(), rows, t.shape[3] if cols is None else cols, t.dtype)


def dense_fields(shape: tuple, rows: int, dtype: torch.dtype, cols: int | None = None) -> dict:
    """:func:`descriptor_fields` of a contiguous tensor of ``shape`` (an output or buffer the op allocates), tiles of
    ``rows`` x ``cols`` (default: every column)."""
    return descriptor_fields(shape, tuple(math.prod(shape[d + 1:]) for d in range(len(shape))), rows,
                             shape[-1] if cols is None else cols, dtype)


def with_base(fields: dict, t: Tensor) -> "TensorDescriptor":
    """The descriptor of these fields (:func:`descriptor_fields`, of ``t``'s layout) over ``t``."""
    descriptor = object.__new__(TensorDescriptor)
    vars(descriptor).update(fields, base=t)
    return descriptor


def described(t: Tensor, fields: dict | None, rows: int, cols: int | None = None) -> "TensorDescriptor":
    """A descriptor of ``rows`` x ``cols`` tiles (default: every column) over ``t``, whose layout's fields were
    prepared (:func:`in_place_fields`: None where TMA cannot read that layout in place); over a copy where TMA cannot
    read ``t`` where it lies."""
    if fields is None or t.data_ptr() % TMA_ALIGN_BYTES:
        return tma_descriptor(tma_ready(t), rows, cols)
    return with_base(fields, t)


def tma_descriptor(t: Tensor, rows: int, cols: int | None = None) -> "TensorDescriptor":
    """A 4-D TMA descriptor over ``t`` whose tiles are ``rows`` x ``cols`` (default: every column). ``t`` must be one
    TMA reads where it lies (:func:`tma_ready`; a ValueError for a misaligned base)."""
    if t.data_ptr() % TMA_ALIGN_BYTES:
        raise ValueError(f"a TMA descriptor's base must be {TMA_ALIGN_BYTES}-byte aligned")
    # (the layout's fields validated once: descriptor_fields)
    return with_base(descriptor_fields(tuple(t.shape), t.stride(), rows, t.shape[3] if cols is None else cols, t.dtype),
                     t)


def _strides_tma_reads(strides: list, element_size: int) -> bool:
    """Whether TMA can read a bias of these strides (as the kernels index it:
    :func:`fuse_attn.kernels.generated.launch.broadcast_strides`) in place: keys contiguous, queries not broadcast,
    every other stride a multiple of 16 bytes."""
    return (strides[3] == 1 and strides[2] != 0
            and not any(s * element_size % TMA_ALIGN_BYTES for s in strides[:3]))


def bias_layout_by_tma(bias: Tensor) -> bool:
    """Whether the bias's layout lets TMA read it in place (:func:`bias_tma_view` asks its base's alignment too).
    Fake tensors too (hinted sizes): the implementation choice times the Gluon kernels on a copy of this layout, and
    its key says which path that was."""
    return _strides_tma_reads(broadcast_strides(bias, size_hint), bias.element_size())


def bias_tma_view(bias: Tensor) -> Tensor | None:
    """The bias ``[Z | 1, H | 1, M, N]`` as TMA reads it in place -- the dims it is broadcast over (stride 0 or size 1,
    as the kernels index it: :func:`fuse_attn.kernels.generated.launch.broadcast_strides`) of size 1, keys contiguous,
    rows and the base 16-byte aligned -- or None where TMA cannot (keys or queries broadcast, keys strided, an odd row
    length or base: the kernels load it from global memory instead)."""
    strides = broadcast_strides(bias)
    if not _strides_tma_reads(strides, bias.element_size()) or bias.data_ptr() % TMA_ALIGN_BYTES:
        return None
    shape = [1 if strides[d] == 0 else bias.shape[d] for d in range(4)]
    # a dim of size 1 is never stepped over: its stride need only be one TMA takes (that of a whole bias head)
    whole = bias.shape[2] * strides[2]
    return bias.as_strided(shape, [strides[0] or shape[1] * (strides[1] or whole), strides[1] or whole, strides[2], 1])


# ---- Gluon helpers of both kernels -----------------------------------------------------------------------------------
@gluon.jit
def batch_and_head(bh, Z, H, BATCH_INNER: gl.constexpr):
    """The (batch row, head) of grid row bh of Z * H: heads fastest, or (BATCH_INNER, a bias broadcast over the batch)
    batch rows fastest, so that the CTAs of one head's batch rows run together and share its bias tiles in L2."""
    if BATCH_INNER:
        return bh % Z, bh // Z
    return bh // H, bh % H


@gluon.jit
def bias_of_head(Bias, z, h, stride_bz, stride_bh, HAS_BIAS: gl.constexpr):
    """The bias of batch row z and head h (0 strides where it broadcasts); Bias itself where there is none."""
    if HAS_BIAS:
        return Bias + z.to(gl.int64) * stride_bz + h.to(gl.int64) * stride_bh
    return Bias


@gluon.jit
def bias_tma_head(z, h, stride_bz, stride_bh):
    """The (batch row, head) coordinates in the bias's TMA view (:func:`bias_tma_view`) of batch row z and head h: 0
    along a dim the bias is broadcast over (size 1 there)."""
    return gl.where(stride_bz == 0, 0, z), gl.where(stride_bh == 0, 0, h)


@gluon.jit
def tma_load_parts(desc, z, h, row0, bar, smem, first, PARTS: gl.constexpr, PART_D: gl.constexpr):
    """The tile of ``desc`` at rows row0 on of (z, h) in PARTS column parts of PART_D (:func:`head_dim_part`), into
    buffers first .. first + PARTS - 1 of ``smem``, completing on ``bar``."""
    for part in gl.static_range(PARTS):
        tma_load(desc, [z, h, row0, part * PART_D], bar, smem.index(first + part))


@gluon.jit
def scores_over_parts(q_smem, q_first, k_smem, k_first, s_zero, PARTS: gl.constexpr):
    """q k^T of the q tile in buffers q_first on and the k tile in buffers k_first on, issued (not waited for): one
    wgmma a column part of the head dim (:func:`head_dim_part`), adding up."""
    s = warpgroup_mma(q_smem.index(q_first), k_smem.index(k_first).permute((1, 0)), s_zero, use_acc=False,
                      is_async=True)
    for part in gl.static_range(1, PARTS):
        s = warpgroup_mma(q_smem.index(q_first + part), k_smem.index(k_first + part).permute((1, 0)), s, is_async=True)
    return s


@gluon.jit
def log2_units(bias):
    """A bias tile in log2 units (fp32): one multiply rounded toward zero, which keeps a finite bias finite
    (``finfo.min`` masks: eager's uniform row) and +-inf / NaN as they are (the generated template's ``_to_log2`` on
    the GPU)."""
    return gl.inline_asm_elementwise("mul.rz.f32 $0, $1, 0f3FB8AA3B;", "=r,r", [bias.to(gl.float32)],
                                     dtype=gl.float32, is_pure=True, pack=1)  # 0f3FB8AA3B: log2(e) in fp32


@builtin
def reinterpret_shared(desc, dtype, shape, layout, _semantic=None):
    """The shared memory of ``desc`` seen as a tile of another dtype, shape and layout (Gluon's
    ``shared_memory_descriptor.reinterpret`` in Triton 3.9, ``_reinterpret`` in 3.6: one name for both)."""
    from triton.language.core import _unwrap_if_constexpr

    return _semantic.memdesc_reinterpret(desc, _unwrap_if_constexpr(dtype), [_unwrap_if_constexpr(n) for n in shape],
                                         _unwrap_if_constexpr(layout))


# ---- shared memory and SMs -------------------------------------------------------------------------------------------
def shared_memory_for_tiles(ctas_an_sm: int = 1) -> int:
    """Bytes of shared memory a CTA's tiles may take where ``ctas_an_sm`` CTAs share an SM."""
    return _SHARED_MEMORY_AN_SM // ctas_an_sm - _RESERVED_A_CTA - _BEYOND_THE_TILES


def ctas_at_once(device: torch.device, ctas_an_sm: int = 1) -> int | None:
    """How many CTAs the device's SMs hold at once, ``ctas_an_sm`` on each; None off a GPU (no SMs to count)."""
    sms = sm_count(device)
    return None if sms is None else ctas_an_sm * sms


def fills_at_most(ctas: int, waves: int, device: torch.device, ctas_an_sm: int = 1) -> bool:
    """Whether a grid of ``ctas`` CTAs fills at most ``waves`` waves of the device's SMs, ``ctas_an_sm`` at a time on
    each (off a GPU, no SMs: False). The Gluon kernels' pairing rules ask it."""
    return ctas <= waves * (ctas_at_once(device, ctas_an_sm) or 0)


# ---- the bias's gradient ---------------------------------------------------------------------------------------------
def ds_row_keys(n: int, element_size: int) -> int:
    """The length of a dS buffer's rows: n keys padded so that a row's stride is one TMA takes."""
    per_granule = TMA_ALIGN_BYTES // element_size
    return -(-n // per_granule) * per_granule


def dscore_kv_heads(q: Tensor, k: Tensor, bias: Tensor) -> int:
    """The kv heads a launch of the backward takes where it also stores dS (the gradient of the scores) for the bias's
    gradient, which is dS summed over the dims the bias is broadcast over: as many as keep the dS buffer of a launch
    ``[Z, heads, M, N]`` and the backward's fp32 dQ accumulator within the fp32 gradient buffer that the generated
    template's backward would take instead (the bias's own size), in launches of equal shares (the last may be
    smaller). Only a bias with a head dim of its own is taken in chunks of heads, each chunk's sum its heads' part of
    the gradient. 0 where none fits, below :data:`_DS_MIN_HEAD_DIM`, or where the bias's dtype is not the inputs'
    (eager's dS is then in the bias's dtype, not rounded to the inputs'): the template's backward computes that
    gradient."""
    Z, H, M, D = q.shape
    H_kv, N = k.shape[1], k.shape[2]
    if bias.dtype != q.dtype or D < _DS_MIN_HEAD_DIM:
        return 0
    room = bias.numel() * 4 - Z * H * M * D * 4  # (the template's buffer less the dQ accumulator)
    kv_head_bytes = Z * (H // H_kv) * M * ds_row_keys(N, q.element_size()) * q.element_size()
    if not kv_head_bytes:  # (no rows or keys: nothing to store)
        return H_kv
    if bias.shape[1] != H:
        return H_kv if H_kv * kv_head_bytes <= room else 0
    fitting = min(H_kv, max(room, 0) // kv_head_bytes)
    return -(-H_kv // -(-H_kv // fitting)) if fitting else 0  # (H_kv over as few launches as fit, shared equally)


# ---- the op library --------------------------------------------------------------------------------------------------
# The Gluon ops are defined on a torch.library.Library rather than with torch.library.custom_op: a custom_op's
# dispatch (its Python wrappers and output checks) cost more host time a call than the launcher itself (110-150 us
# on an H100 machine); fake, autograd and kernel are registered the same way. Each op has kernels for CPU and CUDA
# tensors (on CPU ones the forward runs the generated forward: tests without a GPU).
LIBRARY = torch.library.Library("fuse_attn", "FRAGMENT")


def op_score_tensors(bias: Tensor | None, vectors: Sequence[Tensor] = ()) -> list[Tensor]:
    """The op's bias, or its vectors (the score tensors where no bias is added), as the template op's list of score
    tensors."""
    return [bias] if bias is not None else list(vectors)
