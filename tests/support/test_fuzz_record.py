"""tests/support/fuzz_record.py: the fuzz result table -- rows replaced or accumulated, rows of the older
9-column format read, the failures the exact delta explains listed last, concurrent writers (sharded runs) adding
up under the file lock."""

from __future__ import annotations

import multiprocessing

import pytest
import torch
import triton

from tests.support import fuzz_record

OLD_ROW = "| 2026-11-20 10:00 | long | GPU X | {} | op, GPU kernels | 6 | 5 | 1 | 278 |"


@pytest.fixture
def record(tmp_path, monkeypatch):
    path = tmp_path / "T.md"
    versions = f"{torch.__version__} / {triton.__version__}"
    path.write_text("# intro\n\n" + "\n".join([
        fuzz_record.BEGIN,
        "| date (UTC) | profile | device | torch / triton | test | cases run | passed | failed | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
        OLD_ROW.format(versions), "", fuzz_record.FAILURES_TITLE, "",
        "- [long / GPU X / op, GPU kernels] AssertionError: old -- Case(...)", fuzz_record.END]) + "\ntail\n")
    monkeypatch.setenv("FUSE_ATTN_FUZZ_RECORD", str(path))
    return path


def rows(path) -> dict[str, list[str]]:
    text = path.read_text()
    section = text.split(fuzz_record.BEGIN)[1].split(fuzz_record.END)[0]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and cells[0][:2] == "20":
            out[cells[4]] = cells
    return out


def failures(path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith("- [")]


def test_old_rows_read_and_a_new_row_added(record):
    fuzz_record.add("op, GPU kernels (unspecialized)", 10, 7, ["A: x", f"{fuzz_record.EXACT_DELTA_MARK} B: y", "C: z"],
                    12.0, exact_delta_passes=1)
    fuzz_record.write("long", "GPU X")
    table = rows(record)
    assert table["op, GPU kernels"][5:] == ["6", "5", "1", "-", "278"]  # the old row, with no exact-delta count
    assert table["op, GPU kernels (unspecialized)"][5:] == ["10", "7", "3", "1", "12"]
    listed = [f for f in failures(record) if "(unspecialized)" in f]
    assert fuzz_record.EXACT_DELTA_MARK in listed[-1] and len(listed) == 3  # explained failures last
    text = record.read_text()
    assert text.startswith("# intro") and text.endswith("tail\n")


def test_accumulate_adds_counts_and_keeps_failures(record, monkeypatch):
    monkeypatch.setenv("FUSE_ATTN_FUZZ_ACCUMULATE", "1")
    fuzz_record.add("op, GPU kernels", 4, 4, [], 2.0, exact_delta_passes=0)
    fuzz_record.write("long", "GPU X")
    assert rows(record)["op, GPU kernels"][5:] == ["10", "9", "1", "-", "280"]  # no count before: stays unknown
    assert any("AssertionError: old" in f for f in failures(record))
    fuzz_record.add("op, GPU kernels (unspecialized)", 3, 1, ["A: x", f"{fuzz_record.EXACT_DELTA_MARK} B"], 1.0, 1)
    fuzz_record.write("long", "GPU X")
    fuzz_record.add("op, GPU kernels (unspecialized)", 5, 4, [f"{fuzz_record.EXACT_DELTA_MARK} C"], 1.0, 1)
    fuzz_record.write("long", "GPU X")
    assert rows(record)["op, GPU kernels (unspecialized)"][5:] == ["8", "5", "3", "2", "2"]


def _shard(path: str, start) -> None:
    import os

    os.environ.update(FUSE_ATTN_FUZZ_RECORD=path, FUSE_ATTN_FUZZ_ACCUMULATE="1")
    start.wait()  # all together: unlocked read-modify-writes would lose counts
    for _ in range(50):
        fuzz_record.add("op, sharded", 1, 1, [], 1.0, 0)
        fuzz_record.write("long", "GPU X")


def test_concurrent_shards_add_up(record):
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(4)
    procs = [ctx.Process(target=_shard, args=(str(record), start)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert rows(record)["op, sharded"][5:] == ["200", "200", "0", "0", "200"]
