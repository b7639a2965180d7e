"""TorchInductor's cache (torch 2.5+, read against torch 2.13's `torch/_inductor/codecache.py` and
`torch/_functorch/_aot_autograd/autograd_cache.py`).

Root: TORCHINDUCTOR_CACHE_DIR, else `<tempdir>/torchinductor_<user>` (layouts/homes.py). Kinds:
- `graph`: `fxgraph/<k[1:3]>/<k>/` (k = "f" + 51 base32), one pickled CompiledFxGraph per guard variant,
  each file named by the base32 sha256 of its own bytes. Torch tries the variants in name order, skips
  one that does not unpickle (a warning), and compiles again when none fits: a miss.
- `autograd`: `aotautograd/<k>/` (k = "a" + ...), pickled entries that name the fx graphs they need
  (forward, backward) by key. Torch misses the whole entry when one of them is missing.
- `code`: `<2 chars>/` shard directories of `c<key>.{py,cpp,so,main.cpp,main.so,best_config,...}` groups.
  A fx graph holds its source code: torch rewrites a missing `.py` and compiles a missing `.so` again
  without a fx graph miss; a truncated `.so` fails to load, and so does a `.py` that does not compile
  (deep: torch never writes an existing one again); a `.cpp` is read only while its `.so` is missing.
  torch writes a kernel's `.cpp` first, then compiles it holding the FileLock `locks/<key>.lock` (a
  flock), its compiler writing the `.so` in place:
  a shard one of whose kernels is not whole while its lock is held (or whose source is fresh) is building.
- `autotune`: `cache/`, JSON tables of autotuning results.
- `triton`: `triton/<device>/<key>/`, Triton kernel directories judged by the Triton layout's rules.
Every file but a compiler's output is written as `.<pid>.<tid>.tmp` and renamed, so a visible one is
whole and a dot-tmp file is a writer's (in flight while its pid lives, a leftover once old). Nothing
marks completion, nothing is written on a hit. A symlink, FIFO, device or socket in an entry (torch
opens it; kcache never does) makes it unreadable, never removed (checks.not_regular). kcache never
unpickles: a variant is judged by pickle's framing (PROTO first, STOP last) and, deep, by the sha256 its
name states. `locks/` holds torch's FileLocks: probed, never removed.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import stat
import subprocess
import sys
import warnings
from dataclasses import replace as replace_entry
from pathlib import Path
from typing import Iterable, Iterator, Mapping, NamedTuple

from kcache_cli import layouts
from kcache_cli.fs import read as fsread
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.fs.locking import probe_locked
from kcache_cli.layouts.base import (
    MISS,
    STALE_AFTER,
    UNKNOWN,
    Facts,
    Here,
    Judging,
    Layout,
    MegaFile,
    MegaPlace,
    ScanContext,
    Verdict,
    not_installed,
    unasked,
)
from kcache_cli.layouts.shapes import INDUCTOR
from kcache_cli.layouts.shapes import TRITON as TRITON_SHAPE
from kcache_cli.layouts.shapes import inductor_graph_relpath as graph_relpath
from kcache_cli.layouts.shapes import inductor_graph_shard as graph_shard
from kcache_cli.model.checks import elf_truncated, list_files, not_regular
from kcache_cli.model.records import (
    BUILDING,
    COMPLETE,
    CORRUPT,
    PARTIAL,
    UNREADABLE,
    UNREADABLE_REASON,
    Details,
    Entry,
    Judgement,
    ScanFilter,
    Status,
    TreeUsage,
    entry_with,
    measure_tree,
    usage_of,
)

NAME = INDUCTOR.name
GRAPH, AUTOGRAD, CODE, AUTOTUNE, TRITON = "graph", "autograd", "code", "autotune", "triton"
TRITON_KERNEL = TRITON_SHAPE.kinds[0].kind  # what the Triton layout calls a nested kernel
TMP_RE = re.compile(r"^\.(\d+)\.(\d+)\.tmp$")  # write_atomic's temp file: .<pid>.<thread id>.tmp
VARIANT_RE = re.compile(r"^[a-z2-7]{51}$")
FX_KEY_RE = re.compile(rb"f[a-z2-7]{51}")
# Each byte a key may hold ([a-z2-7]) as b"k", any other as b".": a key lies in a run of 52 b"k"s
_KEY_MARKS = bytes(0x6B if chr(c) in "abcdefghijklmnopqrstuvwxyz234567" else 0x2E for c in range(256))
_KEY_RUN = b"k" * 52
CODE_RE = re.compile(r"^(c[a-z2-7]{51})\.(.+)$")
PICKLE_PROTOCOLS = range(2, 6)
CPU = "cpu"  # the target of a code shard of C++ only (its .so is a host library)
CPU_SUFFIXES = frozenset({"cpp", "h", "o", "so"})
MAX_WRAPPER = 64 << 20  # a generated .py wrapper kcache parses (deep); real ones are kilobytes to megabytes
# Parsing costs up to ~350 bytes of memory and ~1 us per byte of dense code (`x = 1 < 1 < 1 ...`: 8 MB,
# 2.5 GB and 8 s). A wrapper up to INLINE_WRAPPER is parsed here (at most ~100 MB, 0.2 s); a bigger one in
# an interpreter of its own, bounded in memory and CPU time (past either: not judged).
INLINE_WRAPPER = 256 << 10
APART_MEMORY, APART_SECONDS = 512 << 20, 2
# The file name python_problem compiles under: what the parser warns about there (an invalid escape) is
# dropped, never shown to kcache's user nor turned into an error by -W error.
WRAPPER_FILE = "<kcache: an Inductor wrapper>"
warnings.filterwarnings("ignore", module=re.escape(WRAPPER_FILE))


# ---- writers' temp files -----------------------------------------------------------------------------

def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's live process (or a pid we cannot ask about): assume alive
    return True


def temp_status(name: str, mtime: float, now: float) -> tuple[Status, str]:
    """(BUILDING or PARTIAL, why) for a writer's `.<pid>.<tid>.tmp` file."""
    m = TMP_RE.match(name)
    pid = int(m.group(1)) if m else 0
    if pid and pid_alive(pid):
        return BUILDING, f"{name}: torch process {pid} is writing it"
    if now - mtime < STALE_AFTER:
        return BUILDING, f"{name} written {now - mtime:.0f}s ago (a writer on another machine may still be at it)"
    return PARTIAL, f"{name} left by a torch process killed between its write and its rename"


# ---- one directory, listed once ---------------------------------------------------------------------

