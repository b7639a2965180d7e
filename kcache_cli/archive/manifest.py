"""The archive format: its manifest and the rules every record and member name obeys (paths, key
fields, links, lock files, limits). Nothing here reads a cache or writes a file."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Callable, Mapping, NamedTuple

from kcache_cli.fs import state
from kcache_cli.fs.read import JsonTooDeep, parse_json
from kcache_cli.layouts import NAMES, get
from kcache_cli.model.records import EntryKey, iso
from kcache_cli.model.terms import ImportAction, unknown_layout
from kcache_cli.util.errors import KcacheError, UsageError

FORMAT = "kcache-archive"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
COMPRESSION_BY_SUFFIX = ((".tar.gz", "gz"), (".tgz", "gz"), (".tar.zst", "zst"), (".tzst", "zst"),
                         (".tar.zstd", "zst"), (".tar", "tar"))
BINARY_SUFFIXES = (".so", ".cubin", ".fatbin", ".o", ".a", ".hsaco", ".dylib", ".dll")
BIG_FILE = 32 << 20  # files above this are streamed instead of read whole
_LOCK_NAME = re.compile(r"(^|/)(\.lock|[^/]*\.(t_)?lock)$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# C0, DEL, C1 and the bidi controls that make a name read differently from what it is (textsafe).
CONTROL_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
MAX_NAME_DEPTH = 64  # components of a name inside an entry (export walks at most fsread.MAX_TREE_DEPTH)
PATH_MAX = 4096
# File names that need no closer look: ASCII, no component starting with '.', components of 1-255
# bytes, at most 16 deep; matched for all names of a manifest at once, one per line.
_SIMPLE = r"[\w+\-=,@%~][\w.+\-=,@%~]{0,254}(?:/[\w+\-=,@%~][\w.+\-=,@%~]{0,254}){0,15}"
_SIMPLE_NAMES = re.compile(rf"(?:{_SIMPLE}(?:\n{_SIMPLE})*)?", re.ASCII)
_SIMPLE_PATH = re.compile(_SIMPLE, re.ASCII)
_LOCK_LINE = re.compile(r"(?:^|/)(?:\.lock|[^/\n]*\.(?:t_)?lock)$", re.MULTILINE)
_HEX = re.compile(r"[0-9a-f]*")


class ArchiveRejected(KcacheError):
    """The archive breaks a rule: nothing of it is published (exit 1)."""


@dataclass(frozen=True)
class ImportLimits:
    """Bounds on what an archive may make kcache write (tar-bomb defences)."""

    max_member: int = 4 << 30  # one file
    max_total: int = 64 << 30  # all files together
    max_members: int = 5_000_000  # files, links and directories
    max_manifest: int = 256 << 20  # the manifest itself, held in memory
    # In proportion to the archive (a regular file), so that a small archive cannot make the manifest
    # cost gigabytes: its bytes, its JSON values (counted at C speed before parsing) and its
    # entries. kcache's own archives hold about 90 bytes per entry and 0.3 values per byte at least.
    manifest_floor: int = 16 << 20  # bytes of manifest any archive may have
    manifest_per_byte: int = 32  # manifest bytes per archive byte above that
    values_floor: int = 1_000_000  # JSON values any manifest may have
    values_per_byte: int = 1  # values per archive byte above that
    objects_floor: int = 10_000  # JSON objects (two per entry record) any manifest may have
    min_entry_bytes: int = 16  # archive bytes per entry record, at least


# ---- shared rules ------------------------------------------------------------------------------

def compression_for(path: str) -> str:
    """'tar', 'gz' or 'zst' from an archive's name."""
    low = path.lower()
    for suffix, kind in COMPRESSION_BY_SUFFIX:
        if low.endswith(suffix):
            return kind
    raise UsageError(f"cannot tell the archive format from '{os.path.basename(path)}': "
                     "name it .tar, .tar.gz (.tgz) or .tar.zst")


def is_lock_name(name: str) -> bool:
    return name.endswith("lock") and bool(_LOCK_NAME.search(name))


def is_binary_name(name: str) -> bool:
    return name.lower().endswith(BINARY_SUFFIXES)


