"""torch's C++/CUDA extensions built at run time (`torch.utils.cpp_extension.load` / `load_inline`).

One build directory per extension name under the root (torch's `_get_build_directory`:
TORCH_EXTENSIONS_DIR, else <user cache dir>/torch_extensions/py<XY><abiflags>_<cpu|cuNNN|rocmNNN>/):
`<name>/` holds the sources load_inline wrote (main.cpp, cuda.cu), `build.ninja`, the objects, the
module `<name>.so` and ninja's `.ninja_log`/`.ninja_deps`.

What torch's loader does with it (torch 2.13, `_jit_compile`): it takes `lock` in the directory with a
`FileBaton` (os.open(O_CREAT|O_EXCL), the descriptor kept open, the file removed when the build ends),
writes build.ninja, runs ninja there, and imports `<name>.so`. A process that finds `lock` already there
waits until the file disappears, polling for ever: a build killed mid-way leaves it and every later load
hangs (pytorch#189245). So:
- `lock` held open by a live process (read from /proc/<pid>/fd), or a process working in the directory
  (its cwd: the ninja and compilers torch runs there, which outlive a torch killed alone, hold no lock
  descriptor): building; left by no live process: the entry is broken (corrupt: every load hangs and
  nothing clears it) and `verify --fix` removes the lock.
  A new load then builds (ninja) and imports; a load already waiting does not build: FileBaton.wait
  returns when the file vanishes and torch imports `<name>.so` as it is, so where the killed build never
  made it that load dies of ImportError ("cannot open shared object file") and must be restarted.
- an output build.ninja names (an object, the module) missing: half-built, and torch's ninja step builds
  the missing parts again on the next load (partial).
- build.ninja gone, or naming no default target (emptied, cut, edited): torch writes it again on every
  load before ninja runs, so it does not matter; what ninja's logs record does: the outputs .ninja_log
  names (partial when one is missing, or when it names no module: the build stopped before it made one)
  and the sources .ninja_deps names (another directory's: moved). Measured with torch 2.13: build.ninja
  deleted, emptied or without its default line, the next load rewrote it and rebuilt nothing.
- build.ninja names the sources load_inline wrote into the build directory by absolute path. Where that
  is another directory than this one (the entry was copied or moved, or imported under another path),
  torch writes build.ninja again with this path, ninja finds every compile command changed (.ninja_log
  keeps a hash of each command) and builds the extension again from scratch (moved; measured with torch
  2.13: 22 s against 1 s in place). kcache cannot relocate one: a build.ninja rewritten to this path is
  still "command line changed" to ninja, so export leaves a moved extension out unless asked for
  (`--status moved`), import says when one lands elsewhere than it was built, and `verify --fix` leaves
  it as it is. An extension is a hit only at the path it was built at, with the same torch and Python.
- build.ninja's module named `<name>_v<N>`: a process loaded the extension again with changed sources
  or flags, and torch (whose versioner lives in the process) built it as version N in the same directory.
  A new process starts at version 0: it writes build.ninja for `<name>`, ninja finds the compile command
  (-DTORCH_EXTENSION_NAME) and the target changed, and builds `<name>` again, even from the very sources
  of version N (measured with torch 2.13): partial.
- ninja's `.ninja_log` (each output's command) or, where build.ninja has `deps = gcc`, `.ninja_deps` (the
  headers each object read) gone or empty: ninja finds no record of an output and builds everything
  again (measured: each gone, each emptied; partial).
- the module empty or cut short (its ELF header says so: one 64-byte read, in `ls` too): ninja sees it
  up to date and torch's import fails (corrupt).
- the module a symlink, FIFO, device or socket: torch follows or opens it (a FIFO blocks its import),
  kcache never does: unreadable, in `ls` and `verify` alike, never removed for it (checks.not_regular).
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path
from typing import Iterator, Mapping, NamedTuple

from kcache_cli.fs import locking
from kcache_cli.fs import read as fsread
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.layouts._common import leads_here
from kcache_cli.layouts.base import MISS, UNKNOWN, Here, Judging, Layout, ScanContext, StaleLock, Verdict
from kcache_cli.layouts.base import not_installed, unasked
from kcache_cli.layouts.shapes import TORCHEXT, TORCHEXT_EVIDENCE
from kcache_cli.model.checks import elf_truncated, first_not_regular, list_files, read_every_byte
from kcache_cli.model.records import (
    BUILDING,
    COMPLETE,
    CORRUPT,
    MOVED,
    PARTIAL,
    UNREADABLE,
    UNREADABLE_REASON,
    Details,
    Entry,
    Judgement,
    ScanFilter,
)
from kcache_cli.util.units import is_digits

NAME = TORCHEXT.name
KIND = "extension"
LOCK = "lock"  # torch.utils.file_baton.FileBaton's file, in the build directory
NINJA = "build.ninja"
NINJA_MAX = 16 << 20  # torch's are kilobytes; a bigger one is read no further (and not judged by)
LOCK_GRACE = 5.0  # seconds: a lock this young is left alone whoever holds it
STALE_LOCK = ("torch's build lock was left by a build no process runs: every load of this extension waits "
              "for ever (kcache verify --fix removes the lock: new loads then build it; a load already waiting "
              "imports it unbuilt, fails, and must be restarted)")
# What removing a stale lock does to the loads already waiting on it (torch's FileBaton.wait, then the import)
UNLOCKED = ("a torch load already waiting on a removed lock imports the module without building it and fails "
            "where the killed build never made it: restart it (new loads build)")
# A build edge: its outputs, rule and inputs; ninja escapes a space, colon or dollar in a path with "$".
_WORD = r"(?:[^\s:$|]|\$.)+"
_BUILD = re.compile(rf"^build[ \t]+({_WORD}(?:[ \t]+{_WORD})*)[ \t]*:[ \t]*(\w+)((?:[ \t]+{_WORD})*)", re.M)
_ESCAPED = re.compile(r"\$(.)")
_DEFAULT = re.compile(r"^default\s+(\S+)", re.M)
_VAR = re.compile(r"^(cxx|cflags)\s*=\s*(.*)$", re.M)
_DEPS = re.compile(r"^[ \t]+deps[ \t]*=[ \t]*\S", re.M)
NINJA_LOGS = (".ninja_log", ".ninja_deps")  # ninja's build log and deps log, in the build directory


class NinjaPlan(NamedTuple):
    outputs: tuple[str, ...]  # what build.ninja builds, objects and module, relative to the entry
    module: str | None  # its default target: the module torch imports
    sources: tuple[str, ...] = ()  # what its compile steps compile: absolute paths (torch's abspath)
    deps: bool = False  # a rule keeps its headers in ninja's deps log (deps = gcc)
    read_from: str = NINJA  # the file the sources were read from: build.ninja, or ninja's deps log


def _words(text: str) -> list[str]:
    return [_ESCAPED.sub(r"\1", w) for w in re.findall(_WORD, text)]


def ninja_plan(text: str) -> NinjaPlan:
    """The outputs, default target and sources of torch's build.ninja (written by _write_ninja_file)."""
    outs: list[str] = []
    sources: list[str] = []
    for m in _BUILD.finditer(text):
        outs += _words(m.group(1))
        if m.group(2).endswith("compile"):  # compile, cuda_compile, sycl_compile; link takes the objects
            sources += _words(m.group(3))
    default = _DEFAULT.search(text)
    return NinjaPlan(tuple(outs), default.group(1) if default else None, tuple(sources), bool(_DEPS.search(text)))



