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
    own default place, each directory once. A root that is another's (two variables naming one place)
    is listed with the first layout; a root that lies inside another known cache's entries (a
    TRITON_CACHE_DIR inside Inductor's triton/<device>/ or a vLLM unit) is shown only with that cache,
    whose entries hold it."""
    from kcache_cli.layouts import all_layouts

    found = []
    for name, layout in all_layouts().items():
        where = layout.default_root()
        if where is not None:
            found.append((name, where[0]))
    reals = [os.path.realpath(p) for _, p in found]
    out = []
    for i, (name, path) in enumerate(found):
        if reals[i] in reals[:i]:
            continue
        if any(j != i and reals[j] != reals[i] and inside_entries(reals[i], reals[j], found[j][0])
               for j in range(len(found))):
            continue
        out.append((name, path))
    return out


def inside_entries(path: str, root: str, owner: str) -> bool:
    """Whether `path` lies in what the `owner` layout's cache at `root` holds: a nested cache it declares
    (Layout.nested) or one of its entries (by the entry's exact shape, positive evidence)."""
    from kcache_cli.layouts import get

    if not path.startswith(root.rstrip("/") + "/") or not os.path.isdir(root):
        return False
    layout = get(owner)
    for _, nested in layout.nested(Path(root)):
        real = os.path.realpath(nested)
        if path == real or path.startswith(real + "/"):
            return True
    parts = os.path.relpath(path, root).split(os.sep)
    for k in range(1, len(parts) + 1):
        prefix = "/".join(parts[:k])
        found = layout.shape.locate(prefix)
        if found is None:
            continue
        try:
            names = frozenset(os.listdir(os.path.join(root, prefix)))
        except OSError:
            continue
        if layout.shape_problem(prefix, found[0], names, Path(root)) is None:
            return True
    return False