def path_problem(name: object, what: str = "path") -> str | None:
    """Why `name` is not a safe relative path ('a/b/c'), or None."""
    if not isinstance(name, str) or not name:
        return f"empty or non-text {what}"
    if CONTROL_CHARS.search(name):
        return f"{what} {name!r} holds control characters"
    if name.startswith("/"):
        return f"absolute {what} {name!r}"
    if len(name.encode("utf-8", "surrogatepass")) > 4096:
        return f"{what} longer than 4096 bytes"
    if name.count("/") >= MAX_NAME_DEPTH:  # a directory 1,000 deep would fail at publish, not at the check
        return f"{what} {name[:60]!r}... is nested more than {MAX_NAME_DEPTH} directories deep"
    for part in name.split("/"):
        if part in ("", ".", ".."):
            return f"{what} {name!r} has an empty, '.' or '..' component" if part != ".." else \
                f"{what} {name!r} goes up with '..'"
        if part == state.STATE_DIR:
            return f"{what} {name!r} lands in kcache's own {state.STATE_DIR}/"
        if len(part.encode("utf-8", "surrogatepass")) > 255:
            return f"{what} {name!r} has a component longer than 255 bytes"
    return None


def entry_path_problem(layout: str, kind: str, relpath: str) -> str | None:
    """Why `relpath` is not where an entry of this layout and kind lives, or None."""
    if layout not in layout_names():
        return path_problem(relpath, "entry path") or f"{relpath!r} is not where a {layout} {kind} entry lives"
    lay = layout_of(layout)
    if _SIMPLE_PATH.fullmatch(relpath) is None:
        bad = path_problem(relpath, "entry path")
        if bad:
            return bad
        parts = relpath.split("/")
        if any(p.startswith(".") for p in parts) and not (lay.hidden_names and len(parts) == 1):
            return f"entry path {relpath!r} has a hidden component (temp, staging or state directory)"
    return lay.entry_path_problem(kind, relpath)


def layout_names() -> tuple[str, ...]:
    return NAMES


def layout_of(name: str):
    return get(name)


def link_problem(layout: str, kind: str, relpath: str, name: str, target: object,
                 target_ok: Callable[[str], bool]) -> str | None:
    """Why the symlink `name` (inside the entry at `relpath`) -> `target` is not allowed, or None.

    Allowed: a relative target of the form ../../a/b that stays inside the entry; also the entry the
    layout lets it point at (Layout.link_target: a tilus script's `programs/<h>`) when `target_ok`
    says that entry is in the archive or in the cache."""
    where = f"symlink {relpath}/{name} -> {target!r}"
    if not isinstance(target, str) or not target or "\0" in target or CONTROL_CHARS.search(target):
        return f"{where} has an empty or malformed target"
    if target.startswith("/"):
        return f"{where} is absolute"
    parts = target.split("/")
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    rest = parts[ups:]
    if not rest or any(p in ("", ".", "..") for p in rest):
        return f"{where} is not a plain relative path"
    base = (relpath + "/" + name).split("/")[:-1]
    if ups > len(base):
        return f"{where} points outside the cache"
    resolved = base[:len(base) - ups] + rest
    mine = relpath.split("/")
    if len(resolved) > len(mine) and resolved[:len(mine)] == mine:
        return None
    allowed = layout_of(layout).link_target(kind, resolved) if layout in layout_names() else None
    if allowed is not None:  # an entry the layout lets it point at (a tilus script's program)
        if target_ok(allowed):
            return None
        located = layout_of(layout).shape.locate(allowed)
        return (f"{where} points to a {layout} {located[0] if located else 'entry'} that is neither in the "
                "archive nor in the cache")
    return f"{where} points outside its entry"


# ---- entry records -------------------------------------------------------------------------------

FileInfo = tuple[int, str]  # a file's (size, sha256)
# The fields of a manifest entry record, in the order export writes them; any other field (the remote's
# "executable", "pushed", "groups"...) is kept in `EntryRecord.extra` and written after these.
_FIELDS = ("layout", "kind", "target", "space", "op", "hash", "relpath", "status", "compiler", "arch", "platform",
           "files", "links", "dirs", "locks", "omitted", "last_used")
