"""Context parallelism: attention over a sequence sharded across ranks, so unmodified models with their attention
written out (softmax of q @ k^T) train on sequences too long for one GPU.

Each rank holds a shard of the sequence -- of the tokens, and so of q, k and v. torch's ``context_parallel`` only
rewrites SDPA calls; an attention written out would attend over its own shard only (a wrong result). Compiled with
``options={"fuse_attn.context_parallel": ContextParallel(...)}``, the backend replaces every attention it fuses with
:func:`ring_attention`:

* **Ring.** The K/V shards travel around the ranks (``all_to_all_single`` with one peer, a traceable functional
  collective with autograd, issued one step ahead so the transfer overlaps the step's attention). At each step
  every rank attends its queries over the shard it holds with the fused op, which returns the log-sum-exp of each
  row; the partial outputs are merged by it (``out = sum_c exp(lse_c - m) out_c / sum_c exp(lse_c - m)``). The op's
  lse is differentiable, so the backward is autograd's: each step's backward with the gradient of its output and of
  its lse, the K/V gradients sent back along the ring by the collective's backward.
* **Global positions.** Each (query piece, key piece) pair runs with a spec at its global offsets (:func:`pair_spec`):
  a causal band or sliding window becomes a band with the pair's diagonal -- or nothing, where the pair lies wholly
  inside (a full pair) -- and pairs wholly outside are never computed; a score program's ``q_idx`` / ``kv_idx``
  become global positions (ALiBi, windows written into the program), ``q_len`` / ``kv_len`` the global lengths.
* **Load balancing.** With ``load_balance=True`` (the default, as torch's), the sequence is cut into 2W chunks and
  rank r holds chunks r and 2W-1-r, so under a causal mask every rank has the same work.
* **Fallback by gathering.** What the ring cannot serve -- dropout (the keep-mask is drawn from local indices), a
  symbolic sequence length (the pairs' offsets must be constants), queries and keys of different lengths -- runs on
  the gathered sequence: every rank all-gathers q, k, v, computes the whole
  attention and keeps its rows (the unsharded result, at W times the work); the reason is logged once per spec.

A score tensor with a key dim (a padding vector ``[Z, 1, 1, N]``) travels with the K/V shard; one with a query dim is
sliced with the queries. One with both (a materialized ``[.., M, N]`` mask or bias) cannot be sharded: built from
the rank's own positions it describes only the diagonal block of the global matrix. Such an attention, or a
load-balanced shard of odd length, raises :class:`~fuse_attn.score_program.UnsupportedSpec` (the backend leaves it
unfused, with the reason: :func:`unshardable_reason`).

**Uneven sequences.** A sequence that does not cut into the layout's equal chunks (W, or 2W load-balanced) is
sharded only where ``ContextParallel.sequence_length`` names its length: ``shard_sequence`` then cuts it as
``torch.tensor_split`` does (the first chunks one longer), and every attention over it runs on the gathered sequence
(padded to the longest shard for the all-gather), with the reason logged -- the ring's pairs need equal shards. Shards
of other lengths (cut by other means) are refused before anything is computed: an assert on the device compares every
rank's length with the layout's.

Inputs and positions: shard every sequence-dimensioned input with :func:`shard_sequence` (token ids, labels, and the
position ids -- models derive positions from them, e.g. RoPE), and gather outputs with :func:`gather_sequence`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from fuse_attn.kernels import plan
from fuse_attn.score_program import COMPARISON_OPS, ScoreProgramBuilder, UnsupportedSpec, subprogram
from fuse_attn.spec import AttentionSpec, CausalMask

log = logging.getLogger("fuse_attn")


@dataclasses.dataclass(frozen=True)
class ContextParallel:
    """How the sequence is sharded: over ``group`` (None: the default process group), rank r holding positions
    ``[r L, (r + 1) L)`` of a sequence of ``W L``, or with ``load_balance`` chunks r and 2W-1-r of 2W chunks.
    ``sequence_length``: the whole sequence's length where it does not cut into those equal chunks (the module
    docstring's "Uneven sequences"); None where it does."""

    group: Optional[dist.ProcessGroup] = None
    load_balance: bool = True
    sequence_length: Optional[int] = None

    @property
    def group_name(self) -> str:
        return (self.group or dist.group.WORLD).group_name

    def rank_and_size(self) -> tuple[int, int]:
        group = self.group or dist.group.WORLD
        return dist.get_rank(group), dist.get_world_size(group)


