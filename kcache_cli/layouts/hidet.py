"""hidet's operator cache, as real hidet 0.6.1 writes it and as kcache itself builds it (the seed
layout): <root>/ops/<target>_space_<level>/<op>/<hash>/, plus graphs/ and ir_modules/."""

from __future__ import annotations

import functools
import os
import re
import stat
import sys
from pathlib import Path
from typing import Iterator, Mapping, NamedTuple

from kcache_cli.formats.gpu import arch_runs_on, archs_from_command, cuda_archs
from kcache_cli.formats.taskfile import TaskFormatError, parse_task, read_task_file
from kcache_cli.fs import read as fsread
from kcache_cli.fs import state
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.fs.locking import entry_build_locked, probe_locked
from kcache_cli.layouts._common import command_from_script
from kcache_cli.layouts.base import (
    HIT,
    MISS,
    TEMP,
    UNKNOWN,
    CompiledAgain,
    Here,
    InnerLeftover,
    Judging,
    Layout,
    Leftover,
    ScanContext,
    Verdict,
    not_installed,
    unasked,
)
from kcache_cli.layouts.shapes import HIDET
from kcache_cli.model.checks import (
    changed_since,
    check_manifest,
    elf_truncated,
    first_not_regular,
    list_files,
    listing_or_unreadable,
    not_regular,
    size_mismatch,
    subdirs_or_unreadable,
)
from kcache_cli.model.records import (
    BUILDING,
    COMPLETE,
    CORRUPT,
    FAILED,
    PARTIAL,
    UNREADABLE,
    UNREADABLE_REASON,
    Details,
    Entry,
    Judgement,
    LogFile,
    ScanFilter,
    TensorInfo,
    measure_tree,
)
from kcache_cli.util.units import is_digits

NAME = HIDET.name
SPACE_RE = HIDET.kinds[0].segment(1)  # <target>_space_<level>: groups 1 (target) and 2 (level)
BINARY = "lib.so"
MANIFEST = "kcache.json"  # kcache's own record: per-file size and sha256, arch, compiler, command
# Files only real hidet writes; their presence means hidet's completion rules apply.
HIDET_MARKERS = ("version.txt", "compile.sh", "meta.json", "task.pickle", "func_types.pickle")
OTHER_KINDS = tuple((k.template.split("/")[0], k.kind) for k in HIDET.kinds[1:])  # (("graphs", "graph"), ...)


# ---- evidence: what makes a directory hidet's ----------------------------------------------------
ENTRY_NAME = re.compile(r"^[0-9a-f]{16}$")  # sha256(task.txt)[:16]
OTHER_NAME = re.compile(r"^[0-9a-f]{8,64}$")  # graphs/<hash>/, ir_modules/<hash>/
# a kcache build's temp directory (.kcache-tmp-<hash>-<random>), or an import's copy (-<pid>-<random>)
TEMP_NAME = re.compile(r"^" + re.escape(state.TEMP_PREFIX) + r"[0-9a-f]{16}-[0-9a-f]+(-[0-9a-f]+)?$")
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
    tops = [d for d in ("ops", "graphs", "ir_modules") if fsread.is_real_dir(root / d)]
    if not tops:
        return False
    if state.has_cachedir_tag(root):
        return True
    return any(_has_evidence(root, top) for top in tops)


def _has_evidence(root: Path, top: str, budget: int = 256) -> bool:
    try:
        dirs = [de for de in fsread.scandir_list(root / top, limit=budget) if de.is_dir(follow_symlinks=False)]
    except OSError:
        return False
    for de in dirs:
        m = SPACE_RE.match(de.name)
        try:
            if top == "ops":
                if m and m.group(1) in TARGETS:
                    if any(OP_NAME.match(o.name) and o.is_dir(follow_symlinks=False)
                           for o in fsread.scandir_list(de.path, limit=budget)):
                        return True
            elif OTHER_NAME.match(de.name) and set(fsread.listdir(de.path)) & OTHER_FILES:
                return True
        except OSError:
            continue
    return False


def _manifest_mismatch(d: EntryDir, names: dict[str, int]) -> str | None:
    """Compare sizes with kcache.json (cheap: sizes only; checksums are for inspect/verify)."""
    record, problem = d.json_problem(MANIFEST)
    if problem is not None:
        return problem if "deep" in problem else f"{MANIFEST} is unreadable"
    listed = record.get("files", {}) if isinstance(record, dict) else None
    return size_mismatch(MANIFEST, listed, names)


# ---- the judgement: what hidet 0.6's loader does with the entry, for ls (cheap) and all else (deep) ----
# Proven against real hidet 0.6.1 by tests/loaders/probe_hidet.py (tests/test_oracle_hidet.py). hidet's
# `build_task`: `verify_disk_cache` (version.txt equal to the running hidet's, lib.so and
# func_types.pickle present) loads the entry as it is: meta.json, lib.so, func_types.pickle and a
# dispatch_table.txt are read, and any of them damaged crashes every call. Otherwise
# `compile_task_from_scratch` rewrites task.txt, version.txt and meta.json, and `should_skip_build`
# (lib.so over 1 byte, func_types.pickle present) reuses the old lib.so: no compiler runs, so another
# version is a note, not a status; without those two files it compiles over the entry. hidet never reads
# task.txt, task.pickle, the sources or the logs on load, and follows links. A FIFO, device or socket
# (or a link to one) where it opens a file to read or rewrite it is never opened by kcache: the entry is
# unreadable, never removed (checks.not_regular); a directory there fails hidet's open (corrupt).

FUNC_TYPES = "func_types.pickle"
META = "meta.json"
DISPATCH = "dispatch_table.txt"
# TaskMetaData's fields: hidet's from_dict fails without any of them.
META_KEYS = ("name", "symbols", "inputs", "outputs", "share_map", "target", "num_candidates", "hidet_version")
WRITTEN_WITH = 2.0  # seconds: hidet writes func_types.pickle right after the compiler's lib.so and output


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


