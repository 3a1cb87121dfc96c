"""SDPA's kernels and the Gluon forward as candidates of a matched attention (fuse_attn/kernels/dispatch.py).

No GPU here: the timing is replaced (the GPU itself, the device identity and the CUDA-graph steps) and SDPA's
candidates are admitted for CPU tensors, whose graphs the rewrite can trace (the fused op's fake propagation on a
CUDA tensor would tune its kernels), so that what is tested is the eligibility of a spec, the choice and its cache entry, the
FUSE_ATTN_CANDIDATES switch, and the graph the rewrite emits for each choice. The Gluon forward is admitted by
standing in for its eligibility (``gluon_reasons``: an sm90 GPU). The GPU run of the same choices, with numerics, is
in test_compose / the device checks (docs/testing.md)."""

from __future__ import annotations

import logging

import pytest
import torch
from expecttest import TestCase
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from fuse_attn import settings
from fuse_attn.kernels import dispatch, ops, tuning
from fuse_attn.kernels.dispatch import GLUON, SDPA_CUDNN, SDPA_FLASH, TRITON
from fuse_attn.graph.matching import MatchContext
from fuse_attn.report import collect_reports
from fuse_attn.graph.rewrite import rewrite_attention
from fuse_attn.spec import AttentionSpec, CausalMask
from fuse_attn.score_program import ScoreNode, ScoreTensor
from tests.support.fuzz_cases import BIAS_PROGRAM, record_templates_backward
from tests.support.graph_capture import graph_text
from tests.kernels.test_mask_blocks import causal_fill, documents_spec, documents_tensors, mask_case


def causal_attention(q, k, v):
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    n = q.shape[-2]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v


def gqa_attention(q, k, v):  # Hugging Face's repeat_kv, then plain attention
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    return torch.softmax(q @ k.transpose(-1, -2) * 0.125, dim=-1) @ v


def softcapped(q, k, v):
    scores = torch.tanh(q @ k.transpose(-1, -2) / 50) * 50
    return torch.softmax(scores, dim=-1) @ v


def dropped_out(q, k, v):  # attention dropout, which the Gluon kernels do not have
    return torch.nn.functional.dropout(torch.softmax(q @ k.transpose(-1, -2), dim=-1), 0.1, training=True) @ v


def biased(q, k, v, bias):  # a precomputed bias (ALiBi's [1, H, N, N] buffer) added to the scores
    return torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + bias, dim=-1) @ v


def rewritten(fn, shapes, *, dtype=torch.bfloat16, training=False, needing_grad=(), integers=None):
    """``fn`` traced on fake tensors and rewritten: (graph text, verdict lines). ``needing_grad``: the indices of the
    inputs that require a gradient; ``integers``: {index: high} of int64 inputs in [0, high)."""
    report = rewrite_report(fn, shapes, dtype=dtype, training=training, needing_grad=needing_grad, integers=integers)
    return graph_text(report), "\n".join(v.line() for v in report.verdicts)


def rewrite_report(fn, shapes, *, dtype=torch.bfloat16, training=False, needing_grad=(), integers=None):
    """The rewrite's report of ``fn`` (:func:`rewritten`'s arguments)."""
    integers = integers or {}
    inputs = [torch.randint(0, integers[i], s) if i in integers else torch.randn(s, dtype=dtype)
              for i, s in enumerate(shapes)]
    traced = make_fx(fn, pre_dispatch=True, tracing_mode="fake")(*inputs)
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    ctx = MatchContext(constant_inputs={}, gm=traced, inputs_needing_grad=frozenset(placeholders[i] for i in needing_grad))
    return rewrite_attention(traced, ctx, capture=True, training=training)


MHA = [(2, 4, 128, 64)] * 3
GQA = [(2, 8, 128, 64), (2, 2, 128, 64), (2, 2, 128, 64)]


class FakeTimings:
    """The GPU the choice sees: milliseconds per candidate, and which candidates were timed."""

    def __init__(self, times):
        self.times = dict(times)
        self.timed = []

    def time_config(self, launch, candidate, rep_ms):
        launch(candidate)
        self.timed.append(candidate.name)
        return self.times[candidate.name]


CANDIDATE_STEPS = dispatch._CandidateSteps  # (the gpu fixture replaces it with NoSteps)


class NoSteps:
    """Stands in for _CandidateSteps: nothing to record or replay without a GPU (the template timed as it comes)."""

    def __init__(self, *args, **kwargs):
        pass

    def replay(self, candidate):
        pass

    def compile_only(self, candidate):
        pass

    def tune_the_template_where_it_can_win(self, timed):
        return []

    def release_graphs(self):
        pass


@pytest.fixture
def gpu(tmp_path, monkeypatch):
    def install(times):
        timings = FakeTimings(times)
        monkeypatch.setattr(tuning, "_time_config", timings.time_config)
        return timings

    monkeypatch.setenv("FUSE_ATTN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FUSE_ATTN_CACHE", raising=False)
    monkeypatch.delenv("FUSE_ATTN_AUTOTUNE", raising=False)
    monkeypatch.delenv(settings.CANDIDATES, raising=False)
    monkeypatch.setattr(tuning, "_chosen", {})
    monkeypatch.setattr(tuning, "device_identity", lambda device: ("Fake GPU 80GB", "9.0"))
    monkeypatch.setattr(tuning, "software_versions", lambda: ("3.9.0", "2.13.0"))
    monkeypatch.setattr(dispatch, "_CandidateSteps", NoSteps)
    monkeypatch.setattr(dispatch, "_SDPA_DEVICE_TYPES", ("cuda", "cpu"))
    return install


