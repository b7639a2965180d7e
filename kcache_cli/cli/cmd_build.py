"""`kcache build`: compile tasks into the cache ahead of time.

No `from __future__ import annotations` here: Typer would have to evaluate every annotation
string with get_type_hints on each start of kcache, about 3 ms for this command's options."""

import os
import re
import sys
import threading
from typing import TYPE_CHECKING, Annotated, Any, List, Optional

import typer
from typer.core import TyperCommand

from kcache_cli.cli import common as c
from kcache_cli.cli import options as o
from kcache_cli.cli.table import Column
from kcache_cli.cli.progress import Bar
from kcache_cli.util.errors import KcacheError, UsageError
from kcache_cli.util.lazy import lazy_module

if TYPE_CHECKING:  # the real imports, for mypy; at run time each loads at its first use
    from kcache_cli.ops import build as b
    from kcache_cli.ops import repair as r
    from kcache_cli.remote import build, store
    from kcache_cli.util import suggest
else:
    suggest = lazy_module("kcache_cli.util.suggest")
    build = lazy_module("kcache_cli.remote.build")
    store = lazy_module("kcache_cli.remote.store")
    b = lazy_module("kcache_cli.ops.build")
    r = lazy_module("kcache_cli.ops.repair")

EXTRA_KEY = "kcache.extra_flags"


class _BuildCommand(TyperCommand):
    """Everything after `--` is compiler flags, not task files."""

    def parse_args(self, ctx, args):
        if "--" in args:
            i = args.index("--")
            ctx.meta[EXTRA_KEY] = list(args[i + 1:])
            args = args[:i]
        return super().parse_args(ctx, args)


def register(app: typer.Typer) -> None:
    app.command("build", cls=_BuildCommand)(build_command)


TasksArg = Annotated[List[str], typer.Argument(
    metavar="TASK...", show_default=False,
    help="task.txt files (hidet's task string), task directories, or directories of task directories.")]
SourceOpt = Annotated[Optional[str], typer.Option(
    "--source", metavar="PATH", help="The source to compile (one task only). Default: source.cu or "
    "source.cc next to the task file.")]
TargetOpt = Annotated[Optional[str], typer.Option(
    "--target", metavar="TARGET", help="cuda or cpu. Default: from the source's suffix "
    "(.cu: cuda, .cc/.cpp: cpu).", autocompletion=c.complete.complete_build_target)]
SpaceOpt = Annotated[str, typer.Option(
    "--space", metavar="SPACE", help="hidet's search-space level, 0, 1 or 2, or the space's name "
    "(cuda_space_2): the entry goes to ops/<target>_space_<N>/.", autocompletion=c.complete.complete_build_space)]
ArchOpt = Annotated[Optional[str], typer.Option(
    "--arch", metavar="ARCH", help="CUDA arch, e.g. sm_90. Default: the local GPU's (nvidia-smi), else "
    "nvcc's own default (sm_75 for nvcc 13). Always recorded in the entry's kcache.json.")]
NvccOpt = Annotated[Optional[str], typer.Option(
    "--nvcc", metavar="PATH", envvar="KCACHE_NVCC", help="The nvcc to use. Default: nvcc on PATH.")]
CxxOpt = Annotated[Optional[str], typer.Option(
    "--cxx", metavar="PATH", envvar="CXX", help="The C++ compiler for cpu tasks. Default: g++ on PATH.")]
IncludeOpt = Annotated[Optional[List[str]], typer.Option(
    "-I", "--include", metavar="DIR", help="Include directory for the compiler (repeatable).")]
JobsOpt = Annotated[int, typer.Option("-j", "--jobs", metavar="N", min=0,
                                      help="Build N tasks at a time (0: one per core).")]
ForceOpt = Annotated[bool, typer.Option(
    "--force", help="Rebuild even when a complete entry exists (replaced atomically).")]
RepairOpt = Annotated[bool, typer.Option(
    "--repair", help="TASK... are hash prefixes of hidet op entries: rebuild each one's lib.so in place when it "
    "is missing, truncated or lacks --arch (--force: always), from the entry's own source and the command in "
    "its compile.sh (never run by a shell; only a known compiler, hidet's flags and the entry's own source are "
    "accepted); hidet's metadata files are kept.")]