def _names(d: EntryDir) -> tuple[dict[str, int] | None, dict[str, float], str | None]:
    """Top-level file sizes and mtimes of the directory `d` holds (listed through its fd; each lstat kept
    in its listing), or None and why it cannot be read."""
    if d.fd is None and isinstance(d.error, fsread.NotRegularFile):  # a link (or a file) where it belongs
        return None, {}, f"{d.error.kind} (kcache never reads through it)"
    try:
        names, mtimes = d.files()
    except FileNotFoundError:
        return None, {}, "missing"
    except OSError as exc:
        return None, {}, f"cannot read the directory: {exc.strerror}"
    return names, mtimes, None


class _Seen(NamedTuple):
    """One file as hidet meets it: links followed (hidet follows them; kcache only reads through them).
    A NamedTuple: made for several files of every entry, where a frozen dataclass costs twice as much."""

    name: str
    exists: bool = False
    size: int = 0
    link: bool = False
    odd: str | None = None  # not a regular file: a FIFO, a directory, a device (never opened)
    unjudged: str | None = None  # checks.not_regular's reason: a FIFO, device or socket (or a link to one)
    unreadable: str | None = None  # why hidet cannot open it


def _see(d: EntryDir, name: str, names: dict[str, int]) -> _Seen:
    if name not in names:
        return _Seen(name)
    try:
        st = own = d.lstat(name)
        link = stat.S_ISLNK(st.st_mode)
        if link:
            st = d.stat(name)  # a dangling link is no file to hidet: os.path.exists says False
    except OSError:
        return _Seen(name, link=True)
    if not stat.S_ISREG(st.st_mode):
        return _Seen(name, True, st.st_size, link, odd=fsread.kind_of(st.st_mode),
                     unjudged=not_regular(name, st.st_mode, "hidet", linked=link))
    if link:  # root, as the link's maker may (fsread.linked_for: what it leads to is never read for them)
        readable = st.st_mode & 0o444 and d.access(name) and (fsread.EUID != 0 or fsread.may_read(own.st_uid, st))
        why = None if readable else f"{name} is unreadable (permission denied)"
    else:
        why = d.unreadable(name)
    return _Seen(name, True, st.st_size, link, unreadable=why)


def _read(d: EntryDir, seen: _Seen, limit: int) -> bytes | None:
    """A file's bytes (through a link when it is one, as hidet reads it: the link itself is followed, from
    the held directory, never a swapped parent), or None when it cannot be read."""
    try:
        return d.read_bytes(seen.name, limit, strict=False, follow=seen.link)
    except OSError:
        return None


def _pickle_framing(data: bytes) -> str | None:
    """Why bytes cannot be a whole pickle (never unpickled: the protocol header and the final STOP)."""
    if len(data) < 3:
        return "is empty" if not data else f"is truncated ({len(data)} bytes)"
    if data[0] != 0x80 or not 2 <= data[1] <= 5:
        return "is not a pickle (no protocol header)"
    if data[-1:] != b".":
        return "is truncated (no final STOP)"
    return None


def _meta_problem(data: bytes) -> str | None:
    try:
        meta = fsread.parse_json(data, "")
    except fsread.JsonTooDeep as exc:
        return str(exc).strip()
    except ValueError:
        return "is not valid JSON"
    if not isinstance(meta, dict) or any(k not in meta for k in META_KEYS):
        return "lacks hidet's task metadata"
    return None


def _dispatch_problem(data: bytes) -> str | None:
    """hidet's points dispatch table: a header line (the symbols) then lines of integers."""
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return "is not text"
    for i, line in enumerate(lines):
        if i and not all(is_digits(t.lstrip("-")) for t in line.split()):
            return f"line {i + 1} is not a row of integers"
    return None


def _odd(prefix: str, seen: _Seen) -> Judgement:
    """A file hidet opens that is no regular file (through a link too). A FIFO, device or socket: hidet
    opens it (a FIFO blocks it), kcache never does, so the entry is unjudged (checks.not_regular:
    unreadable, never removed). A directory: hidet's open fails on it (corrupt)."""
    if seen.unjudged:
        return Judgement.of(UNREADABLE, prefix + seen.unjudged)
    what = f"a symlink to {seen.odd}" if seen.link else seen.odd
    return Judgement.of(CORRUPT, f"cannot read {prefix}{seen.name}: {what}, not a regular file (kcache never "
                                 "reads it; hidet fails on it)")


def _file_problem(d: EntryDir, prefix: str, seen: _Seen, check, limit: int) -> Judgement | None:
    """A file hidet reads on load: missing, not a file, unreadable, or its bytes failing `check`."""
    where = prefix + seen.name
    if not seen.exists:
        return Judgement.of(CORRUPT, f"no {where}: hidet fails loading the entry on every call")
    if seen.odd:
        return _odd(prefix, seen)
    if seen.unreadable:
        return Judgement.of(UNREADABLE, prefix + seen.unreadable)
    if check is None:
        return None
    data = _read(d, seen, limit)
    bad = "cannot be read" if data is None else check(data)
    return Judgement.of(CORRUPT, f"{where} {bad}: hidet fails loading the entry on every call") if bad else None


def _binary_problem(d: EntryDir, prefix: str, lib: _Seen, mtimes: dict[str, float] | None, deep: bool,
                    done: str = FUNC_TYPES) -> Judgement | None:
    """lib.so as hidet dlopens it: an ELF whose header's section table lies within the file."""
    where = prefix + BINARY
    found = _file_problem(d, prefix, lib, None, 0)
    if found:
        return found
    if lib.size == 0:
        return Judgement.of(CORRUPT, f"{where} is empty (emptied after hidet finished the entry)")
    if deep or lib.link or lib.size < 64 or changed_since(mtimes, done, (BINARY,)):
        head = _read(d, lib, 64) or b""
        truncated = elf_truncated(BINARY, head, lib.size)
        if truncated:
            return Judgement.of(CORRUPT, prefix + truncated)
    if deep:  # every byte, as dlopen maps them
        try:
            if lib.link:
                d.read_bytes(BINARY, lib.size, strict=False, follow=True)
            else:
                for _ in d.iter_chunks(BINARY):
                    pass
        except OSError as exc:
            return Judgement.of(CORRUPT, f"cannot read {where}: {exc.strerror or exc}")
    return None