def on_hopper(monkeypatch):
    """The Gluon forward's eligibility as on an H100 (these tensors are on the CPU): its reasons but the GPU's."""
    from fuse_attn.kernels.hopper import common as hopper_common

    real = hopper_common.hopper_reasons
    monkeypatch.setattr(hopper_common, "hopper_reasons",
                        lambda spec, q, k: [r for r in real(spec, q, k) if "sm90" not in r])


# large enough for the Gluon kernels (GLUON_MIN_STEP_FLOPS): 4 x 16 x 2048^2 x 64 x 4 = 68.7 GFLOP, 3.5x trained
GQA_LONG = [(4, 16, 2048, 64), (4, 4, 2048, 64), (4, 4, 2048, 64)]


class TestEmittedGraphs(TestCase):
    @pytest.fixture(autouse=True)
    def _gpu(self, gpu):
        self.gpu = gpu

    def test_cudnn_timed_fastest_runs_in_the_graph(self):
        timings = self.gpu({TRITON: 0.30, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})
        graph, verdicts = rewritten(causal_attention, MHA, training=True)
        self.assertEqual(set(timings.timed), {TRITON, SDPA_CUDNN, SDPA_FLASH})
        self.assertExpectedInline(verdicts, """fused softmax: bfloat16 D=64 M=128 N=128 scale=0.125 causal(top_left, diagonal=0); runs sdpa_cudnn: fastest of triton, sdpa_cudnn, sdpa_flash, forward+backward timed on Fake GPU 80GB""")
        self.assertExpectedInline(graph, """\
    def forward(self, q_1: "bf16[2, 4, 128, 64]", k_1: "bf16[2, 4, 128, 64]", v_1: "bf16[2, 4, 128, 64]"):
        _scaled_dot_product_cudnn_attention_default = torch.ops.aten._scaled_dot_product_cudnn_attention.default(q_1, k_1, v_1, None, True, 0.0, True, False, scale = 0.125)
        getitem: "bf16[2, 4, 128, 64]" = _scaled_dot_product_cudnn_attention_default[0]
        return getitem""")

    def test_flash_with_gqa_repeats_the_kv_heads_and_inference_keeps_no_lse(self):
        self.gpu({TRITON: 0.30, SDPA_CUDNN: 0.28, SDPA_FLASH: 0.25})
        graph, verdicts = rewritten(gqa_attention, GQA)
        self.assertIn("runs sdpa_flash: fastest of triton, sdpa_cudnn, sdpa_flash, forward timed", verdicts)
        self.assertExpectedInline(graph, """\
    def forward(self, q_1: "bf16[2, 8, 128, 64]", k_1: "bf16[2, 2, 128, 64]", v_1: "bf16[2, 2, 128, 64]"):
        repeat_interleave_self_int: "bf16[2, 8, 128, 64]" = torch.ops.aten.repeat_interleave.self_int(k_1, 4, 1)
        repeat_interleave_self_int_1: "bf16[2, 8, 128, 64]" = torch.ops.aten.repeat_interleave.self_int(v_1, 4, 1)
        _scaled_dot_product_flash_attention_default = torch.ops.aten._scaled_dot_product_flash_attention.default(q_1, repeat_interleave_self_int, repeat_interleave_self_int_1, 0.0, False, False, scale = 0.125)
        getitem: "bf16[2, 8, 128, 64]" = _scaled_dot_product_flash_attention_default[0]
        return getitem""")

    def test_generated_kernels_timed_fastest_run_the_fused_op(self):
        self.gpu({TRITON: 0.20, SDPA_CUDNN: 0.28, SDPA_FLASH: 0.25})
        graph, verdicts = rewritten(causal_attention, MHA)
        self.assertIn("runs triton: fastest of", verdicts)
        self.assertIn("torch.ops.fuse_attn.flash_attention.default(q_1, k_1, v_1, [], None", graph)

    def test_candidates_switch_triton_times_nothing_and_reports_no_choice(self):
        timings = self.gpu({TRITON: 0.30, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(settings.CANDIDATES, "triton")
            graph, verdicts = rewritten(causal_attention, MHA, training=True)
        self.assertEqual(timings.timed, [])
        self.assertNotIn("runs", verdicts)
        self.assertIn("torch.ops.fuse_attn.flash_attention.default", graph)

    def test_the_gluon_forward_timed_fastest_runs_its_op(self):
        with pytest.MonkeyPatch.context() as mp:
            on_hopper(mp)
            timings = self.gpu({TRITON: 0.30, GLUON: 0.18, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})
            graph, verdicts = rewritten(gqa_attention, GQA_LONG, training=True)
        self.assertEqual(set(timings.timed), {TRITON, GLUON, SDPA_CUDNN, SDPA_FLASH})
        self.assertExpectedInline(verdicts, """fused softmax: bfloat16 D=64 M=2048 N=2048 scale=0.125 gqa=4; runs gluon: fastest of triton, gluon, sdpa_cudnn, sdpa_flash, forward+backward timed on Fake GPU 80GB""")
        self.assertIn("torch.ops.fuse_attn.flash_attention_hopper.default(q_1, k_1, v_1, '{", graph)
        self.assertNotIn("repeat_interleave", graph)  # the kernel shares each kv head, as the template does

    def test_the_gluon_kernels_timed_fastest_take_an_added_bias(self):
        with pytest.MonkeyPatch.context() as mp:
            on_hopper(mp)
            timings = self.gpu({TRITON: 0.30, GLUON: 0.18, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})
            graph, verdicts = rewritten(biased, [(4, 16, 2048, 64)] * 3 + [(1, 16, 2048, 2048)], training=True)
        self.assertEqual(set(timings.timed), {TRITON, GLUON})  # (SDPA's kernels take no bias)
        self.assertIn("runs gluon: fastest of triton, gluon, forward+backward", verdicts)
        self.assertRegex(graph,
                         r"torch\.ops\.fuse_attn\.flash_attention_hopper\.default\(q_1, k_1, v_1, '\{.*\}', bias_1\)")

    def test_a_bias_with_and_without_its_gradient_is_timed_apart(self):
        """The choice's cache key says whether the bias needs a gradient -- the Gluon candidate's step differs (its own
        backward, or the template's after its forward) -- and whether TMA can read it in place (the Gluon kernels'
        other path loads it: a bias whose keys are strided)."""
        spec = AttentionSpec(dtype="bfloat16", head_dim=64, head_dim_v=64, scale=0.125, score_program=BIAS_PROGRAM,
                             score_tensors=(ScoreTensor("bias", "bfloat16", (True, False, False, False)),))
        with pytest.MonkeyPatch.context() as mp:
            on_hopper(mp)
            timings = self.gpu({TRITON: 0.30, GLUON: 0.18})
            with FakeTensorMode():
                q, k, v = (torch.empty(4, 16, 2048, 64, dtype=torch.bfloat16) for _ in range(3))
                biases = [torch.empty(1, 16, 2048, 2048, dtype=torch.bfloat16, requires_grad=g) for g in (False, True, False)]
                biases.append(torch.empty(1, 16, 2048, 2048, dtype=torch.bfloat16).transpose(2, 3))
            timed = []
            for bias in biases:
                dispatch.choose_implementation(spec, q, k, v, True, [bias])
                timed.append(len(timings.timed))
        self.assertEqual(set(timings.timed), {TRITON, GLUON})
        # the third: the first's choice, cached; the fourth (strided keys) timed again
        self.assertEqual(timed, [timed[0], 2 * timed[0], 2 * timed[0], 3 * timed[0]])

    def test_a_bias_computed_from_a_parameter_is_timed_with_its_gradient(self):
        """The graph is traced below autograd (no value in it requires grad): which score tensors need a gradient
        follows the graph from the inputs that require one (T5's position bias, from its embedding table), with grad
        mode as the graph sets it and not through detach or integer ops."""
        def learned(q, k, v, table, buckets):
            return biased(q, k, v, table[buckets].permute(2, 0, 1).unsqueeze(0))

        def detached(q, k, v, table, buckets):
            return biased(q, k, v, table[buckets].permute(2, 0, 1).unsqueeze(0).detach())

        def under_no_grad(q, k, v, table, buckets):
            with torch.no_grad():
                bias = table[buckets].permute(2, 0, 1).unsqueeze(0) * 2
            return biased(q, k, v, bias)

        def integer(q, k, v, table, buckets):  # (a bias from the buckets alone: nothing to differentiate)
            return biased(q, k, v, (buckets * 2).to(q.dtype).unsqueeze(0).unsqueeze(0))

        seen = []
        choose = dispatch.choose_implementation
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(dispatch, "choose_implementation", lambda *a, **kw: seen.append(a[-1]) or choose(*a, **kw))
            for fn in (learned, detached, under_no_grad, integer):
                rewritten(fn, [(4, 16, 64, 64)] * 3 + [(32, 16), (64, 64)], training=True, needing_grad=(3,),
                          integers={4: 32})
        self.assertEqual(seen, [[True], [False], [False], [False]])

    def test_the_gluon_forward_is_timed_only_where_it_applies(self):
        with pytest.MonkeyPatch.context() as mp:
            on_hopper(mp)
            timings = self.gpu({TRITON: 0.30, GLUON: 0.18, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})
            mp.setenv(settings.CANDIDATES, "triton,gluon")
            _, verdicts = rewritten(causal_attention, [(4, 16, 2048, 32)] * 3)  # head dim 32
            self.assertEqual(timings.timed, [])
            self.assertNotIn("runs", verdicts)
            rewritten(dropped_out, [(4, 16, 2048, 64)] * 3)  # dropout
            self.assertEqual(timings.timed, [])
            rewritten(gqa_attention, GQA, training=True)  # 4 x 8 x 128^2 x 64 x 2 x 3.5: its host cost would show
            self.assertEqual(timings.timed, [])
            rewritten(gqa_attention, [(2, 16, 1024, 64), (2, 4, 1024, 64), (2, 4, 1024, 64)])  # 2^33, forward only
            self.assertEqual(timings.timed, [])
            rewritten(gqa_attention, GQA_LONG, training=True)  # 240 GFLOP: large enough
            self.assertEqual(set(timings.timed), {TRITON, GLUON})

    def test_what_sdpa_cannot_compute_exactly_is_never_timed(self):
        timings = self.gpu({TRITON: 0.30, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})
        graph, verdicts = rewritten(softcapped, MHA)
        self.assertEqual(timings.timed, [])
        self.assertIn("torch.ops.fuse_attn.flash_attention.default", graph)
        self.assertNotIn("runs", verdicts)


def test_under_cuda_graphs_the_gluon_kernels_are_timed_at_every_size(gpu, monkeypatch):
    """A graph that replays as a CUDA graph (mode="reduce-overhead") runs no launcher on a replay: the Gluon kernels are
    timed for a step under GLUON_MIN_STEP_FLOPS too, and that choice is stored under a key of its own, so a graph
    compiled without CUDA graphs at the same size neither reads it nor runs them."""
    on_hopper(monkeypatch)
    timings = gpu({TRITON: 0.30, GLUON: 0.18, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})
    with dispatch.replayed_as_cuda_graphs():
        graph, verdicts = rewritten(gqa_attention, GQA, training=True)  # 4 x 8 x 128^2 x 64 x 2 x 3.5 FLOPs
    assert set(timings.timed) == {TRITON, GLUON, SDPA_CUDNN, SDPA_FLASH}
    assert "runs gluon" in verdicts and "flash_attention_hopper" in graph
    assert not dispatch._CUDA_GRAPHS  # (the block's end restores it)
    timings.timed.clear()
    graph, verdicts = rewritten(gqa_attention, GQA, training=True)
    assert set(timings.timed) == {TRITON, SDPA_CUDNN, SDPA_FLASH}
    assert "runs sdpa_cudnn" in verdicts and "flash_attention_hopper" not in graph


def test_the_gluon_kernels_are_offered_from_a_smaller_step_for_inference_than_for_training(gpu, monkeypatch):
    """GLUON_MIN_STEP_FLOPS by training: an inference forward of 2^35 FLOPs hides the forward launcher's host cost
    and is offered the Gluon kernels; the same attention trained (3.5x those FLOPs, under 2^37) has a backward whose
    launcher costs more, and is not."""
    on_hopper(monkeypatch)
    timings = gpu({TRITON: 0.30, GLUON: 0.18, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})
    shapes = [(2, 16, 2048, 64), (2, 4, 2048, 64), (2, 4, 2048, 64)]  # 4 x 2 x 16 x 2048^2 x 64 = 2^35 FLOPs
    graph, verdicts = rewritten(gqa_attention, shapes)
    assert GLUON in timings.timed and "runs gluon" in verdicts
    timings.timed.clear()
    graph, verdicts = rewritten(gqa_attention, shapes, training=True)
    assert set(timings.timed) == {TRITON, SDPA_CUDNN, SDPA_FLASH} and "runs sdpa_cudnn" in verdicts


def test_the_backend_tells_the_choice_whether_its_graphs_replay_as_cuda_graphs(monkeypatch):
    """mode="reduce-overhead" (Inductor's CUDA graphs) is known to each attention's choice while the backend rewrites;
    the default mode's graphs are not replayed so."""
    seen = []
    choose = dispatch.choose_implementation
    monkeypatch.setattr(dispatch, "choose_implementation",
                        lambda *args, **kwargs: seen.append(dispatch._CUDA_GRAPHS) or choose(*args, **kwargs))
    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))
    for mode in ("reduce-overhead", "default"):
        torch._dynamo.reset()
        torch.compile(causal_attention, backend="fuse_attn", mode=mode)(q, k, v)
    assert seen == [True, False]


