"""The `kcache` command: global options, command registration, and the one place where errors
become `Error: ...` and an exit status."""

import atexit
import gc
import inspect
import os
import re
import sys
import traceback
from importlib import import_module
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup, TyperOption

from kcache_cli import __version__
from kcache_cli.cli import options, typer_compat
from kcache_cli.cli.options import GlobalOptions, plain_output, settings
from kcache_cli.model.terms import LAYOUT_NAMES
from kcache_cli.remote.redact import redact_text
from kcache_cli.util import interrupts, jsonout
from kcache_cli.util.errors import KcacheError
from kcache_cli.util.interrupts import TermAsInterrupt
from kcache_cli.util.lazy import lazy_module
from kcache_cli.util.textsafe import printable, printable_line

shlex = lazy_module("shlex")  # a TAB's line only: not a cost of every start


def _set_global(name: str):
    def callback(ctx: typer.Context, param, value) -> None:
        if value:
            setattr(settings(ctx), name, value)

    return callback


# (option names, GlobalOptions field, is a flag, metavar, help)
_GLOBAL_OPTIONS = ((("--cache-dir",), "cache_dir", False, "PATH", "Cache root (a global option)."),
                   (("--json",), "json", True, None, "Machine-readable JSON on stdout (a global option)."),
                   (("-q", "--quiet"), "quiet", True, None,
                    "No notes or progress on stderr, only warnings and errors (a global option)."),
                   (("--debug",), "debug", True, None, "Show tracebacks for errors (a global option)."))


def add_global_options(cmd) -> None:
    """Give `cmd` a hidden copy of each global option it does not declare itself, so that
    `kcache ls -q` works like `kcache -q ls`; number options read ASCII decimals only."""
    for p in cmd.params:
        typer_compat.ascii_numbers(p)
    for sub in getattr(cmd, "commands", {}).values():  # `kcache remote ls --limit ...`
        for p in sub.params:
            typer_compat.ascii_numbers(p)
    for p in cmd.params:
        if getattr(p, "param_type_name", "") == "argument" and p.metavar and not hasattr(p, "_kcache_metavar"):
            typer_compat.plain_metavar(p)
            p._kcache_metavar = True
    declared = {o for p in cmd.params for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))}
    for decls, name, flag, metavar, help_text in _GLOBAL_OPTIONS:
        if declared.isdisjoint(decls):
            cmd.params.append(TyperOption(param_decls=list(decls), is_flag=flag or None,
                                          default=False if flag else None, metavar=metavar, hidden=True,
                                          expose_value=False, callback=_set_global(name), help=help_text))