def chunk_indices(rank: int, world: int, load_balance: bool) -> list[int]:
    """The chunks of the global sequence (W of them, or 2W load-balanced) that a rank holds, in its local order."""
    return [rank, 2 * world - 1 - rank] if load_balance else [rank]


def pieces(local_len, rank: int, world: int, load_balance: bool) -> list[tuple]:
    """The pieces of the global sequence that a rank holds, in its local order: (local start, global start, length)."""
    chunks = chunk_indices(rank, world, load_balance)
    if isinstance(local_len, int) and local_len % len(chunks):
        raise UnsupportedSpec(f"a load-balanced shard of odd length {local_len} cannot be cut into two chunks")
    size = local_len // len(chunks)
    return [(i * size, chunk * size, size) for i, chunk in enumerate(chunks)]


def is_uneven(total: int, world: int, load_balance: bool) -> bool:
    """Whether a sequence of ``total`` does not cut into the layout's equal chunks (W, or 2W load-balanced)."""
    return total % (2 * world if load_balance else world) != 0


def uneven_total(sequence_length: Optional[int], world: int, load_balance: bool) -> Optional[int]:
    """``ContextParallel.sequence_length`` where it names an uneven sequence (:func:`is_uneven`), else None: the
    ``total`` of :func:`_layouts`, ``sequence_shard`` and ``_gathered``."""
    return sequence_length if sequence_length is not None and is_uneven(sequence_length, world, load_balance) else None


