"""tilus 0.2.0: <root>/programs/<h12>/ (compiled programs) and <root>/scripts/<name>/<jit key>-<h8>/
(scripts whose programs/<i> and latency/<key>/<i> are relative symlinks to programs).

A copy made by a tool that does not keep symlinks (some archivers, some git set-ups) turns each
link into a small file holding the link's target; kcache reads those "flattened links" as links."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from kcache_cli.fs import read as fsread
from kcache_cli.fs import state
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.layouts._common import command_from_script, walk_tree
from kcache_cli.layouts.base import Judging, Layout, ScanContext
from kcache_cli.layouts.shapes import TILUS
from kcache_cli.model.checks import (
    changed_since,
    elf_truncated,
    list_files,
    listing_or_unreadable,
    not_regular,
    subdirs_or_unreadable,
)
from kcache_cli.model.records import (
    COMPLETE,
    CORRUPT,
    FAILED,
    PARTIAL,
    UNREADABLE,
    Details,
    Entry,
    Judgement,
    LogFile,
    ScanFilter,
    TensorInfo,
    measure_tree,
)

NAME = TILUS.name
TARGET = TILUS.kinds[0].target  # tilus compiles for NVIDIA GPUs only
_PROGRAM_NAME = re.compile(rb"^def (\w+)\(")
_FLAT_LINK = re.compile(r"^(\.\./)+programs/[0-9a-f]+/?$")
LINK_DIRS = ("programs", "latency")


# ---- evidence: what makes a directory tilus's ----------------------------------------------------
PROGRAM_NAME = re.compile(r"^[0-9a-f]{12}$")  # sha256(options + program)[:12]
SCRIPT_NAME = re.compile(r"^[^/]+-[0-9a-f]{8}$")  # <jit key>-<h8>
SCRIPT_OP = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
PROGRAM_FILES = frozenset({"program.txt", "options.txt", ".lock", "module"})
SCRIPT_FILES = frozenset({"source.txt", "meta.json", "build_options.txt", "schedule.txt", "dispatch_table.txt",
                          "dispatch_table.pickle", "programs", "latency", "failed", ".lock"})


def shape_problem(relpath: str, kind: str, names: frozenset[str] | None, root: Path | None = None) -> str | None:
    """None when `relpath` has the exact shape of a tilus entry: programs/<12 hex>/ with tilus's program
    files, scripts/<op>/<jit key>-<8 hex>/ with a script's files; else why it is not one."""
    parts = relpath.split("/")
    if kind == "program":
        if len(parts) != 2 or parts[0] != "programs" or not PROGRAM_NAME.match(parts[1]):
            return "not at programs/<12 hex>/"
        known = PROGRAM_FILES
    elif kind == "script":
        if len(parts) != 3 or parts[0] != "scripts" or not SCRIPT_OP.match(parts[1]) \
                or not SCRIPT_NAME.match(parts[2]):
            return "not at scripts/<name>/<jit key>-<8 hex>/"
        known = SCRIPT_FILES
    else:
        return f"tilus has no {kind} entries"
    if names is not None and not names & known:
        return "it holds none of the files tilus writes"
    return None


def detect(root: Path) -> bool:
    """Evidence, not names alone: a CACHEDIR.TAG, or programs/<12 hex>/ or scripts/<name>/<key>-<8 hex>/
    holding tilus's files."""
    tops = [d for d in ("programs", "scripts") if fsread.is_real_dir(root / d)]
    if not tops:
        return False
    if state.has_cachedir_tag(root):
        return True
    try:
        for de in fsread.scandir_list(root / "programs", limit=256):
            if PROGRAM_NAME.match(de.name) and de.is_dir(follow_symlinks=False) \
                    and set(fsread.listdir(de.path)) & PROGRAM_FILES:
                return True
    except OSError:
        pass
    try:
        for sd in fsread.scandir_list(root / "scripts", limit=64):
            if not sd.is_dir(follow_symlinks=False):
                continue
            for de in fsread.scandir_list(sd.path):
                if SCRIPT_NAME.match(de.name) and de.is_dir(follow_symlinks=False) \
                        and set(fsread.listdir(de.path)) & SCRIPT_FILES:
                    return True
    except OSError:
        pass
    return False


