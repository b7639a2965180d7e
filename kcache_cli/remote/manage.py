"""kcache remote ls | stats | prune: what a remote holds, from its index alone, and removing from it.

Prune removes least recently pulled first (an entry never pulled counts from when it was pushed).
Each entry goes record first (with its index and last-pulled fields), so that no reader finds a
record without its data; then its data and the keys its format set last."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import ClassVar

from kcache_cli import layouts
from kcache_cli.archive.manifest import unchecked_record
from kcache_cli.fs.read import parse_json
from kcache_cli.model.records import EntryKey, Keyed, ScanFilter, Warn, iso
from kcache_cli.model.terms import COMPLETE, Status
from kcache_cli.remote import formats as f
from kcache_cli.remote.store import NotAValue, Store
from kcache_cli.util.units import format_size


@dataclass(frozen=True)
class RemoteEntry(Keyed):
    """An entry as a remote's index describes it (its kind "" when the index does not say)."""

    key: EntryKey
    files: int
    size: int
    arch: str | None
    pushed: float | None  # epoch seconds
    last_pulled: float | None

    status: ClassVar[Status] = COMPLETE  # a remote holds complete entries only (for ScanFilter.matches)

    @property
    def last_used(self) -> float:
        return self.last_pulled or self.pushed or 0.0

    def to_json(self) -> dict:
        return {**self.key.to_json(), "kind": self.kind or None, "file_count": self.files, "size": self.size,
                "arch": self.arch, "pushed": iso(self.pushed), "last_pulled": iso(self.last_pulled)}


