"""`kcache build --repair`: rebuild a hidet op entry's lib.so in place from the entry's own source and
the compile command hidet recorded in its compile.sh, keeping hidet's metadata files.

compile.sh sits in a cache a co-user may write, so it is data, never a script: it is split with shlex,
never given to a shell, and only a command whose program is a known compiler (by basename, or the one
given with --nvcc/--cxx), whose flags are all of the shapes hidet writes (an allow-list: nothing that
names a program, plug-in, spec or response file, or an output anywhere) and whose one input is the
entry's own source is accepted. The entry's source is copied into a private (0700) temp directory in
the op directory, compiled there (its `-o` is the temp directory's lib.so), and only lib.so is renamed
into the entry, through held directory descriptors, under the entry's build lock.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple, Sequence

from kcache_cli.formats.binary import read_binary
from kcache_cli.fs import read as fsread
from kcache_cli.fs import write as fswrite
from kcache_cli.fs.locking import EntryFlock
from kcache_cli.layouts import builder
from kcache_cli.model.checks import elf_truncated
from kcache_cli.ops.build import check_arch, discard_temp, make_temp
from kcache_cli.util.errors import KcacheError, LockTimeout, UsageError

if TYPE_CHECKING:
    from kcache_cli.model.terms import RepairOutcome

REPAIRED: Final = "repaired"
FINE: Final = "fine"
FAILED: Final = "failed"
COMPILERS = ("nvcc", "g++", "gcc", "c++", "clang++")
SCRIPT = "compile.sh"
BINARY = "lib.so"
SOURCES = ("source.cu", "source.cc")
MAX_SCRIPT = 64 * 1024
HASH_RE = re.compile(r"[0-9a-f]{1,64}")

# Flags hidet's compile commands use (hidet/backend/build.py), as whole tokens.
_SIMPLE = re.compile(
    r"-I[^\s,]+|-L[^\s,]+|-l[\w.+-]+|-O[0-3sgz]?|-Ofast|-std=[\w+]+|-m[\w.=-]+|-f[A-Za-z0-9-]+|-D[A-Za-z_]\w*(=[\w.]*)?"
    r"|-W(?!l,|a,|p,)[\w-]+(=[\w-]+)?|-w|-g|-G|-shared|--shared|-lineinfo|-ftz=(true|false)|-prec-(div|sqrt)=(true|false)"
    r"|-fmad=(true|false)|--?use_fast_math|--ptxas-options=-v|--expt-relaxed-constexpr|--expt-extended-lambda"
    r"|-Wl,--no-as-needed|-Wl,--as-needed|-arch=sm_\d+[af]?|--offload-arch=[\w-]+"
    r"|-gencode=arch=compute_\d+[af]?,code=(sm|compute)_\d+[af]?")
_REFUSED_F = ("-fplugin", "-fprofile", "-fdump", "-fsave", "-fstack-usage", "-fcallgraph", "-fcompare-debug",
              "-fauto-profile", "-fcreate-profile", "-fdebug", "-ffile-prefix", "-fmacro-prefix")
_WITH_VALUE = {  # option -> the shape of the token that must follow it
    "-gencode": re.compile(r"arch=compute_\d+[af]?,code=(sm|compute)_\d+[af]?"),
    "-arch": re.compile(r"sm_\d+[af]?"),
    "--cudart": re.compile(r"shared|static|none"),
    "--diag-suppress": re.compile(r"\d+(,\d+)*"),
    "-diag-suppress": re.compile(r"\d+(,\d+)*"),
    "-Xptxas": re.compile(r"-v"),
    "-Xcompiler": None,  # a comma list of flags, each checked like one of the compiler's own
}


class Refused(KcacheError):
    """A compile.sh kcache will not run (one line: what, and why)."""


class RepairOptions(NamedTuple):
    nvcc: str | None = None  # a compiler the user named, accepted beside COMPILERS
    cxx: str | None = None
    arch: str | None = None  # CUDA: rebuild when lib.so lacks it, with -gencode for it added
    force: bool = False  # rebuild even a lib.so that looks whole
    timeout: float | None = None  # seconds to wait for another build's lock


class RepairResult(NamedTuple):
    relpath: str
    path: str
    status: RepairOutcome
    reason: str = ""  # why lib.so needed a rebuild (or why it was left alone)
    command: str = ""  # the command that ran (never through a shell)
    elapsed: float = 0.0
    output: str = ""
    error: str | None = None

    def to_json(self) -> dict:
        return self._asdict()


def find_entries(root: Path, prefixes: Sequence[str]) -> list[str]:
    """The hidet op entries (ops/<space>/<op>/<hash>) whose hash starts with one of `prefixes`; a prefix
    that names none is a usage error. Links are never followed."""
    for p in prefixes:
        if not HASH_RE.fullmatch(p):
            raise UsageError(f"bad hash prefix '{p}' for --repair (hex digits of an entry's hash)")
    found: dict[str, list[str]] = {p: [] for p in prefixes}
    for space in _dirs(root / "ops"):
        for op in _dirs(root / "ops" / space):
            for h in _dirs(root / "ops" / space / op):
                for p in prefixes:
                    if h.startswith(p):
                        found[p].append(f"ops/{space}/{op}/{h}")
    missing = [p for p, hits in found.items() if not hits]
    if missing:
        raise UsageError(f"no hidet op entry's hash starts with {', '.join(missing)} in {root}")
    return sorted({rel for hits in found.values() for rel in hits})


def _dirs(path: Path) -> list[str]:
    try:
        with os.scandir(path) as it:
            return sorted(e.name for e in it if e.is_dir(follow_symlinks=False) and not e.name.startswith("."))
    except OSError:
        return []


def parse_script(text: str, relpath: str, source: str, allowed: Sequence[str] = ()) -> tuple[list[str], str]:
    """compile.sh's one command, checked: -> (argv without its input and -o, the target). Refused otherwise.
    `allowed`: compiler paths the user named (--nvcc/--cxx), accepted beside the known basenames."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if len(lines) != 1:
        raise Refused(f"{relpath}/{SCRIPT}: {len(lines)} commands, kcache repairs from exactly one")
    try:
        argv = shlex.split(lines[0])
    except ValueError as exc:
        raise Refused(f"{relpath}/{SCRIPT}: cannot be split ({exc})") from None
    if not argv:
        raise Refused(f"{relpath}/{SCRIPT}: no command")
    program = argv[0]
    name = os.path.basename(program)
    if name not in COMPILERS and program not in allowed:
        raise Refused(f"{relpath}/{SCRIPT}: program '{_show(program)}' is not a known compiler ({', '.join(COMPILERS)}"
                      " or --nvcc/--cxx)")
    flags, inputs = _check_args(argv[1:], relpath)
    want = f"{relpath}/{source}"
    if len(inputs) != 1 or not ("/" + os.path.normpath(inputs[0])).endswith("/" + want):
        raise Refused(f"{relpath}/{SCRIPT}: its input {', '.join(map(_show, inputs)) or '(none)'} is not the "
                      f"entry's own {source}")
    return [program, *flags], ("cuda" if name == "nvcc" else "cpu")


