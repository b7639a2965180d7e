"""push, pull, remote ls | stats | prune for an OCI registry (oci://HOST/REPO:TAG): a cache as one image
per tag in MCV's compat layout (oci_image), the registry kept to a budget by deleting tags' manifests.

push: the selected complete entries are exported (export's judgement, records and signatures), the
export becomes the image's layer, the config carries MCV's labels, and the manifest is put under the
tag. pull: the image's manifest and config are read first (sizes bounded, digests checked); the node's
GPUs are checked against the image's targets before anything is written; the layer (its size from
the manifest, its digest checked) becomes a kcache archive without the entries of other archs, and
`import` takes it with every check it makes."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, NamedTuple, cast

from kcache_cli import layouts
from kcache_cli.archive.export import (
    EmptyExport,
    ExportedEntry,
    archive_time,
    entry_records,
    export_archive,
    plan_export,
)
from kcache_cli.archive.importer import ImportResult, import_archive
from kcache_cli.archive.manifest import ImportLimits
from kcache_cli.formats.gpu import local_compute_caps
from kcache_cli.layouts.image_format import CPU
from kcache_cli.model.records import ScanFilter, Warn, iso
from kcache_cli.model.terms import Status
from kcache_cli.remote import oci_image as img
from kcache_cli.remote.oci import DEFAULT_TAG, DIGEST, INDEX_TYPES, MANIFEST_TYPES, MAX_CONFIG, OciRef, Registry
from kcache_cli.remote.pull import summary_matches
from kcache_cli.remote.store import RemoteError
from kcache_cli.util.errors import KcacheError, UsageError
from kcache_cli.util.signing import signer
from kcache_cli.util.units import format_size, is_digits

OTHER_ARCH = "built for"  # how the reason of an entry left out for its arch starts


def _tag(ref: OciRef) -> str:
    return ref.tag or DEFAULT_TAG


# ---- push ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ImagePushResult:
    """What pushing a cache image did: the image, its digest, the entries in its layer."""

    remote: str  # the image, oci://host/repo:tag
    root: str
    dry_run: bool
    digest: str | None  # the manifest's (None in a dry run)
    layout: str
    entries: tuple  # ExportedEntry
    left: tuple  # (Entry, why)
    size: int  # bytes of the entries' files
    layer_size: int  # bytes of the compressed layer
    labels: dict[str, str]
    planned: int  # entries that go (would go, in a dry run, as `pushed` counts then: file:// push's way)

    def to_json(self) -> dict[str, object]:
        return {"remote": self.remote, "root": self.root, "dry_run": self.dry_run, "digest": self.digest,
                "layout": self.layout, "planned": self.planned, "pushed": len(self.entries),  # a dry run's: would
                "left_out": len(self.left), "size": self.size,
                "layer_size": self.layer_size, "labels": [{"name": k, "value": v} for k, v in self.labels.items()],
                "entries": [{"layout": e.layout, "kind": e.kind, "relpath": e.relpath, "file_count": e.files,
                             "size": e.size, "arch": e.arch} for e in self.entries],
                "left": [{"relpath": e.relpath, "reason": why} for e, why in self.left]}


def _one_layout(plan) -> str:
    """The one layout of the selection (its entries that go, else those left out: export then says why
    none fits); none selected is what every command says of an empty selection."""
    layouts = sorted({j.layout for j in plan.jobs} or {e.layout for e, _ in plan.left})
    if not layouts:
        raise UsageError(f"no entries in {plan.root} match the selection: nothing to push, no image written")
    if len(layouts) != 1:
        raise UsageError(f"an image holds one layout, the selection has {', '.join(layouts)}: "
                         "select one with --layout")
    return layouts[0]


def push_image(root: Path, reg: Registry, flt: ScanFilter | None = None, *, dry_run: bool = False,
               warn: Warn | None = None) -> ImagePushResult:
    """Push the complete entries `flt` selects as one image under the remote's tag (module doc)."""
    if reg.ref.digest:
        raise UsageError(f"remote {reg.ref.url}: push puts an image under a tag, and its digest comes from its "
                         f"bytes: name a tag, not a digest (--remote {reg.ref._replace(digest=None).url})")
    warn = warn or (lambda m: None)
    made = archive_time()  # export's rule (SOURCE_DATE_EPOCH), checked before anything is read or sent
    plan = plan_export(root, flt or ScanFilter(), warn=warn)
    layout = _one_layout(plan)
    ref = reg.ref.with_tag(_tag(reg.ref))
    if dry_run:  # the entries as the export into the layer would read and judge them, their files' bytes
        entries = tuple(_would_export(plan))
        return ImagePushResult(ref.url, str(root), True, None, layout, entries, tuple(plan.left),
                               sum(e.size for e in entries), 0, {}, len(entries))
    reg.ping()
    with tempfile.TemporaryDirectory(prefix="kcache-oci-") as tmp:
        try:
            exported = export_archive(plan, os.path.join(tmp, "export.tar"), warn=warn)
        except EmptyExport as exc:
            raise KcacheError(str(exc)) from None
        with open(exported.archive, "rb") as src, tempfile.TemporaryFile(prefix="kcache-layer-") as layer:
            fmt = img.image_format(layout)
            facts = img.write_layer(src, layer, fmt)
            labels = img.labels(fmt, facts, ref.repo.rpartition("/")[2])
            config = img.config_json(labels, facts.diff_id, made)
            config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
            reg.put_blob(facts.digest, facts.size, layer)
        reg.put_blob(config_digest, len(config), config)
    manifest = img.manifest_json((config_digest, len(config)), (facts.digest, facts.size), _annotations(fmt, made))
    digest = reg.put_manifest(_tag(ref), manifest, img.OCI_MANIFEST)
    return ImagePushResult(ref.url, str(root), False, digest, layout, exported.entries, exported.left_out,
                           exported.size, facts.size, labels, len(exported.entries))


