"""Dynamic shapes: a model compiled once serves many sequence lengths and batch sizes without recompiling
(``dynamic=True``, ``torch._dynamo.mark_dynamic``, and automatic dynamic after the first recompile), with the
attention fused in that one graph and every length right under the 2x rule against fp64, inference and training.
(That tuned kernel configs are shared by the lengths of a power-of-two bucket is tests/kernels/test_tuning.py's.)

Compiles are counted by wrapping the backend (``CompileCounterWithBackend`` calls the real ``fuse_attn`` backend
once per graph Dynamo compiles), rewrites by ``collect_reports`` (one report per graph the backend rewrote).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from fuse_attn.kernels.generated import decode
from fuse_attn.report import collect_reports
from fuse_attn.spec import CausalMask

from examples.attention_forms import NanoGPTAttention
from tests.support.compiled_modules import compiled_kernels_or_blockwise
from tests.support.numerics import check_close

# Ten lengths, odd and even, none a multiple of the interpreter's 16/32 blocks except 32 (block edges too).
LENGTHS = (5, 7, 9, 12, 16, 17, 23, 29, 32, 37)


def arange_causal(q, k, v):
    """A causal mask from index comparisons of the run-time lengths (symbolic under dynamic shapes)."""
    M, N = q.shape[-2], k.shape[-2]
    future = torch.arange(N, device=q.device)[None, :] > torch.arange(M, device=q.device)[:, None]
    w = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).masked_fill(future, float("-inf"))
    return torch.softmax(w, -1) @ v


class Models:
    """The same module three times: fp64 reference, eager in the working dtype, and the copy that is compiled."""

    def __init__(self, model: torch.nn.Module, device: str, dtype: torch.dtype):
        self.ref = copy.deepcopy(model).to(device, torch.float64)
        self.eager = copy.deepcopy(model).to(device, dtype)
        self.ours = copy.deepcopy(model).to(device, dtype)
        self.device, self.dtype = device, dtype

    def check(self, compiled, x: torch.Tensor, *, train: bool, mark_dims=(), what=""):
        """One call of ``compiled`` on ``x`` against eager and fp64: output, and in training the input's and every
        parameter's gradient."""
        inputs = {}
        for name, dtype in (("ref", torch.float64), ("eager", self.dtype), ("ours", self.dtype)):
            inputs[name] = x.to(self.device, dtype).detach().requires_grad_(train)
        for dim in mark_dims:
            torch._dynamo.mark_dynamic(inputs["ours"], dim)
        for model in (self.ref, self.eager, self.ours):
            model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(train):
            ours, eager, ref = compiled(inputs["ours"]), self.eager(inputs["eager"]), self.ref(inputs["ref"])
        check_close(ours, eager, ref, self.dtype, f"output {what}")
        if not train:
            return
        grad_out = torch.randn(ref.shape, dtype=torch.float64, device=self.device)
        for out, name in ((ref, "ref"), (eager, "eager"), (ours, "ours")):
            out.backward(grad_out.to(out.dtype))
        check_close(inputs["ours"].grad, inputs["eager"].grad, inputs["ref"].grad, self.dtype, f"grad of x {what}")
        params = zip(self.ours.named_parameters(), self.eager.parameters(), self.ref.parameters())
        for (name, o), e, r in params:
            check_close(o.grad, e.grad, r.grad, self.dtype, f"grad of {name} {what}")


