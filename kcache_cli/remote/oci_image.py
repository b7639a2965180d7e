"""A cache as an OCI image in Red Hat MCV's compat layout (redhat-et/GKM `mcv/docs/spec-compat.md`),
the image KServe's `KernelCache` and GKM mount.

One gzip tar layer (`application/vnd.oci.image.layer.v1.tar+gzip`, which MCV's extract takes as it
takes Docker's) holding, in this order:

    io.kcache.manifest/manifest.json     kcache's archive manifest (every file's size and sha256, the
                                         signatures): first, so that pull reads it before any data
    io.<layout>.cache/<relpath>/...      the entries, as in the cache (Triton: `io.triton.cache/<key>/`;
                                         vLLM: `io.vllm.cache/torch_compile_cache/<h10>/`, MCV's
                                         `io.vllm.cache/` being vLLM's cache root)
    io.<layout>.manifest/manifest.json   Triton and vLLM: MCV's manifest ({"triton": [metadata...]});
                                         other layouts: kcache's manifest again

The image config carries MCV's labels (`cache.<layout>.image/entry-count`, `/cache-size-bytes`: the
bytes of the files under `io.<layout>.cache/`, `/summary`: {"targets":[{"backend","arch","warp_size"}]}),
for vLLM `cache.vllm.image/format` and KServe's `io.kserve.km/*` mount hints, and kcache's own
`io.kcache.image/layout` and `/kcache-version`. The manifest's annotations name the signing key when
the records are signed (the signatures themselves are in kcache's manifest, covered by the layer's
digest, which the manifest's digest covers).

Pull turns the layer back into a kcache archive (kcache's manifest first, the names without their
prefix, MCV's manifest and the entries of archs this node cannot run left out) and imports it: every
check `import` makes applies."""

from __future__ import annotations

import gzip
import hashlib
import json
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import IO

from kcache_cli import __version__, layouts
from kcache_cli.archive.manifest import ImportLimits, reject
from kcache_cli.fs import tarstream as ts
from kcache_cli.fs.read import parse_json
from kcache_cli.layouts.image_format import CPU, MAX_META, ImageFormat
from kcache_cli.util.units import is_digits

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
LAYER_TYPES = (OCI_LAYER, DOCKER_LAYER)  # the compat layer types MCV's extract takes
KCACHE_MANIFEST = "io.kcache.manifest/manifest.json"
LABEL_LAYOUT = "io.kcache.image/layout"
LABEL_VERSION = "io.kcache.image/kcache-version"
ANNOTATION_SIGNER = "io.kcache.image/signed-by"
LABEL_TARGETS = "io.kcache.image/targets"  # per target arch: the entries of it and their files' bytes


def image_format(layout: str) -> ImageFormat:
    """The layout's image shape (Layout.image_format); a layout this kcache does not know: refused."""
    if layout not in layouts.NAMES:
        raise reject(f"the image holds {layout[:40]!r} entries, a layout this kcache does not know")
    return layouts.get(layout).image_format()


# ---- the targets: what the summary says (which of them a node runs is its layout's rule: Layout.runs_on) ----

def target_arch(backend: str, arch: object) -> str:
    """One arch word for a summary target: Triton's CUDA capability 90 is `sm_90a` (Triton builds the
    arch-specific variant from 9.0 on), 80 `sm_80`; other backends' words as they are (gfx90a)."""
    text = str(arch)
    if backend == CPU:
        return CPU
    if backend == "cuda" and is_digits(text):
        n = int(text)
        return f"sm_{n}{'a' if n >= 90 else ''}"
    return text


def _summary(labels: dict[str, str], fmt: ImageFormat) -> list[tuple[str, str]]:
    """(backend, arch) of each target of the image's summary label (MCV's JSON) that names an arch."""
    try:
        doc = json.loads(labels.get(fmt.label_prefix + "summary") or "{}")
        targets = doc.get("targets") if isinstance(doc, dict) else None
    except ValueError:
        return []
    return [(str(t.get("backend") or ""), str(t["arch"])) for t in (targets if isinstance(targets, list) else [])
            if isinstance(t, dict) and isinstance(t.get("arch"), (str, int)) and not isinstance(t.get("arch"), bool)]