def _would_export(plan) -> Iterator[ExportedEntry]:
    """The entries export_archive would write for `plan` (read and judged as it does, none written); those
    it would leave out are in `plan.left` afterwards."""
    for record, _, _ in entry_records(plan):
        yield ExportedEntry(record.key, cast(Status, record.status), len(record.files), record.size, record.compiler,
                            record.arch, record.platform, record.omitted or ())


def _annotations(fmt: img.ImageFormat, made: float) -> dict[str, str]:
    """The manifest's annotations: MCV's variant, when it was made (archive_time), and the key that signed the
    records (when one did)."""
    out = {f"{fmt.label_prefix}variant": "compat", "org.opencontainers.image.created":
           time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(made))}
    sign = signer()
    if sign is not None:
        out[img.ANNOTATION_SIGNER] = sign.sign({})["signature"]["key"]
    return out


# ---- reading an image ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Image:
    """An image's manifest and config, read and checked (no layer yet)."""

    ref: OciRef
    digest: str
    layer: tuple[str, int]  # digest, size
    size: int  # config + layer, compressed: what it costs the registry
    labels: dict[str, str]
    created: float | None
    layout: str | None  # kcache's label; None: an image kcache did not push

    def _format(self) -> img.ImageFormat | None:
        return _known_format(self.layout)

    @property
    def targets(self) -> list[str]:
        fmt = self._format()
        return img.summary_targets(self.labels, fmt) if fmt else []

    @property
    def entry_count(self) -> int | None:
        fmt = self._format()
        text = self.labels.get(fmt.label_prefix + "entry-count", "") if fmt else ""
        return int(text) if is_digits(text) else None

    def target_counts(self, target: str) -> tuple[int, int] | None:
        """(entries, their files' bytes) of one of its targets: from kcache's per-target label, or, for an
        image of one target, its entry count and cache size; None when the labels cannot tell."""
        tally = img.read_tally(self.labels)
        if tally is not None:
            return tally.get(target)
        fmt = self._format()
        size = self.labels.get(fmt.label_prefix + "cache-size-bytes", "") if fmt else ""
        if self.targets == [target] and self.entry_count is not None and is_digits(size):
            return self.entry_count, int(size)
        return None

    def to_json(self) -> dict[str, object]:
        """An image of `remote ls --json`."""
        created = iso(self.created) if self.created is not None else None  # the epoch (SOURCE_DATE_EPOCH=0) is a time
        return {"tag": self.ref.tag, "digest": self.digest, "layout": self.layout, "entry_count": self.entry_count,
                "size": self.size, "targets": self.targets, "created": created}


def _known_format(layout: str | None) -> img.ImageFormat | None:
    """The image shape of a layout this kcache knows (None for another, or no layout label)."""
    return layouts.get(layout).image_format() if layout in layouts.NAMES else None


