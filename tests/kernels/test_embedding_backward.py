"""The gradient of a few-row embedding table (fuse_attn/kernels/embedding_backward.py): the kernel against fp64 and
eager's ``embedding_dense_backward`` (the 2x rule), the backend's decomposition in compiled graphs (T5's relative
position bias), and the tables it leaves to Inductor's decomposition."""

from __future__ import annotations

import copy
import functools
import os

import pytest
import torch
import torch.nn.functional as F

from expecttest import TestCase

import fuse_attn
from fuse_attn.kernels import embedding_backward as eb
from fuse_attn.report import collect_reports
from tests.support.numerics import FLOOR, needs_cuda
from tests.support.graph_capture import compiled_code, graph_text, rewrite_reports

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
EMBEDDING_BACKWARD = torch.ops.aten.embedding_dense_backward.default


def _assert_2x(name, ours, eager, ref64, dtype):
    err = (ours.double() - ref64).abs().max().item()
    err_eager = (eager.double() - ref64).abs().max().item()
    floor = FLOOR[dtype] * max(1.0, ref64.abs().max().item())
    assert err <= 2 * err_eager + floor, f"{name}: max|ours-ref|={err:.3g} > 2*{err_eager:.3g} + {floor:.3g}"


def _t5_layout_grad(n: int, heads: int, dtype) -> torch.Tensor:
    """A [N, N, heads] gradient laid out as T5's reaches the embedding: the permuted [1, heads, N, N] score gradient."""
    return torch.randn(1, heads, n, n, dtype=dtype, device=DEVICE).permute(2, 3, 1, 0).squeeze(-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, columns, positions, padding_idx", [
    (32, 8, 1025, -1),  # T5's 32 buckets x 8 heads
    (1, 1, 1, -1),
    (5, 17, 97, 2),  # a padding row
    (64, 100, 257, 0),  # the most rows; columns over two blocks
    (3, 16, 0, -1),  # no positions: a zero table
])
def test_table_gradient_matches_fp64_within_twice_eagers_error(dtype, rows, columns, positions, padding_idx):
    torch.manual_seed(rows * 131 + positions)
    grad = torch.randn(positions, columns, dtype=dtype, device=DEVICE)
    indices = torch.randint(0, rows, (positions,), device=DEVICE)
    ours = eb.table_gradient(grad, indices, rows, padding_idx).to(dtype)
    eager = EMBEDDING_BACKWARD(grad, indices, rows, padding_idx, False)
    ref64 = eb.reference_table_gradient(grad.double(), indices, rows, padding_idx)
    assert ours.dtype == eager.dtype and ours.shape == eager.shape == (rows, columns)
    _assert_2x("table", ours, eager, ref64, dtype)
    if 0 <= padding_idx < rows:
        assert not ours[padding_idx].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_table_gradient_reads_a_strided_gradient_with_many_positions_a_program(dtype):
    """T5's layout (each head's values N^2 apart, positions contiguous), more positions than the programs take in one
    step (the grid-stride loop), indices of a 2-D lookup."""
    torch.manual_seed(0)
    n, heads = 67, 8
    grad = _t5_layout_grad(n, heads, dtype)
    relative = torch.arange(n, device=DEVICE)[None, :] - torch.arange(n, device=DEVICE)[:, None]
    indices = relative.clamp(-15, 16) + 15  # 32 buckets
    assert grad.stride() == (n, 1, n * n) and n * n > eb.INTERPRETER_PROGRAMS * eb.BLOCK_P
    ours = eb.table_gradient(grad.reshape(-1, heads), indices.reshape(-1), 32, -1).to(dtype)
    eager = EMBEDDING_BACKWARD(grad, indices, 32, -1, False)
    ref64 = eb.reference_table_gradient(grad.double().reshape(-1, heads), indices.reshape(-1), 32, -1)
    _assert_2x("table", ours, eager, ref64, dtype)


def test_handles_a_few_row_table_and_leaves_the_rest():
    table = torch.zeros(32, 8, device=DEVICE)
    assert eb.handles(table) and eb.handles(torch.zeros(eb.MAX_ROWS, 1000, device=DEVICE))
    assert not eb.handles(torch.zeros(eb.MAX_ROWS + 1, 8, device=DEVICE))  # a vocabulary: few lookups a row
    assert not eb.handles(table, scale_grad_by_freq=True)
    assert not eb.handles(table, sparse=True)
    assert not eb.handles(table.double())


