"""kcache pull: fetch entries missing here, with every check `import` makes, each published with one rename.

The records come first (by the index, or by key for a known entry); each is judged by import's rules
(archive.plan_records: names, sizes, links, where the layout keeps entries, what is present here);
then the data of a batch of entries arrives in one round trip, every file's size and sha256 is
checked against the record, the entry is written into import's staging directory and published
with import's rename under its lock. A bad entry is refused with a one-line reason; the others
still arrive. A remote that fails midway stops the pull: what was published is whole, the rest
was only staged and is removed."""

from __future__ import annotations

import errno
import hashlib
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Final

from kcache_cli.archive.importer import (
    ImportStaging,
    check_total,
    is_provider,
    other_layout_problem,
    plan_records,
    publish_staged,
    remove_stale_staging,
)
from kcache_cli.archive.manifest import ImportLimits, is_lock_name, path_problem
from kcache_cli.fs.read import parse_json
from kcache_cli.model.records import ScanFilter, Warn
from kcache_cli.model.terms import LAYOUT_NAMES, PullAction, unknown_layout
from kcache_cli.remote import formats as f
from kcache_cli.remote.manage import remote_entry, scan_index
from kcache_cli.remote.moved import MovedEntry, MoveResult, named
from kcache_cli.remote.store import MAX_RECORD, NotAValue, Store, Value
from kcache_cli.util.errors import KcacheError
from kcache_cli.util.signing import verifier
from kcache_cli.util.units import plural

if TYPE_CHECKING:
    from kcache_cli.archive.manifest import EntryRecord

PULL: Final = "pull"
REPLACE: Final = "replace"
SKIP: Final = "skip"
REFUSE: Final = "refuse"
BATCH_BYTES = 64 << 20  # data fetched in one round trip
BATCH_ENTRIES = 256


class PullResult(MoveResult):
    @property
    def size(self) -> int:
        """What arrived (in a dry run: what would arrive)."""
        if self.dry_run:
            return sum(e.size for e in self.entries if e.action in (PULL, REPLACE))
        return sum(e.size for e in self.entries if e.done)

    @property
    def lock_timeouts(self) -> int:
        """Of the skipped entries, those whose lock another process held past the timeout (exit 3, as import's)."""
        return sum(1 for e in self.entries if e.lock_timed_out)

    def to_json(self) -> dict[str, object]:
        """`pull --json`."""
        return self._json({"pulled": self.count(PULL, REPLACE), "skipped": self.count(SKIP),
                           "lock_timeouts": self.lock_timeouts, "refused": self.count(REFUSE)}, self.size)


def summary_matches(flt: ScanFilter, s: dict) -> bool:
    """Whether a remote entry (its index summary or record) is one `flt` selects: the very test `ls`
    applies (ScanFilter.matches: globs, a bare level, hash prefixes, paths)."""
    return flt.matches(remote_entry(str(s.get("layout")), str(s.get("relpath") or ""), s, times=False))


def read_records(store: Store, ids: Iterable[tuple[str, str]]) -> tuple[list[dict], list[tuple[str, str]]]:
    """The records of (layout, relpath) entries: (records, [(relpath, why unreadable)]). Entries
    whose record is gone (pruned meanwhile) are left out; a key of another type (a Redis set) is
    unreadable; each record is read once, and only when it is within MAX_RECORD bytes."""
    ids = list(dict.fromkeys(ids))
    raw = store.get([f.record_key(layout, rel) for layout, rel in ids], MAX_RECORD)
    records, bad = [], []
    for (layout, rel), value in zip(ids, raw):
        if value is None:
            continue
        if isinstance(value, NotAValue):
            bad.append((rel, f"its record on the remote is {value.what}, not a value"))
            continue
        if isinstance(value, int):
            bad.append((rel, f"its record on the remote is {value} bytes, over the limit of {MAX_RECORD}"))
            continue
        try:
            rec = parse_json(value)
            if not isinstance(rec, dict) or (rec.get("layout"), rec.get("relpath")) != (layout, rel):
                raise ValueError
        except (ValueError, UnicodeDecodeError):
            bad.append((rel, "its record on the remote is not a kcache record for this key"))
            continue
        records.append(rec)
    return records, bad


