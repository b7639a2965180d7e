"""The read-only commands: dir, ls, inspect, log, stats."""

import codecs
import functools
import itertools
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, List, Optional

import typer

from kcache_cli.cli import common as c
from kcache_cli.cli import options as o
from kcache_cli.cli.progress import scanning
from kcache_cli.cli.table import Column, fold, paint
from kcache_cli.fs.read import iter_chunks
from kcache_cli.layouts import get
from kcache_cli.model.records import ScanFilter, sort_entries
from kcache_cli.model.terms import COMPLETE, SORT_KEYS
from kcache_cli.util.errors import KcacheError, UsageError
from kcache_cli.util.lazy import lazy_module
from kcache_cli.util.textsafe import one_line

if TYPE_CHECKING:  # the real imports, for mypy; at run time each loads at its first use
    from kcache_cli.catalog import locate, scan
    from kcache_cli.cli import cmd_mega
    from kcache_cli.formats import binary
    from kcache_cli.ops import budget, config, usage
    from kcache_cli.util import suggest
else:
    suggest = lazy_module("kcache_cli.util.suggest")
    binary = lazy_module("kcache_cli.formats.binary")
    cmd_mega = lazy_module("kcache_cli.cli.cmd_mega")
    locate = lazy_module("kcache_cli.catalog.locate")
    scan = lazy_module("kcache_cli.catalog.scan")
    usage = lazy_module("kcache_cli.ops.usage")
    budget = lazy_module("kcache_cli.ops.budget")
    config = lazy_module("kcache_cli.ops.config")


def register(app: typer.Typer) -> None:
    app.command("dir")(dir_command)
    app.command("ls")(ls_command)
    app.command("inspect")(inspect_command)
    app.command("log")(log_command)
    app.command("stats")(stats_command)


def _scan(opts: o.GlobalOptions, flt, loc=None, use_index: bool = False, hint: bool = True):

    loc = loc or c.cache_location(opts, existing=True)
    # ls and stats also show what killed imports and exports left (layout "kcache"; prune removes it)
    with scanning(opts, f"scanning {c.printable_line(str(loc.path))}") as bar:
        result = scan.scan_cache(loc.path, flt, warn=lambda m: c.warn(opts, m), leftovers=True, use_index=use_index,
                            progress=bar)
    o.keep_to_exit(result)
    if hint:  # after the scan: a value its entries have (read from their files) is no unknown one
        c.hint_unknown(opts, loc.path, flt, list(result.entries))
    return loc, result