class Listing(NamedTuple):
    files: dict[str, os.stat_result]  # regular files by name (dot files included)
    links: dict[str, os.stat_result]
    others: dict[str, os.stat_result]  # directories, FIFOs, devices, sockets: not torch's
    readable: bool
    mtime: float  # the directory's own
    own: os.stat_result | None = None  # the directory's own fstat, taken before any file was

    def usage(self, path: str, warn) -> TreeUsage:
        """What measure_tree would say, from this listing when it holds files only (one pass, not two)."""
        if self.others or self.own is None:  # (a listing that could not be read has none)
            return measure_tree(path, warn)
        return usage_of(self.own, [*self.files.values(), *self.links.values()])


def listing(where: EntryDir | str) -> Listing:
    """The files, links and other names directly in the directory, listed through its fd (a path is
    opened first, its last component not followed); each file's and link's lstat kept in `listing` of
    the EntryDir, so that its reads skip their own stat."""
    if isinstance(where, str):
        with EntryDir.open(where) as d:
            return listing(d)
    files: dict[str, os.stat_result] = {}
    links: dict[str, os.stat_result] = {}
    others: dict[str, os.stat_result] = {}
    if where.fd is None:
        return Listing({}, {}, {}, False, 0.0)
    try:
        own = os.fstat(where.fd)
        mtime = own.st_mtime
        for name, st in sorted(_listed(where).items()):
            if stat.S_ISLNK(st.st_mode):
                links[name] = st
            elif stat.S_ISREG(st.st_mode):
                files[name] = st
            else:
                others[name] = st
    except OSError:
        return Listing({}, {}, {}, False, 0.0)
    where.listing.update(files)
    where.listing.update(links)
    return Listing(files, links, others, True, mtime, own)


def _listed(where: EntryDir) -> dict[str, os.stat_result]:
    """Every name directly in the open directory with its lstat: as the walk it shares saw them (a vLLM
    unit's), else listed now (a name gone since its listing is left out)."""
    walked = where.walked()
    if walked is not None:
        return walked
    out = {}
    with os.scandir(where.fd) as it:  # listing() checked it is open
        for de in it:
            try:
                out[de.name] = de.stat(follow_symlinks=False)
            except OSError:
                continue
    return out


def odd_file(lst: Listing) -> str | None:
    """Why the directory leaves its entry unreadable: the first name in it that is a symlink, FIFO, device
    or socket (torch opens what it finds under its names; kcache never does: checks.not_regular)."""
    odd = {**lst.links, **lst.others}
    return next((why for n in sorted(odd) if (why := not_regular(n, odd[n].st_mode, "torch"))), None)


def unreadable_file(d: EntryDir, name: str, st: os.stat_result) -> str | None:
    """EntryDir.unreadable, asked only when a read bit is missing (a file everyone may read is readable)."""
    return None if st.st_mode & 0o444 == 0o444 else d.unreadable(name)


# ---- fx graph and aotautograd entries ---------------------------------------------------------------

def variant_problem(d: EntryDir, name: str, size: int, deep: bool) -> str | None:
    """Why torch cannot unpickle the variant `name` in `d` (by its framing, or deep by its name's hash)."""
    if size == 0:
        return f"variant {name} is empty"
    try:
        if deep and _b32_of_file(d, name) != name:
            return f"variant {name}'s bytes do not hash to its name (damaged after torch wrote it)"
        head, tail = _ends(d, name)
    except OSError as exc:
        return f"variant {name} cannot be read: {exc.strerror or exc}"
    if len(head) < 2 or head[0] != 0x80 or head[1] not in PICKLE_PROTOCOLS or tail != b".":
        return f"variant {name} is not a whole pickle (truncated or overwritten)"
    return None


def _b32_of_file(d: EntryDir, name: str) -> str:
    h = hashlib.sha256()
    for chunk in d.iter_chunks(name):
        h.update(chunk)
    return base64.b32encode(h.digest())[:51].decode().lower()


def _ends(d: EntryDir, name: str) -> tuple[bytes, bytes]:
    fd, st = d.open_file(name)
    try:
        return os.pread(fd, 2, 0), os.pread(fd, 1, max(st.st_size - 1, 0))
    finally:
        fsread.close_read(fd)


def judge_guarded(d: EntryDir, jc: Judging, lst: Listing | None = None) -> Judgement:
    """An fx graph or aotautograd key directory: complete when one variant is whole (torch tries each).
    `jc.graphs` holds the fx graphs judged so far (an aotautograd entry asks for its graphs')."""
    lst = lst or listing(d)
    if not lst.readable:
        return Judgement.of(UNREADABLE, UNREADABLE_REASON)
    variants = [n for n in lst.files if VARIANT_RE.match(n)]
    bad: list[str] = []
    good: list[str] = []
    for n in variants:
        why = unreadable_file(d, n, lst.files[n])
        if why:
            return Judgement.of(UNREADABLE, why)
        problem = variant_problem(d, n, lst.files[n].st_size, jc.deep)
        (bad if problem else good).append(problem or n)
    odd = odd_file(lst)
    if odd:
        return Judgement.of(UNREADABLE, odd)
    if not good:
        return _no_good_variant(lst, bad, jc.now, lst.mtime)
    if os.path.basename(os.path.dirname(d.path)) == "aotautograd":
        return missing_graphs(d, good, jc)
    return Judgement(COMPLETE)


def _no_good_variant(lst: Listing, bad: list[str], now: float, mtime: float) -> Judgement:
    temps = [(n, st) for n, st in lst.files.items() if TMP_RE.match(n)]
    if bad:
        return Judgement(CORRUPT, bad[0] + ": torch skips it with a warning and compiles again", tuple(bad))
    if temps:
        return Judgement.of(*temp_status(temps[0][0], temps[0][1].st_mtime, now))
    if now - mtime < STALE_AFTER:
        return Judgement.of(BUILDING, "no graph in it yet: torch made it less than an hour ago and may be writing")
    return Judgement.of(PARTIAL, "no graph in it: torch misses and compiles again")


def graph_keys(where: EntryDir | str, variants: list[str]) -> list[str]:
    """The fx graph keys the aotautograd variants name, read from their bytes (never unpickled); each
    variant read once while `where` is held (the index's key and the verdict both ask)."""
    if isinstance(where, str):
        with EntryDir.open(where) as d:
            return graph_keys(d, variants)
    keys: set[str] = set()
    for n in variants:
        named = where.derived.get(("fx graph keys", n))
        if named is None:
            named = where.derived[("fx graph keys", n)] = _named_keys(where, n)
        keys.update(named)
    return sorted(keys)


def _named_keys(d: EntryDir, name: str) -> frozenset[str]:
    """The fx graph keys in the bytes of the variant `name` (those read before a read failed)."""
    keys: set[str] = set()
    tail = b""
    try:  # streamed, with an overlap of one key's length so that no key is cut between two chunks
        for chunk in d.iter_chunks(name):
            data = tail + chunk
            keys.update(k.decode() for k in fx_keys(data))
            tail = data[-51:]
    except OSError:
        pass
    return frozenset(keys)


