"""tilelang 0.1.15: <root>/<version>/<platform>/kernels/<sha256>/ (compiled kernels, with a
manifest.json of sizes and sha256s), <root>/<version>/cuda-binaries/<sha256>/ (cubins with a
metadata.json), and `.staging/` directories for writes in flight. tilelang opens its files through links
(a link to a good copy is a hit: judged through it); a file that is, or links to, a FIFO, device or socket
makes the entry unreadable (tilelang opens it, a FIFO blocks it; kcache never does: checks.not_regular),
in ls and verify alike, never removed for it."""

from __future__ import annotations

import os
import re
import stat as _s
from dataclasses import replace
from pathlib import Path
from stat import S_ISLNK
from typing import Iterator

from kcache_cli.formats.binary import MAX_FILE_BYTES
from kcache_cli.fs import read as fsread
from kcache_cli.fs import state
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.layouts.base import MISS, UNKNOWN, Here, Judging, Layout, Leftover, ScanContext, Verdict
from kcache_cli.layouts.base import not_installed, unasked
from kcache_cli.layouts.base import STAGING as STAGING_WHAT
from kcache_cli.layouts.shapes import TILELANG, top_dirs
from kcache_cli.model.checks import changed_since, list_files, not_regular
from kcache_cli.model.records import (
    COMPLETE,
    CORRUPT,
    PARTIAL,
    UNREADABLE,
    UNREADABLE_REASON,
    Details,
    Entry,
    Judgement,
    LogFile,
    ScanFilter,
    Status,
    Warn,
    listdir,
    measure_tree,
)

NAME = TILELANG.name
TARGET = TILELANG.kinds[0].target
VERSION_RE = TILELANG.kinds[0].segment(0)  # anchored
KERNEL_BINARIES = ("executable.so", "kernel_lib.so", "kernel.cubin")
CUBIN_BINARIES = ("kernel.cubin", "kernel.fatbin")
STAGING = ".staging"
UNREADABLE_DIR = (UNREADABLE, UNREADABLE_REASON)
BINARIES_DIR = "cuda-binaries"


# ---- evidence: what makes a directory tilelang's -------------------------------------------------
KEY_NAME = re.compile(r"^[0-9a-f]{64}$")  # sha256 hex
PLATFORM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
KERNEL_FILES = frozenset({"device_kernel.cu", "host_kernel.cu", "params.json", "params.pkl", "manifest.json",
                          "kernel.py", *KERNEL_BINARIES})
BINARY_FILES = frozenset({"metadata.json", *CUBIN_BINARIES})


def real_version_dir(path: str) -> bool:
    """A `<version>/` tilelang made: it holds cuda-binaries/ or a <platform>/kernels/ (not a link)."""
    try:
        for de in fsread.scandir_list(path):
            if not de.is_dir(follow_symlinks=False) or de.name == STAGING:
                continue
            if de.name == BINARIES_DIR:
                return True
            k = os.path.join(de.path, "kernels")
            if fsread.is_dir(k) and not fsread.is_link(k):
                return True
    except OSError:
        pass
    return False


def shape_problem(relpath: str, kind: str, names: frozenset[str] | None, root: Path | None = None) -> str | None:
    """None when `relpath` has the exact shape of a tilelang entry: <version>/<platform>/kernels/<64 hex>/,
    <version>/cuda-binaries/<64 hex>/ with tilelang's files, or a write in .staging/ under a real version
    directory (checked when `root` is given); else why it is not one."""
    parts = relpath.split("/")
    if not parts or not VERSION_RE.match(parts[0]):
        return "not under a <version>/ directory"
    if STAGING in parts:
        i = parts.index(STAGING)
        if i not in (1, 2) or len(parts) < i + 2 or (i == 2 and not PLATFORM_NAME.match(parts[1])):
            return "not at <version>/[<platform>/].staging/<name>"
        if root is not None and not real_version_dir(os.path.join(root, parts[0])):
            return f"{parts[0]}/ holds no tilelang kernels or cuda-binaries (not a tilelang version directory)"
        return None
    if kind == "kernel":
        if len(parts) != 4 or not PLATFORM_NAME.match(parts[1]) or parts[1] == BINARIES_DIR \
                or parts[2] != "kernels" or not KEY_NAME.match(parts[3]):
            return "not at <version>/<platform>/kernels/<64 hex>/"
        known = KERNEL_FILES
    elif kind == "binary":
        if len(parts) != 3 or parts[1] != BINARIES_DIR or not KEY_NAME.match(parts[2]):
            return f"not at <version>/{BINARIES_DIR}/<64 hex>/"
        known = BINARY_FILES
    else:
        return f"tilelang has no {kind} entries"
    if names and not names & known:  # an empty directory at an entry's exact path holds nothing to lose
        return "it holds none of the files tilelang writes"
    return None


