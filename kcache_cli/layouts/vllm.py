"""vLLM's torch_compile_cache (read against vllm/compilation/backends.py and compiler_interface.py).

Root: `$VLLM_CACHE_ROOT/torch_compile_cache` (VLLM_CACHE_ROOT defaulting to `$XDG_CACHE_HOME/vllm`, else
`~/.cache/vllm`). vLLM hashes its config, the traced code and the compiler into a 10-hex directory name,
so every config or env change makes a new `<h10>/`; the unit kcache lists and removes is that whole
directory:

    <h10>/rank_<rank>_<dp rank>/<prefix>/vllm_compile_cache.py     the index
    <h10>/rank_<rank>_<dp rank>/<prefix>/artifact_compile_range_<s>_<e>_subgraph_<i>   an artifact
    <h10>/rank_<rank>_<dp rank>/<prefix>/cache_key_factors.json    what the hash is made of (newer vLLM)
    <h10>/rank_<rank>_<dp rank>/{inductor_cache,triton_cache}/     InductorAdaptor's nested caches
    torch_aot_compile/<sha256>/rank_<r>_<d>/model                   AOT-compiled models

The index is `pprint.pformat` of {(compile_range, graph_index, compiler name): handle}; vLLM reads it with
`ast.literal_eval` and loads each handle: for "inductor_standalone", `(key, absolute path)` of a torch
`CompiledArtifact` saved as one binary file (CRC32 then length-prefixed fields:
torch/utils/_appending_byte_serializer.py) or unpacked (an Inductor cache root); for "inductor",
`(fx graph key, code path)` found in the rank's inductor_cache/. Neither the index nor a binary artifact
is written atomically. A unit is complete when every index parses as a literal and every artifact it
names is there and whole; partial otherwise (vLLM compiles again, or fails at start-up until it does).
The handles hold absolute paths: a unit moved elsewhere is relocated by rewriting them (import, verify
--fix)."""

from __future__ import annotations

import ast
import os
import re
import stat
import zlib
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping, NamedTuple

from kcache_cli import layouts
from kcache_cli.fs import read as fsread
from kcache_cli.fs import write as fswrite
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.layouts._common import walk_tree
from kcache_cli.layouts.base import (
    MISS,
    STALE_AFTER,
    UNKNOWN,
    Facts,
    Here,
    Judging,
    Layout,
    ScanContext,
    Verdict,
    not_installed,
    unasked,
)
from kcache_cli.layouts.image_format import ImageFormat
from kcache_cli.layouts.shapes import INDUCTOR, TRITON, TRITON_TMP, VLLM, inductor_graph_relpath, top_dirs
from kcache_cli.layouts.vllm_image import VllmImage
from kcache_cli.model.checks import list_files
from kcache_cli.model.records import (
    BUILDING,
    COMPLETE,
    MOVED,
    PARTIAL,
    UNREADABLE,
    UNREADABLE_REASON,
    Details,
    Entry,
    Judgement,
    ScanFilter,
    Status,
)
from kcache_cli.util.lazy import lazy_module

if TYPE_CHECKING:  # the real import, for mypy; only `verify --fix` and import write an index
    import pprint
else:
    pprint = lazy_module("pprint")

NAME = VLLM.name
COMPILE, AOT = "compile", "aot"
INDEX, FACTORS = "vllm_compile_cache.py", "cache_key_factors.json"
RANK_RE = re.compile(r"^rank_\d+_\d+$")
NESTED = ("inductor_cache", "triton_cache")  # InductorAdaptor's TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR
MAX_INDEX = 4 << 20  # real indexes are a few kB; literal_eval of more is not worth its memory
STANDALONE, ADAPTOR = "inductor_standalone", "inductor"
GRAPH, AUTOGRAD = INDUCTOR.kinds[0].kind, INDUCTOR.kinds[1].kind  # the nested Inductor caches' kinds