def _suspect(mtimes: dict[str, float] | None, name: str) -> bool:
    """Whether `name` changed well after hidet's compile (it writes func_types.pickle within moments of
    lib.so): only then does `ls` read it. Unknown times count as changed."""
    if not mtimes or name not in mtimes:
        return True
    before = max((mtimes[n] for n in (BINARY, "gcc_output.txt", "nvcc_output.txt") if n in mtimes), default=None)
    return before is None or mtimes[name] - before > WRITTEN_WITH


def _loaded(d: EntryDir, prefix: str, names: dict[str, int], mtimes: dict[str, float] | None, deep: bool,
            task: bool, meta: bool, lib: _Seen | None = None, ft: _Seen | None = None,
            m: _Seen | None = None) -> Judgement | None:
    """What hidet reads when it loads a compiled module (an op entry, a graph's kernel or module):
    lib.so, func_types.pickle, with `meta` meta.json, and for a `task` any dispatch_table.txt. `lib`,
    `ft`, `m`: those files as the caller saw them already (not looked at again)."""
    found = _binary_problem(d, prefix, lib or _see(d, BINARY, names), mtimes, deep)
    if found:
        return found
    ft = ft or _see(d, FUNC_TYPES, names)
    found = _file_problem(d, prefix, ft, _pickle_framing if deep or ft.link or ft.size < 3
                          or _suspect(mtimes, FUNC_TYPES) else None, 64 << 20)
    if found:
        return found
    if meta:
        m = m or _see(d, META, names)
        found = _file_problem(d, prefix, m, _meta_problem if deep or m.link or m.size == 0
                              or changed_since(mtimes, FUNC_TYPES, (META,)) else None, 1 << 20)
        if found:
            return found
    if not task or DISPATCH not in names:
        return None
    return _file_problem(d, prefix, _see(d, DISPATCH, names), _dispatch_problem, 1 << 20)


def _version_text(d: EntryDir, names: dict[str, int]) -> tuple[str | None, Judgement | None]:
    """version.txt's text as hidet reads it (None: no such file to hidet), or why hidet cannot read it."""
    seen = _see(d, "version.txt", names)
    if not seen.exists:
        return None, None
    if seen.odd:
        return None, _odd("", seen)
    if seen.unreadable:
        return None, Judgement.of(UNREADABLE, seen.unreadable + ": hidet fails reading it")
    data = _read(d, seen, 256)
    return (data or b"").decode("utf-8", "replace").strip(), None


def _recompiled(names: dict[str, int], lib: _Seen, ft: _Seen, prefix: str = "") -> Judgement:
    """hidet compiles again over the entry: why (a killed build, most often)."""
    if not lib.exists:
        if "nvcc_log.txt" in names:  # kcache's log without a lib.so: a failed build (kcache publishes none)
            return Judgement.of(FAILED, f"compile failed: {prefix}nvcc_log.txt but no {BINARY}")
        return Judgement.of(PARTIAL, f"no {prefix}{BINARY}: the build was interrupted; hidet compiles it again")
    if lib.size <= 1:
        return Judgement.of(PARTIAL, f"{prefix}{BINARY} is empty: the compile was interrupted; hidet compiles it "
                                     "again")
    return Judgement.of(PARTIAL, f"no {prefix}{FUNC_TYPES}: hidet did not finish writing it and compiles it again")


def version_note(d: EntryDir, running: str) -> str | None:
    """What a version difference with the hidet `running` means (inspect's note; never a status)."""
    names, _, _ = _names(d)
    built, _ = _version_text(d, names or {})
    if names is None or not running or built == running:
        return None
    what = f"built by hidet {built}" if built else "no version.txt" if built is None else "an empty version.txt"
    return (f"{what}; hidet {running} rewrites version.txt, task.txt and meta.json and reuses lib.so "
            "without compiling")


SWAPPED = "a directory on the way to it was replaced by a link"


def judge(d: EntryDir, kind: str = "op", jc: Judging | None = None, *, names: dict[str, int] | None = None,
          mtimes: dict[str, float] | None = None) -> Judgement:
    """The one judgement of the hidet entry `d` holds open: what hidet 0.6 does with it (see above), read
    through `d` alone. Cheap (`jc.deep` False): names, sizes, modes, mtimes, and contents only where
    something changed after the entry was finished. Deep: the bytes of every file hidet reads.
    `jc.version`: the installed hidet's ("" when none is). `names`, `mtimes`: a scan's listing of `d`."""
    if d.swapped or (d.fd is None and isinstance(d.error, fsread.NotRegularFile)):
        return Judgement.of(UNREADABLE, SWAPPED)  # a directory on the way is a link now: judge nobody's files
    jc = jc or Judging()
    if kind == "graph":
        return _judge_graph(d, jc.deep)
    if names is None:
        names, mtimes, why = _names(d)
        if names is None:
            return Judgement.of(UNREADABLE if why != "missing" else PARTIAL, why)
    return _judge_module(d, kind, jc.deep, names, mtimes, jc.version)


