"""torch Mega-Cache blobs as kcache moves them: inspect and verify a blob, import it into a cache root
where torch's own `load_cache_artifacts()` would write each artifact, and export a root's artifacts as a
blob torch loads, with a signed sidecar manifest.

The blob's framing is kcache_cli/formats/megacache.py's; where each artifact type lands is its layout's
(`Layout.mega_place`, `Layout.mega_artifacts`). Nothing in a blob is ever unpickled: kcache checks the
framing, the CRC, each key against the shape torch gives it and each variant's name against the sha256 of
its bytes, then writes bytes. An import takes every check an archive import takes: no path out of the
root and no link followed (fswrite, held directory fds), a whole new entry published by one rename under
its lock (archive.importer's staging), the space and total limits, the other-layout rule, and, when a
trust list is set, a sidecar signed by a trusted key whose sha256 is the blob's."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from kcache_cli import __version__, layouts
from kcache_cli.archive.importer import ImportStaging, plan_records, publish_staged, remove_stale_staging
from kcache_cli.archive.importer import check_total, other_layout_problem
from kcache_cli.formats import megacache
from kcache_cli.fs import read as fsread
from kcache_cli.fs import write as fswrite
from kcache_cli.layouts.base import Layout, MegaPlace
from kcache_cli.util.errors import KcacheError
from kcache_cli.util.signing import signer, verifier

SIDECAR_SUFFIX = ".kcache.json"
SIDECAR_FORMAT = "kcache/torch-mega/1"
# What import did with each artifact: written (a new entry, a file of no entry), written into an entry there
# already (a guard variant joining its graph), present, refused.
IMPORTED, ADDED, PRESENT, REFUSED = "import", "add", "skip", "refuse"


def mega_layouts() -> dict[str, Layout]:
    """Artifact type -> the layout that holds it."""
    return {t: lay for lay in layouts.all_layouts().values() for t in lay.mega_types}


def read_blob(path: str) -> tuple[bytes, megacache.Blob]:
    """The bytes of the blob at `path` (a link to it followed: the user named it) and what they frame."""
    try:
        data = fsread.read_bytes(path, megacache.MAX_BLOB, follow=True)
    except fsread.TooLarge:
        raise KcacheError(f"{path}: over {megacache.MAX_BLOB} bytes, too large for a Mega-Cache blob") from None
    except OSError as exc:
        raise KcacheError(f"{path}: {exc.strerror or exc}") from None
    return data, megacache.parse(data, mega_layouts())


# ---- inspect and verify -------------------------------------------------------------------------

def describe(path: str) -> dict:
    """What `kcache inspect BLOB` and `verify BLOB` show: framing, CRC, groups, each artifact's type, key,
    size and sha256, and where torch's load would write it."""
    data, blob = read_blob(path)
    places = mega_layouts()
    shadowed = set(blob.shadowed())
    arts: list[dict] = []
    for a in blob.artifacts:
        lay = places.get(a.type)
        place = lay.mega_place(a.type, a.key, a.content) if lay else None
        arts.append({"type": a.type, "key": a.key, "size": len(a.content), "offset": a.offset,
                     "sha256": hashlib.sha256(a.content).hexdigest(), "group": a.group,
                     "loaded": a.group not in shadowed and blob.state == megacache.OK,
                     "relpath": f"{place.dir}/{place.name}" if isinstance(place, MegaPlace) else None,
                     "problem": place if isinstance(place, str) else None})
    problems = list(blob.problems)
    problems += [f"group {g} ({blob.groups[g][0]}) is shadowed: torch's load keeps only the last group of a "
                 "type, so its artifacts are never written" for g in sorted(shadowed)]
    problems += [f"artifact {a['key'][:60]!r} ({a['type']}): {a['problem']}" for a in arts if a["problem"]]
    return {"schema": "kcache/torch-mega-inspect/1", "path": os.path.abspath(path), "size": blob.size,
            "sha256": hashlib.sha256(data).hexdigest(),
            "crc32": {"stored": _hex(blob.crc_stored), "computed": _hex(blob.crc_computed), "ok": blob.crc_ok},
            "version": blob.version, "state": blob.state,
            "groups": [{"type": t, "count": n} for t, n in blob.groups],
            "artifacts": arts, "problems": problems, "ok": not problems}


