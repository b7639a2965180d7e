"""Moving entries between machines and checking them: export, import, verify."""

import sys
import time
from typing import Annotated, List, Optional

import typer

from kcache_cli.cli import common as c
from kcache_cli.cli.progress import Bar as _Bar


def register(app: typer.Typer) -> None:
    app.command("export")(export_command)
    app.command("import")(import_command)
    app.command("verify")(verify_command)


def _size(text: Optional[str], option: str, default: int) -> int:
    from kcache_cli.units import parse_size

    return default if text is None else parse_size(text, option)


TTY_ROWS = 100  # rows of the import table on a terminal; pipes get every row

ArchiveArg = Annotated[str, typer.Argument(metavar="ARCHIVE", help="The archive: .tar, .tar.gz (.tgz) or .tar.zst.")]


@c.selectors(status=Annotated[Optional[List[str]], typer.Option(
    "--status", metavar="STATUS", help="Only entries with this status (repeatable). Default: complete entries "
    "only; entries being built are never exported.")])
def export_command(
    ctx: typer.Context,
    archive: ArchiveArg,
    sel: c.Selection,
    sources_only: Annotated[bool, typer.Option("--sources-only", help="Leave the compiled binaries (*.so, *.cubin, "
                                               "*.fatbin...) out, to rebuild elsewhere.")] = False,
    cache_dir: c.CacheDirOpt = None,
    as_json: c.JsonOpt = False,
) -> None:
    """Write the selected entries into one archive, with a manifest of every file's size and sha256.

    Selectors are those of `ls`. The compression follows the name (.tar, .tar.gz, .tar.zst). Programs
    that selected tilus scripts link to come along. The archive appears only when complete.

    Example: kcache export --space cuda_space_0 --op matmul kernels.tar.zst
    """
    from kcache_cli.archive import compression_for, export_archive, plan_export
    from kcache_cli.archive.export import EmptyExport
    from kcache_cli.errors import UsageError

    opts = c.use(ctx, cache_dir, as_json)
    compression_for(archive)  # a bad name is a usage error before any work
    root = c.cache_root(opts, existing=True)
    flt = sel.filter(root)
    c.hint_unknown(opts, root, flt)
    plan = plan_export(root, flt, warn=lambda m: c.warn(opts, m), sources_only=sources_only)
    selected = [*plan.jobs, *(e for e, _ in plan.left)]
    missing = c.unmatched_refs(root, sel.hashes, selected)
    if missing:
        raise c.no_match(missing, [root], selectors=sel.has_selectors())
    if not selected:  # an empty archive is refused
        raise UsageError(f"no entries in {root} match the selection: nothing to export, no archive written")
    out = c.Output(opts)
    try:
        with _Bar(opts, "exporting") as bar:
            result = export_archive(plan, archive, warn=lambda m: c.warn(opts, m), progress=bar)
    except EmptyExport as exc:  # what was left out, and why; then the refusal (exit 1)
        empty = exc.result
        out.result(empty.to_json(str(root)), lambda: _export_human(out, empty))
        raise
    out.result(result.to_json(str(root)), lambda: _export_human(out, result))


def _export_human(out: c.Output, result) -> None:
    if result.left_out:
        shown = result.left_out[:5]
        for e, why in shown:
            out.info(f"left out {e.relpath}: {why}")
        if len(result.left_out) > len(shown):
            out.info(f"left out {c.plural(len(result.left_out) - len(shown), 'more entry', 'more entries')} "
                     "(see --json)")
    if not result.archive:
        return
    out.text(f"exported {c.plural(len(result.entries), 'entry')} ({c.plural(result.files, 'file')}, "
             f"{c.human_size(result.size)}) to {c.printable_line(result.archive)} "
             f"({c.human_size(result.archive_size)})")


def import_command(
    ctx: typer.Context,
    archive: ArchiveArg,
    dry_run: Annotated[bool, typer.Option("--dry-run", "-n", help="Verify the whole archive and list what would come "
                                          "in; write nothing.")] = False,
    max_file_size: Annotated[Optional[str], typer.Option(
        "--max-file-size", metavar="SIZE", help="Reject archives with a file larger than this (default 4GiB).")] = None,
    max_total_size: Annotated[Optional[str], typer.Option(
        "--max-total-size", metavar="SIZE",
        help="Reject archives that expand to more than this (default 64GiB).")] = None,
    lock_timeout: Annotated[Optional[str], typer.Option(
        "--lock-timeout", metavar="SECONDS", help="How long to wait for an entry's lock before skipping "
        "it (30, 2.5, 90s, 5m). Default: 60.")] = None,
    cache_dir: c.CacheDirOpt = None,
    as_json: c.JsonOpt = False,
) -> None:
    """Verify an archive made by `kcache export` and publish its entries into the cache.

    Every member is checked against the manifest (names, types, sizes, sha256) before anything is
    published; a rejected archive leaves the cache unchanged. Each entry appears with one rename.
    Complete entries already present are skipped. Warns when a kernel's arch does not suit this
    machine's GPU.

    Example: kcache import kernels.tar.zst --dry-run
    """
    from kcache_cli.archive import ImportLimits, import_archive
    from kcache_cli.gpu import arch_fit

    opts = c.use(ctx, cache_dir, as_json)
    defaults = ImportLimits()
    limits = ImportLimits(max_member=_size(max_file_size, "--max-file-size", defaults.max_member),
                          max_total=_size(max_total_size, "--max-total-size", defaults.max_total))
    wait = c.lock_timeout(lock_timeout, 60.0)
    root = c.cache_root(opts)
    with _Bar(opts, "verifying" if dry_run else "importing", unit="bytes") as bar:
        result = import_archive(root, archive, dry_run=dry_run, limits=limits, lock_timeout=wait,
                                warn=lambda m: c.warn(opts, m), progress=bar)
    fit = arch_fit({e.relpath: e.arch if e.action != "skip" else None for e in result.entries})
    out = c.Output(opts)
    _warn_misfits(out, result, fit)
    out.result(result.to_json(fit.gpus, fit.fits), lambda: _import_human(out, result, dry_run))


