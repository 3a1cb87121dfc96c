"""Masks computed from small vectors, evaluated in the kernels: packed documents (several sequences in one batch row,
told apart by ``position_ids`` that restart at 0, no attention mask), chunks, and what must still give eager's answer.

Hugging Face turns the position ids into document ids (a cumsum of the restarts) and builds a block-diagonal causal
``[B, 1, N, N]`` mask from gathers ``ids[batch_idx, q_idx] == ids[batch_idx, kv_idx]`` and ``pos[batch_idx,
kv_idx] <= pos[batch_idx, q_idx]``. Each gather is read as a view of its ``[B, N]`` source, loaded per query row or
key column (an "int" score tensor), and the comparisons run in the kernel: no N x N tensor is built or read. (The
tiles those masks hide or keep whole, classified per call from the vectors' bounds: tests/kernels/test_mask_blocks.py.)"""

from __future__ import annotations

import copy

import pytest
import torch
from expecttest import TestCase

from fuse_attn.report import collect_reports
from tests.support.compiled_modules import INTERPRETER_SESSION, compile_and_compare, packed_position_ids
from tests.support.graph_capture import fused_graph, rewrite_reports
from tests.support.numerics import check_close

transformers = pytest.importorskip("transformers")

# Hugging Face's causal comparison: transformers 5.24 (CI's) compares position ids, pos[kv] <= pos[q] (four vectors
# in the kernel); older releases (5.17) compare indices, kv_idx <= q_idx (two vectors: the document ids).
POSITIONS_COMPARED = tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (5, 24)

DOCUMENTS = (10, 8, 6)  # lengths of the documents packed into one row of 24 tokens
LENGTH = sum(DOCUMENTS)


def llama(attention):
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128, attn_implementation=attention)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def llama_logits(model, input_ids, position_ids):
    # (use_cache=False: transformers reads packed documents from position ids only without a cache, as in training)
    return model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits


def score_tensor_sizes(spec, batch, length):
    """The number of elements of each score tensor the op receives for ``spec``."""
    return [(1 if t.broadcast[0] else batch) * (1 if t.broadcast[2] else length) * (1 if t.broadcast[3] else length)
            for t in spec.score_tensors]


class TestHuggingFacePackedDocuments(TestCase):
    def check_vectors_only(self, attention, batch):
        model = llama(attention).eval()
        ids = torch.randint(0, 128, (batch, LENGTH), generator=torch.Generator().manual_seed(0))
        reports = rewrite_reports(lambda i, p: llama_logits(model, i, p), ids, packed_position_ids(DOCUMENTS, batch))
        verdicts = [v for r in reports for v in r.verdicts]
        assert len(verdicts) == 2 and all(v.fused for v in verdicts), "\n".join(v.line() for v in verdicts)
        for verdict in verdicts:
            assert {t.role for t in verdict.spec.score_tensors} == {"int"}
            sizes = score_tensor_sizes(verdict.spec, batch, LENGTH)
            assert sizes == [batch * LENGTH] * len(sizes), verdict.line()
        after = reports[0].after
        for shape in (f"[{batch}, 1, {LENGTH}, {LENGTH}]", f"[{batch}, {LENGTH}, {LENGTH}]"):
            assert shape not in after, f"an N x N tensor {shape} is still built:\n{after}"
        return verdicts[0].description

    def assert_description(self, text, expected):
        """``expected`` (a golden description, pinned for transformers 5.24), or on older releases their spelling."""
        if not POSITIONS_COMPARED:
            assert "(kv_idx <= q_idx)" in text and "int1" in text and "int2" not in text, text
            return
        self.assertExpectedInline(text, expected, skip=1)

    def test_eager_attention(self):
        self.assert_description(self.check_vectors_only("eager", batch=1), """float32 D=16 M=24 N=24 scale=0.25 s -> s + where((int0[1,1,1,N] <= int1[1,1,M,1]) & (int2[1,1,M,1] == int3[1,1,1,N]), 0, -3.40282e+38) gqa=2 tiles classified per call (int0, int1, int2, int3)""")

    def test_sdpa_attention(self):
        self.assert_description(self.check_vectors_only("sdpa", batch=2), """float32 D=16 M=24 N=24 scale=0.25 s -> where(logical_not((int0[Z,1,1,N] <= int1[Z,1,M,1]) & (int2[Z,1,M,1] == int3[Z,1,1,N])), -inf, s) gqa=2 empty rows 0 tiles classified per call (int0, int1, int2, int3)""")


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_llama_packed_training_step_matches_eager(attention, monkeypatch):
    """A training step of the packed batch: the output and every parameter's gradient within the 2x rule of eager
    (against the model in fp64), through the blockwise CPU path and the kernels in the interpreter -- one compiled
    graph for both, since the op chooses its path per call."""
    model = llama(attention)
    ref_model, eager_model = copy.deepcopy(model).double(), copy.deepcopy(model)
    ids = torch.randint(0, 128, (2, LENGTH), generator=torch.Generator().manual_seed(0))
    positions = packed_position_ids(DOCUMENTS, 2)
    grad = torch.randn(2, LENGTH, 128, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def step(module):
        module.zero_grad(set_to_none=True)
        out = llama_logits(module, ids, positions)
        (out * grad.to(out.dtype)).sum().backward()
        return out.detach(), [p.grad for p in module.parameters()]

    (eager, eager_grads), (ref, ref_grads) = step(eager_model), step(ref_model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="fuse_attn")
    for interpret in ("0", "1") if INTERPRETER_SESSION else ("0",):
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
        with collect_reports() as reports:
            ours, grads = step(compiled)
        assert sum(len(r.fused) for r in reports) == (0 if interpret == "1" else 2)  # (compiled at the first step)
        check_close(ours, eager, ref, torch.float32, f"logits, TRITON_INTERPRET={interpret}")
        for (name, _), g, e, r in zip(model.named_parameters(), grads, eager_grads, ref_grads):
            check_close(g, e, r, torch.float32, f"grad of {name}, TRITON_INTERPRET={interpret}")


def qkv(batch=2, heads=2, length=LENGTH, dim=8):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(batch, heads, length, dim, generator=g) for _ in range(3)]