_KNOWN = frozenset(_FIELDS)


_NO_EXTRA: Mapping[str, object] = MappingProxyType({})


def _text(value: object) -> str | None:
    """A text field of a record; anything else (a hostile manifest's number or list) reads as absent."""
    return value if isinstance(value, str) else None


def _when(value: object) -> float | None:
    """A time field of a record (ISO-8601 with its offset, as `iso` writes it) in epoch seconds; anything
    else (not text, no offset, not a date) reads as absent."""
    if type(value) is not str or len(value) > 40:
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    return t.timestamp() if t.tzinfo is not None else None


class EntryRecord(NamedTuple):
    """One entry of an archive's manifest (and of a remote's record): its key, where it lives, its
    files, links, directories and lock files, and what its layout found about it. `from_json` applies
    every rule a record obeys on its own; `to_json` writes exactly what export writes. (A NamedTuple,
    not a frozen dataclass: an import builds one per entry, and this is three times faster to make.)"""

    key: EntryKey  # with the entry's relpath
    files: dict[str, FileInfo]  # name -> (size, sha256)
    links: dict[str, str]  # name -> target
    dirs: tuple[str, ...]
    locks: tuple[str, ...]  # empty lock files, made anew on import
    status: str | None
    compiler: str | None
    arch: str | None
    platform: str | None
    omitted: tuple[str, ...] | None = None  # files a --sources-only export left out (None: not one)
    extra: Mapping[str, object] = _NO_EXTRA  # fields this kcache does not interpret, as they came
    last_used: float | None = None  # when the entry was last used where it was exported (None: not said)

    @property
    def relpath(self) -> str:
        return self.key.relpath

    @property
    def size(self) -> int:
        return sum(size for size, _ in self.files.values())

    @classmethod
    def from_json(cls, rec: object, index: int = 0, limits: ImportLimits = ImportLimits()) -> EntryRecord:
        """The record `rec` (parsed JSON) after every rule a record obeys on its own (ArchiveRejected,
        naming entry `index`, if it breaks one)."""
        return records_from_json([rec], index, limits)[0]

    def to_json(self) -> dict:
        """The record as export writes it into the manifest (its fields in that order, then `extra`)."""
        k = self.key
        out: dict[str, object] = {
            "layout": k.layout, "kind": k.kind, "target": k.target, "space": k.space, "op": k.op, "hash": k.hash,
            "relpath": k.relpath, "status": self.status, "compiler": self.compiler, "arch": self.arch,
            "platform": self.platform, "files": self.files, "links": self.links, "dirs": self.dirs,
            "locks": self.locks}
        if self.omitted is not None:
            out["omitted"] = self.omitted
        if self.last_used is not None:
            out["last_used"] = iso(self.last_used)
        if self.extra:
            out.update(self.extra)
        return out


def _built(rec: dict, key: EntryKey, files: dict[str, FileInfo], links: dict, dirs: list, locks: list) -> EntryRecord:
    """The EntryRecord of a checked JSON record: the remaining fields taken as they are."""
    get = rec.get
    omitted = get("omitted")
    extra = _NO_EXTRA if rec.keys() <= _KNOWN else {k: v for k, v in rec.items() if k not in _KNOWN}
    if omitted is not None and not (isinstance(omitted, list) and all(isinstance(o, str) for o in omitted)):
        extra = {**extra, "omitted": omitted}  # import never reads it: kept as it came, not trusted
        omitted = None
    status, compiler, arch, platform = get("status"), get("compiler"), get("arch"), get("platform")
    # _text, inline: this runs once per entry of an import
    used = get("last_used")
    return EntryRecord(key, files, links, tuple(dirs), tuple(locks),
                       status if type(status) is str else None, compiler if type(compiler) is str else None,
                       arch if type(arch) is str else None, platform if type(platform) is str else None,
                       tuple(omitted) if omitted is not None else None, extra,
                       _when(used) if used is not None else None)


