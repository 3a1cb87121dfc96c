"""Run the backend's trace + rewrite on what Dynamo captures, without compiling (for golden-graph tests); and a
compiled step's output code (:func:`compiled_code`)."""

from __future__ import annotations

import dataclasses
import re

import torch

from fuse_attn.backend import trace_pre_autograd
from fuse_attn.report import GraphReport, collect_reports
from fuse_attn.graph.rewrite import rewrite_attention


def rewrite_reports(fn, *args, dynamic=None, training=False, earlier=(), **kwargs) -> list[GraphReport]:
    """Each graph of ``fn(*args)`` after the rewrite (as for a graph that will be trained, with ``training``); the
    original graphs run eagerly. ``earlier``: argument tuples ``fn`` is compiled with first, in the same Dynamo
    session (their graphs are not reported) -- a float argument that had another value there is a graph input of
    the graphs reported (Dynamo lifts a float whose value changed)."""
    reports: list[GraphReport] = []

    def capture(gm, example_inputs):
        traced, ctx = trace_pre_autograd(gm, example_inputs)
        reports.append(rewrite_attention(traced, ctx, capture=True, training=training))
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=capture, dynamic=dynamic)
    for earlier_args in earlier:
        compiled(*earlier_args, **kwargs)
    reports.clear()
    compiled(*args, **kwargs)
    return reports


def graph_text(report: GraphReport) -> str:
    """The rewritten graph without comments or annotations that vary between torch versions."""
    lines = []
    for line in report.after.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.startswith("class "):
            continue
        line = re.sub(r';\s+[\w, =]+ = None$', "", line.rstrip())  # FX's "x = None" frees
        line = re.sub(r"\bzf\d+\b", "zf", line)  # a lifted float's symbol, numbered by what Dynamo traced before
        lines.append(line)
    return "\n".join(lines)


def verdict_lines(reports: list[GraphReport]) -> str:
    """Verdicts without their source lines (which move whenever a test file is edited)."""
    return "\n".join(dataclasses.replace(v, source=None).line() for r in reports for v in r.verdicts)


def unfused_verdicts(fn, *args, dynamic=None) -> str:
    """The verdict lines of ``fn``'s graphs, which fails unless no graph calls the fused op (what must not be
    rewritten)."""
    reports = rewrite_reports(fn, *args, dynamic=dynamic)
    for report in reports:
        assert "fuse_attn.flash_attention" not in report.after, report.after
    return verdict_lines(reports)


def fused_graph(fn, *args) -> str:
    """The text of ``fn``'s one rewritten graph; fails with the verdicts unless every softmax in it is fused."""
    reports = rewrite_reports(fn, *args)
    assert len(reports) == 1 and all(v.fused for v in reports[0].verdicts), verdict_lines(reports)
    return graph_text(reports[0])


def fused_specs(fn, *args, dynamic=None) -> str:
    """Each fused attention's spec, one line each; fails with the verdicts unless every softmax is fused."""
    reports = rewrite_reports(fn, *args, dynamic=dynamic)
    verdicts = [v for r in reports for v in r.verdicts]
    assert verdicts and all(v.fused for v in verdicts), verdict_lines(reports)
    return "\n".join(v.description for v in verdicts)


def compiled_code(step):
    """``step()`` run once, its graphs lowered by Inductor in this call: its result, the output code Inductor generated
    for it (one text) and the backend's reports of the graphs it compiled.

    The FX graph and AOTAutograd caches are off for the call: an entry stored under other patches of the test session
    (a lowering or launch function a test replaces leaves the graph, so the key, as it was) would otherwise be served
    in place of this process's lowering. The compiled C++ kernels stay in Inductor's cache: an entry there is keyed by
    the kernel's source and compile command, so it is the same kernel whoever built it (a fresh cache would compile
    each of T5's ~30 small C++ kernels again, ~1.4 s each on a CPU)."""
    from torch._inductor.utils import run_and_get_code

    with torch._inductor.config.patch(fx_graph_cache=False, fx_graph_remote_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False, enable_remote_autograd_cache=False), \
            collect_reports() as reports:
        result, codes = run_and_get_code(step)
    return result, "\n".join(codes), reports