def read_link(d: EntryDir, name: str) -> str | None:
    """The target of the symlink `name` in `d`, or of a flattened link (a tiny file holding
    `../../programs/<h>`)."""
    try:
        return d.readlink(name)
    except OSError:
        pass
    try:
        text = d.read_bytes(name, 256).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):  # also a FIFO or device where a link belongs: never read
        return None
    return text if _FLAT_LINK.match(text) else None


def _link_texts(d: EntryDir) -> list[tuple[str, str, str]]:
    """(name inside the script, link text, the path it points to) for every programs/<i> and
    latency/<key>/<i> link of the script held as `d`."""
    out = []
    for sub in LINK_DIRS:
        with d.sub(sub) as s:
            try:  # iterative, fd-relative, depth-limited: a hostile tree cannot exhaust the stack
                found = list(s.walk_files())
            except OSError:
                continue  # missing, unreadable or absurdly deep: no links from it
            for rel, st, link in found:
                name = f"{sub}/{rel}"
                text = link if link is not None else read_link(d, name) if stat.S_ISREG(st.st_mode) else None
                if text is not None:
                    out.append((name, text, os.path.normpath(os.path.join(os.path.dirname(d.join(name)), text))))
    return out


def _lands(anchor: fsread.Anchor | None, target: str) -> bool:
    """os.path.isdir of a link's target as tilus follows it (links on the way followed): below the
    anchored root resolved from the root held open, elsewhere by its path."""
    try:
        if anchor is None or not anchor.holds(target):
            return fsread.is_dir(target)
        return stat.S_ISDIR(os.stat(anchor.rel(target), dir_fd=anchor.fd).st_mode)
    except OSError:
        return False


def script_links(d: EntryDir) -> list[tuple[str, str, str | None]]:
    """(name inside the script, link text, resolved program dir or None when dangling) for every
    programs/<i> and latency/<key>/<i> link of the script held as `d`."""
    return [(name, text, target if _lands(d.anchor, target) else None) for name, text, target in _link_texts(d)]


def links_at(script_path: str) -> list[tuple[str, str, str | None]]:
    """script_links of the script at `script_path` (for callers that are not judging it)."""
    with EntryDir.open(script_path) as d:
        return script_links(d)


def _program_name(d: EntryDir) -> str | None:
    try:
        m = _PROGRAM_NAME.match(d.read_bytes("program.txt", 256, strict=False))
    except OSError:
        return None
    return m.group(1).decode() if m else None


@dataclass(frozen=True)
class BuildFailure:
    """One failed build tilus recorded under scripts/<name>/<key>/failed/building/<N>."""

    script: str  # the script directory
    record: str  # <N>.txt (the command and the compiler's error), or the <N> entry itself
    program: str | None  # the program hash the failed build was for, when the record names it
    error: str  # the first line of the compiler's error
    mtime: float


def build_failures(d: EntryDir) -> list[BuildFailure]:
    """The failed builds the script held as `d` recorded, oldest first."""
    with d.sub("failed/building") as b:
        names = sorted(b.names())
        return sorted((_build_failure(d, b, n, names) for n in names if not _recorded_elsewhere(b, n, names)),
                      key=lambda f: (f.mtime, f.record))


def _is_dir(d: EntryDir, name: str) -> bool:
    try:
        return stat.S_ISDIR(d.stat(name).st_mode)
    except OSError:
        return False


def _recorded_elsewhere(b: EntryDir, n: str, names: list[str]) -> bool:
    """Whether the record of the failed build `n` is <n>.txt (a directory <n> beside it)."""
    return not (n.endswith(".txt") or (not _is_dir(b, n) and f"{n}.txt" not in names)) and f"{n}.txt" in names