def detect(root: Path) -> bool:
    """Evidence, not names alone: a `<version>/` holding cuda-binaries/ or <platform>/kernels/, or
    version directories in a root with a CACHEDIR.TAG."""
    try:
        versions = [n for n in top_dirs(root, links=False) if VERSION_RE.match(n) is not None]
    except OSError:
        return False
    if versions and state.has_cachedir_tag(root):
        return True
    return any(real_version_dir(os.path.join(root, n)) for n in versions[:64])


def _load_json(path: str) -> dict | None:
    """A JSON object under fsread's size and nesting limits, or None."""
    return fsread.json_object(path)


CUDA_BINARY_FORMAT = "tilelang.cuda-binary-cache.v1"  # CUDABinaryCache.cache_format
SOURCES = ("device_kernel.cu", "host_kernel.cu")
MAX_RECORD = 1 << 20  # a manifest or metadata file is a few hundred bytes


def _stat(d: EntryDir, name: str) -> os.stat_result | None:
    """os.stat as the loader's os.path.exists/getsize/open see it (through a link), or None. A file the
    scan listed that is no link: its lstat from the listing (the same, without a second call)."""
    if _listed_plain(d, name):
        return d.listing[name]
    try:
        return d.stat(name)
    except (OSError, ValueError):
        return None


def _listed_plain(d: EntryDir, name: str) -> bool:
    """Whether the scan listed `name` as a file that is no link (read without following: nothing to follow)."""
    st = d.listing.get(name)
    return st is not None and not S_ISLNK(st.st_mode)


def _denied(st: os.stat_result | None) -> bool:
    """A regular file nobody may read (mode bits): unreadable whoever runs kcache (root reads it anyway)."""
    return st is not None and _s.S_ISREG(st.st_mode) and not st.st_mode & 0o444


def _dir_denied(d: EntryDir) -> bool:
    try:
        return not d.own_lstat().st_mode & 0o444
    except OSError:
        return False


def _record(d: EntryDir, name: str) -> tuple[object, str | None]:
    """(the JSON value, None), or (None, "unreadable"/"missing"/"bad") for a manifest or metadata file,
    read through a link as tilelang opens it (never a FIFO or device: fsread)."""
    st = _stat(d, name)
    if st is None:
        return None, "missing"
    if _denied(st):
        return None, "unreadable"
    try:
        return fsread.parse_json(d.read_bytes(name, MAX_RECORD, follow=not _listed_plain(d, name)), name), None
    except PermissionError:
        return None, "unreadable"
    except fsread.JsonTooDeep as exc:  # tilelang's json.load raises RecursionError, which nothing catches
        return None, f"deep: {exc}"
    except (OSError, ValueError):
        return None, "bad"


def _not_regular(d: EntryDir, names: dict[str, int]) -> str | None:
    """Why the entry is left unjudged: its first file that is, as tilelang opens it (through a link), a FIFO,
    device or socket (kcache never opens one: checks.not_regular). A link to a regular file is judged
    through it, as tilelang's loader uses it (a hit); a dangling one is missing."""
    for name in sorted(names):
        st = _stat(d, name)
        why = not_regular(name, st.st_mode, "tilelang", linked=not _listed_plain(d, name)) if st is not None else None
        if why:
            return why
    return None


def _kernel_lib(names: dict[str, int]) -> str:
    """The executable tilelang's backend loads: the one present, else the TVM FFI backend's (default)."""
    return next((b for b in KERNEL_BINARIES if b in names), KERNEL_BINARIES[0])