def _plan_of(d: EntryDir, names: Mapping[str, int]) -> NinjaPlan | None:
    """ninja_plan of the entry's build.ninja; None when there is none, or one over NINJA_MAX (not torch's:
    read no further, and nothing is judged by it)."""
    if NINJA not in names or names[NINJA] > NINJA_MAX:
        return None
    return ninja_plan(d.read_text(NINJA, NINJA_MAX) or "")


def _logged_plan(d: EntryDir, names: Mapping[str, int]) -> NinjaPlan | None:
    """What ninja's logs record of the build, for a build directory whose build.ninja torch writes again
    (gone, or naming no default target): the outputs .ninja_log names, the module among them built last
    (`<name>.so`, `<name>_v<N>.so` after a process built changed sources, or without .so for an
    executable: the one of the latest mtime the log records) and the sources .ninja_deps names; None
    when the log names no module (torch builds it)."""
    log = d.read_text(NINJA_LOGS[0], NINJA_MAX) if names.get(NINJA_LOGS[0]) else None
    rows = [line.split("\t") for line in (log or "").splitlines() if not line.startswith("#") and line.count("\t") >= 4]
    outputs = tuple(dict.fromkeys(row[3] for row in rows))
    shape = re.compile(rf"{re.escape(os.path.basename(d.path))}(?:_v\d+)?(?:\.so)?")
    built = [(int(row[2]) if is_digits(row[2]) else 0, row[3]) for row in rows if shape.fullmatch(row[3])]
    if not built:
        return None
    module = max(built)[1]
    deps = d.read_bytes(NINJA_LOGS[1], NINJA_MAX, strict=False) if names.get(NINJA_LOGS[1]) else b""
    sources = tuple(p for p in _deps_paths(deps) if os.path.isabs(p))
    return NinjaPlan(outputs, module, sources, True, NINJA_LOGS[1])