class DocumentAttention(torch.nn.Module):
    """Attention over packed documents written by hand: ``documents`` [B, T] ids (or, with ``from_positions``,
    position ids restarting at 0 at each document), a block-diagonal mask, causal (``diagonal`` 0) or strictly
    causal (-1: every document's first token sees no key), applied with ``fill``."""

    def __init__(self, from_positions=False, diagonal=0, fill=float("-inf")):
        super().__init__()
        self.from_positions, self.diagonal, self.fill = from_positions, diagonal, fill

    def forward(self, q, k, v, documents):
        T = q.shape[-2]
        if self.from_positions:
            documents = documents.eq(0).cumsum(-1)
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril(self.diagonal)
        mask = (documents[:, None, :, None] == documents[:, None, None, :]) & causal
        w = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
        return torch.softmax(w.masked_fill(~mask, self.fill), -1) @ v


class TestHandWritten(TestCase):
    def test_document_ids_from_position_ids(self):
        text = fused_graph(DocumentAttention(from_positions=True), *qkv(length=6), packed_position_ids((2, 4), 2))
        self.assertExpectedInline(text, """\
    def forward(self, arg0_1: "f32[2, 2, 6, 8]", arg1_1: "i64[2, 6]", arg2_1: "f32[2, 2, 6, 8]", arg3_1: "f32[2, 2, 6, 8]"):
        eq: "b8[2, 6]" = torch.ops.aten.eq.Scalar(arg1_1, 0)
        cumsum: "i64[2, 6]" = torch.ops.aten.cumsum.default(eq, -1)
        unsqueeze: "i64[2, 1, 6]" = torch.ops.aten.unsqueeze.default(cumsum, 1)
        unsqueeze_1: "i64[2, 1, 6, 1]" = torch.ops.aten.unsqueeze.default(unsqueeze, 3)
        unsqueeze_2: "i64[2, 1, 6]" = torch.ops.aten.unsqueeze.default(cumsum, 1)
        unsqueeze_3: "i64[2, 1, 1, 6]" = torch.ops.aten.unsqueeze.default(unsqueeze_2, 2)
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg0_1, arg2_1, arg3_1, [unsqueeze_1, unsqueeze_3], None, '{"causal": null, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 6, "num_heads": 2, "q_len": 6, "scale": 0.3535533905932738, "scale_head_dim_power": 0.0, "score_program": [{"args": [], "op": "score", "value": null}, {"args": [], "op": "load", "value": 0}, {"args": [], "op": "load", "value": 1}, {"args": [1, 2], "op": "eq", "value": null}, {"args": [], "op": "kv_idx", "value": null}, {"args": [], "op": "q_idx", "value": null}, {"args": [4, 5], "op": "le", "value": null}, {"args": [3, 6], "op": "logical_and", "value": null}, {"args": [7], "op": "logical_not", "value": null}, {"args": [], "op": "const", "value": -Infinity}, {"args": [8, 9, 0], "op": "where", "value": null}], "score_tensors": [{"broadcast": [false, true, false, true], "dtype": "int64", "role": "int"}, {"broadcast": [false, true, true, false], "dtype": "int64", "role": "int"}]}')
        getitem: "f32[2, 2, 6, 8]" = flash_attention_default[0]
        return (getitem,)""")