def fx_keys(data: bytes) -> list[bytes]:
    """FX_KEY_RE.findall(data), searched only in the runs of 52 or more bytes a key may hold (found with
    bytes.find; no match lies across any other byte): the same keys, in 60% of the time on a variant."""
    marks = data.translate(_KEY_MARKS)
    out: list[bytes] = []
    start = marks.find(_KEY_RUN)  # the first such run's start: any run before it is shorter
    while start >= 0:
        end = marks.find(b".", start + len(_KEY_RUN))
        end = len(data) if end < 0 else end
        out += FX_KEY_RE.findall(data, start, end)
        start = marks.find(_KEY_RUN, end)
    return out


def missing_graphs(d: EntryDir, variants: list[str], jc: Judging) -> Judgement:
    """The aotautograd entry as the fx graphs it names make it: partial when one is missing or broken
    (torch misses both and compiles again), unreadable or building when one is, else complete. The
    graphs are read through `fxgraph/` of its cache root, opened from the anchor (no link followed)."""
    keys = graph_keys(d, variants)
    if not keys:
        return Judgement(COMPLETE)
    root = os.path.dirname(os.path.dirname(d.path))
    memo = jc.graphs if jc.graphs is not None else {}
    cheap = replace_entry(jc, deep=False)
    with EntryDir.open(os.path.join(root, "fxgraph"), d.anchor) as fx:
        fx.share_walk(d.walk)  # the walk of a vLLM unit holding both, if one was shared
        for key in keys:
            where, rel = os.path.join(root, graph_relpath(key)), graph_relpath(key).split("/", 1)[1]
            try:
                mode = fx.lstat(rel).st_mode
            except OSError:
                mode = 0
            if not (stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):  # a link is judged unreadable: never followed
                return Judgement.of(PARTIAL, f"the fx graph {key} it names is missing: torch misses and compiles "
                                    "both again")
            j = memo.get(where)
            if j is None:
                with fx.sub(rel) as g:
                    j = memo.setdefault(where, judge_guarded(g, cheap))
            if j.status in (UNREADABLE, BUILDING):
                return Judgement.of(j.status, f"the fx graph {key} it names is {j.status} ({j.reason})")
            if j.status != COMPLETE:
                return Judgement.of(PARTIAL, f"the fx graph {key} it names is {j.status}: torch misses and "
                                    "compiles both again")
    return Judgement(COMPLETE)


# ---- code cache shards ------------------------------------------------------------------------------

def code_groups(names) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for n in names:
        m = CODE_RE.match(n)
        if m:
            groups.setdefault(m.group(1), []).append(m.group(2))
    return groups


INTERRUPTED = "its compile was interrupted"


def judge_code(d: EntryDir, jc: Judging, lst: Listing | None = None) -> Judgement:
    """A `<2>/` shard of the code cache, as torch uses its kernels (`c<key>.*` groups) one by one. One
    torch may be compiling now (_compiling) makes it building; a damaged file torch loads and fails on
    makes it corrupt (removing the shard cures that: torch compiles its kernels again from the fx graphs);
    a kernel whose compile was interrupted (a .cpp with no .so) is compiled again on its next use while
    the others still hit, so the shard is partial only when none of its kernels is whole."""
    lst = lst or listing(d)
    if not lst.readable:
        return Judgement.of(UNREADABLE, UNREADABLE_REASON)
    odd = odd_file(lst)
    if odd:
        return Judgement.of(UNREADABLE, odd)
    kernels = {key: _group_problems(d, key, exts, lst, jc.deep) for key, exts in sorted(code_groups(lst.files).items())}
    problems = tuple(p for found in kernels.values() for p in found)
    unreadable = next((p for p in problems if p.startswith("unreadable:")), None)
    if unreadable:
        return Judgement.of(UNREADABLE, unreadable[12:])
    busy = _compiling(d, [k for k, found in kernels.items() if found], lst, jc.now)
    if busy:
        return Judgement.of(BUILDING, busy)
    corrupt = next((p for p in problems if INTERRUPTED not in p), None)
    if corrupt:
        return Judgement(CORRUPT, corrupt, problems)
    if kernels and all(kernels.values()):
        return Judgement(PARTIAL, problems[0], problems)
    temps = [(n, st) for n, st in lst.files.items() if TMP_RE.match(n)]
    if not kernels and temps:
        return Judgement.of(*temp_status(temps[0][0], temps[0][1].st_mtime, jc.now))
    if not kernels:
        return Judgement.of(PARTIAL, "no code cache files in it")
    return Judgement(COMPLETE)  # its interrupted kernels, if any, are named by inspect (_facts)


def _compiling(d: EntryDir, keys: list[str], lst: Listing, now: float) -> str | None:
    """Why torch may be writing one of the kernels `keys` (those not whole) right now, or None. torch
    (CppCodeCache.load_async) writes a kernel's source, then compiles and links it holding the FileLock
    `<cache>/locks/<key>.lock` (a flock), the library written in place: a held lock is a compile in
    progress, and a source with no library written less than an hour ago may still be waiting for its
    lock (a compile worker's queue)."""
    held = _held_lock(d, keys)
    if held:
        return f"torch holds locks/{held}.lock: it is compiling {held}"
    for key in keys:
        for name in sorted(n for n in lst.files if n.startswith(key + ".") and n.endswith("cpp")):
            age = now - lst.files[name].st_mtime
            if age < STALE_AFTER and name[:-3] + "so" not in lst.files:
                return f"{name} written {age:.0f}s ago, no .so yet: torch may be about to compile it"
    return None


def _held_lock(d: EntryDir, keys: list[str]) -> str | None:
    """The first of `keys` whose lock (`locks/<key>.lock` beside the shard) a process holds, probed
    through the cache root's `locks/` opened from the shard's anchor (no link followed)."""
    if not keys:
        return None
    with EntryDir.open(os.path.join(os.path.dirname(d.path), "locks"), d.anchor) as locks:
        if locks.fd is None:
            return None
        return next((k for k in keys if probe_locked(f"{k}.lock", locks.fd)), None)


def _group_problems(d: EntryDir, key: str, exts: list[str], lst: Listing, deep: bool = False) -> list[str]:
    out = []
    for ext in sorted(exts):
        name = f"{key}.{ext}"
        size = lst.files[name].st_size
        why = unreadable_file(d, name, lst.files[name])
        if why:
            return [f"unreadable: {why}"]
        if size == 0 and ext.endswith("cpp") and ext[:-3] + "so" in exts:
            continue  # torch loads the library it built and never reads the source again (the oracle: a hit)
        if size == 0:
            out.append(f"{name} is empty: torch loads it and fails")
        elif ext.endswith("so"):
            bad = elf_truncated(name, d.read_head(name, 64), size)
            if bad:
                out.append(bad + ": torch fails loading it")
        elif ext.endswith("cpp") and ext[:-3] + "so" not in exts:
            out.append(f"{name} has no {ext[:-3]}so: {INTERRUPTED} (torch compiles it again)")
        elif ext == "py" and deep:
            bad = python_problem(d, name)
            if bad:
                out.append(bad)
    return out


