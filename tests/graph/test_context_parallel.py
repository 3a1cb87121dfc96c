"""Context parallelism's pieces without processes (the ring itself runs in tests/e2e/distributed_context_parallel.py):
the shard layouts and the spec of each (query piece, key piece) pair."""

import dataclasses

import pytest
import torch

from fuse_attn.kernels import plan
from fuse_attn.graph.context_parallel import (at_global_positions, sequence_shard, chunk_indices, is_uneven, pair_and_tensors,
                                        pair_spec, pieces, uneven_pieces, unshardable_reason)
from fuse_attn.kernels.reference import score_program_values
from fuse_attn.spec import AttentionSpec, CausalMask
from fuse_attn.score_program import ScoreProgramBuilder, ScoreTensor, UnsupportedSpec

PADDING = ScoreTensor("mask", "bool", (False, True, True, False))


def spec_of(causal=None, form=None) -> AttentionSpec:
    """Plain (``causal`` in the spec), or padding and a causal band written into one mask: SDPA's bool form
    ("-inf") or Hugging Face's eager additive one ("fill")."""
    if form is None:
        return AttentionSpec(dtype="float32", head_dim=8, head_dim_v=8, scale=0.35, causal=causal)
    b = ScoreProgramBuilder()
    s, visible = b.add("score"), b.add("logical_and", b.add("le", b.add("kv_idx"), b.add("q_idx")), b.add("load", value=0))
    root = (b.add("where", b.add("logical_not", visible), b.const(float("-inf")), s) if form == "-inf" else
            b.add("add", s, b.add("where", visible, b.const(0.0), b.const(torch.finfo(torch.float32).min))))
    return AttentionSpec(dtype="float32", head_dim=8, head_dim_v=8, scale=0.35, score_program=b.program(root),
                         score_tensors=(PADDING,), empty_rows="zero" if form == "-inf" else "nan")


def test_load_balanced_shards_hold_a_chunk_from_each_end():
    assert [chunk_indices(r, 2, True) for r in range(2)] == [[0, 3], [1, 2]]
    assert pieces(8, 1, 2, True) == [(0, 4, 4), (4, 8, 4)]
    assert pieces(8, 1, 2, False) == [(0, 8, 8)]
    with pytest.raises(UnsupportedSpec):
        pieces(7, 0, 2, True)
    assert unshardable_reason(7, [], True) is not None and unshardable_reason(7, [], False) is None
    assert "spans query and key positions" in unshardable_reason(8, [(1, 1, 8, 8)], True)
    assert unshardable_reason(8, [(2, 1, 1, 8), (1, 4, 1, 1)], True) is None


@pytest.mark.parametrize("load_balance", [True, False])
def test_an_uneven_sequence_is_cut_as_tensor_split_cuts_it(load_balance):
    # 23 positions over 2 ranks: chunks of 6, 6, 6, 5 (load-balanced) or 12, 11; every position held once, in order
    assert is_uneven(23, 2, load_balance) and is_uneven(22, 2, True) and not is_uneven(22, 2, False)
    count = 4 if load_balance else 2
    sizes = [len(c) for c in torch.arange(23).tensor_split(count)]
    held = [uneven_pieces(23, rank, 2, load_balance) for rank in range(2)]
    by_chunk = {chunk: piece for rank in range(2) for chunk, piece in zip(chunk_indices(rank, 2, load_balance), held[rank])}
    assert [by_chunk[c][2] for c in range(count)] == sizes
    assert [by_chunk[c][1] for c in range(count)] == [sum(sizes[:c]) for c in range(count)]
    positions = torch.arange(23)[None]
    shards = [sequence_shard(positions, 1, rank, 2, load_balance, total=23) for rank in range(2)]
    assert [s.shape[1] for s in shards] == [sum(p[2] for p in h) for h in held]
    assert sorted(torch.cat(shards, 1)[0].tolist()) == list(range(23))
    # a shard of odd length is fine there: the uneven sequence runs gathered, not as two chunks of a ring
    assert unshardable_reason(11, [], True, uneven_length=23) is None


@pytest.mark.parametrize("q_start, kv_start, expected", [
    (8, 8, "diagonal"),  # the same chunk: the band from its diagonal 0
    (16, 0, "full"),  # keys wholly before the queries: no mask
    (0, 8, None),  # keys wholly after: skipped
    (4, 8, "partial"),  # overlapping: the band with the pair's diagonal
])
def test_pairs_of_a_causal_spec(q_start, kv_start, expected):
    pair = pair_spec(spec_of(CausalMask()), q_start, 8, kv_start, 8, 32)
    if expected is None:
        assert pair is None
        return
    assert pair.empty_rows == "zero" and (pair.q_len, pair.kv_len) == (8, 8)
    assert pair.causal == {"diagonal": CausalMask(), "full": None,
                           "partial": CausalMask(diagonal=q_start - kv_start)}[expected]


def test_window_pairs_beyond_the_window_are_skipped():
    spec = spec_of(CausalMask(window=4))
    assert pair_spec(spec, 16, 8, 0, 8, 32) is None  # every key more than 4 positions back
    assert pair_spec(spec, 8, 8, 0, 8, 32).causal == CausalMask(diagonal=8, window=4)