def _reflow(text: str) -> str:
    """Paragraphs as one line each: Rich keeps a docstring's line breaks, and Click rewraps anyway."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def tidy_help(cmd, rich: bool) -> None:
    """Help that reads well in both renderings, for `cmd` and the commands below it: paragraphs that
    reflow, a one-line summary (the first paragraph) in the commands panel, and, under Rich markup,
    brackets escaped so that `[all]` is shown rather than taken for a style."""
    escape = (lambda s: re.sub(r"(?<!\\)\[", r"\\[", s)) if rich else (lambda s: s)
    if not getattr(cmd, "_kcache_tidy", False) and cmd.help:
        text = _reflow(cmd.help)
        cmd.help = escape(text)
        cmd.short_help = escape(text.split("\n\n", 1)[0])
        for p in cmd.params:
            if getattr(p, "help", None):
                p.help = escape(p.help)
        cmd._kcache_tidy = True
    for sub in getattr(cmd, "commands", {}).values():
        tidy_help(sub, rich)


class Interrupted(Exception):
    """Ctrl-C that reached the command's top: Typer would turn the KeyboardInterrupt into a silent exit 130;
    main says `Error: interrupted` instead (a command that knows what it did says more, itself)."""


class PipeClosed(Exception):
    """stdout's reader went away (`kcache stats | head -1`): not an OSError, so that Click, which turns
    EPIPE into exit 1, lets it through to main, which exits 0 as `ls`, `cat` and `grep` do."""


class KcacheGroup(TyperGroup):
    """Global options also work after the subcommand, for every command, including ones registered later."""

    def get_command(self, ctx, cmd_name):
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            add_global_options(cmd)
            tidy_help(cmd, getattr(self, "rich_markup_mode", None) is not None)
        return cmd

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            raise PipeClosed() from exc
        except KeyboardInterrupt as exc:
            raise Interrupted() from exc


app = typer.Typer(
    name="kcache",
    help="See into, build, clean and ship the on-disk caches of compiled GPU and CPU kernels "
    f"({', '.join(LAYOUT_NAMES)}).\n\nExample: kcache ls --op matmul",
    no_args_is_help=True,
    cls=KcacheGroup,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_RICH_MARKUP = app.rich_markup_mode
typer_compat.warn_if_untested()
typer_compat.help_fits_narrow_terminals()  # plain help wraps to the terminal down to 40 columns
typer_compat.rich_help_folds_words()  # and the coloured help folds a word there, never cuts it


def _version(ctx: typer.Context, value: bool) -> None:
    if value and not ctx.resilient_parsing:  # not while the shell is completing a command line
        sys.stdout.write(f"kcache {__version__}\n")
        raise typer.Exit()


@app.callback()
def main_options(
    ctx: typer.Context,
    cache_dir: Annotated[Optional[str], typer.Option(
        "--cache-dir", metavar="PATH", help="Cache root. Default: KCACHE_DIR, else every kernel cache "
        "found by the compilers' own rules (kcache dir --all), or the one the current directory lies in; "
        "build writes into hidet's.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="No notes or progress on stderr, only warnings and "
                                        "errors; import and export print nothing when they work, prune and "
                                        "clear nothing when they remove nothing (cron mails nothing).")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    ctx.obj = GlobalOptions(cache_dir=cache_dir, json=json_out, quiet=quiet, debug=debug)


# Each command, and the module of cli/ that declares it, in the order help lists them. A run loads only
# the module of the command it names (the engines come with it); help, completion and a name kcache does
# not know load them all.
COMMANDS: dict[str, str] = {
    "dir": "cmd_read", "ls": "cmd_read", "inspect": "cmd_read", "log": "cmd_read", "stats": "cmd_read",
    "build": "cmd_build", "prune": "cmd_delete", "clear": "cmd_delete", "export": "cmd_archive",
    "import": "cmd_archive", "verify": "cmd_archive", "push": "cmd_remote", "pull": "cmd_remote",
    "diff": "cmd_diff", "explain": "cmd_explain", "remote": "cmd_remote", "config": "cmd_config",
}
_LOADED: set[str] = set()


def load(modules) -> typer.Typer:
    """`app` with the commands of `modules` (names in cli/) registered, each module once, in help's order."""
    for name in dict.fromkeys(modules):
        if name not in _LOADED:
            import_module(f"kcache_cli.cli.{name}").register(app)
            _LOADED.add(name)
    order = list(COMMANDS)
    app.registered_commands.sort(key=lambda ci: order.index(ci.name) if ci.name in order else len(order))
    app.registered_groups.sort(key=lambda gi: order.index(gi.name) if gi.name in order else len(order))
    return app


def full_app() -> typer.Typer:
    """`app` with every command registered (help, completion, the generated docs)."""
    return load(COMMANDS.values())


def _subcommand(args: list[str]) -> str | None:
    """The command named on the line (skipping global options and --cache-dir's value), or None."""
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a == "--cache-dir":
            skip = True
        elif a == "--" or not a.startswith("-"):
            return None if a == "--" else a
        elif a in ("-h", "--help", "--version") or a.startswith("--install-completion") \
                or a.startswith("--show-completion"):
            return None
    return None


def app_for(args: list[str]) -> typer.Typer:
    """The app to run `args` with. Typer inspects the signature of every registered command at each
    start, and a command's module loads the engines it uses: a line that names one command gets an app
    holding just that one, which parses and behaves the same. Help, completion and unknown names get
    the full app; `--version` an app with no command (its eager callback prints and exits)."""
    if any(k.startswith("_KCACHE_COMPLETE") for k in os.environ):
        return _completing_app()
    name = _subcommand(args)
    if name is None:
        if _version_only(args):  # --version acts before any command runs: none is needed
            return typer_compat.app_holding(app, [], [])
        return full_app()
    if name not in COMMANDS:
        return full_app()
    load([COMMANDS[name]])
    chosen = [ci for ci in app.registered_commands if ci.name == name]
    if len(chosen) != 1:  # a group (remote, config): the app as loaded
        return app
    return typer_compat.app_holding(app, chosen)


