"""Work spread over worker processes: the one way kcache runs in parallel (scan, export, import).

Workers are forked when this process runs no other thread: forking is fast and the workers inherit the
work in memory, so only part numbers and results travel. Forking a process that runs threads (a
progress bar's refresh thread, a pool's manager) can deadlock the child (Python 3.12 warns of it): then
the work goes to a forkserver, which starts clean workers, and everything a part needs travels pickled.
Forked workers (_Workers) need no thread here: this one waits on their pipes and moves the progress."""

from __future__ import annotations

import mmap
import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from kcache_cli.util.errors import KcacheError
from kcache_cli.util.lazy import lazy_module
from kcache_cli.util.progress import NO_PROGRESS

if TYPE_CHECKING:  # the real imports, for mypy; at run time each loads at its first use (30 ms that
    import concurrent.futures as cf  # `inspect` and a small `ls` never need)
    import ctypes
    import multiprocessing
else:
    cf = lazy_module("concurrent.futures")
    ctypes = lazy_module("ctypes")
    multiprocessing = lazy_module("multiprocessing")

MAX_WORKERS = 8


def cpus() -> int:
    """The CPUs this process may run on (at most MAX_WORKERS)."""
    try:
        return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))
    except (AttributeError, OSError):
        return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


def split(items: list, n: int) -> list[list]:
    """`items` in `n` contiguous chunks of nearly equal length (one per worker)."""
    k, r = divmod(len(items), n)
    out, i = [], 0
    for c in range(n):
        j = i + k + (1 if c < r else 0)
        out.append(items[i:j])
        i = j
    return out


_CLAIM = struct.Struct("<I")


