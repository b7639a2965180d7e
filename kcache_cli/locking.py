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


def probe_locked(path: str | os.PathLike) -> bool:
    """True when another process holds a flock on `path` (filelock's and hidet's kind of lock).

    Opens read-only and never creates the file; a missing file is not locked."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
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
