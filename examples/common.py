"""What the examples share: the command line (device, size), the report of what was fused, the check against eager
(the 2x rule against an fp64 copy), and GPU timing against ``torch.compile``'s default backend.

Every example runs each variant of its model the same way (:func:`run_variant`): Dynamo's caches reset, compiled
(or not), the first call's result kept for the checks, then -- on a GPU, and only for the compiled variants --
timed after that warm-up call. On a CPU nothing is timed: the examples run there at a tiny size to show and check
what is fused, not how fast.
"""

from __future__ import annotations

import argparse
import copy
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from fuse_attn.report import collect_reports

# Absolute floors of the 2x rule, as in the tests: about one unit in the last place of values of size ~1.
FLOOR = {torch.float32: 1e-5, torch.bfloat16: 8e-3}
# do_bench's ``rep`` in ms: about two seconds of calls per variant, so the median is over several calls even when
# one call (a whole ``generate``) takes a few hundred ms.
TIMED_MS = 2000


@dataclass(frozen=True)
class Setup:
    device: str
    dtype: torch.dtype
    tiny: bool

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


def parse_setup(doc: str, argv: Optional[Sequence[str]], add_arguments: Callable[[argparse.ArgumentParser], None] = lambda p: None) -> tuple[Setup, argparse.Namespace]:
    """``--device`` (default: cuda when there is one) and ``--size`` (default: full on a GPU, tiny on a CPU), plus
    the example's own arguments (``doc``: the example's docstring, whose first paragraph describes it). bf16 on a
    GPU, fp32 on a CPU. Prints the description and what runs where."""
    description = " ".join(doc.split("\n\n")[0].split())  # the example's first paragraph
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=["tiny", "full"], help="model and input size (default: full on cuda, tiny on cpu)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    size = args.size or ("full" if args.device == "cuda" else "tiny")
    setup = Setup(args.device, torch.bfloat16 if args.device == "cuda" else torch.float32, size == "tiny")
    where = torch.cuda.get_device_name() if setup.cuda else "cpu"
    print(f"{description}\n{where}, {str(setup.dtype).removeprefix('torch.')}, {size} size, torch {torch.__version__}")
    return setup, args


@dataclass
class Variant:
    """One way of running the model: its name, its first call's result, its compile report, its time on a GPU."""

    name: str
    result: Any
    reports: list
    ms: Optional[float] = None
    run: Optional[Callable[[], Any]] = None


def run_variant(setup: Setup, name: str, backend: Optional[str], prepare: Callable[[Optional[str]], Callable[[], Any]],
                first: Callable[[Callable[[], Any]], Any] = lambda run: run()) -> Variant:
    """``prepare(backend)`` builds the callable of this variant (compiling with ``backend``; None: eager).
    ``first(run)`` calls it for the first time(s), compiling it, and gives the result the checks use; a compiled
    variant is then timed on a GPU."""
    torch._dynamo.reset()  # each variant compiles afresh: no graph of another backend is reused or counted
    run = prepare(backend)
    with collect_reports() as reports:
        result = first(run)
    ms = median_ms(run) if setup.cuda and backend is not None else None
    return Variant(name, result, reports, ms, run)


def retime_alternating(variants: Sequence[Variant], rounds: int) -> None:
    """Time the variants again in turns (A B A B ...), ``rounds`` times each, and keep each one's median over the
    rounds: on an H100, host-bound ``generate`` calls ran about 10% faster in whichever variant
    was timed first in its process, in both orders, so one measurement each in a fixed order decides nothing. Each
    round of a variant compiles it again (from warm caches) in the warm-up calls before its timing."""
    times = [[] for _ in variants]
    for _ in range(rounds):
        for v, measured in zip(variants, times):
            # Dynamo's recompile limit counts the graphs of every backend on one code object (the variants share
            # the model's forward): without the reset the variants in turn pass it and run uncompiled
            torch._dynamo.reset()
            measured.append(median_ms(v.run))
    for v, measured in zip(variants, times):
        v.ms = statistics.median(measured)
        print(f"{v.name}: {', '.join(f'{ms:.2f}' for ms in measured)} ms in {rounds} alternating rounds")


def median_ms(fn: Callable[[], Any]) -> float:
    """Median time of ``fn()`` in ms, after warm-up calls (``triton.testing.do_bench``, CUDA events)."""
    import triton.testing

    return triton.testing.do_bench(fn, rep=TIMED_MS, return_mode="median")


def print_speedup(what: str, ours: Variant, default: Variant, items: Optional[int] = None, unit: str = "") -> None:
    """One line: both times, the speed-up of ``ours`` over ``default``, and ``items / s`` (e.g. tokens/s) when
    given."""
    if ours.ms is None or default.ms is None:
        return
    rate = (lambda v: f" ({items / (v.ms * 1e-3):,.0f} {unit}/s)") if items else (lambda v: "")
    print(f"{what}: {ours.name} {ours.ms:.2f} ms{rate(ours)}, {default.name} {default.ms:.2f} ms{rate(default)}; "
          f"speed-up {default.ms / ours.ms:.2f}x")


def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