def summary_targets(labels: dict[str, str], fmt: ImageFormat) -> list[str]:
    """The arch words of the image's summary label, [] when it names none."""
    return sorted({target_arch(backend, arch) for backend, arch in _summary(labels, fmt)})


_ARCH_WORD = re.compile(r"[A-Za-z0-9_.+-]{1,64}", re.ASCII)  # sm_90a, 90, gfx90a, cpu


def label_problem(labels: dict[str, str], fmt: ImageFormat) -> str | None:
    """What is wrong with the labels kcache reads numbers and arch words from, or None: an entry count
    that is not ASCII digits, a summary target whose arch is not an arch word."""
    count = labels.get(fmt.label_prefix + "entry-count")
    if count is not None and not is_digits(count):
        return f"its label {fmt.label_prefix}entry-count is {count[:40]!r}, not a count"
    bad = [arch for _, arch in _summary(labels, fmt) if not _ARCH_WORD.fullmatch(arch)]
    if bad:
        return f"its label {fmt.label_prefix}summary names the arch {bad[0][:40]!r}, not an arch word"
    return None


# ---- writing the layer --------------------------------------------------------------------------

@dataclass
class LayerFacts:
    """What writing the layer learnt: its digests and sizes, and what the labels say."""

    digest: str = ""
    size: int = 0
    diff_id: str = ""
    cache_bytes: int = 0
    records: list[dict] = field(default_factory=list)
    metadata: list[dict] = field(default_factory=list)  # MCV's per-kernel metadata (Triton)


class _Digesting:
    """A file the compressed layer goes to, hashed and counted on the way."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.h, self.n = out, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.h.update(data)
        self.n += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


class _TarOut:
    """The uncompressed tar stream: into gzip, its own sha256 (the diff_id) on the way."""

    def __init__(self, gz) -> None:
        self.gz, self.h = gz, hashlib.sha256()

    def write(self, data: bytes) -> None:
        self.h.update(data)
        self.gz.write(data)

    def file(self, name: str, data: bytes, mode: int = 0o644, mtime: float = 0) -> None:
        self.write(ts.file_header(name, len(data), mode, mtime))
        self.write(data)
        self.write(ts.padding(len(data)))


def write_layer(archive: IO[bytes], out: IO[bytes], fmt: ImageFormat) -> LayerFacts:
    """Turn a kcache export (a plain tar, manifest.json first) into the image's layer, gzip into `out`."""
    facts = LayerFacts()
    digesting = _Digesting(out)
    reader = ts.TarReader(archive)
    with gzip.GzipFile(fileobj=digesting, mode="wb", mtime=0, compresslevel=ts.GZIP_LEVEL) as gz:
        tar = _TarOut(gz)
        head = reader.next()
        if head is None or head.name != "manifest.json":
            raise reject("the export has no manifest.json first")
        doc = json.loads(b"".join(reader.data(head)))
        doc.pop("parts", None)  # one stream in the layer: no part offsets
        facts.records = doc.get("entries") or []
        kmanifest = json.dumps(doc, separators=(",", ":")).encode()
        tar.file(KCACHE_MANIFEST, kmanifest, mtime=head.mtime)
        while (m := reader.next()) is not None:
            _copy_member(reader, m, tar, fmt, facts)
        tar.file(fmt.manifest_member, fmt.manifest(facts.records, facts.metadata) or kmanifest, mtime=head.mtime)
        tar.write(ts.END_OF_ARCHIVE)
        facts.diff_id = "sha256:" + tar.h.hexdigest()
    facts.digest, facts.size = "sha256:" + digesting.h.hexdigest(), digesting.n
    return facts