# document ids as the kernels must take them whatever their order: sorted (from position ids), unsorted, and an id
# that comes back after another (equal ids attend to each other wherever they are, as in eager)
DOCUMENT_IDS = {
    "sorted": torch.tensor([[0] * 10 + [1] * 8 + [2] * 6, [0] * 3 + [1] * 21]),
    "unsorted": torch.tensor([[5] * 10 + [0] * 8 + [3] * 6, [2] * 3 + [9] * 21]),
    "id comes back": torch.tensor([[0] * 10 + [1] * 8 + [0] * 6, [4] * 3 + [7] * 11 + [4] * 10]),
}


@pytest.mark.parametrize("ids", list(DOCUMENT_IDS))
def test_document_mask_matches_eager(target, ids):
    """Output and gradients of q, k, v under the 2x rule, the mask from the ids evaluated in the kernels."""
    device, dtype = target
    reports = rewrite_reports(DocumentAttention(), *qkv(), DOCUMENT_IDS[ids])
    assert [t.role for v in reports[0].verdicts for t in v.spec.score_tensors] == ["int", "int"]
    compile_and_compare(DocumentAttention(), [*qkv(), DOCUMENT_IDS[ids]], train=True, dtype=dtype, device=device)


@pytest.mark.parametrize("fill", ["-inf", "finfo.min"])
def test_rows_with_every_key_masked(target, fill):
    """Strictly causal documents: the first token of each id sees no key. With -inf its output row is NaN, exactly
    where eager's is; with finfo.min it is the uniform average over every key, as in eager (gradients too)."""
    device, dtype = target
    model = DocumentAttention(diagonal=-1, fill=float("-inf") if fill == "-inf" else torch.finfo(dtype).min)
    inputs = [*qkv(), DOCUMENT_IDS["id comes back"]]
    if fill == "finfo.min":  # (its fp32 lse cannot hold finfo.min + log N: the backward takes the row's own statistics)
        compile_and_compare(model, inputs, train=True, dtype=dtype, device=device)
        return
    torch._dynamo.reset()
    inputs = [x.to(device) for x in inputs]
    with collect_reports() as reports:
        ours = torch.compile(model, backend="fuse_attn")(*inputs)
    assert sum(len(r.fused) for r in reports) == 1
    eager, ref = model(*inputs), model(*(x.double() if x.is_floating_point() else x for x in inputs))
    starts = torch.zeros(2, LENGTH, dtype=torch.bool)
    # the first token of each id (a token whose id comes back sees the earlier tokens of that id)
    starts[0, [0, 10]] = starts[1, [0, 3]] = True
    assert torch.equal(ref.isnan().any(-1), starts[:, None].expand(2, 2, LENGTH).to(device))
    assert torch.equal(ours.isnan(), eager.isnan()) and torch.equal(eager.isnan(), ref.isnan())
    seen = ~ref.isnan()
    check_close(ours[seen], eager[seen], ref[seen], dtype, "rows that see a key")


class CuSeqlensAttention(torch.nn.Module):
    """Causal attention within documents given as FlashAttention's varlen callers give them, ``cu_seqlens`` (the
    documents' start offsets and the total length), the document of each token computed in the model."""

    def __init__(self, spelling):
        super().__init__()
        self.spelling = spelling

    def forward(self, q, k, v, cu_seqlens):
        T = q.shape[-2]
        position = torch.arange(T, device=q.device)
        if self.spelling == "searchsorted":
            documents = torch.searchsorted(cu_seqlens, position, right=True)
        else:  # "starts passed": how many documents start at or before each token
            documents = (position[:, None] >= cu_seqlens[None, 1:]).sum(-1)
        mask = (documents[:, None] == documents[None, :]) & (position[None, :] <= position[:, None])
        w = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
        return torch.softmax(w.masked_fill(~mask, float("-inf")), -1) @ v


