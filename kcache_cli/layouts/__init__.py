"""Cache layouts, one module each, behind one interface (`layouts.base.Layout`).

The registry is `shapes.SHAPES` (each layout's name and path shapes, light enough for start-up);
the code of the layout named N is `kcache_cli/layouts/N.py`, whose `LAYOUT` is its `Layout` instance,
imported the first time it is needed. Nothing outside this package names a layout: it asks here.

A new layout is one new module plus its shape in `shapes.SHAPES`.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING

from kcache_cli.layouts.shapes import BUILD_SHAPE, SHAPES

if TYPE_CHECKING:
    from kcache_cli.layouts.base import Layout

NAMES: tuple[str, ...] = tuple(s.name for s in SHAPES)
_LOADED: dict[str, Layout] = {}


def get(name: str) -> Layout:
    """The layout called `name` (KeyError when there is none)."""
    layout = _LOADED.get(name)
    if layout is None:
        if name not in NAMES:
            raise KeyError(name)
        layout = _LOADED[name] = import_module(f"{__name__}.{name}").LAYOUT
    return layout


def all_layouts() -> dict[str, Layout]:
    """Every registered layout by name, in registry order."""
    return {n: get(n) for n in NAMES}


def detect(root: str | Path) -> tuple[str, ...]:
    """The names of the layouts `root` holds."""
    return tuple(n for n in NAMES if get(n).detect(Path(root)))


def builder() -> Layout:
    """The layout `kcache build` publishes into."""
    return get(BUILD_SHAPE.name)


def __getattr__(attr: str):
    if attr == "LAYOUTS":  # name -> Layout, for callers that want the mapping
        return all_layouts()
    raise AttributeError(attr)
