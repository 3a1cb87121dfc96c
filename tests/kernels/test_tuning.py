"""The kernel tuner's choices: memory, disk cache (format, corruption, concurrency, unwritable dirs), progress logs.

No GPU: the device identity, the software versions and the timing are replaced by fakes, and ``launch`` does
nothing (or raises, for a config that "fails to compile"): the ``machine`` fixture (tests/conftest.py) installs
tests/support/tuning.py's ``FakeMachine``.
"""

import json
import logging
import multiprocessing
import os

import pytest
import torch

from fuse_attn import settings
from fuse_attn.kernels import tuning
from fuse_attn.kernels.tuning import KernelConfig
from tests.support.tuning import CANDIDATES, FASTEST, TIMES_MS, key, new_process

LOGGER = "fuse_attn.kernels.tuning"


def tune(machine, k):
    return tuning.tune(k, CANDIDATES, machine.launch)


def read_cache(k):
    with open(tuning.cache_file(k), encoding="utf-8") as f:
        return json.load(f)


def test_a_config_of_two_dkdv_launches_is_written_with_its_launches_and_read_back(machine, monkeypatch):
    # the field is written only off its default: the other configs' entries read as before the field existed
    split = KernelConfig(32, 128, 8, 3, dkdv_launches=2)
    candidates = [CANDIDATES[0], split]
    monkeypatch.setitem(TIMES_MS, split, 0.05)
    k = tuning.tuning_key("bwd_dkdv", torch.device("cuda", 0), "spec0", torch.bfloat16, 256, 256, 1000, 1000)
    assert tuning.tune(k, candidates, machine.launch) == split
    assert read_cache(k)["entries"] == {k.entry_name(): {"block_m": 32, "block_n": 128, "num_warps": 8,
                                                         "num_stages": 3, "dkdv_launches": 2, "ms": 0.05}}
    new_process(monkeypatch)
    assert tuning.tune(k, candidates, machine.launch) == split
    assert machine.timed == candidates  # read back, not timed again


def test_the_first_pass_fastest_are_timed_again_and_the_longer_timing_decides(machine, monkeypatch):
    monkeypatch.setattr(tuning, "_FINALISTS", 2)
    machine.second_pass_ms = {FASTEST: 0.15}  # the first pass's fastest (0.1 ms) is really 0.25 ms: a short-run fluke
    assert tune(machine, key()) == CANDIDATES[2]
    assert machine.timed == CANDIDATES and machine.retimed == [FASTEST, CANDIDATES[2]]  # the slowest is not retimed


def test_tuned_choice_is_written_and_read_back_by_a_new_process(machine, monkeypatch):
    k = key()
    assert tune(machine, k) == FASTEST
    assert machine.timed == CANDIDATES
    data = read_cache(k)
    assert data["format"] == tuning.FORMAT_VERSION
    assert (data["gpu"], data["capability"], data["triton"], data["torch"]) == ("Fake GPU 80GB", "9.0", "3.9.0", "2.13.0")
    assert data["entries"] == {k.entry_name(): {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3, "ms": 0.1}}

    new_process(monkeypatch)
    assert tuning.cached(k) is None
    assert tune(machine, k) == FASTEST
    assert machine.timed == CANDIDATES  # nothing timed again
    assert tuning.cached(k) == FASTEST


def test_a_length_in_a_known_bucket_reuses_its_config_another_bucket_retunes(machine, monkeypatch):
    tune(machine, key(m=1000, n=1000))
    new_process(monkeypatch)
    assert tune(machine, key(m=513, n=1024)) == FASTEST  # same buckets (513..1024): read from disk
    assert len(machine.timed) == len(CANDIDATES)
    tune(machine, key(m=1025, n=1000))
    assert len(machine.timed) == 2 * len(CANDIDATES)
    assert len(read_cache(key())["entries"]) == 2


@pytest.mark.parametrize("change", ["gpu", "capability", "triton", "torch"])
def test_another_gpu_or_version_does_not_reuse_an_entry(machine, monkeypatch, change):
    tune(machine, key())
    new_process(monkeypatch)
    setattr(machine, change, getattr(machine, change) + "1")
    tune(machine, key())
    assert len(machine.timed) == 2 * len(CANDIDATES)
    assert len([name for name in os.listdir(settings.cache_dir()) if name.endswith(".json")]) == 2
    assert read_cache(key())[change] == getattr(machine, change)