def _inductor() -> Layout:
    """The Inductor layout, whose rules judge the Inductor caches a unit holds: found through the registry,
    as every other layout would be (no layout imports another)."""
    return layouts.get(INDUCTOR.name)


class Handle(NamedTuple):
    compiler: str
    key: str
    path: str


class Part(NamedTuple):
    """One `rank_<r>_<d>/<prefix>/` directory holding an index (prefix may be empty)."""

    rank: str  # rank_<r>_<d>
    path: str
    rel: str  # its path relative to the unit: rank_<r>_<d>[/<prefix>]
    handles: tuple[Handle, ...]
    problem: str | None  # why the index cannot be used, or None


# ---- the index ----------------------------------------------------------------------------------------

def read_index(d: EntryDir, name: str) -> tuple[tuple[Handle, ...], str | None]:
    """The handles of the index `name` in `d`, and why vLLM cannot use it (None when it can)."""
    try:
        data = d.read_bytes(name, MAX_INDEX)
    except fsread.TooLarge:
        return (), f"{INDEX} is over {MAX_INDEX} bytes: not vLLM's"
    except OSError as exc:
        return (), f"{INDEX} cannot be read: {exc.strerror or exc}"
    try:
        value = ast.literal_eval(data.decode("utf-8"))
    except (ValueError, SyntaxError, TypeError, UnicodeDecodeError, RecursionError, MemoryError):
        return (), f"{INDEX} does not parse as a literal (vLLM fails reading it at start-up)"
    if not isinstance(value, dict):
        return (), f"{INDEX} is not a dict"
    handles = []
    for key, handle in value.items():
        if not (isinstance(key, tuple) and len(key) == 3 and isinstance(key[2], str)):
            return (), f"{INDEX} has a key that is not (range, graph index, compiler)"
        if not (isinstance(handle, tuple) and len(handle) == 2 and all(isinstance(h, str) for h in handle)):
            return (), f"{INDEX} has a handle that is not (key, path)"
        handles.append(Handle(key[2], handle[0], handle[1]))
    return tuple(handles), None


def _mode(d: EntryDir, name: str) -> int:
    """The lstat mode of `name` in `d` (a link is not followed), 0 when it is not there."""
    try:
        return d.lstat(name).st_mode
    except OSError:
        return 0


def parts(unit: EntryDir | str) -> list[Part]:
    """Every index of a unit, read (through its EntryDir; a path is opened first, no link followed)."""
    if isinstance(unit, str):
        with EntryDir.open(unit) as d:
            return parts(d)
    out = []
    for rank in unit.subdirs():
        if not RANK_RE.match(rank):
            continue
        with unit.sub(rank) as rd:
            for sub in ["", *(n for n in rd.subdirs() if n not in NESTED)]:
                name = f"{sub}/{INDEX}" if sub else INDEX
                if _mode(rd, name):
                    handles, problem = read_index(rd, name)
                    out.append(Part(rank, rd.join(sub), f"{rank}/{sub}" if sub else rank, handles, problem))
    return out


# ---- artifacts -------------------------------------------------------------------------------------

def binary_problem(d: EntryDir, name: str, deep: bool) -> str | None:
    """Why a binary CompiledArtifact is not whole by its own framing: a CRC32 of the rest (deep), then
    fields of an 8-byte big-endian length and that many bytes, ending exactly at the end of the file."""
    shown = name.rpartition("/")[2]
    try:
        fd, st = d.open_file(name)
    except OSError as exc:
        return f"{shown} cannot be read: {exc.strerror or exc}"
    try:
        size, offset, fields = st.st_size, 4, 0
        while offset < size:
            raw = os.pread(fd, 8, offset)
            if len(raw) < 8:
                break
            offset += 8 + int.from_bytes(raw, "big")
            fields += 1
        if size < 4 or offset != size or fields < 3:
            return f"{shown} is truncated or not a torch CompiledArtifact (its fields do not end at its end)"
        if deep and _crc(fd, size).to_bytes(4, "big") != os.pread(fd, 4, 0):
            return f"{shown}'s checksum does not match its bytes (torch refuses to load it)"
    finally:
        fsread.close_read(fd)
    return None


