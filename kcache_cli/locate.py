"""Where the cache is: --cache-dir, KCACHE_DIR, then the default root of the layout `kcache build`
publishes into (its compiler's own rule: kcache_cli/layouts/homes.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kcache_cli.errors import UsageError


@dataclass(frozen=True)
class CacheLocation:
    path: Path
    reason: str


def resolve_cache_dir(cli_value: str | os.PathLike | None = None, package_dir: Path | None = None) -> CacheLocation:
    """The cache root. `--cache-dir ""` (an unset shell variable), `/` and the home directory itself
    are refused (UsageError): kcache deletes inside its root, and neither of those is a cache."""
    if cli_value is not None:
        if not os.fspath(cli_value):
            raise UsageError("--cache-dir is empty (an unset variable?): give the cache's path")
        return _checked(CacheLocation(Path(cli_value).expanduser().absolute(), "--cache-dir"))
    env = os.environ.get("KCACHE_DIR")
    if env:
        return _checked(CacheLocation(Path(env).expanduser().absolute(), "KCACHE_DIR environment variable"))
    return _checked(default_cache_dir(package_dir))


def _checked(loc: CacheLocation) -> CacheLocation:
    why = refused_root(loc.path)
    if why is not None:
        raise UsageError(f"refusing {loc.path} ({loc.reason}) as a cache root: {why}")
    return loc


def refused_root(path: str | os.PathLike) -> str | None:
    """Why `path` can never be a cache root (kcache deletes inside its root): the filesystem root or
    the home directory itself (through any symlink); None when it may be one. --cache-dir, KCACHE_DIR
    and every root `--all-caches` finds are held to it."""
    real = os.path.realpath(path)
    if real == os.path.realpath(os.sep):
        return "it is the filesystem root"
    if real == os.path.realpath(Path.home()):
        return "it is the home directory"
    return None


def default_cache_dir(package_dir: Path | None = None) -> CacheLocation:
    """The cache the build layout's compiler uses when nothing says otherwise (`package_dir`: where its
    Python package lies, for tests; None: found without importing it)."""
    from kcache_cli.layouts import homes
    from kcache_cli.layouts.shapes import BUILD_SHAPE

    home = homes.default_root(BUILD_SHAPE.name, package_dir)
    assert home is not None, "the build layout has a default root"
    return CacheLocation(home.path.absolute(), home.reason)


def known_caches() -> list[tuple[str, Path]]:
    """Every kernel cache kcache knows where to look for on this machine (`dir --all`): each layout's
    own default place."""
    from kcache_cli.layouts import all_layouts

    out = []
    for name, layout in all_layouts().items():
        where = layout.default_root()
        if where is not None:
            out.append((name, where[0]))
    return out