def unchecked_record(rec: dict) -> EntryRecord:
    """The EntryRecord of a JSON record built without the checks: for one `records_from_json` accepted
    already (in a worker of this import), or one read only to find the keys to delete. A malformed one
    raises KeyError, TypeError or ValueError."""
    files = rec["files"]
    key = EntryKey(rec["layout"], rec["kind"], _text(rec.get("target")), _text(rec.get("space")),
                   _text(rec.get("op")), rec["hash"], rec["relpath"])
    return _built(rec, key, {n: (s, d) for n, (s, d) in files.items()}, dict(rec.get("links", {})),
                  rec.get("dirs", []), rec.get("locks", []))


class Manifest(NamedTuple):
    """A parsed manifest: its header (format, version, parts...), its entry records as JSON (each
    checked on its own by `records_from_json`, in the import's workers), each one's path and size."""

    header: dict
    records: list[dict]
    relpaths: list[str]
    totals: list[int]


# ---- import: the plan ---------------------------------------------------------------------------

@dataclass(slots=True)  # no __dict__: one object fewer per entry for the collector to track in a big import
class PlannedEntry:
    """One manifest entry and what import will do with it (the plan before any write)."""

    index: int
    record: EntryRecord
    action: ImportAction = "import"
    reason: str | None = None
    write: bool = True  # extract into staging (False: verify only)
    # The archive's times, kept when its record says when the entry was last used (older archives say not:
    # their files get the import's time): its directories' mtimes by member name (None: not kept), the
    # newest mtime of its members, and the last use of an incomplete entry it replaced.
    dir_times: dict[str, float] | None = None
    newest: float = 0.0
    replaced_use: float = 0.0

    @property
    def layout(self) -> str:
        return self.record.key.layout

    @property
    def kind(self) -> str:
        return self.record.key.kind

    @property
    def relpath(self) -> str:
        return self.record.relpath

    @property
    def size(self) -> int:
        return self.record.size


def reject(msg: str) -> ArchiveRejected:
    return ArchiveRejected(f"archive rejected: {msg}")


def check_proportion(manifest_size: int, archive_size: int | None, limits: ImportLimits,
                      data: bytes | None = None, entries: int | None = None) -> None:
    """Refuse a manifest out of proportion to its archive (millions of records in a small archive):
    its size, then (with `data`) its JSON values counted at C speed before json.loads builds them,
    then (with `entries`) its entry count. Nothing when the archive's size is unknown (a pipe)."""
    if archive_size is None:
        return
    what = f"out of proportion to a {archive_size}-byte archive (a manifest bomb?)"
    if manifest_size > limits.manifest_floor + limits.manifest_per_byte * archive_size:
        raise reject(f"manifest.json is {manifest_size} bytes, {what}")
    if data is not None:
        objects = data.count(b"{")  # at least every object: a record and its file map
        values = data.count(b",") + data.count(b"[") + objects + 1  # at least every value
        if values > limits.values_floor + limits.values_per_byte * archive_size:
            raise reject(f"manifest.json holds up to {values} values, {what}")
        if objects > limits.objects_floor + 2 * archive_size // limits.min_entry_bytes:
            raise reject(f"manifest.json holds up to {objects} objects, {what}")
    if entries is not None and entries * limits.min_entry_bytes > archive_size:
        raise reject(f"manifest.json lists {entries} entries, {what}")