def _hex(v: int | None) -> str | None:
    return None if v is None else f"{v:08x}"


# ---- import -------------------------------------------------------------------------------------

@dataclass
class MegaImported:
    """One artifact of a Mega-Cache blob and what import did with it."""

    type: str
    key: str
    relpath: str | None
    size: int
    action: str
    reason: str | None = None
    lock_timed_out: bool = False  # skipped: another process held its entry's lock past the timeout (exit 3)

    def to_json(self) -> dict:
        return {"type": self.type, "key": self.key, "relpath": self.relpath, "size": self.size,
                "action": self.action, "reason": self.reason}


@dataclass
class MegaImportResult:
    """What importing a torch Mega-Cache blob did, artifact by artifact."""

    root: str
    blob: str
    dry_run: bool
    artifacts: list[MegaImported] = field(default_factory=list)

    def count(self, action: str) -> int:
        return sum(a.action == action for a in self.artifacts)

    @property
    def lock_timeouts(self) -> int:
        """The entries skipped because another process (a build) held their lock past the timeout."""
        return len({a.relpath.rpartition("/")[0] for a in self.artifacts if a.lock_timed_out and a.relpath})

    def to_json(self) -> dict:
        return {"schema": "kcache/torch-mega-import/1", "root": self.root, "blob": self.blob,
                "dry_run": self.dry_run, "artifacts": [a.to_json() for a in self.artifacts],
                "imported": self.count(IMPORTED) + self.count(ADDED), "skipped": self.count(PRESENT),
                "lock_timeouts": self.lock_timeouts, "refused": self.count(REFUSED)}


def _check_signed(path: str, data: bytes) -> None:
    """With a trust list set, the blob must come with a sidecar a trusted key signed, naming its sha256."""
    check = verifier()
    if check is None:
        return
    side = path + SIDECAR_SUFFIX
    try:
        rec = fsread.parse_json(fsread.read_bytes(side, fsread.MAX_JSON, follow=True), side)
    except (OSError, ValueError) as exc:
        raise KcacheError(f"{path}: a trust list is set and its signed sidecar {side} cannot be read "
                          f"({getattr(exc, 'strerror', None) or exc})") from None
    why = check.problem(rec) if isinstance(rec, dict) else "not a JSON object"
    if why is None and rec.get("sha256") != hashlib.sha256(data).hexdigest():
        why = "it names another blob (sha256 differs)"
    if why:
        raise KcacheError(f"{path}: refused, its sidecar {side}: {why}")


def plan_import(root: Path, path: str) -> tuple[bytes, megacache.Blob, list[tuple[megacache.Artifact, Layout,
                                                                                 MegaPlace | str]]]:
    data, blob = read_blob(path)
    if blob.state != megacache.OK:
        raise KcacheError(f"{path}: {blob.state} Mega-Cache blob, torch loads nothing of it: {blob.problems[0]}")
    _check_signed(path, data)
    places = mega_layouts()
    planned = [(a, places[a.type], places[a.type].mega_place(a.type, a.key, a.content) or "no place")
               for a in blob.loaded()]

    why = other_layout_problem(root, {lay.name for _, lay, _ in planned}, "the blob holds")
    if why:
        raise KcacheError(why)
    return data, blob, planned


