"""kcache remote ls | stats | prune: what a remote holds, from its index alone, and removing from it.

Prune removes least recently pulled first (an entry never pulled counts from when it was pushed).
Each entry goes record first (with its index and last-pulled fields), so that no reader finds a
record without its data; then its data and the keys its format set last."""

from __future__ import annotations

import time
from dataclasses import dataclass

from kcache_cli.fsread import parse_json
from kcache_cli.model import ScanFilter
from kcache_cli.remote import formats as f
from kcache_cli.remote.store import Store


@dataclass(frozen=True)
class RemoteEntry:
    layout: str
    kind: str | None
    target: str | None
    space: str | None
    op: str | None
    hash: str
    relpath: str
    files: int
    size: int
    arch: str | None
    pushed: float | None  # epoch seconds
    last_pulled: float | None

    @property
    def last_used(self) -> float:
        return self.last_pulled or self.pushed or 0.0

    def to_json(self) -> dict:
        from kcache_cli.model import iso

        d = dict(self.__dict__)
        d["pushed"], d["last_pulled"] = iso(self.pushed), iso(self.last_pulled)
        return d


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
    return s[key] if isinstance(s.get(key), int) and not isinstance(s.get(key), bool) else 0


def list_remote(store: Store, flt: ScanFilter | None = None) -> list[RemoteEntry]:
    """Every entry in the remote's index that `flt` selects (no record or data is read)."""
    from kcache_cli.remote.pull import summary_matches

    flt = flt or ScanFilter()
    pulled = store.hash_get(f.PULLED)
    out = []
    for eid, value in store.hash_get(f.INDEX).items():
        layout, _, rel = eid.partition(":")
        try:
            loaded = parse_json(value)
        except ValueError:
            loaded = None
        s = {**(loaded if isinstance(loaded, dict) else {}), "layout": layout, "relpath": rel}
        if not summary_matches(flt, s):
            continue
        try:
            last = float(pulled[eid]) if eid in pulled else None
        except ValueError:
            last = None
        out.append(RemoteEntry(layout, _text(s, "kind"), _text(s, "target"), _text(s, "space"), _text(s, "op"),
                               _text(s, "hash") or rel.rsplit("/", 1)[-1], rel, _int(s, "files"), _int(s, "size"),
                               _text(s, "arch"), _epoch(s.get("pushed")), last))
    return sorted(out, key=lambda e: e.relpath)


def remote_stats(entries: list[RemoteEntry]) -> dict:
    def group(key) -> dict:
        acc: dict[str, dict[str, int]] = {}
        for e in entries:
            g = acc.setdefault(str(key(e)), {"entries": 0, "size": 0})
            g["entries"] += 1
            g["size"] += e.size
        return dict(sorted(acc.items()))

    return {"entries": len(entries), "size": sum(e.size for e in entries),
            "files": sum(e.files for e in entries), "never_pulled": sum(1 for e in entries if e.last_pulled is None),
            "by_layout": group(lambda e: e.layout), "by_space": group(lambda e: e.space or e.target or "-"),
            "by_op": group(lambda e: e.op or "-")}


@dataclass(frozen=True)
class RemoteRemoval:
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
                "entries": len(self.removed), "freed": self.freed}


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
        rest = sorted((e for e in entries if e.relpath not in gone), key=lambda e: (e.last_used, e.relpath))
        total = sum(e.size for e in rest)
        for e in rest:
            if total <= max_size:
                break
            out.append(RemoteRemoval(e, f"least recently pulled, over --max-size {max_size}"))
            total -= e.size
    return out


def remove_remote(store: Store, e: RemoteEntry) -> None:
    """Remove one entry: its record, index and pulled fields, then its data (read from the record)."""
    key = f.record_key(e.layout, e.relpath)
    raw = store.get([key])[0]
    fmt = f.format_for(e.layout)
    from kcache_cli.archive.manifest import unchecked_record

    try:
        rec = unchecked_record(parse_json(raw)) if raw is not None else None
        data = [k for ks in fmt.data_keys(rec).values() for k in ks] if rec else []
        last = [k for k, _ in fmt.last(rec)] if rec else []
    except (ValueError, KeyError, TypeError, AttributeError):
        data, last = [], []
    store.delete([key, *last])  # invisible first: to kcache (record) and to the tool itself (its marker)
    eid = f.entry_id(e.layout, e.relpath)
    store.hash_delete(f.INDEX, [eid])
    store.hash_delete(f.PULLED, [eid])
    store.delete(data)


def prune_remote(store: Store, plan: list[RemoteRemoval]) -> int:
    """Carry out a prune plan; returns the bytes freed. A shared directory also loses the data of
    pushes that never published (Redis lets such data expire by itself)."""
    freed = 0
    for r in plan:
        remove_remote(store, r.entry)
        freed += r.entry.size
    expire = getattr(store, "remove_stale_pending", None)
    if expire is not None:
        expire()
    return freed