def parse_manifest(data: bytes, limits: ImportLimits, archive_size: int | None = None) -> Manifest:
    """The manifest's header and the rules that span all entries: unique, non-nested entry paths
    and the limits on sizes and member counts (checked in bulk). Each record's own rules are
    `records_from_json`' (the workers'). Its size and nesting are bounded before it is parsed
    (fsread.parse_json)."""
    check_proportion(len(data), archive_size, limits, data)
    try:
        manifest = parse_json(data, "manifest.json")
    except JsonTooDeep as exc:
        raise reject(str(exc)) from None
    except (ValueError, UnicodeDecodeError):
        raise reject("manifest.json is not valid JSON") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise reject("manifest.json is not a kcache archive manifest")
    version = manifest.get("format_version")
    if type(version) is not int or version < 1:
        raise reject("manifest.json has no valid format_version")
    if version > FORMAT_VERSION:
        raise reject(f"made by a newer kcache (archive format {version}, this kcache reads {FORMAT_VERSION})")
    records = manifest.get("entries")
    if not isinstance(records, list):
        raise reject("manifest.json has no entry list")
    check_proportion(len(data), archive_size, limits, entries=len(records))
    try:
        rels = [rec["relpath"] + "" for rec in records]
        sizes = [[info[0] + 0 for info in rec["files"].values()] for rec in records]
        members = sum(len(rec["files"]) + len(rec.get("links") or ()) + len(rec.get("dirs") or ())
                      + len(rec.get("locks") or ()) + 1 for rec in records)
        if any(type(x) is not int or x < 0 for ss in sizes for x in ss):
            raise TypeError
    except (TypeError, KeyError, IndexError, AttributeError):
        records_from_json(records, 0, limits)  # names the malformed record
        raise reject("manifest.json has malformed entries") from None
    totals = [sum(ss) for ss in sizes]
    largest = max((max(ss) for ss in sizes if ss), default=0)
    if largest > limits.max_member:
        records_from_json(records, 0, limits)  # names the file
    if members > limits.max_members:
        raise reject(f"{members} members, over the limit of {limits.max_members}")
    if sum(totals) > limits.max_total:
        raise reject(f"it would expand to {sum(totals)} bytes, over the limit of {limits.max_total}")
    ordered = sorted(rels)
    for a, b in zip(ordered, ordered[1:]):
        if a == b:
            raise reject(f"entry {a} is listed twice in the manifest")
        if b.startswith(a + "/"):
            raise reject(f"entry {b} lies inside entry {a}")
    return Manifest(manifest, records, rels, totals)


def records_from_json(records: list, offset: int, limits: ImportLimits) -> list[EntryRecord]:
    """Each entry record (record `offset` first) against the rules that need no member: the shape of
    its path, its key fields, its names and records. File names and digests are checked in bulk (one
    regex over all of them); only when that fails is each looked at, to say which one is wrong."""
    out: list[EntryRecord] = []
    all_names: list[str] = []
    all_sizes: list = []
    all_digests: list = []
    for i, rec in enumerate(records, offset):
        r, sizes, digests = _record_from_json(rec, i, limits)
        all_names.extend(r.files)
        all_sizes.extend(sizes)
        all_digests.extend(digests)
        out.append(r)
    # In bulk: every file name simple and no lock, every size a non-negative int, every digest hex64.
    joined = "\n".join(all_names)
    ok = joined.count("\n") == len(all_names) - 1 if all_names else True  # no name holds a newline itself
    ok = ok and _SIMPLE_NAMES.fullmatch(joined) is not None and not _LOCK_LINE.search(joined) \
        and all(type(x) is int and 0 <= x <= limits.max_member for x in all_sizes) \
        and all(type(d) is str for d in all_digests) and set(map(len, all_digests)) <= {64} \
        and _HEX.fullmatch("".join(all_digests)) is not None
    if not ok:
        for rec, r in zip(records, out):
            _check_files(r.relpath, rec["files"], limits)
    return out


