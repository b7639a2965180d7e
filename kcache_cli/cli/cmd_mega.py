"""torch Mega-Cache blobs on the command line: `inspect BLOB`, `verify BLOB`, `import BLOB` and
`export OUT --format torch-mega` (the commands themselves live in cmd_read and cmd_archive; they hand a
blob over here when their argument is one)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kcache_cli.cli import common as c
from kcache_cli.cli import options as o
from kcache_cli.cli.table import Column
from kcache_cli.util.lazy import lazy_module

if TYPE_CHECKING:  # the real imports, for mypy; at run time each loads at its first use
    from kcache_cli.archive import importer, mega
    from kcache_cli.catalog import locate
    from kcache_cli.formats import megacache
    from kcache_cli.ops import explain
else:
    explain = lazy_module("kcache_cli.ops.explain")
    importer = lazy_module("kcache_cli.archive.importer")
    locate = lazy_module("kcache_cli.catalog.locate")
    mega = lazy_module("kcache_cli.archive.mega")
    megacache = lazy_module("kcache_cli.formats.megacache")


def is_blob(arg: str | None) -> bool:
    """Whether `arg` names a file that starts like a Mega-Cache blob (a CRC, then version 1), or one
    ending in .bin / .mega whatever it holds (so that a damaged blob is still inspected as one)."""
    if not arg or not os.path.isfile(arg):
        return False
    if arg.endswith((".bin", ".mega", ".megacache")):
        return True
    try:
        with open(arg, "rb") as f:
            return megacache.looks_like_blob(f.read(12))
    except OSError:
        return False


def show_blob(opts: o.GlobalOptions, path: str, verify: bool) -> None:
    """inspect / verify of a blob; exit 1 when it has a problem."""
    doc = mega.describe(path)
    out = c.Output(opts)
    out.result(doc, lambda: _blob_human(doc, verify))
    if not doc["ok"]:
        raise typer.Exit(1)


def _blob_human(doc: dict, verify: bool) -> None:
    crc = doc["crc32"]
    c.print_text(f"blob     {c.printable_line(doc['path'])}")
    size = doc["size"]
    c.print_text(f"size     {c.human_size(size)} ({c.plural(size, 'byte')}), sha256 {doc['sha256'][:16]}", 9)
    c.print_text(f"crc32    stored {crc['stored'] or '-'}, computed {crc['computed'] or '-'} "
                 f"({'ok' if crc['ok'] else 'MISMATCH'})", 9)
    c.print_text(f"version  {doc['version'] if doc['version'] is not None else '-'}   state {doc['state']}", 9)
    groups = ", ".join(f"{c.printable_line(g['type'])} x{g['count']}" for g in doc["groups"]) or "none"
    c.print_text(f"groups   {groups}", 9)
    if not verify and doc["artifacts"]:
        rows = [[a["type"], a["key"], c.human_size(a["size"]), a["sha256"][:12], "yes" if a["loaded"] else "no"]
                for a in doc["artifacts"]]
        c.print_table([Column("type"), Column("key", spill=True), Column("size", right=True),
                       Column("sha256", drop=2), Column("loads", drop=1)], rows)
    for p in doc["problems"]:
        c.print_text(f"problem  {c.printable_line(p)}", 9)
    if verify and doc["ok"]:
        c.print_text(f"ok: {c.plural(len(doc['artifacts']), 'artifact')}, checksum and framing whole")


def import_blob(opts: o.GlobalOptions, path: str, dry_run: bool, wait: float) -> None:
    result = mega.import_blob(_blob_root(opts), path, dry_run=dry_run, lock_timeout=wait)
    out = c.Output(opts)
    out.result(result, lambda: _import_human(out, result))
    if result.lock_timeouts and not result.count("refuse"):  # the rest is in: exit 3, as import's and pull's
        raise importer.held_locks(result.lock_timeouts, wait, "import")
    if result.lock_timeouts:  # a refusal is not mended by importing again: exit 1, the held locks said
        out.warn(str(importer.held_locks(result.lock_timeouts, wait, "import")))
    if result.count("refuse"):
        raise typer.Exit(1)


def _blob_root(opts: o.GlobalOptions) -> Path:
    """--cache-dir or KCACHE_DIR, else where torch keeps its cache (TORCHINDUCTOR_CACHE_DIR...)."""
    if c.explicit_root(opts):
        return c.cache_root(opts)

    names = sorted({lay.name for lay in mega.mega_layouts().values()})
    return locate.named_cache(names[0]).path


def _import_human(out: c.Output, result) -> None:
    """A row per artifact, then the totals; -q: only the refused ones (the failure's reasons)."""
    shown = [a for a in result.artifacts if not out.opts.quiet or a.action == mega.REFUSED]
    rows = [[a.action, a.type, a.key, c.human_size(a.size), a.reason or ""] for a in shown]
    if rows:
        c.print_table([Column("action"), Column("type"), Column("key", spill=True), Column("size", right=True),
                       Column("note", wrap=True, drop=1)], rows)
    verb = "would import" if result.dry_run else "imported"
    locked = f" ({result.lock_timeouts} whose lock was held)" if result.lock_timeouts else ""
    out.info(f"{verb} {c.plural(result.count('import') + result.count('add'), 'artifact')}, skipped "
             f"{result.count('skip')} present{locked}, refused {result.count('refuse')}; into {result.root}")


def export_blob(opts: o.GlobalOptions, out_path: str, python: str | None) -> None:

    root = c.cache_root(opts, existing=True) if c.explicit_root(opts) else _blob_root(opts)
    here = explain.probe(python, ("torch",))
    facts = {"torch_version": here.versions.get("torch"), "python": here.python,
             "device": here.gpu or "cpu", "exported_by": "kcache export --format torch-mega"}
    result = mega.export_blob(root, out_path, facts)
    out = c.Output(opts)
    out.result(result, lambda: _export_human(out, result))


def _export_human(out: c.Output, result) -> None:
    """The blob and manifest written; -q: nothing (a CI step is silent when it works)."""
    if out.opts.quiet:
        return
    out.text(f"exported {c.plural(len(result.manifest['artifacts']), 'artifact')} ({c.human_size(result.size)}) to "
             f"{c.printable_line(result.out)}; manifest {c.printable_line(result.sidecar)}"
             f"{'' if 'signature' in result.manifest else ' (unsigned: `kcache remote keygen` makes a key)'}")
