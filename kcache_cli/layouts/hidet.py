"""hidet's operator cache, as real hidet 0.6.1 writes it and as kcache itself builds it (the seed
layout): <root>/ops/<target>_space_<level>/<op>/<hash>/, plus graphs/ and ir_modules/."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator

from kcache_cli import fsread, state
from kcache_cli.checks import (changed_since, check_manifest, elf_truncated, list_files, listing_or_unreadable,
                              read_every_byte, read_head, read_text, size_mismatch, unreadable)
from kcache_cli.layouts.base import TEMP, InnerLeftover, Leftover, ModuleLayout
from kcache_cli.layouts.shapes import HIDET
from kcache_cli.locking import entry_build_locked, probe_locked
from kcache_cli.names import visible_dirs
from kcache_cli.model import (BUILDING, COMPLETE, CORRUPT, FAILED, PARTIAL, STALE, UNREADABLE, UNREADABLE_REASON,
                              Details, Entry, Judgement, LogFile, ScanFilter, TensorInfo, measure_tree)

NAME = HIDET.name
SPACE_RE = HIDET.kinds[0].segments[1]  # <target>_space_<level>: groups 1 (target) and 2 (level)
BINARY = "lib.so"
LOGS = ("nvcc_log.txt", "nvcc_output.txt", "gcc_output.txt")  # kcache/seed, real hidet cuda, real hidet cpu
MANIFEST = "kcache.json"  # kcache's own record: per-file size and sha256, arch, compiler, command
# Files only real hidet writes; their presence means hidet's completion rules apply.
HIDET_MARKERS = ("version.txt", "compile.sh", "meta.json", "task.pickle", "func_types.pickle")
OTHER_KINDS = tuple((k.template.split("/")[0], k.kind) for k in HIDET.kinds[1:])  # (("graphs", "graph"), ...)


# ---- evidence: what makes a directory hidet's ----------------------------------------------------
ENTRY_NAME = re.compile(r"^[0-9a-f]{16}$")  # sha256(task.txt)[:16]
OTHER_NAME = re.compile(r"^[0-9a-f]{8,64}$")  # graphs/<hash>/, ir_modules/<hash>/
TEMP_NAME = re.compile(r"^" + re.escape(state.TEMP_PREFIX) + r"[0-9a-f]{16}-[0-9a-f]+$")  # a kcache build's
OP_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
TARGETS = ("cuda", "cpu", "hip")
# Files real hidet 0.6.1 or kcache write in an op entry (and hidet in graphs/ and ir_modules/).
ENTRY_FILES = frozenset({"task.txt", "task.pickle", "version.txt", "meta.json", "candidates.txt", "candidates.json",
                         "candidates", "source.cu", "source.cc", "compile.sh", "lib.so", "nvcc_output.txt",
                         "gcc_output.txt", "func_types.pickle", ".lock", "dispatch_table.txt",
                         "dispatch_table.txt.lock", "dispatch_table.txt.t_lock", "summary.txt", "nvcc_log.txt",
                         MANIFEST})
OTHER_FILES = ENTRY_FILES | {"graph_string.txt", "graph_module", "kernels", "weights.npz", "graph_execution.json"}


def shape_problem(relpath: str, kind: str, names: frozenset[str] | None, root: Path | None = None) -> str | None:
    """None when `relpath` has the exact shape of a hidet entry of `kind` (ops/<target>_space_<N>/<op>/
    <16 hex>/ holding hidet's or kcache's files; a kcache build's temp dir; graphs|ir_modules/<hex>/);
    else why it is not one. `names` (the files in it) is None when only the path is judged."""
    parts = relpath.split("/")
    if kind == "op":
        if len(parts) != 4 or parts[0] != "ops" or not SPACE_RE.match(parts[1]) or not OP_NAME.match(parts[2]):
            return "not at ops/<target>_space_<N>/<op>/<hash>/"
        if TEMP_NAME.match(parts[3]):
            return None
        if not ENTRY_NAME.match(parts[3]):
            return "its name is not 16 hex digits (hidet's task hash)"
        known = ENTRY_FILES
    elif kind in ("graph", "ir_module"):
        if len(parts) != 2 or parts[0] != kind + "s" or not OTHER_NAME.match(parts[1]):
            return f"not at {kind}s/<hex hash>/"
        known = OTHER_FILES
    else:
        return f"hidet has no {kind} entries"
    if names is not None and not names & known:
        return "it holds none of the files hidet or kcache write"
    return None


def detect(root: Path) -> bool:
    """Evidence, not top-level names alone: a CACHEDIR.TAG, or ops/<cuda|cpu|hip>_space_<N>/<op>/ (read
    from directory names only: `ls --op X` reads no other op's directory), or a graphs/ or ir_modules/
    directory holding a hash-named directory with hidet's files."""
    tops = [d for d in ("ops", "graphs", "ir_modules") if (root / d).is_dir() and not (root / d).is_symlink()]
    if not tops:
        return False
    if state.has_cachedir_tag(root):
        return True
    return any(_has_evidence(root, top) for top in tops)


def _has_evidence(root: Path, top: str, budget: int = 256) -> bool:
    try:
        with os.scandir(root / top) as it:
            dirs = [de for _, de in zip(range(budget), it) if de.is_dir(follow_symlinks=False)]
    except OSError:
        return False
    for de in dirs:
        m = SPACE_RE.match(de.name)
        try:
            if top == "ops":
                if m and m.group(1) in TARGETS:
                    with os.scandir(de.path) as it:
                        if any(OP_NAME.match(o.name) and o.is_dir(follow_symlinks=False)
                               for _, o in zip(range(budget), it)):
                            return True
            elif OTHER_NAME.match(de.name) and set(os.listdir(de.path)) & OTHER_FILES:
                return True
        except OSError:
            continue
    return False


def space_name(target: str, level: int | str) -> str:
    return f"{target}_space_{level}"


def _manifest_mismatch(path: str, names: dict[str, int]) -> str | None:
    """Compare sizes with kcache.json (cheap: sizes only; checksums are for inspect/verify)."""
    record, problem = fsread.json_problem(os.path.join(path, MANIFEST))
    if problem is not None:
        return problem if "deep" in problem else f"{MANIFEST} is unreadable"
    listed = record.get("files", {}) if isinstance(record, dict) else None
    return size_mismatch(MANIFEST, listed, names)


# ---- the judgement: one function of an entry's files, for ls (cheap) and everything else (deep) -----

def _version_key(v: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", v))


_VERSIONS: dict[str, str] = {}
_BUILT: dict[str, str] = {}  # version.txt path -> its text, read once by the search for the newest


_INSTALLED: list[str] = []


def installed_version() -> str:
    """The installed hidet's version from its package metadata (hidet is not imported), or ""."""
    if not _INSTALLED:
        found = _dist_info_version()
        if found is None:  # a zip on sys.path, or metadata without a version in its name
            import importlib.metadata

            try:
                found = importlib.metadata.version("hidet")
            except (importlib.metadata.PackageNotFoundError, ValueError):
                found = ""
        _INSTALLED.append(found)
    return _INSTALLED[0]


_DIST_INFO = re.compile(r"hidet-([^-/]+)\.dist-info|hidet-([^-/]+?)(?:-py[\d.]+)?\.egg-info", re.IGNORECASE)


def _dist_info_version() -> str | None:
    """What importlib.metadata.version("hidet") answers, found as it looks (the first sys.path directory
    holding hidet's metadata) but from the directory's name: `hidet-0.6.1.dist-info` is "0.6.1", no
    metadata anywhere is "". None where only importlib.metadata can tell (a zip or egg file on
    sys.path, a `hidet.egg-info` without a version). Importing importlib.metadata and its search cost
    a fifth of an `inspect`."""
    import sys

    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except NotADirectoryError:
            return None
        except OSError:
            continue
        for name in names:
            if name[:5].lower() != "hidet" or not name.endswith(("-info", ".egg")):
                continue
            m = _DIST_INFO.fullmatch(name)
            return (m.group(1) or m.group(2)) if m else None
    return ""


def _newest_then_stale(root: Path, pairs: list[tuple[Entry, str | None]]) -> tuple[str, list[Entry]]:
    """A full scan without an installed hidet: the newest version.txt among every entry's (read once,
    by the scan's workers) is the version in use; complete entries of another version are stale."""
    from dataclasses import replace

    built = {e.path: v for e, v in pairs if v is not None}
    entries = [e for e, _ in pairs]
    for f, text in _version_texts(str(root), ops_too=False):
        built[f] = text.strip()
    version = max({v for v in built.values() if v}, key=_version_key, default="")
    _VERSIONS[str(root)] = version
    if not version:
        return version, entries
    return version, [replace(e, status=STALE, reason=_stale_reason(built[e.path], version))
                     if e.status == COMPLETE and e.path in built and built[e.path] != version else e
                     for e in entries]


def version_in_use(root: str | os.PathLike, fresh: bool = False) -> str:
    """The hidet version whose loader decides: the installed hidet's (its metadata, without importing
    it), else the newest version.txt in the whole cache (whatever part of it a command lists: `ls --op
    X` judges X's entries as `ls` does), else "" (unknown: no entry is judged stale)."""
    key = str(root)
    if fresh:  # every scan looks again; the judgements that follow it in one command reuse its answer
        _forget(root)
    if key in _VERSIONS:
        return _VERSIONS[key]
    found = installed_version()
    if not found:
        texts = _version_texts(key)
        _BUILT.update(texts)  # the judgements of these entries need them too: read once
        seen = {text.strip() for _, text in texts} - {""}
        found = max(seen, key=_version_key, default="")
    _VERSIONS[key] = found
    return found


def _forget(root: str | os.PathLike) -> None:
    _VERSIONS.pop(str(root), None)
    _BUILT.clear()


def _version_texts(root: str, ops_too: bool = True) -> list[tuple[str, str]]:
    """(path, text) of every version.txt of the compiled modules: ops/<space>/<op>/<hash> (not without
    `ops_too`), ir_modules/<hash> and graphs/<graph>/kernels/<kernel>. Directories are listed by name
    (d_type: no stat), links and hidden names skipped; each file is read bounded, never a link, FIFO or
    device. What an earlier run read is served where lstat proves it unchanged (index.group_texts): this
    runs on every entry of the cache before one `inspect` can be answered."""
    from kcache_cli.index import group_texts

    groups: list[str] = []
    if ops_too:
        for space in _subdirs(os.path.join(root, "ops")):
            groups += _subdirs(space)
    groups.append(os.path.join(root, "ir_modules"))
    groups += [os.path.join(g, "kernels") for g in _subdirs(os.path.join(root, "graphs"))]
    return group_texts(root, groups, "version.txt", 256)


def _subdirs(path: str) -> list[str]:
    """The paths of the visible directories in `path` (links not followed)."""
    return [os.path.join(path, n) for n in visible_dirs(path)]


def _names(path: str) -> tuple[dict[str, int] | None, dict[str, float], str | None]:
    """Top-level file sizes and mtimes of a directory, or None and why it cannot be read."""
    names: dict[str, int] = {}
    mtimes: dict[str, float] = {}
    try:
        with os.scandir(path) as it:
            for de in it:
                try:
                    if de.is_dir(follow_symlinks=False):
                        continue
                    st = de.stat(follow_symlinks=False)
                except OSError:
                    continue
                names[de.name] = st.st_size
                mtimes[de.name] = st.st_mtime
    except FileNotFoundError:
        return None, mtimes, "missing"
    except OSError as exc:
        return None, mtimes, f"cannot read the directory: {exc.strerror}"
    return names, mtimes, None


def _module(path: str, prefix: str, names: dict[str, int], mtimes: dict[str, float] | None, deep: bool,
            marker: bool) -> Judgement | None:
    """hidet's rule for one compiled module directory (an op entry, an ir_module, a graph's module or
    kernel): a non-empty lib.so and, with `marker`, func_types.pickle (written last). None: it passes."""
    lib = names.get(BINARY)
    out = next((n for n in ("nvcc_output.txt", "gcc_output.txt") if n in names), None)
    if lib is None:
        if out:  # hidet writes the compiler's output only after the compiler exits 0
            return Judgement.of(CORRUPT, f"{prefix}{BINARY} is missing although the compile succeeded "
                                         f"({prefix}{out} is written only after the compiler exits 0)")
        if "nvcc_log.txt" in names:  # kcache's own log: written once the compiler has finished, and
            # kcache publishes nothing else without a lib.so, so this is a compile that failed
            return Judgement.of(FAILED, f"compile failed: {prefix}nvcc_log.txt but no {BINARY}")
        return Judgement.of(PARTIAL, f"no {prefix}{BINARY}: the build was interrupted or is still running")
    if lib == 0:
        why = fsread.why_unreadable(os.path.join(path, BINARY))
        if why:  # a FIFO, a device or a link where lib.so belongs: said, never read
            return Judgement.of(CORRUPT, f"cannot read {prefix}{BINARY}: {why}")
        if "func_types.pickle" in names:
            return Judgement.of(CORRUPT, f"{prefix}{BINARY} is empty (emptied after hidet finished the entry)")
        return Judgement.of(PARTIAL, f"{prefix}{BINARY} is empty: the compile was interrupted")
    if marker and "func_types.pickle" not in names:
        return Judgement.of(PARTIAL, f"no {prefix}func_types.pickle: hidet did not finish writing it")
    why = unreadable(os.path.join(path, BINARY))
    if why:
        return Judgement.of(UNREADABLE, prefix + why)
    done = MANIFEST if MANIFEST in names else "func_types.pickle"
    if deep or changed_since(mtimes, done, (BINARY,)):
        head = read_head(os.path.join(path, BINARY))
        why = fsread.why_unreadable(os.path.join(path, BINARY)) if not head else None
        if why:  # a FIFO, a device or a link where lib.so belongs: said, never read
            return Judgement.of(CORRUPT, f"cannot read {prefix}{BINARY}: {why}")
        truncated = elf_truncated(BINARY, head, lib)
        if truncated:
            return Judgement.of(CORRUPT, prefix + truncated)
    return None


def _stale(path: str, prefix: str, names: dict[str, int], version: str | None, required: bool,
           root: str | os.PathLike) -> Judgement | None:
    """version.txt against the hidet in use (None: not known yet, looked up only here, where an entry
    has a version.txt: an entry without one never needs the whole cache's newest version.txt); another
    version is stale (hidet rebuilds it)."""
    if "version.txt" not in names:
        if required:
            return Judgement.of(CORRUPT, f"no {prefix}version.txt: hidet will not load this entry and rebuilds it")
        return None
    if version is None:
        version = version_in_use(root)
    if not version:
        return None  # unknown yet (a full scan decides it after reading every entry's version.txt)
    vpath = os.path.join(path, "version.txt")
    text = _BUILT.get(vpath)
    if text is None:
        text = read_text(vpath, 256)
    if text is None:
        why = unreadable(os.path.join(path, "version.txt")) or "version.txt cannot be read"
        return Judgement.of(UNREADABLE, prefix + why)
    built = text.strip()
    if built != version:
        return Judgement.of(STALE, _stale_reason(built, version))
    return None


def _stale_reason(built: str, version: str) -> str:
    return f"built by hidet {built or '(empty version.txt)'}; hidet {version} will rebuild it"


def _task(path: str, names: dict[str, int], mtimes: dict[str, float] | None, deep: bool) -> Judgement | None:
    """task.txt must still hash to the directory's name. Read by ls only when it changed after the
    entry was finished (an edit after the build): after func_types.pickle (hidet), kcache.json (kcache),
    or in the seed layout, which has no completion marker, after lib.so (the compile that writes it
    starts once task.txt is written)."""
    if "task.txt" not in names:
        return None
    if any(m in names for m in HIDET_MARKERS):
        done = "func_types.pickle"
    else:
        done = MANIFEST if MANIFEST in names else BINARY
    if not deep and not changed_since(mtimes, done, ("task.txt",)):
        return None
    from kcache_cli.taskfile import read_task_file, task_hash

    try:  # bounded, and never a FIFO, a device or a link (fsread)
        data = read_task_file(os.path.join(path, "task.txt"), base=path)
    except PermissionError:
        return Judgement.of(UNREADABLE, "task.txt is unreadable (permission denied)")
    except OSError as exc:
        return Judgement.of(CORRUPT, f"cannot read task.txt: {exc.strerror}")
    name = os.path.basename(path)
    actual = task_hash(data)
    if actual != name:
        return Judgement.of(CORRUPT, f"task.txt hashes to {actual}, not {name}: its hash no longer matches "
                                     "(edited after the build?), so hidet will never load this entry")
    return None


def judge(path: str, kind: str = "op", deep: bool = False, *, names: dict[str, int] | None = None,
          mtimes: dict[str, float] | None = None, version: str | None = None,
          root: str | os.PathLike | None = None) -> Judgement:
    """The one judgement of a hidet entry. Cheap (`deep=False`): names, sizes, mtimes, version.txt, and
    contents only where something changed after the entry was finished. Deep: every byte.

    Real hidet entries follow hidet's loader (non-empty lib.so, func_types.pickle, version.txt equal to
    the hidet in use); an entry kcache built is judged by its kcache.json while hidet's own files are
    absent (hidet may rebuild it in place: then hidet's rule applies)."""
    if root is None:
        root = Path(path).parents[3] if kind == "op" else Path(path).parents[1]
    if kind == "graph":
        return _judge_graph(path, deep, version_in_use(root) if version is None else version)
    if names is None:
        names, mtimes, why = _names(path)
        if names is None:
            return Judgement.of(UNREADABLE if why != "missing" else PARTIAL, why)
    hidet_made = any(m in names for m in HIDET_MARKERS)
    if kind == "op" and MANIFEST in names and not hidet_made:
        return _judge_kcache_built(path, names, mtimes, deep)
    found = (_module(path, "", names, mtimes, deep, marker=hidet_made or kind != "op")
             or (_task(path, names, mtimes, deep) if kind == "op" else None)
             or (_stale(path, "", names, version, hidet_made and kind == "op", root) if hidet_made else None))
    if found is None and deep:
        bad = read_every_byte(path)
        if bad:
            found = Judgement.of(UNREADABLE if "unreadable" in bad else CORRUPT, bad)
    return found or Judgement(COMPLETE)


def _judge_kcache_built(path: str, names: dict[str, int], mtimes: dict[str, float] | None, deep: bool
                        ) -> Judgement:
    found = _module(path, "", names, mtimes, deep, marker=False)
    if found:
        return found
    if deep:
        text = read_text(os.path.join(path, MANIFEST))
        try:
            listed = fsread.parse_json(text or "").get("files") or {}
        except (ValueError, AttributeError):
            return Judgement.of(CORRUPT, f"{MANIFEST} is not valid JSON")
        problems = check_manifest(path, MANIFEST, listed)
        if problems:
            status = UNREADABLE if all("Permission denied" in p for p in problems) else CORRUPT
            return Judgement(status, problems[0], tuple(problems))
    elif changed_since(mtimes, MANIFEST):
        bad = _manifest_mismatch(path, names)
        if bad:
            return Judgement.of(CORRUPT, bad)
    return _task(path, names, mtimes, deep) or Judgement(COMPLETE)


def _graph_kernels(path: str) -> list[str]:
    try:
        return sorted((d.name for d in os.scandir(os.path.join(path, "kernels"))
                       if d.is_dir(follow_symlinks=False)), key=lambda n: (len(n), n))
    except OSError:
        return []


def _judge_graph(path: str, deep: bool, version: str) -> Judgement:
    """A compiled graph: its graph_module/ and every kernels/<i>/ (meta.json's num_kernels of them)
    must be loadable; a graph whose kernels were built by another hidet is stale as a whole."""
    meta = _json(os.path.join(path, "meta.json")) or {}
    parts = ["graph_module", *(f"kernels/{k}" for k in _graph_kernels(path))]
    wanted = meta.get("num_kernels")
    if isinstance(wanted, int):
        missing = [i for i in range(wanted) if f"kernels/{i}" not in parts]
        if missing:
            return Judgement.of(PARTIAL, f"no kernels/{missing[0]} (meta.json says {wanted} kernels)")
    built = meta.get("hidet_version")
    if version and isinstance(built, str) and built and built != version:
        return Judgement.of(STALE, f"built by hidet {built}; hidet {version} will rebuild it")
    for part in parts:
        sub = os.path.join(path, part)
        names, mtimes, why = _names(sub)
        if names is None:
            if why == "missing":
                return Judgement.of(PARTIAL, f"no {part}/: hidet did not finish the graph")
            return Judgement.of(UNREADABLE, f"{part}: {why}")
        found = (_module(sub, f"{part}/", names, mtimes, deep, marker=part != "graph_module")
                 or _stale(sub, f"{part}/", names, version, False, ""))
        if found:
            return found
    if deep:
        bad = read_every_byte(path)
        if bad:
            return Judgement.of(UNREADABLE if "unreadable" in bad else CORRUPT, bad)
    return Judgement(COMPLETE)


def _json(path: str) -> dict | None:
    return fsread.json_object(path)


def op_status(path: str, names: dict[str, int], head: bytes | None = None,
              mtimes: dict[str, float] | None = None) -> tuple[str, str | None]:
    """The cheap judgement of an op entry as (status, reason), for callers that have its names."""
    j = judge(path, "op", False, names=names, mtimes=mtimes)
    return j.status, j.reason


def other_target(path: str, kind: str) -> str | None:
    """An ir_module's or graph's target: meta.json's, else the compiler its compile.sh runs."""
    meta = _json(os.path.join(path, "meta.json")) or {}
    if isinstance(meta.get("target"), str) and meta["target"]:
        return meta["target"].split()[0]
    sub = "graph_module" if kind == "graph" else ""
    script = read_text(os.path.join(path, sub, "compile.sh"), 1 << 16) or ""
    if re.search(r"\bnvcc\b", script):
        return "cuda"
    if re.search(r"\b(g\+\+|gcc|c\+\+|clang\+\+)\b", script):
        return "cpu"
    return None


def _space_dirs(ctx, ops: Path, flt: ScanFilter) -> Iterator[tuple[str, str, str]]:
    if flt.spaces:
        candidates = [(s, str(ops / s)) for s in flt.spaces if (ops / s).is_dir()]
    else:
        candidates = [(d.name, d.path) for d in ctx.listdir(ops) if d.is_dir(follow_symlinks=False)]
    for name, path in candidates:
        m = SPACE_RE.match(name)
        if m and flt.wants_target(m.group(1)):
            yield name, m.group(1), path


def _listing(ctx, path: str, job: tuple, out: list[Entry], keep=None) -> list[os.DirEntry]:
    target, space, op = job
    return listing_or_unreadable(ctx, path, out, keep, layout=NAME, kind="op", target=target, space=space, op=op)


def scan(ctx, flt: ScanFilter) -> Iterator[Entry]:
    ops = ctx.root / "ops"
    # Listing the entry directories is cheap; reading them is the work, done in parallel.
    listed: list[tuple[str, str, str, str, str]] = []
    prefixes = flt.name_prefixes()
    named = (lambda de: de.name.startswith(prefixes) or de.name.startswith(state.TEMP_PREFIX)) if prefixes else None
    blocked: list[Entry] = []
    # Without an installed hidet, a full scan learns the version in use from the entries it reads.
    later = not installed_version() and not (flt.ops or flt.spaces or flt.targets or flt.hash_prefixes or flt.paths)
    if later:
        _forget(ctx.root)
    for space, target, space_path in _space_dirs(ctx, ops, flt):
        if flt.ops:
            op_dirs = [(o, os.path.join(space_path, o)) for o in flt.ops if os.path.isdir(os.path.join(space_path, o))]
        else:
            op_dirs = [(d.name, d.path) for d in _listing(ctx, space_path, (target, space, None), blocked)
                       if d.is_dir(follow_symlinks=False)]
        for op, op_path in op_dirs:
            for de in _listing(ctx, op_path, (target, space, op), blocked, named):
                if de.is_dir(follow_symlinks=False):  # not lock files and strays
                    listed.append((de.path, de.name, target, space, op))
    version = "" if later or not ctx.statuses else _version_for(ctx.root, flt, listed)
    jobs = [(*job, version) for job in listed]
    yield from blocked
    if later:
        version, found = _newest_then_stale(ctx.root, list(ctx.map_entries(_op_entry_and_version, jobs)))
        yield from found
    else:
        yield from ctx.map_entries(_op_entry, jobs)
    if flt.ops or flt.spaces:
        return  # graphs and ir_modules have no op or space
    for dirname, kind in OTHER_KINDS:
        for de in ctx.listdir(ctx.root / dirname):
            if de.is_dir(follow_symlinks=False):
                built_for = other_target(de.path, kind)
                if not flt.wants_target(built_for):
                    continue
                j = judge(de.path, kind, False, version=version, root=ctx.root)
                yield ctx.entry(path=de.path, usage=measure_tree(de.path, ctx.warn), layout=NAME, kind=kind,
                                target=built_for, space=None, op=None, hash=de.name, status=j.status, reason=j.reason)


_FEW = 16


def _version_for(root: Path, flt: ScanFilter, jobs: list[tuple]) -> str:
    """The version in use for judging `jobs`. A lookup by name (`inspect <prefix>`: a few op entries and
    no graph) where none of the entries has a version.txt needs none: "" then, and the whole cache's
    version.txt files are not read. A version.txt appearing after this look is judged as one of an
    unknown version, as the cache looked a moment before (and the index stores no file that new)."""
    lookup = (flt.hash_prefixes or flt.paths) and (flt.ops or flt.spaces) and len(jobs) <= _FEW
    if lookup and not any(os.path.lexists(os.path.join(job[0], "version.txt")) for job in jobs):
        _forget(root)  # what inspect looks up later is looked up afresh too
        return ""
    return version_in_use(root, fresh=True)


def _op_entry_and_version(ctx, job: tuple[str, str, str, str, str, str]) -> tuple[Entry, str | None]:
    """The entry (judged without a version yet) and its version.txt, read in the same worker."""
    with fsread.held(job[0]):
        e = _op_entry(ctx, job)
        listing = fsread.held_listing(job[0])
        if listing is not None and "version.txt" not in listing:
            return e, None  # none when the scan listed the directory: not looked for again
        if e.status != UNREADABLE and not job[1].startswith("."):
            text = read_text(os.path.join(e.path, "version.txt"), 256)
            return e, text.strip() if text is not None else None
    return e, None


def _op_entry(ctx, job: tuple[str, str, str, str, str, str]) -> Entry:
    with fsread.held(job[0]):  # one fd of the entry's directory for every read of its files
        return _judged_op_entry(ctx, job)


def _judged_op_entry(ctx, job: tuple[str, str, str, str, str, str]) -> Entry:
    path, name, target, space, op, version = job
    reason: str | None
    names, usage, mtimes = ctx.read_dir(path)
    building = state.temp_hash(name)
    if names is None:
        status, reason, key = UNREADABLE, UNREADABLE_REASON, name
    elif building is not None:
        final = f"{ctx.rel(os.path.dirname(path))}/{building}"
        if entry_build_locked(ctx.root, final):
            status, reason = BUILDING, "kcache build in progress"
        else:
            status, reason = PARTIAL, "temp directory left by an interrupted kcache build"
        key = name[len(state.TEMP_PREFIX):]
    elif name.startswith("."):
        status, reason, key = PARTIAL, "hidden directory (not a hidet entry)", name
    else:
        j = judge(path, "op", False, names=names, mtimes=mtimes, version=version, root=ctx.root)
        status, reason = j.status, j.reason
        key = name
        if status == PARTIAL and ".lock" in names and probe_locked(os.path.join(path, ".lock")):
            status, reason = BUILDING, "hidet holds the entry's lock (compiling)"
    return ctx.entry(path=path, usage=usage, layout=NAME, kind="op", target=target, space=space, op=op,
                     hash=key, status=status, reason=reason)


# ---- deep checks ---------------------------------------------------------------------------------

def command_from_script(text: str) -> str:
    """The command lines of a compile.sh, without the shebang and blank lines."""
    return "\n".join(line for line in text.splitlines() if line.strip() and not line.startswith("#!")).strip()


def _dim(d):
    """A shape dimension as JSON wants it: an integer when it is one (task.txt gives strings)."""
    if isinstance(d, str) and re.fullmatch(r"-?\d+", d.strip()):
        return int(d)
    return d


def _tensors(items, given: tuple[TensorInfo, ...] = ()) -> tuple[TensorInfo, ...]:
    got = []
    for i, t in enumerate(items or []):
        if not isinstance(t, dict):
            continue
        name = given[i].name if i < len(given) else t.get("name")
        got.append(TensorInfo(name, str(t.get("dtype")), tuple(_dim(d) for d in t.get("shape") or ())))
    return tuple(got) or given


def _deep_judgement(root: Path, entry: Entry) -> Judgement:
    if entry.status in (BUILDING,) or not entry.hash or os.path.basename(entry.path).startswith("."):
        return Judgement.of(entry.status, entry.reason)  # temp dirs, hidden dirs, unlistable dirs
    return judge(entry.path, entry.kind, True, root=root)


def _module_dirs(entry: Entry) -> list[str]:
    """The directories holding compiled modules: the entry itself, or a graph's module and kernels."""
    if entry.kind != "graph":
        return [entry.path]
    return [os.path.join(entry.path, "graph_module"),
            *(os.path.join(entry.path, "kernels", k) for k in _graph_kernels(entry.path))]


def describe(root: Path, entry: Entry) -> Details:
    p = entry.path
    facts: list[tuple[str, str]] = []
    verdict = _deep_judgement(root, entry)
    problems = list(verdict.problems)
    files = list_files(p, problems.append)
    task_op, inputs, outputs = _describe_task(entry, problems, facts) if entry.kind == "op" else (None, (), ())
    meta, bad = fsread.json_problem(os.path.join(p, "meta.json"), base=p)
    if bad and not bad.endswith("missing"):
        problems.append(bad)
    if meta:
        facts.append(("hidet version", str(meta.get("hidet_version"))))
        if meta.get("target"):
            facts.append(("meta target", str(meta["target"])))
        inputs, outputs = _tensors(meta.get("inputs"), inputs), _tensors(meta.get("outputs"), outputs)
        if entry.kind == "graph" and meta.get("num_kernels") is not None:
            facts.append(("kernels", str(meta["num_kernels"])))
    version = read_text(os.path.join(p, "version.txt"))
    if version is not None:
        facts.append(("version.txt", version.strip()))
    if version is not None or entry.kind == "graph":  # what decides this entry: the whole cache's newest
        facts.append(("hidet in use", version_in_use(root) or "unknown (not installed, no version.txt)"))
    elif installed := installed_version():  # no version.txt here: no search of the cache for the newest one
        facts.append(("hidet in use", installed))
    manifest, bad = fsread.json_problem(os.path.join(p, MANIFEST), base=p)
    if bad and not bad.endswith("missing"):
        problems.append(bad)
    if isinstance(manifest, dict):
        for key in ("arch", "compiler", "kcache_version"):
            if manifest.get(key):
                facts.append((f"recorded {key}", str(manifest[key])))
    main = _module_dirs(entry)[0]
    command = output = None
    log = read_text(os.path.join(main, "nvcc_log.txt"))
    script = read_text(os.path.join(main, "compile.sh"))
    if script is not None:
        command = command_from_script(script)
    elif log:
        command = log.splitlines()[0].strip() if log.strip() else None
    for name in ("nvcc_output.txt", "gcc_output.txt"):
        output = output or read_text(os.path.join(main, name))
    if output is None and log:
        output = "\n".join(log.splitlines()[1:])
    if os.path.isdir(os.path.join(p, "candidates")):
        facts.append(("candidates/", "auto-tuning leftovers (prune removes them)"))
    binaries = tuple(os.path.join(d, BINARY) for d in _module_dirs(entry) if os.path.lexists(os.path.join(d, BINARY)))
    status, reason = verdict.status, verdict.reason
    if problems and status == COMPLETE:
        status, reason = CORRUPT, problems[0]
    return Details(entry, status, reason, tuple(problems), files, task_op, inputs, outputs, command, output,
                   binaries, tuple(facts))


def _describe_task(entry: Entry, problems: list[str], facts: list[tuple[str, str]]
                   ) -> tuple[str | None, tuple[TensorInfo, ...], tuple[TensorInfo, ...]]:
    """The op's name and tensors from task.txt (its hash is part of the judgement)."""
    from kcache_cli.taskfile import TaskFormatError, parse_task, read_task_file

    try:
        data = read_task_file(os.path.join(entry.path, "task.txt"), base=entry.path)
    except FileNotFoundError:
        facts.append(("task", "no task.txt in this entry"))
        return entry.op, (), ()
    except OSError as exc:
        problems.append(f"cannot read task.txt: {exc.strerror or exc}")
        return entry.op, (), ()
    try:
        task = parse_task(data)
    except TaskFormatError as exc:
        problems.append(str(exc))
        return entry.op, (), ()
    if task.name != entry.op:
        problems.append(f"task.txt names op '{task.name}' but the entry sits under '{entry.op}'")

    def info(t) -> TensorInfo:
        return TensorInfo(t.name, t.dtype, tuple(_dim(d) for d in t.shape))

    return task.name, tuple(info(t) for t in task.inputs), tuple(info(t) for t in task.outputs)


def log_files(entry: Entry) -> list[LogFile]:
    """kcache's nvcc_log.txt, or hidet's compile.sh then the compiler's output (for a graph: its
    graph module's, then each kernel's)."""
    out = []
    for d in _module_dirs(entry):
        label = "" if d == entry.path else os.path.relpath(d, entry.path) + "/"
        if os.path.lexists(os.path.join(d, "nvcc_log.txt")):
            out.append(LogFile(label + "nvcc_log.txt", os.path.join(d, "nvcc_log.txt")))
            continue
        out.extend(LogFile(label + n, os.path.join(d, n)) for n in ("compile.sh", "nvcc_output.txt", "gcc_output.txt")
                   if os.path.lexists(os.path.join(d, n)))
    return out


# ---- for prune/clear -----------------------------------------------------------------------------

def stray_links(ctx, flt: ScanFilter) -> Iterator[Entry]:
    """Symlinks where ops/, a space, an op or an entry belongs: the scan never follows them (it skips
    them); prune --broken and clear remove them as links, leaving their targets alone."""
    def link(path: str, kind: str, target, space, op, h: str) -> Entry:
        return ctx.link_entry(path, layout=NAME, kind=kind, target=target, space=space, op=op, hash=h)

    plain = not (flt.ops or flt.spaces or flt.targets)
    for top, kind in (("ops", "op"), *OTHER_KINDS):
        path = ctx.root / top
        if path.is_symlink():
            if plain:
                yield link(str(path), kind, None, None, None, "")
        elif kind != "op" and plain:
            for de in ctx.listdir(path):
                if de.is_symlink():
                    yield link(de.path, kind, None, None, None, de.name)
    ops = ctx.root / "ops"
    if ops.is_symlink():
        return
    for sd in ctx.listdir(ops):
        m = SPACE_RE.match(sd.name)
        target = m.group(1) if m else None
        if not (flt.wants_space(sd.name) and flt.wants_target(target)):
            continue
        if sd.is_symlink():
            if not flt.ops:
                yield link(sd.path, "op", target, sd.name, None, "")
            continue
        if not sd.is_dir(follow_symlinks=False):
            continue
        for od in ctx.listdir(sd.path):
            if not flt.wants_op(od.name):
                continue
            if od.is_symlink():
                yield link(od.path, "op", target, sd.name, od.name, "")
            elif od.is_dir(follow_symlinks=False):
                for de in ctx.listdir(od.path, keep=os.DirEntry.is_symlink):
                    yield link(de.path, "op", target, sd.name, od.name, de.name)


# ---- the layout ----------------------------------------------------------------------------------

_TEMP_MARK = "/" + state.TEMP_PREFIX


class HidetLayout(ModuleLayout):
    """hidet's operator cache; also where `kcache build` publishes (kcache's temp dirs are its leftovers)."""

    shape = HIDET
    writer_locks = (".lock", "dispatch_table.txt.lock")
    fact_files = (MANIFEST, "compile.sh", "nvcc_log.txt")

    def leftover(self, entry: Entry) -> Leftover | None:
        name = os.path.basename(entry.path)
        if _TEMP_MARK not in entry.relpath or not name.startswith(state.TEMP_PREFIX):
            return None
        return Leftover(TEMP, "temp directory of an interrupted kcache build",
                        f"{os.path.dirname(entry.relpath)}/{state.temp_hash(name)}")

    def inner_leftovers(self, entry: Entry) -> list[InnerLeftover]:
        if entry.kind != "op":
            return []
        return [InnerLeftover("candidates", "auto-tuning leftovers (candidates/)",
                              "candidates/ kept: hidet holds the entry's lock (tuning)")]

    def empty_parent_levels(self, kind: str) -> int:
        return 2 if kind == "op" else 0  # the op and space directories; ops/ itself tells the layout

    def compile_command(self, small) -> str | None:
        if small.get("compile.sh") is not None:
            return command_from_script(small["compile.sh"].decode("utf-8", "replace"))
        if small.get("nvcc_log.txt"):
            return (small["nvcc_log.txt"].decode("utf-8", "replace").splitlines() or [""])[0]
        return None


LAYOUT = HidetLayout()
