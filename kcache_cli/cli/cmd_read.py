"""The read-only commands: dir, ls, inspect, log, stats."""

import os
import sys
from typing import Annotated, Optional

import typer

from kcache_cli.cli import common as c


def register(app: typer.Typer) -> None:
    app.command("dir")(dir_command)
    app.command("ls")(ls_command)
    app.command("inspect")(inspect_command)
    app.command("log")(log_command)
    app.command("stats")(stats_command)


def _scan(opts: c.GlobalOptions, flt):
    from kcache_cli.scan import scan_cache

    loc = c.cache_location(opts)
    result = scan_cache(loc.path, flt, warn=lambda m: c.warn(opts, m))
    return loc, result


def dir_command(
    ctx: typer.Context,
    all_caches: Annotated[bool, typer.Option("--all", help="Every known kernel cache on this machine, "
                                                           "with its layout, entry count and size.")] = False,
    cache_dir: c.CacheDirOpt = None,
    as_json: c.JsonOpt = False,
) -> None:
    """Print the cache root and why it was chosen.

    Example: kcache dir --all
    """
    from kcache_cli.scan import detect_layouts, scan_cache

    opts = c.use(ctx, cache_dir, as_json)
    if not all_caches:
        loc = c.cache_location(opts)
        if opts.json:
            layouts = detect_layouts(loc.path) if loc.path.is_dir() else ()
            c.emit_json({"path": str(loc.path), "reason": loc.reason, "exists": loc.path.is_dir(),
                         "layouts": list(layouts)})
        else:
            sys.stdout.write(f"{loc.path}\n")
            c.info(opts, f"({loc.reason}{'' if loc.path.is_dir() else '; does not exist yet'})")
        return
    from kcache_cli.locate import known_caches

    rows = []
    for owner, path in known_caches():
        res = scan_cache(path, warn=lambda m: c.warn(opts, m))
        rows.append({"cache": owner, "path": str(path), "exists": res.exists, "layouts": list(res.layouts),
                     "entries": len(res.entries), "size": res.size})
    if opts.json:
        c.emit_json(rows)
        return
    c.print_table(["cache", "path", "layout", "entries", "size"],
                  [[r["cache"], r["path"], ",".join(r["layouts"]) or ("-" if r["exists"] else "missing"),
                    str(r["entries"]), c.human_size(r["size"])] for r in rows], right=(3, 4))


def ls_command(
    ctx: typer.Context,
    hashes: c.HashesArg = None,
    op: c.OpOpt = None,
    space: c.SpaceOpt = None,
    target: c.TargetOpt = None,
    layout: c.LayoutOpt = None,
    status: c.StatusOpt = None,
    kind: c.KindOpt = None,
    sort: Annotated[str, typer.Option("--sort", metavar="KEY",
                                      help="Order: op (default), size (biggest first), age (least recently used first).")] = "op",
    limit: Annotated[Optional[int], typer.Option("--limit", min=0, help="Show at most N entries.")] = None,
    cache_dir: c.CacheDirOpt = None,
    as_json: c.JsonOpt = False,
) -> None:
    """List cache entries, one row each: layout, space, op, hash, size, files, status, last used.

    Example: kcache ls --op matmul --sort size --limit 10
    """
    from kcache_cli.errors import UsageError
    from kcache_cli.model import sort_entries

    opts = c.use(ctx, cache_dir, as_json)
    if sort not in ("op", "size", "age"):
        raise UsageError(f"unknown sort key '{sort}' (choose from op, size, age)")
    flt = c.make_filter(op, space, target, layout, status, kind, hashes)
    loc, result = _scan(opts, flt)
    entries = sort_entries(result.entries, sort)
    if limit is not None:
        entries = entries[:limit]
    if opts.json:
        c.emit_json([e.to_json() for e in entries])
        return
    if not result.exists:
        c.info(opts, f"no cache at {loc.path} ({loc.reason})")
        return
    if not entries:
        c.info(opts, f"no entries in {loc.path}" + (" match" if flt != type(flt)() else ""))
        return
    show_reason = any(e.reason for e in entries)
    rows = []
    for e in entries:
        row = [e.layout, e.kind, e.space or e.target or "-", e.op or "-", e.hash, c.human_size(e.size),
               str(e.files), e.status, c.human_age(e.last_used)]
        if show_reason:
            row.append(e.reason or "")
        rows.append(row)
    cols = ["layout", "kind", "space", "op", "hash", "size", "files", "status", "last used"]
    if show_reason:
        cols.append("reason")
    c.print_table(cols, rows, styles={7: c.STATUS_STYLE}, right=(5, 6))
    total = sum(e.size for e in entries)
    c.info(opts, f"{len(entries)} entries, {c.human_size(total)} in {loc.path}")