def _build_failure(d: EntryDir, b: EntryDir, n: str, names: list[str]) -> BuildFailure:
    rel = n
    if n.endswith(".txt") or (not _is_dir(b, n) and f"{n}.txt" not in names):
        text = b.read_text(n, 1 << 16) or ""
    else:
        text = b.read_text(f"{n}/{n}.txt", 1 << 16) or ""
        rel = f"{n}/{n}.txt" if text else n
    link = read_link(b, n.removesuffix(".txt"))
    m = re.search(r"programs/([0-9a-f]{12})\b", (link or "") + "\n" + text)
    errors = [line.strip() for line in text.splitlines() if re.search(r"\berror\b", line, re.IGNORECASE)]
    first = errors[0] if errors else next((x.strip() for x in text.splitlines() if x.strip()), "no message")
    try:
        mtime = b.lstat(rel).st_mtime
    except OSError:
        mtime = 0.0
    return BuildFailure(d.path, b.join(rel), m.group(1) if m else None, first[:200], mtime)


def failures_at(script_path: str) -> list[BuildFailure]:
    """build_failures of the script at `script_path` (for callers that are not judging it)."""
    with EntryDir.open(script_path) as d:
        return build_failures(d)


def failures_by_program(root: str | os.PathLike) -> dict[str, BuildFailure]:
    """program hash -> the latest failed build recorded for it, over every script of the cache."""
    out: dict[str, BuildFailure] = {}
    for jdir in _dirs_below(os.path.join(root, "scripts"), 2):
        failed = os.path.join(jdir, "failed")
        if fsread.is_dir(failed) and fsread.exists(os.path.join(failed, "building"), follow=True):
            for f in failures_at(jdir):
                if f.program:
                    out[f.program] = f
    return out


def _dirs_below(path: str, levels: int) -> list[str]:
    """Path.glob("*/" * levels) of `path`: its directories (links to directories too) `levels` down,
    from the held root."""
    found = [path]
    for _ in range(levels):
        found = [d.path for p in found for d in _listed(p) if d.is_dir()]
    return found


def _listed(path: str) -> list[os.DirEntry]:
    try:
        return fsread.scandir_list(path)
    except OSError:
        return []


def judge(d: EntryDir, kind: str, jc: Judging, *, failures: dict[str, BuildFailure] | None = None) -> Judgement:
    """The one judgement of the tilus program or script held as `d` (cheap for ls, `jc.deep` reads every
    byte). A program's failed builds are recorded by the scripts (`failures`: the scan reads them once)."""
    if kind == "program":
        if failures is None:
            failures = failures_by_program(Path(d.path).parents[1])
        return _judge_program(d, jc.deep, failures.get(os.path.basename(d.path)))
    return _judge_script(d, jc.deep)


# What tilus 0.2.0 does (proven by tests/loaders/probe_tilus.py, tests/test_oracle_tilus.py). A program:
# `get_cache_dir` reads program.txt and options.txt when both exist and fails (ValueError) unless they
# are the texts it hashed into the directory's name; with either missing it writes both again.
# `compiled_program_exists` asks only that module/lib.so exists (through links, any size): then tvm_ffi
# loads it, so an empty or truncated lib.so fails every call; without one tilus compiles the program
# again. func_types.pickle, the sources and the logs are never read. A script: its programs are built or
# loaded as above, then dispatch_table.pickle is unpickled; without one, tilus records the tuning key
# and links latency/<key>/<i>, which fails (FileExistsError) where that link is already there. The
# programs/<i> links are written once, when programs/ is missing, and never read. tilus follows links; a
# FIFO, device or socket (or a link to one) where it opens lib.so, program.txt, options.txt or
# dispatch_table.pickle is never opened by kcache: unreadable, never removed (checks.not_regular).


def _seen_file(d: EntryDir, name: str) -> tuple[os.stat_result | None, bool]:
    """The file as tilus meets it (a link that is the file itself followed) and whether it is a link;
    None: no such file to tilus. Its lstat where it is no link: the directories on the way are none
    either (d.lstat follows none), so following links changes nothing."""
    try:
        st = d.lstat(name)
        return (d.stat(name), True) if stat.S_ISLNK(st.st_mode) else (st, False)
    except OSError:
        return None, False