def kernel_status(d: EntryDir, names: dict[str, int], mtimes: dict[str, float] | None = None
                  ) -> tuple[Status, str | None]:
    """tilelang 0.1.15's `_load_kernel_from_disk`: every file it needs exists (through links), the
    manifest parses and lists the executable and params.json, every listed file has its recorded size,
    and those two their recorded sha256 (read when they changed after the manifest, or `mtimes` is None:
    the deep check); else tilelang removes the entry and compiles again (partial). Sources are checked
    by size only: a same-size edit is a hit."""
    if _dir_denied(d):
        return UNREADABLE, "cannot read the directory: permission denied (mode 000)"
    odd = _not_regular(d, names)
    if odd:
        return UNREADABLE, odd
    lib = _kernel_lib(names)
    needed = (*SOURCES, "manifest.json", lib, "params.json", *(("kernel.py",) if lib == "kernel.cubin" else ()))
    stats = {n: _stat(d, n) for n in needed}
    gone = [n for n in needed if stats[n] is None]
    if gone:
        return PARTIAL, f"{gone[0]} is missing: tilelang compiles the kernel again"
    manifest, bad = _record(d, "manifest.json")
    if bad == "unreadable" or any(_denied(stats[n]) for n in (lib, "params.json")):
        who = "manifest.json" if bad == "unreadable" else next(n for n in (lib, "params.json") if _denied(stats[n]))
        return UNREADABLE, f"{who} is unreadable (permission denied)"
    if bad and bad.startswith("deep: "):
        return CORRUPT, f"{bad[6:]}: tilelang fails loading it on every lookup"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return PARTIAL, "manifest.json does not parse as tilelang's manifest: tilelang compiles the kernel again"
    required = (lib, "params.json")
    if not all(n in files for n in required):
        return PARTIAL, f"manifest.json does not list {next(n for n in required if n not in files)}: tilelang " \
            "compiles the kernel again"
    for name, rec in sorted(files.items()):
        st = stats.get(name) or _stat(d, name)
        size = rec.get("size") if isinstance(rec, dict) else None
        if st is None or size is None or st.st_size != size:
            return PARTIAL, (f"{name} is {'missing' if st is None else f'{st.st_size} bytes'}, manifest.json says "
                             f"{size}: tilelang compiles the kernel again")
    return _required_digests(d, files, required, mtimes)


def _required_digests(d: EntryDir, files: dict, required: tuple[str, ...], mtimes) -> tuple[Status, str | None]:
    for name in required:
        if mtimes is not None and not changed_since(mtimes, "manifest.json", (name,)):
            continue
        try:
            digest = d.sha256(name, follow=True)
        except PermissionError:
            return UNREADABLE, f"{name} is unreadable (permission denied)"
        except OSError as exc:
            return PARTIAL, f"{name} cannot be read ({exc.strerror or exc}): tilelang compiles the kernel again"
        rec = files[name]
        if digest != rec.get("sha256"):
            return PARTIAL, f"{name} sha256 {digest[:16]}... differs from manifest.json: tilelang compiles it again"
    return COMPLETE, None


def binary_status(d: EntryDir, names: dict[str, int], mtimes: dict[str, float] | None = None
                  ) -> tuple[Status, str | None]:
    """tilelang 0.1.15's `CUDABinaryCache.load`: the binary and metadata.json open, the metadata carries
    tilelang's format tag, a positive integer size equal to the binary's, and (read when the binary
    changed after the metadata, or `mtimes` is None: the deep check) its sha256. Else every lookup
    misses and `save` never replaces a published directory: corrupt."""
    if _dir_denied(d):
        return UNREADABLE, "cannot read the directory: permission denied (mode 000)"
    odd = _not_regular(d, names)
    if odd:
        return UNREADABLE, odd
    binary = next((b for b in CUBIN_BINARIES if b in names), CUBIN_BINARIES[0])
    forever = "tilelang misses it on every lookup and never replaces it"
    st = _stat(d, binary)
    meta, bad = _record(d, "metadata.json")
    if _denied(st) or bad == "unreadable":
        return UNREADABLE, f"{binary if _denied(st) else 'metadata.json'} is unreadable (permission denied)"
    if st is None:
        return CORRUPT, f"{binary} is missing: {forever}"
    if bad and bad.startswith("deep: "):
        return CORRUPT, f"{bad[6:]}: tilelang fails loading it on every lookup"
    if bad is not None or not isinstance(meta, dict):
        return CORRUPT, f"metadata.json is {'missing' if bad == 'missing' else 'not a JSON object'}: {forever}"
    if meta.get("format") != CUDA_BINARY_FORMAT:
        return CORRUPT, f"metadata.json's format is {meta.get('format')!r}, not {CUDA_BINARY_FORMAT}: {forever}"
    size = meta.get("size")
    if type(size) is not int or size <= 0 or size != st.st_size:
        return CORRUPT, f"{binary} is {st.st_size} bytes, metadata.json says {size!r}: {forever}"
    if not isinstance(meta.get("sha256"), str):
        return CORRUPT, f"metadata.json has no sha256: {forever}"
    if mtimes is None or changed_since(mtimes, "metadata.json", (binary,)):
        try:
            digest = d.sha256(binary, follow=True)
        except PermissionError:
            return UNREADABLE, f"{binary} is unreadable (permission denied)"
        except OSError as exc:
            return CORRUPT, f"{binary} cannot be read ({exc.strerror or exc}): {forever}"
        if digest != meta["sha256"]:
            return CORRUPT, f"{binary} sha256 {digest[:16]}... differs from metadata.json: {forever}"
    return COMPLETE, None