def _descriptor(d: object, what: str, url: str) -> tuple[str, int, str]:
    if not isinstance(d, dict) or not isinstance(d.get("digest"), str) or not DIGEST.match(d["digest"]) \
            or type(d.get("size")) is not int or d["size"] < 0:
        raise RemoteError(f"remote {url}: its manifest's {what} is not a descriptor kcache reads")
    return d["digest"], d["size"], str(d.get("mediaType") or "")


def read_image(reg: Registry, reference: str) -> Image:
    """The image a tag or digest names: its manifest (one compat layer; asked by digest, it must have that
    digest), its config's labels and creation time."""
    raw, _, digest = reg.get_manifest(reference)
    ref = reg.ref.with_reference(reference)
    try:
        doc = json.loads(raw)
    except ValueError:
        raise RemoteError(f"remote {ref.url}: its manifest is not JSON") from None
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list) or len(layers) != 1:
        raise RemoteError(f"remote {ref.url}: an image of {len(layers) if isinstance(layers, list) else 'no'} "
                          "layers, not the one layer of a cache image")
    layer = _descriptor(layers[0], "layer", ref.url)
    if layer[2] not in img.LAYER_TYPES:
        raise RemoteError(f"remote {ref.url}: its layer is {layer[2][:80]!r}, not a compat gzip tar layer")
    config = _descriptor(doc.get("config"), "config", ref.url)
    try:
        conf = json.loads(reg.get_blob(config[0], config[1], MAX_CONFIG))
        labels = (conf.get("config") or {}).get("Labels") or {}
    except (ValueError, AttributeError):
        raise RemoteError(f"remote {ref.url}: its config is not an image config") from None
    labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
    layout = labels.get(img.LABEL_LAYOUT)
    fmt = _known_format(layout)
    bad = img.label_problem(labels, fmt) if fmt else None
    if bad:
        raise RemoteError(f"remote {ref.url}: {bad}")
    return Image(ref, digest, layer[:2], layer[1] + config[1], labels, _epoch(conf.get("created")), layout)