@pytest.mark.parametrize("spelling, cu_seqlens", [("searchsorted", [0, 10, 18, LENGTH]),
                                                  ("starts passed", [0, 10, 18, LENGTH]),
                                                  ("starts passed", [0, 18, 10, LENGTH + 5, 3])],
                         ids=["searchsorted", "starts passed", "starts passed, negative lengths"])
def test_documents_from_cu_seqlens(target, spelling, cu_seqlens):
    """The model derives the document ids from ``cu_seqlens`` itself: they reach the kernels as one int vector read per
    row and per column, output and gradients under the 2x rule. Offsets that go back (a negative length) or past the
    end give eager's answer too: the kernels see the ids the model computed, whatever they are."""
    device, dtype = target
    inputs = [*qkv(), torch.tensor(cu_seqlens)]
    reports = rewrite_reports(CuSeqlensAttention(spelling), *inputs)
    assert [t.role for v in reports[0].verdicts for t in v.spec.score_tensors] == ["int", "int"]
    compile_and_compare(CuSeqlensAttention(spelling), inputs, train=True, dtype=dtype, device=device)


def test_chunked_attention_reads_chunk_ids_per_row_and_column(target):
    """Llama-4's chunked attention, ``q // C == k // C`` and causal: the chunk ids are integer vectors (each
    computed once, from ``arange``), the comparison runs in the kernels."""
    device, dtype = target

    class Chunked(torch.nn.Module):
        def forward(self, q, k, v):
            T = q.shape[-2]
            chunk = torch.arange(T, device=q.device) // 5
            mask = (chunk[:, None] == chunk[None, :]) & torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
            w = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
            return torch.softmax(w.masked_fill(~mask, float("-inf")), -1) @ v

    reports = rewrite_reports(Chunked(), *qkv())
    spec = reports[0].verdicts[0].spec
    assert [t.role for t in spec.score_tensors] == ["int", "int"]
    assert score_tensor_sizes(spec, 2, LENGTH) == [LENGTH, LENGTH]
    compile_and_compare(Chunked(), qkv(), train=True, dtype=dtype, device=device)


def gathered_documents(index):
    """HF-style gathers ``ids[batch_idx, index(T)]`` of [B, T + 2] ids (``index``: the key / query positions read)."""

    def attention(q, k, v, ids):
        T = q.shape[-2]
        batch = torch.arange(ids.shape[0], device=q.device)[:, None, None, None]
        at = index(torch.arange(T, device=q.device))
        keep = ids[batch, at[None, None, :, None]] == ids[batch, at[None, None, None, :]]
        w = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
        return torch.softmax(w.masked_fill(~keep, float("-inf")), -1) @ v

    return attention