def fused_once(reports) -> None:
    """Exactly one graph was rewritten, with its one attention fused."""
    assert len(reports) == 1, f"{len(reports)} graphs were rewritten"
    assert [v.fused for v in reports[0].verdicts] == [True], "\n".join(v.line() for v in reports[0].verdicts)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_ten_lengths_one_compile(target, train):
    """``dynamic=True``: ten sequence lengths, one compile, one fused graph, each length right."""
    device, dtype = target
    torch.manual_seed(0)
    models = Models(NanoGPTAttention(width=32, heads=2, block_size=64), device, dtype)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("fuse_attn")
    compiled = torch.compile(models.ours, backend=counter, dynamic=True)
    with collect_reports() as reports:
        for length in LENGTHS:
            models.check(compiled, torch.randn(2, length, 32), train=train, what=f"at length {length}")
    assert counter.frame_count == 1
    fused_once(reports)
    spec = reports[0].verdicts[0].spec
    assert spec.q_len is None and spec.kv_len is None  # symbolic: the kernels take the lengths at run time
    assert spec.causal == CausalMask(diagonal=0) and spec.score_tensors == ()  # the sliced buffer: a band


def test_mark_dynamic_sequence_and_batch(target):
    """``mark_dynamic`` on the batch and sequence dims (the rest static): one compile for ten (batch, length)
    pairs. Batch sizes start at 2: Dynamo specializes sizes 0 and 1, so batch 1 would be a graph of its own."""
    device, dtype = compiled_kernels_or_blockwise(target)
    torch.manual_seed(1)
    models = Models(NanoGPTAttention(width=32, heads=2, block_size=64), device, dtype)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("fuse_attn")
    compiled = torch.compile(models.ours, backend=counter)
    with collect_reports() as reports:
        for i, length in enumerate(LENGTHS):
            batch = 2 + i % 3
            models.check(compiled, torch.randn(batch, length, 32), train=False, mark_dims=(0, 1),
                         what=f"at batch {batch}, length {length}")
    assert counter.frame_count == 1
    fused_once(reports)
    spec = reports[0].verdicts[0].spec
    assert spec.q_len is None and spec.kv_len is None


def test_automatic_dynamic_after_one_recompile(target):
    """Without ``dynamic=``: the first length compiles static, the second recompiles with a symbolic length, and
    the other eight reuse that graph; both graphs recognize the causal mask (blocks skipped)."""
    device, dtype = compiled_kernels_or_blockwise(target)
    torch.manual_seed(2)
    models = Models(NanoGPTAttention(width=32, heads=2, block_size=64), device, dtype)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("fuse_attn")
    compiled = torch.compile(models.ours, backend=counter)
    with collect_reports() as reports:
        for length in LENGTHS:
            models.check(compiled, torch.randn(2, length, 32), train=False, what=f"at length {length}")
    assert counter.frame_count == 2
    assert [[v.fused for v in r.verdicts] for r in reports] == [[True], [True]]
    static, dynamic = (r.verdicts[0].spec for r in reports)
    assert static.q_len == 5 and dynamic.q_len is None
    for spec in (static, dynamic):
        assert spec.causal == CausalMask(diagonal=0) and spec.score_tensors == ()


