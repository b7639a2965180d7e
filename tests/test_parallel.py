"""kcache_cli.util.parallel: workers are forked only when no other thread runs; else a forkserver starts them.

Whether a process runs other threads is the point here, and a test runner's worker may run some of its own
(or keep one another test left): the tests that need a process with only its main thread run their body
in a fresh interpreter (`alone`)."""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import threading

from kcache_cli.catalog.scan import scan_cache
from kcache_cli.util import parallel


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


def alone(test, *args: str) -> None:
    """Run the body of `test` (`body_<what>(*args)` for `test_<what>`) in a fresh interpreter whose temp dir
    is short: the forkserver's socket lies there, and AF_UNIX paths end at 108 bytes, which pytest's temp
    paths (longer under xdist) pass (map_parts then raises, and its callers do the work themselves)."""
    code = (f"import sys; sys.path[:0] = {sys.path!r}\nimport test_parallel\n"
            f"test_parallel.body_{test.__name__[5:]}(*{list(args)!r})\n")
    short = tempfile.mkdtemp(prefix="kc-", dir="/tmp")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              cwd=os.path.dirname(inspect.getfile(test)), env={**os.environ, "TMPDIR": short})
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]


def body_forks_when_alone():
    assert parallel.fork_safe()
    out = parallel.map_parts(_part, 3, [[1, 2], [3], []])
    assert [r[1] for r in out] == [[3, 6], [9], []]
    assert {r[0] for r in out} == {os.getpid()}  # forked from this process


def test_forks_when_alone():
    alone(test_forks_when_alone)


def test_forkserver_while_a_thread_runs():
    alone(test_forkserver_while_a_thread_runs)


def body_forkserver_while_a_thread_runs():
    out = _with_thread(lambda: (parallel.fork_safe(), parallel.map_parts(_part, 2, [[1], [2, 3]])))
    assert out[0] is False
    assert [r[1] for r in out[1]] == [[2], [4, 6]]
    assert all(ppid != os.getpid() for ppid, _ in out[1])  # started by the forkserver, not forked from here


def test_parallel_scan_with_a_thread_running_matches_serial(fixture_copy):
    root = fixture_copy("hidet")
    softmax = next((root / "ops/cuda_space_0/softmax").iterdir())
    for i in range(12):
        shutil.copytree(softmax, root / f"ops/cuda_space_1/softmax/{i:016x}")
    alone(test_parallel_scan_with_a_thread_running_matches_serial, str(root))


def body_parallel_scan_with_a_thread_running_matches_serial(root: str):
    import kcache_cli.catalog.scan_context as scan_mod

    serial = scan_cache(root)
    scan_mod.PARALLEL_MIN_JOBS = 2
    threaded = _with_thread(lambda: scan_cache(root))
    assert threaded.entries == serial.entries and len(serial.entries) > 12


def test_a_progress_bar_runs_no_thread_so_workers_fork():
    """The export and import bars are drawn when advanced, not by Rich's refresh thread: the workers
    they show can be forked safely (and fast) while the bar is up."""
    alone(test_a_progress_bar_runs_no_thread_so_workers_fork)


def body_a_progress_bar_runs_no_thread_so_workers_fork():
    import io

    from kcache_cli.cli.common import GlobalOptions
    from kcache_cli.cli.progress import Bar

    tty = io.StringIO()
    tty.isatty = lambda: True  # type: ignore[method-assign]
    sys.stderr = tty
    with Bar(GlobalOptions(), "exporting") as bar:
        assert bar.enabled and bar._progress is not None
        bar.start(3)
        bar.advance(2)
        assert threading.active_count() == 1 and parallel.fork_safe()
        out = parallel.map_parts(_part, 1, [[5]])
    assert out[0][0] == os.getpid()  # forked directly, no forkserver needed
    with Bar(GlobalOptions(quiet=True), "exporting") as quiet:
        assert not quiet.enabled


def _dies(shared: int, part: list[int]) -> list[int]:
    import signal

    if part == [shared]:
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer ends a worker
    return part


def body_a_killed_worker_is_a_runtime_error():
    """Its callers (the scan) catch RuntimeError and do the work themselves."""
    try:
        parallel.map_parts(_dies, 2, [[1], [2], [3]])
    except RuntimeError as exc:
        assert "died" in str(exc)
    else:
        raise AssertionError("a worker killed went unnoticed")
    assert parallel.map_parts(_dies, 9, [[1], [2]]) == [[1], [2]]
    assert threading.active_count() == 1  # no thread left behind by the workers