def _bad_entry_for_this_key(k):
    entry = {"block_m": "wide", "block_n": 64, "num_warps": 8, "num_stages": 3, "ms": 0.1}
    return json.dumps({"format": tuning.FORMAT_VERSION, **k.file_identity(), "entries": {k.entry_name(): entry}})


CORRUPTIONS = {
    "truncated": lambda k: json.dumps({"format": tuning.FORMAT_VERSION, **k.file_identity(), "entries": {}})[:30],
    "garbage": lambda k: b"\x00\xff not json {{{",  # not even UTF-8
    "wrong format version": lambda k: json.dumps({"format": tuning.FORMAT_VERSION + 1, **k.file_identity(),
                                                  "entries": {}}),
    "a list": lambda k: json.dumps([1, 2, 3]),
    "another gpu's entries": lambda k: json.dumps({"format": tuning.FORMAT_VERSION, **k.file_identity(),
                                                   "gpu": "Other GPU", "entries": {}}),
    "bogus config": _bad_entry_for_this_key,
    "entries not an object": lambda k: json.dumps({"format": tuning.FORMAT_VERSION, **k.file_identity(),
                                                   "entries": [1]}),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_corrupt_cache_file_is_ignored_and_rebuilt(machine, caplog, corruption):
    k = key()
    path = tuning.cache_file(k)
    os.makedirs(os.path.dirname(path))
    content = CORRUPTIONS[corruption](k)
    with open(path, "wb") as f:
        f.write(content if isinstance(content, bytes) else content.encode())
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert tune(machine, k) == FASTEST
    assert machine.timed == CANDIDATES
    assert [r.levelno for r in caplog.records if "ignoring" in r.getMessage()] == [logging.WARNING]
    data = read_cache(k)
    assert data["format"] == tuning.FORMAT_VERSION and data["gpu"] == machine.gpu
    assert data["entries"] == {k.entry_name(): {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3, "ms": 0.1}}


def test_a_bad_entry_is_dropped_and_the_good_ones_kept(machine, monkeypatch):
    good, bad = key(digest="good"), key(digest="bad")
    tune(machine, good)
    data = read_cache(good)
    data["entries"][bad.entry_name()] = {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3, "ms": "fast"}
    with open(tuning.cache_file(good), "w", encoding="utf-8") as f:
        json.dump(data, f)
    new_process(monkeypatch)
    assert tune(machine, bad) == FASTEST
    assert tune(machine, good) == FASTEST
    assert len(machine.timed) == 2 * len(CANDIDATES)  # bad re-tuned, good read back
    assert read_cache(good)["entries"][bad.entry_name()]["ms"] == 0.1


def test_a_stored_config_that_is_no_longer_a_candidate_is_retuned(machine, monkeypatch):
    k = key()
    tune(machine, k)
    new_process(monkeypatch)
    remaining = [c for c in CANDIDATES if c != FASTEST]
    assert tuning.tune(k, remaining, machine.launch) == CANDIDATES[2]
    assert machine.timed == CANDIDATES + remaining


def _unwritable_by_chmod(tmp_path):
    d = tmp_path / "read-only"
    d.mkdir()
    d.chmod(0o500)
    try:
        (d / "probe").write_text("")
    except PermissionError:
        return d
    pytest.skip("chmod does not stop this user from writing (root?)")


def _unwritable_under_a_file(tmp_path):
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file" / "cache"  # cannot be created, even by root


@pytest.mark.parametrize("make_dir", [_unwritable_by_chmod, _unwritable_under_a_file])
def test_an_unwritable_cache_dir_warns_once_and_keeps_choices_in_memory(machine, monkeypatch, caplog, tmp_path, make_dir):
    d = make_dir(tmp_path)
    monkeypatch.setenv("FUSE_ATTN_CACHE_DIR", str(d))
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert tune(machine, key(digest="a")) == FASTEST
            assert tune(machine, key(digest="b")) == FASTEST
            assert tune(machine, key(digest="a")) == FASTEST
    finally:
        if d.exists():
            d.chmod(0o700)
    assert len(machine.timed) == 2 * len(CANDIDATES)  # the third call came from memory
    assert len(caplog.records) == 1 and caplog.records[0].levelno == logging.WARNING
    assert str(d) in caplog.records[0].getMessage()
    assert not d.exists() or os.listdir(d) == []


def _tune_many(machine, barrier, process, count):
    barrier.wait()  # start writing together
    for i in range(count):
        tuning.tune(key(digest=f"process{process}-{i}"), CANDIDATES, machine.launch)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork (importing torch anew takes seconds)")
def test_processes_tuning_at_once_keep_each_others_entries(machine):
    per_process = 25  # enough writes that unlocked read-merge-write cycles of two processes overlap
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_tune_many, args=(machine, barrier, p, per_process)) for p in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    entries = read_cache(key())["entries"]
    assert sorted(entries) == sorted(key(digest=f"process{p}-{i}").entry_name() for p in range(2) for i in range(per_process))
    assert all(tuning._entry_choice(e) == FASTEST for e in entries.values())