def compiler_for(program: str, options: RepairOptions) -> str:
    """The compiler that runs: never the path compile.sh names (a co-user may have written it), but the
    one the user named (--nvcc/--cxx) or the same basename found on PATH."""
    if program in (options.nvcc, options.cxx):
        return program
    name = os.path.basename(program)
    given = options.nvcc if name == "nvcc" else options.cxx
    try:
        want = shlex.split(given)[0] if given and not os.path.exists(given) and given.split() else (given or name)
    except ValueError:
        raise UsageError(f"cannot split the compiler command {_show(given or '')}") from None
    found = shutil.which(want)
    if found is None:
        raise KcacheError(f"compiler not found: {want} (--nvcc/--cxx names one)")
    return os.path.abspath(found)


def _show(token: str) -> str:
    return repr(token)[1:-1][:80]


def _check_args(args: list[str], relpath: str) -> tuple[list[str], list[str]]:
    flags: list[str] = []
    inputs: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "-o":  # the output is always the temp directory's lib.so
            i += 2
            continue
        if tok in _WITH_VALUE:
            value = args[i + 1] if i + 1 < len(args) else ""
            shape = _WITH_VALUE[tok]
            ok = all(_flag_ok(f) for f in value.split(",")) if shape is None else bool(shape.fullmatch(value))
            if not ok:
                raise Refused(f"{relpath}/{SCRIPT}: '{_show(tok)} {_show(value)}' is not a flag kcache accepts")
            flags += [tok, value]
            i += 2
            continue
        if tok.startswith("-"):
            if not _flag_ok(tok):
                raise Refused(f"{relpath}/{SCRIPT}: option '{_show(tok)}' is not one kcache accepts")
            flags.append(tok)
        else:
            inputs.append(tok)
        i += 1
    return flags, inputs


