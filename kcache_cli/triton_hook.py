"""A Triton cache manager that tells kcache when a kernel is used (optional; issue 25, "Real last use").

Triton reads a kernel's group file on a hit and writes nothing, so on a mount without atime (`noatime`)
nothing tells the hottest kernel from the coldest, and `kcache prune --max-size` would evict by creation
time. With

    TRITON_CACHE_MANAGER=kcache_cli.triton_hook:KcacheCacheManager

(or `triton.knobs.cache.manager_class = KcacheCacheManager` in Triton 3.4+), every hit (`get_group` or
`get_file` that finds the file) leaves kcache's last-used stamp for the kernel's key directory in the
root's `.kcache/used/`, as `kcache build` does for its own entries (kcache_cli.fs.state.mark_used: through
held descriptors, at most once an hour per kernel). It behaves as Triton's own FileCacheManager otherwise,
and a stamp that cannot be written never fails Triton. Triton is imported when the class is first asked
for, never by kcache itself."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from kcache_cli.fs import state

_STAMPED: dict[tuple[str, str], float] = {}  # (root, key dir) -> when this process last stamped it


def record_hit(cache_dir: str, now: float | None = None) -> None:
    """Stamp the key directory `cache_dir` (<root>/<key>) as used now; never raises."""
    try:
        now = time.time() if now is None else now
        root, key = os.path.split(os.path.normpath(cache_dir))
        if not key or now - _STAMPED.get((root, key), float("-inf")) < state.STAMP_REFRESH:
            return
        _STAMPED[(root, key)] = now
        state.mark_used(Path(root), key, now)
    except Exception:  # noqa: BLE001 - a bookkeeping failure must never fail a compile
        pass


def _make_class() -> type:
    from triton.runtime.cache import FileCacheManager  # type: ignore[import-not-found, unused-ignore]

    class KcacheCacheManager(FileCacheManager):  # type: ignore[misc, valid-type, unused-ignore]
        """Triton's FileCacheManager, stamping kcache's last use on every hit of the regular cache (not of
        Triton's override or dump directories)."""

        def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
            self._kcache_records = not (override or dump)
            if self._kcache_records:
                super().__init__(key)  # as Triton's get_cache_manager calls it
            else:
                super().__init__(key, override=override, dump=dump)

        def get_file(self, filename: str) -> Any:
            found = super().get_file(filename)
            if found is not None and self._kcache_records:
                record_hit(self.cache_dir)
            return found

        def get_group(self, filename: str) -> Any:
            found = super().get_group(filename)
            if found is not None and self._kcache_records:
                record_hit(self.cache_dir)
            return found

    KcacheCacheManager.__module__ = __name__
    return KcacheCacheManager


_CLASS: list[type] = []


def __getattr__(name: str) -> Any:
    """`KcacheCacheManager`, made (and Triton imported) on first use: importing this module needs no Triton."""
    if name != "KcacheCacheManager":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not _CLASS:
        _CLASS.append(_make_class())
    return _CLASS[0]