def import_blob(root: Path, path: str, *, dry_run: bool = False, lock_timeout: float = 60.0) -> MegaImportResult:
    """Write each artifact torch's load would write, where it would write it (see the module's doc)."""
    root = Path(os.path.realpath(root))
    _, _, planned = plan_import(root, path)
    out = MegaImportResult(str(root), os.path.abspath(path), dry_run)
    todo: list[tuple[megacache.Artifact, MegaPlace]] = []
    for a, _lay, place in planned:
        if isinstance(place, str):
            out.artifacts.append(MegaImported(a.type, a.key, None, len(a.content), REFUSED, place))
        else:
            todo.append((a, place))
    if dry_run or not todo:
        out.artifacts += [MegaImported(a.type, a.key, f"{p.dir}/{p.name}", len(a.content), _would(root, p))
                          for a, p in todo]
        return out
    check_total(root, sum(len(a.content) for a, _ in todo))
    try:  # a blob of autotune files alone: no entry's staging makes the root
        fswrite.make_dirs(root)
    except FileExistsError:
        pass
    new_entries = {p.dir for _, p in todo if p.entry_kind and not os.path.lexists(root / p.dir)}
    out.artifacts += _publish_entries(root, [(a, p) for a, p in todo if p.dir in new_entries], lock_timeout)
    for a, p in todo:
        if p.dir not in new_entries:
            out.artifacts.append(_add_file(root, a, p))
    return out


def _would(root: Path, p: MegaPlace) -> str:
    """What importing into `p` would do (a dry run's word, the real run's)."""
    if os.path.lexists(root / p.dir / p.name):
        return PRESENT
    return ADDED if p.entry_kind and os.path.lexists(root / p.dir) else IMPORTED


def _publish_entries(root: Path, items: list[tuple[megacache.Artifact, MegaPlace]],
                     lock_timeout: float) -> list[MegaImported]:
    """New fx graph / AOTAutograd entries: staged whole, checked by import's rules, published by one rename."""
    if not items:
        return []
    # the same artifact twice in a blob (its variant is named by its content: the same file) is one file
    items = list({(p.dir, p.name): (a, p) for a, p in items}.values())
    by_dir: dict[str, list[tuple[megacache.Artifact, MegaPlace]]] = {}
    for a, p in items:
        by_dir.setdefault(p.dir, []).append((a, p))
    records = [_record(root, d, its) for d, its in sorted(by_dir.items())]
    planned, refused = plan_records(root, records)
    out = [MegaImported(its[0][0].type, its[0][0].key, d, sum(len(a.content) for a, _ in its), REFUSED, why)
           for i, why in refused for d, its in [(records[i]["relpath"], by_dir[records[i]["relpath"]])]]
    staging = ImportStaging(root)
    made: set[str] = set()
    try:
        for pe in planned:
            its = by_dir[pe.relpath]
            for a, place in its:
                staging.ensure_dir(pe.relpath)
                staging.write(f"{pe.relpath}/{place.name}", a.content, 0o644)
            done, why, locked = publish_staged(root, pe, staging, lock_timeout, None, made) if pe.write else \
                (False, pe.reason, False)
            out += [MegaImported(a.type, a.key, f"{place.dir}/{place.name}", len(a.content),
                                 IMPORTED if done else PRESENT, why, locked) for a, place in its]
    finally:
        staging.cleanup()
    remove_stale_staging(root)
    return out


def _record(root: Path, rel: str, items: list[tuple[megacache.Artifact, MegaPlace]]) -> dict:
    lay = mega_layouts()[items[0][0].type]
    files = {p.name: [len(a.content), hashlib.sha256(a.content).hexdigest()] for a, p in items}
    return {"layout": lay.name, "kind": items[0][1].entry_kind, "target": None, "space": None, "op": None,
            "hash": rel.rsplit("/", 1)[-1], "relpath": rel, "status": None, "files": files, "links": {},
            "dirs": [], "locks": []}


