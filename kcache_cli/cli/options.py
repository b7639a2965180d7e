"""The global options and what start-up needs of the command line: the options object, the JSON schema
names, and whether output is plain. Light: `kcache --version` loads this and no command module."""

from __future__ import annotations

import os
import re
import sys
from typing import Annotated, Any, Optional

import typer


class GlobalOptions:
    """The global options, merged with a command's own --cache-dir/--json (a plain class: no
    dataclass machinery on the start-up path)."""

    def __init__(self, cache_dir: Optional[str] = None, json: bool = False, quiet: bool = False,
                 debug: bool = False) -> None:
        self.cache_dir, self.json, self.quiet, self.debug = cache_dir, json, quiet, debug
        # -q drops notes and progress; `silent` (ls -q/--null: paths only) drops warnings too, never errors
        self.silent = False
        self.lock_timeout: float | None = None  # a command's checked --lock-timeout, where it has one
        self.many = False  # the scope is every cache found (cache_locations), not one root
        self.command = ""  # the command's name in JSON schemas ("ls", "remote-ls"), set by use()


def settings(ctx: typer.Context) -> GlobalOptions:
    global current
    root_ctx = ctx.find_root()
    if not isinstance(root_ctx.obj, GlobalOptions):
        root_ctx.obj = GlobalOptions()
    current = root_ctx.obj
    return root_ctx.obj


current: GlobalOptions | None = None  # the running command's (what is said after it ends: app._release_roots)


# Options accepted both before and after the subcommand (`kcache --json ls` == `kcache ls --json`).
CacheDirOpt = Annotated[Optional[str], typer.Option(
    "--cache-dir", metavar="PATH", envvar=None,
    help="Cache root (default: KCACHE_DIR, then every cache found; see kcache --help).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]

# The commands that scan caches (ls, stats, prune, clear) answer unchanged entries from the index.
NoIndexOpt = Annotated[bool, typer.Option(
    "--no-index", help="Judge every entry again instead of answering from the index of unchanged entries "
                       "(.kcache/index/; the answer is the same).")]


def use(ctx: typer.Context, cache_dir: Optional[str] = None, as_json: bool = False) -> GlobalOptions:
    """Merge a command's own --cache-dir/--json into the global options."""
    opts = settings(ctx)
    opts.command = command_name(ctx)
    if cache_dir is not None:  # "" too: refused by resolve_cache_dir, never the default cache
        opts.cache_dir = cache_dir
    if as_json:
        opts.json = True
    return opts


SCHEMA_VERSION = 1  # of every command's --json document (kcache_cli/schemas/<command>.json)


def command_name(ctx: typer.Context) -> str:
    """The command as its JSON schema names it: `ls`, `remote-ls` (the words after `kcache`, joined by -)."""
    words: list[str] = []
    at: Any = ctx
    while at.parent is not None:
        words.insert(0, at.info_name or "")
        at = at.parent
    return "-".join(w for w in words if w)


def schema_id(command: str) -> str:
    """The `schema` every --json document starts with: kcache/<command>/<version>."""
    return f"kcache/{command}/{SCHEMA_VERSION}"


def no_color() -> bool:
    """NO_COLOR (https://no-color.org, any non-empty value) or a dumb terminal: no ANSI escapes at all."""
    return bool(os.environ.get("NO_COLOR")) or os.environ.get("TERM") == "dumb"


def plain_output() -> bool:
    """Plain text on stdout (no colour, no box drawing): when it is not a terminal, or colour is off."""
    return no_color() or not sys.stdout.isatty()


# A terminal that reports fewer columns has not said its width: 0 under `docker run -t`, `docker exec -t`,
# `script` and some CI runners. What it says then is taken as shutil takes 0: COLUMNS, else 80.
TERMINAL_MIN = 20
FALLBACK_WIDTH = 80


def columns_asked() -> int | None:
    """COLUMNS when it names a width (ASCII digits, not 0: not "٣", nor 5,000 digits), else None."""
    value = os.environ.get("COLUMNS", "")
    if re.fullmatch(r"[0-9]{1,5}", value, re.ASCII) and int(value) > 0:
        return int(value)
    return None


def terminal_width(stream: Any) -> int:
    """The columns output on `stream` is fitted to: COLUMNS when set, else the terminal's when it reports a
    usable width (TERMINAL_MIN or more), else FALLBACK_WIDTH (a pipe, or a terminal that says 0)."""
    asked = columns_asked()
    if asked is not None:
        return asked
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):  # not a terminal, or not a real file (tests)
        columns = 0
    return columns if columns >= TERMINAL_MIN else FALLBACK_WIDTH


json_written = False  # a command's JSON result is on stdout: an error after it is said on stderr only

# What a command made that lives to its end (a scan's entries, its JSON document), kept here to the exit
# (keep_to_exit): freed one object at a time as the command returns, they cost a listing of 100,000 hidet
# entries 40 ms and one of 20,000 Triton kernels 6 ms, for memory the process's exit (app._exit_now) gives
# back at once. main() lets go of the last command's (tests run many commands in one process).
kept_to_exit: list = []


def keep_to_exit(obj: Any) -> None:
    kept_to_exit.append(obj)


def start_command() -> None:
    """A command starts (main): no JSON written yet, nothing of a command before it kept."""
    global json_written
    json_written = False
    kept_to_exit.clear()