def test_changing_batch_size_recompiles_once(target):
    """Generation with a changing batch size (requests joining and leaving): one recompile to a symbolic batch,
    then every batch size reuses it, with the results right."""
    device, dtype = compiled_kernels_or_blockwise(target)
    torch.manual_seed(3)
    models = Models(NanoGPTAttention(width=32, heads=2, block_size=64), device, dtype)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("fuse_attn")
    compiled = torch.compile(models.ours, backend=counter)
    with collect_reports() as reports:
        for batch in (2, 3, 5, 4, 7, 2):
            models.check(compiled, torch.randn(batch, 11, 32), train=False, what=f"at batch {batch}")
    assert counter.frame_count == 2
    assert [[v.fused for v in r.verdicts] for r in reports] == [[True], [True]]
    # the length stayed static: the causal mask is still recognized in the recompiled graph
    assert reports[1].verdicts[0].spec.causal is not None


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_arange_mask_of_symbolic_lengths_does_not_specialize(target, train):
    """A causal mask built from ``arange`` of symbolic lengths is read from its index expression (a predicate of
    ``j - i``) and becomes the kernels' causal band, whatever the lengths: no guard ties the graph to a length, one
    compile serves ten lengths, with fewer queries than keys."""
    device, dtype = compiled_kernels_or_blockwise(target)
    torch.manual_seed(4)

    class Attention(torch.nn.Module):
        def forward(self, x):
            q, k, v = x.unflatten(-1, (3, 16)).unbind(-2)
            # queries: the last tokens (fewer queries than keys) or all tokens
            return arange_causal(q[:, :, q.shape[2] // 2:], k, v)

    models = Models(Attention(), device, dtype)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("fuse_attn")
    compiled = torch.compile(models.ours, backend=counter, dynamic=True)
    with collect_reports() as reports:
        for length in LENGTHS:
            models.check(compiled, torch.randn(2, 2, length, 48), train=train, what=f"at length {length}")
    assert counter.frame_count == 1
    fused_once(reports)
    spec = reports[0].verdicts[0].spec
    assert spec.causal == CausalMask(diagonal=0) and spec.score_program == () and spec.q_len is None


def test_more_queries_than_keys_under_dynamic_lengths(target):
    """q_len > k_len (cross attention onto a shorter memory), both lengths symbolic: fused, right, one compile."""
    device, dtype = compiled_kernels_or_blockwise(target)
    torch.manual_seed(5)

    class CrossAttention(torch.nn.Module):
        def forward(self, x):
            q, kv = x[:, :, :, :16], x[:, :, : x.shape[2] // 3, 16:]
            k, v = kv.chunk(2, dim=-1)
            return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(16), -1) @ v

    models = Models(CrossAttention(), device, dtype)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("fuse_attn")
    compiled = torch.compile(models.ours, backend=counter, dynamic=True)
    with collect_reports() as reports:
        for length in LENGTHS[2:5]:
            models.check(compiled, torch.randn(2, 2, length, 48), train=True, what=f"at q_len {length}")
    assert counter.frame_count == 1
    fused_once(reports)



@pytest.mark.parametrize("fill", ["-inf", "finfo.min"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_more_queries_than_keys_with_a_bottom_right_causal_mask(target, fill, dynamic):
    """q_len > k_len under a bottom-right causal mask (a KV-cache mask ``j <= i + (N - M)``): the first M - N query
    rows see no key. Fused as eager computes it: NaN rows for a -inf fill, a uniform average for finfo.min; the
    other rows under the 2x rule."""
    device, dtype = compiled_kernels_or_blockwise(target)
    torch.manual_seed(6)

    def attention(q, k, v):
        M, N = q.shape[-2], k.shape[-2]
        future = torch.arange(N, device=q.device)[None, :] > torch.arange(M, device=q.device)[:, None] + (N - M)
        value = float("-inf") if fill == "-inf" else torch.finfo(q.dtype).min
        w = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).masked_fill(future, value)
        return torch.softmax(w, -1) @ v

    torch._dynamo.reset()
    compiled = torch.compile(attention, backend="fuse_attn", dynamic=dynamic)
    with collect_reports() as reports:
        for M, N in ((14, 6),):
            q = torch.randn(1, 2, M, 16, device=device, dtype=torch.float64)
            k, v = (torch.randn(1, 2, N, 16, device=device, dtype=torch.float64) for _ in range(2))
            low = [t.to(dtype) for t in (q, k, v)]
            ours, eager, ref = compiled(*low), attention(*low), attention(q, k, v)
            nan_rows = ref.isnan().any(-1)
            assert bool(nan_rows[..., : M - N].all()) == (fill == "-inf") and not nan_rows[..., M - N:].any()
            assert torch.equal(ours.isnan(), eager.isnan()) and torch.equal(eager.isnan(), ref.isnan())
            seen = ~nan_rows
            check_close(ours[seen], eager[seen], ref[seen], dtype, f"rows that see a key, M={M} N={N}")
    assert all(v.fused for r in reports for v in r.verdicts) and reports


@pytest.mark.parametrize("form", ["sdpa bool mask", "eager finfo.min"])
def test_padded_keys_are_skipped_under_dynamic_lengths(target, form):
    """A [B, N] padding vector under ``dynamic=True``: SDPA's bool mask (rows with no key give 0) and eager
    attention's additive finfo.min mask (a batch row of padding only is uniform). Each batch row's key range is
    computed in the graph from the symbolic length (the kernels skip the key blocks outside it; the verdict says
    so): one compile, every length right, output and gradient, with right padding, half padding, and a batch row of
    one key (SDPA's form) or none (eager's).

    On a GPU, a query length on each side of the split-K decode kernel's row bound (decode.MAX_ROWS) compiles
    once more: the op chooses that kernel for short queries with a guard (``dispatch_splits``)."""
    device, dtype = target
    torch.manual_seed(6)
    lengths = (17, 37, 70)

    def attention(x, keep):
        q, k, v = x.unflatten(-1, (3, 16)).unbind(-2)
        if form == "sdpa bool mask":
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
        # (Hugging Face's form: the additive mask in the scores' dtype, or bf16 scores would be promoted to fp32)
        s = q @ k.transpose(-1, -2) / 4 + torch.where(keep[:, None, None, :], 0.0, torch.finfo(dtype).min).to(dtype)
        return torch.softmax(s, -1) @ v

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("fuse_attn")
    compiled = torch.compile(attention, backend=counter, dynamic=True)
    with collect_reports() as reports:
        for length in lengths:
            last = 1 if form == "sdpa bool mask" else 0
            keep = torch.arange(length)[None, :] < torch.tensor([length, length // 2, last])[:, None]
            x = torch.randn(3, 2, length, 48)
            results = []
            for run, cast in ((compiled, dtype), (attention, dtype), (attention, torch.float64)):
                xi = x.to(device, cast).requires_grad_()
                out = run(xi, keep.to(device))
                (grad,) = torch.autograd.grad(out, xi, torch.ones_like(out))
                results.append((out, grad))
            (ours, ours_grad), (eager, eager_grad), (ref, ref_grad) = results
            check_close(ours, eager, ref, dtype, f"output at length {length}")
            check_close(ours_grad, eager_grad, ref_grad, dtype, f"gradient at length {length}")
    sides_of_the_decode_bound = {length <= decode.MAX_ROWS for length in lengths}
    assert counter.frame_count == (len(sides_of_the_decode_bound) if device == "cuda" else 1)
    assert len(reports) == counter.frame_count
    for report in reports:
        fused_once([report])
    assert "padded keys skipped" in reports[0].verdicts[0].line(), reports[0].verdicts[0].line()


class LearnedBiasAttention(torch.nn.Module):
    """Self-attention with a learned [1, heads, length, length] bias that every batch row shares (T5's and Swin's
    position biases are such tensors)."""

    def __init__(self, width=32, heads=2, length=17):
        super().__init__()
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.bias = torch.nn.Parameter(torch.randn(1, heads, length, length))
        self.heads = heads

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(x).split(C, 2))
        w = q @ k.transpose(-1, -2) * (C // self.heads) ** -0.5 + self.bias
        return (torch.softmax(w, -1) @ v).transpose(1, 2).reshape(B, T, C)


def test_a_bias_the_batch_shares_under_a_symbolic_batch(target):
    """A learned bias broadcast over the batch runs the grid with the batch rows side by side (BATCH_INNER), whose
    program ids divide by the batch size: with a symbolic batch, one compile serves batches 2, 3 and 5, output and
    gradients (the bias's accumulated over the batch) right under the 2x rule."""
    device, dtype = target
    torch.manual_seed(7)
    models = Models(LearnedBiasAttention(), device, dtype)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("fuse_attn")
    compiled = torch.compile(models.ours, backend=counter)
    with collect_reports() as reports:
        for batch in (2, 3, 5):
            models.check(compiled, torch.randn(batch, 17, 32), train=True, mark_dims=(0,), what=f"at batch {batch}")
    assert counter.frame_count == 1
    fused_once(reports)
    assert [t.broadcast for t in reports[0].verdicts[0].spec.score_tensors] == [(True, False, False, False)]
