"""Which implementation runs a matched attention: the generated Triton kernels, the Gluon kernels on Hopper, or one
of SDPA's kernels (cuDNN, flash).

:func:`choose_implementation`, asked by the rewrite while compiling, times every candidate allowed for the attention
on random inputs of its (hinted) sizes, strides and dtype -- the forward alone in inference, forward and backward
when the graph is trained -- and keeps the fastest, as ``max-autotune`` chooses between ATen and Triton templates.
Each candidate's step is recorded once as a CUDA graph and its replay is timed, so only GPU time counts (the host
cost of calling our op outside a compiled graph is not the compiled graph's) -- but for the Gluon kernels, whose op
runs its Python launcher in the compiled graph too: their step is timed as called, back to back, so a step whose
host work outlasts its kernels counts the host's time (on a replayed CUDA graph, no launcher runs: the replay is
timed). The choice persists per GPU and shape with the launch configs (:mod:`.tuning`, key kinds ``impl_fwd`` /
``impl_train``); the attention's verdict line names it (:meth:`ImplementationChoice.text`). ``explain()``, which
matches without compiling, makes no choice.

Candidates: ``triton``, the generated kernels -- every spec, and the fallback of every attention the others cannot
compute; ``gluon``, :mod:`.hopper.forward`'s forward of plain attention or of one added bias (``s + bias``) on sm90
GPUs with :mod:`.hopper.backward`'s backward (:func:`gluon_reasons` says where not); ``sdpa_cudnn`` and
``sdpa_flash`` for attentions SDPA computes exactly (:func:`sdpa_reasons`), emitted into the graph as
``aten._scaled_dot_product_cudnn_attention`` / ``aten._scaled_dot_product_flash_attention`` by
:func:`sdpa_attention` -- the function the timing runs too -- with grouped (GQA) heads repeated first, as Hugging
Face's ``repeat_kv`` does.

Environment: ``FUSE_ATTN_CANDIDATES``, a comma-separated subset of ``triton,gluon,sdpa_cudnn,sdpa_flash`` (default:
all four; ``triton`` is a candidate whatever it says). SDPA's candidates also follow torch's switches
(``torch.backends.cuda.enable_cudnn_sdp``, ``enable_flash_sdp``).
"""

from __future__ import annotations

import contextlib
import logging
import operator
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from fuse_attn import settings
from fuse_attn.kernels import compile_workers, ops, plan, tuning
from fuse_attn.score_program import ORDER_COMPARISONS, subprogram
from fuse_attn.spec import AttentionSpec
from fuse_attn.kernels.generated.launch import (RealInputs, realistic_tuning_masks, random_like, tuning_generator,
                                                write_stored)
from fuse_attn.kernels.plan import size_hint

log = logging.getLogger("fuse_attn.kernels")
aten = torch.ops.aten

TRITON = "triton"
GLUON = "gluon"
SDPA_CUDNN = "sdpa_cudnn"
SDPA_FLASH = "sdpa_flash"
# Candidate order: the first one that runs is taken untimed under FUSE_ATTN_AUTOTUNE=0.
ALL_CANDIDATES = (TRITON, GLUON, SDPA_CUDNN, SDPA_FLASH)
_SDPA_DTYPES = (torch.float16, torch.bfloat16)  # what SDPA's flash and cuDNN kernels take
_SDPA_DEVICE_TYPES = ("cuda",)
# Head dims SDPA's flash kernel takes (FA2: multiples of 8 up to 256); cuDNN's limits vary by version and GPU, and a
# shape it refuses fails while timed and is dropped with its reason.
_SDPA_HEAD_DIM_MULTIPLE = 8
_SDPA_MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class ImplementationChoice:
    """The implementation a matched attention runs, and how it was picked (for the report)."""

    name: str
    # None: nothing to choose from (the generated kernels); else e.g. "fastest of triton, sdpa_cudnn, sdpa_flash,
    # forward+backward timed on NVIDIA H100 80GB HBM3"
    how: Optional[str] = None

    @property
    def is_sdpa(self) -> bool:
        return self.name in (SDPA_CUDNN, SDPA_FLASH)

    def text(self) -> Optional[str]:
        """What the report says, where there was a choice."""
        return None if self.how is None else f"runs {self.name}: {self.how}"