class Claims:
    """The items 0..n-1 in blocks of `block` (more where there would be over MAX_BLOCKS of them) that the
    processes of map_parts, and their threads, claim one at a time as each is free, so that none waits idle
    while another has work left (a process given a fixed share finished up to 7% of a listing before the
    other; the parent's own part, map_parts' `here`, comes after its `meanwhile` work). The blocks' starts
    wait in a pipe every forked worker inherits, written whole before the first fork and closed: a read of
    one start takes it whole (Linux reads a pipe under its lock), so no block is taken twice and none is
    lost, and a read of an empty pipe ends. Pickled (a forkserver's workers inherit no pipe), share i of
    `of` (share(i, of)) takes the blocks dealt to it instead, each `of`-th from the i-th."""

    MAX_BLOCKS = 1024  # 4 KiB of starts: what any pipe holds unread, so that writing them never waits

    def __init__(self, n: int, block: int) -> None:
        self.n, self.block = n, max(block, -(-n // self.MAX_BLOCKS))
        r, w = os.pipe()
        try:
            _write_all(w, b"".join(_CLAIM.pack(s) for s in range(0, n, self.block)))
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
        self.fd = r

    def share(self, i: int, of: int) -> ClaimShare:
        return ClaimShare(self, i, of)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ClaimShare:
    """One process's way into Claims: `take()` the start of the next block it claims, None when none is
    left (thread-safe)."""

    def __init__(self, claims: Claims, i: int, of: int) -> None:
        self.claims: Claims | None = claims  # None once pickled (__getstate__): `fixed` says which blocks
        self.i, self.of, self.n, self.block = i, of, claims.n, claims.block
        self.fixed: list[int] | None = None

    def __getstate__(self) -> dict:
        return {"claims": None, "i": self.i, "of": self.of, "n": self.n, "block": self.block,
                "fixed": list(range(self.i * self.block, self.n, self.of * self.block))[::-1]}

    def take(self) -> int | None:
        if self.fixed is not None:
            return self.fixed.pop() if self.fixed else None  # list.pop is atomic under the GIL
        assert self.claims is not None
        got = os.read(self.claims.fd, _CLAIM.size)
        return _CLAIM.unpack(got)[0] if len(got) == _CLAIM.size else None


def fork_safe() -> bool:
    """Whether forking now is safe: this process runs no thread but the main one."""
    return threading.active_count() == 1 and hasattr(os, "fork")


_ADVANCE: Callable[[int], None] | None = None  # in a forked worker of map_parts: its progress counter's


def advance(n: int) -> None:
    """In a worker of map_parts: `n` more units of work done (the parent moves its progress by them).
    Anywhere else: nothing. Plain shared memory, no lock: each worker writes its own slot only."""
    if _ADVANCE is not None:
        _ADVANCE(n)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


_HELD = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP wait while workers fork. A handler that raises (export's) would
    otherwise run inside the interpreter's at-fork hooks, which swallow what it raises: the interrupt
    would be lost. A worker lets them through again first thing (`die_with_parent`)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def die_with_parent(parent: int | None) -> None:
    """In a worker: be killed (SIGKILL) when the process that started it dies, so that a `kill -9` of
    kcache leaves no worker extracting under init and holding its lock. The kernel's death signal
    covers a death from now on; the parent check covers one before the prctl took effect. The parent's
    handlers (export's, which raise) are not the worker's: they go before the held signals are let
    through, so a worker told to stop just stops, without a traceback."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)  # held by the parent while it forked
    prctl = _prctl()
    if prctl:  # else not Linux: the parent check below is all there is
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


_PRCTL: Any = None


def _prctl() -> Any:
    """libc's prctl (False where there is none), looked up once: _Workers looks it up before it forks, so
    that each worker does not spend a millisecond on ctypes and dlopen first."""
    global _PRCTL
    if _PRCTL is None:
        try:
            _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _PRCTL = False
    return _PRCTL


def _pickled_part(args: tuple[Callable[[Any, Any], Any], Any, Any]) -> Any:
    func, shared, part = args
    return func(shared, part)


class WorkerDied(KcacheError, RuntimeError):
    """A worker process ended without a result (killed): map_parts' callers do the work themselves."""


def map_parts(func: Callable[[Any, Any], Any], shared: Any, parts: Sequence[Any], progress: Any = None,
              meanwhile: Callable[[], None] | None = None, here: Callable[[Any, Any], Any] | None = None
              ) -> list[Any]:
    """`[func(shared, part) for part in parts]`, one worker process per part, results in order. `func`
    must be a module-level function (it may have to be pickled, as `shared` and `parts` may). Raises
    what a worker raised; OSError, RuntimeError or ImportError when no worker can be started or one
    died (callers then do the work themselves). `progress.advance` gets what forked workers count with
    `advance()`, moved from this thread every PROGRESS_POLL seconds (a forkserver's workers count
    nothing). Forked workers are _Workers' (as run_phased's: no pool, no thread, no queue; the pool's
    module alone took 12 ms to import). `meanwhile()` runs here once the workers are started, before
    their results are waited for: work of the caller's own that needs none of them (this process would
    otherwise wait idle; the workers' results wait in their pipes). `here(shared, part)`: where workers are
    forked, the first part runs in this process through it, after `meanwhile` (one fork fewer, and its result
    never crosses a pipe: `here` may return it in the shape it is used in, where `func`'s is packed for the
    trip; a 20,000-kernel Triton listing unpickled and unpacked 40 ms less after its workers ended)."""
    if fork_safe():
        skip = 0 if here is None else 1

        def first(i: int, counted: Callable[[int], None], abort: Callable[[], bool]) -> Any:
            global _ADVANCE
            _ADVANCE = counted
            return func(shared, parts[skip + i])

        workers = _Workers(len(parts) - skip, first, None, progress)
        ended = False
        try:
            if meanwhile is not None:
                meanwhile()
            mine = [] if here is None else [workers.run_here(here, shared, parts[0])]
            out = mine + workers.collect()
            ended = True
            return out
        finally:
            workers.close(5 if ended or here is None else 0)
    # a forkserver's workers are its children: they die with it, and it with this process
    with cf.ProcessPoolExecutor(len(parts), mp_context=multiprocessing.get_context("forkserver"),
                             initializer=die_with_parent, initargs=(None,)) as pool:
        results = pool.map(_pickled_part, [(func, shared, p) for p in parts])
        if meanwhile is not None:
            meanwhile()
        return list(results)


PROGRESS_POLL = 0.1  # seconds between looks at the workers' counters


# ---- two phases in the same workers (export and import) --------------------------------------------

class Aborted(KcacheError):
    """A worker stopped because another one failed."""


_PHASED: tuple | None = None


def run_phased(n: int, first: Callable[..., Any], progress: Any = None,
               between: Callable[[list], None] | None = None, second: Callable[[int], Any] | None = None
               ) -> tuple[list, list]:
    """Run `first(i, advance, abort)` for i in range(n) in forked workers, then `between(results)` here,
    then `second(i)` in the same workers, which keep what phase one left them (so the functions may be
    closures: the workers inherit them). Workers count progress in shared memory and this process
    moves `progress` (start/advance); the first failure stops the others (they see abort()) and is
    raised here; nothing runs phase two unless every worker finished phase one.

    With n == 1, or when forking is not safe (another thread runs), it all runs in this process."""
    if n == 1 or not fork_safe():
        r1 = [first(i, (progress or NO_PROGRESS).advance, _never) for i in range(n)]
        if between is not None:
            between(r1)
        return r1, ([second(i) for i in range(n)] if second is not None else [])
    workers = _Workers(n, first, second, progress)
    try:
        try:
            r1 = workers.collect()
            if between is not None:
                between(r1)
        except BaseException:
            workers.tell("stop", abort=True)
            raise
        if second is None:
            workers.tell("stop")
            return r1, []
        workers.tell("go")
        return r1, workers.collect()
    finally:
        workers.close()


class _Workers:
    """n forked processes (os.fork: multiprocessing's Process, Pipe and shared ctypes took 8 ms of each
    scan to import), a pipe each way to each, and shared progress counters and a stop flag in an anonymous
    shared mapping (slot i: worker i's counter; slot n: the flag)."""

    def __init__(self, n: int, first: Callable, second: Callable | None, progress: Any) -> None:
        global _PHASED
        self.n, self.progress, self.seen, self.mine = n, progress, 0, 0
        self.shared = mmap.mmap(-1, 8 * (n + 1))  # MAP_SHARED | MAP_ANONYMOUS: the workers write in it
        self.slots = memoryview(self.shared).cast("q")
        _PHASED = (first, second, self.slots)
        self.pids: list[int] = []
        self.fds: list[tuple[int, int]] = []  # (its results, its commands): this process's ends
        _flush_std()  # nothing buffered here is written twice by a worker
        _prctl()
        try:
            for i in range(n):
                self._start(i)
        except BaseException:
            self.close()
            raise

    def _start(self, i: int) -> None:
        results, reply = os.pipe()
        commands, told = os.pipe()
        parent = os.getpid()
        try:
            with signals_held():
                pid = os.fork()
                if pid == 0:  # never returns; the held signals are let through by die_with_parent
                    # Every end of this process's it inherited is closed: were one kept, a worker whose
                    # parent died (SIGTERM, SIGKILL) would block forever sending its result.
                    _worker_main(i, reply, commands, [results, told, *(fd for fds in self.fds for fd in fds)],
                                 parent)
        except BaseException:
            for fd in (results, reply, commands, told):
                os.close(fd)
            raise
        os.close(reply)
        os.close(commands)
        self.pids.append(pid)
        self.fds.append((results, told))

    def collect(self) -> list:
        """Every worker's result of the current phase; the first failure is raised (others stop)."""
        results: list = [None] * self.n
        frames = {fd: _Frame() for fd, _ in self.fds}
        waiting = {fd: i for i, (fd, _) in enumerate(self.fds)}
        poll = select.poll()
        for fd in waiting:
            poll.register(fd, select.POLLIN)
        error: Any = None
        while waiting:
            for fd, _ in poll.poll(PROGRESS_POLL * 1000):
                if not frames[fd].read(fd):
                    continue
                i = waiting.pop(fd)
                poll.unregister(fd)
                status, value = frames[fd].message(i)
                if status == "err":
                    self.slots[self.n] = 1
                    if error is None or (isinstance(error, Aborted) and not isinstance(value, Aborted)):
                        error = value
                results[i] = value
            self._moved()
        if error is not None:
            raise error
        return results

    def _moved(self) -> None:
        """The progress moved by what the workers (and this process's part, run_here) counted since."""
        now = sum(self.slots[:self.n]) + self.mine
        if self.progress and now > self.seen:
            self.progress.advance(now - self.seen)
        self.seen = now

    def run_here(self, func: Callable[[Any, Any], Any], *args: Any) -> Any:
        """`func(*args)` in this process while the workers run; what it counts with `advance()` moves the
        progress with theirs (looked at every PROGRESS_POLL seconds, as collect does), from whichever of
        its threads counts (a scan's readers on a slow disk), one at a time."""
        global _ADVANCE
        last = time.monotonic()
        lock = threading.Lock()

        def counted(k: int) -> None:
            nonlocal last
            with lock:
                self.mine += k
                if time.monotonic() - last >= PROGRESS_POLL:
                    last = time.monotonic()
                    self._moved()

        _ADVANCE = counted
        try:
            return func(*args)
        finally:
            _ADVANCE = None
            self._moved()

    def tell(self, message: str, abort: bool = False) -> None:
        if abort:
            self.slots[self.n] = 1
        for _, told in self.fds:
            try:
                os.write(told, _COMMANDS[message])
            except OSError:
                pass  # the worker is gone already

    def close(self, wait: float = 5) -> None:
        """Wait for the workers to end (`wait` seconds in all, then SIGTERM) and let go of their pipes."""
        global _PHASED
        _PHASED = None
        deadline = time.monotonic() + wait
        for pid, (results, told) in zip(self.pids, self.fds):
            if not _ended(results, deadline):
                os.kill(pid, signal.SIGTERM)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:  # reaped already (SIGCHLD ignored by whoever embeds kcache)
                pass
            os.close(results)
            os.close(told)
        self.pids, self.fds = [], []
        self.slots.release()
        self.shared.close()


_COMMANDS = {"go": b"g", "stop": b"s"}
_LENGTH = struct.Struct("<Q")


class _Frame:
    """One message from a worker's pipe, read as it comes: its length (8 bytes), then its pickle."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def read(self, fd: int) -> bool:
        """Read what the pipe holds now; whether the message is whole or the pipe ended before it was."""
        chunk = os.read(fd, 1 << 20)
        self.buf += chunk
        return not chunk or self._whole()

    def _whole(self) -> bool:
        return len(self.buf) >= 8 and len(self.buf) >= 8 + _LENGTH.unpack_from(self.buf)[0]

    def message(self, i: int) -> tuple[str, Any]:
        if not self._whole():
            return "err", WorkerDied(f"worker {i} died")
        return pickle.loads(memoryview(self.buf)[8:8 + _LENGTH.unpack_from(self.buf)[0]])


def _ended(fd: int, deadline: float) -> bool:
    """Whether the worker writing into `fd` ended by `deadline` (time.monotonic): no other process holds
    its end of the pipe, so the pipe ends when it does (anything still unread in it is dropped)."""
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not poll.poll(left * 1000):
            return False
        if not os.read(fd, 1 << 16):
            return True


def _flush_std() -> None:
    """sys.stdout and sys.stderr flushed, whatever they are now (None, closed, a closed pipe)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


def _worker_main(i: int, reply: int, commands: int, parent_ends: list[int], parent: int) -> None:
    """A forked worker: phase one, its result sent, then phase two when told to go. Ends the process."""
    code = 1
    try:
        assert _PHASED is not None, "set by _Workers before forking"
        die_with_parent(parent)
        for fd in parent_ends:
            os.close(fd)
        first, second, slots = _PHASED
        n_slots = len(slots) - 1

        def advance(k: int) -> None:
            slots[i] += k

        def abort() -> bool:
            return bool(slots[n_slots])

        if _report(reply, first, i, advance, abort) and second is not None:
            if os.read(commands, 1) == _COMMANDS["go"]:
                _report(reply, second, i)
        code = 0
    finally:
        _flush_std()
        os._exit(code)


def _report(reply: int, func: Callable, *args: Any) -> bool:
    """Run `func(*args)` and send what came of it; whether it succeeded and could be sent."""
    try:
        status, value = "ok", func(*args)
    except BaseException as exc:  # noqa: BLE001 - every failure travels back to the parent
        status, value = "err", _portable(exc)
    try:
        data = pickle.dumps((status, value), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - a result that cannot travel is a failure that can
        status = "err"
        data = pickle.dumps((status, KcacheError(f"{type(exc).__name__}: {exc}")))
    try:
        _write_all(reply, _LENGTH.pack(len(data)) + data)
    except OSError:  # the parent is gone (killed): nobody to tell, nothing to print
        return False
    return status == "ok"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _portable(exc: BaseException) -> BaseException:
    """`exc`, or a KcacheError saying what it was when it cannot travel between processes."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return KcacheError(f"{type(exc).__name__}: {exc}")


def _never() -> bool:
    return False