def test_an_exported_program_never_times_the_gluon_forward(gpu, monkeypatch):
    """``fuse_exported`` sets the Gluon forward aside (its Python custom op was never tried in an AOTInductor package);
    the backend's rewrite of the same attention times it."""
    import fuse_attn

    on_hopper(monkeypatch)
    timings = gpu({TRITON: 0.30, GLUON: 0.18, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return gqa_attention(q, k, v)

    # 275 GFLOP forward: over GLUON_MIN_STEP_FLOPS without training's 3.5x
    shapes = [(4, 16, 4096, 64), (4, 4, 4096, 64), (4, 4, 4096, 64)]
    inputs = tuple(torch.randn(s, dtype=torch.bfloat16) for s in shapes)
    with fuse_attn.collect_reports() as reports:
        fuse_attn.fuse_exported(torch.export.export(Attention(), inputs))
    assert set(timings.timed) == {TRITON, SDPA_CUDNN, SDPA_FLASH}
    assert "runs sdpa_cudnn: fastest of triton, sdpa_cudnn, sdpa_flash, forward timed" in reports[0].verdicts[0].line()
    assert not dispatch._SET_ASIDE
    rewritten(gqa_attention, shapes, training=True)  # (another key than the export's)
    assert GLUON in timings.timed


def test_the_choice_is_stored_and_read_back_by_a_new_process(gpu, monkeypatch):
    gpu({TRITON: 0.30, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})
    rewritten(causal_attention, MHA, training=True)
    monkeypatch.setattr(tuning, "_chosen", {})  # a new process: memory empty, the disk cache stays
    timings = gpu({TRITON: 0.10, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})  # would now pick triton, if timed again
    graph, verdicts = rewritten(causal_attention, MHA, training=True)
    assert timings.timed == []
    assert "runs sdpa_cudnn" in verdicts and "_scaled_dot_product_cudnn_attention" in graph
    # inference is another key: timed on its own
    rewritten(causal_attention, MHA, training=False)
    assert set(timings.timed) == {TRITON, SDPA_CUDNN, SDPA_FLASH}


def test_a_choice_among_fewer_candidates_is_not_reused_when_more_are_allowed(gpu, monkeypatch):
    """A choice is kept for the candidates it was timed among: one made with cuDNN switched off (or
    FUSE_ATTN_CANDIDATES narrower) is not the answer once cuDNN is allowed again, in this process or the next."""
    gpu({TRITON: 0.30, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})
    monkeypatch.setenv(settings.CANDIDATES, "triton,sdpa_flash")
    _, verdicts = rewritten(causal_attention, MHA, training=True)
    assert "runs sdpa_flash" in verdicts
    monkeypatch.delenv(settings.CANDIDATES)
    timings = gpu({TRITON: 0.30, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})
    _, verdicts = rewritten(causal_attention, MHA, training=True)
    assert set(timings.timed) == {TRITON, SDPA_CUDNN, SDPA_FLASH} and "runs sdpa_cudnn" in verdicts
    monkeypatch.setattr(tuning, "_chosen", {})  # a new process, both choices on disk
    monkeypatch.setenv(settings.CANDIDATES, "triton,sdpa_flash")
    timings = gpu({TRITON: 0.30, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})
    _, verdicts = rewritten(causal_attention, MHA, training=True)
    assert timings.timed == [] and "runs sdpa_flash" in verdicts


@pytest.mark.parametrize("training, untuned_ms, tuned", [
    (True, 0.35, False),  # 1.75x the fastest other (cuDNN's 0.20), beyond what tuning gains trained (1.5x)
    (True, 0.28, True),  # 1.4x: it may win once tuned (and does: 0.18)
    (False, 0.27, False),  # 1.35x, beyond what tuning gains in a forward (1.25x)
    (False, 0.24, True),
])
def test_the_template_is_tuned_only_where_it_can_win(gpu, monkeypatch, training, untuned_ms, tuned):
    """The implementation choice times the generated kernels untuned (their first working configs: one compile per
    kernel) and tunes them (a compile per candidate config) only where they are within what tuning gains of the
    fastest other candidate; then it times them again, tuned."""
    times = {TRITON: 0.18, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.30}
    steps_made = []

    class Steps(CANDIDATE_STEPS):  # (the real one's choice; no recording)
        def __init__(self, spec, q, k, v, training, *args, template_untuned=False):
            self.spec, self.training, self.template_untuned, self.graphs = spec, training, template_untuned, {}
            self.timed = []
            steps_made.append(self)

        def replay(self, candidate):
            self.timed.append((candidate.name, candidate.name == TRITON and not self.template_untuned))

        def compile_only(self, candidate):
            pass

    def time_config(launch, candidate, rep_ms):
        launch(candidate)
        return untuned_ms if candidate.name == TRITON and steps_made[-1].template_untuned else times[candidate.name]

    monkeypatch.setattr(dispatch, "_CandidateSteps", Steps)
    monkeypatch.setattr(tuning, "_time_config", time_config)
    _, verdicts = rewritten(causal_attention, MHA, training=training)
    (steps,) = steps_made
    assert ((TRITON, True) in steps.timed) == tuned
    assert f"runs {TRITON if tuned else SDPA_CUDNN}: fastest of" in verdicts


def test_a_candidate_that_fails_is_dropped_and_timing_that_fails_keeps_the_generated_kernels(gpu, monkeypatch, caplog):
    timings = gpu({TRITON: 0.30, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})

    class CudnnRefuses(NoSteps):
        def replay(self, candidate):
            if candidate.name == SDPA_CUDNN:
                raise RuntimeError("cuDNN Frontend error: no valid execution plan")

    monkeypatch.setattr(dispatch, "_CandidateSteps", CudnnRefuses)
    _, verdicts = rewritten(causal_attention, MHA)
    assert "runs sdpa_flash" in verdicts

    class NothingRuns(NoSteps):
        def replay(self, candidate):
            raise RuntimeError("out of memory")

    monkeypatch.setattr(dispatch, "_CandidateSteps", NothingRuns)
    monkeypatch.setattr(tuning, "_chosen", {})
    with caplog.at_level(logging.WARNING, logger="fuse_attn.kernels"):
        graph, verdicts = rewritten(causal_attention, [(1, 4, 64, 64)] * 3)
    assert "torch.ops.fuse_attn.flash_attention.default" in graph
    assert "runs triton: timing the candidates failed (RuntimeError)" in verdicts
    assert "timing the implementations of" in caplog.text


def fake_qk(q_len=128, kv_len=128, dtype=torch.bfloat16, device="cuda"):
    with FakeTensorMode():
        return (torch.empty(2, 4, q_len, 64, dtype=dtype, device=device),
                torch.empty(2, 4, kv_len, 64, dtype=dtype, device=device))


PLAIN = AttentionSpec(dtype="bfloat16", head_dim=64, head_dim_v=64, scale=0.125)


@pytest.mark.parametrize("change, qk, reason", [
    ({}, {"device": "cpu"}, "run on CUDA devices"),
    ({"dtype": "float32"}, {"dtype": torch.float32}, "take fp16/bf16"),
    ({"score_program": (ScoreNode("score"), ScoreNode("tanh", (0,)))}, {}, "modified beyond the scale"),
    ({"dropout_p": 0.1}, {}, "dropout"),
    ({"head_dim": 60, "head_dim_v": 60}, {}, "head dim 60 is not a multiple of 8"),
    ({"head_dim_v": 32}, {}, "head dims 64/32"),
    ({"causal": CausalMask(window=16)}, {}, "sliding window"),
    ({"causal": CausalMask(alignment="bottom_right")}, {"q_len": 1}, "lengths that may differ"),
])
def test_sdpa_reasons(change, qk, reason):
    import dataclasses

    assert dispatch.sdpa_reasons(PLAIN, *fake_qk()) == []
    assert dispatch.sdpa_reasons(dataclasses.replace(PLAIN, causal=CausalMask()), *fake_qk()) == []
    reasons = dispatch.sdpa_reasons(dataclasses.replace(PLAIN, **change), *fake_qk(**qk))
    assert len(reasons) == 1 and reason in reasons[0], reasons


def test_candidates_switch(monkeypatch, caplog):
    monkeypatch.delenv(settings.CANDIDATES, raising=False)
    assert dispatch.allowed_candidates() == (TRITON, GLUON, SDPA_CUDNN, SDPA_FLASH)
    monkeypatch.setenv(settings.CANDIDATES, " sdpa_flash,triton ")
    assert dispatch.allowed_candidates() == (TRITON, SDPA_FLASH)
    monkeypatch.setenv(settings.CANDIDATES, "sdpa_cudnn")  # the generated kernels stay the fallback
    assert dispatch.allowed_candidates() == (TRITON, SDPA_CUDNN)
    monkeypatch.setenv(settings.CANDIDATES, "triton,cutlass")
    with caplog.at_level(logging.WARNING, logger="fuse_attn.kernels"):
        assert dispatch.allowed_candidates() == (TRITON,)
    assert "unknown candidates ['cutlass']" in caplog.text
    monkeypatch.delenv(settings.CANDIDATES)
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)  # torch's own switch turns a candidate off too
    try:
        assert dispatch.allowed_candidates() == (TRITON, GLUON, SDPA_FLASH)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


# ---- on a GPU: each candidate through the compiled backend, numerics under the 2x rule ------------------------------
def causal_module_fn(q, k, v):
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    return causal_attention(q, k, v)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.version.hip is not None, reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("candidates", ["triton", "gluon", "sdpa_cudnn", "sdpa_flash", None])
@pytest.mark.parametrize("kv_heads", [8, 2])
def test_each_candidate_compiles_and_matches_fp64_with_gradients(candidates, kv_heads, monkeypatch):
    """Forced to one candidate (or free to choose: None), a compiled causal bf16 attention runs it -- the verdict says
    which -- and its output and gradients satisfy the 2x rule against the fp64 computation."""
    from tests.support.numerics import assert_close_2x

    if candidates == "gluon" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon forward runs on sm90 GPUs")
    monkeypatch.setattr(dispatch, "GLUON_MIN_STEP_FLOPS", {False: 0, True: 0})  # these shapes are small, for speed

    if candidates is None:
        monkeypatch.delenv(settings.CANDIDATES, raising=False)
    else:
        monkeypatch.setenv(settings.CANDIDATES, f"triton,{candidates}")
        time_config = tuning._time_config

        def forced_choice(launch, candidate, rep):  # the generated kernels' own launch configs are timed as usual
            if not isinstance(candidate, tuning.Implementation):
                return time_config(launch, candidate, rep)
            launch(candidate)
            return 0.0 if candidate.name == candidates else 1.0

        monkeypatch.setattr(tuning, "_time_config", forced_choice)
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(2, 8, 256, 64), (2, kv_heads, 256, 64), (2, kv_heads, 256, 64)]
    q, k, v = (torch.randn(s, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_() for s in shapes)
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    eager_in = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    monkeypatch.setattr(tuning, "_chosen", {})
    torch._dynamo.reset()
    with collect_reports() as reports:
        out = torch.compile(causal_module_fn, backend="fuse_attn")(q, k, v)
    verdicts = [v for r in reports for v in r.verdicts]
    assert [v.fused for v in verdicts] == [True]
    if candidates == "triton":
        assert verdicts[0].runs is None  # nothing to choose from
    else:
        assert verdicts[0].runs.startswith(f"runs {candidates or ''}"), verdicts[0].runs
    ref, eager = causal_module_fn(*ref_in), causal_module_fn(*eager_in)
    assert_close_2x("out", out, ref, eager, torch.bfloat16)
    dout = torch.randn(out.shape, device="cuda", generator=g, dtype=torch.bfloat16)
    for name, a, b, c in zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), dout),
                             torch.autograd.grad(ref, ref_in, dout.double()), torch.autograd.grad(eager, eager_in, dout)):
        assert_close_2x(name, a, b, c, torch.bfloat16)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm90 GPU (H100 / H200)")