def uneven_pieces(total: int, rank: int, world: int, load_balance: bool) -> list[tuple]:
    """:func:`pieces` of a sequence of ``total`` cut as ``torch.tensor_split`` cuts it into the layout's chunks (the
    first ``total % chunks`` one longer): what ``rank`` holds, (local start, global start, length)."""
    count = 2 * world if load_balance else world
    sizes = [total // count + (1 if c < total % count else 0) for c in range(count)]
    starts = [sum(sizes[:c]) for c in range(count)]
    held, local = [], 0
    for chunk in chunk_indices(rank, world, load_balance):
        held.append((local, starts[chunk], sizes[chunk]))
        local += sizes[chunk]
    return held


def _layouts(local, world: int, load_balance: bool, total: Optional[int]) -> list[list[tuple]]:
    """Every rank's pieces: of equal shards of ``local`` (``total`` None), else of an uneven sequence of ``total``."""
    if total is None:
        return [pieces(local, r, world, load_balance) for r in range(world)]
    return [uneven_pieces(total, r, world, load_balance) for r in range(world)]


def _shard_length(held: list[tuple]) -> int:
    """The length of a rank's shard from its pieces."""
    return sum(size for _, _, size in held)


def shard_sequence(tensor: Tensor, dim: int, cp: ContextParallel = ContextParallel()) -> Tensor:
    """This rank's shard of ``tensor`` (the whole sequence on every rank) along ``dim``, in the layout of ``cp``."""
    rank, world = cp.rank_and_size()
    total = tensor.shape[dim]
    if not is_uneven(total, world, cp.load_balance):
        return sequence_shard(tensor, dim, rank, world, cp.load_balance)
    if cp.sequence_length != total:
        chunks = f"{2 * world} chunks" if cp.load_balance else f"{world} shards"
        raise ValueError(f"a sequence of {total} does not cut into {chunks} of equal length over {world} ranks; "
                         f"ContextParallel(sequence_length={total}) shards it unevenly, its attentions then running on "
                         "the gathered sequence")
    return sequence_shard(tensor, dim, rank, world, cp.load_balance, total)


def sequence_shard(tensor: Tensor, dim: int, rank: int, world: int, load_balance: bool,
             total: Optional[int] = None) -> Tensor:
    """The pieces of the whole sequence ``tensor`` (along ``dim``) that ``rank`` holds, in its local order; ``total``:
    that of an uneven sequence (None: equal shards)."""
    held = _layouts(tensor.shape[dim] // world, world, load_balance, total)[rank]
    return torch.cat([tensor.narrow(dim, start, size) for _, start, size in held], dim)


def gather_sequence(tensor: Tensor, dim: int, cp: ContextParallel = ContextParallel()) -> Tensor:
    """The whole sequence from every rank's shard along ``dim`` (differentiable; the inverse of :func:`shard_sequence`)."""
    rank, world = cp.rank_and_size()
    return _gathered(tensor, dim, cp.group_name, rank, world, cp.load_balance,
                     uneven_total(cp.sequence_length, world, cp.load_balance))


def _gathered(tensor: Tensor, dim: int, group_name: str, rank: int, world: int, load_balance: bool,
              total: Optional[int] = None) -> Tensor:
    """The whole sequence from every rank's shard along ``dim``; ``total``: that of an uneven sequence (each shard is
    then padded to the longest for the all-gather)."""
    from torch.distributed import _functional_collectives as collectives

    # all_gather_single_autograd since torch 2.13, which deprecates the older name
    gather = getattr(collectives, "all_gather_single_autograd", None) or collectives.all_gather_tensor_autograd
    layouts = _layouts(tensor.shape[dim], world, load_balance, total)
    rows = tensor.movedim(dim, 0)
    longest = tensor.shape[dim]
    if total is not None:
        longest = max(_shard_length(held) for held in layouts)
        rows = torch.cat([rows, rows.new_zeros((longest - rows.shape[0], *rows.shape[1:]))], 0)
    stacked = gather(rows.contiguous(), 0, group_name)  # rank-major
    placed = {}  # chunk index -> its rows (the chunk indices are ints, also where the length is symbolic)
    for r, held in enumerate(layouts):
        for chunk, (local_start, _, size) in zip(chunk_indices(r, world, load_balance), held):
            placed[chunk] = stacked.narrow(0, r * longest + local_start, size)
    return torch.cat([placed[chunk] for chunk in sorted(placed)], 0).movedim(0, dim)


def _passed_to_next_rank(t: Tensor, group_name: str, rank: int, world: int) -> Tensor:
    """``t`` of the previous rank (this rank's goes to the next): one step of the ring, with autograd (the gradient
    goes the other way)."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    n = t.shape[0]
    send, receive = [0] * world, [0] * world
    send[(rank + 1) % world] = n
    receive[(rank - 1) % world] = n
    return all_to_all_single_autograd(t.contiguous(), receive, send, group_name)


# ---- specs of the pairs --------------------------------------------------------------------------------------------
def pair_spec(spec: AttentionSpec, q_start: int, q_size: int, kv_start: int, kv_size: int, total: int,
              ) -> Optional[AttentionSpec]:
    """:func:`pair_and_tensors`'s spec."""
    found = pair_and_tensors(spec, q_start, q_size, kv_start, kv_size, total)
    return None if found is None else found[0]


def pair_and_tensors(spec: AttentionSpec, q_start: int, q_size: int, kv_start: int, kv_size: int, total: int,
                     ) -> Optional[tuple[AttentionSpec, list[int]]]:
    """The spec of queries ``[q_start, q_start + q_size)`` over keys ``[kv_start, kv_start + kv_size)`` of a sequence
    of ``total`` positions attended as ``spec`` says -- None where the causal band (the spec's, or one written into
    its program with an -inf padding mask) hides every key from every query of the pair; with the indices of the
    spec's score tensors that the pair's program still reads (:func:`_decided_over_pair` may settle every read of
    one), in the order the pair's spec takes them. Its rows that see no key give 0 (the merge gives them their global
    value). A band written with a masking fill (Hugging Face's eager
    ``finfo.min`` masks) skips no pair: a query with no visible key is uniform over every key of the sequence."""
    causal = None
    padding = plan.key_padding(spec) if spec.causal is None else None
    if padding is not None and padding.kind == "-inf" and padding.band is not None:
        # a causal band written into the program with an -inf padding mask (SDPA's bool form): a pair wholly past it
        # gives its rows no key, which adds nothing to their merge (a row of no key at all is 0 either way)
        if q_size - 1 + q_start - kv_start + padding.band < 0:
            return None
    if spec.causal is not None:
        # global: key g_j visible to query g_i iff g_j <= g_i + offset (and g_j > g_i + offset - window)
        d = q_start - kv_start + spec.causal.offset(total, total)
        window = spec.causal.window
        if q_size - 1 + d < 0 or (window is not None and d - window >= kv_size - 1):
            return None
        if not (d >= kv_size - 1 and (window is None or q_size - 1 + d - window < 0)):
            causal = CausalMask(diagonal=d, alignment="top_left", window=window)
    program, read = _decided_over_pair(at_global_positions(spec, q_start, kv_start, total), q_size, kv_size)
    return dataclasses.replace(spec, causal=causal, score_program=program, score_tensors=tuple(
        spec.score_tensors[i] for i in read), empty_rows="zero", q_len=q_size, kv_len=kv_size), read


def at_global_positions(spec: AttentionSpec, q_start: int, kv_start: int, total: int) -> tuple:
    """The score program with each position and length leaf read at the pair's global offsets."""
    if not spec.score_program:
        return ()
    b = ScoreProgramBuilder()
    new = []
    for node in spec.score_program:
        if node.op in ("q_idx", "kv_idx") and (q_start if node.op == "q_idx" else kv_start):
            new.append(b.add("add", b.add(node.op), b.const(q_start if node.op == "q_idx" else kv_start)))
        elif node.op in ("q_len", "kv_len"):
            new.append(b.const(total))
        else:
            new.append(b.add(node.op, *(new[a] for a in node.args), value=node.value))
    return b.program(new[-1])


def _decided_over_pair(program: tuple, q_size: int, kv_size: int) -> tuple[tuple, list[int]]:
    """``program`` with its integer arithmetic of positions in a normal form and its comparisons settled where they
    can be, for a pair of ``q_size`` queries and ``kv_size`` keys -- exactly (integer positions):

    * a sum or difference of offset positions is written as the positions' own sum or difference plus one constant:
      ``(kv_idx + a) - (q_idx + b)`` reads ``(kv_idx - q_idx) + (a - b)``, and a comparison moves the constants to
      its right side: ``kv_idx + a <= q_idx + b`` reads ``kv_idx <= q_idx + (b - a)``;
    * a comparison that holds for every element of the pair, or for none, becomes True or False, and the ``where``,
      ``&``, ``|`` and ``~`` it feeds are simplified.

    So the pairs of the ring share a program -- and a spec, and so their compiled kernels and tuned configs -- where
    their offsets differ by the same amount (an ALiBi distance: one spec per diagonal instead of one per pair), and
    where the band of a mask written into the program is wholly visible (full pairs), wholly hidden, or has the same
    diagonal (three specs for a causal mask).

    Returns the program and the score tensors it still reads (their old indices, renumbered 0, 1, ... in it)."""
    if not program:
        return program, []
    b = ScoreProgramBuilder()
    new: list[int] = []
    ranges: list[Optional[tuple[int, int]]] = []  # per node: the integer values it takes over the pair, if known
    # per integer node: (base, c) with the node = base + c, base a new node of positions (None: the constant c)
    affine: list[Optional[tuple[Optional[int], int]]] = []

    def boolean(i: int) -> Optional[bool]:
        node = b.nodes[i]
        return node.value if node.op == "const" and type(node.value) is bool else None

    def plus(base: Optional[int], c: int) -> int:
        """The node base + c."""
        return b.const(c) if base is None else base if c == 0 else b.add("add", base, b.const(c))

    def combined(op: str, left: Optional[int], right: Optional[int]) -> Optional[int]:
        """The node left op right of two bases (None: 0)."""
        if right is None:
            return left
        if left is None:
            return right if op == "add" else b.add("neg", right)
        return b.add(op, left, right)

    for node in program:
        args = [new[a] for a in node.args]
        arg_ranges = [ranges[a] for a in node.args]
        arg_affine = [affine[a] for a in node.args]
        value_range, form, result = None, None, None
        if node.op in ("q_idx", "kv_idx"):
            result = b.add(node.op)
            value_range, form = (0, (q_size if node.op == "q_idx" else kv_size) - 1), (result, 0)
        elif node.op == "const" and type(node.value) is int:
            value_range, form = (node.value, node.value), (None, node.value)
        elif node.op in ("add", "sub") and None not in arg_ranges and None not in arg_affine:
            (a_lo, a_hi), (b_lo, b_hi) = arg_ranges
            value_range = (a_lo + b_lo, a_hi + b_hi) if node.op == "add" else (a_lo - b_hi, a_hi - b_lo)
            (left, a), (right, c) = arg_affine
            form = (combined(node.op, left, right), a + c if node.op == "add" else a - c)
            result = plus(*form)
        elif node.op in COMPARISON_OPS and None not in arg_ranges:
            settled = _settled(node.op, *arg_ranges)
            if settled is not None:
                result = b.const(settled)
            elif None not in arg_affine:
                (left, a), (right, c) = arg_affine
                result = (b.add(node.op, left, plus(right, c - a)) if left is not None else
                          b.add(node.op, b.const(a - c), right))
        elif node.op in ("logical_and", "logical_or"):
            absorbing = node.op == "logical_or"  # True absorbs an or, False an and
            known = [boolean(a) for a in args]
            if absorbing in known:
                result = b.const(absorbing)
            elif (not absorbing) in known:
                result = args[1] if known[0] is not None else args[0]
        elif node.op == "logical_not" and boolean(args[0]) is not None:
            result = b.const(not boolean(args[0]))
        elif node.op == "where" and boolean(args[0]) is not None:
            result = args[1] if boolean(args[0]) else args[2]
        if result is None:
            result = b.add(node.op, *args, value=node.value)
        new.append(result)
        ranges.append(value_range)
        affine.append(form)
    built = b.program(new[-1])
    settled = subprogram(built, len(built) - 1)  # one node order per expression, whichever pair built it
    read = sorted({node.value for node in settled if node.op == "load"})
    renumbered = {old: i for i, old in enumerate(read)}
    return tuple(dataclasses.replace(node, value=renumbered[node.value]) if node.op == "load" else node
                 for node in settled), read


def _settled(op: str, left: tuple[int, int], right: tuple[int, int]) -> Optional[bool]:
    """``left op right`` where the two sides take values in the ranges ``left`` and ``right``: True or False if it
    is the same for every pair of values, else None."""
    (a_lo, a_hi), (b_lo, b_hi) = left, right
    if op in ("gt", "ge"):
        return _settled("lt" if op == "gt" else "le", right, left)
    if op == "lt":
        return True if a_hi < b_lo else False if a_lo >= b_hi else None
    if op == "le":
        return True if a_hi <= b_lo else False if a_lo > b_hi else None
    apart = a_hi < b_lo or b_hi < a_lo
    same = a_lo == a_hi == b_lo == b_hi
    equal = True if same else False if apart else None
    return equal if op == "eq" or equal is None else not equal


# ---- the ring ------------------------------------------------------------------------------------------------------
def ring_attention(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec, score_tensors: Sequence[Tensor] = (),
                   dropout_seed: Optional[Tensor] = None, cp: ContextParallel = ContextParallel()) -> Tensor:
    """Attention as ``spec`` says over the whole sequence, from this rank's shards (``[Z, H, L, D]``, laid out as
    ``cp`` says) -- this rank's rows of the output. Differentiable; traceable by torch.compile."""
    rank, world = cp.rank_and_size()
    return ring_attention_call(q, k, v, list(score_tensors), dropout_seed, spec.to_json(), cp.group_name, rank, world,
                               cp.load_balance, cp.sequence_length)


def ring_attention_call(q: Tensor, k: Tensor, v: Tensor, score_tensors: list, dropout_seed: Optional[Tensor],
                        spec_json: str, group_name: str, rank: int, world: int, load_balance: bool,
                        sequence_length: Optional[int] = None) -> Tensor:
    """:func:`ring_attention` with plain arguments: what the backend's rewritten graph calls."""
    from fuse_attn.kernels import flash_attention

    spec = AttentionSpec.from_json(spec_json)
    uneven = uneven_total(sequence_length, world, load_balance)
    problem = unshardable_reason(q.shape[2], [t.shape for t in score_tensors], load_balance, uneven)
    if problem is not None:
        raise UnsupportedSpec(f"context parallel: {problem}")
    if uneven is None:
        _assert_shard_lengths(q, group_name, None)
        reason = _gather_reason(spec, q, k, score_tensors)
    else:
        lengths = [_shard_length(held) for held in _layouts(None, world, load_balance, uneven)]
        _assert_shard_lengths(q, group_name, lengths)
        reason = f"a sequence of {uneven} sharded unevenly over {world} ranks: the ring's pairs need equal shards"
    if reason is not None:
        _log_gathered(plan.describe(spec), reason)
        gather = functools.partial(_gathered, group_name=group_name, rank=rank, world=world, load_balance=load_balance,
                                   total=uneven)
        tensors = [_gather_score_tensor(t, gather) for t in score_tensors]
        out = flash_attention(gather(q, 2), gather(k, 2), gather(v, 2), spec, tensors, dropout_seed=dropout_seed)
        return sequence_shard(out, 2, rank, world, load_balance, uneven)

    local = q.shape[2]
    total = local * world
    q_pieces = pieces(local, rank, world, load_balance)
    query_dim = [t.dim() == 4 and t.shape[2] != 1 for t in score_tensors]
    key_dim = [t.dim() == 4 and t.shape[3] != 1 for t in score_tensors]
    ring = _RingPack([k, v] + [t for t, has in zip(score_tensors, key_dim) if has])
    partials = [[] for _ in q_pieces]  # per query piece: (out, lse, the band's key counts) of each pair
    # Every rank must run the backward of every step's collective (it is one on both sides), so a shard that no pair
    # of this rank reads (causal, contiguous shards: the later ranks' keys) still joins the graph: through an empty
    # slice's sum, an exact 0 whatever it holds.
    unread = q.new_zeros(())
    held = ring.pack
    for step in range(world):
        source = (rank - step) % world
        # the next step's shards, requested before this step computes (the collective overlaps the attention)
        following = [_passed_to_next_rank(t, group_name, rank, world) for t in held] if step < world - 1 else None
        held_k, held_v, *held_keyed = ring.unpack(held)
        keyed = iter(held_keyed)
        held_tensors = [next(keyed) if has else t for t, has in zip(score_tensors, key_dim)]
        read = False
        for kv_local, kv_start, kv_size in pieces(local, source, world, load_balance):
            for (q_local, q_start, q_size), found in zip(q_pieces, partials):
                found_pair = pair_and_tensors(spec, q_start, q_size, kv_start, kv_size, total)
                if found_pair is None:
                    continue
                pair, pair_reads = found_pair
                read = True
                tensors = [t.narrow(3, kv_local, kv_size) if kd else t for t, kd in zip(held_tensors, key_dim)]
                tensors = [t.narrow(2, q_local, q_size) if qd else t for t, qd in zip(tensors, query_dim)]
                tensors = [tensors[i] for i in pair_reads]
                out, lse = flash_attention(q.narrow(2, q_local, q_size), held_k.narrow(2, kv_local, kv_size),
                                           held_v.narrow(2, kv_local, kv_size), pair, tensors, return_lse=True)
                found.append((out, lse, _band_counts(pair, q_size, kv_size, q.device)))
        if not read and step:
            unread = unread + sum(t.narrow(0, 0, 0).sum() for t in held if t.is_floating_point())
        held = following
    outs = [_merged(found, spec, q.narrow(2, start, size), v) for (start, _, size), found in zip(q_pieces, partials)]
    return torch.cat(outs, 2) + unread.to(q.dtype)


class _RingPack:
    """The tensors that travel around the ring, as few collectives per step as their dtypes allow: K, V and the key
    score tensors of their dtype flattened into one buffer, each other dtype (a bool padding vector) in its own. One
    differentiable buffer per step means one chain of backward collectives, run in the same order on every rank
    (two independent chains could be run in different orders by two ranks' autograd engines: a deadlock, or
    gradients exchanged crossed)."""

    def __init__(self, tensors: list):
        self.shapes = [t.shape for t in tensors]
        self.dtypes = sorted({t.dtype for t in tensors}, key=lambda d: d != tensors[0].dtype)
        self.members = [[i for i, t in enumerate(tensors) if t.dtype == d] for d in self.dtypes]
        self.pack = [torch.cat([tensors[i].reshape(-1) for i in members]) for members in self.members]

    def unpack(self, pack: list) -> list:
        tensors = [None] * len(self.shapes)
        for members, flat in zip(self.members, pack):
            sizes = [self.shapes[i].numel() for i in members]
            for i, part in zip(members, flat.split(sizes)):
                tensors[i] = part.view(self.shapes[i])
        return tensors


def _band_counts(pair: AttentionSpec, q_size: int, kv_size: int, device) -> Tensor:
    """How many keys of the pair the causal band leaves each query row, [q_size] fp32."""
    if pair.causal is None:
        return torch.full((q_size,), float(kv_size), device=device)
    i = torch.arange(q_size, device=device)
    hi = (i + pair.causal.diagonal).clamp(max=kv_size - 1)
    window = pair.causal.window
    lo = (i + pair.causal.diagonal - window + 1).clamp(min=0) if window is not None else torch.zeros_like(i)
    return (hi - lo + 1).clamp(min=0).float()


def _merged(found: list, spec: AttentionSpec, q: Tensor, v: Tensor) -> Tensor:
    """Partial outputs of one query piece (``q``) merged by their lse: ``sum_c w_c out_c / sum_c w_c`` with
    ``w_c = exp(lse_c - m)``, m the rows' largest lse (a constant: the result does not depend on it). A row that saw
    no key anywhere gets 0, or NaN where the spec's empty rows are NaN (eager's softmax of all -inf).

    A row whose every score is a fill so large that fp32 absorbs the scores (``s + finfo.min == finfo.min``: Hugging
    Face's eager masks, a query that sees only padding) has ``lse_c = fill``, the ``log(n_c)`` of its n_c keys
    absorbed too; eager's softmax of that row is uniform over all its keys, so such a pair weighs ``n_c`` times (the
    band's count: the fill is all that masks a spec whose padding is skipped,
    :func:`fuse_attn.kernels.plan.key_padding`)."""
    if not found:  # the band hides every key of the sequence from the piece
        Z, H, M, _ = q.shape
        fill = float("nan") if spec.empty_rows == "nan" else 0.0
        return torch.full((Z, H, M, v.shape[3]), fill, dtype=q.dtype, device=q.device)
    outs = torch.stack([out.float() for out, _, _ in found])
    lses = torch.stack([lse for _, lse, _ in found])
    counts = torch.stack([count for _, _, count in found])[:, None, None, :]
    m = lses.detach().amax(0)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    absorbed = torch.isfinite(lses) & (lses.detach() + torch.log(counts) == lses.detach())
    weights = torch.exp(lses - m) * torch.where(absorbed, counts, torch.ones_like(counts))
    total = weights.sum(0)
    empty = total == 0
    merged = (weights[..., None] * outs).sum(0) / torch.where(empty, torch.ones_like(total), total)[..., None]
    if spec.empty_rows == "nan":
        merged = torch.where(empty[..., None], torch.full_like(merged, float("nan")), merged)
    return merged.to(q.dtype)


def unshardable_reason(q_len, score_tensor_shapes: Sequence, load_balance: bool,
                       uneven_length: Optional[int] = None) -> Optional[str]:
    """Why an attention cannot run on a sharded sequence at all -- not even gathered -- or None. ``uneven_length``:
    the length of a sequence sharded unevenly (its shards need not cut into two equal chunks)."""
    for i, shape in enumerate(score_tensor_shapes):
        if len(shape) == 4 and shape[2] != 1 and shape[3] != 1:
            return (f"score tensor {i} {tuple(shape)} spans query and key positions; built from a rank's own shard it "
                    "holds only the diagonal block of the global matrix")
    if load_balance and uneven_length is None and isinstance(q_len, int) and q_len % 2:
        return f"a shard of odd length {q_len} is no load-balanced layout (two chunks of equal length)"
    return None


def _gather_reason(spec: AttentionSpec, q: Tensor, k: Tensor, score_tensors: Sequence[Tensor]) -> Optional[str]:
    """Why the ring cannot serve this attention (it then runs on the gathered sequence), or None."""
    local = q.shape[2]
    if any(t.requires_grad and t.dtype != k.dtype and t.dim() == 4 and t.shape[3] != 1 for t in score_tensors):
        return "a key-sized score tensor needing a gradient in a dtype other than k's: a second chain of collectives"
    if spec.dropout_p:
        return "dropout: the keep-mask is drawn from the kernels' local indices"
    if not isinstance(local, int) or not isinstance(k.shape[2], int):
        return "a symbolic sequence length: the ring's pairs need constant offsets"
    if k.shape[2] != local:
        return f"queries ({local}) and keys ({k.shape[2]}) of different lengths: not one sharded sequence"
    return None


def _assert_shard_lengths(q: Tensor, group_name: str, expected: Optional[list]) -> None:
    """Every rank must hold a shard of the layout's length: this rank's (``expected`` None: equal shards), or
    ``expected[r]`` for rank r of an uneven sequence -- as ``shard_sequence`` cuts them. Shards cut by other means
    would exchange rows that do not line up (a wrong result or a stalled collective), so their lengths are compared
    on the device first: one all-gather of an int per call and an asynchronous assert (no host sync), which stops
    the run with this message."""
    from torch.distributed import _functional_collectives as collectives

    local = torch.full((1,), q.shape[2], dtype=torch.int64, device=q.device)
    lengths = collectives.all_gather_tensor(local, 0, group_name)
    wanted = local if expected is None else torch.tensor(expected, dtype=torch.int64, device=q.device)
    torch._assert_async(torch.all(lengths == wanted),
                        "fuse_attn context parallel: the ranks hold sequence shards of different lengths from the "
                        "layout's; shard the sequence with fuse_attn.graph.context_parallel.shard_sequence (one of uneven "
                        "length with ContextParallel(sequence_length=...))")


def _gather_score_tensor(t: Tensor, gather) -> Tensor:
    if t.dim() == 4 and t.shape[2] != 1:
        return gather(t, 2)
    if t.dim() == 4 and t.shape[3] != 1:
        return gather(t, 3)
    return t


@functools.lru_cache(maxsize=256)
def _log_gathered(spec_text: str, reason: str) -> None:  # once per spec and reason
    log.warning("fuse_attn: context parallel: %s runs on the gathered sequence (%s)", spec_text, reason)
