"""The Gluon forward and backward of attention masked by a key padding vector (Hugging Face's padded batches: the
``MASK_BLOCKS`` paths of fuse_attn/kernels/hopper/ over the tiles fuse_attn/kernels/hopper/key_range_tiles.py lists).

On the CPU: which specs the kernels take (transformers' eager padding + causal mask written as one, BERT's added
padding bias, SDPA's bool mask), the listing rule against the probabilities themselves (no tile left out holds a
nonzero probability, and every full tile's program is the plain score), the listing kernel (Triton's interpreter)
against its PyTorch reference, and the compiled path's wiring. On an sm90 GPU: output, lse and the gradients of q,
k and v against fp64 under the 2x rule, with the bad inputs the listing must not change -- a batch row with no
visible key, left padding, holes inside the visible keys."""

from __future__ import annotations

import pytest
import torch

from fuse_attn.kernels.hopper.common import hopper_reasons, pads_keys
from fuse_attn.kernels.hopper.key_range_tiles import KeyRangeTiles, reference_key_range_tiles
from fuse_attn.kernels.reference import score_program_values, softmax_of_spec
from fuse_attn.score_program import ScoreProgramBuilder, ScoreTensor
from fuse_attn.spec import AttentionSpec
from tests.support.compiled_modules import INTERPRETER_SESSION
from tests.support.gluon_op import (fake_qk, gluon_compile_trains_as_eager, gluon_op_matches_fp64_on_random_inputs,
                                    hopper)

KEYS = (False, True, True, False)  # a [Z, 1, 1, N] vector
FINFO_MIN = torch.finfo(torch.bfloat16).min  # (transformers fills with the model dtype's)
FORMS = ("hf_causal", "bert", "sdpa", "sdpa_zero")


def padding_spec(form: str, head_dim: int = 128, gqa_group: int = 1) -> AttentionSpec:
    """A key padding mask as models write it. "hf_causal": transformers' eager decoder mask, padding and the causal
    band as one, ``s + where(padded, finfo.min, where(kv_idx >= q_idx + 1, finfo.min, 0))``; "bert": BERT's
    ``s + (1 - attention_mask) * finfo.min``, a bias vector; "sdpa": ``where(keep, s, -inf)`` of a bool vector
    (eager's NaN for a row of no key), "sdpa_zero" the same with ``empty_rows="zero"`` (SDPA's 0)."""
    b = ScoreProgramBuilder()
    s = b.add("score")
    empty_rows = "zero" if form == "sdpa_zero" else "nan"
    if form == "hf_causal":
        band = b.add("ge", b.add("kv_idx"), b.add("add", b.add("q_idx"), b.const(1)))
        causal = b.add("where", band, b.const(FINFO_MIN), b.const(0.0))
        root = b.add("add", s, b.add("where", b.load(0, "bool"), b.const(FINFO_MIN), causal))
        tensor = ScoreTensor("mask", "bool", KEYS)
    elif form == "bert":
        root = b.add("add", s, b.load(0, "float"))
        tensor = ScoreTensor("bias", "bfloat16", KEYS)
    else:
        root = b.add("where", b.load(0, "bool"), s, b.const(float("-inf")))
        tensor = ScoreTensor("mask", "bool", KEYS)
    return AttentionSpec(dtype="bfloat16", head_dim=head_dim, head_dim_v=head_dim, scale=head_dim ** -0.5,
                         score_program=b.program(root), score_tensors=(tensor,), gqa_group=gqa_group,
                         empty_rows=empty_rows)


