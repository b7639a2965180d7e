"""What a cache holds, by directory names alone: op names, spaces and entry hashes (for shell completion).

Only directory listings are read (scandir's d_type; no stat of files, no file contents; a lookup by
hash prefix lstats the few directory names that match it instead), and nothing heavier than `os` and
`re` is imported, so completing on a 100,000-entry cache stays fast. The exceptions are what entries keep in
their files (a Triton kernel's arch, in its metadata; its name, in its file names): an arch is read from at most
READS entries, and the names offered come from the scan index (catalog/index.py, loaded only then) and the
listings of at most READS entries it does not hold. The shapes
are the layouts' own declarations (kcache_cli/layouts/shapes.py); tests/test_completion.py checks that
this agrees with the layouts' scans on the real fixture caches.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import replace
from fnmatch import fnmatchcase
from stat import S_ISDIR
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, NamedTuple

from kcache_cli.fs import dirnames
from kcache_cli.fs.dirnames import DirNames
from kcache_cli.fs import read as fsread
from kcache_cli.layouts.shapes import SHAPES, KindShape, LayoutShape, top_dirs
from kcache_cli.model.records import is_glob, space_matches
from kcache_cli.util.lazy import lazy_module
from kcache_cli.util.suggest import closest, did_you_mean
from kcache_cli.util.units import is_digits, plural

if TYPE_CHECKING:  # the real import, for mypy; at run time it loads where an index is asked (a Triton TAB)
    from kcache_cli.catalog import index
else:
    index = lazy_module("kcache_cli.catalog.index")


# Entry directories whose op or space lie in their files (Triton's) that a question which does not scan (a
# TAB, a hint) reads at most: some 40 ms of small reads, every kernel of most Triton caches.
READS = 1000


class EntryName(NamedTuple):
    """An entry as its directory names tell it: no size, no status."""

    layout: str
    kind: str
    space: str | None
    op: str | None
    hash: str


def visible_dirs(path: str | int, prefix: str = "", kept: DirNames | None = None) -> list[str]:
    """Names of the visible subdirectories of `path` (or of the directory fd) starting with `prefix`, and
    hidden ones too where `prefix` starts with "." (numba's `.<dir name>_<sha1>/`, as a shell offers
    dotfiles once a dot is typed; the kinds' patterns still decide what is an entry) (symlinks not
    followed; the type comes from the directory listing, or with a prefix from an lstat of the few names
    that match: a bare name listing is a quarter cheaper than scandir's, and `kept` answers for a
    directory unchanged since it was last listed: fs/dirnames.py); [] if unreadable."""
    try:
        if prefix and not prefix.startswith("."):
            if isinstance(path, int):
                found = [n for n in os.listdir(path) if n.startswith(prefix)]
            elif kept is not None:
                found = kept.starting(path, prefix)
            else:
                found = [n for n in fsread.listdir(path) if n.startswith(prefix)]
            return [n for n in found if _is_dir(path, n)]
        listed = os.scandir(path) if isinstance(path, int) else fsread.scandir_list(path)
        hidden = prefix.startswith(".")
        return [d.name for d in listed if d.name.startswith(prefix) and (hidden or not d.name.startswith("."))
                and d.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _is_dir(path: str | int, name: str) -> bool:
    try:
        if isinstance(path, int):
            return S_ISDIR(os.lstat(name, dir_fd=path).st_mode)
        return fsread.is_real_dir(os.path.join(path, name))
    except OSError:
        return False


def _present(names: list[str], wanted: tuple[str, ...]) -> list[str]:
    """`names`, or only the wanted ones among them (never a wanted name that is not there, so a typed
    `--op ../x` cannot make a listing leave the cache)."""
    return [n for n in names if n in wanted] if wanted else names


def _dirs(root: str, k: KindShape, depth: int, ops: tuple[str, ...] = (), spaces: tuple[str, ...] = (),
          prefix: str = "", kept: DirNames | None = None) -> list[tuple[str, dict[str, str]]]:
    """(path, fields) of every directory `depth` segments down `k`'s template that matches it, within the
    wanted ops and spaces (the last segment of an entry's path: names starting with `prefix`)."""
    level: list[tuple[str, dict[str, str]]] = [(root, {})]
    for i in range(depth):
        fields = k.fields_in(i)
        last = i == k.depth - 1
        found: list[tuple[str, dict[str, str]]] = []
        for path, known in level:
            if not fields:  # fixed text: no listing needed (a missing directory lists as empty below)
                found.append((os.path.join(path, k.parts[i]), known))
                continue
            names = visible_dirs(path, prefix, kept) if last else _level_dirs(path, k, fields, prefix)
            if "op" in fields:
                names = _present(names, ops)
            for n in (names if last else sorted(names)):
                got = k.match_segment(i, n)
                if got is None:
                    continue
                f = {**known, **got}
                if i == k.space_depth and spaces and k.space_of(f) not in spaces:
                    continue
                found.append((os.path.join(path, n), f))
        level = found
    return level


def _level_dirs(path: str, k: KindShape, fields: tuple[str, ...], prefix: str) -> list[str]:
    """The subdirectories of `path` an entry whose hash starts with `prefix` may lie in: the one its hash
    names where the level's field is a function of the hash (KindShape.derived) and `prefix` tells it, else
    every visible one."""
    derive = k.derived.get(fields[0]) if prefix and len(fields) == 1 else None
    only = derive(prefix) if derive is not None else None
    if only is None:
        return visible_dirs(path)
    return [only] if only and _is_dir(path, only) else []


def _walk(root: str, k: KindShape, depth: int, ops: tuple[str, ...] = (), spaces: tuple[str, ...] = (),
          prefix: str = "", kept: DirNames | None = None) -> Iterator[dict[str, str]]:
    """The fields of the directories _dirs finds. A kind that tells its entries by their files
    (`from_files`) has each entry directory listed."""
    for path, f in _dirs(root, k, depth, ops, spaces, prefix, kept):
        if k.from_files is not None and depth == k.depth:
            ours, op = k.from_files(fsread.names(path))
            if not ours or (ops and op not in ops):
                continue
            f = {**f, "op": op} if op else f
        yield f


def _in_files(root: str, s: LayoutShape, ops: tuple[str, ...] = (), spaces: bool = True) -> set[tuple]:
    """(space, op) of the entries of `s`'s kinds that keep them in their files (Triton's kernel name in its
    file names, its arch in its metadata), read from the first READS entry directories listed: every entry
    of a cache up to that size, a sample of a bigger one (Triton's keys are hashes: the listing's order is no
    order of theirs). No listing holds them, and the scan index costs as much as its size to load (a TAB
    on 10^5 kernels would take several start-ups). Without `spaces`, no file is read, only listings."""
    kinds = [k for k in s.kinds if k.from_files is not None]
    found: set[tuple] = set()
    for path in _first_entries(root, kinds, READS):
        listed = fsread.names(path)
        named = _named(kinds, listed)
        if named is not None:
            k, op = named
            read = spaces and k.space_in_files is not None
            found.add((k.space_in_files(root, path, listed) if read else None, op))  # type: ignore[misc]
    return {(space, op) for space, op in found if not ops or op in ops}


def _named(kinds: list[KindShape], listed: list[str]) -> tuple[KindShape, str | None] | None:
    """(the kind, its op) of the entry directory whose listing is `listed`, among `kinds` (those that tell
    their entries by their files); None when it is none of theirs."""
    for k in kinds:
        ours, op = k.from_files(listed)  # type: ignore[misc]  # kinds with from_files only
        if ours:
            return k, op
    return None


def _ops_in_files(root: str, s: LayoutShape, whole: bool = False) -> set[str] | None:
    """The op names of `s`'s entries that keep them in their files (Triton's kernel names), to offer
    (completion, hints): as the scan index recorded them for the entry directories present (no entry read;
    a Triton key is a hash of its kernel's source, name included), and from the listings of the others, at
    most READS of them: all, unless more than READS entries came since the last scan (then a sample). Where
    READS entries are all there are (no index is kept of so few), or there is no index, _in_files' READS.
    With `whole`: None unless the index recorded the op of every entry directory present (a hint that says
    a name is not there)."""
    kinds = [k for k in s.kinds if k.from_files is not None]
    parents = _entry_parents(root, kinds)
    kept = index.recorded(root, "op") if sum(len(names) for _, names, _, _ in parents) > READS else {}
    if not kept:
        return None if whole else {op for _, op in _in_files(root, s, spaces=False) if op}
    ops: set[str] = set()
    others: list[str] = []
    for base, names, links, pattern in parents:
        for name in names:
            op = kept.get(base + name)
            if op is not None:
                if type(op) is str and op:
                    ops.add(op)
            elif len(others) < READS and pattern(name) and not name.startswith(".") and name not in links:
                others.append(os.path.join(root, base + name))
    if whole and others:
        return None
    for path in others:
        named = _named(kinds, fsread.names(path))
        if named is not None and named[1]:
            ops.add(named[1])
    return ops


def _entry_parents(root: str, kinds: list[KindShape]) -> list[tuple[str, list[str], frozenset[str], Callable]]:
    """(relpath prefix, directory names, those that are links, the entries' name pattern) of each directory
    entries of `kinds` lie in, from the listings kept while they are unchanged (fs/dirnames.py: a Triton root's
    10^5 names are not listed again). Kinds whose entries lie in the same directories share their pattern
    (Triton's two)."""
    listings = dirnames.of(root)
    out: dict[str, tuple[str, list[str], frozenset[str], Callable]] = {}
    for k in kinds:
        for parent, _ in _dirs(root, k, k.depth - 1):
            if parent in out:
                continue
            try:
                names, links = listings.dirs_and_links(parent)
            except OSError:
                continue
            base = os.path.relpath(parent, root)
            out[parent] = ("" if base == "." else base + "/", names, links, k.segment(k.depth - 1).fullmatch)
    return list(out.values())


def _first_entries(root: str, kinds: list[KindShape], limit: int) -> list[str]:
    """The paths of the first `limit` directories that may be an entry of one of `kinds`, in listing order
    (the last level's listing stops there: a Triton root's 10^5 names are not all read)."""
    out: dict[str, None] = {}
    for k in kinds:
        last = k.segment(k.depth - 1).fullmatch
        for parent, _ in _dirs(root, k, k.depth - 1):
            if len(out) >= limit:
                break
            try:
                listed = fsread.scandir_list(parent, limit=limit - len(out))
            except OSError:
                continue
            out.update((d.path, None) for d in listed if last(d.name) and d.is_dir(follow_symlinks=False))
    return list(out)


def layouts_of(root: str | os.PathLike) -> tuple[str, ...]:
    """The layouts a root holds, from the names at its top level: its visible real directories, from the
    listing a scan kept while the root is unchanged (shapes.top_dirs: a Triton root's 10^5 keys are not
    listed again)."""
    root = os.fspath(root)
    try:
        top = [n for n in top_dirs(root, links=False) if not n.startswith(".")]
    except OSError:
        return ()
    return tuple(s.name for s in SHAPES if s.held_by(root, top))


def _select(root, layouts: Iterable[str], present: Iterable[str] | None = None) -> tuple[str, list[LayoutShape]]:
    """The shapes of the layouts `root` holds (`present`, when the caller knows them), within `layouts`."""
    root = os.fspath(root)
    present = layouts_of(root) if present is None else tuple(present)
    wanted = set(layouts)
    return root, [s for s in SHAPES if s.name in present and (not wanted or s.name in wanted)]


def space_layouts(root: str | os.PathLike, ops: Iterable[str] = (), layouts: Iterable[str] = (),
                  read: bool = False) -> dict[str, str]:
    """Each space present (hidet `cuda_space_0`, tilelang `0.1.15/linux-x86_64`) -> its layout, sorted;
    with `ops`, only the spaces holding one of those ops. With `read`, also the spaces kept in entries'
    files, not in their paths (a Triton arch `sm_90a`), read from at most READS entries (_in_files): of a
    bigger cache a sample, to offer (completion, hints), never to select with (expand_filter)."""
    root, shapes = _select(root, layouts)
    ops = tuple(ops)
    out: dict[str, str] = {}
    for s in shapes:
        for k in s.kinds:
            if k.space is None or (ops and not k.has_op):  # entries without an op match no --op
                continue
            depth = k.depth if ops and k.op_depth < 0 else max(k.space_depth, k.op_depth) + 1 if ops \
                else k.space_depth + 1
            for f in _walk(root, k, depth, ops=ops):
                out.setdefault(k.space_of(f) or "", s.name)
        if read and any(k.space_in_files is not None for k in s.kinds):
            for space, _ in _in_files(root, s, ops):
                if space:
                    out.setdefault(space, s.name)
    return dict(sorted(out.items()))


def op_places(root: str | os.PathLike, spaces: Iterable[str] = (), layouts: Iterable[str] = (),
              offer: bool = False, whole: bool = False, in_files: bool = True) -> dict[str, tuple[str, ...]]:
    """Each op name present (hidet op directories, tilus script names) -> where it is (its spaces, or
    its layout's name when its entries have no space), sorted; with `spaces`, only the ops in those spaces.
    With `offer`, the names kept in entries' files (Triton's kernel names) are those the scan index recorded
    and at most READS entries tell (_ops_in_files), not every entry's listing: to offer (completion), never
    to select with (expand_filter). With `whole` too, the recorded names only where the index names every
    entry's op, else every entry's listing: all the names there are, for a hint that one is not there.
    Without `in_files`, only the names directories carry (nothing read of Triton's kernels)."""
    root, shapes = _select(root, layouts)
    spaces = tuple(spaces)
    out: dict[str, list[str]] = {}

    def add(op: str, place: str) -> None:
        where = out.setdefault(op, [])
        if place not in where:
            where.append(place)

    for s in shapes:
        offered = None
        if offer and not spaces and _keeps_ops_in_files(s):
            offered = _ops_in_files(root, s, whole)  # their kinds have no space in their paths (Triton's)
        files_told = offered is not None or not in_files  # the ops entries keep in their files: none read
        for k in s.kinds:
            if not k.has_op or (spaces and k.space is None) or (files_told and k.from_files is not None):
                continue
            depth = k.depth if k.op_depth < 0 else max(k.op_depth, k.space_depth) + 1
            for f in _walk(root, k, depth, spaces=spaces):
                if f.get("op"):
                    add(f["op"], k.space_of(f) or s.name)
        for op in sorted(offered or ()):
            add(op, s.name)
    return {op: tuple(where) for op, where in sorted(out.items())}


def entries(root: str | os.PathLike, prefix: str = "", ops: Iterable[str] = (), spaces: Iterable[str] = (),
            layouts: Iterable[str] = (), present: Iterable[str] | None = None) -> Iterator[EntryName]:
    """Every entry whose hash starts with `prefix`, as names only, in directory order per parent. With a
    prefix, the listings of the directories entries lie in are kept for the next lookup (DirNames).
    `present`: the layouts the root holds, when the caller detected them (else found from its names)."""
    root, shapes = _select(root, layouts, present)
    ops, spaces = tuple(ops), tuple(spaces)
    kept = dirnames.of(root) if prefix and not prefix.startswith(".") else None
    for s in shapes:
        for k in s.kinds:
            if (ops and not k.has_op) or (spaces and k.space is None):
                continue  # a program's op name is inside program.txt: not read here
            for f in _walk(root, k, k.depth, ops, spaces, prefix, kept):
                yield EntryName(s.name, k.kind, k.space_of(f), f.get("op"), f["hash"])
    if kept is not None:
        kept.save()


class Nearest(NamedTuple):
    """What a reference that names no entry may have meant (names only: no entry is judged)."""

    hashes: tuple[str, ...]  # entries' hashes sharing the longest prefix with it, as long as tells them apart
    ops: tuple[str, ...]  # op names it is, or is close to


HINT_HASHES = 3
_HINT_LOOKS = 64  # entries looked at, at most, for one prefix length (a 1-character prefix names thousands)


def nearest(ref: str, roots: Iterable[str | os.PathLike]) -> Nearest:
    """The hashes of up to HINT_HASHES entries of `roots` whose hash shares the longest prefix with `ref`
    (its last path part; none starting with all of it: those it names, left out by other selectors), and
    the op names close to it. A lookup by prefix per step, from the kept listings (fs/dirnames.py); op
    names from directory names, and where they lie in files (Triton's) as _ops_in_files offers them."""
    key = ref.rstrip("/").rsplit("/", 1)[-1]
    inside = _holder(ref, roots)
    if inside:
        return Nearest(_told_apart([inside], 0), ())
    hashlike = all(ch.isascii() and (ch.isalnum() or ch in "_-") for ch in key)  # no hash has a '.'
    best, hashes, ops = 0, set[str](), set[str]()
    for where in roots:
        root = os.fspath(where)
        if not fsread.is_dir(root):
            continue
        present = layouts_of(root)
        other = _other_case(root, key, present) if hashlike else []
        # (a key shown as long as it was typed, at least 8: _told_apart shows one past what is shared)
        shared, found = (len(key) - 1, other) if other else _longest_shared(root, key, present) if hashlike else (0, [])
        if shared > best:
            best, hashes = shared, set(found)
        elif shared == best and shared:
            hashes.update(found)
        ops.update(_op_names(root, present))
    close = [key] if key in ops else closest(key, sorted(ops))
    return Nearest(_told_apart(sorted(hashes)[:HINT_HASHES], best), tuple(close))


def _holder(ref: str, roots: Iterable[str | os.PathLike]) -> str | None:
    """The hash of the entry the path `ref` lies inside (one of its files, as `find` prints it), or None:
    each directory of the path, deepest first, looked up as a whole hash (a lookup by prefix each)."""
    if "/" not in ref.strip("/"):
        return None
    for where in roots:
        root = os.fspath(where)
        rel = os.path.relpath(ref, root) if os.path.isabs(ref) else ref
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if not parts or parts[0] == ".." or not fsread.is_dir(root):
            continue
        for part in reversed(parts[:-1]):
            if any(e.hash == part for e in entries(root, part)):
                return part
    return None


def _other_case(root: str, key: str, present: tuple[str, ...]) -> list[str]:
    """The first _HINT_LOOKS hashes that start with `key` in another case: a Triton key (base32, upper case)
    typed in lower case, a hex one in upper case. Hashes are matched as written; this only names them."""
    for variant in dict.fromkeys((key.upper(), key.lower())):
        if variant != key:
            found = [e.hash for e in itertools.islice(entries(root, variant, present=present), _HINT_LOOKS)]
            if found:
                return list(dict.fromkeys(found))
    return []


def _longest_shared(root: str, key: str, present: tuple[str, ...]) -> tuple[int, list[str]]:
    """(n, hashes): the longest prefix of `key` that entries' hashes not starting with `key` share, a binary
    search over its length (each step a lookup by prefix: a miss costs a few lookups, not a listing of
    every entry), and the first _HINT_LOOKS of those hashes; (0, []) when none shares its first character."""

    def sharing(n: int) -> list[str]:
        found = (e.hash for e in entries(root, key[:n], present=present) if not e.hash.startswith(key))
        return list(dict.fromkeys(itertools.islice(found, _HINT_LOOKS)))

    best: tuple[int, list[str]] = (0, [])
    low, high = 1, len(key) - 1
    while low <= high:
        mid = (low + high) // 2
        got = sharing(mid)
        if got:
            best, low = (mid, got), mid + 1
        else:
            high = mid - 1
    dirnames.save(root)  # the listings read for the lookups, for the next command
    return best


def _told_apart(hashes: list[str], shared: int) -> tuple[str, ...]:
    """`hashes` cut to 8 characters, or one past the prefix they share, or more until no two are alike."""
    width = max(shared + 1, 8)
    longest = max(map(len, hashes), default=0)
    while width < longest and len({h[:width] for h in hashes}) < len(hashes):
        width += 1
    return tuple(h[:width] for h in hashes)


def _op_names(root: str, present: tuple[str, ...]) -> set[str]:
    """The op names present, as cheaply as a lookup: from directory names (hidet's op directories, tilus's
    script names), and where they lie in entries' files (Triton's kernel names) from the scan index and at
    most READS entries (_ops_in_files)."""
    root, shapes = _select(root, (), present)
    out: set[str] = set()
    for s in shapes:
        for k in s.kinds:
            if k.op_depth >= 0:
                out.update(f["op"] for f in _walk(root, k, k.op_depth + 1) if f.get("op"))
        if _keeps_ops_in_files(s):
            out.update(_ops_in_files(root, s) or ())
    return out


def targets_present(root: str | os.PathLike) -> tuple[str, ...]:
    """The targets of the entries present: a kind's fixed target, or the {target} its paths carry."""
    root, shapes = _select(root, ())
    found: set[str] = set()
    for s in shapes:
        for k in s.kinds:
            if k.target is not None:
                found.add(k.target)
                continue
            depth = next((i + 1 for i in range(k.depth) if "target" in k.fields_in(i)), 0)
            if depth:
                found.update(f["target"] for f in _walk(root, k, depth))
    return tuple(sorted(found))


def expand_filter(root: str | os.PathLike, flt):
    """`flt` with its op globs (`mat*`) and spaces given as a level (`2`) or a glob replaced by the names
    present, so that layouts read only those directories. A pattern matching nothing stays as it is
    (it then matches nothing), and so does an op glob where a layout keeps ops in its entries' files."""
    ops, spaces = flt.ops, flt.spaces
    if any(is_glob(o) for o in ops):
        present = op_places(root, layouts=flt.layouts, in_files=False)
        ops = _expanded(ops, is_glob, lambda o: [n for n in present if fnmatchcase(n, o)])
        if _ops_in_entries(root, flt.layouts):  # Triton's: each kernel's op is matched as its files are read
            ops += tuple(o for o in flt.ops if is_glob(o) and o not in ops)
    if any(is_digits(s) or is_glob(s) for s in spaces):
        present_spaces = space_layouts(root, layouts=flt.layouts)
        spaces = _expanded(spaces, lambda s: is_digits(s) or is_glob(s),
                           lambda s: [n for n in present_spaces if space_matches(n, s)])
    if ops == flt.ops and spaces == flt.spaces:
        return flt
    return replace(flt, ops=ops, spaces=spaces)


def _ops_in_entries(root: str | os.PathLike, layouts: Iterable[str]) -> bool:
    """Whether a layout `root` holds (within `layouts`) keeps its entries' op names in their files, not in
    their directories' names (Triton's kernels): a glob over those stays a glob, matched by the scan as each
    entry is read, rather than expanded by reading every entry first."""
    return any(_keeps_ops_in_files(s) for s in _select(root, layouts)[1])


def _keeps_ops_in_files(s: LayoutShape) -> bool:
    """Whether some kind of `s` keeps its entries' op names in their files (Triton's kernel names), where
    no directory name tells them."""
    return any(k.from_files is not None for k in s.kinds)


def _expanded(values: tuple[str, ...], is_pattern, names_for) -> tuple[str, ...]:
    out: list[str] = []
    for v in values:
        found = names_for(v) if is_pattern(v) else [v]
        out.extend(n for n in (found or [v]) if n not in out)
    return tuple(out)


def unknown_values(root: str | os.PathLike, flt, found: dict[str, set] | None = None) -> list[str]:
    """One line for each --op, --space or --target value that names nothing present in `root`, with the
    closest names ("did you mean matmul?") and the names there are; never for a value `found` (what, as
    "op", -> the values the entries selected have) holds: a layout that keeps it in its files, not in its
    directory names (Triton's target, Numba's), has it, or matches (`--space 'sm_8*'`)."""
    out = []
    for what, values, present_names, match in _checks(root, flt):
        had = [n for n in (found or {}).get(what, ()) if n is not None]
        values = tuple(v for v in values if not any(match(v, n) for n in had))
        if not values:
            continue
        present = present_names()
        for v in values:
            if not any(match(v, n) for n in present):
                out.append(_did_you_mean(what, v, present, os.fspath(root)))
    return out


def _checks(root: str | os.PathLike, flt) -> tuple:
    """(what, the filter's values, the names present, does value v match name n) for op, space, target."""
    return (("op", flt.ops, lambda: list(op_places(root, layouts=flt.layouts, offer=True, whole=True)),
             lambda v, n: n == v or (is_glob(v) and fnmatchcase(n, v))),
            ("space", flt.spaces, lambda: list(space_layouts(root, layouts=flt.layouts, read=True)),
             lambda v, n: space_matches(n, v)),
            ("target", flt.targets, lambda: list(targets_present(root)), lambda v, n: n == v))


def unknown_across(selected: list, what: str, value: str) -> str | None:
    """One line when the --op/--space/--target `value` names nothing in any of the caches `selected`
    ((root, filter) each), with the closest names over all of them; None when one has it."""
    present_all: list[str] = []
    for root, flt in selected:
        for kind, _, present_names, match in _checks(root, flt):
            if kind != what:
                continue
            present = present_names()
            if any(match(value, n) for n in present):
                return None
            present_all.extend(n for n in present if n not in present_all)
    where = os.fspath(selected[0][0]) if len(selected) == 1 else plural(len(selected), "cache")
    return _did_you_mean(what, value, sorted(present_all), where)


def _did_you_mean(what: str, value: str, present: list[str], root: str) -> str:
    hint = did_you_mean(closest(value, present, n=3))
    shown = ", ".join(present[:12]) + (f" and {len(present) - 12} more" if len(present) > 12 else "")
    there = f" ({what}s present: {shown})" if present else f" (no {what}s present)"
    return f"no {what} '{value}' in {root}{hint}{there}"
