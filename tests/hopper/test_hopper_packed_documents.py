"""The Gluon forward and backward of attention masked by a predicate of integer vectors (packed documents: the
``MASK_BLOCKS`` paths of fuse_attn/kernels/hopper/, the program generated from
fuse_attn/kernels/generated/templates/gluon_score_program.py.tmpl).

Which specs they take and the op's wiring run on the CPU (the op runs the generated forward there, its autograd the
template's backward). The kernels need an sm90 GPU: output, lse and the gradients of q, k and v against fp64 under
the 2x rule, for Hugging Face's forms of the mask (SDPA's ``where`` on a bool mask of two or four vectors, eager's
added ``where(keep, 0, finfo.min)``), at lengths that are no multiple of a tile, head dims 64 and 128, GQA; and the
bad inputs the tile classes must not change: unsorted document ids, an id that comes back after another, a row
whose every key is hidden. Their compile for sm90 runs without a GPU too, in tests/kernels/test_gpu_compile.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fuse_attn.kernels import flash_attention
from fuse_attn.kernels.generated import codegen
from fuse_attn.kernels.hopper.common import hopper_reasons, masks_by_a_predicate
from fuse_attn.kernels.hopper.forward import flash_attention_hopper
from fuse_attn.score_program import ScoreProgramBuilder, ScoreTensor
from fuse_attn.spec import AttentionSpec
from tests.support.gluon_op import (fake_qk, gluon_compile_trains_as_eager, gluon_op_matches_fp64_on_random_inputs,
                                    hopper)

ROWS, COLUMNS = (False, True, False, True), (False, True, True, False)  # [Z, 1, M, 1] and [Z, 1, 1, N] vectors
FINFO_MIN = torch.finfo(torch.bfloat16).min  # (transformers fills with the model dtype's; fp32's is -inf in bf16)


def packed_spec(head_dim=128, form="sdpa", positions=False, gqa_group=1, empty_rows="nan", extra_bias=False):
    """Packed documents as transformers masks them: ``ids_q == ids_k`` and a causal comparison -- of the indices, or
    (``positions``, transformers 5.24) of the position ids, two more vectors. ``form``: "sdpa" (``where(keep, s,
    -inf)``), "eager" (``s + where(keep, 0, finfo.min)``) or "finfo" (``where(keep, s, finfo.min)``)."""
    b = ScoreProgramBuilder()
    s = b.add("score")
    ids_q, ids_k = b.load(0, "int"), b.load(1, "int")
    if positions:
        causal = b.add("le", b.load(3, "int"), b.load(2, "int"))
    else:
        causal = b.add("le", b.add("kv_idx"), b.add("q_idx"))
    keep = b.add("logical_and", b.add("eq", ids_q, ids_k), causal)
    if form == "eager":
        root = b.add("add", s, b.add("where", keep, b.const(0.0), b.const(FINFO_MIN)))
    else:
        root = b.add("where", keep, s, b.const(float("-inf") if form == "sdpa" else FINFO_MIN))
    tensors = [ScoreTensor("int", "int64", ROWS), ScoreTensor("int", "int32", COLUMNS)]
    if positions:
        tensors += [ScoreTensor("int", "int32", ROWS), ScoreTensor("int", "int64", COLUMNS)]
    if extra_bias:
        root = b.add("add", b.load(len(tensors), "float"), root)
        tensors.append(ScoreTensor("bias", "bfloat16", (True, False, False, False)))
    return AttentionSpec(dtype="bfloat16", head_dim=head_dim, head_dim_v=head_dim, scale=head_dim ** -0.5,
                         score_program=b.program(root), score_tensors=tuple(tensors), gqa_group=gqa_group,
                         empty_rows=empty_rows)


def packed_vectors(spec, ids, device="cpu"):
    """The spec's vectors for document ids ``ids`` [Z, N]: the ids per row and per column, and the position ids
    (each token's index within its run of equal ids) where the spec compares them."""
    ids = ids.to(device)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    index = torch.arange(ids.shape[1], device=device).expand_as(ids)
    positions = index - torch.cummax(torch.where(starts, index, 0), dim=1).values
    values = [ids[:, None, :, None], ids[:, None, None, :], positions[:, None, :, None], positions[:, None, None, :]]
    return [v.to(getattr(torch, t.dtype)) for v, t in zip(values, spec.score_tensors)]


def documents(lengths, batch=1):
    """Document ids of documents of ``lengths`` packed into each of ``batch`` rows: [batch, sum(lengths)]."""
    return torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None].expand(batch, -1).contiguous()


@pytest.mark.parametrize("spec", [packed_spec(), packed_spec(form="eager"), packed_spec(positions=True),
                                  packed_spec(64, form="finfo", gqa_group=2, empty_rows="zero")])