def _copy_member(reader, m, tar: _TarOut, fmt: ImageFormat, facts: LayerFacts) -> None:
    name = fmt.prefix + m.name
    if m.type == ts.DIRECTORY:
        tar.write(ts.dir_header(name + "/", m.mtime))
    elif m.type == ts.SYMLINK:
        tar.write(ts.symlink_header(name, m.linkname, m.mtime))
    elif m.type == ts.REGULAR:
        tar.write(ts.file_header(name, m.size, m.mode, m.mtime))
        wanted = fmt.wants(m.name) and m.size <= MAX_META
        small = bytearray()
        for chunk in reader.data(m):
            tar.write(chunk)
            if wanted:
                small += chunk
        tar.write(ts.padding(m.size))
        facts.cache_bytes += m.size
        meta = fmt.metadata(m.name, bytes(small)) if wanted else None
        if meta is not None:
            facts.metadata.append(meta)
    else:
        raise reject(f"member {m.name!r} is a {m.type}, which an image layer does not carry")


def labels(fmt: ImageFormat, facts: LayerFacts, title: str) -> dict[str, str]:
    """The image config's labels (module doc)."""
    p = fmt.label_prefix
    targets = fmt.targets(facts.records, facts.metadata)
    return {"org.opencontainers.image.title": title,
            f"{p}entry-count": str(fmt.entry_count(facts.records, facts.metadata)),
            f"{p}cache-size-bytes": str(facts.cache_bytes),
            f"{p}summary": json.dumps({"targets": targets}, separators=(",", ":")),
            LABEL_LAYOUT: fmt.name, LABEL_VERSION: __version__,
            LABEL_TARGETS: json.dumps(target_tally(facts.records), sort_keys=True, separators=(",", ":")),
            **fmt.labels(facts.records)}


