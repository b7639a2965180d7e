"""kcache push: upload complete entries to a remote, each made visible by one atomic publish.

Per entry: its files (as export reads them: the same judgement, the same record) go up first, with
a time to live, under keys that name their sha256; then one SET NX of the record publishes the
entry, adds it to the index and makes the data permanent. Readers see a whole entry or none; a
pusher killed midway leaves only data that expires; two pushers of one entry do not fight (the
first record wins, the loser removes its own data the winner does not use)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from kcache_cli import __version__
from kcache_cli.archive.export import entry_records, plan_export
from kcache_cli.archive.manifest import unchecked_record
from kcache_cli.fs.read import parse_json
from kcache_cli.model.records import ScanFilter, Warn, iso
from kcache_cli.model.terms import PushAction
from kcache_cli.remote import formats as f
from kcache_cli.remote.moved import MovedEntry, MoveResult
from kcache_cli.remote.store import PENDING_TTL, Publish, Store, hash_fields
from kcache_cli.util.signing import signer as node_signer

if TYPE_CHECKING:
    from kcache_cli.archive.manifest import EntryRecord

PUSH: Final = "push"
SKIP: Final = "skip"
LEFT: Final = "left out"


class PushResult(MoveResult):
    @property
    def size(self) -> int:
        """What is (or in a dry run would be) uploaded."""
        return sum(e.size for e in self.entries if e.action == PUSH)

    def to_json(self) -> dict[str, object]:
        """`push --json`."""
        return self._json({"pushed": self.count(PUSH), "skipped": self.count(SKIP), "left_out": self.count(LEFT)},
                          self.size)


def own_manifest_problem(record: EntryRecord, data: dict[str, bytes]) -> str | None:
    """A file whose sha256 disagrees with the entry's own manifest (kcache.json, tilelang's
    manifest.json): the sizes matched, so the scan called it complete, but its bytes changed."""
    for meta in ("kcache.json", "manifest.json"):
        if meta not in data:
            continue
        try:
            listed = parse_json(data[meta])
            listed = listed.get("files", listed) if isinstance(listed, dict) else None
        except ValueError:
            return f"{meta} is not valid JSON"
        if not isinstance(listed, dict):
            continue
        for name, want in listed.items():
            have = record.files.get(name)
            if isinstance(want, dict) and have and want.get("sha256") and want["sha256"] != have[1]:
                return f"{name} differs from its sha256 in {meta} (corrupt)"
    return None


def _summary(record: EntryRecord, size: int, pushed: str) -> bytes:
    return json.dumps({**record.key._asdict(), "arch": record.arch,  # the key ends with its relpath
                       "compiler": record.compiler, "platform": record.platform, "files": len(record.files),
                       "size": size, "pushed": pushed}, separators=(",", ":")).encode()


@dataclass
class _Outgoing:
    """One entry on its way: its record as stored, its data keys and values, and its publish."""

    record: EntryRecord
    items: dict[str, bytes]
    publish: Publish
    content_addressed: bool
    ttl: int | None


def _prepare(record: EntryRecord, data: dict[str, bytes], executable: tuple[str, ...], signer=None) -> _Outgoing:
    fmt = f.format_for(record.key.layout)
    rec, files = fmt.outgoing(record, data)
    pushed = iso(time.time()) or ""
    # no last use: a record is pushed once for every node to pull, and the remote keeps its own (last_pulled)
    rec = rec._replace(extra={**rec.extra, "executable": sorted(n for n in executable if n in rec.files),
                              "pushed": pushed, "kcache_version": __version__, "format": fmt.name}, last_used=None)
    items: dict[str, bytes] = {}
    for name, keys in fmt.data_keys(rec).items():
        items.update(zip(keys, f.split_pieces(files[name])))
    # Content-addressed data may expire until published; a tool's own keys (Triton's) get no time to
    # live, which a second pusher could put back on keys already published.
    ttl = PENDING_TTL if fmt.content_addressed else None
    size = rec.size
    layout = rec.key.layout
    doc = rec.to_json() if signer is None else signer.sign(rec.to_json())  # kcache_cli/util/signing.py
    publish = Publish(f.record_key(layout, rec.relpath), json.dumps(doc, separators=(",", ":")).encode(),
                      f.INDEX, f.entry_id(layout, rec.relpath), _summary(rec, size, pushed),
                      persist=tuple(items) if ttl else (), last=fmt.last(rec))
    return _Outgoing(rec, items, publish, fmt.content_addressed, ttl)


def publish_entries(store: Store, batch: list[_Outgoing]) -> list[bool]:
    """Upload a batch of entries (data first, in one round trip per kind), then publish each; for each,
    False when another pusher published it first (its data that the winner does not use is removed)."""
    for ttl, only_new in {(o.ttl, o.content_addressed) for o in batch}:
        group = [o for o in batch if (o.ttl, o.content_addressed) == (ttl, only_new)]
        store.put({k: v for o in group for k, v in o.items.items()}, ttl=ttl, only_new=only_new)
    won = store.publish_many([o.publish for o in batch])

    lost = [o for o, w in zip(batch, won) if not w and o.content_addressed]
    if lost:
        winners = store.get([o.publish.key for o in lost])
        for o, raw in zip(lost, winners):
            try:
                winner = unchecked_record(parse_json(raw if isinstance(raw, bytes) else b""))
                keep = {k for ks in f.format_for(o.record.key.layout).data_keys(winner).values() for k in ks}
            except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
                continue  # unreadable: leave everything; our data expires anyway
            store.delete([k for k in o.items if k not in keep])
    return won


def publish_entry(store: Store, record: EntryRecord, data: dict[str, bytes], executable: tuple[str, ...] = (),
                  signer=None) -> bool:
    """Upload one entry and publish it. False when another pusher published it first."""
    return publish_entries(store, [_prepare(record, data, executable, signer)])[0]


def _moved(record: EntryRecord, action: PushAction, done: bool, why: str | None) -> MovedEntry:
    return MovedEntry(record.key, len(record.files), record.size, action, done, why, record.arch)


def _leave_out_unnamable(plan) -> None:
    """Entries whose path is not UTF-8 (an op directory named in another encoding) cannot be named
    by a remote key: they are left out, one by one, and the rest of the cache still goes."""
    bad = []
    for e in plan.jobs:
        try:
            e.relpath.encode("utf-8")
        except UnicodeEncodeError:
            bad.append(e)
    for e in bad:
        plan.jobs.remove(e)
        plan.left.append((e, "its path is not UTF-8, which a remote key must be"))


BATCH_ENTRIES = 64  # entries uploaded and published per round trip
BATCH_BYTES = 32 << 20


def push(root: Path, store: Store, flt: ScanFilter | None = None, *, dry_run: bool = False,
         warn: Warn | None = None, start: Callable[[int], None] | None = None,
         advance: Callable[[int], None] | None = None) -> PushResult:
    """Push the complete entries `flt` selects that the remote does not hold (its index says)."""
    warn = warn or (lambda m: None)

    sign = node_signer()  # the node's key signs every record, when it has one
    plan = plan_export(root, flt or ScanFilter(), warn=warn)
    _leave_out_unnamable(plan)
    have = hash_fields(store, f.INDEX)
    if start:
        start(len(plan.jobs))
    out: list[MovedEntry] = []
    left_seen = len(plan.left)
    batch: list[tuple[_Outgoing, EntryRecord]] = []  # as it goes up, as export read it

    def flush() -> None:
        for (_, record), won in zip(batch, publish_entries(store, [o for o, _ in batch])):
            why = None if won else "pushed meanwhile by another node"
            out.append(_moved(record, PUSH if won else SKIP, won, why))
        batch.clear()

    for record, data, executable in entry_records(plan):
        eid = f.entry_id(record.key.layout, record.relpath)
        problem = own_manifest_problem(record, data)
        if problem:
            out.append(_moved(record, LEFT, False, problem))
        elif eid in have:
            out.append(_moved(record, SKIP, False, "the remote has it"))
        elif dry_run:
            out.append(_moved(record, PUSH, False, None))
        else:
            batch.append((_prepare(record, data, executable, sign), record))
            if len(batch) >= BATCH_ENTRIES or sum(len(v) for o, _ in batch for v in o.items.values()) > BATCH_BYTES:
                flush()
        if advance:
            advance(1 + len(plan.left) - left_seen)
            left_seen = len(plan.left)
    if batch:
        flush()
    for e, why in plan.left:
        out.append(MovedEntry(e.key, e.files, e.size, LEFT, False, why))
    out.sort(key=lambda e: e.relpath)
    return PushResult(store.url, str(root), dry_run, tuple(out))
