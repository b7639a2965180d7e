"""Cross-process locks: all of kcache's locking is here. kcache's own per-entry locks live in
`.kcache/locks/`; the compilers' own lock files inside entries (hidet's and tilus's `.lock`) are
probed without creating anything.

Why raw flock next to filelock: filelock locks a path, and opens (and creates) it itself. Deleting and
importing must lock files reached from an open directory descriptor (`openat` with O_NOFOLLOW, so a
symlink swapped into the path is never followed) and must not create lock files in entries they
probe; filelock cannot do either, so those take `try_flock` on a descriptor they opened. filelock's
locks are flocks too, so both kinds exclude each other on the same file."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from kcache_cli import state


def entry_lock(root: Path, relpath: str, timeout: float = -1):
    """A FileLock for one entry (blocking by default); its file sits outside the entry."""
    from filelock import FileLock

    path = state.lock_path(root, relpath)
    _make_locks_dir(root)
    return FileLock(str(path), timeout=timeout)


def _make_locks_dir(root: Path) -> None:
    """.kcache/locks/, made beneath the root without following a link (fswrite), owners checked."""
    os.close(_locks_dir(root))


def _locks_dir(root: Path) -> int:
    from kcache_cli import fswrite

    try:
        rfd = fswrite.open_root(root)
    except FileNotFoundError:  # a lock taken before the cache exists makes it, as makedirs did
        try:
            fswrite.make_dirs(root)
        except FileExistsError:
            pass
        rfd = fswrite.open_root(root)
    try:
        return state.open_state(rfd, root, "locks", create=True)
    finally:
        os.close(rfd)


def _open_lock(root: Path, name: str) -> int:
    """The lock file `name` in .kcache/locks/, created if missing, through the locks directory's
    descriptor (a locks/ swapped for a link is refused, never written through); a regular file only
    (O_NONBLOCK: a FIFO planted there never blocks the open). Group-writable under umask 002, so
    every member of a shared cache can lock."""
    import stat

    lfd = _locks_dir(root)
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666, dir_fd=lfd)
    finally:
        os.close(lfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file (kcache never locks through one)", name)
    return fd


def try_flock(fd: int) -> bool:
    """Take an exclusive flock on `fd` without waiting: True when taken, False when another process
    holds it (the one try-lock of kcache)."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def wait_flock(fd: int) -> None:
    """Take an exclusive flock on `fd`, waiting as long as it takes."""
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)


class EntryFlock:
    """The lock `entry_lock` gives, taken with flock directly: the same file and the same kind of
    lock (a filelock holder and this exclude each other), without filelock's per-lock bookkeeping
    (about 0.2 ms), which matters to an import that publishes thousands of entries."""

    def __init__(self, root: Path, relpath: str) -> None:
        self.root = root
        self.path = str(state.lock_path(root, relpath))
        self.name = os.path.basename(self.path)
        self._fd: int | None = None

    def acquire(self, timeout: float = -1, poll: float = 0.05) -> bool:
        """Take the lock, waiting up to `timeout` seconds (forever if negative); False on timeout."""
        import time

        deadline = None if timeout < 0 else time.monotonic() + timeout
        while True:
            fd = _open_lock(self.root, self.name)
            try:
                taken = try_flock(fd)
            except OSError:
                os.close(fd)
                raise
            if taken:
                if os.fstat(fd).st_nlink:  # not unlinked by someone cleaning up between open and flock
                    self._fd = fd
                    return True
                os.close(fd)
                continue
            os.close(fd)
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

    Opens read-only and never creates the file; a missing file is not locked. (Taking and dropping the
    lock is the probe: closing the descriptor releases it.)"""
    try:
        # O_NONBLOCK: a `.lock` that is a FIFO must not hang `ls` (flock on it still answers)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return not try_flock(fd)
    except OSError:
        return False
    finally:
        os.close(fd)


def entry_build_locked(root: Path, relpath: str) -> bool:
    return probe_locked(state.lock_path(root, relpath))
