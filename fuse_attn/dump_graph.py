"""Show what fuse_attn rewrites in a model, and why it leaves the rest.

    fuse-attn-dump-graph examples.attention_forms:nanogpt_block [--kernel-source] [--no-graphs]
    python -m tools.dump_graph ...        (the same, from a checkout of the repository)

``module:fn`` names a function that builds the model and its inputs and returns ``(model, args)`` or
``(model, args, kwargs)``. For each graph Dynamo hands to the backend it prints the pre-autograd graph before
and after the rewrite, every fused attention with its spec, and every softmax left alone with its reason.
``--kernel-source`` also prints the Triton source generated for each fused spec.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import torch

from fuse_attn.report import GraphReport, collect_reports


def run_and_collect(model, args, kwargs) -> list[GraphReport]:
    torch._dynamo.reset()
    with collect_reports() as reports:
        torch.compile(model, backend="fuse_attn")(*args, **kwargs)
    return reports


def format_reports(reports: list[GraphReport], *, graphs: bool = True, kernel_source: bool = False) -> str:
    lines = []
    for index, report in enumerate(reports):
        lines.append(f"=== graph {index}: {len(report.fused)} fused, {len(report.not_fused)} not fused ===")
        if graphs and report.before is not None:
            lines += ["--- before ---", report.before.rstrip(), "--- after ---", report.after.rstrip()]
        for verdict in report.verdicts:
            lines.append(verdict.line())
            if not verdict.fused and verdict.about and verdict.about != verdict.node:
                lines.append(f"    (at node {verdict.about})")
            if verdict.fused:
                lines.append(f"    spec: {verdict.spec.to_json()}")
                if kernel_source:
                    from fuse_attn.kernels.ops import generated_source

                    lines += ["--- generated kernel source ---", generated_source(verdict.spec).rstrip()]
        lines += [table.line() for table in report.tables]
    if not reports:
        lines.append("no graph reached the backend's rewrite (no softmax, or rewriting disabled)")
    return "\n".join(lines)


def load_builder(target: str):
    module_name, _, fn_name = target.partition(":")
    if not fn_name:
        raise SystemExit(f"expected module:function, got {target!r}")
    if os.getcwd() not in sys.path:  # the installed command finds the user's modules where `python -m` would
        sys.path.insert(0, os.getcwd())
    return getattr(importlib.import_module(module_name), fn_name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="module:function returning (model, args) or (model, args, kwargs)")
    parser.add_argument("--kernel-source", action="store_true", help="print the generated Triton source per fused spec")
    parser.add_argument("--no-graphs", action="store_true", help="print only the verdicts")
    options = parser.parse_args(argv)
    built = load_builder(options.target)()
    model, args, kwargs = (*built, {}) if len(built) == 2 else built
    reports = run_and_collect(model, args, kwargs)
    print(format_reports(reports, graphs=not options.no_graphs, kernel_source=options.kernel_source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
