"""`kcache diff A B`: what differs between two entries of the same layout and kind."""

from __future__ import annotations

from typing import Annotated

import typer

from kcache_cli.cli import common as c


def register(app: typer.Typer) -> None:
    app.command("diff")(diff_command)


EntryA = Annotated[str, typer.Argument(metavar="A", help=f"The first entry: a unique {c.ENTRY_HELP}.",
                                       autocompletion=c.complete.complete_hash)]
EntryB = Annotated[str, typer.Argument(metavar="B", help=f"The second entry: a unique {c.ENTRY_HELP}.",
                                       autocompletion=c.complete.complete_hash)]


def diff_command(
    ctx: typer.Context,
    a: EntryA,
    b: EntryB,
    cache: c.CacheOpt = None,
    cache_dir: c.CacheDirOpt = None,
    as_json: c.JsonOpt = False,
) -> None:
    """Why are there two of these? What differs between two entries.

    Of two entries of one layout and kind: task
    parameters, compile options and constants (Triton's num_warps, num_stages, constants, target),
    compiler versions, vLLM's cache key factors, compile commands.

    Each entry is looked for in every cache found (without --cache-dir), so A and B may lie in two caches.
    Exit status 0 whether or not they differ; 2 when an entry is not found or the two are of different
    layouts or kinds.

    Example: kcache diff 22DX5RUZ ILJQFT5R
    """
    from kcache_cli.diff import diff_entries
    from kcache_cli.errors import UsageError
    from kcache_cli.model import ScanFilter

    opts = c.use(ctx, cache_dir, as_json)
    loc_a, ea = c.resolve_in_scope(opts, a, cache, lambda root: ScanFilter())
    loc_b, eb = c.resolve_in_scope(opts, b, cache, lambda root: ScanFilter())
    if (ea.layout, ea.kind) != (eb.layout, eb.kind):
        raise UsageError(f"{a} is a {ea.layout} {ea.kind} and {b} a {eb.layout} {eb.kind}: "
                         "diff compares two entries of one layout and kind")
    if ea.path == eb.path:
        raise UsageError(f"{a} and {b} are the same entry ({ea.relpath})")
    result = diff_entries(loc_a.path, ea, loc_b.path, eb)
    c.Output(opts).result(result.to_json(), lambda: _text(result))


def _text(result) -> None:
    for side, e in (("A", result.a), ("B", result.b)):
        c.print_lines([f"{side}: {e.layout} {e.kind} {e.op or '-'} {c.tty_safe(e.relpath)} ({e.status})"])
    if not result.differences:
        c.print_lines([f"no differences in {result.same} properties"])
        return
    rows = []
    for d in result.differences:
        if d.lines:
            rows.append([d.name, "(text)", f"{len(d.lines)} changed line(s)"])
            rows.extend(["", c.tty_safe(ln), ""] for ln in d.lines[:40])
            continue
        rows.append([d.name, c.tty_safe(_short(d.a)), c.tty_safe(_short(d.b))])
    c.print_table(["property", "A", "B"], rows)
    c.print_lines([f"{len(result.differences)} differ, {result.same} the same"])


def _short(value: str | None) -> str:
    if value is None:
        return "(none)"
    value = value.replace("\n", " ")
    return value if len(value) <= 80 else value[:77] + "..."