def test_a_compiled_learned_bias_trains_through_the_gluon_backwards_ds_stores(monkeypatch):
    """A learned ``[1, H, N, N]`` bias at head dim 128, compiled with the Gluon candidate forced: the graph's backward
    computes the bias's gradient in the Gluon backward (dS stored, summed over the batch; here in two launches of 2
    heads), not in the template's (``ops.autograd_backward``, recorded), and q, k, v and the bias's gradients satisfy the 2x
    rule against fp64."""
    from tests.support.numerics import assert_close_2x

    from fuse_attn.kernels.hopper import common as hopper_common

    monkeypatch.setattr(dispatch, "GLUON_MIN_STEP_FLOPS", {False: 0, True: 0})  # these shapes are small, for speed
    monkeypatch.setenv(settings.CANDIDATES, "triton,gluon")
    time_config = tuning._time_config

    def forced_choice(launch, candidate, rep):
        if not isinstance(candidate, tuning.Implementation):
            return time_config(launch, candidate, rep)
        launch(candidate)
        return 0.0 if candidate.name == GLUON else 1.0

    monkeypatch.setattr(tuning, "_time_config", forced_choice)
    monkeypatch.setattr(tuning, "_chosen", {})
    templates_backward = record_templates_backward(monkeypatch)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 512, 128, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    bias = torch.randn(1, 4, 512, 512, device="cuda", generator=g, dtype=torch.bfloat16)
    assert hopper_common.dscore_kv_heads(q, k, bias) == 2
    leaves = lambda cast=None: [t.detach().to(cast or t.dtype).requires_grad_() for t in (q, k, v, bias)]  # noqa: E731
    ours_in, ref_in, eager_in = leaves(), leaves(torch.float64), leaves()

    def attention(q, k, v, bias):
        return (q @ k.transpose(-1, -2) * 128 ** -0.5 + bias).softmax(-1) @ v

    torch._dynamo.reset()
    with collect_reports() as reports:
        out = torch.compile(attention, backend="fuse_attn")(*ours_in)
    verdicts = [v for r in reports for v in r.verdicts]
    assert [v.fused for v in verdicts] == [True] and verdicts[0].runs.startswith("runs gluon"), verdicts
    templates_backward.clear()  # (the choice ran each candidate's step once, the template's too)
    dout = torch.randn(out.shape, device="cuda", generator=g, dtype=torch.bfloat16)
    results = [(out, *torch.autograd.grad(out, ours_in, dout))]
    assert templates_backward == []
    for inputs in (ref_in, eager_in):
        result = attention(*inputs)
        results.append((result, *torch.autograd.grad(result, inputs, dout.to(result.dtype))))
    for name, ours, ref64, eager in zip(("out", "dq", "dk", "dv", "dbias"), *results):
        assert_close_2x(name, ours, ref64, eager, torch.bfloat16)