def _deps_paths(data: bytes) -> list[str]:
    """The paths ninja's deps log (.ninja_deps, v4) records: after its header, records of a 4-byte size
    (the high bit set for a deps record) and, for a path record, the path NUL-padded and a 4-byte id."""
    if not data.startswith(b"# ninjadeps\n"):
        return []
    at, out = len(b"# ninjadeps\n") + 4, []
    while at + 4 <= len(data):
        size = int.from_bytes(data[at:at + 4], "little")
        at += 4
        if not size & 0x80000000:
            out.append(data[at:at + max(0, size - 4)].rstrip(b"\0").decode("utf-8", "replace"))
        at += size & 0x7FFFFFFF
    return out


def built_elsewhere(d: EntryDir, plan: NinjaPlan, names: Mapping[str, int]) -> str | None:
    """The build directory build.ninja records, where it is not this one: the directory of a source that
    lies in the entry (load_inline's main.cpp, cuda.cu), named by another path. Sources outside the
    entry (`load` of a project's files) keep their path wherever the entry lies: they say nothing."""
    for src in plan.sources:
        name = os.path.basename(src)
        if os.path.isabs(src) and name in names and not leads_here(d, name, src):
            return os.path.dirname(src)
    return None


def moved_reason(recorded: str, by: str = NINJA) -> str:
    return (f"{by} records its build directory as {recorded} (moved or copied): torch builds it "
            "again here on the next load (ninja's log holds the old commands; kcache cannot relocate it)")


def lock_holder(st: os.stat_result, now: float, where: os.stat_result) -> str | None:
    """Why the lock file `st` in the build directory `where` may belong to a live build (then it stays), or
    None when it is stale: no process of its owner has it open (FileBaton keeps its descriptor open from
    the exclusive create to the removal, so a live builder always has) or works in the directory (ninja
    and its compilers, which torch runs there without the lock's descriptor and which outlive a torch
    killed alone), every such process could be inspected, and it is older than LOCK_GRACE."""
    found = locking.file_openers(st)
    if found.pids:
        return f"torch is building it: process {found.pids[0]} holds its lock"
    working = locking.cwd_users(where)
    if working.pids:
        return (f"process {working.pids[0]} still builds in it (its torch is gone: when it ends, the lock stays "
                "and loads wait for ever)")
    if found.blind:
        return f"its lock may be held: {found.blind} process(es) of its owner could not be inspected"
    if now - st.st_mtime < LOCK_GRACE:
        return "its lock was taken moments ago"
    return None