def target_tally(records: list[dict]) -> dict[str, dict[str, int]]:
    """Per arch word of kcache's records (`cpu` for CPU code; the words the summary names): its entries and
    their files' bytes. An entry that records no arch is in none."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        word = CPU if r.get("target") == CPU else r.get("arch")
        if not isinstance(word, str) or not word:
            continue
        files = r.get("files")
        sizes = [v[0] for v in files.values() if isinstance(v, list) and v] if isinstance(files, dict) else []
        size = sum(n for n in sizes if type(n) is int)
        group = out.setdefault(word, {"entry_count": 0, "size": 0})
        group["entry_count"] += 1
        group["size"] += size
    return out


def read_tally(labels: dict[str, str]) -> dict[str, tuple[int, int]] | None:
    """The label target_tally wrote, as (entries, bytes) per arch word; None when there is none (an image an
    older kcache pushed) or it is not one."""
    try:
        doc = json.loads(labels.get(LABEL_TARGETS) or "null")
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    out = {}
    for word, g in doc.items():
        n, size = (g.get("entry_count"), g.get("size")) if isinstance(g, dict) else (None, None)
        if type(n) is not int or type(size) is not int or n < 0 or size < 0:
            return None
        out[word] = (n, size)
    return out


def config_json(lbls: dict[str, str], diff_id: str, made: float) -> bytes:
    """The image config; `made`: export.archive_time() (SOURCE_DATE_EPOCH when set: then two pushes of an
    unchanged cache are one image; else the clock's, to the microsecond: two pushes in a second differ)."""
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    when = datetime.fromtimestamp(made, timezone.utc).isoformat().replace("+00:00", "Z")
    return json.dumps({"created": when, "architecture": arch, "os": "linux", "config": {"Labels": lbls},
                       "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                       "history": [{"created": when, "created_by": "kcache push"}]}, separators=(",", ":")).encode()


def manifest_json(config: tuple[str, int], layer: tuple[str, int], annotations: dict[str, str]) -> bytes:
    doc: dict = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                 "config": {"mediaType": OCI_CONFIG, "digest": config[0], "size": config[1]},
                 "layers": [{"mediaType": OCI_LAYER, "digest": layer[0], "size": layer[1]}]}
    if annotations:
        doc["annotations"] = annotations
    return json.dumps(doc, separators=(",", ":")).encode()


# ---- reading it back ----------------------------------------------------------------------------

@dataclass
class Skipped:
    """Entries left out of a pull before any write, with why (another arch, not selected), and the files the
    manifest lists: the only members the layer may carry, each once, of the size listed."""

    relpaths: set[str] = field(default_factory=set)
    reasons: dict[str, str] = field(default_factory=dict)
    records: list[dict] = field(default_factory=list)
    files: dict[str, int] = field(default_factory=dict)  # relpath/name -> size, removed as each arrives
    expands: int = 0  # the most the kept entries make the archive hold: their bytes and tar headers
    members: int = 0


MEMBER_ROOM = 4 * ts.BLOCK  # a member's tar header, a long name's pax header and the padding, at most


def layer_to_archive(layer: IO[bytes], out: IO[bytes], fmt: ImageFormat, keep: Callable[[dict], str | None],
                     limits: ImportLimits, room: Callable[[int], None] = lambda n: None) -> Skipped:
    """Write the kcache archive the layer holds into `out` (plain tar, manifest.json first), leaving out
    the entries `keep` turns down (with its reason) and MCV's manifest. The manifest's sizes are held to
    import's limits and `room(bytes)` is asked for what the kept entries expand to, before a byte is
    written; then every file must be one the manifest lists, once, of the size it lists, and any other
    member outside `io.<layout>.cache/` is refused, as are more members than import takes (a gzip bomb
    never fills the disk)."""
    reader = ts.TarReader(gzip.GzipFile(fileobj=layer, mode="rb"))
    try:
        raw, mtime = _first_manifest(reader, limits)
        skipped = Skipped()
        data = _kept_manifest(raw, keep, skipped, limits)
        room(len(data) + skipped.expands + 2 * MEMBER_ROOM)
        out.write(ts.file_header("manifest.json", len(data), 0o644, mtime) + data + ts.padding(len(data)))
        while (m := reader.next()) is not None:
            skipped.members += 1
            if skipped.members > limits.max_members:
                raise reject(f"its layer holds over {limits.max_members} members")
            _copy_back(reader, m, out, fmt, skipped)
        out.write(ts.END_OF_ARCHIVE)
    except (ts.TarFormatError, OSError, EOFError, gzip.BadGzipFile) as exc:
        raise reject(f"its layer is not a gzip tar kcache reads ({exc})") from None
    finally:
        reader.close()
    return skipped


def layer_records(layer: IO[bytes], limits: ImportLimits) -> list[dict]:
    """The entry records of the kcache manifest that starts the layer (nothing after it is read)."""
    reader = ts.TarReader(gzip.GzipFile(fileobj=layer, mode="rb"))
    try:
        skipped = Skipped()
        _kept_manifest(_first_manifest(reader, limits)[0], lambda rec: "listed", skipped, limits)
    except (ts.TarFormatError, OSError, EOFError, gzip.BadGzipFile) as exc:
        raise reject(f"its layer is not a gzip tar kcache reads ({exc})") from None
    finally:
        reader.close()
    return skipped.records


def _first_manifest(reader: ts.TarReader, limits: ImportLimits) -> tuple[bytes, float]:
    """(bytes, mtime) of kcache's manifest, which must be the layer's first member."""
    head = reader.next()
    if head is None or head.name != KCACHE_MANIFEST or head.type != ts.REGULAR:
        raise reject(f"its first member is not {KCACHE_MANIFEST} (an image kcache did not push: MCV's "
                     "own images carry no per-file sha256 for kcache to check)")
    if head.size > limits.max_manifest:
        raise reject(f"{KCACHE_MANIFEST} is {head.size} bytes, over the limit of {limits.max_manifest}")
    return b"".join(reader.data(head)), head.mtime


def _kept_manifest(raw: bytes, keep: Callable[[dict], str | None], skipped: Skipped, limits: ImportLimits) -> bytes:
    try:
        doc = parse_json(raw, KCACHE_MANIFEST)
    except (ValueError, UnicodeDecodeError):
        raise reject(f"{KCACHE_MANIFEST} is not valid JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise reject(f"{KCACHE_MANIFEST} is not a kcache archive manifest")
    doc.pop("parts", None)
    kept = []
    for rec in doc["entries"]:
        size = _declare(rec, skipped, limits)
        why = keep(rec) if isinstance(rec, dict) and isinstance(rec.get("relpath"), str) else None
        if why:
            skipped.relpaths.add(rec["relpath"])
            skipped.reasons[rec["relpath"]] = why
            skipped.records.append(rec)
        else:
            kept.append(rec)
            skipped.expands += size  # only what is kept is written: another arch's entries may be any size
            if skipped.expands > limits.max_total:
                raise reject(f"its entries for here would expand to at least {skipped.expands} bytes, over the "
                             f"limit of {limits.max_total}")
    doc["entries"] = kept
    return json.dumps(doc, separators=(",", ":")).encode()


def _declare(rec: object, skipped: Skipped, limits: ImportLimits) -> int:
    """Note the files one record lists, held to import's limit per file (the caller holds those it keeps
    to the limit in all); returns the most the entry adds to the archive. A malformed record is import's
    to name: its files are not listed, so none of them may come."""
    if not isinstance(rec, dict) or not isinstance(rec.get("relpath"), str):
        return 0
    relpath, files = rec["relpath"], rec.get("files")
    size = count = 0
    for name, info in files.items() if isinstance(files, dict) else ():
        n = info[0] if isinstance(info, list) and info else None
        if type(n) is not int or n < 0:
            continue
        if n > limits.max_member:
            raise reject(f"{relpath}/{name} is {n} bytes, over the limit of {limits.max_member} per file")
        skipped.files[f"{relpath}/{name}"] = n
        size, count = size + n, count + 1
    count += 1 + sum(len(v) for k in ("links", "dirs") if isinstance(v := rec.get(k), (list, dict)))
    return size + MEMBER_ROOM * count


def _skipped(name: str, skipped: Skipped) -> bool:
    parts = name.split("/")
    return any("/".join(parts[:i]) in skipped.relpaths for i in range(1, len(parts) + 1))


def _copy_back(reader, m, out: IO[bytes], fmt: ImageFormat, skipped: Skipped) -> None:
    name, prefix = m.name, fmt.prefix
    if name in (fmt.manifest_member, prefix.rstrip("/"), *_parents(prefix)):
        for _ in reader.data(m):
            pass
        return
    if not name.startswith(prefix):
        raise reject(f"member {name!r} is outside {prefix}")
    rel = name[len(prefix):]
    if m.type == ts.REGULAR:
        listed = skipped.files.pop(rel, None)
        if listed is None:
            raise reject(f"member {name!r} is not a file its manifest lists (or comes twice)")
        if m.size != listed:
            raise reject(f"member {name!r} is {m.size} bytes, its manifest lists {listed}")
    if _skipped(rel, skipped):
        for _ in reader.data(m):
            pass
        return
    if m.type == ts.DIRECTORY:
        out.write(ts.dir_header(rel + "/", m.mtime))
    elif m.type == ts.SYMLINK:
        out.write(ts.symlink_header(rel, m.linkname, m.mtime))
    elif m.type == ts.REGULAR:
        out.write(ts.file_header(rel, m.size, m.mode & 0o777, m.mtime))
        for chunk in reader.data(m):
            out.write(chunk)
        out.write(ts.padding(m.size))
    else:
        raise reject(f"member {name!r} is a {m.type}")


def _parents(prefix: str) -> list[str]:
    """io.vllm.cache/torch_compile_cache/ -> [io.vllm.cache]: directories above the entries."""
    parts = prefix.rstrip("/").split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]

