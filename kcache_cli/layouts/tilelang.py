"""tilelang 0.1.15: <root>/<version>/<platform>/kernels/<sha256>/ (compiled kernels, with a
manifest.json of sizes and sha256s), <root>/<version>/cuda-binaries/<sha256>/ (cubins with a
metadata.json), and `.staging/` directories for writes in flight."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator

from kcache_cli import fsread
from kcache_cli.checks import (changed_since, check_manifest, list_files, read_every_byte, size_mismatch,
                              unreadable)
from kcache_cli.layouts.base import STAGING as STAGING_WHAT
from kcache_cli.layouts.base import Leftover, ModuleLayout
from kcache_cli.layouts.shapes import TILELANG
from kcache_cli.model import (COMPLETE, CORRUPT, PARTIAL, UNREADABLE, UNREADABLE_REASON, Details, Entry, Judgement,
                              LogFile, ScanFilter, measure_tree)

NAME = TILELANG.name
TARGET = TILELANG.kinds[0].target
VERSION_RE = TILELANG.kinds[0].segments[0]  # anchored
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
        with os.scandir(path) as it:
            for de in it:
                if not de.is_dir(follow_symlinks=False) or de.name == STAGING:
                    continue
                if de.name == BINARIES_DIR:
                    return True
                k = os.path.join(de.path, "kernels")
                if os.path.isdir(k) and not os.path.islink(k):
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
    if names is not None and not names & known:
        return "it holds none of the files tilelang writes"
    return None


def detect(root: Path) -> bool:
    """Evidence, not names alone: a `<version>/` holding cuda-binaries/ or <platform>/kernels/, or
    version directories in a root with a CACHEDIR.TAG."""
    from kcache_cli import state

    try:
        versions = [d for d in os.scandir(root) if VERSION_RE.match(d.name) and d.is_dir(follow_symlinks=False)]
    except OSError:
        return False
    if versions and state.has_cachedir_tag(root):
        return True
    return any(real_version_dir(d.path) for d in versions[:64])


def _load_json(path: str) -> dict | None:
    """A JSON object under fsread's size and nesting limits, or None."""
    return fsread.json_object(path)


def kernel_status(path: str, names: dict[str, int], mtimes: dict[str, float] | None = None
                  ) -> tuple[str, str | None]:
    binary = next((b for b in KERNEL_BINARIES if b in names), None)
    if "manifest.json" in names and changed_since(mtimes, "manifest.json"):
        manifest, bad = fsread.json_problem(os.path.join(path, "manifest.json"))
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            return CORRUPT, bad if bad and "deep" in bad else "manifest.json is unreadable"
        bad = size_mismatch("manifest.json", manifest["files"], names)
        if bad:
            return CORRUPT, bad
    if binary is None:
        return PARTIAL, "no executable.so, kernel_lib.so or kernel.cubin"
    if names[binary] == 0:
        return PARTIAL, f"{binary} is empty"
    why = unreadable(os.path.join(path, binary))
    if why:
        return UNREADABLE, why
    if binary == "kernel.cubin" and "kernel.py" not in names:
        return PARTIAL, "kernel.cubin without kernel.py"
    if "params.json" not in names and "params.pkl" not in names:
        return PARTIAL, "no params.json"
    return COMPLETE, None


def binary_status(path: str, names: dict[str, int], mtimes: dict[str, float] | None = None
                  ) -> tuple[str, str | None]:
    binary = next((b for b in CUBIN_BINARIES if b in names), None)
    if binary is None:
        return PARTIAL, "no kernel.cubin or kernel.fatbin"
    if "metadata.json" not in names:
        return PARTIAL, "no metadata.json"
    why = unreadable(os.path.join(path, binary))
    if why:
        return UNREADABLE, why
    if not changed_since(mtimes, "metadata.json", (binary,)):
        return COMPLETE, None
    meta = _load_json(os.path.join(path, "metadata.json"))
    if meta is None:
        return CORRUPT, "metadata.json is unreadable"
    if meta.get("size") is not None and meta["size"] != names[binary]:
        return CORRUPT, f"{binary} is {names[binary]} bytes, metadata.json says {meta['size']}"
    return COMPLETE, None