@pytest.mark.parametrize("bias_grad", [False, True])
def test_the_timed_steps_take_the_bias_and_its_gradient(bias_grad, monkeypatch):
    """Each candidate's trained step runs on random copies of the score tensors, the gradient of a bias that
    requires one with the rest (on CPU tensors: the steps without recording, each op's CPU path)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, score_program=BIAS_PROGRAM,
                         score_tensors=(ScoreTensor("bias", "float32", (True, False, False, False)),))
    q, k, v = (torch.randn(1, 2, 17, 16) for _ in range(3))
    bias = torch.randn(1, 2, 17, 17, requires_grad=bias_grad)
    steps = dispatch._CandidateSteps(spec, q, k, v, True, [bias])
    assert [t.requires_grad for t in steps.score_tensors] == [bias_grad]
    assert not torch.equal(steps.score_tensors[0], bias)  # random, as q, k and v
    grads = []
    monkeypatch.setattr(torch.autograd, "grad", lambda out, inputs, dout: grads.append(len(inputs)))
    for name in (TRITON, GLUON):
        steps._step(name)()
    assert grads == [3 + bias_grad] * 2


def test_a_trained_step_where_v_is_narrower_than_q_takes_the_outputs_gradient(monkeypatch):
    """MLA's v head dim below q's (here 32 / 16): the timed step's gradient of the output is v's width, so every
    candidate's trained step runs (on CPU tensors: each op's CPU path, without recording)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    spec = AttentionSpec(dtype="float32", head_dim=32, head_dim_v=16, scale=32 ** -0.5, causal=CausalMask())
    q, k = (torch.randn(1, 2, 17, 32) for _ in range(2))
    steps = dispatch._CandidateSteps(spec, q, k, torch.randn(1, 2, 17, 16), True)
    for name in (TRITON, GLUON):
        steps._step(name)()
    assert steps.dout.shape == (1, 2, 17, 16)