def _judge_module(d: EntryDir, kind: str, deep: bool, names: dict[str, int], mtimes: dict[str, float] | None,
                  running: str) -> Judgement:
    """judge() of an op entry or an ir_module, from its listing."""
    if kind == "op" and not deep and _plain_op(d, names, mtimes):
        return _COMPLETE
    if kind == "op" and not any(m in names for m in HIDET_MARKERS):
        return _judge_kcache_built(d, names, mtimes, deep, running)
    lib, ft = _see(d, BINARY, names), _see(d, FUNC_TYPES, names)
    odd = next((f for f in (lib, ft) if f.odd), None)
    if odd:  # a FIFO where lib.so belongs: hidet's loader (or its compiler) would block on it
        return _odd("", odd)
    if kind != "op":  # an ir_module: build_ir_module's should_skip_build, then the module is loaded
        if not (lib.exists and lib.size > 1 and ft.exists):
            return _recompiled(names, lib, ft)
        return _loaded(d, "", names, mtimes, deep, task=False, meta=False, lib=lib, ft=ft) or Judgement(COMPLETE)
    version = _see(d, "version.txt", names)
    if version.odd:
        return _odd("", version)
    if version.unreadable:  # verify_disk_cache opens it first, whatever follows
        return Judgement.of(UNREADABLE, version.unreadable + ": hidet fails reading it")
    # verify_disk_cache takes an empty lib.so for a missing one (an interrupted compile)
    if not (lib.exists and ft.exists) or lib.size == 0:
        return _recompiled(names, lib, ft)
    # Loaded as it is (version.txt equal to the running hidet's) or after hidet rewrote its metadata: the
    # two differ only in whether meta.json is read, and whether a one-byte lib.so is loaded or compiled
    # over. version.txt is read only where that decides (an untouched entry costs no read).
    m = _see(d, META, names)
    fixed = _unwritable(d, names)
    blocks = first_not_regular(d, (n for n in REWRITTEN if n in names), "hidet", follow=True)
    weighed = (deep or lib.size <= 1 or not m.exists or bool(m.odd or m.unreadable) or m.link or m.size == 0
               or bool(fixed or blocks) or changed_since(mtimes, FUNC_TYPES, (META,)))
    loads_as_is = weighed and _matches(d, version, running)
    if lib.size <= 1 and not loads_as_is:
        return _recompiled(names, lib, ft)
    if fixed and not loads_as_is:  # compile_task_from_scratch opens each of them for writing first
        return Judgement.of(UNREADABLE, f"{fixed} may not be written (permission denied): hidet fails rewriting "
                                        "it before it reuses lib.so")
    if blocks and not loads_as_is:  # a FIFO: hidet's open of it to write it blocks
        return Judgement.of(UNREADABLE, blocks)
    return _loaded(d, "", names, mtimes, deep, task=True, meta=loads_as_is, lib=lib, ft=ft, m=m) or Judgement(COMPLETE)


REWRITTEN = ("task.txt", "version.txt", "meta.json", "candidates.txt", "candidates.json")


# ---- the usual op entry, judged in one pass ----------------------------------------------------------
# Nearly every op entry is one hidet finished writing: its files regular, readable and writable, lib.so
# whole, func_types.pickle written with it. _plain_op tells such an entry complete with the reads the rule
# makes of it and none of its general steps, and leaves every other entry to the rule (_judge_module);
# tests/test_hidet_plain.py holds the two equal case by case.

_COMPLETE = Judgement(COMPLETE)
_PLAIN = (BINARY, FUNC_TYPES, "version.txt", META)


def _plain_op(d: EntryDir, names: dict[str, int], mtimes: dict[str, float] | None) -> bool:
    """Whether the cheap judgement finds the op entry `d` (its listing `names`, `mtimes`) complete, told in
    one pass; False where it may find otherwise (then the rule judges it): lib.so, func_types.pickle,
    version.txt and meta.json regular files, readable by the rule's test, every file hidet rewrites a
    regular one someone may write, no dispatch table, func_types.pickle written with lib.so (no framing to
    check), and what the rule would read of lib.so (its ELF header) and meta.json whole, read without
    moving their atimes (fsread.read_listed)."""
    listing, fd = d.listing, d.fd
    if fd is None or d.held or mtimes is None or DISPATCH in names:
        return False
    try:
        lib, ft, _, meta = stats = [listing[n] for n in _PLAIN]
    except KeyError:
        return False
    if not all([stat.S_ISREG(st.st_mode) for st in stats]) or any([d.unreadable(n) for n in _PLAIN]):
        return False
    for name in REWRITTEN:  # _unwritable's and first_not_regular's cases go to the rule
        st = listing.get(name)
        if st is not None and not (stat.S_ISREG(st.st_mode) and st.st_mode & 0o222):
            return False
    if lib.st_size < 64 or ft.st_size < 3 or not meta.st_size or _suspect(mtimes, FUNC_TYPES):
        return False
    if changed_since(mtimes, FUNC_TYPES, (BINARY,)):
        head = fsread.read_listed(fd, BINARY, lib, 64, head=True)
        if head is None or elf_truncated(BINARY, head, lib.st_size):
            return False
    if not changed_since(mtimes, FUNC_TYPES, (META,)):
        return True  # the rule reads neither version.txt nor meta.json
    # The rule reads version.txt, and meta.json only where it is the running hidet's (loaded as it is, not
    # rewritten): a whole meta.json is complete either way, so version.txt is not read.
    data = fsread.read_listed(fd, META, meta, 1 << 20)
    return data is not None and _meta_problem(data) is None


def _unwritable(d: EntryDir, names: dict[str, int]) -> str | None:
    """The first file hidet rewrites before reusing lib.so that nobody may write (its mode, as a listing
    shows it: root writes anyway, the cache's users do not), or None."""
    for name in REWRITTEN:
        if name in names:
            try:
                st = d.lstat(name)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and not st.st_mode & 0o222:
                return name
    return None


def _matches(d: EntryDir, version: _Seen, running: str) -> bool:
    """Whether hidet's verify_disk_cache finds version.txt equal to the running hidet's. Not installed
    where kcache runs (pipx, another venv): judged as by the hidet that wrote the entry."""
    if not version.exists:
        return False
    built = (_read(d, version, 256) or b"").decode("utf-8", "replace").strip()
    return bool(built) and built == (running or built)


def _loader_recompiles_kcache_builds(running: str) -> bool:
    return bool(running) and tuple(int(x) for x in re.findall(r"\d+", running)[:2]) >= (0, 6)


KCACHE_LACKS = "version.txt, meta.json and func_types.pickle"  # what hidet 0.6 needs that kcache build never writes
KCACHE_BUILT = (f"made by kcache build: hidet {{}} compiles it again in place (it needs {KCACHE_LACKS}); kcache "
                "build reuses it")
KCACHE_BUILT_NOTE = (f"made by kcache build: a hidet 0.6 or later would compile it again in place (it needs "
                     f"{KCACHE_LACKS})")