def _completing_app() -> typer.Typer:
    """The app a TAB completes with: the module of the command the line names (bash's COMP_WORDS, or
    the line zsh, fish and PowerShell pass in _TYPER_COMPLETE_ARGS), the whole app while the command's
    own name is being typed."""
    line = os.environ.get("COMP_WORDS") or os.environ.get("_TYPER_COMPLETE_ARGS") or ""
    try:
        words = shlex.split(line)[1:]
    except ValueError:  # an open quote: Typer copes, the whole app it is
        return full_app()
    typing_word = not line.endswith(" ") and words
    name = _subcommand(words[:-1] if typing_word else words)
    if name not in COMMANDS:
        return full_app()
    return load([COMMANDS[name]])


def _version_only(args: list[str]) -> bool:
    """`--version` before any command, help or completion option (its eager callback prints and exits)."""
    for a in args:
        if a == "--version":
            return True
        if a in ("-h", "--help", "--") or not a.startswith("-") or "completion" in a:
            return False
    return False


def _pipe_closed() -> None:
    """Exit 0 when stdout's reader has gone: nothing more can be said, and nothing is wrong. stdout is
    pointed at /dev/null first, so that the interpreter's last flush does not fail again; so is stderr
    when its reader has gone too (`kcache ls 2>&1 | head -1`), else that flush makes the exit 120."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        try:
            sys.stderr.flush()
        except BrokenPipeError:
            os.dup2(devnull, sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (tests): nothing to flush later
        pass
    sys.exit(0)


def _fail(message: str, code: int, as_json: bool, trace: bool = False) -> None:
    """The one way a failure ends the run: `Error: ...` on stderr, and under --json also
    {"error": ..., "exit": N} on stdout (a script reading stdout sees why) unless the command's result
    is there already (it says what failed), then exit `code`."""
    message = redact_text(message)
    if trace:  # --debug: the traceback first (the exit status stays the same)
        _write_traceback()
    sys.stderr.write(f"Error: {printable_line(message)}\n")
    if as_json and not options.json_written:  # stdout holds one JSON document: the result, or this

        try:
            doc = {"schema": options.schema_id("error"), "error": message, "exit": code}
            sys.stdout.flush()
            sys.stdout.buffer.write(jsonout.encode(doc) + b"\n")
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            _pipe_closed()
    sys.exit(code)


def _write_traceback() -> None:
    """--debug's traceback of the exception being handled: no password (a remote's URL), and what a remote
    or a cache put in its messages shown escaped, as the Error line shows it (a registry's ESC bytes)."""

    sys.stderr.write(printable(redact_text(traceback.format_exc())))


def _release_roots() -> None:
    """The roots the command vetted and held (fsread.hold_root), closed: main runs many times in tests.
    First, what the command's reads of other users' files moved is noted in them (fs/readmarks.py)."""
    readmarks = sys.modules.get("kcache_cli.fs.readmarks")
    if readmarks is not None:
        readmarks.save_all()
        _say_unnoted(readmarks.UNNOTED)
    fsread = sys.modules.get("kcache_cli.fs.read")
    if fsread is not None:
        fsread.release_roots()


def _say_unnoted(unnoted: dict[str, int]) -> None:
    """A reader who could keep no note of what its reads moved (readmarks.UNNOTED) is told so, once per
    cache: a prune by age or least recent use now takes those files as just used."""
    said, opts = dict(unnoted), options.current or options.GlobalOptions()
    unnoted.clear()
    if not said or opts.silent:
        return
    from kcache_cli.cli.common import warn
    from kcache_cli.util.units import plural

    for root, count in sorted(said.items()):
        warn(opts, f"reading {root.rstrip('/')} moved the last use of {plural(count, 'file')}, "
                   "and you cannot write it to note that: a prune by age or least recent use now takes them "
                   "as just used (read it as its owner or as a member of its group)")


def run() -> None:
    """The console script and `python -m kcache_cli`: main(), then the process ends at once (_exit_now).
    Where that cannot be, every object still alive is moved out of the cyclic collector's reach (gc.freeze):
    Python collects again while it exits, walking each object a command left alive (a scan's entries, the
    index's records) only to free memory that goes with the process anyway. Tests call main() itself, many
    times in one process."""
    try:
        main()
    except SystemExit as exc:
        _exit_now(exc.code)
        raise
    else:
        _exit_now(0)
    finally:
        gc.freeze()


def _exit_now(code: object) -> None:
    """End the process with `code` as the interpreter's exit would, without its teardown: the exit
    handlers run and the standard streams are flushed, then os._exit. The teardown clears every module
    and frees what they hold, one object at a time, for memory that goes with the process anyway: 4-5 ms
    of every command (`--version` 54 -> 50 ms); kcache keeps no buffered file but the standard streams (it
    writes through descriptors). Returns, for the interpreter's own exit, when that would do more: a
    status that is not a number (printed), a thread it would wait for, a flush that fails (a closed pipe:
    its own message and status, as before)."""
    if code is None:
        code = 0
    if type(code) is not int or not 0 <= code <= 255:
        return
    threading = sys.modules.get("threading")
    if threading is not None and any(not t.daemon for t in threading.enumerate()
                                     if t is not threading.main_thread()):
        return
    atexit._run_exitfuncs()  # each handler once: run, they are unregistered
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        return
    os._exit(code)


def _interrupted_first(as_json: bool, debug: bool) -> None:
    """An unexpected error after a signal told the command to stop is that interrupt (`Error: interrupted`,
    128 + the signal): C code may swallow what the handler raised, and the import machinery does when it
    runs a lazy module's code (util/lazy.py), leaving the module half run for the next `from X import Y`.
    (A KcacheError says more, itself: prune's "interrupted: removed X of Y entries".)"""
    if interrupts.taken():
        _fail("interrupted", interrupts.exit_status(), as_json, debug)


def _aborted(exc: BaseException) -> tuple[str, int]:
    """What a prompt's Abort was: Ctrl-C (or SIGTERM as one) at it is an interrupt, the end of input not."""
    if isinstance(exc.__context__, KeyboardInterrupt):
        return "interrupted", interrupts.exit_status()
    return "aborted", 1


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, turn errors into one line and an exit status."""
    args = sys.argv[1:] if argv is None else argv
    ours = args[:args.index("--")] if "--" in args else args  # not a compiler flag after `--`
    debug, as_json = "--debug" in ours, "--json" in ours

    options.start_command()  # (main runs more than once in one process in tests)
    # A scan keeps a few objects per entry alive to the end: with the default thresholds, the cyclic
    # collector walks all of them again every few thousand entries (a sixth of a 100,000-entry scan).
    # What kcache makes is almost free of cycles; collecting them 140 times less often costs no memory
    # to speak of. Forked workers inherit it.
    gc.set_threshold(100_000, 50, 100)
    # Help text without box drawing or colour when stdout is not a terminal or NO_COLOR is set.
    app.rich_markup_mode = None if plain_output() else _RICH_MARKUP
    interrupts.forget()
    try:  # SIGTERM and SIGHUP unwind every command as Ctrl-C does (temps removed, locks let go)
        with typer_compat.shell_named(args), TermAsInterrupt():
            rc = app_for(args)(args=args, prog_name="kcache", standalone_mode=False)
    except KcacheError as exc:
        if debug:  # the traceback (no password, escaped), and the same exit status as without --debug
            _write_traceback()
        _fail(str(exc), exc.exit_code, as_json)
    except typer.Abort as exc:
        _fail(*_aborted(exc), as_json)
    except (KeyboardInterrupt, Interrupted):
        _fail("interrupted", interrupts.exit_status(), as_json, debug)
    except (BrokenPipeError, PipeClosed):
        _pipe_closed()
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, no traceback
        from kcache_cli.cli.errors import (
            describe_exception,
            is_usage_error,
            no_args_help,
        )

        _interrupted_first(as_json, debug)
        if debug and not is_usage_error(exc):
            _write_traceback()
        help_text = no_args_help(exc)
        if help_text is not None:  # bare `kcache` (or `kcache remote`): the help, on stdout, as --help
            sys.stdout.write(help_text)
            sys.exit(0)
        message, code = describe_exception(exc)
        _fail(message, code, as_json)
    finally:
        _release_roots()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _pipe_closed()
    sys.exit(rc if isinstance(rc, int) else 0)