def _record_from_json(rec: object, i: int, limits: ImportLimits) -> tuple[EntryRecord, list, list]:
    """Record `i` checked on its own but for its file names and digests (checked in bulk by the
    caller), with its file sizes and digests as the JSON gave them."""
    if not isinstance(rec, dict):
        raise reject(f"manifest entry {i} is not an object")
    layout, kind, relpath = rec.get("layout"), rec.get("kind"), rec.get("relpath")
    unknown = unknown_layout(layout)
    if unknown:
        raise reject(f"manifest entry {i}: {unknown}")
    if not isinstance(layout, str) or not isinstance(kind, str) or not isinstance(relpath, str):
        raise reject(f"manifest entry {i} has no valid kind or path")
    bad = entry_path_problem(layout, kind, relpath)
    if bad:
        raise reject(f"manifest entry {i}: {bad}")
    key = EntryKey(layout, kind, _text(rec.get("target")), _text(rec.get("space")), _text(rec.get("op")),
                   rec.get("hash"), relpath)  # type: ignore[arg-type]  # a str: it equals the path's last part
    if key.hash != relpath.split("/")[-1] or layout_of(layout).key_problem(kind, relpath, key):
        raise reject(f"manifest entry {relpath}: its hash, space or op disagree with its path")
    files, links, dirs, locks = rec.get("files"), rec.get("links", {}), rec.get("dirs", []), rec.get("locks", [])
    if not isinstance(files, dict) or not isinstance(links, dict) or not isinstance(dirs, list) \
            or not isinstance(locks, list):
        raise reject(f"manifest entry {relpath}: malformed files, links, dirs or locks")
    try:
        sizes = [info[0] for info in files.values()]
        digests = [info[1] for info in files.values()]
        if any(len(info) != 2 for info in files.values()):
            raise TypeError
    except (TypeError, KeyError, IndexError):
        _check_files(relpath, files, limits)  # says which record is malformed
        raise reject(f"manifest entry {relpath}: malformed file records") from None
    _check_names(relpath, files, links, dirs, locks)
    return _built(rec, key, dict(zip(files, zip(sizes, digests))), dict(links), dirs, locks), sizes, digests


def _check_names(relpath: str, files: dict, links: dict, dirs: list, locks: list) -> None:
    """The names of an entry's links, directories and lock files: safe, each listed once, lock files
    named like one, nothing under a file or link."""
    names = set(files)
    for name, target in links.items():
        if not isinstance(target, str):
            raise reject(f"{relpath}/{name}: malformed link record")
    for group, what in ((links, "link"), (dirs, "directory"), (locks, "lock file")):
        for name in group or ():
            bad = path_problem(name, f"{what} name")
            if bad:
                raise reject(f"{relpath}: {bad}")
            if name in names:
                raise reject(f"{relpath}/{name} is listed twice in the manifest")
            names.add(name)
    for name in locks:
        if not is_lock_name(name):
            raise reject(f"{relpath}/{name} is listed as a lock file but is not named like one")
    nested = [n for n in names if "/" in n]
    if nested:
        not_dirs = names - set(dirs)
        for name in nested:
            parts_ = name.split("/")
            for k in range(1, len(parts_)):
                if "/".join(parts_[:k]) in not_dirs:
                    raise reject(f"{relpath}/{name} lies under a file or link of the same entry")


def _check_files(relpath: str, files: dict, limits: ImportLimits) -> None:
    """The file records of one entry, one by one (the slow path that names what is wrong)."""
    for name, info in files.items():
        bad = path_problem(name, "file name")
        if bad:
            raise reject(f"{relpath}: {bad}")
        if is_lock_name(name):
            raise reject(f"{relpath}/{name} is named like a lock file (lock files are never shipped)")
        if not isinstance(info, list) or len(info) != 2:
            raise reject(f"{relpath}/{name}: malformed file record (want [size, sha256])")
        size, digest = info
        if type(size) is not int or size < 0 or type(digest) is not str or not _HEX64.fullmatch(digest):
            raise reject(f"{relpath}/{name}: the manifest gives no valid size and sha256")
        if size > limits.max_member:
            raise reject(f"{relpath}/{name} is {size} bytes, over the limit of {limits.max_member} per file")


STAGING_NAME_ROOM = len("/.kcache/import-4194304-01234567/")  # the longest staging prefix below the root


def path_too_long(p: PlannedEntry, room: int) -> str | None:
    """The first path of entry `p` longer than `room` bytes (relative to the root), or None."""
    r = p.record
    names = (*r.files, *r.links, *r.dirs, *r.locks)
    longest = max(map(len, names), default=0) + len(p.relpath) + 1
    if 4 * longest <= room:  # even in 4-byte UTF-8 characters it fits
        return None
    for name in names:
        full = f"{p.relpath}/{name}"
        if len(full.encode("utf-8", "surrogatepass")) > room:
            return f"{full[:60]!r}..."
    return None


def rejection_reason(exc: ArchiveRejected) -> str:
    """The rule a record broke, without the 'archive rejected: ' that import puts first."""
    return str(exc).removeprefix("archive rejected: ")