def _judge_kcache_built(d: EntryDir, names: dict[str, int], mtimes: dict[str, float] | None, deep: bool,
                        running: str) -> Judgement:
    """An entry made by `kcache build` (kcache.json) or the seed layout. Where a hidet 0.6 or later is
    installed, it is what that hidet does: it finds no version.txt, rewrites the metadata and compiles over
    the entry (no func_types.pickle). Where none is, kcache's own rule: lib.so whole, kcache.json's sizes
    (and, deep, checksums) matching; inspect notes what hidet 0.6 would do."""
    lib = _see(d, BINARY, names)
    if lib.unjudged:  # a FIFO lib.so: hidet's compiler writing over it, or kcache's rule reading it, blocks
        return Judgement.of(UNREADABLE, lib.unjudged)
    if not lib.exists or lib.size <= 1:
        return _recompiled(names, lib, _Seen(FUNC_TYPES))
    if lib.unreadable:
        return Judgement.of(UNREADABLE, lib.unreadable)
    if _loader_recompiles_kcache_builds(running):
        return Judgement.of(PARTIAL, KCACHE_BUILT.format(running))
    bad = kcache_built_problem(d, deep, names, mtimes)
    if bad:
        return Judgement.of(UNREADABLE if "ermission denied" in bad else CORRUPT, bad)
    return Judgement(COMPLETE)


def kcache_built_problem(d: EntryDir, deep: bool = True, names: dict[str, int] | None = None,
                         mtimes: dict[str, float] | None = None) -> str | None:
    """Why an entry `kcache build` made is not whole as kcache built it (lib.so; kcache.json's sizes, and
    deep its checksums), or None: kcache's own rule, whatever a hidet would do with the entry."""
    if names is None:
        names, mtimes, why = _names(d)
        if names is None:
            return why
    lib = _see(d, BINARY, names)
    done = MANIFEST if MANIFEST in names else FUNC_TYPES
    found = (_binary_problem(d, "", lib, mtimes, deep, done) if lib.exists
             else Judgement.of(PARTIAL, f"no {BINARY}"))
    if found:
        return found.reason
    if MANIFEST not in names:
        return None  # the seed layout: nothing more to check
    if not deep:
        return _manifest_mismatch(d, names) if changed_since(mtimes, MANIFEST) else None
    record, bad = d.json_problem(MANIFEST)
    if bad:
        return bad
    listed = record.get("files") if isinstance(record, dict) else None
    if not isinstance(listed, dict):
        return f"{MANIFEST} lists no files"
    problems = check_manifest(d, MANIFEST, listed)
    return problems[0] if problems else None


def _graph_kernels(path: str) -> list[str]:
    try:
        return sorted((d.name for d in os.scandir(os.path.join(path, "kernels"))
                       if d.is_dir(follow_symlinks=False)), key=lambda n: (len(n), n))
    except OSError:
        return []


def _graph_json(d: EntryDir, names: dict[str, int], name: str) -> tuple[dict | None, Judgement | None]:
    seen = _see(d, name, names)
    found = _file_problem(d, "", seen, lambda d: None, 1 << 20)
    if found:
        return None, Judgement.of(found.status, (found.reason or "").replace("hidet fails loading the entry",
                                                                              "load_compiled_graph fails"))
    try:
        data = fsread.parse_json(_read(d, seen, 16 << 20) or b"")
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return None, Judgement.of(CORRUPT, f"{name} is not a JSON object: load_compiled_graph fails")
    return data, None


def _judge_graph(d: EntryDir, deep: bool) -> Judgement:
    """A compiled graph, as `load_compiled_graph` reads it: meta.json, graph_execution.json, weights.npz
    (when the graph has weights), every kernels/<i>/ (meta.json's num_kernels) as a compiled task, the
    graph_module/ and graph_string.txt. It checks no version and never compiles: all of it must load."""
    names, _, why = _names(d)
    if names is None:
        return Judgement.of(UNREADABLE if why != "missing" else PARTIAL, why)
    meta, found = _graph_json(d, names, META)
    execution, found = (None, found) if found else _graph_json(d, names, "graph_execution.json")
    if found:
        return found
    assert meta is not None and execution is not None
    needs = ["graph_string.txt"] + (["weights.npz"] if execution.get("weights_index") else [])
    for name in needs:
        problem = _file_problem(d, "", _see(d, name, names), None, 0)
        if problem:
            return Judgement.of(problem.status, (problem.reason or "").replace("hidet fails loading the entry",
                                                                                "load_compiled_graph fails"))
    kernels = meta.get("num_kernels")
    parts = [f"kernels/{i}" for i in range(kernels if isinstance(kernels, int) and kernels >= 0 else 0)]
    for part in [*parts, "graph_module"]:
        found = _graph_part(d, part, deep)
        if found:
            return found
    return Judgement(COMPLETE)


def _graph_part(d: EntryDir, part: str, deep: bool) -> Judgement | None:
    """A graph's kernels/<i>/ (a compiled task) or graph_module/ (a compiled module), as hidet loads it."""
    with d.sub(part) as sub:
        sub_names, sub_mtimes, why = _names(sub)
        if sub_names is None:
            if why == "missing":
                return Judgement.of(CORRUPT, f"no {part}/: load_compiled_graph fails")
            return Judgement.of(UNREADABLE, f"{part}: {why}")
        task = part != "graph_module"
        return _loaded(sub, f"{part}/", sub_names, sub_mtimes, deep, task=task, meta=task)


def other_target(d: EntryDir, kind: str) -> str | None:
    """An ir_module's or graph's target (`d` holds it open): meta.json's, else the compiler its compile.sh
    runs."""
    meta = d.json_object("meta.json") or {}
    if isinstance(meta.get("target"), str) and meta["target"]:
        return meta["target"].split()[0]
    script = d.read_text("graph_module/compile.sh" if kind == "graph" else "compile.sh", 1 << 16) or ""
    if re.search(r"\bnvcc\b", script):
        return "cuda"
    if re.search(r"\b(g\+\+|gcc|c\+\+|clang\+\+)\b", script):
        return "cpu"
    return None