def _crc(fd: int, size: int) -> int:
    crc, offset = 0, 4
    while offset < size:
        chunk = os.pread(fd, min(fsread.CHUNK, size - offset), offset)
        if not chunk:
            break
        crc, offset = zlib.crc32(chunk, crc), offset + len(chunk)
    return crc


def unpacked_problem(d: EntryDir, jc: Judging) -> str | None:
    """Why an unpacked artifact (an Inductor cache root with one aotautograd entry, held as `d`) does not
    load. Its entries are judged by the Inductor layout, each opened beneath `d`."""
    name = os.path.basename(d.path)
    for top in ("aotautograd", "fxgraph"):
        if stat.S_ISLNK(_mode(d, top)):
            return f"{name}/{top} is a symlink (kcache never follows it)"
    keys = d.subdirs("aotautograd")
    if len(keys) != 1:
        return f"{name}/aotautograd/ holds {len(keys)} entries; torch loads exactly one"
    inductor = _inductor()
    ijc = replace(inductor.judging(jc.deep, caller_reads=jc.caller_reads), graphs={})
    entries = [(AUTOGRAD, f"aotautograd/{keys[0]}"), *((GRAPH, g) for g in _graphs(d))]
    judged = {}
    for kind, rel in entries[1:] + entries[:1]:  # the graphs first: the aotautograd entry asks for those it names
        with d.sub(rel) as where:
            judged[rel] = inductor.judge(where, kind, ijc)
    for _, rel in entries:
        if judged[rel].status != COMPLETE:
            return f"{name}: {rel} is {judged[rel].status} ({judged[rel].reason})"
    return None


def _graphs(d: EntryDir) -> list[str]:
    """The fx graph directories of the Inductor cache root `d`, relative to it."""
    return [f"fxgraph/{shard}/{g}" for shard in d.subdirs("fxgraph") for g in d.subdirs(f"fxgraph/{shard}")]


def handle_problem(d: EntryDir, part: Part, h: Handle, jc: Judging) -> str | None:
    """Why the artifact a handle names is not there whole in the unit held as `d`, or None."""
    rel = part.rel
    if h.compiler == STANDALONE:
        if not plain(h.key):
            return f"{INDEX} names {h.key!r}, not a file name"
        where = f"{rel}/{h.key}"
        mode = _mode(d, where)
        if stat.S_ISLNK(mode):
            return f"{h.key} is a symlink (kcache never follows it)"
        if stat.S_ISDIR(mode):
            with d.sub(where) as ud:
                return unpacked_problem(ud, jc)
        if stat.S_ISREG(mode):
            return binary_problem(d, where, jc.deep)
        return f"{h.key} is missing ({INDEX} names it): vLLM fails loading it"
    if h.compiler == ADAPTOR:
        graph = f"{part.rank}/inductor_cache/{inductor_graph_relpath(h.key)}"
        if not re.fullmatch("f" + "[a-z2-7]{51}", h.key) or not stat.S_ISDIR(_mode(d, graph)):
            return f"the fx graph {h.key} it names is not in {part.rank}/inductor_cache/"
        inductor = _inductor()
        with d.sub(graph) as gd:
            j = inductor.judge(gd, GRAPH, inductor.judging(jc.deep, caller_reads=jc.caller_reads))
        return None if j.status == COMPLETE else f"the fx graph {h.key} is {j.status} ({j.reason})"
    return None  # eager: nothing compiled to keep