def dir_command(
    ctx: typer.Context,
    all_caches: Annotated[bool, typer.Option("--all", help="Every known kernel cache on this machine, "
                                                           "with its layout, entry count and size.")] = False,
    cache_dir: o.CacheDirOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """Print the cache root the commands use here, and why it was chosen.

    That is --cache-dir or KCACHE_DIR; else, inside a cache (the current directory anywhere in it), that
    cache, as ls, stats, prune... use it (build still writes into hidet's root, and dir says so on
    stderr); else hidet's root, where build writes (the other commands then work on every cache found:
    kcache dir --all).

    Example: kcache dir --all
    """
    opts = o.use(ctx, cache_dir, as_json)
    out = c.Output(opts)
    if not all_caches:
        loc = _root_here(opts)

        def where() -> None:
            out.text(c.tty_safe(str(loc.path)))
            out.info(f"({c.printable_line(loc.reason)}{'' if loc.path.is_dir() else '; does not exist yet'})")

        out.result(lambda: {"path": str(loc.path), "reason": loc.reason, "exists": loc.path.is_dir(),
                            "layouts": list(scan.detect_layouts(loc.path) if loc.path.is_dir() else ())}, where)
        return

    rows: list[dict] = []
    shown: dict[str, str] = {}  # the path people know: the CUDA JIT cache itself, not the root holding it
    for owner, path in locate.known_caches():
        if os.path.lexists(path) and not locate.found_root(path, f"the {owner} cache", lambda m: c.warn(opts, m)):
            continue  # another user's directory, or a link: never listed (DESIGN §1.1)
        shown[str(path)] = str(get(owner).shown_path(path))
        with scanning(opts, f"scanning {c.printable_line(str(path))}") as bar:
            res = scan.scan_cache(path, warn=lambda m: c.warn(opts, m), progress=bar)
        rules = {str(where): why for where, why in get(owner).default_roots()}  # torchext: one per folder
        rows.append({"cache": owner, "path": str(path), "reason": rules.get(str(path), ""), "exists": res.exists,
                     "layouts": list(res.layouts), "entry_count": len(res.entries), "size": res.size,
                     "nested": nested_caches(owner, path)})

    # cache, entries and size always; the path last, wrapped or on its own line when the row is too wide
    out.result({"caches": rows}, lambda: c.print_table(
        [Column("cache"), Column("layout", drop=1), Column("entries", right=True), Column("size", right=True),
         Column("path", wrap=True)],
        [line for r in rows for line in [
            [r["cache"], ",".join(r["layouts"]) or ("-" if r["exists"] else "missing"),
             f"{r['entry_count']:,}", c.human_size(r["size"]), c.tty_safe(c.home_short(shown[r["path"]]))],
            # nested caches: counted in the row above (its entries hold them), shown so they are found
            *([f"  in {r['cache']}", n["layout"], "-", "-", c.tty_safe(c.home_short(n["path"]))]
              for n in r["nested"])]]))


def _root_here(opts: o.GlobalOptions):
    """The root `kcache dir` names: the one ls, stats, prune... use here. Inside a cache that is not
    build's root, that cache, its reason saying where build writes instead (`cd "$(kcache dir)"` must
    land in the cache the commands read)."""
    build = c.cache_location(opts)
    here, refused = c.cwd_scope(opts)
    if here is None:
        return build if refused is None else replace(
            build, reason=f"{build.reason}; where build writes: ls, stats, prune... refuse here: {refused}")
    if os.path.realpath(here.path) == os.path.realpath(build.path):
        return build
    what = f"this {here.cache} cache" if here.cache else "this cache"
    return replace(here, reason=f"the current directory lies in {what}: ls, stats, prune... work on it here; "
                                f"build writes into {build.path} ({build.reason})")


def nested_caches(owner: str, path) -> list[dict]:
    """The caches of other layouts that `owner`'s cache at `path` holds inside its entries (counted in
    its row, never listed as rows of their own)."""
    if not path.is_dir():
        return []
    return [{"layout": layout, "path": str(p)} for layout, p in get(owner).nested(path)]


@c.selectors(size_age=True)
def ls_command(
    ctx: typer.Context,
    sel: c.Selection,
    sort: Annotated[str, typer.Option(
        "--sort", metavar="KEY", help="Order: op (default), size (biggest first), age (least recently used first).",
        autocompletion=c.complete.complete_sort)] = "op",
    limit: Annotated[Optional[int], typer.Option("--limit", metavar="N", min=0, help="Show at most N entries.")] = None,
    paths_only: Annotated[bool, typer.Option("-q", "--quiet", help="Print the entries' paths only, one per line "
                                             "(like docker ps -q), control characters shown as ? (as ls -q does); "
                                             "nothing on stderr. With --json: the JSON.")] = False,
    null: Annotated[bool, typer.Option("-0", "--null", help="Print the entries' exact paths only, each ended by a "
                                       "NUL byte, for xargs -0; nothing on stderr.")] = False,
    cache: c.CacheOpt = None,
    all_caches: c.AllCachesOpt = False,
    no_index: o.NoIndexOpt = False,
    cache_dir: o.CacheDirOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """List entries, with their status, size and last use.

    One row each: layout, kind, space, op, hash, size, files, status, last used.

    Sizes are disk usage (allocated blocks, as du counts them); --json adds apparent_size (the bytes).

    Without --cache-dir or KCACHE_DIR, every kernel cache found (kcache dir --all) in one table with a
    `cache` column, or the cache the current directory lies in; --cache NAME picks one.
    Entries are named by hash prefix, path in the cache or absolute path. On a narrow terminal a
    column of `-` only goes first, then those that matter least (layout of a one-layout cache, kind,
    files); statuses always show in full, hashes at least as far as tells them apart (8 characters or
    more; --json has them whole), and a name cut short ends in `…`.

    Example: kcache ls --op 'mat*' --space 2 --sort size --limit 10
    """
    opts = o.use(ctx, cache_dir, as_json)
    sort = sort.lower()  # --sort SIZE as --sort size
    if sort not in SORT_KEYS:
        raise suggest.unknown_choice("sort key", sort, SORT_KEYS)
    if null and opts.json:
        raise UsageError("--null and --json do not go together")
    if paths_only or null:  # nothing on stderr but errors; with --json the JSON still wins over -q's paths
        opts.quiet = opts.silent = True
        paths_only = not opts.json
    listed = _ls_listed(opts, sel, all_caches, cache, not no_index)
    rows = _ls_rows(listed, sort, limit)
    out = c.Output(opts)

    def human() -> None:
        if null:
            _print_null([e.path for _, e in rows])
        elif paths_only:
            c.print_lines([one_line(e.path) for _, e in rows])
        else:
            _ls_human(out, listed, rows)

    out.result(lambda: {"entries": [dict(e.to_json(), cache=loc.cache or None, root=str(loc.path)) if opts.many
                                    else e.to_json() for loc, e in rows],
                        "entry_count": len(rows),
                        "total": sum(len(result.entries) for _, _, result in listed),
                        "size": sum(e.size for _, e in rows)}, human)


def _ls_listed(opts: o.GlobalOptions, sel: c.Selection, all_caches: bool, cache: Optional[str],
               use_index: bool) -> list:
    """(location, filter, scan result) for each cache listed; an entry named by hash or path that is in
    none of them is an error."""
    locs = c.cache_locations(opts, all_caches, cache, sel.hashes, all_caches_option=True)
    listed = []
    missing = set(c.ref_list(sel.hashes))
    for loc in locs:
        refs = c.refs_in(loc.path, sel.hashes) if len(locs) > 1 or opts.many else sel.hashes
        if sel.hashes and not refs:
            continue  # the entries named are in other caches
        flt = sel.filter(loc.path, refs)
        listed.append((loc, flt, _scan(opts, flt, loc, use_index, hint=not opts.many)[1]))
        missing -= c.matched_refs(loc.path, refs, listed[-1][2].entries)
    if opts.many:
        c.hint_unknown_many(opts, [(loc.path, flt) for loc, flt, _ in listed],
                            found=[e for _, _, res in listed for e in res.entries])
    if missing:  # an entry named that is nowhere: a typo, not "no entries"
        raise c.no_match([r for r in c.ref_list(sel.hashes) if r in missing], [loc.path for loc in locs],
                         selectors=sel.has_selectors())
    return listed


def _ls_rows(listed: list, sort: str, limit: Optional[int]) -> list:
    """(location, entry) of every cache's entries, in one order across them, at most `limit`."""
    if len(listed) == 1:  # one cache: no map back from each entry to it (10^5 entries: 20 ms)
        loc, _, result = listed[0]
        entries = sort_entries(result.entries, sort)
        return [(loc, e) for e in (entries[:limit] if limit is not None else entries)]
    where = {id(e): loc for loc, _, result in listed for e in result.entries}
    entries = sort_entries([e for _, _, result in listed for e in result.entries], sort)
    return [(where[id(e)], e) for e in (entries[:limit] if limit is not None else entries)]


def _print_null(paths: list[str]) -> None:
    """Each path's exact bytes (undecodable ones too), NUL-terminated, for `xargs -0`."""
    sys.stdout.flush()
    sys.stdout.buffer.write(b"".join(os.fsencode(p) + b"\0" for p in paths))
    sys.stdout.buffer.flush()


def _ls_human(out: c.Output, listed: list, rows: list) -> None:
    """The table of `rows`, with a `cache` column when they come from more than one cache; what was
    missing or empty on stderr."""
    for loc, _, result in listed:
        if not result.exists:
            out.info(f"no cache at {loc.path} ({loc.reason})")
    there = [(loc, flt) for loc, flt, result in listed if result.exists]
    if not listed:
        out.info("no kernel cache found (see kcache dir --all)")
    if not rows:
        if there:
            selected = any(flt != type(flt)() for _, flt in there)
            where = there[0][0].path if len(there) == 1 else f"{len(there)} caches"
            count = sum(len(result.entries) for _, _, result in listed if result.exists)
            out.info(f"0 of {c.plural(count, 'entry')} shown (--limit 0) in {where}" if count else
                     f"no entries in {where}" + (" match" if selected else ""))
        return
    _ls_table(out, rows)
    roots = [loc for loc, _, _ in listed if str(loc.path) in _shown_roots(rows)]  # in the scope's order
    shown = sum(e.size for _, e in rows)
    where = roots[0].path if len(roots) == 1 else f"{len(roots)} caches ({', '.join(_label(loc) for loc in roots)})"
    found = [result for _, _, result in listed if result.exists]
    count, size = sum(len(r.entries) for r in found), sum(r.size for r in found)
    if len(rows) < count:  # --limit: what is shown of how many
        out.info(f"{len(rows)} of {c.plural(count, 'entry')}, {c.human_size(shown)} of {c.human_size(size)} in {where}")
    else:
        out.info(f"{c.plural(len(rows), 'entry')}, {c.human_size(shown)} in {where}")


def _shown_roots(rows: list) -> set[str]:
    """The roots the rows shown come from."""
    return {str(loc.path) for loc, _ in rows}


def _label(loc) -> str:
    """The `cache` column's value: the layout whose cache it is, else the root's name."""
    return loc.cache or loc.path.name


def _ls_table(out: c.Output, rows: list) -> None:
    entries = [e for _, e in rows]
    caches = len({str(loc.path) for loc, _ in rows}) > 1
    one_layout = len({e.layout for e in entries}) == 1
    one_kind = len({e.kind for e in entries}) == 1  # hidet's graphs among its ops keep their kind
    cols = [Column("layout", drop=1 if one_layout or caches else 6), Column("kind", drop=2 if one_kind else 6),
            Column("space", drop=7), Column("op", drop=9), Column("hash", spill=True),
            Column("size", right=True, drop=10), Column("files", right=True, drop=3),
            Column("status", styles=c.STATUS_STYLE), Column("last used", drop=4)]
    if caches:  # status, op and size are the last to go; the cache before them, after kind and space
        cols.insert(0, Column("cache", drop=8))
    show_reason = any(e.reason for e in entries)
    if show_reason:
        cols.append(Column("reason", wrap=True))
    table = []
    for loc, e in rows:
        row = [e.layout, e.kind, e.space or "-", e.op or "-", e.hash, c.human_size(e.size),
               f"{e.files:,}", e.status, c.human_age(e.last_used)]
        if caches:
            row.insert(0, _label(loc))
        if show_reason:
            row.append(e.reason or "")
        table.append(row)
    c.print_table(cols, table)


def _details(opts: o.GlobalOptions, ref: str, space=None, op=None, layout=None, kind=None, statuses: bool = True,
             cache: Optional[str] = None):
    """(root, entry, its layout) of the one entry `ref` names in the command's scope (every cache found,
    the one the current directory or an absolute `ref` lies in, --cache NAME, or --cache-dir)."""
    loc, entry = c.resolve_in_scope(opts, ref, cache, lambda root: c.make_filter(op, space, None, layout, None,
                                                                                 kind, None, root=root), statuses)
    return loc.path, entry, get(entry.layout)


HashArg = Annotated[str, typer.Argument(metavar="ENTRY", help=f"The entry: a unique {c.ENTRY_HELP}.",
                                        autocompletion=c.complete.complete_hash)]
_PICK = "Among the same hash in several places: "
PickSpaceOpt = Annotated[Optional[List[str]], typer.Option(
    "--space", metavar="SPACE", help=_PICK + "the one in this space (cuda_space_2 or 2).",
    autocompletion=c.complete.complete_space)]
PickOpOpt = Annotated[Optional[List[str]], typer.Option("--op", metavar="NAME", help=_PICK + "the one of this op.",
                                                        autocompletion=c.complete.complete_op)]
PickLayoutOpt = Annotated[Optional[List[str]], typer.Option(
    "--layout", metavar="LAYOUT", help=_PICK + "the one of this layout.", autocompletion=c.complete.complete_layout)]
PickKindOpt = Annotated[Optional[List[str]], typer.Option(
    "--kind", metavar="KIND", help=_PICK + "the one of this kind.", autocompletion=c.complete.complete_kind)]


def inspect_command(
    ctx: typer.Context,
    hash_prefix: HashArg,
    space: PickSpaceOpt = None,
    op: PickOpOpt = None,
    layout: PickLayoutOpt = None,
    kind: PickKindOpt = None,
    cache: c.CacheOpt = None,
    cache_dir: o.CacheDirOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """Everything about one entry, with the checks that read every byte.

    Path, task, files, compile command, binary arch and symbols, status.

    Runs the deep checks that read every byte, as the compiler's loader would: every file it reads on a
    hit whole, files against a manifest (kcache.json, tilelang's manifest.json). Without --cache-dir the entry is
    looked for in every cache found (an absolute path finds its own root). Exit status: 0 when the entry
    is complete, 1 when it is not (its status and reason say why), 2 when no single entry matches.

    A torch Mega-Cache blob (torch.compiler.save_cache_artifacts()) is shown instead: its checksum,
    framing, and each artifact's type, key and size (never unpickled).

    Example: kcache inspect ad252b06 --space cuda_space_0
    """
    opts = o.use(ctx, cache_dir, as_json)

    # a torch Mega-Cache blob: its framing, never its pickles (a hash is no file: cmd_mega stays unloaded)
    if os.path.isfile(hash_prefix) and cmd_mega.is_blob(hash_prefix):
        cmd_mega.show_blob(opts, hash_prefix, verify=False)
        return
    root, entry, layout_mod = _details(opts, hash_prefix, space, op, layout, kind, cache=cache)
    d = layout_mod.describe(root, entry)

    bins = [binary.read_binary(p) for p in d.binaries]
    c.Output(opts).result(d.to_json(bins), lambda: _inspect_text(entry, d, bins))
    if d.status != COMPLETE:
        raise typer.Exit(1)


def _problems(d) -> list[str]:
    """The reason, then each other problem once (a deep check often restates the scan's reason)."""
    out: list[str] = [d.reason] if d.reason else []
    for p in d.problems:
        if not any(p in seen or seen in p for seen in out):
            out.append(p)
    return out


def _inspect_text(entry, d, bins) -> None:
    width = c.output_width()
    colour = not o.plain_output()
    lines: list[str] = []

    def line(key: str, value: str, style: str = "") -> None:
        key, value = c.printable_line(key), c.printable_line(value)  # names, paths and logs stay inert
        if width is not None and len(key) > 16:  # wider than its column (a file name): alone, the value below
            lines.append(f"\x1b[1m{key}\x1b[0m" if colour else key)
            key = ""
        head = f"\x1b[1m{key:<16}\x1b[0m" if colour and key else f"{key:<16}"
        if width is not None and len(value) > width - 17 and " " not in value and len(value) <= width - 2:
            # one word too long beside its key (a 64-digit hash, a path): whole, on its own line
            lines.append(head.rstrip())
            lines.append("  " + (paint(value, style, colour) if style else value))
            return
        parts = fold(value, None if width is None else max(width - 17, 20)) if value else [""]
        for i, part in enumerate(parts):
            shown = paint(part, style, colour) if style else part
            lines.append(f"{head if i == 0 else ' ' * 16} {shown}".rstrip())

    line("path", entry.path)
    line("layout", f"{entry.layout} {entry.kind}")
    line("space", entry.space or "-")
    line("op", entry.op or d.task_op or "-")
    line("hash", entry.hash)
    line("status", d.status, c.STATUS_STYLE.get(d.status, ""))
    for i, p in enumerate(_problems(d)):
        line("reason" if i == 0 else "", p, "red")
    line("size", f"{c.human_size(entry.size)} ({c.plural(entry.size, 'byte')}) in {c.plural(entry.files, 'file')}")
    line("modified", c.human_age(entry.modified))
    line("last used", c.human_age(entry.last_used))
    for label, tensors in (("inputs", d.inputs), ("outputs", d.outputs)):
        if tensors:
            line(label, ", ".join(_tensor_text(t) for t in tensors))
    for k, v in d.facts:
        for i, part in enumerate(v.splitlines() or [""]):
            line(k if i == 0 else "", part)
    if d.compile_command:
        line("compile command", d.compile_command)
    for b in bins:
        _binary_lines(line, b, entry)
    line("files", "")
    for f in d.files:
        link = f" -> {f.link}" if f.link else ""
        lines.extend(fold(f"  {f.size:>10}  {c.printable_line(f.name + link)}", width, indent=14))
    c.print_lines(lines)


def _binary_lines(line, b, entry) -> None:
    name = os.path.relpath(b.path, entry.path)
    if b.error:
        line(name, f"unreadable: {b.error}", "red")
        return
    arch = ", ".join(b.archs) or ("none (host code only)" if b.format == "elf-so" else "-")
    ptx = f"; PTX {', '.join(b.ptx_archs)}" if b.ptx_archs else ""
    line(name, f"{b.format} {b.machine or ''}, CUDA arch {arch}{ptx}")
    if b.symbols:
        # extern "C" entry points (hidet's launch functions, tvm_ffi's) first, C++ runtime noise last
        symbols = sorted(b.symbols, key=lambda s: (s.startswith("_Z"), s))
        shown = ", ".join(symbols[:12]) + (f" and {len(symbols) - 12} more" if len(symbols) > 12 else "")
        line("  symbols", shown)


def _tensor_text(t) -> str:
    shape = ", ".join(str(s) for s in t.shape)
    return f"{t.name + ': ' if t.name else ''}{t.dtype}[{shape}]"


def log_command(
    ctx: typer.Context,
    hash_prefix: HashArg,
    raw: Annotated[bool, typer.Option("--raw", help="Plain text, no headers or highlighting: byte-exact into a "
                                      "pipe or file (on a terminal, control characters show as escapes).")] = False,
    space: PickSpaceOpt = None,
    op: PickOpOpt = None,
    layout: PickLayoutOpt = None,
    kind: PickKindOpt = None,
    cache: c.CacheOpt = None,
    cache_dir: o.CacheDirOpt = None,
) -> None:
    """Show an entry's compile log.

    The log is nvcc_log.txt, or compile.sh plus the compiler's output.

    Error and warning lines are highlighted.

    Example: kcache log ad252b06 --raw | grep ptxas
    """
    opts = o.use(ctx, cache_dir)
    if opts.json:  # the global --json (log has none of its own): a log is text, not a document
        raise UsageError("log has no --json: its output is the log's text (--raw for its bytes)")
    root, entry, layout_mod = _details(opts, hash_prefix, space, op, layout, kind, statuses=False,  # none shown
                                       cache=cache)
    logs = layout_mod.log_files(entry)
    if not logs:
        raise KcacheError(layout_mod.no_log(entry))
    refused: list[str] = []
    opened = _opened_logs(logs, refused)
    if raw and not sys.stdout.isatty():  # byte-exact into a pipe or file: it is data there
        for _, chunks in opened:
            _copy_log(chunks)
    elif not raw and not sys.stdout.isatty():  # headers, no highlighting: no Rich to import
        for lf, chunks in opened:
            sys.stdout.write(f"==> {c.printable_line(lf.label)} <==\n")
            for ln in _log_lines(chunks):
                sys.stdout.write(c.printable(ln) + "\n")
    else:
        _show_logs(opened, raw)
    sys.stdout.flush()
    if refused:  # after the logs that could be read: one line, exit 1
        more = f" (and {len(refused) - 1} more log{'s' if len(refused) > 2 else ''})" if len(refused) > 1 else ""
        raise KcacheError(refused[0] + more)


def _show_logs(opened, raw: bool) -> None:
    """The logs on a terminal: headers and highlighting (Rich), or with --raw the text, its controls
    shown as escapes."""
    con = None if raw else c.stdout_console()
    from rich.markup import escape

    for lf, chunks in opened:
        if con is not None:
            con.print(f"[bold blue]==> {escape(c.printable_line(lf.label))} <==[/]")
        for ln in _log_lines(chunks):
            if con is None:
                sys.stdout.write(c.printable(ln) + "\n")
            else:
                con.print(_log_line(c.printable(ln), escape))


def _opened_logs(logs, refused: list[str]):
    """Each log that can be read, opened before anything of it is shown (its header is never printed
    for a file kcache then refuses: a symlink, a FIFO...): (log, its chunks). Why the others cannot
    be read goes to `refused`."""
    for lf in logs:
        try:
            chunks = _open_log(lf)
        except KcacheError as exc:
            refused.append(str(exc))
            continue
        yield lf, chunks


def _open_log(lf) -> Iterator[bytes]:
    """The log's chunks (fsread: a regular file, streamed: a log is never loaded whole), opened now:
    KcacheError when it cannot be read."""
    try:
        chunks = iter_chunks(lf.path)
        first = next(chunks, b"")
    except OSError as exc:
        raise KcacheError(f"cannot read {lf.label}: {exc.strerror}") from None
    return itertools.chain((first,), chunks)


def _copy_log(chunks: Iterator[bytes]) -> None:
    last = b"\n"
    for chunk in chunks:
        if chunk:
            sys.stdout.buffer.write(chunk)
            last = chunk[-1:]
    if last != b"\n":
        sys.stdout.buffer.write(b"\n")


LOG_LINE_MAX = 64 << 10  # a longer line is shown in pieces of this many characters


def _log_lines(chunks: Iterator[bytes]):
    """A log's lines, decoded as they stream (undecodable bytes kept as \\xNN by textsafe)."""
    decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
    pending = ""
    for chunk in chunks:
        pending += decoder.decode(chunk)
        *lines, pending = pending.split("\n")
        for ln in lines:
            yield ln.removesuffix("\r")  # CRLF logs: the \r is not shown as \x0d
        while len(pending) > LOG_LINE_MAX:
            yield pending[:LOG_LINE_MAX]
            pending = pending[LOG_LINE_MAX:]
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending


def _log_line(ln: str, escape) -> str:
    kind = c.line_kind(ln)
    if kind == "error":
        return f"[bold red]{escape(ln)}[/]"
    if kind == "warning":
        return f"[yellow]{escape(ln)}[/]"
    return escape(ln)


def stats_command(
    ctx: typer.Context,
    top: Annotated[int, typer.Option("--top", metavar="N", min=0,
                                     help="How many of the biggest entries to show.")] = 10,
    cache: c.CacheOpt = None,
    all_caches: c.AllCachesOpt = False,
    no_index: o.NoIndexOpt = False,
    cache_dir: o.CacheDirOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """Where the space goes: by layout, op, status and age.

    Totals per layout, space and op, counts per status, and the biggest entries (sizes on disk, as du
    counts them; --json adds apparent_size); space by layout, op
    and age of last use (<1d, <7d, <30d, older) drawn as bars; RECLAIMABLE: the bytes `kcache prune
    --broken` would free (broken entries as ls judges them, stale temp and staging files).

    JSON: by_layout, by_space, by_op, by_status, by_kind and by_age map each value to {entry_count, size};
    reclaimable is {bytes, entry_count, command}.

    Without --cache-dir or KCACHE_DIR: one report for each cache found, then their TOTAL (--json: their
    list, caches, each naming its cache, and total), or for the cache the current directory lies in;
    --cache NAME picks one. One report alone (--cache-dir, --cache, inside a cache) is the --json
    document itself.

    Example: kcache stats --json | jq '.caches[] | {cache, by_status}'
    """
    opts = o.use(ctx, cache_dir, as_json)
    reports = []
    for loc in c.cache_locations(opts, all_caches, cache, all_caches_option=True):
        _, result = _scan(opts, ScanFilter(), loc, not no_index)
        reports.append(_stats(opts, loc, result, top, opts.many))
    out = c.Output(opts, collect=opts.many)
    budget = _budget_usage(opts, reports)
    for n, report in enumerate(reports):
        out.result(report, functools.partial(_stats_text, out, report, first=n == 0))
    total = _total(reports) if opts.many else None  # every cache found: how big in all, at once
    if total is not None and reports and not opts.json:
        out.text("")
        c.print_text(f"TOTAL        {c.plural(total['entry_count'], 'entry')}, {c.human_size(total['size'])} in "
                     f"{c.plural(total['cache_count'], 'cache')}", indent=13)
    if budget and not opts.json:
        out.text("")
        c.print_lines([_budget_line(u, max(len(b.name) for b in budget)) for u in budget])
    out.done(empty="no kernel cache found (see kcache dir --all)", over_all=None if total is None else {"total": total})


def _total(reports: list[dict]) -> dict:
    """The caches' reports added up: how many exist, their entries and bytes (on disk, and the files' own)."""
    there = [r for r in reports if r["exists"]]
    return {"cache_count": len(there), "entry_count": sum(r["entry_count"] for r in there),
            "size": sum(r["size"] for r in there), "apparent_size": sum(r["apparent_size"] for r in there)}


def _budget_usage(opts: o.GlobalOptions, reports: list[dict]) -> list:
    """Each cache's bytes against the max-size that binds a bare prune of it (the one kept in the cache
    wins; your own settings bind only your caches), and your caches against [all]; each report gets its
    own as "budget" ({"used", "limit"} or null). A config that cannot be read is a warning here."""
    try:
        cfg = config.load()
    except KcacheError as exc:
        c.warn(opts, f"no budget shown from your own settings: {exc}")
        cfg = config.Config(config.config_path(), False)
    found = budget.usage([(Path(r["root"]), tuple(r["layouts"]), r["size"]) for r in reports if r["exists"]], cfg,
                         lambda m: c.warn(opts, m))
    by_root = {u.root: u for u in found if u.root}
    for r in reports:
        r["budget"] = by_root[r["root"]].to_json() if r["root"] in by_root else None
    return found


def _budget_line(u, width: int) -> str:
    """"hidet  12.3 GB of 20.0 GB  ████████░░░░ 61%" (the bar full beyond 100%)."""
    share = u.used / u.limit if u.limit else 1.0
    cells = 20
    full = min(cells, round(share * cells))
    utf = (getattr(sys.stdout, "encoding", "") or "").lower().replace("-", "") == "utf8"
    blocks = utf and not o.plain_output()  # in a pipe, a file or under NO_COLOR: # and ., as the share bars
    bar = ("\u2588" * full + "\u2591" * (cells - full)) if blocks else ("#" * full + "." * (cells - full))
    return f"{u.name:<{width}}  {c.human_size(u.used)} of {c.human_size(u.limit)}  {bar} {share * 100:.0f}%"


def _stats(opts: o.GlobalOptions, loc, result, top: int, many: bool = False) -> dict:
    report = result.to_json(top)
    report["root"] = str(loc.path)
    report.update(_space_pictures(opts, loc, result))
    if many:  # one report per cache: which one
        report["cache"] = loc.cache or None
    return {**report, "reason": loc.reason}


def _space_pictures(opts: o.GlobalOptions, loc, result) -> dict:
    """stats' by_age and reclaimable (what prune --broken would free, planned from this same scan)."""
    return {"by_age": usage.by_age(result.entries), "reclaimable": usage.reclaimable(loc.path, result).to_json()}


BAR_MIN, BAR_MAX = 10, 30  # characters of a share bar


def _bar_width(labels: list[str], numbers: int) -> int:
    """The bars' width: what the label, entries and size columns leave of the line (20 in a pipe)."""
    width = c.output_width()
    if width is None:
        return 20
    label = max([len(x) for x in labels] + [6])
    return max(BAR_MIN, min(BAR_MAX, width - label - numbers - 2 * 3 - 5))


def _bar(size: int, total: int, width: int) -> str:
    """`size`'s share of `total` as a bar and a percentage: blocks on a terminal, # and . in plain text."""
    share = size / total if total else 0.0
    filled = round(share * width)
    full, empty = ("#", ".") if o.plain_output() else ("\u2588", "\u2591")
    return f"{full * filled}{empty * (width - filled)} {share * 100:3.0f}%"


def _share_table(title: str, groups: dict, total: int, ordered: bool = False) -> None:
    """One breakdown (by layout, op or age) as rows with a bar of each one's share of the bytes."""
    items = list(groups.items()) if ordered else sorted(groups.items(), key=lambda kv: (-kv[1]["size"], kv[0]))
    nums = [[f"{v['entry_count']:,}", c.human_size(v["size"])] for _, v in items]
    width = _bar_width([k for k, _ in items] + [title], max([len(n[0]) + len(n[1]) for n in nums] + [11]) + 4)
    c.print_table([Column(title), Column("entries", right=True), Column("size", right=True),
                   Column("share", drop=1)],
                  [[k, *n, _bar(v["size"], total, width)] for (k, v), n in zip(items, nums)])


def _reclaimable_line(report: dict) -> str:
    r = report["reclaimable"]
    trash = r.get("trash", 0)  # what an interrupted prune or clear left in the trash (ops/delete.trash_left)
    left = f"{c.human_size(trash)} left in the trash by an interrupted run" if trash else ""
    if not r["entry_count"]:
        return (f"RECLAIMABLE  {left}: {r['command']}" if trash else
                "RECLAIMABLE  nothing: no broken entries or stale temp files")
    return (f"RECLAIMABLE  {c.human_size(r['bytes'] - trash)} in {c.plural(r['entry_count'], 'item')} (broken "
            f"entries, stale temp files){', and ' + left if trash else ''}: {r['command']}")


def _stats_text(out: c.Output, report: dict, first: bool = True) -> None:
    if not first:
        out.text("")
    if not report["exists"]:
        out.info(f"no cache at {report['root']} ({report['reason']})")
        return
    c.print_text(c.printable_line(f"{report['root']}: {', '.join(report['layouts']) or 'no known layout'}, "
                 f"{c.plural(report['entry_count'], 'entry')}, {c.human_size(report['size'])}"), indent=2)
    for key, title in (("by_layout", "layout"), ("by_space", "space"), ("by_op", "op"), ("by_age", "last used"),
                       ("by_status", "status")):
        if not report[key] or not report["entry_count"]:
            continue  # no entry has a space (an op) here: a table of "-" alone, or of nothing, says nothing
        none = report.get(f"no_{title}")  # entries without a space (op): a row "-"
        groups = {**report[key], **({"-": none} if none else {})}
        sys.stdout.write("\n")
        if key in ("by_layout", "by_op", "by_age"):
            _share_table(title, groups, report["size"], ordered=key == "by_age")
            continue
        rows = sorted(groups.items(), key=lambda kv: (-kv[1]["size"], kv[0]))
        c.print_table([Column(title, styles=c.STATUS_STYLE if key == "by_status" else {}),
                       Column("entries", right=True), Column("size", right=True)],
                      [[k, f"{v['entry_count']:,}", c.human_size(v["size"])] for k, v in rows])
    if report["biggest"]:
        sys.stdout.write("\n")
        c.print_table([Column("biggest", spill=True), Column("space", drop=8), Column("op", drop=7),
                       Column("size", right=True), Column("status", styles=c.STATUS_STYLE)],
                      [[e["hash"], e["space"] or "-", e["op"] or "-", c.human_size(e["size"]), e["status"]]
                       for e in report["biggest"]])
    sys.stdout.write("\n")
    c.print_text(_reclaimable_line(report), indent=13)
