"""kcache's own bookkeeping inside a cache root: `.kcache/` (locks, trash, last-used stamps)
and the temp directories of builds in flight."""

from __future__ import annotations

import os
import time
from pathlib import Path

STATE_DIR = ".kcache"
# A build compiles into <op dir>/.kcache-tmp-<hash>-<random>/ and renames it to <hash>/.
TEMP_PREFIX = ".kcache-tmp-"
STAMP_REFRESH = 3600.0  # a last-used stamp is rewritten at most once an hour


def state_dir(root: Path) -> Path:
    return Path(root) / STATE_DIR


def locks_dir(root: Path) -> Path:
    return state_dir(root) / "locks"


def trash_dir(root: Path) -> Path:
    return state_dir(root) / "trash"


def used_dir(root: Path) -> Path:
    return state_dir(root) / "used"


def _stamp_name(relpath: str) -> str:
    return relpath.replace("%", "%25").replace("/", "%2F")


def _relpath_of_stamp(name: str) -> str:
    return name.replace("%2F", "/").replace("%25", "%")


def lock_path(root: Path, relpath: str) -> Path:
    """The lock of one entry: outside the entry, so publishing and deleting never touch it."""
    return locks_dir(root) / (_stamp_name(relpath) + ".lock")


def temp_hash(name: str) -> str | None:
    """The hash a kcache temp directory is building, from its name, or None."""
    if not name.startswith(TEMP_PREFIX):
        return None
    return name[len(TEMP_PREFIX):].split("-", 1)[0] or None


def load_last_used(root: Path) -> dict[str, float]:
    """relpath -> last-used time, from the stamps kcache leaves when it resolves or builds an entry."""
    out: dict[str, float] = {}
    try:
        it = os.scandir(used_dir(root))
    except OSError:
        return out
    with it:
        for de in it:
            try:
                out[_relpath_of_stamp(de.name)] = de.stat(follow_symlinks=False).st_mtime
            except OSError:
                pass
    return out


def mark_used(root: Path, relpath: str, now: float | None = None) -> None:
    """Refresh an entry's last-used stamp, at most once an hour; never fails the caller."""
    now = time.time() if now is None else now
    stamp = used_dir(root) / _stamp_name(relpath)
    try:
        if now - stamp.stat().st_mtime < STAMP_REFRESH:
            return
    except OSError:
        pass
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.touch()
        os.utime(stamp, (now, now))
    except OSError:
        pass  # a read-only cache still works; last use falls back to mtime