def plain(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..") and "\0" not in name


# ---- judging ---------------------------------------------------------------------------------------

def newest(d: EntryDir) -> float:
    """measure_tree's newest mtime of the unit held as `d` (its directories' own included), read through
    its fd and subdirectories opened beneath it (or from the walk of it that `d` shares); 0 when it cannot
    be read."""
    if d.fd is None:
        return 0.0
    top = os.fstat(d.fd).st_mtime
    if d.walk is not None and not d.at:  # the walk of the unit it shares holds every time already
        return max([top, *(st.st_mtime for listed in d.walk.dirs.values() for st in listed.values())])
    stack = [(d, 0)]
    while stack:
        where, depth = stack.pop()
        try:
            with os.scandir(where.fd) as it:  # where.fd: d's own, or one a sub() below opened
                for de in it:
                    try:
                        top = max(top, de.stat(follow_symlinks=False).st_mtime)
                        if de.is_dir(follow_symlinks=False) and depth < fsread.MAX_TREE_DEPTH:
                            sub = where.sub(de.name)
                            if sub.fd is not None:
                                stack.append((sub, depth + 1))
                    except OSError:
                        continue
        except OSError:
            pass
        finally:
            if where is not d:
                where.close()
    return top


def judge_unit(d: EntryDir, jc: Judging, outside: list[bool] | None = None) -> Judgement:
    """What vLLM makes of the unit held as `d` (`outside`: see leads_nowhere)."""
    try:
        if d.fd is None:
            raise d.error or FileNotFoundError(d.path)
        st = os.fstat(d.fd)
        if d.walked() is None:  # else listed by the walk it shares
            os.listdir(d.fd)
    except OSError:
        return Judgement.of(UNREADABLE, UNREADABLE_REASON)
    found = parts(d)
    if not found:
        what = "no vllm_compile_cache.py in any rank_<r>_<d>/: vLLM compiles everything again"
        if jc.now - newest(d) < STALE_AFTER or jc.now - st.st_mtime < STALE_AFTER:
            return Judgement.of(BUILDING, what.split(":")[0] + " yet: vLLM may be compiling into it")
        return Judgement.of(PARTIAL, what)
    problems, lost = [], []
    for part in found:
        if part.problem:
            problems.append(f"{part.rel}/{part.problem}")
            continue
        for h in part.handles:
            bad = handle_problem(d, part, h, jc)
            if bad:
                problems.append(f"{part.rel}: {bad}")
            else:
                there = leads_nowhere(part, h, outside, stat.S_ISDIR(_mode(d, f"{part.rel}/{h.key}")))
                if there:
                    lost.append(_named(f"{part.rel}/{INDEX}", h, there))
    if problems:  # the tree's age is asked only now: a complete unit needs no second walk
        fresh = jc.now - newest(d) < STALE_AFTER
        status: Status = BUILDING if fresh else PARTIAL  # vLLM writes the index and binaries in place
        return Judgement(status, problems[0] + ("" if status == PARTIAL else " (written less than an hour ago)"),
                         tuple(problems))
    if lost:  # whole here, named where no such artifact is: vLLM's load of that path fails at start-up
        return Judgement.of(MOVED, _moved(lost[0]))
    return Judgement(COMPLETE)


def leads_nowhere(part: Part, h: Handle, outside: list[bool] | None = None, unpacked: bool | None = None
                  ) -> str | None:
    """What lies where a standalone handle names a path other than its artifact here (the unit was moved
    or copied), when vLLM's load of that path (CompiledArtifact.load) fails: "nothing", or what is there
    instead of a file of the artifact's kind (`unpacked`: a directory; else one regular file; looked up
    by path when not given): a FIFO blocks vLLM's open, a device feeds it what it yields. None when the
    handle names the artifact here, or a path elsewhere that vLLM loads (a copy whose original is still
    there hits; `verify` reports it). `outside` gets True when the path is elsewhere: the verdict then
    depends on a file outside the unit (the scan index stores none such)."""
    here = os.path.join(part.path, h.key)
    if h.compiler != STANDALONE or h.path == here:
        return None
    if outside is not None:
        outside.append(True)
    if unpacked is None:
        unpacked = os.path.isdir(here) and not os.path.islink(here)
    try:
        mode = os.stat(h.path).st_mode  # followed, as vLLM's open follows it
    except (OSError, ValueError):
        return "nothing"
    if stat.S_ISDIR(mode) if unpacked else stat.S_ISREG(mode):
        return None
    return "a regular file" if stat.S_ISREG(mode) else fsread.kind_of(mode)


def _named(index: str, h: Handle, there: str) -> str:
    """Where `index` sends vLLM for `h`, and what is there when it is not nothing (leads_nowhere)."""
    return f"{index} names {h.path}" + ("" if there == "nothing" else f", {there}")


def judge_aot(d: EntryDir) -> Judgement:
    ranks = [r for r in d.subdirs() if RANK_RE.match(r)]
    if not ranks:
        return Judgement.of(PARTIAL, "no rank_<r>_<d>/ in it: vLLM compiles again")
    for r in ranks:
        try:
            st = d.lstat(f"{r}/model")
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return Judgement.of(PARTIAL, f"{r}/model is missing or empty: vLLM compiles again")
    return Judgement(COMPLETE)


def judge(d: EntryDir, kind: str, jc: Judging) -> Judgement:
    return judge_aot(d) if kind == AOT else judge_unit(d, jc)


def detect(root: Path) -> bool:
    """<h10>/ directories with a rank_<r>_<d>/ inside, or torch_aot_compile/."""
    try:
        tops = top_dirs(root, links=False)
    except OSError:
        return False
    for name in tops[:64]:
        if name == "torch_aot_compile" or (
                VLLM.kinds[0].match_segment(0, name) is not None
                and any(RANK_RE.match(os.path.basename(d)) for d in fsread.subdir_paths(os.path.join(root, name)))):
            return True
    return False


def scan(ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]:
    """Every unit, judged through `ctx.map_entries` (a worker per core for big caches). A job is plain data
    (path, kind): the index answers an unchanged unit from its record, keyed by the lstat of every name in
    the unit's tree (a unit whose index names paths elsewhere is judged again each time: its verdict goes
    by whether they lead to a file)."""
    if flt.targets or flt.spaces or flt.ops:
        return  # vLLM's units have no target, space or op names
    prefixes = flt.name_prefixes()
    aot = os.path.join(ctx.root, "torch_aot_compile")
    found = [(os.path.join(ctx.root, n), COMPILE) for n in ctx.subdirs(ctx.root)
             if VLLM.kinds[0].match_segment(0, n) is not None]
    found += [(os.path.join(aot, n), AOT) for n in ctx.subdirs(aot) if VLLM.kinds[1].match_segment(1, n) is not None]
    jobs = [job for job in found if not prefixes or os.path.basename(job[0]).startswith(prefixes)]
    yield from ctx.map_entries(_unit_entry, jobs)


def _unit_entry(ctx, job: tuple[str, str]) -> Entry:
    path, kind = job
    with ctx.open_entry(path) as d:
        recording = getattr(ctx, "recording", None)
        try:  # its usage and, to be recorded, the key (the whole tree's stats, before the judgement reads)
            usage, key = walk_tree(d, ctx.warn, recording is not None)
        except OSError:  # not there, or cannot be listed: read_dir says so (or not: gone)
            _names, usage, _mtimes = ctx.read_dir(d)
            key = None
        if recording is not None:
            recording[path] = key
        outside: list[bool] = []
        j = judge_aot(d) if kind == AOT else judge_unit(d, Judging(), outside)
        if outside and recording is not None:  # a handle names a path elsewhere: not in the key, not stored
            recording[path] = None
    return ctx.entry(path=path, usage=usage, layout=NAME, kind=kind, target=None, space=None, op=None,
                     hash=os.path.basename(path), status=j.status, reason=j.reason)


def shape_problem(relpath: str, kind: str, names: frozenset[str] | None, root: Path | None = None) -> str | None:
    k = VLLM.kind(kind)
    if k is None or not k.fits(relpath):
        return f"{relpath!r} is not where a vLLM {kind} entry lives"
    if names is not None and names and not any(RANK_RE.match(n) for n in names):
        return "it holds no rank_<r>_<d>/ directory vLLM writes"
    return None


# ---- what a unit says about itself ---------------------------------------------------------------------

def key_factors(unit: str) -> dict[str, object]:
    """cache_key_factors.json of the unit (its own, else the first part's), flattened to dotted keys."""
    for where in [unit, *(p.path for p in parts(unit))]:
        data = fsread.json_object(os.path.join(where, FACTORS))
        if data is not None:
            return flatten(data)
    return {}


def flatten(data: object, prefix: str = "") -> dict[str, object]:
    if isinstance(data, dict) and data:
        out: dict[str, object] = {}
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: data} if prefix else {}