class RelativeBiasAttention(torch.nn.Module):
    """T5's self-attention core: a learned [buckets, heads] table looked up at each (query, key) pair's bucket,
    permuted to [1, heads, N, N] and added to the scores (unscaled, as T5 does)."""

    def __init__(self, heads: int, buckets: int = 32):
        super().__init__()
        self.buckets = buckets
        self.relative_attention_bias = torch.nn.Embedding(buckets, heads)

    def forward(self, q, k, v):
        n = q.shape[2]
        position = torch.arange(n, device=q.device)
        relative = position[None, :] - position[:, None]
        half = self.buckets // 2
        bucket = relative.clamp(-half + 1, half) + half - 1
        bias = self.relative_attention_bias(bucket).permute(2, 0, 1).unsqueeze(0)
        scores = q @ k.transpose(-1, -2) + bias
        return scores.softmax(-1) @ v


def _compiled_step(module, q, k, v, dout):
    compiled = torch.compile(module, backend="fuse_attn")

    def step():
        out = compiled(q, k, v)
        out.backward(dout)
        return out

    return compiled_code(step)


def _eager_table_grad(module, inputs, dout, dtype):
    """The table's gradient of an eager copy of ``module`` in ``dtype``."""
    twin = copy.deepcopy(module).to(dtype)
    twin.zero_grad(set_to_none=True)
    twin(*(t.detach().to(dtype) for t in inputs)).backward(dout.to(dtype))
    return twin.relative_attention_bias.weight.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_relative_bias_table_gradient_runs_our_kernel_in_the_compiled_backward(dtype):
    torch.manual_seed(0)
    heads, n, d = 4, 37, 16
    module = RelativeBiasAttention(heads).to(DEVICE, dtype)
    q, k, v = (torch.randn(2, heads, n, d, device=DEVICE, dtype=dtype, requires_grad=True) for _ in range(3))
    dout = torch.randn(2, heads, n, d, device=DEVICE, dtype=dtype)
    out, code, reports = _compiled_step(module, q, k, v, dout)
    assert [len(r.fused) for r in reports] == [1]
    assert "embedding_dense_backward" not in code  # (Inductor names its kernels after the ops they compute)
    if DEVICE == "cuda":
        assert "def _table_gradient_partials(" in code and "torch.ops.fuse_attn" not in code
    else:
        assert "fuse_attn.table_gradient_cpu" in code
    ours = module.relative_attention_bias.weight.grad
    _assert_2x("table", ours, _eager_table_grad(module, (q, k, v), dout, dtype),
               _eager_table_grad(module, (q, k, v), dout, torch.float64), dtype)