@pytest.mark.parametrize("candidates", ["triton,sdpa_cudnn,sdpa_flash", "triton"])
def test_the_templates_tunings_compile_beside_the_choices_candidates(gpu, monkeypatch, candidates):
    """Before it times anything, a choice among implementations submits its candidates' compiles first and the
    template's own tunings' (forward, dQ, dK/dV) after them in the same batch; with the template the only candidate,
    its tunings alone."""
    gpu({TRITON: 0.18, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.30})
    monkeypatch.setenv(settings.CANDIDATES, candidates)
    submitted = []
    monkeypatch.setattr(ops, "compile_candidates_ahead", lambda *args, timed_first=None: submitted.append(
        (args[-1], timed_first and (timed_first[0].kind, [c.name for c in timed_first[1]], timed_first[2]()))))
    rewritten(causal_attention, MHA, training=True)
    [(training, timed_first)] = submitted
    assert training
    if candidates == "triton":
        assert timed_first is None
    else:
        kind, names, compile_only = timed_first
        assert kind == "impl_train" and names == candidates.split(",")
        assert compile_only.__func__ is NoSteps.compile_only  # (the steps' own compiles, found done when timed)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm90 GPU (H100 / H200)")
def test_the_implementation_choice_compiles_every_candidates_kernels_before_timing_any(tmp_path, monkeypatch, caplog):
    """A trained choice among the template (untuned) and the Gluon kernels: both candidates' kernels compile in one
    batch before either step is timed, and recording the steps compiles nothing more."""
    import triton

    monkeypatch.setenv("FUSE_ATTN_CACHE_DIR", str(tmp_path / "tuning"))
    monkeypatch.setenv(settings.CANDIDATES, "triton,gluon")
    monkeypatch.setattr(tuning, "_chosen", {})
    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path / "triton"))
    monkeypatch.setattr(dispatch, "GLUON_MIN_STEP_FLOPS", {True: 0, False: 0})  # (offered at this small size)
    monkeypatch.setattr(dispatch, "TUNING_GAINS_AT_MOST", {True: 0.0, False: 0.0})  # (the template left untuned)
    # (the choice's own batch: the template's tunings, which compile beside it, are another test's)
    compile_ahead = tuning.compile_ahead
    monkeypatch.setattr(tuning, "compile_ahead", lambda kernels, staged=True: compile_ahead(kernels[:1], staged))

    def binaries() -> int:
        return sum(1 for _ in (tmp_path / "triton").rglob("*.cubin"))

    batches, real = [], tuning._compile_concurrently

    def counted(candidates, compile_only, keys=()):
        where = real(candidates, compile_only, keys)
        batches.append(([key.kind for key in keys], binaries()))
        return where

    monkeypatch.setattr(tuning, "_compile_concurrently", counted)
    spec = AttentionSpec(dtype="bfloat16", head_dim=64, head_dim_v=64, scale=0.125, causal=CausalMask(), gqa_group=2)
    q = torch.randn(2, 8, 1024, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 4, 1024, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    with caplog.at_level(logging.INFO, logger="fuse_attn.kernels.tuning"):
        choice = dispatch.choose_implementation(spec, q, k, v, training=True)
    assert choice.name in (TRITON, GLUON)
    assert batches and batches[0][0] == ["impl_train"], batches
    assert binaries() == batches[0][1] > 0  # (every kernel the recorded steps launched was in the batch)
    assert "compiled 2 candidates for impl_train" in caplog.text


@pytest.mark.parametrize("fails", [False, True])
def test_the_timing_graphs_are_destroyed_as_the_choice_is_made(gpu, monkeypatch, fails):
    """Each candidate's recorded graph goes as the choice is made (also where the timing failed), not whenever Python
    lets go of the steps (which can be inside a user's own CUDA graph capture)."""
    released = []

    class Steps(NoSteps):
        def replay(self, candidate):
            if fails:
                raise RuntimeError("a candidate failed")

        def release_graphs(self):
            released.append(self)

    gpu({TRITON: 0.30, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})
    monkeypatch.setattr(dispatch, "_CandidateSteps", Steps)
    _, verdicts = rewritten(causal_attention, MHA, training=True)
    assert len(released) == 1
    assert ("timing the candidates failed" in verdicts) == fails


def test_the_timing_inputs_leave_the_users_random_stream_alone():
    """The candidate steps' inputs, dO and dropout's seed come from the tuner's own generator, and a step run with
    dropout draws nothing: the user's stream (their dropout masks, their initial weights) is where it was whether
    or not a choice was timed. Shown failing with the steps' dO drawn from torch's default generator."""
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, dropout_p=0.25)
    q, k, v = (torch.empty(1, 2, 17, 16) for _ in range(3))
    torch.manual_seed(7)
    before = torch.get_rng_state()
    steps = CANDIDATE_STEPS(spec, q, k, v, training=True)
    steps._step(TRITON)()
    steps._step(TRITON)()
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("form", ["eager", "sdpa"])
def test_the_choice_times_a_predicate_on_documents(form):
    """Random vectors leave every tile of a predicate partial (the whole N x N computed), which ranks the
    implementations as no packed batch would: the choice's copies hold documents of CHOICE_DOCUMENT_TOKENS tokens --
    ids where the predicate compares them for equality, positions in the document where it orders them."""
    spec = documents_spec(form)
    n = 2 * dispatch.CHOICE_DOCUMENT_TOKENS + 17  # (two documents and the start of a third)
    q, k, v = (torch.empty(2, 2, n, 16) for _ in range(3))
    tokens = torch.arange(n).expand(2, n)
    steps = CANDIDATE_STEPS(spec, q, k, v, False, documents_tensors(tokens))
    ids, positions = tokens // dispatch.CHOICE_DOCUMENT_TOKENS, tokens % dispatch.CHOICE_DOCUMENT_TOKENS
    pos_k, pos_q, ids_q, ids_k = steps.score_tensors
    assert torch.equal(pos_k[:, 0, 0, :], positions) and torch.equal(pos_q[:, 0, :, 0], positions)
    assert torch.equal(ids_q[:, 0, :, 0], ids) and torch.equal(ids_k[:, 0, 0, :], ids)