def _space_dirs(ctx, ops: Path, flt: ScanFilter) -> Iterator[tuple[str, str, str]]:
    if flt.spaces:
        candidates = [(s, str(ops / s)) for s in flt.spaces if fsread.is_real_dir(ops / s)]  # never a link
    else:
        candidates = [(d.name, d.path) for d in ctx.listdir(ops) if d.is_dir(follow_symlinks=False)]
    for name, path in candidates:
        m = SPACE_RE.match(name)
        if m and flt.wants_target(m.group(1)):
            yield name, m.group(1), path


class OpJob(NamedTuple):
    """One op entry directory for the scan to judge (in a worker process): with it, everything the
    judgement takes from outside the entry, so that the index keeps an answer per job."""

    path: str
    name: str
    target: str
    space: str
    op: str
    version: str  # the installed hidet's, which decides how hidet treats the entry ("" when no status shows)


def _listing(ctx, path: str, where: tuple[str, str, str | None], out: list[Entry]) -> list[os.DirEntry]:
    target, space, op = where
    return listing_or_unreadable(ctx, path, out, layout=NAME, kind="op", target=target, space=space, op=op)


def scan(ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]:
    ops = ctx.root / "ops"
    # Each entry is judged against the installed hidet alone (its version is in the job: the index keeps
    # answers per version); never against other entries' version.txt files.
    version = installed_version() if ctx.statuses else ""
    # Listing the entry directories is cheap; reading them is the work, done in parallel.
    jobs: list[OpJob] = []
    new_job = tuple.__new__  # OpJob(...) runs namedtuple's __new__ in Python: 10^5 of them took 30 ms
    prefixes = flt.name_prefixes()
    named = (*prefixes, state.TEMP_PREFIX) if prefixes else ()  # an entry's names: its hash, its rebuild's
    blocked: list[Entry] = []
    for space, target, space_path in _space_dirs(ctx, ops, flt):
        if flt.ops:
            op_dirs = [(o, os.path.join(space_path, o)) for o in flt.ops
                       if fsread.is_real_dir(os.path.join(space_path, o))]  # as listed below: never a link
        else:
            op_dirs = [(d.name, d.path) for d in _listing(ctx, space_path, (target, space, None), blocked)
                       if d.is_dir(follow_symlinks=False)]
        for op, op_path in op_dirs:  # every entry directory (not lock files and strays), from the kept listing
            names = subdirs_or_unreadable(ctx, op_path, blocked, named, layout=NAME, kind="op", target=target,
                                          space=space, op=op)
            jobs.extend(new_job(OpJob, (f"{op_path}/{n}", n, target, space, op, version)) for n in names)
    yield from blocked
    yield from ctx.map_entries(_op_entry, jobs)
    if flt.ops or flt.spaces:
        return  # graphs and ir_modules have no op or space
    jc = Judging(False, version=version)
    for dirname, kind in OTHER_KINDS:
        for de in ctx.listdir(ctx.root / dirname):
            if de.is_dir(follow_symlinks=False):
                yield from _other_entry(ctx, flt, de, kind, jc)


def _other_entry(ctx, flt: ScanFilter, de: os.DirEntry, kind: str, jc: Judging) -> Iterator[Entry]:
    """A graphs/<hash>/ or ir_modules/<hash>/ entry, when the filter wants its target."""
    with ctx.open_entry(de.path) as d:
        built_for = other_target(d, kind)
        if not flt.wants_target(built_for):
            return
        j = judge(d, kind, jc)
    yield ctx.entry(path=de.path, usage=measure_tree(de.path, ctx.warn), layout=NAME, kind=kind,
                    target=built_for, space=None, op=None, hash=de.name, status=j.status, reason=j.reason)


def _op_entry(ctx, job: OpJob) -> Entry:
    with ctx.open_entry(job.path) as d:  # one fd of the entry's directory for every read of its files
        return _judged_op_entry(ctx, job, d)


def _judged_op_entry(ctx, job: OpJob, d: EntryDir) -> Entry:
    path, name, target, space, op, version = job
    reason: str | None
    building = state.temp_hash(name) if TEMP_NAME.match(name) else None  # as prune's shape check names it
    names, usage, mtimes = ctx.read_dir(d, quiet=building is not None)
    if names is None and building is None:
        status, reason, key = UNREADABLE, UNREADABLE_REASON, name
    elif building is not None:  # (another member's is 0700 by design: judged by its lock, not its files)
        final = f"{ctx.rel(os.path.dirname(path))}/{building}"
        if entry_build_locked(ctx.root, final):
            status, reason = BUILDING, "kcache build in progress"
        else:
            status, reason = PARTIAL, "temp directory left by an interrupted kcache build"
        key = name[len(state.TEMP_PREFIX):]
    elif name.startswith("."):
        status, reason, key = PARTIAL, "hidden directory (not a hidet entry)", name
    elif not _hidet_named(op, name):
        misshapen = _misshapen(ctx.rel(path), op, name)
        status, reason, key = misshapen.status, misshapen.reason, name
    else:
        j = judge(d, "op", Judging(False, version=version), names=names, mtimes=mtimes)
        status, reason = j.status, j.reason
        key = name
        if status == PARTIAL and ".lock" in names and probe_locked(os.path.join(path, ".lock")):
            status, reason = BUILDING, "hidet holds the entry's lock (compiling)"
    return ctx.entry(path=path, usage=usage, layout=NAME, kind="op", target=target, space=space, op=op,
                     hash=key, status=status, reason=reason)


_HEX = "0123456789abcdef"


@functools.lru_cache(maxsize=4096)
def _op_named(op: str) -> bool:
    return OP_NAME.match(op) is not None


def _hidet_named(op: str | None, name: str) -> bool:
    """ENTRY_NAME and OP_NAME, asked of every entry of a scan cheaply (an op's answer kept)."""
    return len(name) == 16 and not name.strip(_HEX) and _op_named(op or "")