def _details(opts: c.GlobalOptions, prefix: str):
    from kcache_cli.layouts import get
    from kcache_cli.scan import resolve_entry

    root = c.cache_root(opts)
    entry = resolve_entry(root, prefix, warn=lambda m: c.warn(opts, m))
    return root, entry, get(entry.layout)


HashArg = Annotated[str, typer.Argument(metavar="HASH", help="A unique hash prefix (or the entry's path in the cache).",
                                        autocompletion=c.complete.complete_hash)]


def inspect_command(
    ctx: typer.Context,
    hash_prefix: HashArg,
    cache_dir: c.CacheDirOpt = None,
    as_json: c.JsonOpt = False,
) -> None:
    """Everything about one entry: path, task, files, compile command, binary arch and symbols, status.

    Runs the deep checks that read every byte: task.txt's sha256 against the directory name,
    files against a manifest (kcache.json, tilelang's manifest.json).

    Example: kcache inspect ad252b06
    """
    opts = c.use(ctx, cache_dir, as_json)
    root, entry, layout = _details(opts, hash_prefix)
    d = layout.describe(root, entry)
    from kcache_cli.binary import read_binary

    bins = [read_binary(p) for p in d.binaries]
    archs = sorted({a for b in bins for a in b.archs})
    if opts.json:
        data = entry.to_json()
        data.update(status=d.status, reason=d.reason, problems=list(d.problems), op=entry.op or d.task_op,
                    inputs=[_tensor(t) for t in d.inputs], outputs=[_tensor(t) for t in d.outputs],
                    files=[{"name": f.name, "size": f.size, "link": f.link} for f in d.files],
                    compile_command=d.compile_command, compiler_output=d.compiler_output, archs=archs,
                    binaries=[{"path": b.path, "format": b.format, "machine": b.machine, "archs": list(b.archs),
                               "ptx": list(b.ptx_archs), "symbols": list(b.symbols), "error": b.error}
                              for b in bins],
                    facts={k: v for k, v in d.facts})
        c.emit_json(data)
        return
    con = c.stdout_console()
    from rich.markup import escape

    def line(key: str, value: str, style: str = "") -> None:
        value = escape(value)
        con.print(f"[bold]{key:<16}[/] " + (f"[{style}]{value}[/]" if style else value))

    line("path", entry.path)
    line("layout", f"{entry.layout} {entry.kind}")
    line("space", entry.space or "-")
    line("op", entry.op or d.task_op or "-")
    line("hash", entry.hash)
    line("status", d.status + (f": {d.reason}" if d.reason else ""), c.STATUS_STYLE.get(d.status, ""))
    for p in d.problems[1:]:
        line("", p, "red")
    line("size", f"{c.human_size(entry.size)} ({entry.size} bytes) in {entry.files} files")
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
        name = os.path.relpath(b.path, entry.path)
        if b.error:
            line(name, f"unreadable: {b.error}", "red")
            continue
        arch = ", ".join(b.archs) or ("none (host code only)" if b.format == "elf-so" else "-")
        ptx = f"; PTX {', '.join(b.ptx_archs)}" if b.ptx_archs else ""
        line(name, f"{b.format} {b.machine or ''}, CUDA arch {arch}{ptx}")
        if b.symbols:
            # extern "C" entry points (hidet's launch functions, tvm_ffi's) first, C++ runtime noise last
            symbols = sorted(b.symbols, key=lambda s: (s.startswith("_Z"), s))
            shown = ", ".join(symbols[:12]) + (f" and {len(symbols) - 12} more" if len(symbols) > 12 else "")
            line("  symbols", shown)
    line("files", "")
    for f in d.files:
        link = f" -> {f.link}" if f.link else ""
        con.print(f"  {f.size:>10}  {escape(f.name)}{escape(link)}")


def _tensor(t) -> dict:
    return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}


def _tensor_text(t) -> str:
    shape = ", ".join(str(s) for s in t.shape)
    return f"{t.name + ': ' if t.name else ''}{t.dtype}[{shape}]"


