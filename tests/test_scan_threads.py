"""When a scan worker starts its reader threads: only once entries are seen to wait on the disk. Its clock
(scan_context.blocked_time) counts the time a thread neither runs nor waits for a CPU, so that a machine
shared by many (entries slow because others compute) never starts threads that would fight over the GIL."""

from __future__ import annotations

import os
import time

import pytest

from kcache_cli.catalog import scan_context


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