def test_positions_in_the_program_become_global():
    b = ScoreProgramBuilder()
    root = b.add("add", b.add("score"), b.add("to_float", b.add("sub", b.add("kv_idx"), b.add("q_idx"))))
    spec = AttentionSpec(dtype="float32", head_dim=8, head_dim_v=8, scale=0.35, score_program=b.program(root))
    pair = pair_spec(spec, 16, 8, 8, 8, 32)
    assert "to_float((kv_idx - q_idx) - 8)" in pair.describe()  # (kv_idx + 8) - (q_idx + 16), constants gathered
    # an ALiBi distance: the pairs of a 2-rank load-balanced ring share one spec per diagonal of the chunk grid
    specs = {pair_spec(spec, q_start, 8, kv_start, 8, 32) for q_start in range(0, 32, 8) for kv_start in range(0, 32, 8)}
    assert len(specs) == 7


def test_a_band_in_the_program_skips_pairs_only_where_its_fill_is_minus_inf():
    # SDPA's bool form: a pair past the band gives its rows no key (nothing to merge); Hugging Face's eager form: a
    # query with no visible key is uniform over every key of the sequence, so no pair may be skipped
    assert pair_spec(spec_of(form="-inf"), 0, 8, 8, 8, 32) is None
    past = pair_spec(spec_of(form="fill"), 0, 8, 8, 8, 32)
    assert past is not None and past.describe().endswith("s - 3.40282e+38 empty rows 0")  # every key at the fill
    assert not past.score_tensors  # the band is settled (hidden), so the padding is no longer read
    before = plan.key_padding(pair_spec(spec_of(form="-inf"), 16, 8, 0, 8, 32))
    assert before.tensor == 0 and before.band is None  # the band is settled (visible): only the padding masks


@pytest.mark.parametrize("form", ["fill", "-inf"])
def test_the_pairs_of_a_ring_share_three_specs(form):
    """2 ranks, load-balanced: of the 16 (query chunk, key chunk) pairs, the four on the diagonal share the band
    kv_idx <= q_idx, the six before it read only the padding, the six after it are at the fill everywhere (or skipped:
    -inf) -- so the ring compiles and tunes three sets of kernels, not one per pair."""
    specs = {}
    for rank in range(2):
        for source in range(2):
            for _, q_start, q_size in pieces(16, rank, 2, True):
                for _, kv_start, kv_size in pieces(16, source, 2, True):
                    found = pair_and_tensors(spec_of(form=form), q_start, q_size, kv_start, kv_size, 32)
                    specs.setdefault(None if found is None else found[0], []).append((q_start, kv_start))
    assert sorted(map(len, specs.values())) == [4, 6, 6]
    assert [p for p, pairs in specs.items() if (0, 0) in pairs][0].describe().startswith(
        "float32 D=8 M=8 N=8 scale=0.35 s -> " + ("s + where((kv_idx <= q_idx) & mask0" if form == "fill" else
                                                  "where(logical_not((kv_idx <= q_idx) & mask0"))


def window_spec() -> AttentionSpec:
    """A window of 5 and an ALiBi-like distance, written with offsets on both sides of the comparison."""
    b = ScoreProgramBuilder()
    q, kv = b.add("q_idx"), b.add("kv_idx")
    inside = b.add("logical_and", b.add("le", b.add("add", kv, b.const(2)), b.add("add", q, b.const(2))),
                   b.add("lt", b.add("sub", q, kv), b.const(5)))
    distance = b.add("mul", b.add("to_float", b.add("sub", kv, q)), b.const(0.5))
    root = b.add("where", inside, b.add("add", b.add("score"), distance), b.const(float("-inf")))
    return AttentionSpec(dtype="float32", head_dim=8, head_dim_v=8, scale=0.35, score_program=b.program(root))


@pytest.mark.parametrize("spec", [spec_of(form="fill"), spec_of(form="-inf"), window_spec()], ids=["fill", "-inf", "window"])
@pytest.mark.parametrize("q_start, kv_start", [(8, 8), (16, 0), (0, 8), (16, 8), (8, 4), (4, 9), (14, 8), (15, 8), (1, 8)])
def test_a_pair_program_computes_what_the_global_program_does(spec, q_start, kv_start):
    """The settled program of a pair, on the pair's tensors, equals the program at global positions element for
    element (the settling is exact, not an approximation)."""
    found = pair_and_tensors(spec, q_start, 8, kv_start, 8, 32)
    if found is None:
        return
    pair, read = found
    g = torch.Generator().manual_seed(q_start * 32 + kv_start)
    s = torch.randn(2, 1, 8, 8, generator=g)
    padding = [torch.rand(2, 1, 1, 8, generator=g) < 0.7] if spec.score_tensors else []
    at_global = dataclasses.replace(pair, score_program=at_global_positions(spec, q_start, kv_start, 32),
                                    score_tensors=spec.score_tensors)
    expected = score_program_values(s, padding, at_global, 0, 8, 8)[-1]
    settled = score_program_values(s, [padding[i] for i in read], pair, 0, 8, 8)[-1]
    assert torch.equal(settled, expected)