def python_problem(d: EntryDir, name: str) -> str | None:
    """Why torch's import of the wrapper `name` fails (deep): torch compiles its text as it finds it
    (`_reload_python_module`; a file already there is never written again), so one cut short or
    overwritten fails every load. compile() only parses and never runs the code; kcache's Python parses
    what torch's generated code holds. None when it compiles, or is not judged: over MAX_WRAPPER, or
    past what its parse may cost (INLINE_WRAPPER, _compiled_apart)."""
    try:
        source = d.read_bytes(name, MAX_WRAPPER)
    except OSError:
        return None
    if len(source) > INLINE_WRAPPER:
        why = _compiled_apart(source)
        return f"{name} does not compile ({why}): torch's import of it fails" if why else None
    try:
        compile(source, WRAPPER_FILE, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"{name} does not compile ({exc.msg}, line {exc.lineno}): torch's import of it fails"
    except ValueError as exc:  # null bytes (Python 3.11; a SyntaxError from 3.12)
        return f"{name} does not compile ({exc}): torch's import of it fails"
    except (RecursionError, MemoryError):  # nested beyond what this Python parses: not judged
        return None
    return None


# What _compiled_apart runs: exit 3 with why the text does not compile, 0 when it does; anything else
# (out of memory or CPU time, nested too deep) is no verdict.
_APART = """
import resource, sys, warnings
resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
resource.setrlimit(resource.RLIMIT_CPU, ({seconds}, {seconds}))
warnings.simplefilter("ignore")
try:
    compile(sys.stdin.buffer.read(), {file!r}, "exec", dont_inherit=True)
except SyntaxError as exc:
    print(f"{{exc.msg}}, line {{exc.lineno}}")
    sys.exit(3)
except ValueError as exc:
    print(exc)
    sys.exit(3)
"""


def _compiled_apart(source: bytes) -> str | None:
    """Why `source` does not compile, parsed by this Python in a process of its own (isolated, no site)
    whose memory and CPU time are bounded (APART_MEMORY, APART_SECONDS): None when it compiles or the
    parse went past a bound."""
    code = _APART.format(memory=APART_MEMORY, seconds=APART_SECONDS, file=WRAPPER_FILE)
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", code], input=source, capture_output=True,
                              timeout=4 * APART_SECONDS, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout.decode("utf-8", "replace").strip() or "a syntax error") if done.returncode == 3 else None


# ---- autotune tables and nested Triton caches -------------------------------------------------------

def judge_autotune(d: EntryDir, jc: Judging) -> Judgement:
    lst = listing(d)
    if not lst.readable:
        return Judgement.of(UNREADABLE, UNREADABLE_REASON)
    odd = odd_file(lst)
    if odd:
        return Judgement.of(UNREADABLE, odd)
    for name, st in lst.files.items():
        if name.startswith("."):
            continue
        why = d.unreadable(name)
        if why:
            return Judgement.of(UNREADABLE, why)
        if st.st_size == 0 or (jc.deep and d.json_problem(name)[1]):
            return Judgement.of(CORRUPT, f"{name} is not a JSON table (torch fails reading it)")
    return Judgement(COMPLETE)


def _triton() -> Layout:
    """The Triton layout, whose rules judge the Triton caches nested under triton/<device>/: found through
    the registry, as every other layout would be (no layout imports another)."""
    return layouts.get(TRITON_SHAPE.name)


def _as_triton(entry: Entry) -> Entry:
    """A nested Triton kernel's entry as the Triton layout's own kind."""
    return entry_with(entry, kind=TRITON_KERNEL)


# ---- torch's Mega-Cache: where each artifact's populate_cache writes, and what export carries ------
# (torch 2.13: InductorCacheArtifact, AOTAutogradCacheArtifact, AutotuneCacheArtifact, PGOCacheArtifact,
# PrecompileCacheArtifact; the blob's framing is kcache_cli/formats/megacache.py's)

MEGA_GRAPH, MEGA_AUTOGRAD, MEGA_AUTOTUNE, MEGA_PGO, MEGA_PRECOMPILE = (
    "inductor", "aot_autograd", "autotune", "pgo", "precompile")
MEGA_TYPES = frozenset({MEGA_GRAPH, MEGA_AUTOGRAD, MEGA_AUTOTUNE, MEGA_PGO, MEGA_PRECOMPILE})
GRAPH_KEY_RE = re.compile(r"^f[a-z2-7]{51}$")
AUTOGRAD_KEY_RE = re.compile(r"^a[a-z2-7]{51}$")
AUTOTUNE_KEY_RE = re.compile(r"^([a-z2-7]{2})/([A-Za-z0-9_-]{1,128}\.best_config)$")
PRECOMPILE_KEY_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")
PGO_UNSAFE_RE = re.compile(r'[<>:"/\\|?*]')  # torch's code_state_path replaces these with "_"


def variant_name(content: bytes) -> str:
    """The name torch gives a guard variant: the base32 of its bytes' sha256, 51 characters, lower case."""
    return base64.b32encode(hashlib.sha256(content).digest())[:51].decode().lower()


def mega_place(kind: str, key: str, content: bytes) -> MegaPlace | str | None:
    """Where torch 2.13's populate_cache writes the artifact, relative to the Inductor root."""
    if kind == MEGA_GRAPH:
        if not GRAPH_KEY_RE.match(key):
            return f"fx graph key {key[:80]!r} is not an Inductor fx graph key (f + 51 base32)"
        return MegaPlace(GRAPH, graph_relpath(key), variant_name(content))
    if kind == MEGA_AUTOGRAD:
        if not AUTOGRAD_KEY_RE.match(key):
            return f"AOTAutograd key {key[:80]!r} is not an AOTAutograd key (a + 51 base32)"
        return MegaPlace(AUTOGRAD, f"aotautograd/{key}", variant_name(content))
    if kind == MEGA_AUTOTUNE:
        m = AUTOTUNE_KEY_RE.match(key)  # torch joins the key to its cache dir as it is: "../x" would leave it
        if not m:
            return f"autotune key {key[:80]!r} is not <2 chars>/<hash>.best_config (torch would write it there)"
        return MegaPlace(None, m.group(1), m.group(2))
    if kind == MEGA_PGO:
        name = PGO_UNSAFE_RE.sub("_", f"code_state_{key}.pkl")
        if len(os.fsencode(name)) > 255 or "\0" in name:  # the file system's limit is in bytes (UTF-8's)
            return f"PGO key {key[:80]!r} makes no file name (over 255 bytes)"
        return MegaPlace(None, "dynamo", name)
    if kind == MEGA_PRECOMPILE:
        if not PRECOMPILE_KEY_RE.match(key) or key in (".", ".."):
            return f"precompile key {key[:80]!r} is not one directory name (torch writes dynamo/<key>/entry)"
        return MegaPlace(None, f"dynamo/{key}", "entry")
    return None


