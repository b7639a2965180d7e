"""Cross-process locks. kcache's own per-entry locks live in `.kcache/locks/` (filelock);
hidet's and tilus's `.lock` files inside entries are probed without creating anything."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from kcache_cli import state


def entry_lock(root: Path, relpath: str, timeout: float = -1):
    """A FileLock for one entry (blocking by default); its file sits outside the entry."""
    from filelock import FileLock

    path = state.lock_path(root, relpath)
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path), timeout=timeout)


class EntryFlock:
    """The lock `entry_lock` gives, taken with flock directly: the same file and the same kind of
    lock (a filelock holder and this exclude each other), without filelock's per-lock bookkeeping
    (about 0.2 ms), which matters to an import that publishes thousands of entries."""

    def __init__(self, root: Path, relpath: str) -> None:
        self.path = str(state.lock_path(root, relpath))
        self._fd: int | None = None

    def acquire(self, timeout: float = -1, poll: float = 0.05) -> bool:
        """Take the lock, waiting up to `timeout` seconds (forever if negative); False on timeout."""
        import fcntl
        import time

        deadline = None if timeout < 0 else time.monotonic() + timeout
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
            else:
                if os.fstat(fd).st_nlink:  # not unlinked by someone cleaning up between open and flock
                    self._fd = fd
                    return True
                os.close(fd)
                continue
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the descriptor drops the flock

    def __enter__(self) -> "EntryFlock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def probe_locked(path: str | os.PathLike) -> bool:
    """True when another process holds a flock on `path` (filelock's and hidet's kind of lock).

    Opens read-only and never creates the file; a missing file is not locked."""
    import fcntl

    try:
        # O_NONBLOCK: a `.lock` that is a FIFO must not hang `ls` (flock on it still answers)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def entry_build_locked(root: Path, relpath: str) -> bool:
    return probe_locked(state.lock_path(root, relpath))