def _epoch(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# ---- pull ---------------------------------------------------------------------------------------

NO_GPU = "no GPU found here (nvidia-smi): name this node's with --gpu ARCH (sm_90a), or pull without the check " \
    "with --no-gpu-check"


def node_archs(gpu: str | None, no_check: bool) -> list[str] | None:
    """The arch words of this node: --gpu (sm_80, gfx90a; several with commas), else nvidia-smi's GPUs
    ([] when it finds none: the preflight then asks whether the image needs one); None with --no-gpu-check."""
    if gpu:
        return [a.strip() for a in gpu.split(",") if a.strip()]
    if no_check:
        return None
    return sorted({f"sm_{a}{b}" for a, b in local_compute_caps() or ()})


def needs_gpu(targets: list[str]) -> bool:
    """Whether code for these targets needs a GPU: any but a CPU target. An image whose summary names none
    (its entries record no arch: an Inductor graph, a vLLM compile) has nothing to check a GPU against."""
    return any(t != CPU for t in targets)


def _needs_gpu(rec: dict) -> bool:
    """Whether one entry record is GPU code: a target other than the CPU, or a GPU arch."""
    return rec.get("target") not in (None, CPU) or rec.get("arch") not in (None, "", CPU)


def preflight(image: Image, node: list[str] | None, flt: ScanFilter | None = None) -> None:
    """Refuse an image none of whose targets runs on the node, before anything is written. On a node
    without a GPU (`node` []) an image that needs one is refused (a usage error: --gpu or --no-gpu-check),
    unless selectors may pick only its CPU entries (each is checked as the layer is read)."""
    if image.layout is None:
        raise KcacheError(_not_ours(image, "kcache pulls only images whose files its manifest lists with their "
                                           "sha256"))
    targets = image.targets
    if node == [] and needs_gpu(targets) and (flt is None or flt.takes_all()):
        raise UsageError(NO_GPU)
    if not node or not targets:
        return
    if not any(layouts.get(image.layout).runs_on(t, node) for t in targets):
        raise KcacheError(f"{image.ref.url} is built for {', '.join(targets)}; this node runs {', '.join(node)}: "
                          "nothing in it would load here (nothing written)")


def _not_ours(image: Image, why: str) -> str:
    """That `image` is not one kcache pushed, and `why` that matters to the command asking."""
    return f"{image.ref.url} is not an image kcache pushed (no {img.LABEL_LAYOUT} label); {why}"


class SkippedEntry(NamedTuple):
    """An entry of the image a pull left out, with why (its record's words, for the table)."""

    relpath: str
    arch: str | None
    why: str
    layout: str | None = None
    kind: str | None = None
    space: str | None = None
    op: str | None = None
    hash: str | None = None

    @classmethod
    def of(cls, rec: dict, why: str) -> SkippedEntry:
        words = [v if isinstance(v := rec.get(k), str) else None
                 for k in ("arch", "layout", "kind", "space", "op", "hash")]
        return cls(rec["relpath"], words[0], why, *words[1:])


def pull_action(action: str) -> str:
    """A pull's word for what import did with an entry: `pull` / `replace` / `skip`, as every pull says
    (docs/remote.md), not import's `import`."""
    return "pull" if action == "import" else action


@dataclass(frozen=True)
class ImagePullResult:
    """What pulling a cache image did: its digest and the import of its layer."""

    remote: str
    digest: str
    node: tuple[str, ...] | None
    imported: ImportResult
    skipped: tuple[SkippedEntry, ...] = field(default=())

    @property
    def other_arch(self) -> int:
        """Entries left out because this node cannot run their arch."""
        return sum(1 for s in self.skipped if s.why.startswith(OTHER_ARCH))

    @property
    def size(self) -> int:
        """Bytes of the entries that arrived (in a dry run: that would), as a pull from Redis counts them: not
        those present here already, which import read and verified too."""
        return sum(e.size for e in self.imported.entries if e.action in ("import", "replace")
                   and (e.done or self.imported.dry_run))

    def to_json(self) -> dict[str, object]:
        out = self.imported.to_json()
        out.pop("archive", None)
        out["entries"] = [{**e, "action": pull_action(e["action"])} for e in out["entries"]]
        return {**out, "size": self.size, "remote": self.remote, "digest": self.digest,
                "gpu": list(self.node) if self.node else None, "skipped_other_arch": self.other_arch,
                "left_out": [{"relpath": s.relpath, "arch": s.arch, "reason": s.why} for s in self.skipped]}


def other_arch(rec: dict, node: list[str], layout: str) -> str | None:
    """Why pull leaves an entry record out on a node of these GPU archs (none of its archs runs there by its
    layout's rule, Layout.runs_on), or None when it keeps it: pull checks signatures only of what it keeps."""
    arch = rec.get("arch") if isinstance(rec.get("arch"), str) else None
    runs_on = layouts.get(layout).runs_on
    if arch and not any(runs_on(a.strip(), node) for a in arch.split(",")):
        return f"{OTHER_ARCH} {arch}; this node runs {', '.join(node)}"
    return None


def _keeper(node: list[str] | None, flt: ScanFilter, layout: str) -> Callable[[dict], str | None]:
    def keep(rec: dict) -> str | None:
        arch = rec.get("arch") if isinstance(rec.get("arch"), str) else None
        if node == []:  # no GPU here: only the selected entries that are no GPU code may come
            if not summary_matches(flt, rec):
                return "not selected"
            if _needs_gpu(rec):
                raise UsageError(f"{rec.get('relpath')} is built for {arch or 'a GPU'}; {NO_GPU}")
            return None
        if node is not None and (why := other_arch(rec, node, layout)):
            return why
        if not summary_matches(flt, rec):
            return "not selected"
        return None
    return keep


def pull_image(root: Path, reg: Registry, image: Image, node: list[str] | None, flt: ScanFilter | None = None, *,
               dry_run: bool = False, lock_timeout: float = 60.0, warn: Warn | None = None) -> ImagePullResult:
    """Import the image's entries that run on `node` (and `flt` selects) into `root` (module doc)."""
    preflight(image, node, flt)
    limits = ImportLimits()
    assert image.layout is not None
    with tempfile.TemporaryDirectory(prefix="kcache-oci-") as tmp:
        archive = os.path.join(tmp, "image.tar")
        with _fetched_layer(reg, image, tmp, limits) as layer:
            with open(archive, "wb") as out:  # not under a root: our own 0700 temp dir
                skipped = img.layer_to_archive(layer, out, img.image_format(image.layout),
                                               _keeper(node, flt or ScanFilter(), image.layout), limits,
                                               lambda n: _check_room(tmp, n, "its entries expand to"))
        result = import_archive(root, archive, dry_run=dry_run, limits=limits, lock_timeout=lock_timeout, note=warn)
    left = tuple(SkippedEntry.of(r, skipped.reasons[r["relpath"]]) for r in skipped.records)
    return ImagePullResult(image.ref.url, image.digest, tuple(node) if node else None, result, left)


@contextmanager
def _fetched_layer(reg: Registry, image: Image, tmp: str, limits: ImportLimits) -> Iterator[IO[bytes]]:
    """The image's layer, downloaded whole (within import's limits; its digest checked) into a temp file in
    `tmp`, read from its start."""
    if image.layer[1] > limits.max_total:
        raise RemoteError(f"remote {image.ref.url}: its layer is {image.layer[1]} bytes, over the limit of "
                          f"{limits.max_total} (not fetched)")
    _check_room(tmp, image.layer[1], "the image's layer is")
    with tempfile.TemporaryFile(prefix="kcache-layer-", dir=tmp) as layer:
        reg.get_blob(image.layer[0], image.layer[1], limits.max_total, sink=layer)
        layer.seek(0)
        yield layer


def image_records(reg: Registry, image: Image) -> list[dict]:
    """The entry records of a kcache image (its manifest, the layer's first member), nothing written: what
    `kcache explain` judges an image by."""
    if image.layout is None:
        raise KcacheError(_not_ours(image, "explain judges an image by the compiler and arch kcache's manifest "
                                           "records for each entry"))
    limits = ImportLimits()
    with tempfile.TemporaryDirectory(prefix="kcache-oci-") as tmp, _fetched_layer(reg, image, tmp, limits) as layer:
        return img.layer_records(layer, limits)


def _check_room(tmp: str, size: int, what: str) -> None:
    """The layer is downloaded whole, then expanded into an archive, before import reads it: each refused
    when the temp file system cannot hold it (`what`: "the image's layer is")."""
    st = os.statvfs(tmp)
    if st.f_bavail * st.f_frsize < size:
        raise KcacheError(f"{what} {size} bytes, more than {tmp} has free (set TMPDIR elsewhere; nothing written)")


# ---- remote ls | stats | prune -----------------------------------------------------------------

def list_images(reg: Registry, warn: Warn | None = None, unread: list[str] | None = None) -> list[Image]:
    """Every tag of the repository as an image, newest first; a tag whose image cannot be read is a warning
    (and goes into `unread`)."""
    out = []
    for tag in sorted(set(reg.tags())):
        try:
            out.append(read_image(reg, tag))
        except RemoteError as exc:
            if warn:
                warn(f"tag {tag}: {exc}")
            if unread is not None:
                unread.append(tag)
    return sorted(out, key=lambda i: (-(i.created or 0), i.ref.tag or ""))


def named_by(reg: Registry, tag: str) -> set[str]:
    """The digests of what a tag kcache could not read as a cache image names: its manifest's, and the
    manifests' an index lists (a multi-arch tag). RemoteError when it cannot be read at all."""
    raw, _, digest = reg.get_manifest(tag, MANIFEST_TYPES + INDEX_TYPES)
    try:
        listed = json.loads(raw).get("manifests")
    except (ValueError, AttributeError):
        listed = None
    children = [m.get("digest") for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []
    return {digest, *(d for d in children if isinstance(d, str))}


def image_stats(url: str, images: list[Image]) -> dict[str, object]:
    """`remote stats` of a repository: tags, bytes, entries; per layout the same; per target arch its tags,
    its entries and their files' bytes (None where a tag's labels cannot tell: never a whole image's)."""
    by_target: dict[str, dict[str, int | None]] = {}
    by_layout: dict[str, dict[str, int | None]] = {}
    digests: dict[str, Image] = {}
    for i in images:
        again = i.digest in digests  # one image under several tags: its labels, so its rows, are the same
        digests[i.digest] = i
        _count_in(by_layout.setdefault(i.layout or "-", {"tags": 0, "entry_count": 0, "size": 0}),
                  (i.entry_count or 0, i.size), again)
        for t in i.targets:
            _count_in(by_target.setdefault(t, {"tags": 0, "entry_count": 0, "size": 0}), i.target_counts(t), again)
    once = digests.values()
    return {"remote": url, "tags": len(images), "images": len(digests), "size": sum(i.size for i in once),
            "entry_count": sum(i.entry_count or 0 for i in once), "by_target": by_target, "by_layout": by_layout}


def _count_in(row: dict[str, int | None], counts: tuple[int, int] | None, again: bool) -> None:
    """One more tag in a `remote stats` row, with its (entries, bytes) unless its image was counted `again`
    under another tag (its blobs are stored once): unknown (None) from the first tag whose labels cannot
    tell, never a guess."""
    row["tags"] = (row["tags"] or 0) + 1
    if again:
        return
    n, size = row["entry_count"], row["size"]
    if counts is None or n is None or size is None:
        row["entry_count"] = row["size"] = None
    else:
        row["entry_count"], row["size"] = n + counts[0], size + counts[1]


@dataclass(frozen=True)
class TagRemoval:
    """An image tag a remote prune removes, and why (and whether it was done)."""

    image: Image
    why: str
    done: bool = False
    skipped: str | None = None  # why it was not deleted after all

    def to_json(self) -> dict[str, object]:
        return {**self.image.to_json(), "why": self.why, "done": self.done, "skipped": self.skipped}


def plan_prune(images: list[Image], keep: int | None, older_than: float | None, max_size: int | None,
               now: float | None = None) -> list[TagRemoval]:
    """The tags to delete: past the `keep` newest, older than `older_than` seconds, then the oldest
    until the repository holds at most `max_size` bytes. Never one of the `keep` newest."""
    now = time.time() if now is None else now
    ordered = sorted(images, key=lambda i: (-(i.created or 0), i.ref.tag or ""))  # newest first
    kept = ordered[:keep] if keep is not None else []
    out: dict[str, TagRemoval] = {}
    for i in ordered[len(kept):] if keep is not None else ():
        out[i.ref.tag or ""] = TagRemoval(i, f"past the {keep} newest")
    for i in ordered[len(kept):]:
        if older_than is not None and i.created is not None and now - i.created > older_than:
            out.setdefault(i.ref.tag or "", TagRemoval(i, "older than --older-than"))
    if max_size is not None:  # an image's bytes go only with the last tag naming it
        holders: dict[str, int] = {}
        for i in ordered:
            if (i.ref.tag or "") not in out:
                holders[i.digest] = holders.get(i.digest, 0) + 1
        total = sum({i.digest: i.size for i in ordered if i.digest in holders}.values())
        for i in reversed(ordered[len(kept):]):
            if total <= max_size:
                break
            if (i.ref.tag or "") not in out:
                out[i.ref.tag or ""] = TagRemoval(i, f"over --max-size {format_size(max_size)}")
                holders[i.digest] -= 1
                total -= i.size if holders[i.digest] == 0 else 0
    return sorted(out.values(), key=lambda r: (r.image.created or 0, r.image.ref.tag or ""))


def prune_images(reg: Registry, images: list[Image], plan: list[TagRemoval], dry_run: bool,
                 unread: Sequence[str] = ()) -> list[TagRemoval]:
    """Delete the planned tags' manifests by digest; one that another, unselected tag shares, or whose
    tag moved since it was listed, is left (deleting it would take a tag nobody selected). The tags the
    listing could not read (`unread`: an index, a read that failed) are read again for what they name;
    one that still cannot be read fails the prune before anything is deleted."""
    selected = {r.image.ref.tag for r in plan}
    shared = {i.digest for i in images if i.ref.tag not in selected}
    for tag in unread if plan else ():
        try:
            shared |= named_by(reg, tag)
        except RemoteError as exc:
            raise RemoteError(f"tag {tag} cannot be read ({exc}): nothing deleted, since it may name an image "
                              "the prune selected") from None
    out: list[TagRemoval] = []
    deleted: set[str] = set()
    for r in plan:
        if r.image.digest in deleted:  # a second selected tag of an image deleted already
            out.append(TagRemoval(r.image, r.why, True))
        elif r.image.digest in shared:
            out.append(TagRemoval(r.image, r.why, False, "another tag kept names the same image"))
        elif dry_run:
            out.append(r)
        elif reg.manifest_digest(r.image.ref.tag or "") != r.image.digest:
            out.append(TagRemoval(r.image, r.why, False, "the tag moved since it was listed"))
        else:
            reg.delete_manifest(r.image.digest)
            deleted.add(r.image.digest)
            out.append(TagRemoval(r.image, r.why, True))
    return out