def test_cache_off_neither_writes_nor_reads(machine, monkeypatch):
    k = key()
    tune(machine, k)
    new_process(monkeypatch)
    monkeypatch.setenv("FUSE_ATTN_CACHE", "0")
    tune(machine, k)
    assert len(machine.timed) == 2 * len(CANDIDATES)  # the stored entry was not read
    tune(machine, key(digest="other"))
    assert list(read_cache(k)["entries"]) == [k.entry_name()]  # nor was the new one written


def test_cache_off_creates_nothing(machine, monkeypatch):
    monkeypatch.setenv("FUSE_ATTN_CACHE", "0")
    tune(machine, key())
    assert not os.path.exists(settings.cache_dir())


def test_tuning_logs_progress_and_dropped_configs(machine, caplog):
    machine.failing[CANDIDATES[1]] = RuntimeError("out of resource: shared memory, Required: 262144\nfull details")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert tune(machine, key()) == CANDIDATES[2]
    before, dropped, after = [r.getMessage() for r in caplog.records]
    assert before.startswith("tuning fwd spec0 torch.bfloat16 D=64 DV=64 M_bucket=1024 N_bucket=1024 on Fake GPU 80GB")
    assert "3 candidate configs" in before
    assert str(CANDIDATES[1]) in dropped and "RuntimeError: out of resource: shared memory" in dropped
    assert "full details" not in dropped
    assert str(CANDIDATES[2]) in after and "0.2000 ms" in after and "2 of 3 candidates ran" in after
    assert "tuning took" in after


def test_one_progress_line_once_tuning_has_taken_a_while(machine, monkeypatch, caplog):
    """Past PROGRESS_AFTER_S of tuning in a process, one WARNING line, written while the tuning still runs; none
    before that, none again for later tunings."""
    import time

    monkeypatch.setattr(tuning, "_progress", tuning._TuningProgress())
    monkeypatch.setattr(tuning, "PROGRESS_AFTER_S", 0.2)
    time_config = machine.time_config
    timed_while_warned = []

    def slow_time_config(launch, cfg, rep_ms):
        time.sleep(0.05)
        timed_while_warned.append(any(r.levelname == "WARNING" for r in caplog.records))
        return time_config(launch, cfg, rep_ms)

    monkeypatch.setattr(tuning, "_time_config", slow_time_config)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        tune(machine, key(m=100))  # 6 timings, 0.3 s: the line appears during the last ones
        tune(machine, key(m=5000))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "tuning the attention kernels" in warnings[0], warnings
    assert tuning.cache_file(key()) in warnings[0]
    assert timed_while_warned[0] is False and True in timed_while_warned[:6]
    assert tuning.seconds_spent()["tuning"] >= 0.05 * len(timed_while_warned)  # the tunings' time is accounted


def test_a_tuning_within_a_tuning_is_counted_once(machine, monkeypatch):
    """Timing the implementations launches the template, whose first launch tunes its own configs: the inner tuning
    runs within the outer one. Both finish with their choice, and the time is counted once."""
    import time

    monkeypatch.setattr(tuning, "_progress", tuning._TuningProgress())
    inner_choices = []

    def launch(cfg):
        if cfg == CANDIDATES[0] and not inner_choices:
            inner_choices.append(tune(machine, key(digest="inner")))
        time.sleep(0.01)

    assert tuning.tune(key(digest="outer"), CANDIDATES, launch) == FASTEST
    assert inner_choices == [FASTEST]
    spent = tuning.seconds_spent()["tuning"]
    assert 0.01 <= spent < 1.0  # (the inner tuning's time within the outer's, not added twice)


