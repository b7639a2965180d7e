"""Where the cache is: --cache-dir, KCACHE_DIR, then the default root of the layout `kcache build`
publishes into (its compiler's own rule: kcache_cli/layouts/homes.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CacheLocation:
    path: Path
    reason: str


def resolve_cache_dir(cli_value: str | os.PathLike | None = None, package_dir: Path | None = None) -> CacheLocation:
    if cli_value:
        return CacheLocation(Path(cli_value).expanduser().absolute(), "--cache-dir")
    env = os.environ.get("KCACHE_DIR")
    if env:
        return CacheLocation(Path(env).expanduser().absolute(), "KCACHE_DIR environment variable")
    return default_cache_dir(package_dir)


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
