"""What every command shares: global options, the cache root, filters, and output helpers.

Rich and humanize are imported inside the helpers that need them, to keep start-up fast."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from kcache_cli.cli import complete  # light: the TAB path imports nothing heavy
from kcache_cli.errors import UsageError
from kcache_cli.terms import KINDS, LAYOUT_NAMES, STATUSES


class GlobalOptions:
    """The global options, merged with a command's own --cache-dir/--json (a plain class: no
    dataclass machinery on the start-up path)."""

    def __init__(self, cache_dir: Optional[str] = None, json: bool = False, quiet: bool = False,
                 debug: bool = False) -> None:
        self.cache_dir, self.json, self.quiet, self.debug = cache_dir, json, quiet, debug


def settings(ctx: typer.Context) -> GlobalOptions:
    root_ctx = ctx.find_root()
    if not isinstance(root_ctx.obj, GlobalOptions):
        root_ctx.obj = GlobalOptions()
    return root_ctx.obj


# Options accepted both before and after the subcommand (`kcache --json ls` == `kcache ls --json`).
CacheDirOpt = Annotated[Optional[str], typer.Option("--cache-dir", metavar="PATH", envvar=None,
                                                    help="Cache root (default: KCACHE_DIR, then hidet's rule).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]


def use(ctx: typer.Context, cache_dir: Optional[str] = None, as_json: bool = False) -> GlobalOptions:
    """Merge a command's own --cache-dir/--json into the global options."""
    opts = settings(ctx)
    if cache_dir:
        opts.cache_dir = cache_dir
    if as_json:
        opts.json = True
    return opts


def cache_location(opts: GlobalOptions):
    from kcache_cli.locate import resolve_cache_dir

    return resolve_cache_dir(opts.cache_dir)


def cache_root(opts: GlobalOptions) -> Path:
    return cache_location(opts).path


# ---- filters -------------------------------------------------------------------------------------
OpOpt = Annotated[Optional[List[str]], typer.Option("--op", metavar="NAME", help="Only this op (repeatable).",
                                                    autocompletion=complete.complete_op)]
SpaceOpt = Annotated[Optional[List[str]], typer.Option(
    "--space", metavar="SPACE",
    help="Only this space, e.g. cuda_space_2, 0.1.15/linux-x86_64 or a Triton arch sm_90a (repeatable).",
    autocompletion=complete.complete_space)]
TargetOpt = Annotated[Optional[List[str]], typer.Option("--target", metavar="TARGET",
                                                        help="Only this target: cuda, cpu, hip (repeatable).",
                                                        autocompletion=complete.complete_target)]
LayoutOpt = Annotated[Optional[List[str]], typer.Option("--layout", metavar="LAYOUT",
                                                        help=f"Only this layout: {', '.join(LAYOUT_NAMES)} "
                                                             "(repeatable).",
                                                        autocompletion=complete.complete_layout)]
StatusOpt = Annotated[Optional[List[str]], typer.Option(
    "--status", metavar="STATUS", help="Only this status: complete, partial, failed, corrupt, building (repeatable).",
    autocompletion=complete.complete_status)]
KindOpt = Annotated[Optional[List[str]], typer.Option(
    "--kind", metavar="KIND", help="Only this kind: op, graph, ir_module, program, script, kernel, binary.",
    autocompletion=complete.complete_kind)]
HashesArg = Annotated[Optional[List[str]], typer.Argument(metavar="[HASH]...", help="Hash prefixes to keep.",
                                                          show_default=False, autocompletion=complete.complete_hash)]

_SPACE = re.compile(r"^[a-z0-9]+_space_\d+$|^[\w.+\-]+/[\w.+\-]+$|^[\w.+\-]+$")


def _checked(values: Optional[List[str]], allowed: tuple[str, ...] | None, what: str) -> tuple[str, ...]:
    out = []
    for v in values or ():
        for part in v.split(","):
            part = part.strip()
            if not part:
                continue
            if allowed is not None and part not in allowed:
                raise UsageError(f"unknown {what} '{part}' (choose from {', '.join(allowed)})")
            out.append(part)
    return tuple(out)


def make_filter(op=None, space=None, target=None, layout=None, status=None, kind=None, hashes=None):
    from kcache_cli.model import ScanFilter

    spaces = _checked(space, None, "space")
    for s in spaces:
        if not _SPACE.match(s) or any(part in (".", "..") for part in s.split("/")):
            raise UsageError(f"bad space '{s}' (expected e.g. cuda_space_0, cpu_space_2 or 0.1.15/linux-x86_64)")
    prefixes = _checked(hashes, None, "hash")
    for p in prefixes:
        if not re.fullmatch(r"[0-9a-zA-Z_\-]+", p):
            raise UsageError(f"bad hash prefix '{p}'")
    return ScanFilter(
        ops=_checked(op, None, "op"),
        spaces=spaces,
        targets=_checked(target, None, "target"),
        layouts=_checked(layout, LAYOUT_NAMES, "layout"),
        statuses=_checked(status, STATUSES, "status"),
        kinds=_checked(kind, KINDS, "kind"),
        hash_prefixes=prefixes,
    )


# ---- output --------------------------------------------------------------------------------------
def no_color() -> bool:
    """NO_COLOR (https://no-color.org, any non-empty value) or a dumb terminal: no ANSI escapes at all."""
    return bool(os.environ.get("NO_COLOR")) or os.environ.get("TERM") == "dumb"


def plain_output() -> bool:
    """Plain text on stdout (no colour, no box drawing): when it is not a terminal, or colour is off."""
    return no_color() or not sys.stdout.isatty()


def emit_json(data) -> None:
    """JSON on stdout, never through Rich; indented for people, compact for pipes."""
    import json

    indent = 2 if sys.stdout.isatty() else None
    sys.stdout.write(json.dumps(data, indent=indent) + "\n")


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, color_system=None if no_color() else "auto")


def stdout_console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=not sys.stdout.isatty(), color_system=None if no_color() else "auto")


def warn(opts: GlobalOptions, message: str) -> None:
    if not opts.quiet:
        sys.stderr.write(f"warning: {message}\n")


def info(opts: GlobalOptions, message: str) -> None:
    """A line for people on stderr (stdout stays data)."""
    if not opts.quiet:
        sys.stderr.write(message + "\n")


def human_size(n: int) -> str:
    from kcache_cli.units import format_size

    return format_size(n)


def human_age(ts: float) -> str:
    from kcache_cli.units import format_ago

    return format_ago(ts)


STATUS_STYLE = {"complete": "green", "partial": "yellow", "failed": "red", "corrupt": "bold red",
                "building": "cyan"}


def print_table(columns: list[str], rows: list[list[str]], styles: dict[int, dict[str, str]] | None = None,
                right: tuple[int, ...] = ()) -> None:
    """A Rich table on a terminal; plain aligned columns (grep- and awk-friendly) otherwise or under NO_COLOR."""
    if not plain_output():
        from rich import box
        from rich.table import Table

        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for i, c in enumerate(columns):
            table.add_column(c, justify="right" if i in right else "left", no_wrap=True)
        for row in rows:
            cells = []
            for i, cell in enumerate(row):
                style = (styles or {}).get(i, {}).get(cell)
                cells.append(f"[{style}]{_escape(cell)}[/]" if style else _escape(cell))
            table.add_row(*cells)
        stdout_console().print(table)
        return
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    out = []
    for row in [columns] + rows:
        cells = [(row[i].rjust(w) if i in right else row[i].ljust(w)) for i, w in enumerate(widths)]
        out.append("  ".join(cells).rstrip())
    sys.stdout.write("\n".join(out) + "\n")


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
