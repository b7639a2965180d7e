"""kcache_cli.parallel: workers are forked only when no other thread runs; else a forkserver starts them."""

from __future__ import annotations

import os
import shutil
import threading

from kcache_cli import parallel
from kcache_cli.scan import scan_cache


def _part(shared: int, part: list[int]) -> tuple[int, list[int]]:
    return os.getppid(), [shared * x for x in part]


def _with_thread(run):
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)  # as a progress bar's refresh thread
    t.start()
    try:
        return run()
    finally:
        stop.set()
        t.join()


def test_forks_when_alone():
    assert parallel.fork_safe()
    out = parallel.map_parts(_part, 3, [[1, 2], [3], []])
    assert [r[1] for r in out] == [[3, 6], [9], []]
    assert {r[0] for r in out} == {os.getpid()}  # forked from this process


def test_forkserver_while_a_thread_runs():
    out = _with_thread(lambda: (parallel.fork_safe(), parallel.map_parts(_part, 2, [[1], [2, 3]])))
    assert out[0] is False
    assert [r[1] for r in out[1]] == [[2], [4, 6]]
    assert all(ppid != os.getpid() for ppid, _ in out[1])  # started by the forkserver, not forked from here


def test_parallel_scan_with_a_thread_running_matches_serial(fixture_copy, monkeypatch):
    import kcache_cli.scan_context as scan_mod

    root = fixture_copy("hidet")
    softmax = next((root / "ops/cuda_space_0/softmax").iterdir())
    for i in range(12):
        shutil.copytree(softmax, root / f"ops/cuda_space_1/softmax/{i:016x}")
    serial = scan_cache(root)
    monkeypatch.setattr(scan_mod, "PARALLEL_MIN_JOBS", 2)
    threaded = _with_thread(lambda: scan_cache(root))
    assert threaded.entries == serial.entries and len(serial.entries) > 12


def test_a_progress_bar_runs_no_thread_so_workers_fork(monkeypatch, capsys):
    """The export and import bars are drawn when advanced, not by Rich's refresh thread: the workers
    they show can be forked safely (and fast) while the bar is up."""
    import io
    import sys

    from kcache_cli.cli.common import GlobalOptions
    from kcache_cli.cli.progress import Bar

    tty = io.StringIO()
    tty.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stderr", tty)
    with Bar(GlobalOptions(), "exporting") as bar:
        assert bar.enabled and bar._progress is not None
        bar.start(3)
        bar.advance(2)
        assert threading.active_count() == 1 and parallel.fork_safe()
        out = parallel.map_parts(_part, 1, [[5]])
    assert out[0][0] == os.getpid()  # forked directly, no forkserver needed
    with Bar(GlobalOptions(quiet=True), "exporting") as quiet:
        assert not quiet.enabled