def log_command(
    ctx: typer.Context,
    hash_prefix: HashArg,
    raw: Annotated[bool, typer.Option("--raw", help="Plain text, no headers or highlighting.")] = False,
    cache_dir: c.CacheDirOpt = None,
) -> None:
    """Show an entry's compile log: nvcc_log.txt, or compile.sh plus the compiler's output.

    Error and warning lines are highlighted.

    Example: kcache log ad252b06 --raw | grep ptxas
    """
    from kcache_cli.errors import KcacheError

    opts = c.use(ctx, cache_dir)
    root, entry, layout = _details(opts, hash_prefix)
    logs = layout.log_files(entry)
    if not logs:
        raise KcacheError(layout.no_log(entry))
    if raw:
        for lf in logs:
            with open(lf.path, "rb") as f:
                data = f.read()
            sys.stdout.buffer.write(data if data.endswith(b"\n") or not data else data + b"\n")
        sys.stdout.flush()
        return
    from rich.markup import escape

    con = c.stdout_console()
    for lf in logs:
        con.print(f"[bold blue]==> {escape(lf.label)} <==[/]")
        with open(lf.path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        for ln in text.splitlines():
            con.print(_log_line(ln, escape))


def _log_line(ln: str, escape) -> str:
    low = ln.lower()
    if " error" in low or low.startswith("error") or "error:" in low or "fatal" in low:
        return f"[bold red]{escape(ln)}[/]"
    if "warning" in low:
        return f"[yellow]{escape(ln)}[/]"
    return escape(ln)


def stats_command(
    ctx: typer.Context,
    top: Annotated[int, typer.Option("--top", min=0, help="How many of the biggest entries to show.")] = 10,
    cache_dir: c.CacheDirOpt = None,
    as_json: c.JsonOpt = False,
) -> None:
    """Totals per layout, space and op, counts per status, and the biggest entries.

    Example: kcache stats --json | jq .by_status
    """
    from kcache_cli.model import ScanFilter

    opts = c.use(ctx, cache_dir, as_json)
    loc, result = _scan(opts, ScanFilter())
    groups: dict[str, dict[str, dict[str, int]]] = {"by_layout": {}, "by_space": {}, "by_op": {}, "by_status": {},
                                                     "by_kind": {}}
    for e in result.entries:
        for key, value in (("by_layout", e.layout), ("by_space", e.space or "-"), ("by_op", e.op or "-"),
                           ("by_status", e.status), ("by_kind", e.kind)):
            g = groups[key].setdefault(value, {"entries": 0, "size": 0})
            g["entries"] += 1
            g["size"] += e.size
    import heapq

    biggest = heapq.nlargest(top, result.entries, key=lambda e: (e.size, e.relpath))
    layouts = list(result.layouts)
    if opts.json:
        c.emit_json({"root": str(loc.path), "exists": result.exists,
                     "layout": layouts[0] if len(layouts) == 1 else ("mixed" if layouts else None),
                     "layouts": layouts, "entries": len(result.entries), "size": result.size,
                     **{k: dict(sorted(v.items())) for k, v in groups.items()},
                     "biggest": [e.to_json() for e in biggest], "warnings": list(result.warnings)})
        return
    if not result.exists:
        c.info(opts, f"no cache at {loc.path} ({loc.reason})")
        return
    sys.stdout.write(f"{loc.path}: {', '.join(layouts) or 'no known layout'}, {len(result.entries)} entries, "
                     f"{c.human_size(result.size)}\n")
    for key, title in (("by_layout", "layout"), ("by_space", "space"), ("by_op", "op"), ("by_status", "status")):
        rows = sorted(groups[key].items(), key=lambda kv: (-kv[1]["size"], kv[0]))
        if not rows:
            continue
        sys.stdout.write("\n")
        c.print_table([title, "entries", "size"], [[k, str(v["entries"]), c.human_size(v["size"])] for k, v in rows],
                      styles={0: c.STATUS_STYLE} if key == "by_status" else None, right=(1, 2))
    if biggest:
        sys.stdout.write("\n")
        c.print_table(["biggest", "space", "op", "size", "status"],
                      [[e.hash, e.space or "-", e.op or "-", c.human_size(e.size), e.status] for e in biggest],
                      styles={4: c.STATUS_STYLE}, right=(3,))
