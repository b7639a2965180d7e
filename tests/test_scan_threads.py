"""When a scan worker starts its reader threads: only once entries are seen to wait on the disk. Its clock
(scan_context.blocked_time) counts the time a thread neither runs nor waits for a CPU, so that a machine
shared by many (entries slow because others compute) never starts threads that would fight over the GIL."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from kcache_cli.catalog import scan_context
from kcache_cli.catalog.scan import scan_cache
from kcache_cli.model.records import entry_with
from kcache_cli.util import parallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from gen_cache import generate  # noqa: E402


def test_blocked_time_counts_a_wait():
    before = scan_context.blocked_time()
    time.sleep(0.1)
    assert scan_context.blocked_time() - before >= 0.08


@pytest.mark.skipif(not os.path.exists(scan_context._SCHEDSTAT), reason="no per-thread schedstat in /proc")
def test_blocked_time_does_not_count_computing_or_waiting_for_a_cpu():
    before = scan_context.blocked_time()
    start = time.thread_time()
    while time.thread_time() - start < 0.2:  # computing, preempted as often as the machine's load makes it
        pass
    assert scan_context.blocked_time() - before < 0.05


def test_without_schedstat_the_cpu_time_is_left_out(monkeypatch):
    monkeypatch.setattr(scan_context, "_SCHEDSTAT", "/nonexistent/schedstat")
    before = scan_context.blocked_time()
    time.sleep(0.05)
    assert scan_context.blocked_time() - before >= 0.04


def test_a_worker_s_threads_answer_as_its_one_thread_does(tmp_path, monkeypatch):
    """The threads a scan's worker starts once its entries wait on the disk (forced here: every block counts
    as slow) judge the entries as one thread does, with no error. Their first reads of a lazily loaded
    module once raced (util/lazy.py), and only a cache read from the disk took this path."""
    root = tmp_path / "cache"
    generate(str(root), 700, equal_mtimes=True)
    monkeypatch.setattr(scan_context, "PARALLEL_MIN_JOBS", 1)
    monkeypatch.setattr(parallel, "cpus", lambda: 2)
    plain = scan_cache(root)
    started = tmp_path / "threads"

    class Counted(threading.Thread):
        def start(self) -> None:
            with open(started, "a") as f:  # from the forked worker: the parent reads the file
                f.write("+")
            super().start()

    monkeypatch.setattr(scan_context, "SLOW", -1.0)
    monkeypatch.setattr(threading, "Thread", Counted)
    threaded = scan_cache(root)
    assert started.read_text().count("+") >= scan_context.THREADS_PER_WORKER - 1  # a worker's threads ran
    assert not threaded.warnings and len(plain.entries) == 700
    assert [entry_with(e, last_used=0.0) for e in threaded.entries] == [
        entry_with(e, last_used=0.0) for e in plain.entries]