class Checks:
    """The example's checks: each prints its line; a failed one makes :meth:`exit_code` 1."""

    def __init__(self, setup: Setup):
        self.setup = setup
        self.failures: list[str] = []

    def fail(self, message: str) -> None:
        self.failures.append(message)
        print(f"FAILED: {message}")

    def fused(self, what: str, reports: list, layers: int) -> None:
        """Print every softmax's verdict (fused, with its spec, or why not); expect each graph that has attention
        (one per compile: Dynamo may compile a model more than once, e.g. for a new sequence length) to have all
        ``layers`` fused."""
        verdicts = [v for r in reports for v in r.verdicts]
        count = sum(v.fused for v in verdicts)
        print(f"{what}: fuse_attn fused {count} attention(s) in {len(reports)} graph(s) of {layers} attention layers")
        for verdict in verdicts:
            print("  " + verdict.line())
        if not reports or [len(r.fused) for r in reports] != [layers] * len(reports):
            self.fail(f"{what}: fused per graph {[len(r.fused) for r in reports]}, expected {layers} in each")

    def close(self, what: str, ours: torch.Tensor, baselines: Sequence[torch.Tensor], reference: torch.Tensor, *, quiet: bool = False) -> float:
        """The 2x rule: ``|ours - fp64| <= 2 * max |baseline - fp64| + floor``, the baselines being eager (and on
        a GPU also torch.compile default, whose rounding of the rest of the model can be worse than eager's) in
        the same dtype. Returns our error over the allowed error (<= 1 passes)."""
        baseline_error = max(max_error(b, reference) for b in baselines)
        allowed = 2 * baseline_error + FLOOR[self.setup.dtype]
        error = max_error(ours, reference)
        if not quiet:
            print(f"{what}: error against fp64 {error:.3g}, allowed {allowed:.3g} "
                  f"(2 x {baseline_error:.3g} of the same dtype's baseline + {FLOOR[self.setup.dtype]:g})")
        if not error <= allowed:  # `not <=` also fails on NaN
            self.fail(f"{what}: error {error:.3g} > allowed {allowed:.3g}")
        return error / allowed

    def all_close(self, what: str, named_ours: Sequence[tuple[str, torch.Tensor]], baselines: Sequence[Sequence[torch.Tensor]], reference: Sequence[torch.Tensor]) -> None:
        """:meth:`close` for each of many tensors (e.g. parameter gradients); prints the one nearest its bound."""
        failed_before = len(self.failures)
        ratios = [(self.close(f"{what} {name}", ours, others, ref, quiet=True), name)
                  for (name, ours), others, ref in zip(named_ours, zip(*baselines), reference)]
        worst, name = max(ratios)
        passed = len(ratios) - (len(self.failures) - failed_before)
        print(f"{what}: {passed} of {len(ratios)} tensors within the 2x rule; nearest its bound: {name} at "
              f"{worst:.2f} of the allowed error")

    def equal(self, what: str, ours: torch.Tensor, expected: torch.Tensor) -> None:
        same = ours.shape == expected.shape and bool((ours == expected).all())
        print(f"{what}: {'equal' if same else 'DIFFERENT'}")
        if not same:
            self.fail(f"{what} differ:\n{ours}\n{expected}")

    def exit_code(self) -> int:
        print("all checks passed" if not self.failures else f"{len(self.failures)} check(s) failed")
        return 1 if self.failures else 0


def compare_training(setup: Setup, checks: Checks, model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module], torch.Tensor],
                     *, steps: int, tokens_per_step: int, layers: int) -> None:
    """Train copies of ``model`` (same weights) with AdamW for ``steps`` steps: compiled with fuse_attn, eager, eager
    in fp64 (the reference), and on a GPU compiled with torch.compile's default backend. Checks what was fused and
    the first step's loss and gradients (2x rule), prints the losses, and on a GPU the time of a training step."""

    def prepare(source: torch.nn.Module, dtype: torch.dtype):
        def build(backend: Optional[str]) -> Callable[[], tuple[torch.Tensor, list]]:
            copy_ = copy.deepcopy(source).to(dtype)
            params = list(copy_.parameters())
            optimizer = torch.optim.AdamW(params, lr=1e-3)
            run_model = copy_ if backend is None else torch.compile(copy_, backend=backend)

            def step():
                optimizer.zero_grad(set_to_none=True)  # at the start: the returned gradients stay this step's
                loss = loss_fn(run_model)
                loss.backward()
                optimizer.step()
                return loss.detach(), [p.grad for p in params]

            return step
        return build

    def first_steps(step):  # the losses of every step, the gradients of the first
        first = step()
        return [first] + [(step()[0], None) for _ in range(steps - 1)]

    named = [name for name, _ in model.named_parameters()]
    ours = run_variant(setup, "fuse_attn", "fuse_attn", prepare(model, setup.dtype), first_steps)
    eager = run_variant(setup, "eager", None, prepare(model, setup.dtype), first_steps)
    reference = run_variant(setup, "fp64", None, prepare(model, torch.float64), first_steps)
    baselines = [eager]
    if setup.cuda:
        default = run_variant(setup, "torch.compile default", "inductor", prepare(model, setup.dtype), first_steps)
        baselines.append(default)
    checks.fused("training", ours.reports, layers)
    (loss, grads), *_ = ours.result
    checks.close("first step's loss", loss, [b.result[0][0] for b in baselines], reference.result[0][0])
    checks.all_close("first step's gradient", list(zip(named, grads)), [b.result[0][1] for b in baselines],
                     reference.result[0][1])
    for i, (o, e, r) in enumerate(zip(ours.result, eager.result, reference.result)):
        print(f"step {i}: loss fuse_attn {o[0].item():.5f}, eager {e[0].item():.5f}, fp64 {r[0].item():.5f}")
    if setup.cuda:
        print_speedup("training step (forward, backward, AdamW)", ours, default, tokens_per_step, "tokens")


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Cross entropy of the logits at each position against the next token, in fp32 or wider (an fp64 model's loss
    stays fp64: it is the reference)."""
    logits = logits[:, :-1].flatten(0, 1)
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), tokens[:, 1:].flatten())
