"""Scan a cache root into entries, across every layout found in it."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

from kcache_cli import layouts
from kcache_cli.catalog import names
from kcache_cli.catalog.names import expand_filter
from kcache_cli.catalog.scan_context import ScanContext
from kcache_cli.fs import read as fsread
from kcache_cli.fs import dirnames, readmarks, state
from kcache_cli.fs.locking import leftover_live
from kcache_cli.layouts import get as get_layout
from kcache_cli.model.records import (
    UNREADABLE,
    Entry,
    ScanFilter,
    ScanResult,
    TreeUsage,
    Warn,
    file_bytes,
    is_glob,
    measure_tree,
)
from kcache_cli.model.terms import BUILDING, PARTIAL
from kcache_cli.util.errors import UsageError
from kcache_cli.util.lazy import lazy_module
from kcache_cli.util.progress import NO_PROGRESS, Progress

if TYPE_CHECKING:  # the real import, for mypy; at run time it loads with the first scan that uses the index
    from kcache_cli.catalog import index
else:  # (a lookup by hash prefix, `inspect` and `log`, never does)
    index = lazy_module("kcache_cli.catalog.index")


def detect_layouts(root: Path) -> tuple[str, ...]:
    """The layouts `root` holds: as the command's check of its root found them (fsread.hand_on), else
    detected now."""
    handed = fsread.take(root, "layouts")
    return handed if handed is not None else layouts.detect(root)


def scan_cache(root: Path, flt: ScanFilter = ScanFilter(), warn: Warn | None = None,
               leftovers: bool = False, use_index: bool = False, statuses: bool = True,
               progress: Progress = NO_PROGRESS) -> ScanResult:
    """Every entry under `root` that `flt` keeps. Damaged entries come back with a status;
    unreadable directories come back as warnings. A missing root is an empty result. With
    `leftovers`, kcache's own leftovers of killed imports and exports too (layout `kcache`).
    `progress` is started with the entries found so far (again as more are found) and advanced by
    each one judged.

    With `use_index`, entries whose files are provably unchanged since the last scan come from
    `<root>/.kcache/index/` (kcache_cli/catalog/index.py) instead of being judged again; the answer is the same.
    Entries named by hash prefix or path are judged from the few directories their names show either way:
    loading a 10^5-entry index costs more than reading them."""
    root = Path(root)
    warnings: list[str] = []

    def collect(msg: str) -> None:
        warnings.append(msg)
        if warn is not None:
            warn(msg)

    if not fsread.is_dir(root):
        return ScanResult(str(root), False, (), (), ())
    if fsread.root_moved(root):
        return _moved(root, collect, warnings)
    fsread.anchor(root)

    complete = flt == ScanFilter()
    flt = expand_filter(root, flt)
    layouts = detect_layouts(root)
    unlisted = not layouts and _unlisted(root, collect)
    for odd, removed in state.odd_index_files(str(root)):  # read by the hidet layout with or without use_index
        collect(f"{odd} is not a regular file: removed (kcache keeps its index there)" if removed else
                f"{odd} is not a regular file: ignored (remove it: kcache keeps its index there)")
    readmarks.load(root)
    use_index = use_index and not flt.name_prefixes()
    if use_index:
        ctx: ScanContext = index.IndexedContext(root, collect, state.load_last_used(root), complete=complete)
    else:
        ctx = ScanContext(root, collect, state.load_last_used(root), statuses=statuses)
    ctx.progress = progress
    entries: list[Entry] = []
    everything = flt.takes_all()
    for name in layouts:
        if flt.layouts and name not in flt.layouts:
            continue
        found = _counted(ctx, get_layout(name).scan(ctx, flt))
        entries.extend(found if everything else (e for e in found if flt.matches(e)))
    if use_index:
        ctx.save()  # type: ignore[attr-defined]
    readmarks.save(root)
    dirnames.save(root)  # the listings of its directories this scan made, for the next command
    if leftovers and not flt.layouts:
        entries.extend(e for e in leftover_entries(root, collect) if flt.matches(e))
    if fsread.root_moved(root):  # what was listed by path may be another directory's
        return _moved(root, collect, warnings)
    entries = [e for e in entries if e.status != UNREADABLE or os.path.lexists(e.path)]  # gone: no entry
    return ScanResult(str(root), True, layouts, tuple(exact_names_win(entries, flt)), tuple(warnings), unlisted)


def _unlisted(root: Path, warn: Warn) -> bool:
    """Whether the root itself cannot be listed (its owner's chmod 000): said once, as the entries it may
    hold are not known, where an empty cache would have none."""
    try:
        with os.scandir(root):
            return False
    except OSError as exc:
        warn(f"cannot read {root}: {exc.strerror}: the entries it may hold are not known")
        return True


def exact_names_win(entries: list[Entry], flt: ScanFilter) -> list[Entry]:
    """A reference that is an entry's whole hash names that entry alone, not also the entries whose hash
    it begins (as git's exact names win over prefixes): `clear as` removes the Inductor code shard `as`,
    never the autograd entry `asckqa4y...` beside it. A reference no hash equals stays a prefix."""
    if not flt.hash_prefixes:
        return entries
    whole = {e.hash for e in entries} & set(flt.hash_prefixes)
    if not whole:
        return entries

    def named(e: Entry) -> bool:
        if e.relpath in flt.paths or e.hash in whole:
            return True
        return any(e.hash.startswith(p) for p in flt.hash_prefixes if p not in whole)

    return [e for e in entries if named(e)]


def _moved(root: Path, warn: Warn, warnings: list[str]) -> ScanResult:
    """The scan of a held root whose path names another directory now (swapped for a link since kcache
    vetted it): nothing, and a warning."""
    warn(f"skipping {root}: it was replaced (by a link?) since kcache checked it; nothing there was used")
    return ScanResult(str(root), True, (), (), tuple(warnings))


def _counted(ctx: ScanContext, found: Iterable[Entry]) -> Iterator[Entry]:
    """A layout's entries, each counted found and judged unless the layout's map_entries counted them."""
    ctx.mapped = False
    for e in found:
        if not ctx.mapped:
            ctx.note_found(1)
            ctx.progress.advance(1)
        yield e


class NoSuchEntry(UsageError):
    """No entry of the root matches the reference (resolve_entry): over several caches, look in the next."""


class Ambiguous(UsageError):
    """Several entries of the root match the reference (resolve_entry), `entries`: over several caches,
    the other caches' matches belong in the same answer."""

    def __init__(self, message: str, entries: list[Entry]):
        super().__init__(message)
        self.entries = entries


_HASH_CHARS = re.compile(r"^\.?[0-9a-zA-Z_\-]+$")  # a leading ".": numba's `.<dir name>_<sha1>/`


def split_refs(root: Path, refs) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Entry references as typed -> (hash prefixes, paths relative to the root). A reference is a hash
    prefix, the entry's path relative to the root (`ops/cuda_space_0/add/8d1f7691cdf75e90`), or its
    absolute path (as `build` and `ls --json` print it; a path under the current directory works too)."""
    prefixes: list[str] = []
    paths: list[str] = []
    for ref in refs:
        ref = ref.strip()
        if not ref:
            raise UsageError("empty entry reference (give a hash prefix or the entry's path)")
        if "/" not in ref and ref not in (".", ".."):
            if not _HASH_CHARS.match(ref):
                raise UsageError(f"bad hash prefix '{ref}'{_cut_short(ref)}")
            prefixes.append(ref)
            continue
        rel = _relative_to_root(Path(root), ref)
        if rel not in paths:
            paths.append(rel)
    return tuple(prefixes), tuple(paths)


def _cut_short(ref: str) -> str:
    """The next step for a prefix pasted from a table with the `…` that ends a value the table cut short."""
    head = ref.rstrip("\u2026")
    return f" (a table ends what it cut short in \u2026: give {head} without the \u2026)" if (
        head != ref and _HASH_CHARS.match(head)) else ""


def _inside(root: str, path: str) -> str | None:
    if path == root:
        return ""
    base = os.path.join(root, "")
    return path[len(base):] if path.startswith(base) else None


def _relative_to_root(root: Path, ref: str) -> str:
    if os.path.isabs(ref) or os.path.exists(ref) and not os.path.exists(os.path.join(root, ref)):
        absolute = os.path.abspath(ref)
        rel = _inside(os.path.abspath(root), absolute)
        if rel is None:  # through symlinks (/tmp vs /private/tmp, a linked home directory)
            rel = _inside(os.path.realpath(root), os.path.realpath(absolute))
        if not rel:
            raise UsageError(f"{ref} is not an entry of the cache {root} (pass --cache-dir for another cache)")
    else:
        rel = ref
    parts = [p for p in rel.replace(os.sep, "/").split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise UsageError(f"bad entry path '{ref}' (give a path inside the cache, without '..')")
    return "/".join(parts)


def _differing(found: list[Entry]) -> str:
    """The selector that tells `found` apart, as the user would type it."""
    for attr, option in (("space", "--space"), ("layout", "--layout"), ("kind", "--kind"), ("op", "--op")):
        values = sorted({getattr(e, attr) for e in found if getattr(e, attr)})
        if len(values) > 1:
            return f"pick one with {' or '.join(f'{option} {v}' for v in values[:4])}, or give its path"
    return "give more digits or the entry's path"


def leftover_entries(root: Path, warn: Warn) -> list[Entry]:
    """kcache's own leftovers in the root: staging dirs of imports (`.kcache/import-*`) and temp files of
    exports written into the root's top directory (`.<archive>.*.kcache-tmp`). Partial when their
    writer is gone (prune removes them), building while it runs."""
    out: list[Entry] = []
    try:
        root_fd = fsread.open_root(root)
    except OSError:
        return out
    try:
        places = [("", root_fd)]
        try:
            places.append((state.STATE_DIR, os.open(state.STATE_DIR, fsread.DIR_FLAGS, dir_fd=root_fd)))
        except OSError:
            pass
        for where, fd in places:
            pattern, first = (state.IMPORT_STAGING, "import-") if where else (state.EXPORT_TEMP, ".")
            for name in sorted(_names_starting(root, where, fd, first)):
                live = leftover_live(fd, name) if pattern.match(name) else None
                if live is None:
                    continue
                rel = f"{where}/{name}" if where else name
                path = os.path.join(str(root), rel)
                kind = "import" if where else "export"
                if where:
                    usage = measure_tree(path, warn)
                else:  # a file: its own size
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    usage = TreeUsage(file_bytes(st), 1, st.st_mtime, 0.0, st.st_size, st.st_dev, st.st_ino)
                reason = (f"{'staging of an import' if where else 'temp file of an export'} "
                          + ("in progress" if live else "that was interrupted (prune removes it)"))
                out.append(Entry("kcache", kind, None, None, None, name, path, rel, usage.size, usage.files,
                                 BUILDING if live else PARTIAL, reason, usage.mtime, usage.mtime, usage.apparent,
                                 dev=usage.dev, ino=usage.ino))
    finally:
        for _, fd in places:
            os.close(fd)
    return out


def _names_starting(root: Path, where: str, fd: int, first: str) -> list[str]:
    """The names in the directory `fd` (`where` below the root) that start with `first`: the pattern's fixed
    start (a Triton root lists 10^5 keys, none of them a leftover). The root's come from the listing the
    scan just kept (fs/dirnames.py, checked by an fstat), not from listing them all again."""
    if not where:
        try:
            return dirnames.of(root).starting(str(root), first)
        except OSError:
            pass  # listed through the fd the caller holds instead
    return [n for n in os.listdir(fd) if n.startswith(first)]


def resolve_entry(root: Path, ref: str, warn: Warn | None = None, flt: ScanFilter = ScanFilter(),
                  statuses: bool = True, selectors: bool = True) -> Entry:
    """The one entry that `ref` (a hash prefix, a path relative to the root, or an absolute path) names
    among those `flt` selects (--space, --op... to tell apart the same hash in two spaces). Without
    `statuses` (for a caller that shows none) its status may miss what the whole cache decides."""
    prefixes, paths = split_refs(root, [ref.rstrip("/") or ref])
    flt = replace(flt, hash_prefixes=prefixes, paths=paths)
    result = scan_cache(root, narrowed_by_names(root, flt), warn, statuses=statuses)
    found = list(result.entries)  # a ref that is a whole hash names that entry alone (exact_names_win)
    real = [e for e in found if not os.path.basename(e.relpath).startswith(".")]
    if len(real) == 1 and len(found) > 1:  # an entry and the temp dir of its rebuild: the entry
        found = real
    if not found:
        where = "" if result.exists else f" ({root} does not exist)"
        raise NoSuchEntry(f"no entry matches '{ref}' in {root}{where}")
    if len(found) > 1:
        names = ", ".join(f"{e.relpath} ({e.layout} {e.kind})" for e in found[:8])
        more = f" and {len(found) - 8} more" if len(found) > 8 else ""
        how = _differing(found) if selectors else "give the entry's path"  # no --space, --op... to offer
        raise Ambiguous(f"'{ref}' is ambiguous: {len(found)} entries match: {names}{more}; {how}", found)
    return found[0]


def narrowed_by_names(root: Path, flt: ScanFilter) -> ScanFilter:
    """`flt` (naming entries by hash prefix or path) limited to the layouts, spaces and ops where
    directory names alone (kcache_cli/catalog/names.py) show entries it could name: only those are listed and
    judged, not every layout's entries nor hidet's graphs. Spaces and ops narrow nothing else (the hidet
    version in use is still the whole cache's). Where names show none (a temp directory's name) `flt` is
    kept as it is."""
    if not fsread.is_dir(root):
        return flt
    present = fsread.take(root, "layouts")  # as the command's check of its root detected them
    if present is not None:
        fsread.hand_on(root, "layouts", present)  # and again for the scan that follows
    hits = [h for p in flt.name_prefixes() for h in names.entries(root, p, layouts=flt.layouts, present=present)]
    if not hits:
        return flt
    layouts = tuple(sorted({h.layout for h in hits}))
    spaces = flt.spaces
    if not spaces and all(h.space for h in hits):
        spaces = tuple(sorted({h.space for h in hits if h.space}))
    ops = flt.ops
    if not ops and all(h.op and not is_glob(h.op) for h in hits):  # an op named [x] is no pattern here
        ops = tuple(sorted({h.op for h in hits if h.op}))
    return replace(flt, layouts=layouts, spaces=spaces, ops=ops)