BUILD_WAIT = 3600.0  # seconds a build waits for another build of the same entry (a default deadline)
LockTimeoutOpt = Annotated[Optional[str], c.lock_timeout_option("another build of the same entry", f"{BUILD_WAIT:g}")]
RemoteOpt = Annotated[Optional[str], typer.Option(
    "--remote", metavar="URL", envvar="KCACHE_REMOTE", show_envvar=False,
    help="Share builds through this remote (redis://host:port/db, rediss://..., file:///dir; default: "
    "KCACHE_REMOTE): a local hit is done, a remote hit is pulled, a miss is compiled and pushed. A remote "
    "that is down or slow is a warning, never a failed build.")]
NoRemoteOpt = Annotated[bool, typer.Option("--no-remote", help="Ignore KCACHE_REMOTE.")]
RemoteTimeoutOpt = Annotated[float, typer.Option(
    "--remote-timeout", metavar="SECONDS", callback=lambda v: _remote_seconds(v),
    help="How long the remote part of the build (asking, pulling, pushing, for all tasks) may take in all; "
    "past it the build goes on without the remote (0.1 to 604800).")]


def _remote_seconds(value: float) -> float:
    return store.check_timeout(value, "--remote-timeout")


def build_command(
    ctx: typer.Context,
    tasks: TasksArg,
    source: SourceOpt = None,
    target: TargetOpt = None,
    space: SpaceOpt = "0",
    arch: ArchOpt = None,
    nvcc: NvccOpt = None,
    cxx: CxxOpt = None,
    include: IncludeOpt = None,
    jobs: JobsOpt = 1,
    force: ForceOpt = False,
    repair: RepairOpt = False,
    lock_timeout: LockTimeoutOpt = None,
    timeout: c.OldTimeoutOpt = None,
    remote: RemoteOpt = None,
    no_remote: NoRemoteOpt = False,
    remote_timeout: RemoteTimeoutOpt = 10.0,
    cache_dir: o.CacheDirOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """Compile hidet kernels into the cache ahead of time.

    Compiles task.txt + source.cu/.cc into ops/<target>_space_<N>/<op>/<hash>/, or find it there.

    The hash is sha256 of task.txt's exact bytes (first 16 hex digits), the op its `name:` field.
    The cache is one root: --cache-dir or KCACHE_DIR, else hidet's (hidet.toml cache_dir,
    <git root>/.hidet_cache, ~/.cache/hidet), never the others `ls` shows.
    A complete entry is a hit: its path is printed and nothing changes. Otherwise the build
    compiles in a temp directory and publishes the entry with one rename: nvcc -shared
    -Xcompiler -fPIC -O3 -arch=ARCH, or g++ -shared -fPIC -O3, plus -I directories and the
    flags after `--` (they run inside the entry's directory: give paths in them absolute).
    An entry built for another arch is an error (--force rebuilds it). Several tasks: -j N,
    a progress bar on stderr, one row each and a summary on stdout; exit 1 if any failed.
    hidet 0.6 and later compile the entries build makes again in place (they lack version.txt,
    meta.json and func_types.pickle): where one is installed, build says so.

    Example: kcache build task.txt --arch sm_90 -- -lineinfo
    """
    opts = o.use(ctx, cache_dir, as_json)
    wait = c.lock_timeout(lock_timeout, BUILD_WAIT, old=timeout)
    extra = tuple(ctx.meta.get(EXTRA_KEY) or ())
    if arch:
        b.check_arch(arch)
    if repair:
        return _repair(opts, tasks, _repair_options(nvcc, cxx, arch, force, wait), bool(extra or source or include))
    options = _build_options(space, target, arch, nvcc, cxx, include, extra, force, wait)
    paths = b.find_tasks(tasks)
    if source is not None and len(paths) != 1:
        raise UsageError(f"--source needs exactly one task ({len(paths)} given)")
    root = c.cache_root(opts)
    show = sys.stderr.isatty() and not opts.quiet
    listener = _Listener(opts, len(paths), show)
    builder = _remote_builder(opts, remote, remote_timeout) if remote and not no_remote else b.build_task

    if len(paths) == 1 and not opts.json:
        return _build_one(opts, root, paths[0], options, source, listener, builder)
    _build_many(opts, root, paths, options, source, jobs, listener, builder)


def _build_many(opts: o.GlobalOptions, root, paths, options, source, jobs: int, listener, builder) -> None:
    """Several tasks (or one under --json): built -j at a time, one row each and a summary."""
    tasks_to_build = [b.load_task(paths[0], options, source)] if source is not None else paths
    try:
        results = b.build_tasks(root, tasks_to_build, options, jobs=jobs or os.cpu_count() or 1, listener=listener,
                                builder=builder)
    finally:
        listener.stop()
    _show_results(opts, results)


def _build_options(space: str, target: str | None, arch: str | None, nvcc: str | None, cxx: str | None,
                   include: List[str] | None, extra: tuple[str, ...], force: bool, wait: float | None):
    """The build's options from its command line: space and target checked, the extra flags too."""
    level, target = _space_level(space, target)
    if target is not None and target not in b.TARGETS:
        raise suggest.unknown_choice("target", target, b.TARGETS)
    b.check_extra_flags(extra)
    return b.BuildOptions(space=level, target=target, arch=arch, nvcc=nvcc, cxx=cxx,
                          include_dirs=tuple(include or ()), extra_flags=extra, force=force, timeout=wait)


def _repair_options(nvcc, cxx, arch, force, wait):
    return r.RepairOptions(nvcc=nvcc, cxx=cxx, arch=arch, force=force, timeout=wait)


def _repair(opts: o.GlobalOptions, prefixes: List[str], options, other_inputs: bool) -> None:
    """`build --repair HASH_PREFIX...`: one row per entry (repaired, fine, failed) and a summary, or the JSON."""
    if other_inputs:
        raise UsageError("--repair takes the compile command from each entry's compile.sh: no --source, -I or "
                         "flags after --")
    root = c.cache_root(opts)
    results = r.repair_entries(root, r.find_entries(root, prefixes), options)
    for res in results:
        if res.status == r.FAILED:
            c.warn(opts, f"{res.relpath}: {res.error}")
            if res.output:
                sys.stderr.write(c.printable(res.output))
    out = c.Output(opts)

    def human() -> None:
        rows = [[res.status, res.relpath, res.reason or (res.error or "")[:60]] for res in results]
        c.print_table(["status", "entry", "why"], rows,
                      styles={0: {"repaired": "green", "fine": "cyan", "failed": "bold red"}})
        out.text(", ".join(f"{counts[k]} {k}" for k in (r.REPAIRED, r.FINE, r.FAILED)))

    counts = {k: sum(res.status == k for res in results) for k in (r.REPAIRED, r.FINE, r.FAILED)}
    out.result({**counts, "entries": [res.to_json() for res in results]}, human)
    if any(res.status == r.FAILED for res in results):
        raise typer.Exit(1)


def _show_results(opts: o.GlobalOptions, results) -> None:
    """Failures and notes on stderr; a row per task and a summary (or the JSON) on stdout; the exit code."""
    for res in results:
        if res.status == b.FAILED:
            _show_failure(res)
        _notes(opts, res)
    _compiled_again(opts, results)
    out = c.Output(opts)

    def human() -> None:
        # the entry inside the cache (ops/<space>/<op>/<hash>), or the task file that failed
        rows = [[res.status, (res.relpath if res.status != b.FAILED else res.task) or ""] for res in results]
        c.print_table([Column("status", styles={"built": "green", "hit": "cyan", "failed": "bold red"}),
                       Column("entry or task", wrap=True)], rows)
        out.text(f"{b.count(results, b.BUILT)} built, {c.plural(b.count(results, b.HIT), 'hit')}, "
                 f"{b.count(results, b.FAILED)} failed")

    out.result(b.summary_json(results), human)
    code = b.exit_code(results)
    if code:
        raise typer.Exit(code)


def _build_one(opts: o.GlobalOptions, root, path: str, options, source: Optional[str], listener, builder) -> None:
    """One task: errors are one line (main() prints them); stdout is the entry's path."""
    try:
        result = builder(root, path, options, source=source, listener=listener)
    finally:
        listener.stop()
    _notes(opts, result)
    _compiled_again(opts, [result])
    if result.status == b.FAILED:
        _show_failure(result, header=False)  # main() prints the error line itself
        raise KcacheError(result.error)
    out = c.Output(opts)
    if result.status == b.BUILT:
        out.info(f"built {result.relpath} for {result.arch} in {result.elapsed:.1f}s"
                 + (f" (replaced a {result.replaced})" if result.replaced else ""))
    out.text(c.tty_safe(result.path))  # one task without --json: its entry's path is the result


def _space_level(space: str, target: Optional[str]) -> tuple[int, Optional[str]]:
    """`--space 2` or `--space cuda_space_2` (which also says the target) -> (2, target)."""
    m = re.fullmatch(r"(?:([a-z0-9]+)_space_)?(\d+)", space.strip())
    if not m or int(m.group(2)) not in b.SPACE_LEVELS:
        raise UsageError(f"bad space '{space}' for build (0, 1 or 2, or a name such as cuda_space_2)")
    named = m.group(1)
    if named and target is not None and named != target:
        raise UsageError(f"--space {space} is a {named} space but --target is {target}")
    return int(m.group(2)), named or target


def _remote_builder(opts: o.GlobalOptions, url: str, timeout: float):
    """build_task that consults the remote first and pushes what it compiles (kcache_cli.remote.build)."""
    budget = build.RemoteBudget(timeout)  # one for the whole command

    def builder(root, task, options, *, source=None, listener=None):
        return build.build_with_remote(root, task, options, url, source=source, listener=listener,
                                 warn=lambda m: c.warn(opts, m), budget=budget)

    return builder


def _notes(opts: o.GlobalOptions, result) -> None:
    for note in result.notes:
        c.warn(opts, note)


def _compiled_again(opts: o.GlobalOptions, results) -> None:
    """Once per run: the installed compiler compiles what this build made or found again in place."""
    said = b.compiled_again_warning(results)
    if said:
        c.warn(opts, said)


class _Listener:
    """Build events on stderr: a bar on a terminal (kcache_cli.cli.progress, started on the first
    compile, so that a hit never imports Rich), plain lines otherwise. Called from the building threads."""

    def __init__(self, opts: o.GlobalOptions, total: int, show: bool) -> None:
        self.opts, self.total, self.show = opts, total, show
        self.lock = threading.Lock()
        self.bar: Any = None
        self.active: dict[str, str] = {}
        self.finished = 0

    def _start(self) -> None:
        if self.bar is not None or not self.show:
            return

        self.bar = Bar(self.opts, "building", animate=True).__enter__()
        self.bar.start(self.total)
        self.bar.advance(self.finished)

    def _say(self, message: str) -> None:
        if self.opts.quiet:
            return
        if self.bar is not None:
            self.bar.print(c.printable(message))
        else:
            sys.stderr.write(c.printable(message) + "\n")
            sys.stderr.flush()

    def _describe(self) -> None:
        if self.bar is not None:
            names = c.printable_line(", ".join(sorted(set(self.active.values()))))
            self.bar.status(f"compiling {names}" if names else "building")

    def waiting(self, spec, holder: str) -> None:
        with self.lock:
            self._start()
            self._say(f"waiting: {holder} is building {spec.relpath} (its lock is held)")

    def compiling(self, spec) -> None:
        with self.lock:
            self._start()
            self.active[spec.relpath] = spec.op
            self._describe()

    def done(self, result) -> None:
        with self.lock:
            self.finished += 1
            if result.relpath:
                self.active.pop(result.relpath, None)
            if self.bar is not None:
                self.bar.advance(1)
                self._describe()

    def stop(self) -> None:
        with self.lock:
            if self.bar is not None:
                self.bar.__exit__(None, None, None)


def _show_failure(result, header: bool = True) -> None:
    """The failure on stderr: the error, the command, and the compiler output with the failing
    lines (and the source lines the compiler quotes under them) highlighted."""
    from rich.markup import escape

    con = c.stderr_console()
    if header:  # folded to the width, as warnings are (the compiler's own lines below are not)
        lines = c.fold_err(f"failed: {c.printable_line(result.task)}: {c.printable_line(result.error or '')}", 2)
        con.print(f"[bold red]failed:[/]{escape(lines[0][len('failed:'):])}", soft_wrap=True)
        for line in lines[1:]:
            con.print(escape(line), soft_wrap=True)
    if not result.output and not result.command:
        return
    if result.command:
        con.print(f"[dim]$ {escape(c.printable(result.command))}[/]", soft_wrap=True)
    quoting = False
    for line in c.printable(result.output or "").splitlines():  # a source line may quote an ESC
        kind = c.line_kind(line)
        if kind == "error":
            con.print(f"[bold red]{escape(line)}[/]", soft_wrap=True)
            quoting = True
        elif kind == "warning":
            con.print(f"[yellow]{escape(line)}[/]", soft_wrap=True)
            quoting = False
        elif quoting and (line.startswith((" ", "\t")) or line.strip() == "^"):
            con.print(f"[red]{escape(line)}[/]", soft_wrap=True)  # the quoted source line and its caret
        else:
            con.print(escape(line), soft_wrap=True)
            quoting = False