def judge(d: EntryDir, kind: str, jc: Judging) -> Judgement:
    """The one judgement of a tilelang kernel or binary (its directory held as `d`): cheap for ls (digests
    only of what changed after its manifest / metadata), `jc.deep` reads every byte tilelang checks, and
    params.json must parse."""
    try:
        if not d.own_lstat().st_mode & 0o444:
            return Judgement.of(UNREADABLE, "cannot read the directory: permission denied (mode 000)")
        names, mtimes = d.files()
    except OSError as exc:
        return Judgement.of(UNREADABLE, f"cannot read the directory: {exc.strerror}")
    return _judged(d, kind, jc.deep, names, mtimes)


def _judged(d: EntryDir, kind: str, deep: bool, names: dict[str, int], mtimes: dict[str, float] | None
            ) -> Judgement:
    status, reason = (kernel_status if kind == "kernel" else binary_status)(d, names, None if deep else mtimes)
    if status == COMPLETE and deep and kind == "kernel":
        params, bad = _record(d, "params.json")
        if bad is not None or not isinstance(params, (dict, list)):
            return Judgement.of(CORRUPT, "params.json does not parse: tilelang cannot load the kernel, and never "
                                "replaces an entry whose files are all there")
        lib = _kernel_lib(names)
        try:
            head = d.read_bytes(lib, 4, strict=False, follow=True)
        except OSError:
            head = b""
        if head not in (b"\x7fELF", b"\x50\xed\x55\xba"):
            return Judgement.of(PARTIAL, f"{lib} is not a loadable binary: tilelang removes the entry and compiles "
                                "it again")
    return Judgement.of(status, reason)


def _staging(ctx, path: str, kind: str, space: str) -> Iterator[Entry]:
    for de in ctx.listdir(path):
        usage = measure_tree(de.path, ctx.warn)  # a file gives its own size
        yield ctx.entry(path=de.path, usage=usage, layout=NAME, kind=kind, target=TARGET, space=space, op=None,
                        hash=de.name, status=PARTIAL, reason="tilelang staging directory (a write in flight, "
                        "stale after an hour)")


def scan(ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]:
    """Kernels and binaries are judged through `ctx.map_entries` (worker processes for big caches), each
    job plain data that the index (kcache_cli/catalog/index.py) may answer from its record of an unchanged entry:
    a verdict goes by the entry's own files alone (their sizes, mtimes and bytes; no lock, no clock)."""
    if flt.ops or not flt.wants_target(TARGET):
        return  # tilelang kernels carry no op name
    prefixes = flt.name_prefixes()
    jobs: list[tuple[str, str, str]] = []  # every space's, judged together: one set of workers, not one per space
    for vdir in ctx.listdir(ctx.root):
        if not VERSION_RE.match(vdir.name) or not vdir.is_dir(follow_symlinks=False):
            continue
        version = vdir.name
        for sub in ctx.listdir(vdir.path):
            if not sub.is_dir(follow_symlinks=False):
                continue
            if sub.name == STAGING:
                if flt.wants_space(version):
                    yield from _staging(ctx, sub.path, "binary", version)
                continue
            space = f"{version}/{sub.name}"
            if not flt.wants_space(space):
                continue
            kind, where = "binary", sub.path
            if sub.name != BINARIES_DIR:
                kind, where = "kernel", os.path.join(sub.path, "kernels")
                yield from _staging(ctx, os.path.join(sub.path, STAGING), "kernel", space)
            jobs += [(f"{where}/{name}", kind, space) for name in ctx.subdirs(where)
                     if not prefixes or name.startswith(prefixes)]
    yield from ctx.map_entries(_judged_entry, jobs)