def test_no_progress_line_for_a_short_tuning(machine, monkeypatch, caplog):
    monkeypatch.setattr(tuning, "_progress", tuning._TuningProgress())
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        tune(machine, key())
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_untimed_picks_the_first_working_config_and_never_stands_in_for_a_tuned_one(machine, monkeypatch):
    machine.failing[CANDIDATES[0]] = RuntimeError("does not compile")
    monkeypatch.setenv("FUSE_ATTN_AUTOTUNE", "0")
    assert tune(machine, key()) == CANDIDATES[1]
    assert machine.timed == []
    assert not os.path.exists(settings.cache_dir())
    monkeypatch.delenv("FUSE_ATTN_AUTOTUNE")
    assert tune(machine, key()) == FASTEST
    assert machine.timed == [CANDIDATES[1], CANDIDATES[2]]  # tuned after all (the first one still fails)


def test_untimed_context_picks_untimed_whatever_the_environment_says(machine):
    """tuning.untimed() (a kernel's cost without its tuning, as the implementation choice's first round times it): the
    first working config under the untimed key, nothing timed or stored; outside it, the tuning as before."""
    machine.failing[CANDIDATES[0]] = RuntimeError("does not compile")
    with tuning.untimed():
        with tuning.untimed():  # (nests)
            assert not key().timed
        assert tune(machine, key()) == CANDIDATES[1]
    assert machine.timed == []
    assert not os.path.exists(settings.cache_dir())
    assert key().timed
    assert tune(machine, key()) == FASTEST


def test_cache_dir_location(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("FUSE_ATTN_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert settings.cache_dir() == str(tmp_path / ".cache" / "fuse_attn")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert settings.cache_dir() == str(tmp_path / "xdg" / "fuse_attn")
    monkeypatch.setenv("FUSE_ATTN_CACHE_DIR", str(tmp_path / "mine"))
    assert settings.cache_dir() == str(tmp_path / "mine")


def test_every_candidate_is_compiled_before_any_is_timed_and_a_failed_compile_is_dropped_when_timed(machine,
                                                                                                      monkeypatch):
    from fuse_attn.kernels import compile_workers

    monkeypatch.setattr(compile_workers, "processes_to_fork", lambda: 0)  # (one pass of compiles: here, on threads)
    events = []

    def compile_only(cfg):
        events.append(("compile", cfg))
        if cfg == CANDIDATES[0]:
            raise RuntimeError("out of resources: shared memory")

    def launch(cfg):
        events.append(("launch", cfg))
        if cfg == CANDIDATES[0]:
            raise RuntimeError("out of resources: shared memory")

    assert tuning.tune(key(), CANDIDATES, launch, compile_only=compile_only) == FASTEST
    assert [e for e in events if e[0] == "compile"] == [("compile", c) for c in CANDIDATES]
    first_launch = next(i for i, e in enumerate(events) if e[0] == "launch")
    assert first_launch == len(CANDIDATES)  # all compiles came first
    assert machine.timed == CANDIDATES[1:]  # the config whose compile failed was tried again and dropped


def test_kernels_tuned_one_after_the_other_compile_in_one_batch(machine, monkeypatch):
    batches, bound = [], []

    def compile_all(candidates, compile_only, keys=()):
        batches.append(list(candidates))
        for cand in candidates:
            compile_only(cand)
        return "here"

    monkeypatch.setattr(tuning, "_compile_concurrently", compile_all)
    compiled = []

    def binder(name):
        def bind():
            bound.append(name)
            return lambda cfg: compiled.append((name, cfg))
        return bind

    first, second = key("dq"), key("dkdv")
    tuning.compile_together([(first, CANDIDATES, binder("dq")), (second, CANDIDATES[:2], binder("dkdv"))])
    assert [len(b) for b in batches] == [len(CANDIDATES) + 2] and bound == ["dq", "dkdv"]
    assert compiled == [("dq", c) for c in CANDIDATES] + [("dkdv", c) for c in CANDIDATES[:2]]
    assert tuning.tune(first, CANDIDATES, machine.launch) == FASTEST  # (then timed as ever)

    # one kernel still to time (the other chosen in this process, or stored by another): its own tuning compiles it
    new_process(monkeypatch)
    tuning.tune(first, CANDIDATES, machine.launch)
    batches.clear(), bound.clear()
    tuning.compile_together([(first, CANDIDATES, binder("dq")), (key("other"), CANDIDATES, binder("other"))])
    new_process(monkeypatch)
    tuning.compile_together([(first, CANDIDATES, binder("dq")), (key("another"), CANDIDATES, binder("another"))])
    assert batches == [] and bound == []