def select(store: Store, flt: ScanFilter) -> list[tuple[str, str]]:
    """(layout, relpath) of the remote entries `flt` selects, from the index only."""
    return sorted(((e.layout, e.relpath) for batch in scan_index(store, flt, pulled=False) for e in batch),
                  key=lambda x: x[1])


def _moved(r: EntryRecord, action: PullAction, done: bool, reason: str | None, locked: bool = False) -> MovedEntry:
    """A checked record's line in the result; `locked`: skipped, its lock held past the timeout."""
    return MovedEntry(r.key, len(r.files), r.size, action, done, reason, r.arch, locked)


def _unchecked(rec: dict, action: PullAction, done: bool, reason: str | None) -> MovedEntry:
    """The line of a record as the remote gave it (refused, turned down, or of an unknown layout)."""
    files = rec["files"] if isinstance(rec.get("files"), dict) else {}
    size = sum(int(v[0]) for v in files.values() if isinstance(v, list) and v and isinstance(v[0], int))
    return MovedEntry(named(str(rec.get("layout")), str(rec.get("kind")), str(rec.get("relpath"))), len(files), size,
                      action, done, reason, rec.get("arch") if isinstance(rec.get("arch"), str) else None)


def piece_limits(size: int, n: int) -> list[int]:
    """The size each of a file's `n` pieces must have: all CHUNK bytes but the last (one piece: all)."""
    return [size] if n == 1 else [f.CHUNK] * (n - 1) + [size - f.CHUNK * (n - 1)]


def verify_files(rec: EntryRecord, keys: dict[str, list[str]], values: dict[str, Value]
                 ) -> tuple[dict, str | None]:
    """{name: bytes} of one entry, each checked against the record's size and sha256; or a reason."""
    out = {}
    for name, (size, digest) in rec.files.items():
        got = [values.get(k) for k in keys[name]]
        if any(v is None for v in got):
            return {}, f"{name} is missing on the remote (pruned or expired?)"
        junk = [v for v in got if isinstance(v, NotAValue)]
        if junk:
            return {}, f"{name} is {junk[0].what} on the remote, not a value"
        over = [v for v in got if isinstance(v, int)]
        if over:  # a piece holds more than the record says: never fetched
            return {}, f"{name} has a piece of {over[0]} bytes on the remote, its record says {size} in all"
        data = got[0] if len(got) == 1 else b"".join(got)  # type: ignore[arg-type]
        if len(data) != size:  # type: ignore[arg-type]
            return {}, f"{name} is {len(data)} bytes on the remote, its record says {size}"  # type: ignore[arg-type]
        if hashlib.sha256(data).hexdigest() != digest:  # type: ignore[arg-type]
            return {}, f"{name}: its sha256 differs from the pushed record (damaged or tampered with)"
        out[name] = data
    return out, None


def _extra_problem(rec: EntryRecord, extra: dict[str, bytes]) -> str | None:
    """Files a layout makes for this machine (Triton's group file) are named by the record too: the
    same rules as its files, at the top of the entry, and no clash with them."""
    for name in extra:
        bad = path_problem(name, "file name")
        if bad or "/" in name or name in rec.files or name in rec.links or is_lock_name(name):
            return bad or f"{name!r} cannot be written at the top of the entry"
    return None


def _stage(staging, rec: EntryRecord, files: dict[str, bytes], extra: dict[str, bytes]) -> None:
    """Write one verified entry under the staging directory, through its held descriptors (fswrite:
    no link followed, nothing replaced)."""
    rel = rec.relpath
    names = rec.extra.get("executable")  # the pusher's list of executable files
    executable = set(names) if isinstance(names, list) else set()
    staging.ensure_dir(rel)
    for name, data in (*files.items(), *extra.items()):
        staging.ensure_dir(f"{rel}/{name}".rpartition("/")[0])
        staging.write(f"{rel}/{name}", data, 0o755 if name in executable else 0o644)
    for name, target in rec.links.items():
        staging.ensure_dir(f"{rel}/{name}".rpartition("/")[0])
        staging.symlink(f"{rel}/{name}", target)