def _misshapen(relpath: str, op: str | None, name: str) -> Judgement:
    """An op entry under a name hidet never makes (planted, or another tool's; not _hidet_named): corrupt,
    as prune and clear leave it alone (shape_problem), so that ls and verify say what they do with it."""
    return Judgement.of(CORRUPT, f"not shaped like a hidet entry ({shape_problem(relpath, 'op', None)}): hidet "
                                 "never looks it up, and kcache never removes it (remove it by hand)")


# ---- deep checks ---------------------------------------------------------------------------------

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
    name = os.path.basename(entry.path)
    if entry.status in (BUILDING,) or not entry.hash or name.startswith("."):
        return Judgement.of(entry.status, entry.reason)  # temp dirs, hidden dirs, unlistable dirs
    if entry.kind == "op" and not _hidet_named(entry.op, name) and not state.temp_hash(name):
        return _misshapen(entry.relpath, entry.op, name)
    with EntryDir.open(entry.path, fsread.anchor(root)) as d:
        return judge(d, entry.kind, LAYOUT.judging(True))


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
    if bad and not bad.endswith("missing") and not verdict.problems:  # the judgement says when it matters
        facts.append(("meta.json note", f"{bad} (hidet rewrites it before it reads it)"))
    if meta:
        facts.append(("hidet version", str(meta.get("hidet_version"))))
        if meta.get("target"):
            facts.append(("meta target", str(meta["target"])))
        inputs, outputs = _tensors(meta.get("inputs"), inputs), _tensors(meta.get("outputs"), outputs)
        if entry.kind == "graph" and meta.get("num_kernels") is not None:
            facts.append(("kernels", str(meta["num_kernels"])))
    facts.extend(_version_facts(root, entry))
    manifest, bad = fsread.json_problem(os.path.join(p, MANIFEST), base=p)
    if bad and not bad.endswith("missing"):
        facts.append(("kcache.json note", f"{bad} (hidet never reads it)"))
    if isinstance(manifest, dict):
        for key in ("arch", "compiler", "kcache_version"):
            if manifest.get(key):
                facts.append((f"recorded {key}", str(manifest[key])))
    main = _module_dirs(entry)[0]
    command = output = None
    log = fsread.read_text(os.path.join(main, "nvcc_log.txt"), 1 << 20, base=p)  # no link below the root
    script = fsread.read_text(os.path.join(main, "compile.sh"), 1 << 20, base=p)  # followed (a swap since)
    if script is not None:
        command = command_from_script(script)
    elif log:
        command = log.splitlines()[0].strip() if log.strip() else None
    for name in ("nvcc_output.txt", "gcc_output.txt"):
        output = output or fsread.read_text(os.path.join(main, name), 1 << 20, base=p)
    if output is None and log:
        output = "\n".join(log.splitlines()[1:])
    if fsread.is_dir(os.path.join(p, "candidates")):
        facts.append(("candidates/", "hidet's tuning candidates, kept by hidet under debug_cache_tuning (prune "
                                     "keeps them too)"))
    binaries = tuple(os.path.join(d, BINARY) for d in _module_dirs(entry) if fsread.exists(os.path.join(d, BINARY)))
    status, reason = verdict.status, verdict.reason
    if problems and status == COMPLETE:
        status, reason = CORRUPT, problems[0]
    return Details(entry, status, reason, tuple(problems), files, task_op, inputs, outputs, command, output,
                   binaries, tuple(facts))


def _version_facts(root: Path, entry: Entry) -> list[tuple[str, str]]:
    """version.txt, the installed hidet (the one the entry is judged against) and what a difference means."""
    version = fsread.read_text(os.path.join(entry.path, "version.txt"), 1 << 20, base=entry.path)
    facts = [("version.txt", version.strip())] if version is not None else []
    running = installed_version()
    facts.append(("hidet installed", running or "not found (judged as by the hidet that wrote it)"))
    if entry.kind != "op":
        return facts
    with EntryDir.open(entry.path, fsread.anchor(root)) as d:
        names, _, _ = _names(d)
        if names is not None and not any(m in names for m in HIDET_MARKERS):
            facts.append(("hidet will", KCACHE_BUILT_NOTE))
        elif note := version_note(d, running):
            facts.append(("hidet will", note))
    return facts


def _describe_task(entry: Entry, problems: list[str], facts: list[tuple[str, str]]
                   ) -> tuple[str | None, tuple[TensorInfo, ...], tuple[TensorInfo, ...]]:
    """The op's name and tensors from task.txt: facts only (hidet hashes the task in memory and never reads
    task.txt when it looks an entry up, so an edited task.txt changes nothing)."""
    try:
        data = read_task_file(os.path.join(entry.path, "task.txt"), base=entry.path)
    except FileNotFoundError:
        facts.append(("task", "no task.txt in this entry"))
        return entry.op, (), ()
    except OSError as exc:
        facts.append(("task.txt note", f"cannot read task.txt: {exc.strerror or exc} (hidet never reads it on load)"))
        return entry.op, (), ()
    try:
        task = parse_task(data)
    except TaskFormatError as exc:
        facts.append(("task.txt note", f"{exc} (hidet never reads task.txt on load)"))
        return entry.op, (), ()
    if task.name != entry.op:
        facts.append(("task.txt note", f"task.txt names op '{task.name}' but the entry sits under '{entry.op}'"))

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

def stray_links(ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]:
    """Symlinks where ops/, a space, an op or an entry belongs: the scan never follows them (it skips
    them); prune --broken and clear remove them as links, leaving their targets alone."""
    def link(path: str, kind: str, target, space, op, h: str) -> Entry:
        return ctx.link_entry(path, layout=NAME, kind=kind, target=target, space=space, op=op, hash=h)

    plain = not (flt.ops or flt.spaces or flt.targets)
    for top, kind in (("ops", "op"), *OTHER_KINDS):
        path = ctx.root / top
        if fsread.is_link(path):
            if plain:
                yield link(str(path), kind, None, None, None, "")
        elif kind != "op" and plain:
            for de in ctx.listdir(path):
                if de.is_symlink():
                    yield link(de.path, kind, None, None, None, de.name)
    ops = ctx.root / "ops"
    if fsread.is_link(ops):
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
                for name in ctx.links(od.path):
                    yield link(os.path.join(od.path, name), "op", target, sd.name, od.name, name)


