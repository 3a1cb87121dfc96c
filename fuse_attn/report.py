"""What happened to each softmax: fused (with its spec) or not (with the reason). Logged and collectable.

Every verdict is an INFO line of the ``fuse_attn`` logger (``TORCH_LOGS=fuse_attn`` shows them). An attention left
unfused is also a WARNING, once per reason and process (:func:`warn_unfused`), so that it is seen without logs.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Iterator, Optional

from fuse_attn.kernels import plan
from fuse_attn.spec import AttentionSpec

log = logging.getLogger("fuse_attn")


@dataclass(frozen=True)
class SoftmaxVerdict:
    node: str  # the softmax node's name in the pre-autograd graph
    fused: bool
    reason: Optional[str] = None  # why not, when not fused
    about: Optional[str] = None  # the node the reason is about
    spec: Optional[AttentionSpec] = None
    source: Optional[str] = None  # the user's code line, when known
    runs: Optional[str] = None  # which implementation a fused attention runs, where candidates were timed
    implementation: Optional[str] = None  # that implementation's name (dispatch's candidate names), once compiled
    # whether a softmax left unfused is an attention's: False where its weights meet no matrix product (a classifier's
    # probabilities), None where that was not examined
    attention: Optional[bool] = None
    # an attention sink: its logit column's share applied to the fused op's output (fuse_attn.graph.matching)
    sink: bool = False
    # the graph reads the scores' logsumexp besides the softmax: the fused op's lse serves it
    logsumexp_read: bool = False

    @property
    def description(self) -> Optional[str]:
        """A fused attention's spec and what the kernels plan for it (:func:`fuse_attn.kernels.plan.describe`)."""
        if self.spec is None:
            return None
        return (plan.describe(self.spec) + (" + sink (output x sigmoid(lse - sink))" if self.sink else "")
                + (" + the scores' logsumexp (the op's lse)" if self.logsumexp_read else ""))

    def line(self) -> str:
        where = f" ({self.source})" if self.source else ""
        if self.fused:
            runs = f"; {self.runs}" if self.runs else ""
            return f"fused {self.node}{where}: {self.description}{runs}"
        return f"not fused {self.node}{where}: {self.reason}"


@dataclass(frozen=True)
class TableLookup:
    """An embedding lookup of a few-row trained table (T5's relative position bias) that the rewrite gave the table
    gradient by partial sums (``fuse_attn.kernels.embedding_backward``)."""

    node: str  # the lookup's node name in the pre-autograd graph
    table: str  # the table's shape
    source: Optional[str] = None  # the user's code line, when known

    def line(self) -> str:
        where = f" ({self.source})" if self.source else ""
        return f"table gradient by partial sums {self.node}{where}: a {self.table} table"


@dataclass
class GraphReport:
    """One graph's rewrite: the verdicts, the table lookups rewritten and, when captured, the graph text before and
    after."""

    verdicts: list[SoftmaxVerdict]
    before: Optional[str] = None
    after: Optional[str] = None
    rewritten: bool = True
    tables: list[TableLookup] = field(default_factory=list)

    @property
    def fused(self) -> list[SoftmaxVerdict]:
        return [v for v in self.verdicts if v.fused]

    @property
    def changed(self) -> bool:
        """Whether the rewrite changed the graph: an attention fused or a table lookup rewritten."""
        return bool(self.fused or self.tables)

    @property
    def not_fused(self) -> list[SoftmaxVerdict]:
        return [v for v in self.verdicts if not v.fused]


@dataclass
class ExplainReport:
    """What ``fuse_attn.explain`` found: one GraphReport per graph Dynamo captured."""

    graphs: list[GraphReport]

    @property
    def fused(self) -> list[SoftmaxVerdict]:
        return [v for g in self.graphs for v in g.fused]

    @property
    def not_fused(self) -> list[SoftmaxVerdict]:
        return [v for g in self.graphs for v in g.not_fused]

    def __str__(self) -> str:
        lines = [f"{len(self.fused)} attention(s) fused, {len(self.not_fused)} softmax(es) not fused, in {len(self.graphs)} graph(s)"]
        lines += [v.line() for g in self.graphs for v in g.verdicts]
        lines += [t.line() for g in self.graphs for t in g.tables]
        return "\n".join(lines)


collectors: list[list[GraphReport]] = []


@contextlib.contextmanager
def _collecting(open_blocks: list[list[GraphReport]]) -> Iterator[list[GraphReport]]:
    """A list of reports that is one of ``open_blocks`` for the duration of the block."""
    reports: list[GraphReport] = []
    open_blocks.append(reports)
    try:
        yield reports
    finally:
        open_blocks.remove(reports)


def collect_reports() -> contextlib.AbstractContextManager[list[GraphReport]]:
    """Collect the report of every graph the backend rewrites inside the block."""
    return _collecting(collectors)


def publish(report: GraphReport) -> None:
    """Log the report of a graph the backend (or :func:`fuse_attn.fuse_exported`) compiles and hand it to the
    collectors; ``fuse_attn.explain`` only analyses, and publishes nothing."""
    for line in [v.line() for v in report.verdicts] + [t.line() for t in report.tables]:
        log.info(line)
    warn_unfused(report.verdicts)
    for reports in collectors:
        reports.append(report)


explain_collectors: list[list[GraphReport]] = []


def collect_explained() -> contextlib.AbstractContextManager[list[GraphReport]]:
    """The report of every graph that runs inside the block under ``fuse_attn.explain``'s backend
    (:func:`fuse_attn.backend.analyze_only`)."""
    return _collecting(explain_collectors)


def explained(report: GraphReport) -> None:
    """Hand the report of a graph run under ``fuse_attn.explain``'s backend to the open :func:`collect_explained`
    blocks (nothing is logged: explain warns of nothing)."""
    for reports in explain_collectors:
        reports.append(report)


# The reasons an unfused attention was already warned of in this process (:func:`warn_unfused`).
warned_reasons: set[str] = set()


def warn_unfused(verdicts: list[SoftmaxVerdict]) -> None:
    """One WARNING per reason and process for the attentions left unfused: a model compiled many times (each graph
    break, each recompile) says each reason once. A softmax that is no attention (``attention`` False) is not
    warned of; the INFO lines and ``fuse_attn.explain`` still list it."""
    for verdict in verdicts:
        if verdict.fused or verdict.attention is False or verdict.reason in warned_reasons:
            continue
        warned_reasons.add(verdict.reason)
        where = f" at {verdict.source}" if verdict.source else f" ({verdict.node})"
        log.warning("fuse_attn: an attention%s runs unfused: %s. fuse_attn.explain(model, *inputs) lists every "
                    "softmax left unfused and why (this warning is given once per reason)", where, verdict.reason)


def reset_unfused_warnings() -> None:
    """Forget the reasons already warned of: each is warned of again (for tests)."""
    warned_reasons.clear()