def describe(root: Path, entry: Entry) -> Details:
    with EntryDir.open(entry.path, fsread.anchor(root)) as d:
        j = judge(d, entry.kind, Judging(deep=True))
    facts: list[tuple[str, str]] = []
    if entry.kind == COMPILE:
        for part in parts(entry.path):
            kinds = sorted({h.compiler for h in part.handles})
            facts.append((f"index {part.rel}", f"{len(part.handles)} artifact(s), {', '.join(kinds) or '-'}"
                          + (f"; {part.problem}" if part.problem else "")))
        facts.extend((f"key factor {k}", str(v)) for k, v in sorted(key_factors(entry.path).items()))
        moved = relocation_problem(entry)
        if moved:
            facts.append(("paths", moved))
        for layout, where in nested_in(entry.path):
            facts.append((f"nested {layout} cache", where))
    return Details(entry, j.status, j.reason, j.problems, list_files(entry.path), facts=tuple(facts))


def no_log(entry: Entry) -> str:
    return "vLLM keeps no compile log in its cache; run with VLLM_LOGGING_LEVEL=DEBUG to see its compiles"


def nested_in(unit: str) -> list[tuple[str, str]]:
    """The Inductor and Triton caches InductorAdaptor keeps inside a unit."""
    out = []
    for rank in fsread.subdir_paths(unit):
        for name, layout in zip(NESTED, (INDUCTOR.name, TRITON.name)):
            if os.path.isdir(os.path.join(rank, name)):
                out.append((layout, os.path.join(rank, name)))
    return out