def test_a_lookup_the_rewrite_fails_on_keeps_its_lookup_and_the_attention_still_fuses(monkeypatch):
    """An internal error while rewriting a table lookup costs that lookup its table gradient, not the graph its
    fused attention: the lookup stays aten's, the attention is fused, the gradient is right."""
    from fuse_attn.graph import rewrite

    fill_val = rewrite._Emitter._fill_val

    def failing_on_the_lookup(self, node, target, args, kwargs):
        if target is torch.ops.fuse_attn.table_lookup.default:
            raise RuntimeError("a bug of ours")
        return fill_val(self, node, target, args, kwargs)

    monkeypatch.setattr(rewrite._Emitter, "_fill_val", failing_on_the_lookup)
    torch.manual_seed(0)
    heads, n, d = 2, 19, 16
    module = RelativeBiasAttention(heads).to(DEVICE)
    q, k, v = (torch.randn(1, heads, n, d, device=DEVICE, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, heads, n, d, device=DEVICE)
    _, code, reports = _compiled_step(module, q, k, v, dout)
    assert [(len(r.fused), r.tables) for r in reports] == [(1, [])]
    _assert_2x("table", module.relative_attention_bias.weight.grad,
               _eager_table_grad(module, (q, k, v), dout, torch.float32),
               _eager_table_grad(module, (q, k, v), dout, torch.float64), torch.float32)


def test_relative_bias_table_gradient_under_symbolic_lengths():
    """One compile (dynamic=True) serves two lengths; the table's gradient within the 2x rule at each.

    With ``dynamic=True`` Dynamo lifts the embedding's float ``norm_type`` to an input; nothing tensor-valued reads
    it, so AOTAutograd specializes it and Dynamo restarts its analysis of the frame once: the backend may see the
    graph twice at the first length, never again at the second."""
    torch.manual_seed(0)
    heads, d = 2, 16
    module = RelativeBiasAttention(heads).to(DEVICE)
    compiled = torch.compile(module, backend="fuse_attn", dynamic=True)
    torch._dynamo.reset()
    reports_per_length = []
    with collect_reports() as reports:
        for n in (19, 33):
            q, k, v = (torch.randn(1, heads, n, d, device=DEVICE, requires_grad=True) for _ in range(3))
            dout = torch.randn(1, heads, n, d, device=DEVICE)
            module.zero_grad(set_to_none=True)
            compiled(q, k, v).backward(dout)
            ours = module.relative_attention_bias.weight.grad
            _assert_2x(f"table at N{n}", ours, _eager_table_grad(module, (q, k, v), dout, torch.float32),
                       _eager_table_grad(module, (q, k, v), dout, torch.float64), torch.float32)
            reports_per_length.append(len(reports))
    assert reports_per_length[0] >= 1 and reports_per_length[1] == reports_per_length[0]  # one graph serves both
    assert all(len(r.fused) == 1 for r in reports)


def test_t5s_encoder_and_decoder_tables_train_through_the_op():
    """Hugging Face's T5 (encoder and decoder, each computing its bias once and sharing it over its layers; the
    decoder's buckets causal): both tables' gradients come from the op, within the 2x rule against fp64 eager."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.T5Config(d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2, num_decoder_layers=2,
                                   vocab_size=64, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
                                   attn_implementation="eager")
    model = transformers.T5ForConditionalGeneration(config).to(DEVICE)
    ids = torch.randint(3, 64, (2, 11), device=DEVICE)
    labels = torch.randint(3, 64, (2, 7), device=DEVICE)
    compiled = torch.compile(model, backend="fuse_attn")
    _, code, reports = compiled_code(lambda: compiled(input_ids=ids, labels=labels).loss.backward())
    assert sum(len(r.fused) for r in reports) == 6  # 2 encoder, 2 decoder self-, 2 cross-attentions
    assert "embedding_dense_backward" not in code
    assert code.count("def _table_gradient_partials(" if DEVICE == "cuda" else "fuse_attn.table_gradient_cpu") >= 2

    def tables(m):
        return [m.encoder.block[0].layer[0].SelfAttention, m.decoder.block[0].layer[0].SelfAttention]

    def eager_grads(dtype):
        twin = copy.deepcopy(model).to(dtype)
        twin.zero_grad(set_to_none=True)
        twin(input_ids=ids, labels=labels).loss.backward()
        return [a.relative_attention_bias.weight.grad for a in tables(twin)]

    for name, ours, eager, ref64 in zip(["encoder", "decoder"],
                                        [a.relative_attention_bias.weight.grad for a in tables(model)],
                                        eager_grads(torch.float32), eager_grads(torch.float64)):
        _assert_2x(f"{name} table", ours, eager, ref64, torch.float32)


def test_a_trained_table_in_a_graph_without_attention_is_rewritten_too():
    """A graph break can put the position-bias lookup in a graph of its own: a trained few-row table is traced and
    rewritten there too, and the report names it."""
    torch.manual_seed(0)
    table = torch.nn.Embedding(32, 8).to(DEVICE)
    indices = torch.randint(0, 32, (50, 50), device=DEVICE)

    def loss():
        return (table(indices) ** 2).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, backend="fuse_attn")
    _, code, reports = compiled_code(lambda: compiled().backward())
    assert [len(r.tables) for r in reports] == [1] and "a [32, 8] table" in reports[0].tables[0].line()
    assert "embedding_dense_backward" not in code
    ours = table.weight.grad.clone()
    table.weight.grad = None
    loss().backward()
    eager = table.weight.grad
    ref64 = eb.reference_table_gradient((2 * table.weight.detach().double())[indices.reshape(-1)],
                                        indices.reshape(-1), 32, -1)
    _assert_2x("table", ours, eager, ref64, torch.float32)


@pytest.mark.parametrize("attention_in_the_region", [True, False])
def test_a_table_looked_up_in_an_activation_checkpointed_region(attention_in_the_region):
    """Hugging Face's gradient checkpointing wraps each block, T5's first one computing the bias: the region's lookup
    is rewritten with its attention, or alone where the region holds only the lookup (the graph's softmax outside
    every region is then left alone, as any)."""
    torch.manual_seed(0)
    heads, n, d = 2, 21, 16
    module = RelativeBiasAttention(heads).to(DEVICE)
    q, k, v = (torch.randn(1, heads, n, d, device=DEVICE, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, heads, n, d, device=DEVICE)
    checkpoint = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)

    def bias(q):
        position = torch.arange(q.shape[2], device=q.device)
        bucket = (position[None, :] - position[:, None]).clamp(-15, 16) + 15
        return module.relative_attention_bias(bucket).permute(2, 0, 1).unsqueeze(0)

    def fn(q, k, v):
        if attention_in_the_region:
            return checkpoint(module, q, k, v)
        return (q @ k.transpose(-1, -2) + checkpoint(bias, q)).softmax(-1) @ v

    torch._dynamo.reset()
    _, code, reports = compiled_code(lambda: torch.compile(fn, backend="fuse_attn")(q, k, v).backward(dout))
    assert [len(r.tables) for r in reports] == [1]
    assert [len(r.fused) for r in reports] == [1 if attention_in_the_region else 0]
    assert "embedding_dense_backward" not in code
    ours = module.relative_attention_bias.weight.grad
    _assert_2x("table", ours, _eager_table_grad(module, (q, k, v), dout, torch.float32),
               _eager_table_grad(module, (q, k, v), dout, torch.float64), torch.float32)


def test_explain_names_the_table_it_would_rewrite():
    heads, n, d = 2, 9, 16
    module = RelativeBiasAttention(heads).to(DEVICE)
    q, k, v = (torch.randn(1, heads, n, d, device=DEVICE, requires_grad=True) for _ in range(3))
    torch._dynamo.reset()
    text = str(fuse_attn.explain(module, q, k, v))
    assert "1 attention(s) fused" in text and "table gradient by partial sums" in text and "a [32, 2] table" in text
    with torch.no_grad():  # no gradient, no table gradient
        torch._dynamo.reset()
        assert "table gradient" not in str(fuse_attn.explain(module, q, k, v))


@pytest.mark.parametrize("buckets, scale_grad_by_freq, frozen", [
    (eb.MAX_ROWS + 1, False, False),  # more rows than a program's accumulator holds
    (32, True, False),  # gradients scaled by the indices' frequencies
    (32, False, True),  # a table that needs no gradient
])
def test_other_tables_keep_inductors_embedding(buckets, scale_grad_by_freq, frozen):
    torch.manual_seed(0)
    heads, n, d = 2, 20, 16
    module = RelativeBiasAttention(heads, buckets).to(DEVICE)
    module.relative_attention_bias.scale_grad_by_freq = scale_grad_by_freq
    module.relative_attention_bias.weight.requires_grad_(not frozen)
    q, k, v = (torch.randn(1, heads, n, d, device=DEVICE, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, heads, n, d, device=DEVICE)
    out, code, reports = _compiled_step(module, q, k, v, dout)
    assert [len(r.fused) for r in reports] == [1]
    assert "table_gradient" not in code and "table_lookup" not in code
    assert ("embedding_dense_backward" in code) == (not frozen)
    torch.testing.assert_close(out, module(q, k, v))


class TestGoldenGraph(TestCase):
    def test_a_trained_few_row_table_is_looked_up_by_the_op_whose_backward_sums_by_programs(self):
        # T5's position bias: a [4, 3] table looked up at each (query, key) pair's bucket; the lookup keeps its
        # place, as fuse_attn::table_lookup (its backward is fuse_attn::table_gradient), and the bias its copy
        def fn(q, k, v, table, buckets):
            bias = F.embedding(buckets, table).permute(2, 0, 1).unsqueeze(0)
            return torch.softmax(q @ k.transpose(-1, -2) + bias, -1) @ v

        # (on the device the table's kernel runs on: CUDA, or the CPU under the interpreter -- eb.handles)
        torch.manual_seed(0)
        q, k, v = (torch.randn(2, 3, 5, 8, device=DEVICE) for _ in range(3))
        table = torch.randn(4, 3, device=DEVICE, requires_grad=True)
        reports = rewrite_reports(fn, q, k, v, table, torch.randint(0, 4, (5, 5), device=DEVICE), training=True)
        self.assertExpectedInline(graph_text(reports[0]), """\
    def forward(self, arg0_1: "i64[5, 5]", arg1_1: "f32[4, 3]", arg2_1: "f32[2, 3, 5, 8]", arg3_1: "f32[2, 3, 5, 8]", arg4_1: "f32[2, 3, 5, 8]"):
        table_lookup_default: "f32[5, 5, 3]" = torch.ops.fuse_attn.table_lookup.default(arg1_1, arg0_1, -1)
        permute: "f32[3, 5, 5]" = torch.ops.aten.permute.default(table_lookup_default, [2, 0, 1])
        clone_default: "f32[3, 5, 5]" = torch.ops.aten.clone.default(permute, memory_format = torch.contiguous_format)
        unsqueeze_default: "f32[1, 3, 5, 5]" = torch.ops.aten.unsqueeze.default(clone_default, 0)
        flash_attention_default = torch.ops.fuse_attn.flash_attention.default(arg3_1, arg2_1, arg4_1, [unsqueeze_default], None, '{"causal": null, "dropout_p": 0.0, "dtype": "float32", "empty_rows": "nan", "gqa_group": 1, "head_dim": 8, "head_dim_v": 8, "kv_len": 5, "num_heads": 3, "q_len": 5, "scale": 1.0, "scale_head_dim_power": 0.0, "score_program": [{"args": [], "op": "score", "value": null}, {"args": [], "op": "load", "value": 0}, {"args": [0, 1], "op": "add", "value": null}], "score_tensors": [{"broadcast": [true, false, false, false], "dtype": "float32", "role": "bias"}]}')
        getitem: "f32[2, 3, 5, 8]" = flash_attention_default[0]
        return (getitem,)""")