def test_the_kernels_take_a_predicates_mask(spec, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert masks_by_a_predicate(spec)
    assert hopper_reasons(spec, *fake_qk(head_dim=spec.head_dim)) == []


@pytest.mark.parametrize("spec, reason", [
    (packed_spec(extra_bias=True), "mask the plain scores by a predicate of at most 4 integer vectors"),
    (dataclasses.replace(packed_spec(), head_dim=192, head_dim_v=128, scale=192 ** -0.5), "at head dims 192/128"),
])
def test_the_kernels_refuse_other_programs_with_a_predicate(spec, reason, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert not masks_by_a_predicate(spec) or spec.head_dim == 192
    reasons = hopper_reasons(spec, *fake_qk(head_dim=spec.head_dim))
    assert len(reasons) == 1 and reason in reasons[0], reasons


def test_the_score_program_is_generated_in_gluons_names():
    source = codegen.generate_gluon_score_program_source(packed_spec(form="eager"))
    assert "tl." not in source and "def program(" in source and "def program_grad(" in source
    assert "-3.4028234663852886e+38" in source  # finfo.min in log2 units, kept finite (eager's uniform empty rows)


def test_the_op_on_cpu_runs_the_generated_forward_and_the_templates_backward():
    spec = packed_spec(64, form="eager")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 37, 64, generator=g, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    vectors = packed_vectors(spec, documents([9, 12, 16]))
    out, lse = flash_attention_hopper(q, k, v, spec, return_lse=True, vectors=vectors)
    want_out, want_lse = flash_attention(q, k, v, spec, vectors, return_lse=True)
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=0)
    dout = torch.randn(out.shape, generator=g, dtype=torch.bfloat16)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(want_out, (q, k, v), dout)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _packed_attention(q, k, v, position_ids):
    """Hugging Face's packed documents, as its eager path masks them: document ids from the position ids' restarts, a
    bool mask of same document and not after the query, applied with the dtype's finfo.min."""
    documents = (position_ids == 0).cumsum(-1)
    n = position_ids.shape[-1]
    index = torch.arange(n)
    visible = (documents[:, None, :, None] == documents[:, None, None, :]) & (index[None, :] <= index[:, None])
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    return torch.softmax(scores.masked_fill(~visible, torch.finfo(scores.dtype).min), dim=-1) @ v


def test_a_compiled_graph_that_chose_it_trains_on_cpu(monkeypatch):
    """The compiled path where a CPU can run it (tests/support/gluon_on_cpu.py): the rewrite emits the Gluon op with
    the integer vectors; output and gradients as eager's."""
    from tests.support.compiled_modules import packed_position_ids

    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(2, 4, 30, 64, generator=g, requires_grad=True) for _ in range(3)]
    gluon_compile_trains_as_eager(monkeypatch, _packed_attention, inputs, packed_position_ids((7, 11, 12), 2),
                                  generator=g)


# ---- on an sm90 GPU ----------------------------------------------------------------------------------------------------


@hopper
@pytest.mark.parametrize("head_dim, form, positions, gqa_group, lengths", [
    (128, "sdpa", False, 1, (97,)),  # one document shorter than a tile
    (128, "sdpa", False, 2, (300, 1, 724)),  # a one-token document; 1025 tokens
    (64, "eager", False, 1, (600, 500, 1)),
    (128, "eager", True, 1, (2048, 2052)),  # two documents of many tiles: full tiles in a run, in both kernels
    (64, "sdpa", True, 2, (17, 1000, 1083)),
    (128, "finfo", False, 1, (513, 512)),
])
def test_packed_documents_match_fp64_with_gradients(head_dim, form, positions, gqa_group, lengths):
    spec = packed_spec(head_dim, form, positions, gqa_group)
    gluon_op_matches_fp64_on_random_inputs(spec, packed_vectors(spec, documents(lengths, batch=2), "cuda"), 2,
                                           sum(lengths), seed=sum(lengths))


@hopper
@pytest.mark.parametrize("form, empty_rows", [("sdpa", "nan"), ("sdpa", "zero"), ("eager", "nan"), ("finfo", "nan")])
def test_bad_inputs_give_eagers_answer(form, empty_rows):
    """Vectors that the tile classes' bounds must not be trusted on: unsorted document ids (batch row 0), an id that
    comes back after another (row 1), and rows whose every key is hidden -- a negative position per query (rows
    200-263 and 650-699): no key's position is at or below it. Eager's answer for those rows: -inf fills give NaN
    (0 under empty_rows="zero"), finite ones a uniform row."""
    spec = packed_spec(128, form, positions=True, empty_rows=empty_rows)
    g = torch.Generator().manual_seed(1)
    unsorted = torch.randint(0, 4, (1, 700), generator=g)
    comes_back = torch.cat([torch.full((300,), 2), torch.full((100,), 5), torch.full((300,), 2)])[None]
    vectors = packed_vectors(spec, torch.cat([unsorted, comes_back]), "cuda")
    row_positions = vectors[2].clone()
    row_positions[:, :, 200:264] = -1
    row_positions[:, :, 650:] = -1
    vectors[2] = row_positions
    gluon_op_matches_fp64_on_random_inputs(spec, vectors, 2, 700, seed=3)