def mega_artifacts(root: Path) -> list[MegaFile]:
    """The whole guard variants of every fx graph and AOTAutograd entry, and the autotune records
    (`<shard>/*.best_config`) under `root`, as save_cache_artifacts records them. A damaged variant is
    left out (torch would skip it too)."""
    out: list[MegaFile] = []
    anchor = fsread.anchor(root)
    for top, typ in (("fxgraph", MEGA_GRAPH), ("aotautograd", MEGA_AUTOGRAD)):
        dirs = [k for sh in fsread.subdir_paths(os.path.join(root, top)) for k in fsread.subdir_paths(sh)] \
            if top == "fxgraph" else fsread.subdir_paths(os.path.join(root, top))
        for path in dirs:
            key = os.path.basename(path)
            if not (GRAPH_KEY_RE if typ == MEGA_GRAPH else AUTOGRAD_KEY_RE).match(key):
                continue
            with EntryDir.open(path, anchor) as d:
                lst = listing(d)
                out += [MegaFile(typ, key, os.path.relpath(os.path.join(path, n), root)) for n, st in lst.files.items()
                        if VARIANT_RE.match(n) and variant_problem(d, n, st.st_size, True) is None]
    for de in fsread.sorted_entries(root, lambda e: len(e.name) == 2 and e.is_dir(follow_symlinks=False)):
        out += [MegaFile(MEGA_AUTOTUNE, f"{de.name}/{n}", f"{de.name}/{n}") for n in sorted(fsread.names(de.path))
                if AUTOTUNE_KEY_RE.match(f"{de.name}/{n}")]
    return out


# ---- will torch here use it (kcache explain) --------------------------------------------------------