def _flag_ok(tok: str) -> bool:
    if tok.startswith(_REFUSED_F):
        return False
    return bool(_SIMPLE.fullmatch(tok))


def lib_problem(entry_fd: int, target: str, arch: str | None) -> str | None:
    """Why the entry's lib.so needs a rebuild (missing, not a regular file, truncated, lacking `arch`), or None."""
    try:
        st = os.stat(BINARY, dir_fd=entry_fd, follow_symlinks=False)
    except FileNotFoundError:
        return f"{BINARY} is missing"
    if not stat.S_ISREG(st.st_mode):
        return f"{BINARY} is not a regular file"

    try:
        head = fsread.read_bytes(BINARY, 64, dir_fd=entry_fd, strict=False)
    except OSError as exc:
        return f"{BINARY} cannot be read ({exc.strerror or exc})"
    bad = elf_truncated(BINARY, head, st.st_size)
    if bad or st.st_size <= 1:
        return bad or f"{BINARY} is empty"
    if arch and target == "cuda":
        have = read_binary(f"/proc/self/fd/{entry_fd}/{BINARY}").archs
        if arch not in have:
            return f"{BINARY} lacks {arch} (it holds {', '.join(have) or 'none'})"
    return None


def repair_entries(root: Path, relpaths: Sequence[str], options: RepairOptions = RepairOptions()) -> list[RepairResult]:
    out = []
    for rel in relpaths:
        try:
            out.append(repair_entry(root, rel, options))
        except Refused as exc:
            out.append(RepairResult(rel, str(root / rel), FAILED, error=f"refused, nothing ran: {exc}"))
        except KcacheError as exc:
            out.append(RepairResult(rel, str(root / rel), FAILED, error=str(exc)))
        except OSError as exc:  # the entry changed under us (a co-user): one line, the entry as it was
            out.append(RepairResult(rel, str(root / rel), FAILED, error=f"cannot repair: {exc.strerror or exc}"))
    return out


def repair_entry(root: Path, relpath: str, options: RepairOptions = RepairOptions()) -> RepairResult:
    """Rebuild one entry's lib.so, under its build lock (as `kcache build` takes it)."""
    root_fd = fswrite.open_root(root)
    try:
        try:
            entry_fd = fswrite.open_dir(root_fd, relpath)
        except OSError as exc:
            raise KcacheError(f"cannot open {relpath}: {exc.strerror or exc} (never through a link)") from None
        try:
            lock = _lock(root, relpath, options.timeout)
            try:
                return _repair_locked(root, root_fd, entry_fd, relpath, options)
            finally:
                lock.release()
        finally:
            os.close(entry_fd)
    finally:
        os.close(root_fd)


def _lock(root: Path, relpath: str, timeout: float | None):
    """The entry's build lock, the one `kcache build` takes (.kcache/locks/, outside the entry)."""
    lock = EntryFlock(root, relpath)
    try:
        if lock.acquire(timeout=-1 if timeout is None else timeout):
            return lock
    except OSError as exc:
        raise KcacheError(f"cannot lock {lock.path}: {exc.strerror}") from None
    raise LockTimeout(f"another build of {relpath} still holds its lock ({lock.path}){lock.holder()} after "
                      f"{timeout:g}s (--lock-timeout to wait longer)")


def _repair_locked(root: Path, root_fd: int, entry_fd: int, relpath: str, options: RepairOptions) -> RepairResult:

    path = str(root / relpath)
    busy = builder().busy(path)
    if busy:
        raise KcacheError(f"{busy}: not repaired while it compiles")
    source = _source_name(entry_fd, relpath)
    problem = lib_problem(entry_fd, "cuda" if source.endswith(".cu") else "cpu", options.arch)
    if problem is None and not options.force:  # compile.sh is not even read
        return RepairResult(relpath, path, FINE, f"{BINARY} looks whole (--force rebuilds it)")
    try:
        fd, st = fsread.open_regular(SCRIPT, dir_fd=entry_fd)
        text = fsread.read_open(fd, st, MAX_SCRIPT, True, SCRIPT).decode("utf-8", "replace")
    except OSError as exc:
        raise Refused(f"{relpath}/{SCRIPT}: cannot be read ({exc.strerror or exc})") from None
    _check_owner(st, relpath, SCRIPT)
    allowed = [p for p in (options.nvcc, options.cxx) if p]
    argv, target = parse_script(text, relpath, source, allowed)
    argv[0] = compiler_for(argv[0], options)
    if options.arch and target == "cuda":
        n = check_arch(options.arch)[len("sm_"):]
        argv += ["-gencode", f"arch=compute_{n},code=sm_{n}"]
    return _compile(root, root_fd, entry_fd, relpath, source, [*argv, source, "-o", BINARY],
                    problem or "--force")