def _not_a_file(name: str, st: os.stat_result, link: bool, fails: str) -> Judgement | None:
    """A file tilus opens (`st`: through a link, as tilus meets it) that is no regular file. A FIFO, device
    or socket, or a link to one: tilus opens it (a FIFO blocks it), kcache never does, so the entry is
    unjudged (checks.not_regular: unreadable, never removed). A directory: tilus's open fails (corrupt,
    `fails` saying how)."""
    if stat.S_ISREG(st.st_mode):
        return None
    odd = not_regular(name, st.st_mode, "tilus", linked=link)
    if odd:
        return Judgement.of(UNREADABLE, odd)
    return Judgement.of(CORRUPT, f"{name} is {fsread.kind_of(st.st_mode)}{fails}")


def _judge_program(d: EntryDir, deep: bool, failure: BuildFailure | None) -> Judgement:
    lib, link = _seen_file(d, "module/lib.so")
    if lib is None:
        if failure is not None:
            where = os.path.relpath(failure.record, os.path.dirname(os.path.dirname(d.path)))
            return Judgement.of(FAILED, f"build failed ({where}): {failure.error}")
        return Judgement.of(PARTIAL, "no module/lib.so: the build was interrupted; tilus compiles it again")
    texts = _program_texts_problem(d, lib, deep)
    if texts:
        return texts
    odd = _not_a_file("module/lib.so", lib, link, ": tilus fails loading it")
    if odd:
        return odd
    why = d.unreadable("module/lib.so") if not link else (
        None if lib.st_mode & 0o444 and d.access("module/lib.so")
        else "lib.so is unreadable (permission denied)")
    if why:
        return Judgement.of(UNREADABLE, "module/" + why)
    if lib.st_size == 0:
        return Judgement.of(CORRUPT, "module/lib.so is empty: tilus loads it and fails on every call")
    if deep or link or lib.st_size < 64 or _changed_after_compile(d):
        try:
            head = d.read_bytes("module/lib.so", 64, strict=False, follow=link)
        except OSError as exc:
            return Judgement.of(CORRUPT, f"cannot read module/lib.so: {exc.strerror}")
        truncated = elf_truncated("lib.so", head, lib.st_size)
        if truncated:
            return Judgement.of(CORRUPT, f"module/{truncated}: tilus fails loading it on every call")
    return Judgement(COMPLETE)


def _changed_after_compile(d: EntryDir) -> bool:
    """Whether lib.so changed after nvcc finished (it writes nvcc_output.txt then): only then does ls read it."""
    mtimes = {}
    for name in ("lib.so", "nvcc_output.txt"):
        try:
            mtimes[name] = d.lstat(f"module/{name}").st_mtime
        except OSError:
            pass
    return changed_since(mtimes, "nvcc_output.txt", ("lib.so",))


def _program_texts_problem(d: EntryDir, lib: os.stat_result, deep: bool) -> Judgement | None:
    """program.txt and options.txt as get_cache_dir reads them: only when both are there (else tilus
    writes them again); they must hash to the directory's name. ls reads them only when one changed
    after lib.so (they are written before the compile)."""
    found = []
    for name in ("program.txt", "options.txt"):
        st, link = _seen_file(d, name)
        if st is None:
            return None
        found.append((name, st, link))
    for name, st, link in found:
        odd = _not_a_file(name, st, link, ": tilus fails reading it")
        if odd:
            return odd
        if not st.st_mode & 0o444 or not d.access(name):
            return Judgement.of(UNREADABLE, f"{name} is unreadable (permission denied): tilus fails reading it")
    if not (deep or any(st.st_mtime >= lib.st_mtime for _, st, _ in found)):
        return None
    bad = _program_hash_problem(d)
    return Judgement.of(CORRUPT, bad) if bad else None


def _program_hash_problem(d: EntryDir) -> str | None:
    try:
        texts = [d.read_bytes(n, fsread.MAX_TEXT, follow=True).decode("utf-8") for n in ("options.txt", "program.txt")]
    except UnicodeDecodeError:
        return "options.txt or program.txt is not text: tilus fails reading it on every call"
    except OSError as exc:
        return f"cannot read options.txt or program.txt: {exc.strerror}"
    actual = hashlib.sha256((texts[0] + texts[1]).encode()).hexdigest()[:12]
    name = os.path.basename(d.path)
    if actual != name:
        return (f"options.txt + program.txt hash to {actual}, not {name}: edited after the build, so tilus "
                "fails on every call (the program text is different from the cached one)")
    return None