def test_a_killed_worker_is_a_runtime_error():
    alone(test_a_killed_worker_is_a_runtime_error)


def body_workers_count_progress():
    counted = []

    class Progress:
        def advance(self, n):
            counted.append(n)

    assert parallel.map_parts(_counting, None, [[1, 2, 3], [4, 5]], progress=Progress()) == [3, 2]
    assert sum(counted) == 5


def _counting(shared, part):
    for _ in part:
        parallel.advance(1)
    return len(part)


def test_workers_count_progress():
    alone(test_workers_count_progress)


def test_a_forkservers_workers_take_kcaches_noted_reads_as_no_use(fixture_copy):
    """Workers a forkserver starts (a thread runs) inherit nothing from the scan: like its anchors, they must
    take the cache's notes of kcache's earlier reads themselves (readmarks.MARKS), or an atime kcache's own
    read left is the entry's last use there, and not in a serial scan."""
    alone(test_a_forkservers_workers_take_kcaches_noted_reads_as_no_use, str(fixture_copy("hidet")))


def body_a_forkservers_workers_take_kcaches_noted_reads_as_no_use(root: str):
    import json
    from pathlib import Path

    import kcache_cli.catalog.scan_context as scan_mod

    old, read = 1_700_000_000 * 10**9, 1_800_000_000 * 10**9
    notes = {}
    for p in sorted(Path(root, "ops").rglob("*"), reverse=True):  # a directory after what it holds
        if p.is_file() and not p.is_symlink():
            os.utime(p, ns=(read, old))  # read last by kcache (a member's read, noted), written long ago
            notes[str(p.stat().st_ino)] = [read, old]
        elif p.is_dir():
            os.utime(p, ns=(old, old))
    Path(root, ".kcache").mkdir(mode=0o755, exist_ok=True)
    Path(root, ".kcache", f"reads.{os.geteuid()}").write_text(json.dumps(notes))
    serial = scan_cache(root)
    assert serial.entries and all(e.last_used < 1_750_000_000 for e in serial.entries)
    scan_mod.PARALLEL_MIN_JOBS = 2
    assert _with_thread(lambda: scan_cache(root)).entries == serial.entries


def _big(shared: int, part: list[int]) -> bytes:
    return bytes([part[0]]) * shared


def body_a_result_bigger_than_a_pipe_travels_whole():
    """Results of megabytes (a 100,000-entry scan's) cross the pipes whole, each worker's its own, while the
    parent reads them all as they come (no worker waits on another's)."""
    out = parallel.map_parts(_big, 5 << 20, [[1], [2], [3]])
    assert [len(r) for r in out] == [5 << 20] * 3
    assert [r[:1] + r[-1:] for r in out] == [b"\1\1", b"\2\2", b"\3\3"]


def test_a_result_bigger_than_a_pipe_travels_whole():
    alone(test_a_result_bigger_than_a_pipe_travels_whole)


def _half_sent(shared: int, part: list[int]) -> list[int]:
    import signal

    if part == [shared]:  # its message's length and the start of it, then killed (as by the OOM killer)
        os.write(shared_fd(), (1 << 20).to_bytes(8, "little") + b"\x80\x05")
        os.kill(os.getpid(), signal.SIGKILL)
    return part


def shared_fd() -> int:
    """The write end of the pipe to the parent in this worker (parallel._worker_main's `reply`)."""
    import inspect as stack

    for frame in stack.stack():
        if frame.function == "_worker_main":
            return frame.frame.f_locals["reply"]
    raise AssertionError("not in a worker")


def body_a_worker_killed_mid_message_died():
    try:
        parallel.map_parts(_half_sent, 2, [[1], [2]])
    except parallel.WorkerDied as exc:
        assert "worker 1 died" in str(exc)
    else:
        raise AssertionError("half a message taken for a result")


def test_a_worker_killed_mid_message_died():
    alone(test_a_worker_killed_mid_message_died)


