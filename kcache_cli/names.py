"""What a cache holds, by directory names alone: op names, spaces and entry hashes (for shell completion).

Only directory listings are read (scandir's d_type; no stat of files, no file contents), and nothing
heavier than `os` and `re` is imported, so completing on a 100,000-entry cache stays fast. The shapes
mirror what the layout modules scan (layouts/hidet.py, tilus.py, tilelang.py); tests/test_completion.py
checks that both agree on the real fixture caches.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Iterable, Iterator

_HIDET_SPACE = re.compile(r"^[a-z0-9]+_space_\d+$")  # as layouts/hidet.py SPACE_RE
_TILELANG_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?([.+\-\w]*)$")  # as layouts/tilelang.py VERSION_RE
_HIDET_OTHER = (("graphs", "graph"), ("ir_modules", "ir_module"))
_TILELANG_BINARIES = "cuda-binaries"


@dataclass(frozen=True)
class EntryName:
    """An entry as its directory names tell it: no size, no status."""

    layout: str
    kind: str
    space: str | None
    op: str | None
    hash: str


def _dirs(path: str, prefix: str = "") -> list[str]:
    """Names of the visible subdirectories of `path` starting with `prefix` (symlinks not followed; the
    type comes from the directory listing); [] if unreadable."""
    try:
        with os.scandir(path) as it:
            return [d.name for d in it if d.name.startswith(prefix) and not d.name.startswith(".")
                    and d.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _present(names: list[str], wanted: tuple[str, ...]) -> list[str]:
    """`names`, or only the wanted ones among them (never a wanted name that is not there, so a typed
    `--op ../x` cannot make a listing leave the cache)."""
    return [n for n in names if n in wanted] if wanted else names


def layouts_of(root: str | os.PathLike) -> tuple[str, ...]:
    """The layouts a root holds, from the names at its top level (one directory listing)."""
    top = set(_dirs(os.fspath(root)))
    found = []
    if top & {"ops", "graphs", "ir_modules"}:
        found.append("hidet")
    if top & {"programs", "scripts"}:
        found.append("tilus")
    if any(_TILELANG_VERSION.match(n) for n in top):
        found.append("tilelang")
    return tuple(found)


def _hidet_spaces(root: str, spaces: Iterable[str]) -> list[str]:
    ops_dir = os.path.join(root, "ops")
    wanted = set(spaces)
    return sorted(s for s in _dirs(ops_dir) if _HIDET_SPACE.match(s) and (not wanted or s in wanted))


def _tilelang_spaces(root: str, spaces: Iterable[str]) -> list[tuple[str, str, str]]:
    """(space, kind, directory holding the hash dirs) for each tilelang space."""
    wanted = set(spaces)
    out = []
    for version in sorted(_dirs(root)):
        if not _TILELANG_VERSION.match(version):
            continue
        vdir = os.path.join(root, version)
        for sub in sorted(_dirs(vdir)):
            space = f"{version}/{sub}"
            if wanted and space not in wanted:
                continue
            if sub == _TILELANG_BINARIES:
                out.append((space, "binary", os.path.join(vdir, sub)))
            else:
                out.append((space, "kernel", os.path.join(vdir, sub, "kernels")))
    return out


def _select(root, layouts: Iterable[str]) -> tuple[str, tuple[str, ...]]:
    root = os.fspath(root)
    present = layouts_of(root)
    wanted = set(layouts)
    return root, tuple(name for name in present if not wanted or name in wanted)


def space_layouts(root: str | os.PathLike, ops: Iterable[str] = (), layouts: Iterable[str] = ()) -> dict[str, str]:
    """Each space present (hidet `cuda_space_0`, tilelang `0.1.15/linux-x86_64`) -> its layout, sorted;
    with `ops`, only the spaces holding one of those ops."""
    root, present = _select(root, layouts)
    ops = set(ops)
    out: dict[str, str] = {}
    if "hidet" in present:
        for s in _hidet_spaces(root, ()):
            if not ops or ops & set(_dirs(os.path.join(root, "ops", s))):
                out[s] = "hidet"
    if "tilelang" in present and not ops:  # tilelang kernels carry no op name
        for s, _, _ in _tilelang_spaces(root, ()):
            out.setdefault(s, "tilelang")
    return dict(sorted(out.items()))


def op_places(root: str | os.PathLike, spaces: Iterable[str] = (),
              layouts: Iterable[str] = ()) -> dict[str, tuple[str, ...]]:
    """Each op name present (hidet op directories, tilus script names) -> where it is (hidet spaces,
    "tilus"), sorted; with `spaces`, only the ops in those spaces."""
    root, present = _select(root, layouts)
    spaces = tuple(spaces)
    out: dict[str, list[str]] = {}
    if "hidet" in present:
        for s in _hidet_spaces(root, spaces):
            for op in _dirs(os.path.join(root, "ops", s)):
                out.setdefault(op, []).append(s)
    if "tilus" in present and not spaces:  # tilus entries have no space
        for op in _dirs(os.path.join(root, "scripts")):
            out.setdefault(op, []).append("tilus")
    return {op: tuple(where) for op, where in sorted(out.items())}


def entries(root: str | os.PathLike, prefix: str = "", ops: Iterable[str] = (), spaces: Iterable[str] = (),
            layouts: Iterable[str] = ()) -> Iterator[EntryName]:
    """Every entry whose hash starts with `prefix`, as names only, in directory order per parent."""
    root, present = _select(root, layouts)
    ops, spaces = tuple(ops), tuple(spaces)
    if "hidet" in present:
        for s in _hidet_spaces(root, spaces):
            space_dir = os.path.join(root, "ops", s)
            for op in _present(_dirs(space_dir), ops):
                for h in _dirs(os.path.join(space_dir, op), prefix):
                    yield EntryName("hidet", "op", s, op, h)
        if not ops and not spaces:  # graphs and ir_modules have no op or space
            for dirname, kind in _HIDET_OTHER:
                for h in _dirs(os.path.join(root, dirname), prefix):
                    yield EntryName("hidet", kind, None, None, h)
    if "tilus" in present and not spaces:
        scripts = os.path.join(root, "scripts")
        for op in _present(_dirs(scripts), ops):
            for h in _dirs(os.path.join(scripts, op), prefix):
                yield EntryName("tilus", "script", None, op, h)
        if not ops:  # a program's op name is inside program.txt: not read here
            for h in _dirs(os.path.join(root, "programs"), prefix):
                yield EntryName("tilus", "program", None, None, h)
    if "tilelang" in present and not ops:
        for space, kind, hdir in _tilelang_spaces(root, spaces):
            for h in _dirs(hdir, prefix):
                yield EntryName("tilelang", kind, space, None, h)


def targets_present(root: str | os.PathLike) -> tuple[str, ...]:
    """The targets of the entries present: hidet spaces' `<target>_`, and cuda for tilus and tilelang."""
    root = os.fspath(root)
    present = layouts_of(root)
    found = {s.rsplit("_space_", 1)[0] for s in _hidet_spaces(root, ())} if "hidet" in present else set()
    if "tilus" in present or "tilelang" in present:
        found.add("cuda")  # both compile for NVIDIA GPUs only
    return tuple(sorted(found))