class TestGathers(TestCase):
    def test_an_offset_position_is_a_slice_of_the_ids(self):
        text = fused_graph(gathered_documents(lambda t: t + 2), *qkv(length=5), torch.tensor([[9, 9, 0, 0, 1, 1, 1]] * 2))
        self.assertExpectedInline(text, """\
    def forward(self, arg0_1: "f32[2, 2, 5, 8]", arg1_1: "i64[2, 7]", arg2_1: "f32[2, 2, 5, 8]", arg3_1: "f32[2, 2, 5, 8]"):
        slice_tensor: "i64[2, 5]" = torch.ops.aten.slice.Tensor(arg1_1, 1, 2, 7)
        unsqueeze_default: "i64[2, 1, 5]" = torch.ops.aten.unsqueeze.default(slice_tensor, 1)
        unsqueeze_default_1: "i64[2, 1, 5, 1]" = torch.ops.aten.unsqueeze.default(unsqueeze_default, 3)
        slice_tensor_1: "i64[2, 5]" = torch.ops.aten.slice.Tensor(arg1_1, 1, 2, 7)
        unsqueeze_default_2: "i64[2, 1, 5]" = torch.ops.aten.unsqueeze.default(slice_tensor_1, 1)
        unsqueeze_default_3: "i64[2, 1, 1, 5]" = torch.ops.aten.unsqueeze.default(unsqueeze_default_2, 2)
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg0_1, arg2_1, arg3_1, [unsqueeze_default_1, unsqueeze_default_3], None, '{"causal": null, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 2, "q_len": 5, "scale": 0.3535533905932738, "scale_head_dim_power": 0.0, "score_program": [{"args": [], "op": "score", "value": null}, {"args": [], "op": "load", "value": 0}, {"args": [], "op": "load", "value": 1}, {"args": [1, 2], "op": "eq", "value": null}, {"args": [3], "op": "logical_not", "value": null}, {"args": [], "op": "const", "value": -Infinity}, {"args": [4, 5, 0], "op": "where", "value": null}], "score_tensors": [{"broadcast": [false, true, false, true], "dtype": "int64", "role": "int"}, {"broadcast": [false, true, true, false], "dtype": "int64", "role": "int"}]}')
        getitem: "f32[2, 2, 5, 8]" = flash_attention_default[0]
        return (getitem,)""")

    def test_other_indices_load_the_gathered_values(self):
        text = fused_graph(gathered_documents(lambda t: t.flip(0)), *qkv(length=5), torch.tensor([[0, 0, 1, 1, 1, 2, 2]] * 2))
        self.assertExpectedInline(text, """\
    def forward(self, arg0_1: "f32[2, 2, 5, 8]", arg1_1: "i64[2, 7]", arg2_1: "f32[2, 2, 5, 8]", arg3_1: "f32[2, 2, 5, 8]"):
        arange: "i64[2]" = torch.ops.aten.arange.default(2, device = device(type='cpu'), pin_memory = False)
        unsqueeze: "i64[2, 1]" = torch.ops.aten.unsqueeze.default(arange, 1)
        unsqueeze_1: "i64[2, 1, 1]" = torch.ops.aten.unsqueeze.default(unsqueeze, 2)
        unsqueeze_2: "i64[2, 1, 1, 1]" = torch.ops.aten.unsqueeze.default(unsqueeze_1, 3)
        arange_1: "i64[5]" = torch.ops.aten.arange.default(5, device = device(type='cpu'), pin_memory = False)
        flip: "i64[5]" = torch.ops.aten.flip.default(arange_1, [0])
        unsqueeze_3: "i64[1, 5]" = torch.ops.aten.unsqueeze.default(flip, 0)
        unsqueeze_4: "i64[1, 1, 5]" = torch.ops.aten.unsqueeze.default(unsqueeze_3, 1)
        unsqueeze_5: "i64[1, 1, 5, 1]" = torch.ops.aten.unsqueeze.default(unsqueeze_4, 3)
        index: "i64[2, 1, 5, 1]" = torch.ops.aten.index.Tensor(arg1_1, [unsqueeze_2, unsqueeze_5])
        unsqueeze_6: "i64[1, 5]" = torch.ops.aten.unsqueeze.default(flip, 0)
        unsqueeze_7: "i64[1, 1, 5]" = torch.ops.aten.unsqueeze.default(unsqueeze_6, 1)
        unsqueeze_8: "i64[1, 1, 1, 5]" = torch.ops.aten.unsqueeze.default(unsqueeze_7, 2)
        index_1: "i64[2, 1, 1, 5]" = torch.ops.aten.index.Tensor(arg1_1, [unsqueeze_2, unsqueeze_8])
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg0_1, arg2_1, arg3_1, [index, index_1], None, '{"causal": null, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 2, "q_len": 5, "scale": 0.3535533905932738, "scale_head_dim_power": 0.0, "score_program": [{"args": [], "op": "score", "value": null}, {"args": [], "op": "load", "value": 0}, {"args": [], "op": "load", "value": 1}, {"args": [1, 2], "op": "eq", "value": null}, {"args": [3], "op": "logical_not", "value": null}, {"args": [], "op": "const", "value": -Infinity}, {"args": [4, 5, 0], "op": "where", "value": null}], "score_tensors": [{"broadcast": [false, true, false, true], "dtype": "int64", "role": "int"}, {"broadcast": [false, true, true, false], "dtype": "int64", "role": "int"}]}')
        getitem: "f32[2, 2, 5, 8]" = flash_attention_default[0]
        return (getitem,)""")


@pytest.mark.parametrize("index", ["offset", "reversed"])
def test_gathered_documents_match_eager(target, index):
    device, dtype = target
    model = gathered_documents(lambda t: t + 2 if index == "offset" else t.flip(0))
    ids = torch.tensor([[9, 9] + [0] * 10 + [1] * 8 + [2] * 6, [3, 3] + [1] * 3 + [2] * 21])

    class Module(torch.nn.Module):
        def forward(self, *args):
            return model(*args)

    compile_and_compare(Module(), [*qkv(), ids], train=True, dtype=dtype, device=device)