def _batches(planned: list) -> Iterable[list]:
    batch: list = []
    size = 0
    for p in planned:
        if batch and (size + p.size > BATCH_BYTES or len(batch) >= BATCH_ENTRIES):
            yield batch
            batch, size = [], 0
        batch.append(p)
        size += p.size
    if batch:
        yield batch


def pull(root: Path, store: Store, flt: ScanFilter | None = None, *, ids: Iterable[tuple[str, str]] | None = None,
         dry_run: bool = False, lock_timeout: float = 60.0, accept: Callable[[dict], str | None] | None = None,
         warn: Warn | None = None, start: Callable[[int], None] | None = None,
         advance: Callable[[int], None] | None = None) -> PullResult:
    """Pull the remote entries `flt` selects (or exactly `ids`, (layout, relpath) pairs, read by key
    without the index). `accept(record)` may turn an entry down with a reason (build: another arch)."""
    warn = warn or (lambda m: None)
    flt = flt or ScanFilter()
    root = Path(os.path.realpath(root))
    records, unreadable = read_records(store, select(store, flt) if ids is None else ids)
    foreign = _foreign(store, flt, records) if ids is None else {}
    out = [MovedEntry(named("?", "?", rel), 0, 0, REFUSE, False, why) for rel, why in unreadable]
    records = _trusted(records, out)
    records = _well_typed(records, out)
    unknown = [r for r in records if r.get("layout") not in LAYOUT_NAMES]
    out += [_unchecked(r, SKIP, False, f"{unknown_layout(r.get('layout'))}: this kcache does not know it")
            for r in unknown]
    records = [r for r in records if r.get("layout") in LAYOUT_NAMES]
    mixed = other_layout_problem(root, {str(r["layout"]) for r in records}, "the selected remote entries include",
                                 "select with --layout or pull them")
    if mixed:
        raise KcacheError(mixed)
    if accept is not None:
        kept = []
        for rec in records:
            why = accept(rec)
            (out.append(_unchecked(rec, SKIP, False, why)) if why else kept.append(rec))
        records = kept
    targets = [r["relpath"] for r in records if is_provider(r.get("layout"), r.get("kind"))]
    planned, refused = plan_records(root, records, ImportLimits(), targets)
    out += [_unchecked(records[i], REFUSE, False, why) for i, why in refused]
    out += [_moved(p.record, SKIP, False, p.reason) for p in planned if not p.write]
    # entries others use first (a tilus program before the scripts that link to it)
    todo = sorted((p for p in planned if p.write), key=lambda p: not is_provider(p.layout, p.kind))
    if start:
        start(len(todo))
    if todo and not dry_run:
        check_total(root, sum(p.size for p in todo))
    if dry_run or not todo:
        out += [_moved(p.record, PULL if p.action == "import" else REPLACE, False, p.reason) for p in todo]
        return PullResult(store.url, str(root), dry_run, tuple(sorted(out, key=lambda e: e.relpath)))
    out += _fetch_and_publish(root, store, todo, foreign, lock_timeout, warn, advance)
    return PullResult(store.url, str(root), dry_run, tuple(sorted(out, key=lambda e: e.relpath)))


def _well_typed(records: list[dict], out: list[MovedEntry]) -> list[dict]:
    """The records whose fields pull uses besides import's (its format's: "executable", Triton's "groups")
    have the types pull reads; the others are refused, one line each."""
    kept = []
    for rec in records:
        why = f.format_for(str(rec.get("layout"))).record_problem(rec)
        if why:
            out.append(_unchecked(rec, REFUSE, False, why))
        else:
            kept.append(rec)
    return kept


def _trusted(records: list[dict], out: list[MovedEntry]) -> list[dict]:
    """With a trust list set (kcache_cli/util/signing.py), the records a listed key signed; the others are
    refused, one line each."""
    check = verifier()
    if check is None:
        return records
    kept = []
    for rec in records:
        why = check.problem(rec)
        (out.append(_unchecked(rec, REFUSE, False, why)) if why else kept.append(rec))
    return kept