# ---- will vLLM here use it (kcache explain) -------------------------------------------------------------
# The <h10> name hashes vLLM's config, the traced code and the compiler (torch's version among it), and the
# env switches vLLM lists (cache_key_factors.json records them where vLLM is new enough to write it).

PACKAGE = "vllm"


def _same_env(recorded: object, here: str) -> bool:
    if isinstance(recorded, bool):
        return here.strip().lower() in (("1", "true", "yes", "on") if recorded else ("0", "false", "no", "off", ""))
    return str(recorded) == here


def explain(root: Path, entry: Entry, here: Here) -> Verdict:
    """A miss when vLLM is absent here, the unit is incomplete, or a switch it records is set otherwise
    here; else unknown: the config, code and compiler hashes are vLLM's own to compute."""
    if (not_asked := unasked(here)) is not None:
        return not_asked
    if here.versions.get(PACKAGE) is None:
        return not_installed("vLLM", PACKAGE)
    if entry.status != COMPLETE:
        return Verdict(MISS, f"vLLM does not use a {entry.status} unit: {entry.reason}", "status", entry.status,
                       COMPLETE)
    factors = key_factors(entry.path) if entry.kind == COMPILE else {}
    for k, v in sorted(factors.items()):
        name = k.split(".", 1)[1] if k.startswith("env.") else None
        if name and name in here.env and not _same_env(v, here.env[name]):
            return Verdict(MISS, f"vLLM hashes {name} into the unit's name", name, str(v), here.env[name])
    known = "records its key factors" if factors else "records no key factors (cache_key_factors.json)"
    return Verdict(UNKNOWN, f"the unit {known}; its config, code and compiler hashes are vLLM "
                   f"{here.versions[PACKAGE]}'s own to compute")