def _add_file(root: Path, a: megacache.Artifact, p: MegaPlace) -> MegaImported:
    """One file into an existing entry (another guard variant), or a file torch keeps outside entries
    (autotune, PGO): written as torch writes it (`.<pid>.<tid>.tmp`, then renamed), never over a file
    present, through directory fds held from the root (no link followed, no '..')."""
    rel = f"{p.dir}/{p.name}"
    root_fd = fswrite.open_root(root)
    try:
        dfd = fswrite.open_dir(root_fd, p.dir, create=True)
    except OSError as exc:
        os.close(root_fd)
        return MegaImported(a.type, a.key, rel, len(a.content), REFUSED, f"{p.dir}: {exc.strerror or exc}")
    try:
        if fswrite.lexists_at(dfd, p.name):
            return MegaImported(a.type, a.key, rel, len(a.content), PRESENT, "present")
        tmp = f".{os.getpid()}.{threading.get_ident()}.tmp"
        fswrite.write_file(dfd, tmp, a.content, 0o644, give=True)  # root's in a user's cache: the user's
        try:
            fswrite.rename_noreplace_at(dfd, tmp, dfd, p.name)
        except FileExistsError:
            return MegaImported(a.type, a.key, rel, len(a.content), PRESENT, "present (written meanwhile)")
        finally:
            fswrite.unlink_at(dfd, tmp)
        return MegaImported(a.type, a.key, rel, len(a.content), ADDED if p.entry_kind else IMPORTED)
    finally:
        os.close(dfd)
        os.close(root_fd)


# ---- export -------------------------------------------------------------------------------------

@dataclass
class MegaExportResult:
    """The Mega-Cache blob written, its sidecar manifest and size."""

    out: str
    sidecar: str
    size: int
    manifest: dict

    def to_json(self) -> dict:
        return {"schema": "kcache/torch-mega-export/1", "out": self.out, "sidecar": self.sidecar, "size": self.size,
                "artifacts": self.manifest["artifacts"], "signed": "signature" in self.manifest}


def export_blob(root: Path, out: str, facts: dict | None = None) -> MegaExportResult:
    """A blob of every whole fx graph variant, AOTAutograd entry and autotune record under `root`, in the
    order torch saves them, and beside it `<out>.kcache.json`: torch version and device where `facts`
    gives them, each artifact's type, key, size and sha256, the blob's sha256, kcache's signature."""
    root = Path(os.path.realpath(root))
    items: list[tuple[str, str, bytes]] = []
    for lay in {id(v): v for v in mega_layouts().values()}.values():
        for f in lay.mega_artifacts(root):
            items.append((f.type, f.key, _read_below(root, f.relpath)))
    if not items:
        raise KcacheError(f"{root} holds no fx graph, AOTAutograd entry or autotune record to export")
    data = megacache.build(items)
    manifest: dict = {"format": SIDECAR_FORMAT, **(facts or {}), "size": len(data),
                      "sha256": hashlib.sha256(data).hexdigest(),
                      "artifacts": [{"type": t, "key": k, "size": len(c), "sha256": hashlib.sha256(c).hexdigest()}
                                    for t, k, c in items]}

    manifest["kcache_version"] = __version__
    sign = signer()
    if sign is not None:
        manifest = sign.sign(manifest)
    _write_out(out, data)
    _write_out(out + SIDECAR_SUFFIX, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    return MegaExportResult(os.path.abspath(out), os.path.abspath(out + SIDECAR_SUFFIX), len(data), manifest)


def _read_below(root: Path, relpath: str) -> bytes:
    """The bytes of `relpath` below `root`, no link followed on the way (a member may swap a shard directory
    for a link between the listing and this read): KcacheError naming it when it cannot be read."""
    try:
        return fsread.read_bytes(str(root / relpath), megacache.MAX_BLOB, base=str(root))
    except OSError as exc:
        raise KcacheError(f"cannot read {root / relpath}: {exc.strerror or exc}; nothing exported") from None


def _write_out(path: str, data: bytes) -> None:
    """The user's output file, replaced atomically in its directory (held open)."""
    head = os.path.dirname(os.path.abspath(path))
    dfd = fswrite.open_root(head)
    try:
        fswrite.replace_file(dfd, os.path.basename(path), data)
    finally:
        os.close(dfd)