def visible_keys(N: int) -> torch.Tensor:
    """[6, N] bool, which keys each batch row keeps: all; right padding to 60%; none (an empty sequence); left padding
    of 30% and a hole of 5 keys inside the rest; the last key only; the first key only."""
    keys = torch.arange(N)
    hole = (keys >= N // 2) & (keys < N // 2 + 5)
    return torch.stack([keys >= 0, keys < (3 * N + 4) // 5, keys < 0, (keys >= (3 * N) // 10) & ~hole,
                        keys == N - 1, keys == 0])


def padding_vector(form: str, visible: torch.Tensor, device="cpu") -> torch.Tensor:
    """The spec's score tensor for the kept keys ``visible`` [Z, N]: True where padded ("hf_causal"), the bias, or True
    where kept (SDPA's)."""
    if form == "hf_causal":
        vector = ~visible
    elif form == "bert":
        vector = (1.0 - visible.to(torch.bfloat16)) * FINFO_MIN
    else:
        vector = visible
    return vector[:, None, None, :].to(device)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_kernels_take_a_key_padding_vector(form, head_dim, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    spec = padding_spec(form, head_dim)
    assert pads_keys(spec)
    assert hopper_reasons(spec, *fake_qk(256, 256, head_dim=head_dim)) == []
    # (with the spec's own causal mask beside the vector the template takes it: test_hopper_forward's reasons)


def test_the_causal_band_of_a_padding_mask_halves_the_steps_flops():
    """The least step the Gluon kernels are offered at (dispatch.GLUON_MIN_STEP_FLOPS) counts the work of a causal
    band written into the mask (transformers' padding + causal mask) as that of the spec's own causal mask."""
    from fuse_attn.kernels.dispatch import _step_flops

    q = k = torch.empty(2, 4, 256, 128)
    assert _step_flops(padding_spec("hf_causal"), q, k, True) == _step_flops(padding_spec("bert"), q, k, True) / 2


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("key_major", [False, True])
@pytest.mark.parametrize("M, rows, cols", [(77, 16, 16), (77, 32, 16), (100, 16, 32)])
def test_the_listed_tiles_hold_every_probability_and_full_tiles_are_plain(form, key_major, M, rows, cols):
    """The rule itself (``reference_key_range_tiles``), against eager's probabilities in fp64 on random scores: a
    (query block, key tile) pair it does not list has probability exactly 0 at every entry, and where it lists the
    pair full the program leaves every score as it is."""
    spec = padding_spec(form)
    vector = padding_vector(form, visible_keys(M))
    g = torch.Generator().manual_seed(M + rows + cols)
    s = torch.randn(vector.shape[0], 1, M, M, generator=g, dtype=torch.float64) * 4
    values = score_program_values(s, [vector.double() if form == "bert" else vector], spec, 0, M, M)[-1]
    p = softmax_of_spec(values, spec).nan_to_num(nan=1.0)  # (a row of eager NaN: every key counts as seen)
    lists = reference_key_range_tiles(spec, vector, M, M, rows, cols, key_major)
    for z, per_outer in enumerate(lists):
        for outer, (full, partial) in enumerate(per_outer):
            for inner in range(-(-M // (cols if not key_major else rows))):
                block, tile = (inner, outer) if key_major else (outer, inner)
                at = (z, 0, slice(block * rows, (block + 1) * rows), slice(tile * cols, (tile + 1) * cols))
                if inner in full:
                    assert torch.equal(values[at], s[at]), (z, block, tile)
                elif inner not in partial:
                    assert (p[at] == 0).all(), (z, block, tile)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("M, rows, cols, key_major", [(200, 128, 128, False), (200, 64, 128, True),
                                                      (77, 32, 16, False), (77, 32, 16, True)])
def test_the_listing_kernel_matches_its_reference(form, M, rows, cols, key_major):
    """(In Triton's interpreter, or on the GPU.)"""
    if not INTERPRETER_SESSION and not torch.cuda.is_available():
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1) or a GPU")
    spec = padding_spec(form)
    vector = padding_vector(form, visible_keys(M)).to("cpu" if INTERPRETER_SESSION else "cuda")
    listed = KeyRangeTiles(spec, [vector], M, M, rows, cols, key_major)([vector])
    lists, counts = listed["BlockList"], listed["BlockCounts"]
    for z, per_outer in enumerate(reference_key_range_tiles(spec, vector, M, M, rows, cols, key_major)):
        for outer, (full, partial) in enumerate(per_outer):
            n_full, n_rest = counts[z, outer].tolist()
            assert (n_full, n_rest) == (len(full), len(partial)), (z, outer)
            assert lists[z, outer, :n_full + n_rest].tolist() == full + partial, (z, outer)
            # (the row holds every inner block: no index past the visited ones is garbage)
            assert sorted(lists[z, outer].tolist()) == list(range(lists.shape[2])), (z, outer)


@pytest.mark.parametrize("form", FORMS)
def test_the_tuner_times_a_batch_padded_on_the_right(form):
    """The tuner's random copy of the vector (a bool mostly True, normal floats) would leave no run of visible keys,
    every tile partial; it gets a batch padded to its longest row, in the vector's convention."""
    from fuse_attn.kernels.generated.launch import random_like, realistic_tuning_masks

    spec = padding_spec(form)
    N = 96
    tuning = random_like(padding_vector(form, visible_keys(N)[:4]))
    realistic_tuning_masks(spec, [tuning])
    lengths = torch.tensor([96, 72, 48, 32])
    assert torch.equal(tuning, padding_vector(form, torch.arange(N)[None, :] < lengths[:, None]))
    assert all(full for z in reference_key_range_tiles(spec, tuning, N, N, 16, 16, False) for full, _ in z[1:])
    shared = random_like(padding_vector(form, visible_keys(N)[:1]).expand(3, 1, 1, N))  # (one row for the batch)
    realistic_tuning_masks(spec, [shared])
    assert torch.equal(shared, padding_vector(form, torch.ones(3, N, dtype=torch.bool)))


def _padded_attention(q, k, v, attention_mask):
    """transformers' eager decoder attention of a padded batch: its padding and causal masks as one, finfo.min."""
    n = q.shape[-2]
    min_value = torch.finfo(q.dtype).min
    causal = torch.triu(torch.full((n, n), min_value, dtype=q.dtype), diagonal=1)
    mask = causal[None, None].masked_fill(~attention_mask[:, None, None, :].bool(), min_value)
    return torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + mask, dim=-1) @ v


def test_a_compiled_graph_that_chose_it_trains_on_cpu(monkeypatch):
    """The compiled path where a CPU can run it (tests/support/gluon_on_cpu.py): the rewrite emits the Gluon op with
    the padding vector among its vectors; output and gradients as eager's."""
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(3, 4, 30, 64, generator=g, requires_grad=True) for _ in range(3)]
    attention_mask = torch.arange(30)[None, :] < torch.tensor([30, 17, 1])[:, None]
    verdicts = gluon_compile_trains_as_eager(monkeypatch, _padded_attention, inputs, attention_mask, generator=g)
    assert pads_keys(verdicts[0].spec)


# ---- on an sm90 GPU ----------------------------------------------------------------------------------------------------


@hopper
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("head_dim, length, gqa_group", [(128, 1025, 1), (64, 97, 2), (128, 2051, 2)])
def test_key_padding_matches_fp64_with_gradients(form, head_dim, length, gqa_group):
    """Output, lse and dq / dk / dv against fp64 under the 2x rule (NaN where eager's are), for the six batch rows of
    :func:`visible_keys`: every key, right and left padding, a hole, one key, and none (eager's uniform row under a
    finite fill, NaN or 0 under -inf)."""
    spec = padding_spec(form, head_dim, gqa_group)
    vector = padding_vector(form, visible_keys(length), "cuda")
    gluon_op_matches_fp64_on_random_inputs(spec, [vector], vector.shape[0], length, seed=length + head_dim)