# ---- relocation -----------------------------------------------------------------------------------------

def moved_handles(part: Part, dest_part: str) -> list[Handle]:
    return [h for h in part.handles if h.compiler == STANDALONE and plain(h.key)
            and h.path != os.path.join(dest_part, h.key)]


def _moved(where: str) -> str:
    """The reason of a moved unit (`where`: the index and the path it names), as verify's relocation
    problem gives it too."""
    return f"{where} (the cache was moved or copied): vLLM fails loading it until `kcache verify --fix` rewrites " \
           "the paths"


def relocation_problem(entry: Entry) -> str | None:
    """Why vLLM fails loading the unit where it now lies, or would once the copy its index names is gone:
    what `verify --fix` repairs."""
    if entry.kind != COMPILE or entry.status not in (COMPLETE, MOVED):
        return None
    for part in parts(entry.path):
        moved = moved_handles(part, part.path)
        if moved:
            index = f"{os.path.relpath(part.path, entry.path)}/{INDEX}"
            there = leads_nowhere(part, moved[0])
            if there:
                return _moved(_named(index, moved[0], there))
            return f"{index} names {moved[0].path} (the cache was moved or copied): vLLM loads that file while " \
                   "it is there, and fails once it is gone, until `kcache verify --fix` rewrites the paths"
    return None


def relocate(staged: str, final: str) -> int:
    """Rewrite every index of the unit `staged` so that each standalone handle's path names the artifact
    under `final` (where the unit is or will be published), in vLLM's own format (pprint, indent 4).
    Each index is replaced atomically through a directory fd opened beneath `staged` without following
    a link. Returns how many indexes changed."""
    changed = 0
    for part in parts(staged):
        if part.problem:
            continue
        rel = os.path.relpath(part.path, staged)
        dest = os.path.normpath(os.path.join(final, rel))
        if not moved_handles(part, dest):
            continue
        value = ast.literal_eval(fsread.read_bytes(os.path.join(part.path, INDEX), MAX_INDEX).decode())
        fixed = {k: (v[0], os.path.join(dest, v[0])) if k[2] == STANDALONE and plain(v[0]) else v
                 for k, v in value.items()}
        dfd = fsread.open_dir_beneath(staged, rel)
        try:
            fswrite.replace_file_via_dir(dfd, INDEX, pprint.PrettyPrinter(indent=4).pformat(fixed).encode(), TRITON_TMP)
        finally:
            os.close(dfd)
        changed += 1
    return changed


class VllmLayout(Layout):
    """vLLM: whole <h10>/ units (their indexes name artifacts by absolute path, rewritten on import)."""

    shape = VLLM
    relocates = True  # the handles' absolute paths
    fact_files = ()
    packages = (PACKAGE,)
    env_switches = ("VLLM_*",)

    detect = staticmethod(detect)
    shape_problem = staticmethod(shape_problem)
    scan = staticmethod(scan)
    judge = staticmethod(judge)
    describe = staticmethod(describe)
    no_log = staticmethod(no_log)
    relocation_problem = staticmethod(relocation_problem)

    def image_format(self) -> ImageFormat:
        """MCV's compat image of vLLM's cache (vllm_image.py)."""
        return VllmImage()

    def relocate(self, staged: str, final: str, root: Path) -> None:
        if os.path.basename(os.path.dirname(final)) != "torch_aot_compile":
            relocate(staged, final)

    def nested(self, root: Path) -> list[tuple[str, Path]]:
        return [(layout, Path(p)) for d in fsread.subdir_paths(str(root)) for layout, p in nested_in(d)]

    def facts(self, entry: Entry, small: Mapping[str, bytes], names: Iterable[str]) -> Facts:
        factors = key_factors(entry.path) if entry.kind == COMPILE else {}
        compiler = factors.get("compiler_hash")
        return Facts(f"vllm (compiler hash {compiler})" if compiler else "vllm", None, None)

    explain = staticmethod(explain)


LAYOUT = VllmLayout()