def _warn_misfits(out: c.Output, result, fit) -> None:
    """Warn about imported kernels this machine's GPU cannot run (or that there is no GPU to ask)."""
    caps = fit.gpus
    if fit.checked and caps is None:
        out.warn("no NVIDIA GPU found (nvidia-smi): cannot check that the imported kernels' archs suit this machine")
    bad = [e for e in result.entries if e.relpath in fit.misfits]
    if bad and caps:
        local = ", ".join(f"{a}.{b}" for a, b in caps)
        for e in bad[:10]:
            out.warn(f"{e.relpath} is built for {e.arch}, which does not run on this machine's GPU "
                     f"(compute capability {local})")
        if len(bad) > 10:
            out.warn(f"{c.plural(len(bad) - 10, 'more entry', 'more entries')} built for archs this GPU cannot run")


def _import_human(out: c.Output, result, dry_run: bool) -> None:
    shown = list(result.entries)
    if sys.stdout.isatty() and len(shown) > TTY_ROWS:  # a terminal gets the skips first, then a sample
        shown = sorted(shown, key=lambda e: e.action != "skip")[:TTY_ROWS]
    if shown:
        rows = [[e.action, e.layout, e.kind, e.space or e.target or "-", e.op or "-", e.hash, str(e.files),
                 c.human_size(e.size), e.arch or "-", e.reason or ""] for e in shown]
        from kcache_cli.cli.table import Column

        c.print_table([Column("action"), Column("layout", drop=1), Column("kind", drop=2), Column("space", drop=8),
                       Column("op", drop=7), Column("hash", spill=True), Column("files", right=True, drop=3),
                       Column("size", right=True, drop=6), Column("arch", drop=7), Column("note", wrap=True)], rows)
    if len(shown) < len(result.entries):
        more = c.plural(len(result.entries) - len(shown), "more entry", "more entries")
        out.info(f"({more} not shown: see --json)")
    verb = "would import" if dry_run else "imported"
    came, replaced = result.count("import") + result.count("replace"), result.count("replace")
    out.info(f"{verb} {c.plural(came, 'entry')} ({replaced} replacing incomplete ones), skipped "
             f"{result.count('skip')}; {c.plural(result.files, 'file')} ({c.human_size(result.size)}) verified "
             f"{'' if dry_run else 'into ' + result.root}".rstrip())


@c.selectors()
def verify_command(
    ctx: typer.Context,
    sel: c.Selection,
    fix: Annotated[bool, typer.Option("--fix", help="Rewrite the absolute paths entries record about themselves "
                                                    "to where they lie now (a cache moved or copied by hand), "
                                                    "for layouts that record any (Triton's group files).")
                   ] = False,
    cache_dir: c.CacheDirOpt = None,
    as_json: c.JsonOpt = False,
) -> None:
    """Check every entry against its layout's rules and recorded checksums; exit 1 on any problem.

    Reads every byte: task.txt against the hash, files against kcache.json or tilelang's manifests,
    tilus links, binaries, Triton's group files. Entries that are not complete are problems; entries
    being built are skipped. --fix rewrites the paths an entry records about itself when they point at
    another root (the layout's relocation hook, as import uses).

    Example: kcache verify --layout tilelang --json
    """
    from kcache_cli.verify import verify_cache

    opts = c.use(ctx, cache_dir, as_json)
    root = c.cache_root(opts, existing=True)
    flt = sel.filter(root)
    c.hint_unknown(opts, root, flt)
    started = time.monotonic()
    from kcache_cli.cli.progress import Phase

    with _Bar(opts, "scanning", unit="judged") as bar:  # the scan's count, then the entries verified
        result = verify_cache(root, flt, warn=lambda m: c.warn(opts, m), progress=Phase(bar, "verifying"),
                              fix=fix, scanning=bar)
    missing = c.unmatched_refs(root, sel.hashes, [*(ch.entry for ch in result.checked), *result.skipped])
    if missing:
        raise c.no_match(missing, [root], selectors=sel.has_selectors())
    out = c.Output(opts)
    for e, error in result.fix_errors:
        out.warn(f"{e.relpath}: {error}")
    took = time.monotonic() - started
    out.result(result, lambda: _verify_human(out, result, root, fix, took))
    if result.failed:
        raise typer.Exit(1)


def _verify_human(out: c.Output, result, root, fix: bool, took: float) -> None:
    failed = result.failed
    if failed:
        rows = []
        for ch in failed:
            for i, p in enumerate(ch.problems):
                e = ch.entry
                rows.append([e.layout, e.kind, e.space or e.target or "-", e.op or "-", e.hash, ch.status, p]
                            if i == 0 else ["", "", "", "", "", "", p])
        from kcache_cli.cli.table import Column

        c.print_table([Column("layout", drop=1), Column("kind", drop=2), Column("space", drop=8),
                       Column("op", drop=7), Column("hash", spill=True), Column("status", styles=c.STATUS_STYLE),
                       Column("problem", wrap=True)], rows)
    if not result.exists:
        out.info(f"no cache at {root}: nothing to verify")
        return
    building = f", skipped {len(result.skipped)} being built" if result.skipped else ""
    fixed = f", rewrote the paths of {len(result.fixed)}" if fix else ""
    out.info(f"checked {c.plural(len(result.checked), 'entry')} in {took:.1f}s: "
             f"{len(result.checked) - len(failed)} ok, {len(failed)} with problems{building}{fixed}")
