"""`kcache build`: compile a task's source into the hashed tree, atomically.

A task is hidet's task.txt plus its source.cu/source.cc. Its entry is
`<root>/ops/<target>_space_<n>/<op>/<sha256(task.txt)[:16]>/`. A build takes the entry's lock
(`.kcache/locks/`, outside the entry), checks again, compiles in `<op dir>/.kcache-tmp-<hash>-<rand>/`
and publishes with one rename, so a reader sees either no entry or a complete one, and a killed
build leaves only a temp directory (`ls --status partial`, removed by `prune`).

The hit path (a complete entry exists) is kept cheap: no filelock, subprocess or layout imports
unless they are needed, and the records are immutable NamedTuples rather than frozen dataclasses
(a frozen dataclass costs about 1 ms to create at import; these are a quarter of that).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Final, Iterable, Iterator, NamedTuple, Protocol, Sequence

from kcache_cli import __version__
from kcache_cli.formats.binary import read_binary
from kcache_cli.formats.gpu import ARCH_RE
from kcache_cli.formats.gpu import local_gpu_arch as first_gpu_arch
from kcache_cli.formats.taskfile import parse_task, read_task_file, task_hash
from kcache_cli.fs import delete as fsdelete
from kcache_cli.fs import read as fsread
from kcache_cli.fs import state
from kcache_cli.fs import write as fswrite
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.fs.locking import EntryFlock
from kcache_cli.fs.read import json_object, open_regular, parse_json
from kcache_cli.layouts import builder
from kcache_cli.layouts.shapes import BUILD_SHAPE
from kcache_cli.model import checks
from kcache_cli.model.records import Judgement
from kcache_cli.model.terms import COMPLETE, CORRUPT
from kcache_cli.util.errors import KcacheError, LockTimeout, UsageError
from kcache_cli.util.lazy import lazy_module
from kcache_cli.util.interrupts import TermAsInterrupt

if TYPE_CHECKING:
    from kcache_cli.model.terms import BuildOutcome, Status
    from kcache_cli.util import suggest
else:
    suggest = lazy_module("kcache_cli.util.suggest")  # an error's hint only

BUILT: Final = "built"
HIT: Final = "hit"
FAILED: Final = "failed"
TARGETS = ("cuda", "cpu")
SPACE_LEVELS = (0, 1, 2)  # hidet's search-space levels: ops/<target>_space_<level>/
TARGET_OF_SUFFIX = {".cu": "cuda", ".cc": "cpu", ".cpp": "cpu", ".cxx": "cpu"}
SOURCE_NAME = {"cuda": "source.cu", "cpu": "source.cc"}
SOURCE_CANDIDATES = ("source.cu", "source.cc", "source.cpp")
TASK = "task.txt"
BINARY = "lib.so"
LOG = "nvcc_log.txt"
MANIFEST = "kcache.json"
# Flags that would make the recorded arch a lie: the arch is given with --arch only.
ARCH_FLAGS = ("-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code", "--gpu-code")
COMPILER_MEMO = "compilers.json"  # in .kcache/: nvcc's default arch, per nvcc binary


class BuildError(KcacheError):
    """A task that cannot be built as given (missing file, no name, unknown suffix...)."""


class CompilerNotFound(KcacheError):
    pass


class ArchMismatch(KcacheError):
    """A complete entry exists, built for another arch than the one requested."""


class BuildOptions(NamedTuple):
    """How to build: every field has the default the CLI has."""

    space: int = 0
    target: str | None = None  # default: from the source's suffix
    arch: str | None = None  # default: the local GPU's (nvidia-smi), else nvcc's own default
    nvcc: str | None = None  # default: KCACHE_NVCC, then PATH
    cxx: str | None = None  # default: CXX, then g++ on PATH
    include_dirs: tuple[str, ...] = ()
    extra_flags: tuple[str, ...] = ()
    force: bool = False
    timeout: float | None = None  # seconds to wait for another build's lock; None: for ever


class TaskSpec(NamedTuple):
    """A task resolved against the options: where its entry lives and what to compile."""

    task_path: str
    task_bytes: bytes
    op: str
    hash: str
    source_path: str
    target: str
    space: str  # cuda_space_0
    relpath: str  # ops/cuda_space_0/<op>/<hash>


class BuildResult(NamedTuple):
    """What one task came to: built, hit or failed, and where its entry is."""

    task: str  # the task file as given
    status: BuildOutcome
    op: str | None = None
    hash: str | None = None
    target: str | None = None
    space: str | None = None
    relpath: str | None = None
    path: str | None = None  # absolute path of the entry (also for failures, where it would be)
    arch: str | None = None
    arch_source: str | None = None  # built: --arch, nvidia-smi, nvcc default, host; hit: kcache.json, lib.so
    elapsed: float | None = None  # compiler seconds (built, failed compiles)
    command: str | None = None  # shell-quoted compile command
    output: str | None = None  # compiler output
    error: str | None = None  # one line, for failures
    exit_code: int = 0  # the error's exit code (3: lock timeout)
    replaced: str | None = None  # why an existing entry at the path was replaced
    waited: bool = False  # another build held the lock
    notes: tuple[str, ...] = ()  # things worth telling people (source differs, arch unknown...)
    # built or hit: the installed compiler that compiles the entry again in place rather than loading it
    # ("hidet 0.6.1": hidet 0.6 and later with an entry kcache build made), else None
    recompiled_by: str | None = None

    def to_json(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self._asdict().items()}


class Listener(Protocol):
    """What a caller (the CLI's progress bar) hears of builds; called in the building threads."""

    def waiting(self, spec: TaskSpec, holder: str) -> None: ...

    def compiling(self, spec: TaskSpec) -> None: ...

    def done(self, result: BuildResult) -> None: ...


class BuildListener:
    """A Listener that ignores everything."""

    def waiting(self, spec: TaskSpec, holder: str) -> None:
        pass

    def compiling(self, spec: TaskSpec) -> None:
        pass

    def done(self, result: BuildResult) -> None:
        pass


# ---- tasks ---------------------------------------------------------------------------------------

def find_tasks(paths: Iterable[str | os.PathLike]) -> list[str]:
    """Task files from the command line: a task.txt, a task directory, or a directory of them."""
    out: list[str] = []
    for p in paths:
        p = os.fspath(p)
        if not os.path.isdir(p):
            out.append(p)  # a file, or missing: load_task says what is wrong with it
            continue
        if os.path.isfile(os.path.join(p, TASK)):
            out.append(os.path.join(p, TASK))
            continue
        found = []
        for dirpath, dirnames, filenames in os.walk(p):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            if TASK in filenames and dirpath != p:
                found.append(os.path.join(dirpath, TASK))
                dirnames[:] = []  # a task directory's subdirectories are not tasks
        if not found:
            raise UsageError(f"no {TASK} in {p} or in the directories under it")
        out.extend(found)
    seen: set[str] = set()
    unique = []
    for t in out:
        key = os.path.realpath(t)
        if key not in seen:
            seen.add(key)
            unique.append(t)
    return unique


def load_task(task_path: str | os.PathLike, options: BuildOptions = BuildOptions(),
              source: str | os.PathLike | None = None) -> TaskSpec:
    """Read a task file and find its source; every problem is a one-line BuildError."""
    task_path = os.fspath(task_path)
    if os.path.isdir(task_path):
        task_path = os.path.join(task_path, TASK)
    try:
        data = read_task_file(task_path)  # bounded, and never a FIFO or device (fsread)
    except FileNotFoundError:
        raise BuildError(f"task file not found: {task_path}") from None
    except OSError as exc:
        raise BuildError(f"cannot read task file {task_path}: {exc.strerror}") from None
    op = parse_task(data, task_path).name
    if op.startswith("."):  # '..' would climb out of the space directory; dot-names are not entries
        raise BuildError(f"{task_path}: op name '{op}' is not a usable directory name")
    if options.target is not None and options.target not in TARGETS:
        raise suggest.unknown_choice("target", options.target, TARGETS)
    src = _find_source(task_path, options.target, source)
    target = options.target
    if target is None:
        target = TARGET_OF_SUFFIX.get(os.path.splitext(src)[1].lower())
        if target is None:
            raise BuildError(f"cannot tell the target of {src} from its suffix (.cu: cuda, .cc/.cpp: cpu); "
                             "pass --target")
    if not isinstance(options.space, int) or options.space < 0:
        raise UsageError(f"bad space level {options.space!r} (0, 1 or 2)")
    h = task_hash(data)
    shape = _entry_shape()
    fields = {"target": target, "level": str(options.space), "op": op, "hash": h}
    return TaskSpec(task_path, data, op, h, src, target, shape.space_of(fields) or "", shape.relpath(**fields))


def _find_source(task_path: str, target: str | None, source) -> str:
    if source is not None:
        src = os.fspath(source)
        if not os.path.isfile(src):
            raise BuildError(f"source file not found: {src}")
        return src
    here = os.path.dirname(task_path) or "."
    found = [os.path.join(here, n) for n in SOURCE_CANDIDATES if os.path.isfile(os.path.join(here, n))]
    if target is not None and len(found) > 1:
        found = [s for s in found if TARGET_OF_SUFFIX[os.path.splitext(s)[1]] == target] or found
    if not found:
        raise BuildError(f"no source.cu or source.cc next to {task_path} (pass --source)")
    if len(found) > 1:
        raise BuildError(f"both {' and '.join(os.path.basename(s) for s in found)} next to {task_path}: "
                         "pass --source or --target")
    return found[0]


# ---- compilers and arch --------------------------------------------------------------------------

_memo_lock = threading.Lock()
_memo: dict[str, dict] = {}  # per process: compiler key -> {"default_arch"} or {"version"}
_asked: set[str] = set()  # compilers whose default arch this process asked itself


def find_compiler(target: str, options: BuildOptions) -> tuple[str, ...]:
    """The compiler command (absolute program path, then any flags the variable carried)."""
    if target == "cuda":
        given, var = options.nvcc or os.environ.get("KCACHE_NVCC"), "--nvcc or KCACHE_NVCC"
        default = ["nvcc"]
        for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if home:
                default.append(os.path.join(home, "bin", "nvcc"))
    else:
        given, var = options.cxx or os.environ.get("CXX"), "--cxx or CXX"
        default = ["g++"]
    if given:
        argv = _split_command(given)
        path = shutil.which(argv[0])
        if path is None:
            raise CompilerNotFound(f"compiler not found: {argv[0]} (from {var})")
        return (os.path.abspath(path), *argv[1:])
    for name in default:
        path = shutil.which(name)
        if path:
            return (os.path.abspath(path),)
    raise CompilerNotFound(f"{default[0]} not found on PATH (set {var})")


def _split_command(value: str) -> list[str]:
    """A compiler from a variable: a path, or a command with flags as in CXX='g++ -m64'."""
    if os.path.exists(value) or not value.strip() or " " not in value.strip():
        return [value]

    return shlex.split(value)


def _compiler_key(program: str) -> str | None:
    try:
        real = os.path.realpath(program)
        st = os.stat(real)
    except OSError:
        return None
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def _memo_get(root: Path, key: str | None, name: str):
    if key is None:
        return None
    with _memo_lock:
        if key in _memo and name in _memo[key]:
            return _memo[key][name]
    rec = _read_memo(root).get(key)
    if isinstance(rec, dict) and isinstance(rec.get(name), str):
        with _memo_lock:
            _memo.setdefault(key, {})[name] = rec[name]
        return rec[name]
    return None


def _read_memo(root: Path) -> dict:
    """The compiler memo, bounded, read beneath the root, and only when it is this user's (or root's)."""
    data = state.read_own_file(root, COMPILER_MEMO, 1 << 20)
    try:
        memo = parse_json(data, COMPILER_MEMO) if data else {}
    except ValueError:
        return {}
    return memo if isinstance(memo, dict) else {}


def _memo_put(root: Path, key: str | None, name: str, value: str) -> None:
    """Remember a compiler fact in .kcache/ (atomically; losing a race only costs a re-probe)."""
    if key is None or state.linked_state_dir(root, ()) is not None:  # never write through a linked .kcache
        return
    with _memo_lock:
        _memo.setdefault(key, {})[name] = value
        try:
            data = _read_memo(root)
            data.setdefault(key, {})
            if not isinstance(data[key], dict):
                data[key] = {}
            data[key][name] = value
            _write_state_file(root, COMPILER_MEMO, json.dumps(data, indent=1, sort_keys=True).encode())
        except OSError:
            pass  # a read-only cache: probe again next time


def _write_state_file(root: Path, name: str, data: bytes) -> None:
    """Replace .kcache/`name` atomically, through the state directory held from the root (fswrite)."""
    root_fd = fswrite.open_root(root)
    try:
        sfd = state.open_state(root_fd, root, create=True)
        try:
            fswrite.replace_file_shared(sfd, name, data)  # the group's in a group-shared cache
        finally:
            os.close(sfd)
    finally:
        os.close(root_fd)


class CompilerVersion:
    """The compiler's `--version` line that names its release, asked while the compile runs.

    Asked on every build rather than remembered across runs (a wrapper script can point at
    another toolkit tomorrow); once per compiler within a process."""

    def __init__(self, compiler: Sequence[str]) -> None:
        self.key = "version:" + "\0".join(compiler)
        self.proc = None
        with _memo_lock:
            if self.key in _memo:
                return
        try:
            self.proc = _spawn([*compiler, "--version"])  # ended with kcache, as the compile is
        except OSError:
            pass

    def result(self) -> str | None:
        with _memo_lock:
            if self.key in _memo:
                return _memo[self.key]["version"]
        if self.proc is None:
            return None
        try:
            out = _reap(self.proc, 60)
        except subprocess.TimeoutExpired:
            return None
        lines = [line.strip() for line in out.decode("utf-8", "replace").splitlines() if line.strip()]
        version = (next((line for line in lines if "release" in line), lines[0])
                   if self.proc.returncode == 0 and lines else None)
        with _memo_lock:
            _memo[self.key] = {"version": version}
        return version

    def cancel(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            _end_group(self.proc)
            try:
                _reap(self.proc, 5)
            except subprocess.TimeoutExpired:  # a child that left the group holds the pipe: not waited on
                pass




def nvcc_default_arch(root: Path, nvcc: Sequence[str], fresh: bool = True) -> str:
    """What nvcc compiles for without -arch, read from its own `--dryrun` plan (nvcc 13: sm_75).

    Remembered per nvcc binary in .kcache/compilers.json: a cache hit (fresh=False) uses that and
    costs no subprocess; a build asks nvcc again (a wrapper script may point at another toolkit)."""
    key = _compiler_key(nvcc[0])
    with _memo_lock:
        asked = key in _asked  # asked in this process already: as fresh as it gets
    got = _memo_get(root, key, "default_arch") if asked or not fresh else None
    if got is not None and ARCH_RE.match(got):
        return got

    try:
        _, out = run_compiler([*nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull], timeout=60)
        text = out.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError) as exc:
        raise KcacheError(f"cannot ask {nvcc[0]} for its default arch ({exc}); pass --arch") from None
    m = re.search(r"\bptxas\b[^\n]*?-arch[= ](sm_\w+)", text)  # the SASS arch it assembles for
    cicc = re.search(r"\bcicc\b[^\n]*?-arch[= ]compute_(\w+)", text)  # else the PTX it generates
    arch = m.group(1) if m else (f"sm_{cicc.group(1)}" if cicc else None)
    if arch is None or not ARCH_RE.match(arch):
        raise KcacheError(f"cannot tell {nvcc[0]}'s default arch from its --dryrun output; pass --arch")
    _memo_put(root, key, "default_arch", arch)
    with _memo_lock:
        if key is not None:
            _asked.add(key)
    return arch


def local_gpu_arch() -> str | None:
    """The first local GPU's arch (`9.0` -> `sm_90`), or None without a GPU."""
    return first_gpu_arch()


class Arch(NamedTuple):
    value: str
    source: str  # --arch, nvidia-smi, nvcc default, host


def check_arch(arch: str) -> str:
    if not ARCH_RE.match(arch):
        raise UsageError(f"bad arch '{arch}' (expected e.g. sm_90, sm_90a, sm_100f or compute_90)")
    return arch


def resolve_arch(root: Path, target: str, options: BuildOptions, fresh: bool = True) -> Arch:
    """The arch a build of `target` is for: --arch, else the local GPU's, else nvcc's default
    (fresh=False: as remembered, for the hit check). A CPU build is for the host machine."""
    if target != "cuda":
        return Arch(os.uname().machine, "host")
    if options.arch:
        return Arch(check_arch(options.arch), "--arch")
    gpu = local_gpu_arch()
    if gpu:
        return Arch(gpu, "nvidia-smi")
    return Arch(nvcc_default_arch(root, find_compiler("cuda", options), fresh), "nvcc default")


def compile_command(target: str, compiler: Sequence[str], arch: Arch, options: BuildOptions) -> list[str]:
    """The exact compile command; it runs inside the entry's directory, on relative names."""
    if target == "cuda":
        base = ["-shared", "-Xcompiler", "-fPIC", "-O3", f"-arch={arch.value}"]
    else:
        base = ["-shared", "-fPIC", "-O3"]
    return [*compiler, *base, *_flag_words(options.include_dirs, options.extra_flags), "-o", BINARY,
            SOURCE_NAME[target]]


def check_extra_flags(flags: Sequence[str]) -> None:
    for f in flags:
        name = f.split("=", 1)[0]
        if name in ARCH_FLAGS or (name.startswith("-arch") and name != "-arch"):
            raise UsageError(f"'{f}' after --: give the arch with --arch so that it is recorded")


# ---- the entry on disk ---------------------------------------------------------------------------

def _read_manifest(path: str) -> dict | None:
    # size- and depth-limited, no link or FIFO followed: the entry may hold anything
    return json_object(os.path.join(path, MANIFEST))


def _entry_shape():
    """The path shape of the entries `kcache build` writes (the build layout's, from the light registry)."""
    shape = BUILD_SHAPE.kind(BUILD_SHAPE.build_kind or "")
    assert shape is not None, "the build layout declares its build kind"
    return shape


def entry_status(path: str, deep: bool = False) -> tuple[Status | None, str | None, dict | None]:
    """(status, reason, kcache.json) of the entry at `path`; status None when there is none.

    The build layout's own judgement: the one `kcache ls` shows, or with `deep` the one `verify` and
    `inspect` show (every byte against kcache.json: what a hit goes by)."""
    if os.path.islink(path):
        return CORRUPT, "a symlink, not an entry directory", None
    if not os.path.lexists(path):
        return None, None, None
    if not os.path.isdir(path):
        return CORRUPT, "not a directory", None

    layout = builder()
    with EntryDir.open(path) as d:
        verdict = layout.judge(d, layout.shape.build_kind or "", layout.judging(deep))
    return verdict.status, verdict.reason, _read_manifest(path)


def _entry_archs(path: str, manifest: dict | None) -> tuple[tuple[str, ...], str]:
    """The archs an entry is for, and where that came from (kcache.json, the binary, or nowhere)."""
    if manifest is not None and isinstance(manifest.get("arch"), str):
        return (manifest["arch"],), MANIFEST

    info = read_binary(os.path.join(path, BINARY))
    return tuple(info.archs) + tuple(info.ptx_archs), BINARY


def _source_differs(spec: TaskSpec, manifest: dict | None, final: Path) -> bool:
    """Whether the entry was built from another source than the task's: by kcache.json's sha256, or for an
    entry hidet made (no kcache.json), by the source file it keeps."""
    rec = ((manifest or {}).get("files") or {}).get(SOURCE_NAME[spec.target])
    if isinstance(rec, dict) and rec.get("sha256"):
        theirs = rec["sha256"]
    elif manifest is None:
        try:
            fd = os.open(final, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            theirs = _sha256_at(fd, SOURCE_NAME[spec.target])[2]
        except OSError:  # none kept: nothing to compare
            return False
        finally:
            os.close(fd)
    else:
        return False
    h = hashlib.sha256()
    try:
        for chunk in _source_chunks(spec.source_path):
            h.update(chunk)
    except BuildError:  # unreadable: the build says so
        return False
    return h.hexdigest() != theirs


def _flag_words(include_dirs: Iterable[str], extra_flags: Iterable[str]) -> list[str]:
    """The flags a build adds to the compiler's own, as its command line has them: -I<dir> then the rest."""
    return [*(f"-I{os.path.abspath(d)}" for d in include_dirs), *extra_flags]


def _flags_differ(spec: TaskSpec, options: BuildOptions, manifest: dict | None) -> str | None:
    """The note for an entry whose kcache.json records other flags (-I directories, the flags after --) than
    this build's, or None: the same, or not recorded (an entry hidet made, an older kcache's)."""
    dirs, extra = (manifest or {}).get("include_dirs"), (manifest or {}).get("extra_flags")
    if not (isinstance(dirs, list) and isinstance(extra, list)
            and all(isinstance(f, str) for f in (*dirs, *extra))):
        return None
    theirs, ours = _flag_words(dirs, extra), _flag_words(options.include_dirs, options.extra_flags)
    if theirs == ours:
        return None
    return (f"{spec.relpath} was built with other flags than this build's (the entry's: "
            f"{shlex.join(theirs) or 'none'}; asked for: {shlex.join(ours) or 'none'}; the task is the same); "
            "--force rebuilds it")


SOURCE_CHUNK = 1 << 20  # a source is read this much at a time: a 3 GB source costs 1 MiB of memory


def _source_chunks(path: str) -> Iterator[bytes]:
    """The source file the user named, in chunks (never read whole): a link is followed (the user named
    it), but it must be a regular file (a FIFO or device is refused, never read or waited on);
    BuildError when it cannot be read."""
    try:
        src, _ = open_regular(path, follow=True)
    except OSError as exc:
        raise BuildError(f"cannot read source {path}: {exc.strerror or exc}") from None
    try:
        while True:
            try:
                data = os.read(src, SOURCE_CHUNK)
            except OSError as exc:
                raise BuildError(f"cannot read source {path}: {exc.strerror or exc}") from None
            if not data:
                return
            yield data
    finally:
        os.close(src)


# ---- building ------------------------------------------------------------------------------------

def build_task(root: str | os.PathLike, task: str | os.PathLike | TaskSpec, options: BuildOptions = BuildOptions(),
               *, source: str | os.PathLike | None = None, listener: Listener | None = None) -> BuildResult:
    """Build one task into the cache at `root`, or find it there.

    Returns a BuildResult (built, hit, or failed for a compile error). Raises a KcacheError for a
    task that cannot be built as given, a missing compiler, an entry built for another arch
    (ArchMismatch) and a lock that did not come free within options.timeout (LockTimeout)."""
    with TermAsInterrupt() as signals:  # SIGTERM (CI timeouts, docker stop) unwinds as Ctrl-C does
        spec = task if isinstance(task, TaskSpec) else load_task(task, options, source)
        result = _build_task(Path(root).absolute(), spec, options, listener or BuildListener())
        signals.check()  # one a finalizer swallowed
    notes = task_notes(spec)
    return result._replace(notes=notes + result.notes) if notes else result


def task_notes(spec: TaskSpec) -> tuple[str, ...]:
    """What to say about the task file itself: a final newline (an editor's) makes it another task than
    the one hidet would look up, since hidet writes its task strings without one."""
    bare = spec.task_bytes.rstrip(b"\r\n")
    if bare == spec.task_bytes:
        return ()
    theirs = task_hash(bare)
    return (f"{spec.task_path} ends with a newline; hidet's own task strings have none, so hidet looks this task "
            f"up as {theirs} (ops/{spec.space}/{spec.op}/{theirs}), while the file's exact bytes hash to "
            f"{spec.hash}, the entry built; remove the final newline to build the entry hidet uses",)


def _build_task(root: Path, spec: TaskSpec, options: BuildOptions, listener: Listener) -> BuildResult:
    check_extra_flags(options.extra_flags)
    arch_cache: dict[bool, Arch] = {}

    def arch(fresh: bool = False) -> Arch:
        if fresh not in arch_cache:
            arch_cache[fresh] = resolve_arch(root, spec.target, options, fresh)
        return arch_cache[fresh]

    final = root / spec.relpath
    if not options.force:
        found = _hit(root, spec, final, arch, options, waited=False)
        if found is not None:
            return found
    compiler = find_compiler(spec.target, options)
    linked = state.linked_state_dir(root, ("locks", "used", "trash"))
    if linked is not None:
        raise KcacheError(f"refusing to build: {root / linked} is a symlink or not a directory (kcache never "
                          "writes through a link)")
    state.make_root(root)  # a root kcache makes is tagged (CACHEDIR.TAG): evidence that it is a cache
    lock, waited = _acquire(root, spec, options.timeout, listener)
    try:
        if not options.force:  # another build may have published while we waited for the lock
            found = _hit(root, spec, final, arch, options, waited)
            if found is not None:
                return found
        replaced = _wait_for_compiler(spec, final, options.timeout, listener)
        note = builder().build_replacing(str(final)) if replaced else None  # --force over the compiler's own
        listener.compiling(spec)
        built = _compile_and_publish(root, spec, final, arch(fresh=True), compiler, options, replaced, waited)
        if note is None or built.status != BUILT:
            return built
        return built._replace(notes=(*built.notes, f"{spec.relpath}: replaced; {note}"))
    finally:
        lock.release()


def _hit(root: Path, spec: TaskSpec, final: Path, arch: Callable[[], Arch], options: BuildOptions, waited: bool
         ) -> BuildResult | None:

    status, reason, manifest = entry_status(str(final), deep=True)  # a lib.so that differs is no hit
    if status is None or not builder().build_reuses(str(final), Judgement(status, reason)):
        return None
    want = arch()
    notes = []
    have: tuple[str, ...] = ()
    where = ""
    if spec.target == "cuda" or manifest is not None:
        have, where = _entry_archs(str(final), manifest)
        if not have:
            notes.append(f"no arch recorded for {spec.relpath}; reusing it as built")
        elif want.value not in have:
            why = {"nvcc default": " (nvcc's default: no GPU found)", "nvidia-smi": " (the local GPU's)"}
            raise ArchMismatch(f"{spec.relpath} was built for {', '.join(have)}, not {want.value}"
                               f"{why.get(want.source, '')}: pass --arch {have[0]} to use it, or --force to "
                               f"rebuild it for {want.value}")
    if _source_differs(spec, manifest, final):
        notes.append(f"{spec.relpath} was built from another {SOURCE_NAME[spec.target]} than {spec.source_path} "
                     "(the task is the same); --force rebuilds it")
    flags = _flags_differ(spec, options, manifest)
    if flags:
        notes.append(flags)
    unnoted = state.mark_used(root, spec.relpath)
    if unnoted:
        notes.append(unnoted)
    return BuildResult(spec.task_path, HIT, spec.op, spec.hash, spec.target, spec.space, spec.relpath, str(final),
                       arch=", ".join(have) if have else want.value, arch_source=where if have else want.source,
                       waited=waited, notes=tuple(notes), recompiled_by=None if status == COMPLETE else _recompiler())


def _acquire(root: Path, spec: TaskSpec, timeout: float | None, listener: Listener):
    """The entry's lock; says so (listener.waiting) when another build holds it. -> (lock, waited).

    `locking.EntryFlock`: the file and kind of lock that `entry_lock` (filelock) takes, without
    importing filelock (about 35 ms, most of the 5% a build may add to a one-second compile)."""
    lock = EntryFlock(root, spec.relpath)
    try:
        if lock.acquire(timeout=0):
            return lock, False
        listener.waiting(spec, "another kcache build")
        if lock.acquire(timeout=-1 if timeout is None else timeout):
            return lock, True
    except OSError as exc:
        raise KcacheError(f"cannot lock {lock.path}: {exc.strerror}") from None
    raise LockTimeout(f"another build of {spec.relpath} still holds its lock ({lock.path}){lock.holder()} after "
                      f"{timeout:g}s (--lock-timeout to wait longer)")


def _wait_for_compiler(spec: TaskSpec, final: Path, timeout: float | None, listener: Listener) -> str | None:
    """Wait while the build layout's own compiler works on this entry (it holds one of the entry's
    writer locks, e.g. hidet's <entry>/.lock); then say what a build would replace: None, or the reason
    the existing entry is not usable as it is."""
    status, reason, _ = entry_status(str(final), deep=True)
    if status is None:
        return None
    layout = builder()
    busy = layout.busy(str(final))
    if busy:
        listener.waiting(spec, layout.name)
        deadline = None if timeout is None else time.monotonic() + timeout
        while busy:
            if deadline is not None and time.monotonic() >= deadline:
                raise LockTimeout(f"{busy} ({final}) after {timeout:g}s")
            time.sleep(0.1)
            busy = layout.busy(str(final))
        status, reason, _ = entry_status(str(final), deep=True)
        if status is None:
            return None
    return f"{status} entry" + (f" ({reason})" if reason else "")


def _check_inside(root: Path, path: Path) -> None:
    real_root, real = os.path.realpath(root), os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise KcacheError(f"refusing to build: {path} leads outside the cache ({real})")


def _check_no_links(root: Path, relpath: str) -> None:
    """Every existing directory above `relpath` (.kcache/, locks/, used/, ops/, the space, the op) must be
    a real directory: kcache never writes through a symlink, even one that points inside the cache
    (prune and clear refuse the same links)."""
    cur = str(root)
    for part in relpath.split("/")[:-1]:
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise KcacheError(f"refusing to build: cannot check {cur}: {exc.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            raise KcacheError(f"refusing to build: {cur} is a symlink (kcache never writes through a link)")
        if not stat.S_ISDIR(st.st_mode):
            raise KcacheError(f"refusing to build: {cur} is not a directory")


def _make_op_dir(root: Path, spec: TaskSpec, op_dir: Path, root_fd: int) -> tuple[int, list[str]]:
    """Make the entry's op directory (and space directory) beneath the held root, never through a
    symlink; (its descriptor, the relpaths of those it made, to be removed again if nothing is published)."""
    existing = op_dir
    while not existing.exists() and existing != root:
        existing = existing.parent
    _check_inside(root, existing)  # a symlinked space or op directory must not lead out (said early)
    _check_no_links(root, spec.relpath)
    op_rel = os.path.dirname(spec.relpath)
    made = [rel for rel in (op_rel, os.path.dirname(op_rel)) if not (root / rel).exists()]
    try:
        return fswrite.open_dir(root_fd, op_rel, create=True), made
    except OSError as exc:
        raise KcacheError(f"cannot create {op_dir}: {exc.strerror}") from None


def discard_temp(root: Path, relpath: str) -> None:
    """Remove what a build leaves (its temp dir, the old entry in the trash), relative to directory
    descriptors (kcache_cli.fs.delete): never through a link, never onto another mount."""
    fsdelete.remove_under(root, relpath)


class _Temp(NamedTuple):
    """A build's temp directory, `name` in the op directory `op_fd`, held as `fd`: made 0700, so no
    co-user can change what the compiler writes in it; opened to the cache's users when published."""

    op_fd: int
    name: str
    fd: int

    def cwd(self) -> str:
        """The directory for the compiler: the held one itself (through /proc), never a path to it."""
        held = f"/proc/self/fd/{self.fd}"
        return held if os.path.isdir(held) else "."


def make_temp(op_fd: int, op_rel: str, h: str) -> _Temp:
    for _ in range(100):
        name = f"{state.TEMP_PREFIX}{h}-{os.urandom(4).hex()}"
        try:
            fswrite.mkdir_at(op_fd, name, 0o700)
        except FileExistsError:
            continue
        fd = os.open(name, fswrite.DIR_FLAGS, dir_fd=op_fd)
        if fswrite.owner_problem(os.fstat(fd), name, private=True) is None:
            return _Temp(op_fd, name, fd)
        os.close(fd)
    raise KcacheError(f"cannot create a temp directory in {op_rel}")


def _write(tmp: _Temp, name: str, data: bytes | Iterator[bytes], sync: bool = True) -> None:
    fswrite.write_file(tmp.fd, name, data, 0o666, sync)


def _prepare(tmp: _Temp, *written: str) -> None:
    """Runs beside the compiler: make the inputs durable and load hashlib for the checksums."""
    for name in written:
        try:
            _fsync_at(tmp.fd, name)
        except OSError:
            pass  # the publish step fsyncs the directory; a failure here shows up there


def _fsync_at(dir_fd: int, name: str) -> None:
    fd, _ = fsread.open_regular(name, dir_fd=dir_fd)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256_at(dir_fd: int, name: str) -> tuple[int, int, str]:
    """(size, mtime_ns, sha256) of the regular file `name` in `dir_fd`."""
    fd, st = fsread.open_regular(name, dir_fd=dir_fd)
    try:
        h = hashlib.sha256()
        for chunk in iter(lambda: os.read(fd, fsread.CHUNK), b""):
            h.update(chunk)
    finally:
        os.close(fd)
    return st.st_size, st.st_mtime_ns, h.hexdigest()


def _compile_and_publish(root: Path, spec: TaskSpec, final: Path, arch: Arch, compiler: Sequence[str],
                         options: BuildOptions, replaced: str | None, waited: bool) -> BuildResult:
    try:
        from kcache_cli.fs.read import open_regular

        os.close(open_regular(spec.source_path, follow=True)[0])  # readable before any directory is made
    except OSError as exc:
        raise BuildError(f"cannot read source {spec.source_path}: {exc.strerror or exc}") from None
    root_fd = fswrite.open_root(root)
    try:
        op_fd, made = _make_op_dir(root, spec, final.parent, root_fd)
        try:
            tmp = make_temp(op_fd, os.path.dirname(spec.relpath), spec.hash)
            try:
                result = _compile_in(root, root_fd, spec, final, tmp, arch, compiler, options, waited,
                                     made)
            finally:
                os.close(tmp.fd)
            if result.status == BUILT:
                os.fsync(op_fd)
        finally:
            os.close(op_fd)
    finally:
        os.close(root_fd)
    if result.status == BUILT:
        unnoted = state.mark_used(root, spec.relpath)
        return result._replace(replaced=replaced, notes=result.notes + ((unnoted,) if unnoted else ()),
                               recompiled_by=_recompiler())
    return result


def _recompiler() -> str | None:
    """The installed compiler that compiles what kcache build writes again in place (the build layout's
    word), or None."""
    again = builder().build_compiled_again()
    return again.by if again is not None else None


def compiled_again_warning(results: Sequence[BuildResult]) -> str | None:
    """The one warning for a run whose entries (built or hit) the installed compiler compiles again in place
    rather than loading them: it names that compiler and what it needs; None when there are none."""
    again = [r for r in results if r.recompiled_by]
    if not again:
        return None
    what = builder().build_compiled_again()
    needs = f" (it needs {what.needs}, which kcache build does not write)" if what is not None else ""
    n = len(again)
    return (f"{again[0].recompiled_by} is installed and compiles the entries kcache build makes again in place "
            f"on first use{needs}: {n} {'entry' if n == 1 else 'entries'} of this build will not be loaded as "
            "built (see docs/build.md)")


def _compile_in(root: Path, root_fd: int, spec: TaskSpec, final: Path, tmp: _Temp, arch: Arch,
                compiler: Sequence[str], options: BuildOptions, waited: bool, made: list[str]) -> BuildResult:
    """Compile in the held temp directory, write the log and manifest there, and publish it."""
    argv = compile_command(spec.target, compiler, arch, options)
    command = shlex.join(argv)
    result: dict[str, Any] = dict(task=spec.task_path, op=spec.op, hash=spec.hash, target=spec.target, space=spec.space,
                  relpath=spec.relpath, path=str(final), arch=arch.value, arch_source=arch.source, command=command,
                  waited=waited)
    published = False
    version = None
    try:
        src_name = SOURCE_NAME[spec.target]
        _write(tmp, src_name, _source_chunks(spec.source_path), sync=False)  # streamed, never whole
        _write(tmp, TASK, spec.task_bytes, sync=False)
        version = CompilerVersion(compiler)
        # While the compiler runs (a child process), this process is idle: sync the inputs and
        # import hashlib then, rather than after the compile, where every millisecond shows.
        prep = threading.Thread(target=_prepare, args=(tmp, src_name, TASK), daemon=True)
        prep.start()
        start = time.perf_counter()
        try:
            status, out = run_compiler(argv, tmp.cwd())
        except OSError as exc:
            raise CompilerNotFound(f"cannot run {argv[0]}: {exc.strerror}") from None
        finally:
            prep.join()
        elapsed = time.perf_counter() - start
        output = out.decode("utf-8", "replace")
        why = _exit_words(status) if status != 0 else _output_problem(tmp, spec.task_bytes)
        if why:
            return BuildResult(status=FAILED, elapsed=elapsed, output=output, exit_code=1,
                               error=f"compile failed ({why}): {spec.op} {spec.hash} from {spec.source_path}; "
                                     "nothing was published", **result)
        if output and not output.endswith("\n"):
            output += "\n"
        _write(tmp, LOG, f"{command}\n{output}elapsed time: {elapsed:.3f} seconds\n".encode())
        _fsync_at(tmp.fd, BINARY)
        files, newest = _files_record(tmp, (src_name, TASK, BINARY, LOG))
        _write(tmp, MANIFEST, (json.dumps(_manifest(spec, arch, compiler, version.result(), argv, command,
                                                    options, elapsed, files), indent=2) + "\n").encode())
        _stamp_after(tmp, newest)
        os.fsync(tmp.fd)
        _check_no_links(root, spec.relpath)  # the op directory may have been swapped meanwhile: say so
        try:
            _publish(root, root_fd, tmp, spec)
        except OSError as exc:
            raise KcacheError(f"cannot publish {final}: {exc.strerror or exc} (nothing was published)") from None
        published = True
    finally:
        if not published:
            if version is not None:
                version.cancel()
            discard_temp(root, f"{os.path.dirname(spec.relpath)}/{tmp.name}")
            _remove_empty(root_fd, made)
    return BuildResult(status=BUILT, elapsed=elapsed, output=output, **result)


# ---- the compilers this process runs: they stop with it ----------------------------------------------

_RUNNING: set[subprocess.Popen] = set()
_RUNNING_LOCK = threading.Lock()


def run_compiler(argv: list[str], cwd: str | None = None, timeout: float | None = None) -> tuple[int, bytes]:
    """(exit status, output) of the compiler (or a probe of it), run in a process group of its own (with
    nvcc's cicc and ptxas, a wrapper's g++ or sleep): an interrupt of kcache ends the whole group
    (stop_compilers), so nothing goes on writing into a temp directory kcache has let go of, nor keeps
    kcache waiting on its output. OSError when it cannot be started; TimeoutExpired after `timeout`."""
    proc = _spawn(argv, cwd)
    out = _reap(proc, timeout)
    return proc.returncode, out


def _spawn(argv: list[str], cwd: str | None = None) -> subprocess.Popen:
    """`argv` started in a new session (its own process group), known to stop_compilers until reaped."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    return proc


def _reap(proc: subprocess.Popen, timeout: float | None = None) -> bytes:
    """The output of `proc` once it ends; on an interrupt in this thread (Ctrl-C, or SIGTERM as one) or a
    timeout, its whole group is ended first, and the exception goes on."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException:
        _end_group(proc)
        proc.wait()  # not its pipes: a child that left the group may hold them
        raise
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)
    return out


def stop_compilers() -> None:
    """End every compiler this process runs, with its group (an interrupt the main thread caught while
    builds ran in others: a Ctrl-C no longer reaches the compilers' own groups)."""
    with _RUNNING_LOCK:
        for proc in list(_RUNNING):
            _end_group(proc)


def _end_group(proc: subprocess.Popen) -> None:
    if proc.returncode is None:  # not reaped: its group is still its own (as Popen.send_signal checks)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:  # gone meanwhile
            pass


def _files_record(tmp: _Temp, names: Iterable[str]) -> tuple[dict, int]:
    """({name: {size, sha256}} of the files for kcache.json, the newest mtime among them in ns)."""
    files = {}
    newest = 0
    for name in names:
        size, mtime_ns, digest = _sha256_at(tmp.fd, name)
        newest = max(newest, mtime_ns)
        files[name] = {"size": size, "sha256": digest}
    return files, newest


def _exit_words(status: int) -> str:
    return f"killed by signal {-status}" if status < 0 else f"exit status {status}"


ET_DYN = 3  # an ELF shared object, as hidet's loader (ctypes.CDLL) takes one


def _output_problem(tmp: _Temp, task: bytes) -> str | None:
    """Why what the compiler left in the temp directory must not be published, or None: lib.so must be an
    ELF shared object (a compiler that wrote garbage and exited 0 published a `complete` entry), task.txt
    the bytes kcache wrote, and nothing there but regular files (a link, FIFO or directory would be
    published into the cache)."""
    try:
        size = os.stat(BINARY, dir_fd=tmp.fd, follow_symlinks=False).st_size
        head = fsread.read_bytes(BINARY, 64, dir_fd=tmp.fd, strict=False)
    except OSError:
        return f"it wrote no {BINARY}"
    if not head:
        return f"it wrote no {BINARY}"
    bad = checks.elf_truncated(BINARY, head, size)  # the cheap judgement's own check of a binary
    if bad:
        return bad
    if int.from_bytes(head[16:18], "little" if head[5] == 1 else "big") != ET_DYN:
        return f"its {BINARY} is not a shared object"
    try:
        same = fsread.read_bytes(TASK, len(task) + 1, dir_fd=tmp.fd, strict=False) == task
    except OSError:
        same = False
    if not same:
        return f"it changed {TASK}"
    with os.scandir(tmp.fd) as it:
        odd = sorted(de.name for de in it if not de.is_file(follow_symlinks=False))
    return f"it left {odd[0]!r}, not a regular file" if odd else None


def _remove_empty(root_fd: int, made: list[str]) -> None:
    """The op and space directories a failed build made, if still empty (rmdir removes nothing else), so
    that no op shows up in completion for an entry that never was. A build starting there meanwhile
    makes them again (_make_op_dir)."""
    for rel in made:
        try:
            parent, name = fswrite.open_parent(root_fd, rel)
        except OSError:
            return
        try:
            if not fswrite.rmdir_at(parent, name):
                return  # not empty (another build, or an entry): leave it and its parents
        finally:
            os.close(parent)


def _stamp_after(tmp: _Temp, newest_ns: int) -> None:
    """kcache.json is the entry's completion marker: make its mtime strictly later than every file it
    lists (a coarse clock can give them all one tick), so that `ls` can tell an entry untouched since
    its build from one changed afterwards without reading it (checks.changed_since). Through its fd."""
    fd, st = fsread.open_regular(MANIFEST, dir_fd=tmp.fd)
    try:
        if st.st_mtime_ns <= newest_ns:
            fswrite.set_times_fd(fd, (st.st_atime_ns, newest_ns + 1_000_000))
    finally:
        os.close(fd)


def _publish(root: Path, root_fd: int, tmp: _Temp, spec: TaskSpec) -> None:
    """One rename makes the entry visible. An entry already there (--force, or a broken one) is
    exchanged with it in one step, then renamed into .kcache/trash/: readers see the old entry or the
    new one (where the file system cannot exchange, the old goes first: the old, none, or the new).
    Through held directory fds; the temp directory is opened to the cache's users first (umask), and
    handed over (fswrite.hand_over_tree: the group's, or the owner's when root builds in a user's cache)."""
    name = spec.relpath.rpartition("/")[2]
    os.fchmod(tmp.fd, 0o777 & ~fswrite.umask() | (os.fstat(tmp.op_fd).st_mode & stat.S_ISGID))
    # a member must be able to remove or replace it, whatever this umask; root's build in a user's cache the user's
    fswrite.hand_over_tree(tmp.fd, os.fstat(root_fd))
    if fswrite.lexists_at(tmp.op_fd, name) and fswrite.exchange_held(tmp.op_fd, tmp.name, name, os.fstat(tmp.fd)):
        _trash_old(root, root_fd, tmp.op_fd, tmp.name, spec)  # the old entry, now under the temp name
        return
    old = None
    trash = -1
    try:
        if fswrite.lexists_at(tmp.op_fd, name):
            trash = state.open_state(root_fd, root, "trash", create=True)
            old = f"build-{spec.hash}-{os.urandom(4).hex()}"
            fswrite.rename_at(tmp.op_fd, name, trash, old)
        try:
            fswrite.rename_held(tmp.op_fd, tmp.name, tmp.op_fd, name, os.fstat(tmp.fd))
        except OSError:
            if old is not None:  # put the old entry back rather than leave nothing
                try:
                    fswrite.rename_noreplace_at(trash, old, tmp.op_fd, name)
                except OSError:
                    pass
            raise
    finally:
        if trash >= 0:
            os.close(trash)
    if old is not None:
        discard_temp(root, f"{state.STATE_DIR}/trash/{old}")


def _trash_old(root: Path, root_fd: int, op_fd: int, name: str, spec: TaskSpec) -> None:
    """The replaced entry, at `name` in the op directory, out of the way: into the trash, emptied there.
    The new entry is published already: nothing here may fail the build. Where it cannot move (an entry
    another user wrote 0755: moving a directory to another parent takes write on it), or killed before,
    it stays under the temp name, a leftover the next prune removes once the build's lock is free."""
    try:
        trash = state.open_state(root_fd, root, "trash", create=True)
    except OSError:
        return
    old = f"build-{spec.hash}-{os.urandom(4).hex()}"
    try:
        fswrite.rename_at(op_fd, name, trash, old)
    except OSError:
        return
    finally:
        os.close(trash)
    try:
        discard_temp(root, f"{state.STATE_DIR}/trash/{old}")
    except OSError:  # the next prune empties the trash
        pass


def _manifest(spec: TaskSpec, arch: Arch, compiler: Sequence[str], version: str | None, argv: list[str],
              command: str, options: BuildOptions, elapsed: float, files: dict) -> dict:
    uname = os.uname()
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        libc = None
    return {
        "kcache_version": __version__,
        "op": spec.op,
        "hash": spec.hash,
        "target": spec.target,
        "space": spec.space,
        "arch": arch.value,
        "arch_source": arch.source,
        "compiler": f"{compiler[0]} ({version})" if version else compiler[0],
        "compiler_path": compiler[0],
        "compiler_version": version,
        "command": command,
        "argv": argv,
        "include_dirs": [os.path.abspath(d) for d in options.include_dirs],
        "extra_flags": list(options.extra_flags),
        "platform": "-".join(p for p in (uname.sysname, uname.release, uname.machine, libc) if p),
        "machine": uname.machine,
        "built": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "elapsed": round(elapsed, 3),
        "files": files,
    }


# ---- many tasks ----------------------------------------------------------------------------------

def failure(task: str, exc: KcacheError, spec: TaskSpec | None = None, root: str | os.PathLike | None = None
            ) -> BuildResult:
    """The result of a task that could not be built; a lock timeout says it waited."""
    extra: dict[str, Any] = {}
    if spec is not None:
        extra = dict(op=spec.op, hash=spec.hash, target=spec.target, space=spec.space, relpath=spec.relpath)
        if root is not None:
            extra["path"] = str(Path(root).absolute() / spec.relpath)
    return BuildResult(task, FAILED, error=str(exc), exit_code=exc.exit_code, waited=isinstance(exc, LockTimeout),
                       **extra)


def build_tasks(root: str | os.PathLike, tasks: Sequence[str | os.PathLike | TaskSpec],
                options: BuildOptions = BuildOptions(), *, jobs: int = 1,
                listener: Listener | None = None, builder: Callable | None = None) -> list[BuildResult]:
    """Build several tasks (task files or loaded TaskSpecs), `jobs` at a time; every task gets a
    result, in the order given. A task that cannot be built (bad file, compile error, arch
    mismatch, lock timeout) is a failed result, not an exception. `builder` replaces build_task
    (build --remote)."""
    build_one = builder or build_task
    listener = listener or BuildListener()
    check_extra_flags(options.extra_flags)

    def one(task) -> BuildResult:
        spec = task if isinstance(task, TaskSpec) else None
        name = spec.task_path if spec is not None else os.fspath(task)
        try:
            spec = spec or load_task(task, options)
            result = build_one(root, spec, options, listener=listener)
        except KcacheError as exc:
            result = failure(name, exc, spec, root)
        except OSError as exc:
            result = failure(name, KcacheError(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")), spec,
                             root)
        listener.done(result)
        return result

    with TermAsInterrupt() as signals:  # SIGTERM (CI timeouts, docker stop) unwinds as Ctrl-C does
        results = _run_all(one, tasks, max(1, jobs))
        signals.check()  # one a finalizer swallowed
    return results


def _run_all(one: Callable[[Any], BuildResult], tasks: Sequence, jobs: int) -> list[BuildResult]:
    """`one(task)` for each task, `jobs` at a time. An interrupt starts nothing new and ends the compilers
    running, whose builds then clean up after themselves."""
    if jobs == 1 or len(tasks) <= 1:
        return [one(t) for t in tasks]
    pool = ThreadPoolExecutor(max_workers=min(jobs, len(tasks)))
    try:
        return list(pool.map(one, tasks))
    except BaseException:
        stop_compilers()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)


def count(results: Sequence[BuildResult], status: str) -> int:
    return sum(1 for r in results if r.status == status)


def exit_code(results: Sequence[BuildResult]) -> int:
    """0 when nothing failed; 3 when every failure was a lock timeout; else the failures' code (1)."""
    codes = {r.exit_code or 1 for r in results if r.status == FAILED}
    if not codes:
        return 0
    return codes.pop() if len(codes) == 1 else 1


def summary_json(results: Sequence[BuildResult]) -> dict:
    return {"built": count(results, BUILT), "hits": count(results, HIT), "failed": count(results, FAILED),
            "results": [r.to_json() for r in results]}