def expand_filter(root: str | os.PathLike, flt):
    """`flt` with its op globs (`mat*`) and spaces given as a level (`2`) or a glob replaced by the names
    present, so that layouts read only those directories. A pattern matching nothing stays as it is
    (it then matches nothing)."""
    from dataclasses import replace

    from kcache_cli.model import is_glob, space_matches

    ops, spaces = flt.ops, flt.spaces
    if any(is_glob(o) for o in ops):
        present = op_places(root, layouts=flt.layouts)
        ops = _expanded(ops, is_glob, lambda o: [n for n in present if fnmatchcase(n, o)])
    if any(s.isdigit() or is_glob(s) for s in spaces):
        present_spaces = space_layouts(root, layouts=flt.layouts)
        spaces = _expanded(spaces, lambda s: s.isdigit() or is_glob(s),
                           lambda s: [n for n in present_spaces if space_matches(n, s)])
    if ops == flt.ops and spaces == flt.spaces:
        return flt
    return replace(flt, ops=ops, spaces=spaces)


def _expanded(values: tuple[str, ...], is_pattern, names_for) -> tuple[str, ...]:
    out: list[str] = []
    for v in values:
        found = names_for(v) if is_pattern(v) else [v]
        out.extend(n for n in (found or [v]) if n not in out)
    return tuple(out)


def unknown_values(root: str | os.PathLike, flt) -> list[str]:
    """One line for each --op, --space or --target value that names nothing present in `root`, with the
    closest names ("did you mean matmul?") and the names there are."""
    from kcache_cli.model import is_glob, space_matches

    out = []
    checks = (("op", flt.ops, lambda: list(op_places(root, layouts=flt.layouts)),
               lambda v, n: n == v or (is_glob(v) and fnmatchcase(n, v))),
              ("space", flt.spaces, lambda: list(space_layouts(root, layouts=flt.layouts)), space_matches),
              ("target", flt.targets, lambda: list(targets_present(root)), lambda v, n: n == v))
    for what, values, present_names, match in checks:
        if not values:
            continue
        present = present_names()
        for v in values:
            if any(match(n, v) if what == "space" else match(v, n) for n in present):
                continue
            out.append(_did_you_mean(what, v, present, os.fspath(root)))
    return out


def _did_you_mean(what: str, value: str, present: list[str], root: str) -> str:
    import difflib

    close = difflib.get_close_matches(value, present, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    shown = ", ".join(present[:12]) + (f" and {len(present) - 12} more" if len(present) > 12 else "")
    there = f" ({what}s present: {shown})" if present else f" (no {what}s present)"
    return f"no {what} '{value}' in {root}{hint}{there}"
