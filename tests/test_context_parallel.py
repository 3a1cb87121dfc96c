"""Context parallelism's pieces without processes (the ring itself runs in tests/distributed_context_parallel.py):
the shard layouts and the spec of each (query piece, key piece) pair."""

import pytest
import torch

from fuse_attn.context_parallel import chunk_indices, pair_spec, pieces, unshardable_reason
from fuse_attn.spec import AttentionSpec, CausalMask, ScoreProgramBuilder, ScoreTensor, UnsupportedSpec

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
    return AttentionSpec(dtype="float32", head_dim=8, head_dim_v=8, scale=0.35, score_mod=b.program(root),
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
    spec = AttentionSpec(dtype="float32", head_dim=8, head_dim_v=8, scale=0.35, score_mod=b.program(root))
    pair = pair_spec(spec, 16, 8, 8, 8, 32)
    assert "(kv_idx + 8) - (q_idx + 16)" in pair.describe()


def test_a_band_in_the_program_skips_pairs_only_where_its_fill_is_minus_inf():
    # SDPA's bool form: a pair past the band gives its rows no key (nothing to merge); Hugging Face's eager form: a
    # query with no visible key is uniform over every key of the sequence, so no pair may be skipped
    assert pair_spec(spec_of(form="-inf"), 0, 8, 8, 8, 32) is None
    past = pair_spec(spec_of(form="fill"), 0, 8, 8, 8, 32)
    assert past is not None and past.key_padding().band == -8
    assert pair_spec(spec_of(form="-inf"), 16, 8, 0, 8, 32).key_padding().band == 16