def test_output_buffered_before_the_fork_is_written_once():
    """What this process printed to a pipe and had not flushed when its workers forked is written once:
    a worker's copy of the buffer must not be flushed too."""
    code = ("import sys; sys.path[:0] = " + repr(sys.path) + "\nimport test_parallel\n"
            "from kcache_cli.util import parallel\nprint('before', end='')\n"
            "assert parallel.map_parts(test_parallel._part, 1, [[1], [2]])[1][1] == [2]\nprint('|after')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(__file__))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "before|after\n"


def _slow_part(shared: str, part: list[int]) -> list[int]:
    """Waits until the parent's `meanwhile` has run (it makes the file `shared`): the workers run while it does."""
    import time

    deadline = time.monotonic() + 30
    while not os.path.exists(shared) and time.monotonic() < deadline:
        time.sleep(0.01)
    return [os.path.exists(shared), *part]


def body_meanwhile_runs_here_while_the_workers_run(flag: str):
    seen = []

    def meanwhile() -> None:
        seen.append(os.getpid())
        open(flag, "w").close()

    out = parallel.map_parts(_slow_part, flag, [[1], [2, 3]], meanwhile=meanwhile)
    assert out == [[True, 1], [True, 2, 3]] and seen == [os.getpid()]  # once, here, before the results
    os.unlink(flag)
    seen.clear()
    out = _with_thread(lambda: parallel.map_parts(_slow_part, flag, [[4], [5]], meanwhile=meanwhile))
    assert out == [[True, 4], [True, 5]] and seen == [os.getpid()]  # a forkserver's workers too

    def fails() -> None:
        raise ValueError("meanwhile failed")

    try:
        parallel.map_parts(_part, 1, [[1], [2]], meanwhile=fails)
    except ValueError as exc:
        assert "meanwhile failed" in str(exc)
    else:
        raise AssertionError("a failed meanwhile was swallowed")


def test_meanwhile_runs_here_while_the_workers_run(tmp_path):
    """map_parts' `meanwhile` runs in the calling process once its workers are started and before their
    results are waited for (each worker here waits for what it makes); what it raises is raised."""
    alone(test_meanwhile_runs_here_while_the_workers_run, str(tmp_path / "flag"))


def _claiming(shared: float, share: parallel.ClaimShare) -> tuple[int, list[int]]:
    """Takes blocks until none is left; share 1 is slow (`shared` seconds a block), the others 1 ms."""
    import time

    taken = []
    for start in iter(share.take, None):
        taken.append(start)
        time.sleep(shared if share.i == 1 else 0.001)
    return os.getpid(), taken


def body_claimed_blocks_go_to_whoever_is_free():
    """map_parts with Claims: the first share runs in this process (`here`), every block is taken once,
    and a process that is slow (another load on its core) takes fewer blocks instead of holding the
    others up."""
    claims = parallel.Claims(300, 1)
    try:
        out = parallel.map_parts(_claiming, 0.02, [claims.share(i, 3) for i in range(3)], here=_claiming)
    finally:
        claims.close()
    assert sorted(s for _, taken in out for s in taken) == list(range(300))
    assert out[0][0] == os.getpid() and os.getpid() not in {pid for pid, _ in out[1:]}
    assert len(out[1][1]) < min(len(out[0][1]), len(out[2][1]))


def test_claimed_blocks_go_to_whoever_is_free():
    alone(test_claimed_blocks_go_to_whoever_is_free)


def _fails_here(shared: None, part: int) -> None:
    raise OSError(5, "Input/output error")


def body_a_failure_in_the_parents_part_stops_the_workers():
    """The parent's own part (`here`) raising: its error is what map_parts raises, at once (the workers,
    asleep, are not waited for) and none is left behind."""
    import time

    started = time.monotonic()
    try:
        parallel.map_parts(_sleeps, None, [0, 30, 30], here=_fails_here)
    except OSError as exc:
        assert exc.errno == 5
    else:
        raise AssertionError("the parent's failure went unnoticed")
    assert time.monotonic() - started < 4  # not the 5 s a finished part waits for the workers
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        pass  # no child left
    else:
        raise AssertionError("a worker was left behind")


def _sleeps(shared: None, part: int) -> int:
    import time

    time.sleep(part)
    return part


def test_a_failure_in_the_parents_part_stops_the_workers():
    alone(test_a_failure_in_the_parents_part_stops_the_workers)