def _judge_script(d: EntryDir, deep: bool) -> Judgement:
    links = script_links(d)
    failures = build_failures(d)
    if failures:
        last = failures[-1]
        newest_ok = max([_lmtime(d, n) for n, _, _ in links] + [_lmtime(d, "dispatch_table.txt")], default=0.0)
        if last.mtime >= newest_ok:
            earlier = " (earlier builds succeeded)" if links else ""
            return Judgement.of(FAILED, f"its last build failed{earlier}: {last.error} "
                                        f"(failed/building/{os.path.basename(last.record)})")
    return _dispatch_problem(d, links, deep) or _programs_problem(d, links) or Judgement(COMPLETE)


def _dispatch_problem(d: EntryDir, links: list[tuple[str, str, str | None]], deep: bool) -> Judgement | None:
    """dispatch_table.pickle as tilus unpickles it (never unpickled here: its framing), or its absence where
    a latency/<key>/<i> link is already there (tilus fails creating it again on every call)."""
    table = "dispatch_table.pickle"
    st, link = _seen_file(d, table)
    if st is None:
        latency = sorted(n for n, _, _ in links if n.startswith("latency/"))
        if latency:
            return Judgement.of(CORRUPT, f"no dispatch_table.pickle but {latency[0]} exists: tilus fails "
                                         "creating that link again on every call")
        return None
    odd = _not_a_file(table, st, link, "")
    if odd:
        return odd
    if not st.st_mode & 0o444 or not d.access(table):
        return Judgement.of(UNREADABLE, "dispatch_table.pickle is unreadable (permission denied): tilus fails "
                                        "reading it")
    txt = _lmtime(d, "dispatch_table.txt")  # written right after the pickle
    if not (deep or link or st.st_size < 3 or abs(st.st_mtime - txt) > 2.0):
        return None
    try:
        data = d.read_bytes(table, 64 << 20, strict=False, follow=link)
    except OSError as exc:
        return Judgement.of(CORRUPT, f"cannot read dispatch_table.pickle: {exc.strerror}")
    if len(data) < 3 or data[0] != 0x80 or not 2 <= data[1] <= 5 or data[-1:] != b".":
        return Judgement.of(CORRUPT, "dispatch_table.pickle is not a whole pickle: tilus fails unpickling it "
                                     "on every call")
    return None


def _programs_problem(d: EntryDir, links: list[tuple[str, str, str | None]]) -> Judgement | None:
    """The script's programs (found through its links; tilus itself recomputes them): one tilus compiles
    again makes the script compile, one it fails on makes the script fail. Each program is another entry,
    opened from the anchored root (no link on the way followed)."""
    root = Path(d.path).parents[2]
    seen: set[str] = set()
    for name, text, target in links:
        if target is None:
            m = re.search(r"(?:^|/)programs/([0-9a-f]{12})/?$", text)
            if m and not _lexists(d.anchor, str(root / "programs" / m.group(1))):
                return Judgement.of(PARTIAL, f"its program {m.group(1)} is gone ({name}): tilus compiles it again")
            continue  # a link tilus never reads
        if target in seen or os.path.dirname(target) != str(root / "programs"):
            continue
        seen.add(target)
        with EntryDir.open(target, d.anchor, follow=True) as program:  # through the script's link, as tilus
            j = _judge_program(program, False, None)
        if j.status != COMPLETE:
            return Judgement.of(j.status, f"its program {os.path.basename(target)}: {j.reason}")
    return None