def test_the_choice_times_a_summarized_mask_causal():
    """A mask tensor whose tiles are classified per call is timed causal (as the launch configs are), not random."""
    spec, mask = mask_case(causal_fill(6, 9))[4], torch.zeros(1, 1, 6, 9)
    q, k, v = (torch.empty(1, 2, n, 16) for n in (6, 9, 9))
    steps = CANDIDATE_STEPS(spec, q, k, v, False, [mask])
    visible = torch.arange(9)[None, :] <= torch.arange(6)[:, None] + 3
    assert torch.equal(steps.score_tensors[0][0, 0], torch.where(visible, 0.0, torch.finfo(torch.float32).min))


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_the_gluon_step_is_timed_as_called_unless_the_graph_replays(cuda_graphs, monkeypatch):
    """The Gluon op's Python launcher runs on every call of a compiled step (not on a CUDA graph's replay): its step
    is timed as called, so host time counts where it outlasts the kernels; the others' recorded graphs replay (on CPU
    tensors: the op's CPU path, recording stood in for)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(dispatch, "_CUDA_GRAPHS", cuda_graphs)
    recorded = []

    class Graph:
        def replay(self):
            pass

    monkeypatch.setattr(dispatch, "_record", lambda step: recorded.append(step) or Graph())
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25)
    steps = CANDIDATE_STEPS(spec, *(torch.empty(1, 2, 17, 16) for _ in range(3)), training=True)
    calls = []
    monkeypatch.setattr(torch.autograd, "grad", lambda out, inputs, dout: calls.append(out.shape))
    for _ in range(2):
        steps.replay(tuning.Implementation(GLUON))
        steps.replay(tuning.Implementation(TRITON))
    assert len(recorded) == (2 if cuda_graphs else 1)  # each recorded once; Gluon's not at all without CUDA graphs
    assert calls == ([] if cuda_graphs else [(1, 2, 17, 16)] * 2)


@pytest.mark.parametrize("allowed, runs", [(None, SDPA_CUDNN), ("triton", TRITON)])
def test_each_fused_verdict_names_the_implementation_it_runs(allowed, runs, gpu, monkeypatch):
    """The verdict names what the fused attention runs -- the chosen candidate, or the generated kernels where they
    were the only one -- so a benchmark's row can say it (tools/bench_variants.py)."""
    gpu({TRITON: 0.30, SDPA_CUDNN: 0.20, SDPA_FLASH: 0.25})
    if allowed:
        monkeypatch.setenv(settings.CANDIDATES, allowed)
    (verdict,) = rewrite_report(causal_attention, MHA, training=True).verdicts
    assert verdict.fused and verdict.implementation == runs
