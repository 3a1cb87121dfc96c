"""Writes the result of a fuzz run into a markdown file (``FUSE_ATTN_FUZZ_RECORD=path``).

The file's table between the two marker lines below holds one row per (profile, device, test): the latest run of
each replaces its previous row (or, with ``FUSE_ATTN_FUZZ_ACCUMULATE=1`` and the same versions, adds to it);
everything outside the markers is left as it is. Failures of a run are listed
under the table (ten, each with the case that reproduces it; those that pass with the exact delta last)."""

from __future__ import annotations

import datetime
import fcntl
import os
import re

import torch

BEGIN = "<!-- fuzz results: written by tests/support/fuzz_record.py, one row per profile, device and test -->"
END = "<!-- end of fuzz results -->"
HEADER = ("| date (UTC) | profile | device | torch / triton | test | cases run | passed | failed | of those, pass with "
          "exact delta | seconds |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
# Starts a failure that passes with FUSE_ATTN_EXACT_DELTA=1 (tests/kernels/test_fuzz.py): listed after the others.
EXACT_DELTA_MARK = "[passes with FUSE_ATTN_EXACT_DELTA=1]"
FAILURES_TITLE = "Failures of the latest recorded runs:"

_rows: list[dict] = []


def add(test: str, run: int, passed: int, failures: list[str], seconds: float, exact_delta_passes: int = 0) -> None:
    _rows.append(dict(test=test, run=run, passed=passed, failures=failures, seconds=seconds,
                      exact_delta_passes=exact_delta_passes))


def write(profile: str, device: str) -> None:
    path = os.environ.get("FUSE_ATTN_FUZZ_RECORD")
    rows, _rows[:] = list(_rows), []
    if not path or not rows:
        return
    import triton

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    versions = f"{torch.__version__} / {triton.__version__}"
    with open(path, "r+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # processes of a sharded run (FUSE_ATTN_FUZZ_SHARD) record into one file
        text = _updated(f.read(), path, profile, device, rows, date, versions)
        f.seek(0)
        f.truncate()
        f.write(text)


def _updated(text: str, path: str, profile: str, device: str, rows: list[dict], date: str, versions: str) -> str:
    if BEGIN not in text or END not in text:
        raise ValueError(f"{path} has no fuzz results section (the lines {BEGIN!r} and {END!r})")
    head, rest = text.split(BEGIN, 1)
    section, tail = rest.split(END, 1)
    table = {}  # (profile, device, test) -> row text, in order
    failures = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) in (9, 10) and not set(cells[0]) <= set("-") and cells[0] != "date (UTC)":
            if len(cells) == 9:  # a row recorded before the exact-delta column: not counted then
                cells.insert(8, "-")
            table[(cells[1], cells[2], cells[4])] = "| " + " | ".join(cells) + " |"
        m = re.match(r"- \[(.*?) / (.*?) / (.*?)\] (.*)", line)
        if m:
            failures.setdefault(m.groups()[:3], []).append(line)
    accumulate = os.environ.get("FUSE_ATTN_FUZZ_ACCUMULATE", "0") == "1"
    for r in rows:
        key = (profile, device, r["test"])
        run, passed, seconds, exact = r["run"], r["passed"], r["seconds"], r["exact_delta_passes"]
        new_failures = [f"- [{profile} / {device} / {r['test']}] {_one_line(f)}" for f in r["failures"]]
        old = [c.strip() for c in table[key].strip().strip("|").split("|")] if key in table else None
        if accumulate and old is not None and old[3] == versions:
            run, passed, seconds = run + int(old[5]), passed + int(old[6]), seconds + float(old[9])
            exact = exact + int(old[8]) if old[8].isdigit() else "-"
            new_failures = failures.get(key, []) + new_failures
        table[key] = (f"| {date} | {profile} | {device} | {versions} | {r['test']} | {run} | {passed} | "
                      f"{run - passed} | {exact} | {seconds:.0f} |")
        # the failures the exact delta does not explain first
        failures[key] = sorted(new_failures, key=lambda line: EXACT_DELTA_MARK in line)[:10]
    lines = [BEGIN, HEADER, *table.values(), ""]
    listed = [line for key in table for line in failures.get(key, [])]
    lines += [FAILURES_TITLE, "", *(listed or ["- none"]), END]
    return head + "\n".join(lines) + tail


def _one_line(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")[:700]