def _lock_verdict(d: EntryDir, now: float) -> Judgement:
    st = d.lstat(LOCK)
    if not stat.S_ISREG(st.st_mode):
        kind = fsread.kind_of(st.st_mode)
        waits = ": every load waits for ever" if stat.S_ISDIR(st.st_mode) else ""
        return Judgement.of(CORRUPT, f"its {LOCK} is {kind}, not torch's lock file: torch cannot take its lock{waits}")
    held = lock_holder(st, now, d.own_lstat())
    return Judgement.of(BUILDING, held) if held else Judgement.of(CORRUPT, STALE_LOCK)


def _is_dir(d: EntryDir, name: str) -> bool:
    try:
        return stat.S_ISDIR(d.lstat(name).st_mode)
    except OSError:
        return False


def judge(d: EntryDir, kind: str, jc: Judging) -> Judgement:
    """By torch's loader: a lock first (it decides whether torch waits), then build.ninja's outputs, then
    where build.ninja says it was built (elsewhere: torch builds it all again), then the module."""
    try:
        names, _ = d.files()
    except OSError:
        return Judgement.of(UNREADABLE, UNREADABLE_REASON)
    if LOCK in names or _is_dir(d, LOCK):  # files() leaves subdirectories out; torch's O_EXCL does not
        return _lock_verdict(d, jc.now)
    plan = _plan_of(d, names)
    if plan is None and NINJA in names:  # no build.ninja torch writes: not judged by it (never cut short)
        return Judgement(COMPLETE)
    if plan is None or plan.module is None:  # gone or not torch's: torch writes it again before ninja runs
        plan = _logged_plan(d, names)
    if plan is None or plan.module is None:
        return Judgement.of(PARTIAL, "no build.ninja of torch's and no module in ninja's log: the build stopped "
                                     "before it made one (torch builds it again)")
    missing = [o for o in plan.outputs if o not in names]
    if missing:
        return Judgement.of(PARTIAL, f"half-built: {', '.join(missing[:3])} missing (torch's ninja step builds "
                                     "it again on the next load)")
    recorded = built_elsewhere(d, plan, names)
    if recorded is not None:  # torch builds it all again here: what the module holds does not matter
        return Judgement.of(MOVED, moved_reason(recorded, plan.read_from))
    version = _built_as_version(d, plan.module)
    if version is not None:
        return Judgement.of(PARTIAL, f"built as {plan.module}, version {version} of a process that loaded changed "
                                     "sources: a new process builds it again as version 0")
    log = _log_gone(plan, names)
    if log is not None:
        return Judgement.of(PARTIAL, f"{log} is gone or empty: ninja finds no record of what it built and builds "
                                     "it all again")
    return _module_verdict(d, plan.module, names.get(plan.module, 0), jc)


def _built_as_version(d: EntryDir, module: str) -> str | None:
    """N where build.ninja's module is `<this directory's name>_v<N>` (.so, or none for an executable):
    torch's name for a build with changed inputs in a process that built the extension before."""
    m = re.fullmatch(rf"{re.escape(os.path.basename(d.path))}_v(\d+)(?:\.so)?", module)
    return m.group(1) if m else None


def _log_gone(plan: NinjaPlan, names: Mapping[str, int]) -> str | None:
    """The log of ninja's that is gone or empty: .ninja_log, or .ninja_deps where a rule has `deps`."""
    return next((log for log in NINJA_LOGS[:2 if plan.deps else 1] if not names.get(log)), None)


def _module_verdict(d: EntryDir, module: str, size: int, jc: Judging) -> Judgement:
    """The module torch dlopens: whole unless empty or shorter than its ELF header says (one read of 64
    bytes, in ls too: ninja takes a module cut short as up to date and torch's import dies of it), or
    (deep) a byte of the entry cannot be read. A module nobody may read is unreadable, never broken; so is
    a module that is a symlink, FIFO, device or socket (torch follows or opens it; kcache, maybe root over
    another user's directory, opens none: /proc/kmsg gives up the kernel's messages; checks.not_regular)."""
    unreadable = first_not_regular(d, (module,), "torch") or (d.unreadable(module) if size else None)
    if unreadable:
        return Judgement.of(UNREADABLE, unreadable)
    bad: str | None
    try:
        if not size:
            bad = f"{module} is empty"
        else:
            bad = elf_truncated(module, d.read_bytes(module, 64, strict=False), size)
    except PermissionError as exc:
        return Judgement.of(UNREADABLE, f"{module} is unreadable ({exc.strerror})")
    except OSError as exc:
        bad = f"cannot read {module}: {exc.strerror or exc}"
    if bad is None and jc.deep:
        bad = read_every_byte(d, jc.caller_reads)
    return Judgement.of(CORRUPT, f"{bad}: torch's import of it fails") if bad else Judgement(COMPLETE)