def allowed_candidates() -> tuple[str, ...]:
    """The candidates ``FUSE_ATTN_CANDIDATES`` allows (unknown names are ignored with a warning), in
    :data:`ALL_CANDIDATES` order, with SDPA's backends that torch's switches turned off removed. The generated
    kernels are always one: they are what runs where SDPA's kernels cannot (a shape cuDNN refuses fails while
    timed), so an SDPA kernel is never taken untimed."""
    text = settings.candidates_text()
    names = ALL_CANDIDATES if text is None else tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in ALL_CANDIDATES]
    if unknown:
        log.warning("fuse_attn: %s names unknown candidates %s (known: %s); ignoring them", settings.CANDIDATES, unknown,
                    ", ".join(ALL_CANDIDATES))
    switched_off = {SDPA_CUDNN: not torch.backends.cuda.cudnn_sdp_enabled(),
                    SDPA_FLASH: not torch.backends.cuda.flash_sdp_enabled()}
    return tuple(n for n in ALL_CANDIDATES if n == TRITON or n in names and not switched_off.get(n, False))


def sdpa_reasons(spec: AttentionSpec, q: Tensor, k: Tensor) -> list[str]:
    """Why SDPA's kernels cannot compute this attention exactly (empty: they can). q ``[Z, H, M, D]`` and k
    ``[Z, H // g, N, D]`` may be fake, with symbolic lengths."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    reasons = []
    if q.device.type not in _SDPA_DEVICE_TYPES:
        reasons.append(f"SDPA's cuDNN and flash kernels run on CUDA devices, not {q.device.type}")
    if q.dtype not in _SDPA_DTYPES:
        reasons.append(f"SDPA's cuDNN and flash kernels take fp16/bf16, not {q.dtype}")
    if spec.score_program or spec.score_tensors:
        reasons.append("the scores are modified beyond the scale (a score program, mask or bias)")
    if spec.dropout_p:
        reasons.append("dropout: the generated kernels draw the keep-mask from the graph's seed")
    if spec.head_dim is None or spec.head_dim != spec.head_dim_v:
        reasons.append(f"head dims {spec.head_dim}/{spec.head_dim_v} are symbolic or differ")
    elif spec.head_dim % _SDPA_HEAD_DIM_MULTIPLE or spec.head_dim > _SDPA_MAX_HEAD_DIM:
        reasons.append(f"head dim {spec.head_dim} is not a multiple of {_SDPA_HEAD_DIM_MULTIPLE} up to {_SDPA_MAX_HEAD_DIM}")
    if spec.causal is not None:
        if spec.causal.window is not None or spec.causal.diagonal != 0:
            reasons.append("a sliding window or a shifted causal diagonal")
        elif not statically_known_true(q.shape[2] == k.shape[2]):
            # SDPA's is_causal aligns the diagonal top-left, its kernels differ where M != N: equal lengths only
            reasons.append("causal with query and key lengths that may differ")
    return reasons


def sdpa_attention(call: Callable[..., Any], name: str, q, k, v, spec: AttentionSpec, training: bool):
    """SDPA's kernel ``name`` on q ``[Z, H, M, D]``, k/v ``[Z, H // g, N, D]``: its output ``[Z, H, M, D]``.

    ``call(target, *args, **kwargs)`` runs or records each op: graph nodes while rewriting (the rewrite's
    emitter), tensors while timing (:func:`_run`). ``training``: cuDNN keeps the log-sum-exp its backward needs."""
    if spec.gqa_group > 1:
        k = call(aten.repeat_interleave.self_int, k, spec.gqa_group, 1)
        v = call(aten.repeat_interleave.self_int, v, spec.gqa_group, 1)
    causal = spec.causal is not None
    scale = spec.scale_for(spec.head_dim)
    if name == SDPA_CUDNN:
        result = call(aten._scaled_dot_product_cudnn_attention.default, q, k, v, None, training, 0.0, causal, False,
                      scale=scale)
    elif name == SDPA_FLASH:
        result = call(aten._scaled_dot_product_flash_attention.default, q, k, v, 0.0, causal, False, scale=scale)
    else:
        raise ValueError(f"{name!r} is not one of SDPA's candidates")
    return call(operator.getitem, result, 0)


def _run(target, *args, **kwargs):
    return target(*args, **kwargs)


# The Gluon kernels are offered only for steps whose GPU work hides most of their host cost, by whether the step
# trains. Their ops' Python launchers (an op Inductor calls, TMA descriptors, the compiled kernels' positional run:
# positional_launch.PositionalLaunch, forward.ForwardCall) take 40-50 us a forward call of B8 H16 N1024 D64 on an H200
# host (cuDNN's 23-25 us), and 135-220 us a backward call (cuDNN's 69-92 us); in a compiled graph of 12 chained causal
# forwards (B8 H12 N1024 D64, 1.3e10 FLOPs each: tools/bench_host_overhead.py --chain 12) a forward took 47-94 us of
# wall time for 42 us of GPU work over four runs on that host (the template's kernels launched from Inductor's code:
# 51-56 us for 51-54). A forward of 2^34 FLOPs takes the GPU about twice that, which hides it. A training step of
# about 2^37 FLOPs (B16 H16 N1024 D64, causal) takes the GPU 0.51 ms for both (H100), which hides the backward's.
# Below these the Gluon kernels are not even timed. Above, their step is timed as called (host time counts where it
# outlasts the GPU's: :meth:`_CandidateSteps.replay`): a predicate's mask adds the tile-classes kernels' launches and
# the lists' allocations to each call, and its empty tiles cut the GPU work far below the FLOPs counted here (16
# packed documents at N 8192, B1 H16 D128, 2^40.8 FLOPs counted: a forward+backward of 0.50 ms of GPU time took
# 1.35 ms a call, a forward 0.16 ms for 0.15, H200). Where the compiled graph replays as a CUDA graph
# (:func:`replayed_as_cuda_graphs`) no launcher runs on a replay, and the Gluon kernels are offered at every size.
GLUON_MIN_STEP_FLOPS = {False: 2**34, True: 2**37}  # by training
# Whether the graph being rewritten replays as a CUDA graph (Inductor's ``triton.cudagraphs``, which
# mode="reduce-overhead" and "max-autotune" turn on): set by the backend around its rewrite.
_CUDA_GRAPHS = False


@contextlib.contextmanager
def replayed_as_cuda_graphs(on: bool = True):
    """Within the block (where ``on``), the graphs rewritten replay as CUDA graphs: their ops' Python launchers run only
    while a graph is recorded, never on a replay, so the Gluon kernels' host cost no longer rules them out of small
    steps (:func:`gluon_reasons`)."""
    global _CUDA_GRAPHS
    before, _CUDA_GRAPHS = _CUDA_GRAPHS, on
    try:
        yield
    finally:
        _CUDA_GRAPHS = before


def _step_flops(spec: AttentionSpec, q: Tensor, k: Tensor, training: bool) -> float:
    """The matmul FLOPs of the timed step at the hinted sizes: 4 Z H M N D, halved when causal (the spec's mask, or
    the causal band a key padding mask carries in its program: Hugging Face's padding + causal mask), 3.5x for the
    forward and backward together (as tools/bench_attention.py counts them)."""
    Z, H, M, D = (size_hint(n) for n in q.shape)
    padding = plan.key_padding(spec)
    causal = spec.causal is not None or padding is not None and padding.band is not None
    return 4 * Z * H * M * size_hint(k.shape[2]) * D * (0.5 if causal else 1.0) * (3.5 if training else 1.0)


def gluon_reasons(spec: AttentionSpec, q: Tensor, k: Tensor, training: bool) -> list[str]:
    """Why the Gluon kernels are no candidate for this attention (empty: they are one)."""
    try:
        from fuse_attn.kernels.hopper.common import hopper_reasons
    except ImportError as e:  # a Triton without Gluon's Hopper API (it is there from 3.6 on)
        return [f"Triton {_triton_version()} lacks Gluon's Hopper API ({e})"]
    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor

        if isinstance(q, DTensor):
            return ["the Gluon kernels have no DTensor sharding rule"]
    reasons = hopper_reasons(spec, q, k)
    flops = _step_flops(spec, q, k, training)
    least = GLUON_MIN_STEP_FLOPS[training]
    if not reasons and flops < least and not _CUDA_GRAPHS:
        reasons.append(f"a step of {flops:.3g} FLOPs, under the {least:.3g} whose GPU time hides the Gluon op's host "
                       "cost")
    return reasons


def gluon_score_operands(spec: AttentionSpec, score_tensors: Sequence) -> tuple:
    """``(bias, vectors)``, the Gluon forward's score operands for a spec it takes (:func:`gluon_reasons` empty):
    the one added bias where the spec adds one whose tiles are not listed per call (``common.lists_tiles``: a key
    padding vector, a mask summarized per call), else the score tensors as its vectors (the integer vectors of a
    predicate's mask, a key padding vector, a mask tensor, or the tensors a score program reads), or none."""
    from fuse_attn.kernels.hopper.common import adds_a_bias, lists_tiles

    if adds_a_bias(spec) and not lists_tiles(spec):
        return score_tensors[0], None
    return None, (list(score_tensors) or None)


def _triton_version() -> str:
    import triton

    return triton.__version__


# Candidates a caller sets aside while it rewrites (name -> why), beyond what FUSE_ATTN_CANDIDATES allows
_SET_ASIDE: dict[str, str] = {}


@contextlib.contextmanager
def set_aside(name: str, why: str):
    """Within the block, ``name`` is no candidate (the report's debug line says ``why``)."""
    _SET_ASIDE[name] = why
    try:
        yield
    finally:
        _SET_ASIDE.pop(name, None)


def _score_grads(score_tensors: Sequence[Tensor], score_grads: Optional[Sequence[bool]]) -> list[bool]:
    """Which score tensors are timed with a gradient: ``score_grads`` where given, else those that require grad."""
    return [t.requires_grad for t in score_tensors] if score_grads is None else list(score_grads)


def choose_implementation(spec: AttentionSpec, q: Tensor, k: Tensor, v: Tensor, training: bool,
                          score_tensors: Sequence[Tensor] = (),
                          score_grads: Optional[Sequence[bool]] = None,
                          lse_used: bool = False) -> ImplementationChoice:
    """The implementation of one matched attention (q, k, v and its score tensors: its fused op's operands, fake while
    compiling). ``score_grads``: which score tensors need a gradient, timed with it (default: those that require
    grad; a graph traced below autograd says it apart, :func:`fuse_attn.graph.nodes.nodes_needing_grad`).
    ``lse_used``: the graph reads the attention's logsumexp too (an attention sink's share), which SDPA's calls
    here do not return."""
    score_grads = _score_grads(score_tensors, score_grads)
    allowed = [n for n in allowed_candidates() if n not in _SET_ASIDE]
    reasons = {n: [] for n in allowed if n == TRITON}
    if GLUON in allowed:
        reasons[GLUON] = gluon_reasons(spec, q, k, training)
    sdpa = [n for n in allowed if n in (SDPA_CUDNN, SDPA_FLASH)]
    if sdpa:
        why_not = sdpa_reasons(spec, q, k) + (["the graph reads the attention's logsumexp"] if lse_used else [])
        reasons.update(dict.fromkeys(sdpa, why_not))
    reasons.update({n: [why] for n, why in _SET_ASIDE.items()})
    candidates = [n for n in allowed if not reasons[n]]
    if candidates == [TRITON]:
        ops.compile_candidates_ahead(q, k, v, score_tensors, spec, score_grads, training)
        log.debug("fuse_attn: %s runs %s: %s", plan.describe(spec), ops.execution_path(q.device),
                  "; ".join(f"{n}: {'; '.join(r)}" for n, r in reasons.items() if r)
                  or f"{settings.CANDIDATES} allows only triton")
        return ImplementationChoice(TRITON)
    Z, H, M, D = q.shape
    # (the candidates in the key: a choice timed among fewer -- cuDNN switched off, FUSE_ATTN_CANDIDATES narrower --
    # is no answer once more are allowed)
    kernel_id = (f"{spec.digest} Z={size_hint(Z)} H={size_hint(H)} H_kv={size_hint(k.shape[1])} "
                 f"among={','.join(candidates)}")
    if training and score_tensors:  # (a bias that needs a gradient takes the template's backward after either forward)
        kernel_id += " score_grads=" + "".join("1" if g else "0" for g in score_grads)
    if GLUON in candidates and _CUDA_GRAPHS and _step_flops(spec, q, k, training) < GLUON_MIN_STEP_FLOPS[training]:
        kernel_id += " cuda_graphs=1"  # (the Gluon kernels a candidate only because no launcher runs on a replay)
    if GLUON in candidates and score_tensors:  # (the Gluon kernels' two paths for a bias: by TMA, or loaded)
        from fuse_attn.kernels.hopper.common import adds_a_bias, bias_layout_by_tma

        if adds_a_bias(spec):
            kernel_id += f" bias_tma={int(bias_layout_by_tma(score_tensors[0]))}"
    key = tuning.tuning_key("impl_train" if training else "impl_fwd", q.device, kernel_id, q.dtype, size_hint(D),
                            size_hint(v.shape[3]), size_hint(M), size_hint(k.shape[2]))
    timed = "forward+backward" if training else "forward"
    how = f"fastest of {', '.join(candidates)}, {timed} timed on {key.gpu}"
    chosen = tuning.cached(key)
    if chosen is None:
        try:
            with RealInputs():
                steps = _CandidateSteps(spec, q, k, v, training, score_tensors, score_grads, template_untuned=True)
            try:
                implementations = [tuning.Implementation(n) for n in candidates]
                if TRITON in candidates:
                    # the template's own tunings (where its untuned step can win) compile beside the candidates':
                    # the Gluon kernels' take longest, and leave most CPUs idle meanwhile
                    ops.compile_candidates_ahead(q, k, v, score_tensors, spec, score_grads, training,
                                                 timed_first=(key, implementations, lambda: steps.compile_only))
                with RealInputs():
                    chosen = tuning.tune(key, implementations, steps.replay, compile_only=steps.compile_only,
                                         revisit=steps.tune_the_template_where_it_can_win)
            finally:
                steps.release_graphs()
        except Exception as e:  # noqa: BLE001 -- every candidate failed: the generated kernels, as without a choice
            log.warning("fuse_attn: timing the implementations of %s failed (%s: %s); it runs the generated kernels",
                        plan.describe(spec), type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else "")
            return ImplementationChoice(TRITON, f"timing the candidates failed ({type(e).__name__})")
    return ImplementationChoice(chosen.name, how)


# How much faster tuning made the generated kernels' step than their first working launch configs, at most, plus a
# margin: tools/bench_candidates.py's "untuned / tuned triton" on an H200 (GPT-2 small, BERT-base, Llama-3.2-1B GQA
# and B1 H32 N256 D128 attentions, bf16) 1.08-1.17 forward, 1.20-1.39 forward+backward. An untuned template slower
# than the best other candidate by more than this cannot win once tuned, and is not tuned: its tuning compiles every
# candidate config of each of its kernels (about 10 s on an H200 for a forward and backward), the larger part of a
# cold first step's extra time.
TUNING_GAINS_AT_MOST = {False: 1.25, True: 1.5}  # {training: bound}


class _CandidateSteps:
    """Each candidate's step (forward, or forward and backward) on one set of random inputs, recorded once as a
    CUDA graph; ``replay(candidate)`` runs it (the first replay records it). Trained, the step takes the gradients
    of q, k, v and of the score tensors that require one. With ``template_untuned`` the generated kernels' step runs
    their first working launch configs (:func:`tuning.untimed`) until :meth:`tune_the_template_where_it_can_win`
    tunes them."""

    def __init__(self, spec: AttentionSpec, q: Tensor, k: Tensor, v: Tensor, training: bool,
                 score_tensors: Sequence[Tensor] = (), score_grads: Optional[Sequence[bool]] = None,
                 template_untuned: bool = False):
        score_grads = _score_grads(score_tensors, score_grads)
        self.spec, self.training, self.template_untuned = spec, training, template_untuned
        self.q, self.k, self.v = (random_like(t).requires_grad_(training) for t in (q, k, v))
        self.score_tensors = [random_like(t) for t in score_tensors]
        realistic_tuning_masks(spec, self.score_tensors)
        _documents_of_the_choice(spec, self.score_tensors)
        for t, needs in zip(self.score_tensors, score_grads):
            t.requires_grad_(training and needs and t.is_floating_point())
        self.dout = torch.randn(self.q.shape[:3] + self.v.shape[3:], dtype=q.dtype, device=self.q.device,
                                generator=tuning_generator(self.q.device))  # (out's)
        # dropout's keep-mask from a seed of the tuner's stream, not one drawn from the user's on each step
        self.dropout_seed = (random_like(torch.empty((), dtype=torch.int64, device=self.q.device))
                             if spec.dropout_p else None)
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}

    def _step(self, name: str) -> Callable[[], None]:
        def forward():
            if name == TRITON:
                return ops.flash_attention(self.q, self.k, self.v, self.spec, self.score_tensors, self.dropout_seed)
            if name == GLUON:
                from fuse_attn.kernels.hopper.forward import flash_attention_hopper

                bias, vectors = gluon_score_operands(self.spec, self.score_tensors)
                return flash_attention_hopper(self.q, self.k, self.v, self.spec, bias=bias, vectors=vectors or ())
            return sdpa_attention(_run, name, self.q, self.k, self.v, self.spec, self.training)

        def step():
            with torch.enable_grad() if self.training else torch.no_grad():
                out = forward()
                if self.training:
                    inputs = [self.q, self.k, self.v] + [t for t in self.score_tensors if t.requires_grad]
                    torch.autograd.grad(out, inputs, self.dout)

        return step

    def replay(self, candidate: tuning.Implementation) -> None:
        """One step of the candidate: its recorded graph replayed (GPU time only), or -- the Gluon kernels, unless the
        compiled graph replays as a CUDA graph -- the step as called, whose Python launchers run in the compiled graph
        too."""
        if candidate.name == GLUON and not _CUDA_GRAPHS:
            self._step(GLUON)()
            return
        graph = self.graphs.get(candidate.name)
        if graph is None:
            with self._configs_of(candidate):
                graph = self.graphs[candidate.name] = _record(self._step(candidate.name))
        graph.replay()

    def release_graphs(self) -> None:
        """Destroy the recorded graphs (and release their memory pools) now, while compiling, rather than whenever
        Python lets go of these steps, which can be in the middle of the user's own CUDA graph capture."""
        self.graphs.clear()

    def compile_only(self, candidate: tuning.Implementation) -> None:
        """Compile the Triton and Gluon kernels of the candidate's step, launching none: the tuner then compiles
        every candidate's at once before timing any (one after the other as each first ran, the implementation
        choice of a Llama-3.2-1B attention compiled for 10.5 s on an H200). SDPA's kernels are cuDNN's and
        FlashAttention's, built as they first run."""
        if candidate.name in (SDPA_CUDNN, SDPA_FLASH):
            return
        with self._configs_of(candidate), compile_workers.compile_launches_only():
            self._step(candidate.name)()

    def _configs_of(self, candidate: tuning.Implementation):
        """The context of the candidate's step: the template's first working configs while it is untuned."""
        untuned = candidate.name == TRITON and self.template_untuned
        return tuning.untimed() if untuned else contextlib.nullcontext()

    def tune_the_template_where_it_can_win(self, timed: list[tuple[float, tuning.Implementation]]) -> list:
        """Given the first timing pass (the template untuned), the template to time again tuned where it is within
        :data:`TUNING_GAINS_AT_MOST` of the fastest other candidate (or no other ran); else nothing: it stays
        untuned and loses."""
        times = {cand.name: ms for ms, cand in timed}
        if not self.template_untuned or TRITON not in times:
            return []
        others = [ms for name, ms in times.items() if name != TRITON]
        if others and times[TRITON] > min(others) * TUNING_GAINS_AT_MOST[self.training]:
            log.info("fuse_attn: %s: the generated kernels untuned take %.3f ms, %.2fx the fastest other candidate: "
                     "left untuned (tuning gains at most %.2fx)", plan.describe(self.spec), times[TRITON],
                     times[TRITON] / min(others), TUNING_GAINS_AT_MOST[self.training])
            return []
        self.template_untuned = False
        self.graphs.pop(TRITON, None)  # (recorded again, tuned, when next replayed)
        return [next(cand for _, cand in timed if cand.name == TRITON)]


# The document length the implementation choice assumes for a predicate of integer vectors (the real ids are not
# known while compiling): the middle of the 512 and 2048 tokens of tools/bench_variants.py's packed_documents_8k and
# _32k. On random ids every tile is partial (the whole N x N computed), a mask no packed batch has; the configs of the
# generated kernels stay timed on random ids (on documents, their 8k forward ran 10-17% slower on an H200).
CHOICE_DOCUMENT_TOKENS = 1024


def _documents_of_the_choice(spec: AttentionSpec, score_tensors: list) -> None:
    """Give the choice's random copies of a predicate's integer vectors the values of documents of
    :data:`CHOICE_DOCUMENT_TOKENS` tokens, so that the candidates are timed on the empty, full and partial tiles such a
    mask has. Each vector read per query row or per key column holds, along its tokens, the document's index
    (``index // tokens``: packed documents' ids), or -- a vector the predicate orders (``<=``, ``<``, ...) -- the
    position in the document (``index % tokens``: position ids); vectors read once stay random."""
    summarized = plan.mask_blocks(spec)
    if summarized is None or summarized.predicate is None:
        return
    nodes = subprogram(spec.score_program, summarized.predicate)
    ordered = {nodes[arg].value for node in nodes if node.op in ORDER_COMPARISONS for arg in node.args
               if nodes[arg].op == "load"}
    for loaded in plan.predicate_loads(spec):
        t, axis = score_tensors[loaded], plan.vector_axis(spec.score_tensors[loaded])
        if axis is None:
            continue
        tokens = 2 if axis == "m" else 3
        shape = [1] * t.dim()
        shape[tokens] = t.shape[tokens]
        token = torch.arange(t.shape[tokens], device=t.device)
        values = (token % CHOICE_DOCUMENT_TOKENS if loaded in ordered
                  else token.div(CHOICE_DOCUMENT_TOKENS, rounding_mode="floor"))
        write_stored(t, values.to(t.dtype).view(shape))


# Steps run before recording: the first tunes the generated kernels' launch configs and compiles them (or builds
# cuDNN's plan); the second runs as the recorded step will, so the allocator's pool holds its buffers.
_WARMUP_STEPS = 2


def _record(step: Callable[[], None]) -> "torch.cuda.CUDAGraph":
    """``step`` as a CUDA graph, warmed up on a side stream first (as ``torch.cuda.make_graphed_callables`` does)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(_WARMUP_STEPS):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph
