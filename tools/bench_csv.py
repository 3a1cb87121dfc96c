"""CSV output shared by the benchmark tools: rows appended and flushed as they are measured."""

from __future__ import annotations

import contextlib
import csv


@contextlib.contextmanager
def appending(path, columns, run_info):
    """Yield ``record(values)``: appends one row (``values`` + ``run_info``) to ``path`` and flushes it."""
    with open(path, "a", newline="") as f:
        writer = csv.writer(f)
        if f.tell() == 0:
            writer.writerow(columns)

        def record(values):
            writer.writerow(values + run_info)
            f.flush()

        yield record