def judge(path: str, kind: str, deep: bool = False, *, names: dict[str, int] | None = None,
          mtimes: dict[str, float] | None = None, root: object = None) -> Judgement:
    """The one judgement of a tilelang kernel or binary: cheap for ls, `deep` checks every byte against
    manifest.json / metadata.json."""
    if names is None:
        names, mtimes = {}, {}
        try:
            for de in os.scandir(path):
                if not de.is_dir(follow_symlinks=False):
                    st = de.stat(follow_symlinks=False)
                    names[de.name], mtimes[de.name] = st.st_size, st.st_mtime
        except OSError as exc:
            return Judgement.of(UNREADABLE, f"cannot read the directory: {exc.strerror}")
    status, reason = (kernel_status if kind == "kernel" else binary_status)(path, names, None if deep else mtimes)
    if status != COMPLETE or not deep:
        return Judgement.of(status, reason)
    if kind == "kernel":
        manifest = _load_json(os.path.join(path, "manifest.json"))
        problems = check_manifest(path, "manifest.json", manifest.get("files") or {}) if manifest else []
    else:
        meta = _load_json(os.path.join(path, "metadata.json")) or {}
        binary = next((b for b in CUBIN_BINARIES if b in names), None)
        problems = check_manifest(path, "metadata.json", {binary: {"size": meta.get("size"), "sha256": meta["sha256"]}}
                                  ) if binary and meta.get("sha256") else []
    bad = read_every_byte(path) or _not_a_binary(path, names)
    if bad and not problems:
        problems = [bad]
    if problems:
        status = UNREADABLE if all("unreadable" in p or "Permission denied" in p for p in problems) else CORRUPT
        return Judgement(status, problems[0], tuple(problems))
    return Judgement(COMPLETE)


def _not_a_binary(path: str, names: dict[str, int]) -> str | None:
    """A compiled file whose bytes are no kernel binary (an ELF .so or cubin, or a fatbin)."""
    from kcache_cli.checks import read_head

    for b in (*KERNEL_BINARIES, *CUBIN_BINARIES):
        if b in names:
            head = read_head(os.path.join(path, b), 4)
            if head != b"\x7fELF" and head != b"\x50\xed\x55\xba":
                return f"{b} is not a readable kernel binary (neither ELF nor fatbin)"
    return None


def _staging(ctx, path: str, kind: str, space: str) -> Iterator[Entry]:
    for de in ctx.listdir(path):
        usage = measure_tree(de.path, ctx.warn)  # a file gives its own size
        yield ctx.entry(path=de.path, usage=usage, layout=NAME, kind=kind, target=TARGET, space=space, op=None,
                        hash=de.name, status=PARTIAL, reason="tilelang staging directory (a write in flight, "
                        "stale after an hour)")


def scan(ctx, flt: ScanFilter) -> Iterator[Entry]:
    if flt.ops or not flt.wants_target(TARGET):
        return  # tilelang kernels carry no op name
    for vdir in ctx.listdir(ctx.root):
        if not VERSION_RE.match(vdir.name) or not vdir.is_dir(follow_symlinks=False):
            continue
        version = vdir.name
        for sub in ctx.listdir(vdir.path):
            if not sub.is_dir(follow_symlinks=False):
                continue
            if sub.name == BINARIES_DIR:
                space = f"{version}/{BINARIES_DIR}"
                if not flt.wants_space(space):
                    continue
                for de in ctx.listdir(sub.path):
                    if de.is_dir(follow_symlinks=False):
                        names, usage, mtimes = ctx.read_dir(de.path)
                        status, reason = binary_status(de.path, names, mtimes) if names is not None else UNREADABLE_DIR
                        yield ctx.entry(path=de.path, usage=usage, layout=NAME, kind="binary", target=TARGET,
                                        space=space, op=None, hash=de.name, status=status, reason=reason)
            elif sub.name == STAGING:
                if flt.wants_space(version):
                    yield from _staging(ctx, sub.path, "binary", version)
            else:
                space = f"{version}/{sub.name}"
                if not flt.wants_space(space):
                    continue
                yield from _staging(ctx, os.path.join(sub.path, STAGING), "kernel", space)
                for de in ctx.listdir(os.path.join(sub.path, "kernels")):
                    if de.is_dir(follow_symlinks=False):
                        names, usage, mtimes = ctx.read_dir(de.path)
                        status, reason = kernel_status(de.path, names, mtimes) if names is not None else UNREADABLE_DIR
                        yield ctx.entry(path=de.path, usage=usage, layout=NAME, kind="kernel", target=TARGET,
                                        space=space, op=None, hash=de.name, status=status, reason=reason)


def describe(root: Path, entry: Entry) -> Details:
    p = entry.path
    problems: list[str] = []
    facts: list[tuple[str, str]] = []
    files = list_files(p, problems.append) if os.path.isdir(p) else ()
    if entry.kind == "kernel":
        manifest, bad = fsread.json_problem(os.path.join(p, "manifest.json"), base=p)
        if bad and not bad.endswith("missing"):
            problems.append(bad)
        elif not isinstance(manifest, dict):
            facts.append(("manifest", "none (nothing to check checksums against)"))
        else:
            problems.extend(check_manifest(p, "manifest.json", manifest.get("files") or {}))
        host = fsread.read_text(os.path.join(p, "host_kernel.cu"), 4096, base=p)
        if host and host.startswith("// tilelang target:"):
            facts.append(("host target", host.splitlines()[0].split(":", 1)[1].strip()))
        binaries = tuple(os.path.join(p, b) for b in KERNEL_BINARIES if os.path.lexists(os.path.join(p, b)))
    else:
        record, bad = fsread.json_problem(os.path.join(p, "metadata.json"), base=p)
        if bad and not bad.endswith("missing"):
            problems.append(bad)
        meta = record if isinstance(record, dict) else {}
        binary = next((b for b in CUBIN_BINARIES if os.path.lexists(os.path.join(p, b))), None)
        if binary and meta.get("sha256"):
            problems.extend(check_manifest(p, "metadata.json", {binary: {"size": meta.get("size"),
                                                                         "sha256": meta["sha256"]}}))
        if meta.get("format"):
            facts.append(("format", str(meta["format"])))
        binaries = (os.path.join(p, binary),) if binary else ()
    staging = f"/{STAGING}/" in f"/{entry.relpath}"
    verdict = judge(p, entry.kind, True) if entry.hash and os.path.isdir(p) and not staging \
        else Judgement.of(entry.status, entry.reason)
    if entry.kind == "kernel":
        facts.extend(kernel_params(p))
    problems = [*verdict.problems, *(x for x in problems if x not in verdict.problems)]
    status, reason = verdict.status, verdict.reason
    if problems and status == COMPLETE:
        status, reason = CORRUPT, problems[0]
    return Details(entry, status, reason, tuple(problems), files, None, (), (), None, None, binaries, tuple(facts))


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
    return next((os.path.join(path, b) for b in CUBIN_BINARIES if os.path.lexists(os.path.join(path, b))), None)