# ---- the layout ----------------------------------------------------------------------------------

_TEMP_MARK = "/" + state.TEMP_PREFIX


# ---- will hidet here use it (kcache explain) -------------------------------------------------------------
# hidet finds an op by its task's hash; with another hidet version it rewrites version.txt and reuses lib.so
# when the task hashes the same (the judgement above), which kcache cannot tell across versions: unknown.

PACKAGE = "hidet"


def _recorded(root: Path, entry: Entry) -> tuple[str | None, str | None]:
    """(the hidet version in the entry's version.txt, the CUDA arch its compile.sh builds for), each None
    where the entry records none (or is no longer a directory below `root`: no link followed)."""
    small: dict[str, bytes] = {}
    with EntryDir.open(entry.path, fsread.anchor(root)) as d:
        for n in ("version.txt", "compile.sh"):
            try:  # bounded (fsread)
                small[n] = d.read_bytes(n, 1 << 20, strict=False)
            except OSError:
                pass
    built = small.get("version.txt", b"").decode("utf-8", "replace").strip() or None
    script = small.get("compile.sh")
    return built, archs_from_command(command_from_script(script.decode("utf-8", "replace"))) if script else None


def explain(root: Path, entry: Entry, here: Here) -> Verdict:
    """hit: hidet installed in the version recorded, the entry complete, its binary's CUDA arch run by the
    GPU here (or a CPU entry); miss or unknown with the factor otherwise."""
    if (not_asked := unasked(here)) is not None:
        return not_asked
    built, arch = _recorded(root, entry)  # read first: a miss for want of hidet still names the version recorded
    have = here.versions.get(PACKAGE)
    if have is None:
        return not_installed("hidet", PACKAGE, built)
    if entry.status != COMPLETE:
        return Verdict(MISS, f"hidet does not use a {entry.status} entry: {entry.reason}", "status", entry.status,
                       COMPLETE)
    if entry.target == "cuda":
        if arch is None:
            return Verdict(UNKNOWN, "the entry records no CUDA arch (no compile.sh)")
        if here.gpu is None:
            return Verdict(UNKNOWN, f"no GPU here to run {arch} (--gpu names the arch)")
        g = cuda_archs(here.gpu)[0]
        if not arch_runs_on(arch, [g.cc]) or (arch.endswith("a") and arch != here.gpu and "compute_" not in arch):
            return Verdict(MISS, "the binary's CUDA arch does not run on the GPU here", "arch", arch, here.gpu)
    if built != have:
        return Verdict(UNKNOWN, f"built by hidet {built or '(no version.txt)'}; hidet {have} reuses lib.so only "
                       "when the task hashes the same, which kcache cannot tell across versions")
    return Verdict(HIT, f"hidet {have} as recorded, {arch or entry.target or 'cpu'}, and the entry is complete")


class HidetLayout(Layout):
    """hidet's operator cache; also where `kcache build` publishes (kcache's temp dirs are its leftovers)."""

    shape = HIDET
    writer_locks = (".lock", "dispatch_table.txt.lock")
    fact_files = (MANIFEST, "compile.sh", "nvcc_log.txt")
    packages = (PACKAGE,)

    detect = staticmethod(detect)
    shape_problem = staticmethod(shape_problem)
    scan = staticmethod(scan)
    stray_links = staticmethod(stray_links)

    def judging(self, deep: bool = False, *, statuses: bool = True, caller_reads: bool = False) -> Judging:
        """hidet's judgement goes by the installed hidet's version (looked up here, once: never by the
        judgement itself)."""
        return Judging(deep, version=installed_version() if statuses else "", caller_reads=caller_reads)

    judge = staticmethod(judge)
    describe = staticmethod(describe)
    log_files = staticmethod(log_files)

    def leftover(self, entry: Entry) -> Leftover | None:
        if _TEMP_MARK not in entry.relpath:  # asked of every entry a plan or stats looks at: the cheap test first
            return None
        name = os.path.basename(entry.path)
        if not name.startswith(state.TEMP_PREFIX):
            return None
        return Leftover(TEMP, "temp directory of an interrupted kcache build",
                        f"{os.path.dirname(entry.relpath)}/{state.temp_hash(name)}")

    def inner_leftovers(self, entry: Entry) -> list[InnerLeftover]:
        return []  # hidet removes candidates/ itself unless debug_cache_tuning asks to keep it: kept

    def build_reuses(self, path: str, judgement: Judgement) -> bool:
        if judgement.status == COMPLETE:
            return True
        if judgement.reason != KCACHE_BUILT.format(installed_version()):
            return False
        with EntryDir.open(path) as d:
            return not kcache_built_problem(d, True)  # every byte, as build's hit goes by

    def build_replacing(self, path: str) -> str | None:
        with EntryDir.open(path) as d:
            names = set(d.names())
        if MANIFEST in names or "version.txt" not in names:
            return None
        return ("it was an entry hidet made itself; kcache's build of it has no version.txt, meta.json or "
                "func_types.pickle, so a hidet 0.6 or later compiles it again in place")

    def build_compiled_again(self) -> CompiledAgain | None:
        running = installed_version()
        if not _loader_recompiles_kcache_builds(running):
            return None
        return CompiledAgain(f"hidet {running}", KCACHE_LACKS)

    def empty_parent_levels(self, kind: str) -> int:
        return 2 if kind == "op" else 0  # the op and space directories; ops/ itself tells the layout

    def compile_command(self, small: Mapping[str, bytes]) -> str | None:
        if small.get("compile.sh") is not None:
            return command_from_script(small["compile.sh"].decode("utf-8", "replace"))
        if small.get("nvcc_log.txt"):
            return (small["nvcc_log.txt"].decode("utf-8", "replace").splitlines() or [""])[0]
        return None

    explain = staticmethod(explain)


LAYOUT = HidetLayout()
