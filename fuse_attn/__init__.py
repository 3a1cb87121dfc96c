"""fuse_attn: ``torch.compile(model, backend="fuse_attn")`` fuses every attention into a generated Triton flash kernel."""

from __future__ import annotations

from fuse_attn.report import ExplainReport, collect_reports

__all__ = ["explain", "collect_reports", "ExplainReport", "fuse_exported"]


def fuse_exported(ep):
    """Replace every attention of an exported program (``torch.export.export``) with the fused op, in place, for
    export flows such as AOTInductor packages; returns the program (:mod:`fuse_attn.export`)."""
    from fuse_attn.export import fuse_exported as rewrite

    return rewrite(ep)


def explain(model, *args, **kwargs) -> ExplainReport:
    """Say, for every softmax in ``model(*args, **kwargs)``, whether the backend fuses it and why not (and, where the
    call computes gradients, which few-row embedding tables get the table gradient by partial sums).

    Runs Dynamo and the backend's matcher only (the graphs then run eagerly; nothing is compiled by Inductor), and
    warns of nothing: compiling with the backend warns of each reason an attention is left unfused once per process,
    this lists every softmax.
    """
    import torch

    from fuse_attn.backend import analyze_only
    from fuse_attn.report import collect_explained

    with collect_explained() as graphs:
        torch.compile(model, backend=analyze_only)(*args, **kwargs)
    return ExplainReport(graphs)