def _read_binary_bytes(path: str) -> bytes | None:
    """A compiled file's bytes for the byte search (fsread: regular files only, under the ELF
    reader's size bound), or None."""
    from kcache_cli.binary import MAX_FILE_BYTES

    try:
        return fsread.read_bytes(path, MAX_FILE_BYTES)
    except OSError:
        return None


def binary_users(root: Path, binaries: list[str]) -> dict[str, list[str]]:
    """binary dir -> kernel dirs (of the same tilelang version) that embed that binary byte for byte.

    Reads every kernel's compiled files once; binaries that cannot be read have no known users."""
    out: dict[str, list[str]] = {b: [] for b in binaries}
    by_version: dict[str, list[str]] = {}
    for b in binaries:
        by_version.setdefault(os.path.dirname(os.path.dirname(b)), []).append(b)
    for vdir, bins in by_version.items():
        index: dict[bytes, list[tuple[str, bytes]]] = {}
        for b in bins:
            f = _binary_file(b)
            data = _read_binary_bytes(f) if f else None
            if data is not None and len(data) >= _FINGERPRINT:
                index.setdefault(data[:_FINGERPRINT], []).append((b, data))
        if not index:
            continue
        magics = {k[:4] for k in index}
        try:
            platforms = [d for d in os.scandir(vdir) if d.is_dir(follow_symlinks=False)
                         and d.name not in (BINARIES_DIR, STAGING)]
        except OSError:
            continue
        for plat in platforms:
            try:
                kernels = [d.path for d in os.scandir(os.path.join(plat.path, "kernels"))
                           if d.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for k in sorted(kernels):
                for name in KERNEL_BINARIES:
                    data = _read_binary_bytes(os.path.join(k, name))
                    if data is None:
                        continue
                    for magic in magics:
                        pos = data.find(magic)
                        while pos >= 0:
                            for b, blob in index.get(data[pos:pos + _FINGERPRINT], ()):
                                if data[pos:pos + len(blob)] == blob and k not in out[b]:
                                    out[b].append(k)
                            pos = data.find(magic, pos + 1)
    return out


def stray_links(ctx, flt: ScanFilter) -> Iterator[Entry]:
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

class TilelangLayout(ModuleLayout):
    """tilelang: kernels embed the cuda-binaries they were built from; writes go through .staging/."""

    shape = TILELANG
    provider_kinds = frozenset({"binary"})
    binary_kinds = frozenset({"binary"})

    def users(self, root: Path, providers: list[str]) -> dict[str, list[str]]:
        return binary_users(root, providers)

    def use_words(self, kind: str) -> tuple[str, str]:
        return "embeds", "embedded in"

    def leftover(self, entry: Entry) -> Leftover | None:
        rel = entry.relpath
        if rel.startswith(STAGING + "/") or f"/{STAGING}/" in rel:
            return Leftover(STAGING_WHAT, "tilelang staging left by an interrupted write", None)
        return None

    def leftover_parts(self, entry: Entry, warn) -> list[Entry]:
        if os.path.basename(entry.path) != BINARIES_DIR or not os.path.isdir(entry.path):
            return [entry]
        # .staging/cuda-binaries/ holds one directory per write: each is judged on its own
        from dataclasses import replace

        from kcache_cli.scan import listdir

        out = []
        for de in listdir(entry.path, warn):
            u = measure_tree(de.path, warn)
            rel = f"{entry.relpath}/{de.name}"
            out.append(replace(entry, path=de.path, relpath=rel, hash=de.name, size=u.size, files=u.files,
                               modified=u.mtime, last_used=u.mtime))
        return out

    def platform(self, entry: Entry) -> str | None:
        if entry.kind == "kernel" and entry.space and "/" in entry.space:
            return entry.space.split("/", 1)[1]
        return None


LAYOUT = TilelangLayout()