def _foreign(store: Store, flt: ScanFilter, records: list[dict]) -> dict[str, dict[str, bytes]]:
    """Entries another tool pushed in its own format (Triton) that `flt` selects, added to `records`;
    returns their files by relpath. Only the selected ones are fetched."""
    known = {(r["layout"], r["relpath"]) for r in records}

    def wanted(rec: dict) -> bool:
        return (rec["layout"], rec["relpath"]) not in known and summary_matches(flt, rec)

    foreign: dict[str, dict[str, bytes]] = {}
    for fmt in f.foreign_formats():
        for rec, data in fmt.foreign(store, wanted):
            records.append(rec)
            foreign[rec["relpath"]] = data
    return foreign


def _fetch(store: Store, batch: list, foreign: dict) -> tuple[dict, dict]:
    """The data of a batch of entries, in one round trip: ({relpath: {name: keys}}, {key: value}).
    Each key is fetched once however many files name it, and only when it holds no more bytes than
    the record says (else its size comes back instead)."""
    keys = {p.relpath: f.format_for(p.layout).data_keys(p.record) for p in batch}
    limits: dict[str, int] = {}
    for p in batch:
        if p.relpath not in foreign:
            for name, ks in keys[p.relpath].items():
                for k, n in zip(ks, piece_limits(p.record.files[name][0], len(ks))):
                    limits[k] = max(n, limits.get(k, 0))
    wanted = list(limits)
    values: dict[str, Value] = dict(zip(wanted, store.get(wanted, [limits[k] for k in wanted])))
    for p in batch:
        if p.relpath in foreign:  # fetched already, with its group file
            values.update({ks[0]: foreign[p.relpath].get(n) for n, ks in keys[p.relpath].items()})
    return keys, values


def _fetch_and_publish(root: Path, store: Store, todo: list, foreign: dict, lock_timeout: float, warn: Warn,
                       advance: Callable[[int], None] | None) -> list[MovedEntry]:
    """Verify, stage and publish batch after batch; the next batch's data is on its way meanwhile."""
    out: list[MovedEntry] = []
    staging = ImportStaging(root)
    made: set[str] = set()
    batches = list(_batches(todo))
    pool = ThreadPoolExecutor(max_workers=1)
    pulled: dict[str, bytes] = {}
    try:
        coming = pool.submit(_fetch, store, batches[0], foreign) if batches else None
        for i, batch in enumerate(batches):
            keys, values = coming.result()  # type: ignore[union-attr]
            coming = pool.submit(_fetch, store, batches[i + 1], foreign) if i + 1 < len(batches) else None
            pulled = {}
            for p in batch:
                rec = p.record
                files, why = verify_files(rec, keys[p.relpath], values)
                extra = f.format_for(p.layout).local_files(rec, os.path.join(root, p.relpath)) if why is None else {}
                why = why or _extra_problem(rec, extra)
                if why is None:
                    _stage(staging, rec, files, extra)
                    done, why, locked = publish_staged(root, p, staging, lock_timeout, warn, made)
                    if done:
                        pulled[f.entry_id(p.layout, p.relpath)] = str(time.time()).encode()
                    action: PullAction = (PULL if p.action == "import" else REPLACE) if done else SKIP
                    out.append(_moved(rec, action, done, why if not done else p.reason, locked))
                else:
                    out.append(_moved(rec, REFUSE, False, why))
                if advance:
                    advance(1)
            store.hash_set(f.PULLED, pulled)  # stores are thread-safe: Redis takes a second connection
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        try:  # those of the batch published before the disk filled (a file:// store may share that disk)
            store.hash_set(f.PULLED, pulled)
        except (OSError, KcacheError):
            pass
        published = sum(m.done for m in out)
        raise KcacheError(f"{exc.strerror} in {root}: pulled {published} of {plural(len(todo), 'entry')} before it "
                          "filled (each whole), the others are not here; free space and pull again (what is here is "
                          "skipped)") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        staging.cleanup()
    remove_stale_staging(root)
    return out