def target(names: Mapping[str, int]) -> str:
    """cuda when load_inline wrote CUDA sources (cuda.cu) or an object of one was built, else cpu."""
    return "cuda" if any(n.endswith((".cu", ".cuda.o")) for n in names) else "cpu"


def scan(ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]:
    if not (flt.wants_target("cpu") or flt.wants_target("cuda")) or flt.spaces or flt.ops:
        return
    prefixes = flt.name_prefixes()
    for de in ctx.listdir(ctx.root, lambda d: TORCHEXT.kinds[0].match_segment(0, d.name) is not None):
        if not de.is_dir(follow_symlinks=False):
            continue
        if prefixes and not any(de.name.startswith(p) for p in prefixes):
            continue
        with ctx.open_entry(de.path) as d:
            names, usage, _ = ctx.read_dir(d)
            if names is None or not any(n in names for n in (LOCK, *TORCHEXT_EVIDENCE)):
                continue  # not torch's build directory
            if not flt.wants_target(target(names)):
                continue
            j = judge(d, KIND, Judging())
        yield ctx.entry(path=de.path, usage=usage, layout=NAME, kind=KIND, target=target(names), space=None, op=None,
                        hash=de.name, status=j.status, reason=j.reason)


def describe(root: Path, entry: Entry) -> Details:
    with EntryDir.open(entry.path, fsread.anchor(root)) as d:
        j = judge(d, entry.kind, Judging(deep=True))
        text = d.read_text(NINJA, NINJA_MAX) if j.status != UNREADABLE else None
    plan = ninja_plan(text or "")
    binaries = (os.path.join(entry.path, plan.module),) if plan.module and j.status == COMPLETE else ()
    facts = [("loader", "torch.utils.cpp_extension (load / load_inline)"),
             ("reused", "only at the path it was built at, with the same torch and Python: build.ninja names "
                        "its sources by absolute path, and torch runs ninja on every load of a new process")]
    command = compile_command({NINJA: (text or "").encode()})
    return Details(entry, j.status, j.reason, j.problems, list_files(entry.path), binaries=binaries,
                   compile_command=command, facts=tuple(facts))


def compile_command(small: Mapping[str, bytes]) -> str | None:
    text = small.get(NINJA, b"").decode("utf-8", "replace")
    found: dict[str, str] = {m.group(1): m.group(2) for m in _VAR.finditer(text)}
    return f"{found['cxx']} {found.get('cflags', '')}".strip() if found.get("cxx") else None


def in_use(entry: Entry, now: float) -> str | None:
    try:
        st = os.lstat(os.path.join(entry.path, LOCK))
    except OSError:
        return None
    return lock_holder(st, now, os.lstat(entry.path)) if stat.S_ISREG(st.st_mode) else None


def stale_locks(d: EntryDir, jc: Judging) -> list[StaleLock]:
    try:
        st = d.lstat(LOCK)
    except OSError:
        return []
    stale = stat.S_ISREG(st.st_mode) and lock_holder(st, jc.now, d.own_lstat()) is None
    return [StaleLock(LOCK, st, UNLOCKED)] if stale else []


def landed_elsewhere(path: str) -> str | None:
    """What import says of an extension it published at `path` that was built at another path (moved)."""
    try:
        with EntryDir.open(path) as d:
            names, _ = d.files()
            plan = _plan_of(d, names)
            recorded = built_elsewhere(d, plan, names) if plan is not None else None
    except OSError:
        return None
    return (f"built in {recorded}: torch builds it again here on the next load (kcache cannot relocate a torch "
            "extension; `kcache ls` shows it moved)") if recorded else None