def _judged_entry(ctx, job: tuple[str, str, str]) -> Entry:
    """The entry of the kernel or binary directory of the job (path, kind, space)."""
    path, kind, space = job
    with ctx.open_entry(path) as d:
        names, usage, mtimes = ctx.read_dir(d)
        status_of = kernel_status if kind == "kernel" else binary_status
        status, reason = status_of(d, names, mtimes) if names is not None else UNREADABLE_DIR
    return ctx.entry(path=path, usage=usage, layout=NAME, kind=kind, target=TARGET, space=space, op=None,
                     hash=os.path.basename(path), status=status, reason=reason)


def describe(root: Path, entry: Entry) -> Details:
    """The deep judgement (what tilelang's own load checks, byte for byte) and what the entry records."""
    p = entry.path
    facts: list[tuple[str, str]] = []
    files = list_files(p) if os.path.isdir(p) else ()
    if entry.kind == "kernel":
        host = fsread.read_text(os.path.join(p, "host_kernel.cu"), 4096, base=p)
        if host and host.startswith("// tilelang target:"):
            facts.append(("host target", host.splitlines()[0].split(":", 1)[1].strip()))
        binaries = tuple(os.path.join(p, b) for b in KERNEL_BINARIES if os.path.lexists(os.path.join(p, b)))
    else:
        meta = fsread.json_object(os.path.join(p, "metadata.json"), base=p) or {}
        if meta.get("format"):
            facts.append(("format", str(meta["format"])))
        binaries = tuple(os.path.join(p, b) for b in CUBIN_BINARIES if os.path.lexists(os.path.join(p, b)))
    staging = f"/{STAGING}/" in f"/{entry.relpath}"
    verdict = Judgement.of(entry.status, entry.reason)
    if entry.hash and os.path.isdir(p) and not staging:
        with EntryDir.open(p, fsread.anchor(root)) as d:
            verdict = judge(d, entry.kind, Judging(deep=True))
    if entry.kind == "kernel":
        facts.extend(kernel_params(p))
    return Details(entry, verdict.status, verdict.reason, verdict.problems if verdict.status != COMPLETE else (),
                   files, None, (), (), None, None, binaries, tuple(facts))


def kernel_params(path: str) -> list[tuple[str, str]]:
    """A kernel's parameters from params.json (tvm ffi's node graph: Maps of dtype and shape)."""
    data = _load_json(os.path.join(path, "params.json"))
    if not data or not isinstance(data.get("nodes"), list):
        return []
    nodes = data["nodes"]

    def value(i, depth=0):
        if not isinstance(i, int) or not 0 <= i < len(nodes) or depth > 20:
            return None
        n = nodes[i]
        t, d = n.get("type"), n.get("data")
        if t == "ffi.Array":
            return [value(x, depth + 1) for x in d or []]
        if t == "ffi.Map":
            d = d or []
            return {str(value(d[k], depth + 1)): value(d[k + 1], depth + 1) for k in range(0, len(d) - 1, 2)}
        return d

    root = value(data.get("root_index"))
    items = root if isinstance(root, list) else [root]
    out = []
    for i, p in enumerate(items):
        if isinstance(p, dict) and "dtype" in p:
            shape = p.get("shape")
            text = f"{p['dtype']}[{', '.join(str(x) for x in shape)}]" if isinstance(shape, list) else str(p["dtype"])
            out.append((f"param {i}", text))
    return out


def log_files(entry: Entry) -> list[LogFile]:
    return []  # tilelang keeps no compile log on disk


# ---- for prune/clear -----------------------------------------------------------------------------
# Which kernels use a cuda-binary? tilelang keys cuda-binaries/<key>/ by
# sha256(json of {code_hash, target arch and code, compile format, nvcc options with absolute include
# paths, tilelang version, ...}) (tilelang/cache/cuda_binary_cache.py, make_key): a one-way hash of
# inputs the cache does not keep, so it cannot be recomputed from a kernel entry. What the cache does
# keep is the bytes: the tvm_ffi backend embeds the cubin/fatbin verbatim in the kernel's
# executable.so (and the cubin backends copy it to kernel.cubin). A kernel uses a binary when the
# binary's bytes appear, whole, in one of the kernel's compiled files.
_FINGERPRINT = 64  # bytes of a binary's start used to find candidate positions