def _epoch(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return time.mktime(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    except ValueError:
        return None


def _text(s: dict, key: str) -> str | None:
    return s[key] if isinstance(s.get(key), str) else None


def _int(s: dict, key: str) -> int:
    v = s.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def _float(value: object) -> float | None:
    try:
        v = float(value) if isinstance(value, (bytes, str)) else None
    except ValueError:
        return None
    return v if v is not None and v == v and abs(v) != float("inf") else None


def remote_entry(layout: str, rel: str, summary: object, last_pulled: float | None = None,
                 times: bool = True) -> RemoteEntry:
    """An entry as the index (or a record) describes it: what is not a string or a count is unknown.
    `times`: parse when it was pushed (selection alone does not need it)."""
    s = summary if isinstance(summary, dict) else {}
    key = EntryKey(layout, _text(s, "kind") or "", _text(s, "target"), _text(s, "space"), _text(s, "op"),
                   _text(s, "hash") or rel.rsplit("/", 1)[-1], rel)
    return RemoteEntry(key, _int(s, "files"), _int(s, "size"), _text(s, "arch"),
                       _epoch(s.get("pushed")) if times else None, last_pulled)


def _summary(value: object) -> dict:
    if not isinstance(value, bytes):
        return {}  # over MAX_RECORD (its size) or gone
    try:
        loaded = parse_json(value)
    except (ValueError, UnicodeDecodeError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def scan_index(store: Store, flt: ScanFilter | None = None, pulled: bool = True) -> Iterator[list[RemoteEntry]]:
    """The entries of the remote's index that `flt` selects, a batch at a time, as the index is
    scanned (no record or data is read; memory stays that of one batch however big the index).
    `pulled`: with their last-pulled times (one more read per batch)."""
    flt = flt or ScanFilter()
    for batch in store.hash_scan(f.INDEX):
        kept = []
        for eid, value in batch:
            layout, _, rel = eid.partition(":")
            e = remote_entry(layout, rel, _summary(value), times=pulled)
            if flt.matches(e):
                kept.append(e)
        if not kept:
            continue
        if not pulled:
            yield kept
            continue
        times = store.hash_values(f.PULLED, [f.entry_id(e.layout, e.relpath) for e in kept], limit=64)
        yield sorted((replace(e, last_pulled=_float(p)) for e, p in zip(kept, times)), key=lambda e: e.relpath)


def list_remote(store: Store, flt: ScanFilter | None = None) -> list[RemoteEntry]:
    """Every entry in the remote's index that `flt` selects, sorted (all in memory: stats, prune)."""
    return sorted((e for batch in scan_index(store, flt) for e in batch), key=lambda e: e.relpath)


def remote_stats(entries: list[RemoteEntry]) -> dict:
    def group(key) -> dict:
        acc: dict[str, dict[str, int]] = {}
        for e in entries:
            g = acc.setdefault(str(key(e) or ""), {"entry_count": 0, "size": 0})  # "": none (no_space)
            g["entry_count"] += 1
            g["size"] += e.size
        return dict(sorted(acc.items()))

    spaces, ops = group(lambda e: e.space), group(lambda e: e.op)

    return {"entry_count": len(entries), "size": sum(e.size for e in entries),
            "file_count": sum(e.files for e in entries),
            "never_pulled": sum(1 for e in entries if e.last_pulled is None),
            "by_layout": group(lambda e: e.layout), "by_space": {k: v for k, v in spaces.items() if k},
            "by_op": {k: v for k, v in ops.items() if k}, "no_space": spaces.get(""), "no_op": ops.get("")}


@dataclass(frozen=True)
class RemoteRemoval:
    """A remote entry a remote prune removes, and why."""

    entry: RemoteEntry
    why: str

    def to_json(self) -> dict:
        return {**self.entry.to_json(), "why": self.why}


@dataclass(frozen=True)
class RemotePruneResult:
    """What `remote prune` removed (or in a dry run would remove) and the bytes that freed."""

    remote: str
    dry_run: bool
    removed: tuple[RemoteRemoval, ...]
    freed: int

    def to_json(self) -> dict:
        """`remote prune --json`."""
        return {"remote": self.remote, "dry_run": self.dry_run, "removed": [r.to_json() for r in self.removed],
                "entry_count": len(self.removed), "freed": self.freed}


def plan_remote_prune(entries: list[RemoteEntry], max_size: int | None = None, older_than: float | None = None,
                      now: float | None = None) -> list[RemoteRemoval]:
    """What to remove: entries unused (not pulled, nor pushed) for `older_than` seconds, then least
    recently pulled first until the rest fits in `max_size` bytes. The list is the dry run."""
    now = time.time() if now is None else now
    out: list[RemoteRemoval] = []
    gone: set[str] = set()
    if older_than is not None:
        for e in entries:
            if now - e.last_used > older_than:
                out.append(RemoteRemoval(e, f"not pulled for more than {older_than:g}s"))
                gone.add(e.relpath)
    if max_size is not None:
        rest = sorted((e for e in entries if e.relpath not in gone), key=lambda e: (e.last_used, -e.size, e.relpath))
        total = sum(e.size for e in rest)
        for e in rest:
            if total <= max_size:
                break
            out.append(RemoteRemoval(e, f"least recently pulled, over --max-size {format_size(max_size)}"))
            total -= e.size
    return out


def _path_problem(layout: str, relpath: str, kind: str) -> str | None:
    """Why keys derived from `relpath` may be another entry's: it is not exactly where `layout` keeps a
    `kind` entry (a Triton key's data keys name only the key: `junk/<key>` would name `<key>`'s)."""
    if layout not in layouts.NAMES:
        return "its layout is not one this kcache knows"
    bad = layouts.get(layout).shape_problem(relpath, kind, None)
    return f"its path is not an entry's ({bad})" if bad else None


def owned_keys(store: Store, e: RemoteEntry) -> tuple[list[str], list[str], str | None]:
    """The keys entry `e` owns: (its data, the keys its format set last), from its record; or why
    none are known. Only a record that is this entry's own (its layout and relpath those of its key)
    names keys, and only keys under this entry: a junk record naming another entry's relpath, at a path
    that is not exactly its layout's entry shape, or claiming a file bigger than any cache holds, names none."""
    raw = store.get([f.record_key(e.layout, e.relpath)])[0]
    if isinstance(raw, NotAValue):
        return [], [], f"its record is {raw.what}, not a value"
    if not isinstance(raw, bytes):
        return [], [], None if raw is None else f"its record is {raw} bytes, not read"
    try:
        loaded = parse_json(raw)
        rec = unchecked_record(loaded)
        if (rec.key.layout, rec.relpath) != (e.layout, e.relpath):
            return [], [], "its record names another entry"
        bad = _path_problem(rec.key.layout, rec.relpath, rec.key.kind)
        if bad:
            return [], [], bad
        fmt = f.format_for(e.layout)
        data = [k for ks in fmt.data_keys(rec).values() for k in ks]
        last = [k for k, _ in fmt.last(rec)]
    except f.ClaimTooBig as exc:
        return [], [], str(exc)
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return [], [], "its record is not one kcache reads"
    return data, last, None


def remove_remote(store: Store, e: RemoteEntry, warn: Warn | None = None) -> None:
    """Remove one entry: its record, index and pulled fields, then the data its own record names."""
    data, last, why = owned_keys(store, e)
    if why and warn:
        warn(f"{e.relpath}: {why}; removed its record and index entry only")
    store.delete([f.record_key(e.layout, e.relpath), *last])  # invisible first: to kcache and to the tool
    eid = f.entry_id(e.layout, e.relpath)
    store.hash_delete(f.INDEX, [eid])
    store.hash_delete(f.PULLED, [eid])
    store.delete(data)


def prune_remote(store: Store, plan: list[RemoteRemoval], warn: Warn | None = None) -> int:
    """Carry out a prune plan; returns the bytes freed. A shared directory also loses the data of
    pushes that never published (Redis lets such data expire by itself)."""
    freed = 0
    for r in plan:
        remove_remote(store, r.entry, warn)
        freed += r.entry.size
    expire = getattr(store, "remove_stale_pending", None)
    if expire is not None:
        expire()
    return freed