def _source_name(entry_fd: int, relpath: str) -> str:
    for name in SOURCES:
        try:
            os.stat(name, dir_fd=entry_fd, follow_symlinks=False)
            return name
        except FileNotFoundError:
            continue
    raise Refused(f"{relpath}: no {' or '.join(SOURCES)} to rebuild {BINARY} from")


def _compile(root: Path, root_fd: int, entry_fd: int, relpath: str, source: str, argv: list[str],
             reason: str) -> RepairResult:

    op_rel, _, h = relpath.rpartition("/")
    op_fd = fswrite.open_dir(root_fd, op_rel)
    try:
        tmp = make_temp(op_fd, op_rel, h)
        try:
            _copy_source(entry_fd, tmp.fd, relpath, source)
            start = time.perf_counter()
            try:
                proc = subprocess.run(argv, cwd=tmp.cwd(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, shell=False, timeout=3600)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise KcacheError(f"cannot run {argv[0]}: {getattr(exc, 'strerror', None) or exc}") from None
            elapsed = time.perf_counter() - start
            output = proc.stdout.decode("utf-8", "replace")
            command = shlex.join(argv)
            if proc.returncode != 0 or lib_problem(tmp.fd, "cpu", None) is not None:
                return RepairResult(relpath, str(root / relpath), FAILED, reason, command, elapsed, output,
                                    f"compile failed (exit status {proc.returncode}): {BINARY} left as it was")
            _fsync(tmp.fd, root_fd)
            fswrite.rename_at(tmp.fd, BINARY, entry_fd, BINARY)  # only lib.so changes in the entry
            os.fsync(entry_fd)
            return RepairResult(relpath, str(root / relpath), REPAIRED, reason, command, elapsed, output)
        finally:
            os.close(tmp.fd)
            discard_temp(root, f"{op_rel}/{tmp.name}")
    finally:
        os.close(op_fd)


def _copy_source(entry_fd: int, tmp_fd: int, relpath: str, source: str) -> None:
    """The entry's own source into the temp directory: a regular file, never through a link or a FIFO."""
    try:
        fd, st = fsread.open_regular(source, dir_fd=entry_fd)
    except OSError as exc:
        kind = getattr(exc, "kind", None) if isinstance(exc, fsread.NotRegularFile) else None
        raise Refused(f"{relpath}/{source}: {kind or exc.strerror or exc}, not compiled") from None
    try:
        _check_owner(st, relpath, source)
        fswrite.write_file(tmp_fd, source, iter(lambda: os.read(fd, 1 << 20), b""), 0o600)
    finally:
        fsread.close_read(fd)


def _check_owner(st: os.stat_result, relpath: str, name: str) -> None:
    """Refused unless the file is this user's or root's: the compiler runs with this user's rights, and a
    source's `#include "/etc/shadow"` or `.incbin` (or compile.sh's -I) reads what this user may read into
    a lib.so the cache's group then reads. Root's cron repairing a member's entry would leak root's files."""
    if st.st_uid not in (os.geteuid(), 0):
        raise Refused(f"{relpath}/{name} is uid {st.st_uid}'s: kcache compiles only your own or root's sources "
                      f"(the compiler would read what you may read for them); repair it as uid {st.st_uid}")


def _fsync(dir_fd: int, root_fd: int) -> None:
    """The new lib.so made durable, and root's given to the owner of a user's cache (fswrite.give_to)."""
    fd, _ = fsread.open_regular(BINARY, dir_fd=dir_fd)
    try:
        fswrite.give_to(fd, fswrite.owner_for(os.fstat(root_fd)))
        os.fsync(fd)
    finally:
        fsread.close_read(fd)