def _lexists(anchor: fsread.Anchor | None, path: str) -> bool:
    """os.path.lexists of a path in the cache (links on the way followed, as tilus meets it): below the
    anchored root resolved from the root held open."""
    if anchor is None or not anchor.holds(path):
        return os.path.lexists(path)
    try:
        os.stat(anchor.rel(path), dir_fd=anchor.fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def _lmtime(d: EntryDir, name: str) -> float:
    try:
        return d.lstat(name).st_mtime
    except OSError:
        return 0.0


def program_status(root: Path, path: str) -> tuple[str, str | None]:
    with EntryDir.open(path, fsread.anchor(root)) as d:
        j = judge(d, "program", Judging())
    return j.status, j.reason


def scan(ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]:
    if not flt.wants_target(TARGET) or flt.spaces:
        return  # tilus entries have no space
    scripts = ctx.root / "scripts"
    if flt.ops:
        script_dirs = [(o, str(scripts / o)) for o in flt.ops if fsread.is_real_dir(scripts / o)]  # never a link
    else:
        script_dirs = [(d.name, d.path) for d in ctx.listdir(scripts) if d.is_dir(follow_symlinks=False)]
    linked: dict[str, str] = {}  # program dir -> op of a script that links to it
    blocked: list[Entry] = []
    named = flt.name_prefixes()  # entries named by hash prefix or path: only names that start so are judged
    for op, sdir in script_dirs:
        for de in listing_or_unreadable(ctx, sdir, blocked, layout=NAME, kind="script", target=TARGET, space=None,
                                        op=op):
            if not de.is_dir(follow_symlinks=False) or named and not flt.ops and not de.name.startswith(named):
                continue
            with ctx.open_entry(de.path) as d:
                j = judge(d, "script", Judging())
            status, reason = j.status, j.reason
            if flt.ops:
                for _, _, target in links_at(de.path):
                    if target:
                        linked.setdefault(target, op)
            yield ctx.entry(path=de.path, usage=measure_tree(de.path, ctx.warn), layout=NAME, kind="script",
                            target=TARGET, space=None, op=op, hash=de.name, status=status, reason=reason)
    programs: list[tuple[str, str, str | None]]
    where = str(ctx.root / "programs")
    if flt.ops:  # only the programs the selected scripts use (and name): no need to read every program
        programs = [(os.path.basename(p), p, op) for p, op in sorted(linked.items())
                    if not named or os.path.basename(p).startswith(named)]
    elif named:  # the names that start so, from the listing a lookup kept while programs/ is unchanged
        programs = [(n, os.path.join(where, n), None) for n in ctx.subdirs(where, named)]
    else:  # from the listing kept while programs/ is unchanged (fs/dirnames.py): no object per name
        programs = [(n, f"{where}/{n}", None) for n in subdirs_or_unreadable(
            ctx, where, blocked, layout=NAME, kind="program", target=TARGET, space=None, op=None)]
    yield from blocked
    failures = failures_by_program(ctx.root)
    jobs = [(path, _plain_failure(failures.get(h)), linked_op) for h, path, linked_op in programs]
    yield from ctx.map_entries(_program_entry, jobs)


def _plain_failure(f: BuildFailure | None) -> tuple | None:
    """The failure as plain data, for a job the index compares (a changed record judges the program again)."""
    return None if f is None else (f.script, f.record, f.program, f.error, f.mtime)


def _program_entry(ctx, job: tuple[str, tuple | None, str | None]) -> Entry:
    """The entry of the program directory `path` (a job: plain data, so that the index can answer an
    unchanged program from its record, keyed by the lstat of every name in its tree; its verdict goes by
    its own files and the failed build the scripts recorded for it, which the job carries)."""
    path, failure, linked_op = job
    with ctx.open_entry(path) as d:
        recording = getattr(ctx, "recording", None)
        try:  # its usage and, to be recorded, the key (the whole tree's stats, before the judgement reads)
            usage, key = walk_tree(d, ctx.warn, recording is not None)
        except OSError:  # not there, or cannot be listed
            usage, key = measure_tree(path, ctx.warn), None
        if recording is not None:
            recording[path] = key
        j = _judge_program(d, False, BuildFailure(*failure) if failure else None)
        name = linked_op or _program_name(d)
    return ctx.entry(path=path, usage=usage, layout=NAME, kind="program", target=TARGET,
                     space=None, op=name, hash=os.path.basename(path), status=j.status, reason=j.reason)


def referrers(root: Path, program_path: str) -> list[str]:
    """Script directories with a link to the program at `program_path`."""
    return sorted(link_map(root).get(os.path.normpath(program_path), []))


def describe(root: Path, entry: Entry) -> Details:
    p = entry.path
    problems: list[str] = []
    facts: list[tuple[str, str]] = []
    files = list_files(p, problems.append)
    command = output = None
    binaries: tuple[str, ...] = ()
    inputs: tuple[TensorInfo, ...] = ()
    if entry.kind == "program":
        options = fsread.read_text(os.path.join(p, "options.txt"), 1 << 20, base=p)
        if options:
            m = re.search(r"arch='(\w+)'", options)
            if m:
                facts.append(("options arch", m.group(1)))
        script = fsread.read_text(os.path.join(p, "module", "compile.sh"), base=p)
        if script is not None:
            command = command_from_script(script)
        output = fsread.read_text(os.path.join(p, "module", "nvcc_output.txt"), base=p)
        lib = os.path.join(p, "module", "lib.so")
        binaries = (lib,) if os.path.lexists(lib) else ()  # a FIFO or link: the ELF reader says so
        users = referrers(root, p)
        facts.append(("used by scripts", ", ".join(os.path.relpath(u, root) for u in users) or "none"))
    else:
        for name, text, target in links_at(p):
            if target is None:
                facts.append((f"link {name}", f"{text} (dangling: tilus never reads it)"))
            else:
                facts.append((f"link {name}", f"{text} ({program_status(root, target)[0]})"))
        meta, bad = fsread.json_problem(os.path.join(p, "meta.json"), base=p)
        if bad and not bad.endswith("missing"):
            facts.append(("meta.json note", f"{bad} (tilus never reads it back)"))
        elif meta is not None:
            try:
                params = meta.get("params", {})
                for n, t in zip(params.get("names", []), params.get("types", [])):
                    # scalars (hidet.int32) and pointers (void*) are parameters, not tensors
                    kind = "pointer" if str(t).endswith("*") else "scalar"
                    facts.append((f"param {n}", f"{str(t).removeprefix('hidet.')} ({kind})"))
            except (ValueError, AttributeError, TypeError):
                facts.append(("meta.json note", "meta.json does not hold tilus's record (tilus never reads it back)"))
        table = fsread.read_text(os.path.join(p, "dispatch_table.txt"), base=p)
        if table:
            facts.append(("dispatch table", table.strip()))
    for f in failures_at(p) if entry.kind == "script" else ():
        facts.append((f"failed build {os.path.basename(f.record)}", f.error))
    verdict = Judgement.of(entry.status, entry.reason)
    if entry.hash and os.path.isdir(p):
        with EntryDir.open(p, fsread.anchor(root)) as d:
            verdict = judge(d, entry.kind, Judging(deep=True))
    problems = [*verdict.problems, *(x for x in problems if x not in verdict.problems)]
    status, reason = verdict.status, verdict.reason
    if problems and status == COMPLETE:
        status, reason = CORRUPT, problems[0]
    return Details(entry, status, reason, tuple(problems), files, entry.op, inputs, (), command, output,
                   binaries, tuple(facts))


def log_files(entry: Entry) -> list[LogFile]:
    if entry.kind == "program":
        dirs = [entry.path]
    else:  # a program directory that is itself a symlink is a stray, never read through
        dirs = sorted({t for _, _, t in links_at(entry.path) if t and not os.path.islink(t)})
    out = []
    failures = failures_at(entry.path) if entry.kind == "script" else \
        [f for f in failures_by_program(Path(entry.path).parents[1]).values()
         if f.program == os.path.basename(entry.path)]
    for f in failures:  # tilus's record of a failed build: the command and the compiler's error
        out.append(LogFile(f"failed build {os.path.basename(f.record)}", f.record))
    for d in dirs:
        for n in ("compile.sh", "nvcc_output.txt"):
            full = os.path.join(d, "module", n)
            if os.path.lexists(full):
                label = f"module/{n}" if entry.kind == "program" else f"{os.path.basename(d)}/module/{n}"
                out.append(LogFile(label, full))
    return out


# ---- for prune/clear -----------------------------------------------------------------------------

def link_map(root: Path) -> dict[str, list[str]]:
    """Every program dir (normalized path) -> the script dirs that link to it, over all scripts.

    One walk of scripts/ (links are read, never followed out of the cache)."""
    out: dict[str, list[str]] = {}
    scripts = os.path.join(root, "scripts")
    try:
        names = sorted(fsread.scandir_list(scripts), key=lambda d: d.name)
    except OSError:
        return out
    for sdir in names:
        if not sdir.is_dir(follow_symlinks=False):
            continue
        try:
            jdirs = sorted(fsread.scandir_list(sdir.path), key=lambda d: d.name)
        except OSError:
            continue
        for jdir in jdirs:
            if not jdir.is_dir(follow_symlinks=False):
                continue
            for _, _, target in links_at(jdir.path):
                if target:
                    users = out.setdefault(os.path.normpath(target), [])
                    if jdir.path not in users:
                        users.append(jdir.path)
    return out


def stray_links(ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]:
    """Symlinks where a program, a script or a script's op directory belongs: never followed
    (scan skips them); prune --broken and clear remove them as links."""
    if not flt.wants_target(TARGET) or flt.spaces:
        return

    def link(de: os.DirEntry, kind: str, op: str | None, h: str) -> Entry:
        return ctx.link_entry(de.path, f"where a {kind} belongs", layout=NAME, kind=kind, target=TARGET,
                              space=None, op=op, hash=h)

    linked_tops = set()
    for top, kind in (("programs", "program"), ("scripts", "script")):
        path = ctx.root / top
        if path.is_symlink():
            linked_tops.add(top)
            if not flt.ops:
                yield ctx.link_entry(str(path), f"where {top}/ belongs", layout=NAME, kind=kind, target=TARGET,
                                     space=None, op=None, hash="")
    if "programs" not in linked_tops:
        for de in ctx.listdir(ctx.root / "programs"):
            if de.is_symlink() and not flt.ops:
                yield link(de, "program", None, de.name)
    if "scripts" in linked_tops:
        return
    for sdir in ctx.listdir(ctx.root / "scripts"):
        if flt.ops and sdir.name not in flt.ops:
            continue
        if sdir.is_symlink():
            yield link(sdir, "script", sdir.name, "")
        elif sdir.is_dir(follow_symlinks=False):
            for de in ctx.listdir(sdir.path):
                if de.is_symlink():
                    yield link(de, "script", sdir.name, de.name)


# ---- the layout ----------------------------------------------------------------------------------

_OPTIONS_ARCH = re.compile(rb"arch='sm_?(\d+)([af]?)'")


class TilusLayout(Layout):
    """tilus: scripts link to the programs they run (relative symlinks into programs/)."""

    shape = TILUS
    writer_locks = (".lock", "dispatch_table.txt.lock")
    provider_kinds = frozenset({"program"})
    fact_files = ("kcache.json", "module/compile.sh", "options.txt")

    detect = staticmethod(detect)
    shape_problem = staticmethod(shape_problem)
    scan = staticmethod(scan)
    stray_links = staticmethod(stray_links)
    judge = staticmethod(judge)
    describe = staticmethod(describe)
    log_files = staticmethod(log_files)

    def uses(self, root: Path, entry: Entry) -> list[str]:
        if entry.kind != "script":
            return []
        return [os.path.relpath(t, root).replace(os.sep, "/") for _, _, t in links_at(entry.path) if t]

    def users(self, root: Path, providers: list[str]) -> dict[str, list[str]]:
        links = link_map(root)
        return {p: links.get(os.path.normpath(p), []) for p in providers}

    def users_break(self, kind: str) -> bool:
        return kind == "program"  # its scripts' links would dangle

    def use_words(self, kind: str) -> tuple[str, str]:
        return "links to", "linked from"

    def link_target(self, kind: str, resolved: list[str]) -> str | None:
        if kind == "script" and len(resolved) == 2 and resolved[0] == "programs" and not resolved[1].startswith("."):
            return "/".join(resolved)
        return None

    def empty_parent_levels(self, kind: str) -> int:
        return 1 if kind == "script" else 0  # the script's op directory

    def compile_command(self, small: Mapping[str, bytes]) -> str | None:
        script = small.get("module/compile.sh")
        return command_from_script(script.decode("utf-8", "replace")) if script is not None else None

    def options_arch(self, small: Mapping[str, bytes]) -> str | None:
        m = _OPTIONS_ARCH.search(small.get("options.txt") or b"")
        return f"sm_{m.group(1).decode()}{m.group(2).decode()}" if m else None


LAYOUT = TilusLayout()