PACKAGE = "torch"
ENV_SWITCHES = ("TORCHINDUCTOR_*", "TORCH_COMPILE_*", "TORCHDYNAMO_*")
# What each Mega-Cache artifact type is among the cache's entries (pgo and precompile are Dynamo's own)
_MEGA_KIND = {MEGA_GRAPH: GRAPH, MEGA_AUTOGRAD: AUTOGRAD, MEGA_AUTOTUNE: AUTOTUNE}
# torch 2.13's variables that turn a cache off, as its Config reads an env_name_force: the first one set
# wins, "1" is True, "0" False, any other text itself (so "" is False and "no" True); the kinds each leaves
# unused, proven on CPU (tests/loaders/test_mega_torch.py): force_disable_caches compiles into a fresh
# cache dir (Triton's too); fx_graph_cache off also makes AOTAutograd bypass its cache (check_cacheable),
# unless the remote fx graph cache is on; enable_autograd_cache off leaves the fx graphs in use.
_FORCE_DISABLE = ("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "TORCH_COMPILE_FORCE_DISABLE_CACHES")
_FX_GRAPH_CACHE, _FX_REMOTE, _AUTOGRAD_CACHE = (
    "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE")


def _torch_flag(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, bool] | None:
    """(the variable, its truth) of the first of `names` set in `env`, as torch reads it; None: none set."""
    name = next((n for n in names if n in env), None)
    if name is None:
        return None
    value = env[name]
    return name, value == "1" or (value != "0" and bool(value))


def switched_off(kind: str, env: Mapping[str, str]) -> Verdict | None:
    """The miss when torch, with the environment switches `env`, does not read a `kind` entry (an entry's
    kind, or a blob artifact's type) from its cache; None when no switch stops it. One rule for the
    cache's entries, an archive's records and a blob's artifacts."""
    kind = _MEGA_KIND.get(kind, kind)
    force = _torch_flag(env, _FORCE_DISABLE)
    fx, autograd = _torch_flag(env, (_FX_GRAPH_CACHE,)), _torch_flag(env, (_AUTOGRAD_CACHE,))
    remote_fx = _torch_flag(env, (_FX_REMOTE,))
    if force and force[1]:
        name, what = force[0], "torch reads no cache (it compiles into a fresh one)"
    elif fx and not fx[1] and (kind == GRAPH or (kind == AUTOGRAD and not (remote_fx and remote_fx[1]))):
        name, what = fx[0], ("torch reads no fx graph from its cache" if kind == GRAPH else
                             "AOTAutograd bypasses its cache when the fx graph cache is off")
    elif autograd and not autograd[1] and kind == AUTOGRAD:
        name, what = autograd[0], "torch reads no AOTAutograd entry from its cache"
    else:
        return None
    return Verdict(MISS, f"{name}={env[name]} here: {what}", name, None, env[name])


def explain(root: Path, entry: Entry, here: Here) -> Verdict:
    """An fx graph, AOTAutograd entry or code shard is keyed by torch_key() (torch's version and sources),
    the graph, its inputs and Inductor's config, none of which the entry records outside its pickles (kcache
    never unpickles): kcache can tell a miss (no torch here, an incomplete entry, a cache switched off),
    never a hit."""
    if entry.kind == TRITON:
        off = switched_off(TRITON, here.env) if here.versions.get(PACKAGE) else None
        return off or _triton().explain(root, _as_triton(entry), here)
    if (not_asked := unasked(here)) is not None:
        return not_asked
    if here.versions.get(PACKAGE) is None:
        return not_installed("torch", PACKAGE)
    if entry.status != COMPLETE:
        return Verdict(MISS, f"torch does not use a {entry.status} entry: {entry.reason}", "status", entry.status,
                       COMPLETE)
    return switched_off(entry.kind, here.env) or Verdict(
        UNKNOWN, f"the {entry.kind} entry's key hashes the torch version, the graph and Inductor's config, which "
        f"it records only inside pickles (torch {here.versions[PACKAGE]} here)")


def explain_mega(kind: str, recorded: Mapping[str, object], here: Here) -> Verdict:
    """A Mega-Cache blob's artifact of type `kind`, by the torch version its sidecar records (kcache export
    writes it) and the switches that turn torch's caches off here."""
    value = recorded.get("torch_version")
    torch_version = value if isinstance(value, str) else None
    have = here.versions.get(PACKAGE)
    if (not_asked := unasked(here)) is not None:
        return not_asked
    if have is None:
        return not_installed("torch", PACKAGE, torch_version)
    off = switched_off(kind, here.env)
    if off:
        return off
    if torch_version is None:
        return Verdict(UNKNOWN, "the blob records no torch version (no kcache sidecar beside it)")
    if torch_version != have:
        return Verdict(MISS, "torch keys every artifact by its own version (torch_key)", "torch version",
                       torch_version, have)
    return Verdict(UNKNOWN, f"torch {have} as recorded; the keys also hash the graph, its inputs and config, "
                   "which the blob records only inside pickles")


def explain_record(record: Mapping[str, object], here: Here) -> Verdict:
    """An archive's or image's entry: a cache switched off here is a miss (the rule the cache's entries and
    a blob's artifacts follow); else unknown, as for the default."""
    off = switched_off(str(record.get("kind")), here.env) if here.versions.get(PACKAGE) and not here.problem else None
    return off or Verdict(UNKNOWN, "kcache does not judge inductor entries from what an archive or image records")


# ---- the judgement, the scan ------------------------------------------------------------------------

def judge(d: EntryDir, kind: str, jc: Judging) -> Judgement:
    return _judge(d, kind, jc, None)


def _judge(d: EntryDir, kind: str, jc: Judging, lst: Listing | None) -> Judgement:
    if kind == CODE:
        return judge_code(d, jc, lst)
    if kind == AUTOTUNE:
        return judge_autotune(d, jc)
    if kind == TRITON:
        triton = _triton()
        return triton.judge(d, TRITON_KERNEL, triton.judging(jc.deep, caller_reads=jc.caller_reads))
    j = judge_guarded(d, jc, lst)
    if kind == GRAPH and not jc.deep and jc.graphs is not None:
        jc.graphs[d.path] = j
    return j


class Found(NamedTuple):
    kind: str
    path: str
    hash: str
    space: str | None


def candidates(root: str, ctx, flt: ScanFilter) -> Iterator[Found]:
    """Every directory that may be an entry of this layout, by its path shape alone (a code shard holding
    none of torch's files is dropped where it is judged: _entry), whose name starts with one of the
    reference's (`flt.name_prefixes()`), if it has any."""
    fits = {k.kind: [seg.fullmatch for seg in k.segments] for k in INDUCTOR.kinds}  # one C call per name
    prefixes = flt.name_prefixes()

    def named(name: str) -> bool:
        return not prefixes or name.startswith(prefixes)

    for name in ctx.subdirs(root):  # the root's real directories, from the listing kept while it is unchanged
        path = os.path.join(root, name)
        if name == "fxgraph":
            for shard in _graph_shards(ctx, path, prefixes):
                if fits[GRAPH][1](shard) and _may_hold(shard, prefixes):
                    where = f"{path}/{shard}"
                    yield from (Found(GRAPH, f"{where}/{k}", k, None) for k in ctx.subdirs(where)
                                if named(k) and fits[GRAPH][2](k))
        elif name == "aotautograd" and (not prefixes or any(p[:1] in ("", "a") for p in prefixes)):
            yield from (Found(AUTOGRAD, f"{path}/{k}", k, None) for k in ctx.subdirs(path)
                        if named(k) and fits[AUTOGRAD][1](k))
        elif name == "triton":
            for dev in ctx.subdirs(path):
                if fits[TRITON][1](dev):
                    yield from (Found(TRITON, f"{path}/{dev}/{k}", k, f"triton/{dev}")
                                for k in ctx.subdirs(f"{path}/{dev}", prefixes) if fits[TRITON][2](k))
        elif fits[AUTOTUNE][0](name):
            if named(name):
                yield Found(AUTOTUNE, path, name, None)
        elif fits[CODE][0](name) and named(name):
            yield Found(CODE, path, name, None)


def _graph_shards(ctx, fxgraph: str, prefixes: tuple[str, ...]) -> list[str]:
    """The shard directories of `fxgraph` that may hold a graph whose key starts with one of `prefixes`:
    the ones their keys name (shapes.py KindShape.derived), where every prefix tells its shard, else every
    one listed (links are not)."""
    named = [graph_shard(p) for p in prefixes]
    if not prefixes or None in named:
        return ctx.subdirs(fxgraph)
    return [s for s in sorted({s for s in named if s}) if fsread.is_real_dir(f"{fxgraph}/{s}")]


def _may_hold(shard: str, prefixes: tuple[str, ...]) -> bool:
    """Whether fxgraph/<shard>/ may hold a graph whose key starts with one of `prefixes` (any, when there
    are none): a key is `f` and 51 more, and its shard is its second and third characters (graph_relpath),
    so a lookup by prefix lists one shard, not a thousand."""
    return not prefixes or any(p[:1] in ("", "f") and shard.startswith(p[1:3]) for p in prefixes)


def _torch_shard(lst: Listing) -> bool:
    """A code shard directory is torch's when it holds a code cache file or a writer's temp file, or
    nothing (one that cannot be read is listed as unreadable: never removed)."""
    names = [*lst.files, *lst.links, *lst.others]
    return not lst.readable or not names or any(CODE_RE.match(n) or TMP_RE.match(n) for n in names)


def scan(ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]:
    """Every entry, judged through `ctx.map_entries` (a worker per core for big caches; the index answers
    an unchanged fx graph, code shard or nested Triton kernel from its record). Each job is plain data:
    (path, kind, hash, space, the ops and targets wanted): only a nested Triton kernel has an op and a
    target, read from its files in the worker, which drops one that is not wanted."""
    wanted = ScanFilter(ops=flt.ops, targets=flt.targets)
    found = [f for f in candidates(str(ctx.root), ctx, flt) if not flt.kinds or f.kind in flt.kinds]
    # What an entry of no op or target is wanted for (each filter asked once, not per entry: 10^4 of them)
    bare = flt.wants_space(None) and wanted.wants_op(None)
    plain = bare and wanted.wants_target(None)
    code = bare and (wanted.wants_target(None) or wanted.wants_target(CPU))
    spaces = {space: flt.wants_space(space) for space in {f.space for f in found if f.kind == TRITON}}
    jobs = [(f.path, f.kind, f.hash, f.space, wanted.ops, wanted.targets)
            for f in [f for f in found if f.kind == GRAPH] + [f for f in found if f.kind != GRAPH]  # graphs
            if (spaces[f.space] if f.kind == TRITON else code if f.kind == CODE else plain)]  # first: the memo
    yield from (e for e in ctx.map_entries(_entry, jobs, _unfiltered) if e is not None)


def _unfiltered(job: tuple) -> tuple[tuple, ScanFilter]:
    """A job without its op and target filter, and the filter: `ls --op X` (nested Triton kernels) and
    `--target cpu` (code shards too) are answered from the index's records of an unfiltered listing
    (catalog/index.py), the filter applied to each entry's op and target as _entry applies it."""
    path, kind, key, space, ops, targets = job
    return (path, kind, key, space, (), ()), ScanFilter(ops=ops, targets=targets)


def _entry(ctx, job: tuple) -> Entry | None:
    """The entry of one job (None: a nested Triton kernel whose op or target is not wanted, a two-letter
    directory that is not a code shard). The fx graphs judged so far (by path) are kept with the context:
    the aotautograd entries ask for their graphs' judgements again."""
    path, kind, key, space, ops, targets = job
    memo = getattr(ctx, "inductor_graphs", None)
    if memo is None:
        memo = {}
        ctx.inductor_graphs = memo
    recording = getattr(ctx, "recording", None)
    with ctx.open_entry(path) as d:
        if kind == TRITON:
            return _nested_triton(ctx, d, job)
        lst = listing(d) if kind in (GRAPH, AUTOGRAD, CODE) else None
        if kind == CODE and lst is not None and not _torch_shard(lst):
            return None  # a two-letter directory of someone else's
        # recording: an aotautograd entry's graphs are judged from the listings its key holds (_seen)
        jc = Judging(graphs={} if recording is not None else memo)
        judged = _judged_as(ctx) if recording is not None else {}
        seen = _seen(d, kind, lst, jc, judged) if recording is not None else None
        if recording is not None and seen is None:
            jc = Judging(graphs=memo)  # not stored: judged as a scan without the index judges it
        j = _judge(d, kind, jc, lst)  # after the key was taken
        if kind == GRAPH and seen is not None and lst is not None:
            judged[path] = (_identity(lst), j)
    if kind == CODE and j.status == CORRUPT:
        seen = None  # torch's lock on its broken kernel, which no stat shows, makes it building (_compiling)
    if recording is not None:
        recording[path] = seen
    target = code_target(lst) if kind == CODE and lst is not None else None
    if targets and target not in targets:
        return None  # a code shard of Python (or of C++) where the other was asked for
    usage = lst.usage(path, ctx.warn) if lst is not None else measure_tree(path, ctx.warn)
    return ctx.entry(path=path, usage=usage, layout=NAME, kind=kind, target=target, space=space, op=None,
                     hash=key, status=j.status, reason=j.reason)


def code_target(lst: Listing) -> str | None:
    """A code shard whose files are all C++ (sources, headers, objects and the host libraries built from
    them: `.cpp`, `.h`, `.o`, `.so`) is CPU code, "cpu"; one holding Python (a graph's wrapper, or a Triton
    kernel's source, for either device) or a GPU binary cannot tell from its names: None."""
    suffixes = {m.group(2).rpartition(".")[2] for n in lst.files if (m := CODE_RE.match(n))}
    return CPU if suffixes and suffixes <= CPU_SUFFIXES else None


def _nested_triton(ctx, d: EntryDir, job: tuple) -> Entry | None:
    """A nested Triton kernel's entry, made by the Triton layout's own scan from one listing of it (its
    judgement, op, target, sizes and index key), named as Inductor's; None when its op or target is not
    wanted."""
    path, kind, key, space, ops, targets = job
    e = _triton().nested_entry(ctx, d, path)
    if e is None:
        return None
    if ops or targets:
        wanted = ScanFilter(ops=ops, targets=targets)
        if not (wanted.wants_op(e.op) and wanted.wants_target(e.target)):
            return None
    return entry_with(e, layout=NAME, kind=kind, space=space, hash=key)


def _judged_as(ctx) -> dict[str, tuple[tuple | None, Judgement]]:
    """The fx graphs this context judged for the index, by path: the identity of the listing each was
    judged from (_identity) and its judgement."""
    judged = getattr(ctx, "inductor_judged", None)
    if judged is None:
        judged = ctx.inductor_judged = {}
    return judged


def _identity(lst: Listing) -> tuple | None:
    """What the index's key holds of a directory listed as `lst` (the directory's inode and times, each
    file's inode, size and times), or None where it holds more than files. Two listings of one identity
    are of the same files, unchanged: a judgement of either is the other's."""
    own = lst.own
    if own is None or lst.links or lst.others or not lst.readable:
        return None
    return (own.st_ino, own.st_mtime_ns, own.st_ctime_ns,
            *[(n, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) for n, st in lst.files.items()])


def _seen(d: EntryDir, kind: str, lst: Listing | None, jc: Judging, judged: dict) -> tuple | None:
    """What the index keys the entry's record with, taken before its judgement reads a byte: the stats
    of its files, and for an aotautograd entry those of the fx graphs it names (their directories and
    files, named relative to the entry: its verdict goes by them). None: not indexed (a link, a directory
    in it, a graph that cannot be read; nested Triton kernels and autotune tables)."""
    if kind not in (GRAPH, CODE, AUTOGRAD) or lst is None or lst.own is None or lst.links or lst.others:
        return None
    if kind == CODE and any(e.endswith("cpp") and e[:-3] + "so" not in exts for exts in code_groups(lst.files).values()
                            for e in exts):
        return None  # a kernel torch may compile (its lock, which no stat shows, makes the shard building)
    stats: list[tuple[str, os.stat_result]] = list(lst.files.items())
    if kind == AUTOGRAD:
        graphs = _graphs_seen(d, [n for n in lst.files if VARIANT_RE.match(n)], jc, judged)
        if graphs is None:
            return None
        stats += graphs
    return lst.own, stats


def _graphs_seen(d: EntryDir, variants: list[str], jc: Judging, judged: dict
                 ) -> list[tuple[str, os.stat_result]] | None:
    """The stats of the fx graphs an aotautograd entry's variants name, their names relative to the entry
    (`../../fxgraph/<xx>/<key>`, then each name in it), read through fds; None when one is not there or
    cannot be listed. Each graph is judged (as `jc`) into `jc.graphs`, from the listing its stats come
    from, after they were taken, as the entry's own verdict is: that verdict then judges none again. A
    graph this process judged as an entry from a listing of the same identity (`judged`, _judged_as) is
    not judged again: 2,500 aotautograd entries recorded judged 5,000 graphs twice (a fifth of a first
    listing's time)."""
    root = os.path.dirname(os.path.dirname(d.path))
    out: list[tuple[str, os.stat_result]] = []
    with EntryDir.open(os.path.join(root, "fxgraph"), d.anchor) as fx:
        for key in graph_keys(d, variants):
            rel = graph_relpath(key).split("/", 1)[1]
            with fx.sub(rel) as g:
                lst = listing(g)
                if not lst.readable or lst.own is None:
                    return None
                out.append((f"../../fxgraph/{rel}", lst.own))
                out += sorted((f"../../fxgraph/{rel}/{name}", st)
                              for name, st in (*lst.files.items(), *lst.links.items(), *lst.others.items()))
                before = judged.get(g.path)
                if before is not None and before[0] is not None and before[0] == _identity(lst):
                    verdict = before[1]
                else:
                    verdict = judge_guarded(g, jc, lst)
                jc.graphs[g.path] = verdict  # type: ignore[index]  # _entry's, a dict
    return out


def shape_problem(relpath: str, kind: str, names: frozenset[str] | None, root: Path | None = None) -> str | None:
    """None when `relpath` is exactly an entry of `kind` holding files torch writes; else why not."""
    k = INDUCTOR.kind(kind)
    if k is None or not k.fits(relpath):
        return f"{relpath!r} is not where an Inductor {kind} entry lives"
    if names is None:
        return None
    listed = sorted(names)
    if kind in (GRAPH, AUTOGRAD) and listed and not any(VARIANT_RE.match(n) or TMP_RE.match(n) for n in listed):
        return "it holds no graph torch wrote"  # (an empty one torch made and never filled is removable)
    if kind == CODE and not any(CODE_RE.match(n) or TMP_RE.match(n) for n in listed):
        return "it holds no code cache file"
    if kind == TRITON:
        return _triton().shape_problem(relpath.rsplit("/", 1)[-1], TRITON_KERNEL, names)
    return None


# ---- deep checks, logs, relocation ------------------------------------------------------------------

def describe(root: Path, entry: Entry) -> Details:
    if entry.kind == TRITON:
        t = _triton().describe(root, _as_triton(entry))
        return Details(entry, t.status, t.reason, t.problems, t.files, t.task_op, binaries=t.binaries, facts=t.facts)
    with EntryDir.open(entry.path, fsread.anchor(root)) as d:
        j = judge(d, entry.kind, Judging(deep=True))
        facts = _facts(d, entry, root)
    files = list_files(entry.path) if os.path.isdir(entry.path) else ()
    binaries = tuple(os.path.join(entry.path, f.name) for f in files if f.name.endswith(".so") and f.link is None)
    return Details(entry, j.status, j.reason, j.problems, files, binaries=binaries, facts=tuple(facts))


def _facts(d: EntryDir, entry: Entry, root: Path) -> list[tuple[str, str]]:
    lst = listing(d)
    facts: list[tuple[str, str]] = []
    if entry.kind in (GRAPH, AUTOGRAD):
        variants = [n for n in lst.files if VARIANT_RE.match(n)]
        bad = [n for n in variants if variant_problem(d, n, lst.files[n].st_size, True)]
        facts.append(("variants", f"{len(variants)} guard variant(s), {len(bad)} damaged"))
        if entry.kind == AUTOGRAD:
            for key in graph_keys(d, [n for n in variants if n not in bad]):
                there = os.path.isdir(os.path.join(root, graph_relpath(key)))
                facts.append(("fx graph", f"{key} ({'present' if there else 'missing'})"))
    elif entry.kind == CODE:
        groups = sorted(code_groups(lst.files).items())
        facts += [("code", f"{key}: {', '.join(sorted(exts))}") for key, exts in groups]
        cut = [key for key, exts in groups if any(e.endswith("cpp") and e[:-3] + "so" not in exts for e in exts)]
        if cut:
            facts.append(("interrupted kernels", f"{', '.join(cut)} (a .cpp with no .so: torch compiles each "
                          "again on its next use; the shard's other kernels still hit)"))
    temps = [n for n in lst.files if TMP_RE.match(n)]
    if temps:
        facts.append(("writer temp files", ", ".join(temps)))
    return facts


def no_log(entry: Entry) -> str:
    if entry.kind == TRITON:
        return _triton().no_log(entry)
    return ("TorchInductor keeps no compile log in its cache; run with TORCH_LOGS=output_code (or "
            "TORCH_COMPILE_DEBUG=1) to see the generated code and the compiler's commands")


def relocation_problem(entry: Entry) -> str | None:
    if entry.kind != TRITON:
        return None
    return _triton().relocation_problem(_as_triton(entry))


class InductorLayout(Layout):
    """TorchInductor: guarded fx graphs and aotautograd entries (which name the fx graphs they need), code
    cache shards, autotune tables and a nested Triton cache; no writer locks inside entries (torch writes
    every file through a temp file and a rename, and compiles a code shard's kernel under its lock in
    `locks/`: that shard is building)."""

    shape = INDUCTOR
    relocates = True  # its nested Triton kernels: Triton's group files
    provider_kinds = frozenset({GRAPH})
    fact_files = ()
    binary_kinds = frozenset({TRITON})
    mega_types = MEGA_TYPES
    packages = (PACKAGE,)
    env_switches = ENV_SWITCHES

    shape_problem = staticmethod(shape_problem)
    scan = staticmethod(scan)
    judge = staticmethod(judge)
    describe = staticmethod(describe)
    no_log = staticmethod(no_log)
    relocation_problem = staticmethod(relocation_problem)

    def runs_on(self, arch: str, gpus: Iterable[str]) -> bool:
        """Inductor's GPU code is its nested Triton kernels, which Triton looks up by the exact GPU: its rule."""
        return _triton().runs_on(arch, gpus)

    def uses(self, root: Path, entry: Entry) -> list[str]:
        if entry.kind != AUTOGRAD:
            return []
        variants = [n for n in listing(entry.path).files if VARIANT_RE.match(n)]
        return [graph_relpath(k) for k in graph_keys(entry.path, variants)
                if os.path.isdir(os.path.join(root, graph_relpath(k)))]

    def users(self, root: Path, providers: list[str]) -> dict[str, list[str]]:
        named: dict[str, list[str]] = {}
        for de in fsread.subdir_paths(os.path.join(root, "aotautograd")):
            variants = [n for n in listing(de).files if VARIANT_RE.match(n)]
            for key in graph_keys(de, variants):
                named.setdefault(os.path.normpath(os.path.join(root, graph_relpath(key))), []).append(de)
        return {p: sorted(named.get(os.path.normpath(p), [])) for p in providers}

    def users_break(self, kind: str) -> bool:
        return kind == GRAPH  # an aotautograd entry whose fx graph is gone is a miss

    def use_words(self, kind: str) -> tuple[str, str]:
        return "names", "named by"

    def nested(self, root: Path) -> list[tuple[str, Path]]:
        return [("triton", Path(d)) for d in fsread.subdir_paths(os.path.join(root, "triton"))]

    def records_paths(self, kind: str) -> bool:
        return kind == TRITON  # its nested Triton kernels' group files; torch's own files record none

    def relocate(self, staged: str, final: str, root: Path) -> None:
        if os.path.basename(os.path.dirname(os.path.dirname(final))) == "triton":
            _triton().relocate(staged, final, root)

    def facts(self, entry: Entry, small: Mapping[str, bytes], names: Iterable[str]) -> Facts:
        if entry.kind == TRITON:
            return _triton().facts(_as_triton(entry), small, names)
        return Facts("torch inductor", None, None)

    mega_place = staticmethod(mega_place)
    mega_artifacts = staticmethod(mega_artifacts)
    explain = staticmethod(explain)
    explain_mega = staticmethod(explain_mega)
    explain_record = staticmethod(explain_record)


LAYOUT = InductorLayout()
