"""What a cache holds, by directory names alone: op names, spaces and entry hashes (for shell completion).

Only directory listings are read (scandir's d_type; no stat of files, no file contents), and nothing
heavier than `os` and `re` is imported, so completing on a 100,000-entry cache stays fast. The shapes
mirror what the layout modules scan (layouts/hidet.py, tilus.py, tilelang.py, triton.py); tests/test_completion.py
checks that both agree on the real fixture caches.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

_HIDET_SPACE = re.compile(r"^[a-z0-9]+_space_\d+$")  # as layouts/hidet.py SPACE_RE
_TILELANG_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?([.+\-\w]*)$")  # as layouts/tilelang.py VERSION_RE
_HIDET_OTHER = (("graphs", "graph"), ("ir_modules", "ir_module"))
_TRITON_KEY = re.compile(r"^(?:[A-Z2-7]{52}|[0-9a-f]{64})$")  # as layouts/triton.py KEY_RE
_TRITON_STAGES = (".ttir", ".ttgir", ".llir", ".ptx", ".amdgcn", ".cubin", ".hsaco", ".source")
_TRITON_LOOKS = 64  # as layouts/triton.py DETECT_LOOKS
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
    if _is_triton(os.fspath(root), top):
        found.append("triton")
    return tuple(found)


def _names(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _triton_name(names: list[str]) -> str | None:
    """A Triton kernel's name from its directory listing (as layouts/triton.py kernel_name)."""
    for n in sorted(names):
        if n.startswith("__grp__") and n.endswith(".json"):
            return n[len("__grp__"):-len(".json")]
    for n in sorted(names):
        if n.endswith(_TRITON_STAGES):
            return n.rsplit(".", 1)[0]
    if len(names) == 1 and names[0].endswith((".so", ".autotune.json")):
        return names[0].split(".", 1)[0]
    return None


def _is_triton(root: str, top: set[str]) -> bool:
    """Key directories holding Triton's files (as layouts/triton.py detect): a group file, a temp dir
    or a compile stage in one of the first few."""
    keys = [n for n in top if _TRITON_KEY.match(n)][:_TRITON_LOOKS]
    return any(n.startswith(("__grp__", "tmp.pid_")) or n.endswith(_TRITON_STAGES)
               for k in keys for n in _names(os.path.join(root, k)))


def _triton_kernels(root: str, prefix: str = "") -> Iterator[tuple[str, str | None, str]]:
    """(key, kernel name, kind) of every Triton key directory whose key starts with `prefix`."""
    for k in sorted(_dirs(root, prefix)):
        if _TRITON_KEY.match(k):
            listing = _names(os.path.join(root, k))
            module = len(listing) == 1 and listing[0].endswith(".so")  # the driver's launcher module
            yield k, _triton_name(listing), "binary" if module else "kernel"


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
    if "triton" in present and not spaces:  # a Triton kernel's arch is inside its metadata: not read here
        for _, kernel, _ in _triton_kernels(root):
            if kernel and "triton" not in out.get(kernel, ()):
                out.setdefault(kernel, []).append("triton")
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
    if "triton" in present and not spaces:
        for h, kernel, kind in _triton_kernels(root, prefix):
            if not ops or kernel in ops:
                yield EntryName("triton", kind, None, kernel, h)