def no_log(entry: Entry) -> str:
    return "torch keeps no compile log in an extension's build directory (load(verbose=True) prints it)"


# ---- will torch here load it (kcache explain) ---------------------------------------------------------------

PACKAGE = "torch"
_FOLDER = re.compile(r"py(\d)(\d+)[a-z]*_([a-z]+\d*)")  # torch's py<XY><abiflags>_<accelerator> folder


def _accelerator(version: str) -> str | None:
    """cpu, cuNNN or rocmNNN from a torch wheel's local version (2.13.0+cu128), or None when it has none."""
    local = version.partition("+")[2]
    m = re.fullmatch(r"(cpu|cu\d+|rocm[\d.]+)", local)
    return m.group(1).replace(".", "") if m else None


def _folder_miss(root: Path, have: str, here: Here) -> Verdict | None:
    """A miss when the root is a torch folder (py311_cpu) another Python or torch build than here's would
    use: torch here builds in its own py<XY>_<accelerator>/ and never looks in this one."""
    m = _FOLDER.fullmatch(root.name)
    if m is None:  # TORCH_EXTENSIONS_DIR, or a root named otherwise: torch here uses it whatever it runs on
        return None
    built, py = f"{m.group(1)}.{m.group(2)}", ".".join((here.python or "").split(".")[:2])
    if py and py != built:
        return Verdict(MISS, f"torch on Python {py} builds in py{py.replace('.', '')}_<accelerator>/, never in "
                       f"{root.name}/", "python version", built, py)
    accel = _accelerator(have)
    if accel is not None and accel != m.group(3):
        return Verdict(MISS, f"torch {have} builds in *_{accel}/, never in {root.name}/", "torch accelerator",
                       m.group(3), accel)
    return None


def explain(root: Path, entry: Entry, here: Here) -> Verdict:
    """torch loads an extension only with torch installed, from its own py<XY>_<accelerator>/ folder, and
    whole at the path it was built at (not moved, no dead lock: judged as ls does); then ninja, run on
    every load of a new process, reuses the module only when each compile command (the flags the load
    passes, torch's and Python's include paths) and each source match what .ninja_log recorded, which
    kcache cannot know before the load: never a hit."""
    if (not_asked := unasked(here)) is not None:
        return not_asked
    have = here.versions.get(PACKAGE)
    if have is None:
        return not_installed("torch", PACKAGE, why=": nothing loads the extension")
    folder = _folder_miss(root, have, here)
    if folder is not None:
        return folder
    with EntryDir.open(entry.path, fsread.anchor(root)) as d:
        j = judge(d, entry.kind, Judging(deep=True))
    if j.status == BUILDING:
        return Verdict(UNKNOWN, f"{j.reason}: a load here waits for that build, then imports what it made")
    if j.status != COMPLETE:
        return Verdict(MISS, f"torch {have} does not load a {j.status} extension as it is: {j.reason}", "status",
                       j.status, COMPLETE)
    return Verdict(UNKNOWN, f"complete at the path it was built at, torch {have} here; torch runs ninja on every "
                   "load of a new process, which reuses the module only when each compile command (the flags the "
                   "load passes, torch's include paths) and each source match what .ninja_log recorded: kcache "
                   "cannot tell which flags and sources the load will pass")


class TorchExtLayout(Layout):
    shape = TORCHEXT
    fact_files = (NINJA,)
    packages = (PACKAGE,)

    scan = staticmethod(scan)
    judge = staticmethod(judge)
    describe = staticmethod(describe)
    no_log = staticmethod(no_log)
    compile_command = staticmethod(compile_command)

    def in_use(self, entry: Entry) -> str | None:
        return in_use(entry, time.time())

    stale_locks = staticmethod(stale_locks)
    landed_elsewhere = staticmethod(landed_elsewhere)
    explain = staticmethod(explain)


LAYOUT = TorchExtLayout()