def _binary_file(path: str) -> str | None:
    return next((os.path.join(path, b) for b in CUBIN_BINARIES if fsread.exists(os.path.join(path, b))), None)


def _read_binary_bytes(path: str) -> bytes | None:
    """A compiled file's bytes for the byte search (fsread: regular files only, under the ELF
    reader's size bound), or None."""
    try:
        return fsread.read_bytes(path, MAX_FILE_BYTES)
    except OSError:
        return None


def binary_users(root: Path, binaries: list[str]) -> dict[str, list[str]]:
    """binary dir -> kernel dirs (of the same tilelang version) that embed that binary byte for byte.

    Reads every kernel's compiled files once; binaries that cannot be read have no known users. Binaries
    with the same bytes share one list of users (read, never changed): each kernel is added once, not once
    per copy (5,000 copies used by 20,000 kernels made 10^8 entries)."""
    out: dict[str, list[str]] = {b: [] for b in binaries}
    by_version: dict[str, list[str]] = {}
    for b in binaries:
        by_version.setdefault(os.path.dirname(os.path.dirname(b)), []).append(b)
    for vdir, bins in by_version.items():
        index = _blob_index(bins)
        if not index:
            continue
        magics = {k[:4] for k in index}  # where a blob can start in a kernel's file (an ELF's magic)
        users: dict[bytes, list[str]] = {}  # a list per distinct blob, shared by every dir holding it
        for same in index.values():
            for blob, dirs in same.items():
                users[blob] = out[dirs[0]]
                out.update(dict.fromkeys(dirs, users[blob]))
        try:
            platforms = [d for d in fsread.scandir_list(vdir) if d.is_dir(follow_symlinks=False)
                         and d.name not in (BINARIES_DIR, STAGING)]
        except OSError:
            continue
        for plat in platforms:
            try:
                kernels = [d.path for d in fsread.scandir_list(os.path.join(plat.path, "kernels"))
                           if d.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for k in sorted(kernels):
                for blob in _embedded(k, index, magics):
                    users[blob].append(k)
    return out


# A binary's first _FINGERPRINT bytes -> its whole bytes -> the binary dirs holding exactly those bytes.
_BlobIndex = dict[bytes, dict[bytes, list[str]]]


def _blob_index(bins: list[str]) -> _BlobIndex:
    """The readable binaries among `bins`, identical ones together: each distinct blob is searched for
    once, however many dirs hold it (copies of one cubin under 5,000 keys were compared 5,000 times at
    every place a kernel's file could hold one: a 20,000-kernel prune ran for minutes)."""
    index: _BlobIndex = {}
    for b in bins:
        f = _binary_file(b)
        data = _read_binary_bytes(f) if f else None
        if data is not None and len(data) >= _FINGERPRINT:
            index.setdefault(data[:_FINGERPRINT], {}).setdefault(data, []).append(b)
    return index


def _embedded(kernel: str, index: _BlobIndex, magics: set[bytes]) -> list[bytes]:
    """The binaries' blobs that one of the kernel's compiled files holds whole, each once, in the order
    found. A blob can start only where its first four bytes are (`magics`): only there is it compared."""
    found: dict[bytes, None] = {}
    for name in KERNEL_BINARIES:
        data = _read_binary_bytes(os.path.join(kernel, name))
        if data is None:
            continue
        for magic in magics:
            pos = data.find(magic)
            while pos >= 0:
                for blob in index.get(data[pos:pos + _FINGERPRINT], ()):
                    if data.startswith(blob, pos):
                        found[blob] = None
                pos = data.find(magic, pos + 1)
    return list(found)


def stray_links(ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]:
    """Symlinks where a version, platform, kernels/ or an entry belongs: never followed; prune --broken
    and clear remove them as links."""
    if flt.ops or not flt.wants_target(TARGET):
        return

    def link(de: os.DirEntry, kind: str, space: str | None, h: str) -> Entry:
        return ctx.link_entry(de.path, layout=NAME, kind=kind, target=TARGET, space=space, op=None, hash=h)

    for vdir in ctx.listdir(ctx.root):
        if not VERSION_RE.match(vdir.name):
            continue
        if vdir.is_symlink():
            if not flt.spaces:
                yield link(vdir, "kernel", None, "")
            continue
        if not vdir.is_dir(follow_symlinks=False):
            continue
        for sub in ctx.listdir(vdir.path):
            kind = "binary" if sub.name == BINARIES_DIR else "kernel"
            space = f"{vdir.name}/{sub.name}"
            if sub.name == STAGING or not flt.wants_space(space):
                continue
            if sub.is_symlink():
                yield link(sub, kind, space, "")
                continue
            if not sub.is_dir(follow_symlinks=False):
                continue
            entries_dir = sub.path if kind == "binary" else os.path.join(sub.path, "kernels")
            if kind == "kernel" and os.path.islink(entries_dir):
                yield ctx.link_entry(entries_dir, layout=NAME, kind=kind, target=TARGET, space=space, op=None,
                                     hash="")
                continue
            for de in ctx.listdir(entries_dir):
                if de.is_symlink():
                    yield link(de, kind, space, de.name)


# ---- the layout ----------------------------------------------------------------------------------

# ---- will tilelang here use it (kcache explain) ---------------------------------------------------------

PACKAGE = "tilelang"


def explain(root: Path, entry: Entry, here: Here) -> Verdict:
    """tilelang looks only under `<its own version>/`: another version is a miss; past that its key hashes
    the program, target and pass configs, which kcache does not compare (unknown)."""
    if (not_asked := unasked(here)) is not None:
        return not_asked
    have = here.versions.get(PACKAGE)
    version = (entry.space or "").split("/", 1)[0] or None
    if have is None:
        return not_installed("tilelang", PACKAGE, version)
    if version != have:
        return Verdict(MISS, f"tilelang {have} looks only under {have}/", "tilelang version", version, have)
    if entry.status != COMPLETE:
        return Verdict(MISS, f"tilelang does not use a {entry.status} entry: {entry.reason}", "status",
                       entry.status, COMPLETE)
    return Verdict(UNKNOWN, f"tilelang {have} as recorded; its key hashes the program, target and pass configs, "
                   "which kcache does not compare")


class TilelangLayout(Layout):
    """tilelang: kernels embed the cuda-binaries they were built from; writes go through .staging/."""

    shape = TILELANG
    provider_kinds = frozenset({"binary"})
    binary_kinds = frozenset({"binary"})
    packages = (PACKAGE,)

    detect = staticmethod(detect)
    shape_problem = staticmethod(shape_problem)
    scan = staticmethod(scan)
    stray_links = staticmethod(stray_links)
    judge = staticmethod(judge)
    describe = staticmethod(describe)
    log_files = staticmethod(log_files)

    def users(self, root: Path, providers: list[str]) -> dict[str, list[str]]:
        return binary_users(root, providers)

    def use_words(self, kind: str) -> tuple[str, str]:
        return "embeds", "embedded in"

    def leftover(self, entry: Entry) -> Leftover | None:
        rel = entry.relpath
        if rel.startswith(STAGING + "/") or f"/{STAGING}/" in rel:
            return Leftover(STAGING_WHAT, "tilelang staging left by an interrupted write", None)
        return None

    def leftover_parts(self, entry: Entry, warn: Warn) -> list[Entry]:
        if os.path.basename(entry.path) != BINARIES_DIR or not os.path.isdir(entry.path):
            return [entry]
        # .staging/cuda-binaries/ holds one directory per write: each is judged on its own


        out = []
        for de in listdir(entry.path, warn):
            u = measure_tree(de.path, warn)
            rel = f"{entry.relpath}/{de.name}"
            out.append(replace(entry, path=de.path, relpath=rel, hash=de.name, size=u.size,
                               apparent_size=u.apparent, files=u.files,
                               modified=u.mtime, last_used=u.mtime, dev=u.dev, ino=u.ino))
        return out

    def platform(self, entry: Entry) -> str | None:
        if entry.kind == "kernel" and entry.space and "/" in entry.space:
            return entry.space.split("/", 1)[1]
        return None

    explain = staticmethod(explain)


LAYOUT = TilelangLayout()
