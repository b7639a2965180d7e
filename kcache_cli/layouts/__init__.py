"""Cache layouts, one module each, behind one interface (`layouts.base.Layout`).

The registry is `shapes.SHAPES` (each layout's name and path shapes, light enough for start-up);
the code of the layout named N is `kcache_cli/layouts/N.py`, whose `LAYOUT` is its `Layout` instance,
imported the first time it is needed. Nothing outside this package names a layout: it asks here.

Adding a layout (say `triton`):
1. `shapes.py`: a `LayoutShape("triton", (KindShape("kernel", "{hash}", target=None, patterns=(("hash",
   r"[A-Z2-7]{52}"),)),), "<key>/")` appended to `SHAPES` (names.py, completion, `--layout` and
   `--kind` choices, archive path checks and detection all follow from it).
2. `triton.py`: module-level functions `scan`, `judge`, `describe`, `log_files` (and `shape_problem`,
   `detect`, `no_log`... where the defaults do not fit), then `class TritonLayout(base.Layout)` with
   `shape = shapes.TRITON` whose methods override the hooks with `Layout`'s exact signatures, each a
   one-line call of the module's function (`def scan(self, ctx: ScanContext, flt: ScanFilter) ->
   Iterator[Entry]: return scan(ctx, flt)`) or its own body: `leftover` (tmp.pid_* dirs), `relocate`
   (rewrite the group files' absolute paths on import), `facts`...; then `LAYOUT = TritonLayout()`.
   mypy checks every override; tests/test_layouts.py checks each hook-named function is called by its
   class and each method overrides a hook. A layout never imports another layout's module: it asks
   this registry (`layouts.get("triton")`) at run time, and shares helpers through `_common.py`.
   `judge(d, kind, jc)` reads the entry only through `d` (an `entrydir.EntryDir`: by name, from the
   directory held open) and takes everything else from `jc` (a `base.Judging`: deep or cheap, the
   compiler version in use, the clock); its scan opens each entry it judges with `ctx.open_entry`.
3. Tests, and the layout tables of README.md and docs/layouts.md. Nothing else names a layout.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING

from kcache_cli.layouts.shapes import BUILD_SHAPE, BY_NAME, SHAPES, listing_roots_once, top_dirs

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
    """The names of the layouts `root` holds (the root's top-level names listed once for all of them). A
    layout's module is imported only when the names leave a question its own detect answers: a command
    on a hidet cache loads neither Triton's code nor Inductor's."""
    with listing_roots_once():
        try:
            names = top_dirs(root)
        except OSError:  # a root that can be searched but not listed: each layout looks for its own names
            return tuple(n for n in NAMES if get(n).detect(Path(root)))
        key = str(root)
        shapes = (BY_NAME[n] for n in NAMES)  # the registry as it is now (a layout added at run time too)
        return tuple(s.name for s in shapes
                     if s.held_by(key, names) and (not s.own_detect or get(s.name).detect(Path(root))))


def builder() -> Layout:
    """The layout `kcache build` publishes into."""
    return get(BUILD_SHAPE.name)


def __getattr__(attr: str):
    if attr == "LAYOUTS":  # name -> Layout, for callers that want the mapping
        return all_layouts()
    raise AttributeError(attr)
