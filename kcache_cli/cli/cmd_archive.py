"""Moving entries between machines and checking them: export, import, verify."""

import dataclasses
import functools
import sys
import time
from typing import TYPE_CHECKING, Annotated, List, Optional

import typer

from kcache_cli.cli import common as c
from kcache_cli.cli import options as o
from kcache_cli.cli.cmd_mega import export_blob, import_blob, is_blob, show_blob
from kcache_cli.cli.progress import Bar as _Bar
from kcache_cli.cli.progress import Phase
from kcache_cli.cli.table import Column
from kcache_cli.layouts import get as layout_of
from kcache_cli.model.terms import EXPORT_FORMATS
from kcache_cli.util.errors import KcacheError, UsageError
from kcache_cli.util.lazy import lazy_module
from kcache_cli.util.units import parse_size

if TYPE_CHECKING:  # the real imports, for mypy; at run time each loads at its first use
    from kcache_cli.archive import export, importer, manifest, stdio
    from kcache_cli.catalog import locate
    from kcache_cli.formats import gpu
    from kcache_cli.ops import verify
else:
    export = lazy_module("kcache_cli.archive.export")
    gpu = lazy_module("kcache_cli.formats.gpu")
    importer = lazy_module("kcache_cli.archive.importer")
    manifest = lazy_module("kcache_cli.archive.manifest")
    stdio = lazy_module("kcache_cli.archive.stdio")
    locate = lazy_module("kcache_cli.catalog.locate")
    verify = lazy_module("kcache_cli.ops.verify")


def register(app: typer.Typer) -> None:
    app.command("export")(export_command)
    app.command("import")(import_command)
    app.command("verify")(verify_command)


def _size(text: Optional[str], option: str, default: int) -> int:
    return default if text is None else parse_size(text, option)


TTY_ROWS = 100  # rows of the import table on a terminal; pipes get every row

ArchiveArg = Annotated[str, typer.Argument(metavar="ARCHIVE", help="The archive: .tar, .tar.gz (.tgz) or .tar.zst; "
                                           "- for a pipe (export: standard output, zstd; import: standard input).")]


@c.selectors(size_age=True, status=Annotated[Optional[List[str]], typer.Option(
    "--status", metavar="STATUS", help="Only entries with this status (repeatable). Default: complete entries "
    "only; entries being built are never exported.", autocompletion=c.complete.complete_status)])
def export_command(
    ctx: typer.Context,
    archive: ArchiveArg,
    sel: c.Selection,
    sources_only: Annotated[bool, typer.Option("--sources-only", help="Leave the compiled binaries (*.so, *.cubin, "
                                               "*.fatbin...) out, to rebuild elsewhere.")] = False,
    fmt: Annotated[Optional[str], typer.Option(
        "--format", metavar="FORMAT", help="tar (default: kcache's archive) or torch-mega: a blob torch's "
        "load_cache_artifacts() loads, of the Inductor cache's fx graphs, AOTAutograd entries and autotune "
        "records, with a signed manifest ARCHIVE.kcache.json.", autocompletion=c.complete.complete_format)] = None,
    python: Annotated[Optional[str], typer.Option(
        "--python", metavar="PY", help="With --format torch-mega: the Python whose torch version the manifest "
        "records (default: python3 on PATH).")] = None,
    cache: c.CacheOpt = None,
    cache_dir: o.CacheDirOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """Write the selected entries into one verified archive.

    The archive has a manifest of every file's size and sha256.

    Selectors are those of `ls`. The compression follows the name (.tar, .tar.gz, .tar.zst). Programs
    that selected tilus scripts link to come along. The archive appears only when complete. An archive
    holds one cache's entries: without --cache-dir the selection is looked for in every cache found, and
    one that spans several caches is refused (--cache NAME picks one).

    Example: kcache export --space cuda_space_0 --op matmul kernels.tar.zst
    """
    opts = o.use(ctx, cache_dir, as_json)
    if fmt is not None and fmt not in EXPORT_FORMATS:
        raise UsageError(f"--format {fmt!r}: {' or '.join(EXPORT_FORMATS)}")
    piped = archive == "-"
    if fmt == "torch-mega":
        if sel.has_selectors() or piped:
            raise UsageError("--format torch-mega exports the whole Inductor cache into a named blob: no "
                             "selector applies, and - is no file name")
        export_blob(opts, archive, python)
        return
    compression = _export_compression(opts, archive)  # a bad name is a usage error before any work
    root, plan, selected = _export_plan(opts, sel, cache, sources_only)
    out = c.Output(opts)
    try:
        if not selected:
            raise export.empty_export(root, [], compression, sources_only)
        with _Bar(opts, "exporting") as bar:
            write = export.export_to_stream if piped else functools.partial(export.export_archive, archive=archive)
            result = write(plan, warn=lambda m: c.warn(opts, m), progress=bar)
    except export.EmptyExport as exc:  # what was left out and why, then that no archive was written: a
        empty = exc.result  # warning (under -q too), but nothing to do is exit 0 (DESIGN 7), whatever the reason
        out.result(empty.to_json(str(root)), lambda: _export_human(out, empty))
        out.warn(str(exc))
        return
    out.result(result.to_json(str(root)), lambda: _export_human(out, result))


def _export_compression(opts: o.GlobalOptions, archive: str) -> str:
    """The compression the archive's name asks for; `-` (standard output) is zstd, never a terminal, and
    leaves no room on stdout for --json."""
    if archive != "-":
        return manifest.compression_for(archive)
    if opts.json:
        raise UsageError("export - writes the archive on standard output: there is no room for --json (name an "
                         "archive file to have both)")
    stdio.refuse_terminal(1, "export -")
    return "zst"


def _export_plan(opts: o.GlobalOptions, sel: c.Selection, cache: Optional[str], sources_only: bool) -> tuple:
    """(root, export plan, entries selected) of the one cache the selection names entries in; entries
    named that are nowhere are a usage error, and so is a selection spanning several caches."""
    locs = c.cache_locations(opts, False, cache, sel.hashes)
    plans, missing = [], set(c.ref_list(sel.hashes))
    for loc in locs:
        refs = c.refs_in(loc.path, sel.hashes) if opts.many or len(locs) > 1 else sel.hashes
        if sel.hashes and not refs:
            continue  # the entries named are in other caches
        flt = sel.filter(loc.path, refs)
        plan = export.plan_export(loc.path, flt, warn=lambda m: c.warn(opts, m), sources_only=sources_only)
        selected = [*plan.jobs, *(e for e, _ in plan.left)]
        missing -= c.matched_refs(loc.path, refs, selected)
        plans.append((loc, plan, selected, flt))
    c.hint_unknown_many(opts, [(p[0].path, p[3]) for p in plans], [e for p in plans for e in p[2]])
    if missing:
        raise c.no_match([r for r in c.ref_list(sel.hashes) if r in missing], [loc.path for loc in locs],
                         selectors=sel.has_selectors())
    hits = [p[:3] for p in plans if p[2]]
    if len(hits) > 1:
        names = ", ".join(loc.cache or str(loc.path) for loc, _, _ in hits)
        raise UsageError(f"the selection names entries in {len(hits)} caches ({names}): an archive holds one "
                         "cache's entries; pick one with --cache NAME or --cache-dir")
    if not hits:
        root = locs[0].path if len(locs) == 1 else f"{len(locs)} caches"
        return root, None, []
    loc, plan, selected = hits[0]
    return loc.path, plan, selected


def _export_human(out: c.Output, result) -> None:
    """What was left out (notes; those skipped were warnings already), then the archive written; -q: nothing
    (a CI step is silent when it works)."""
    if out.opts.quiet:
        return
    left = [(e, why) for e, why in result.left_out if e.relpath not in result.warned]
    for e, why in left[:5]:
        out.info(f"left out {e.relpath}: {why}")
    if len(left) > 5:
        out.info(f"left out {c.plural(len(left) - 5, 'more entry', 'more entries')} (see --json)")
    if not result.archive:
        return
    piped = result.archive == "-"  # the archive itself is on stdout: the summary goes to stderr
    (out.info if piped else out.text)(
        f"exported {c.plural(len(result.entries), 'entry')} ({c.plural(result.files, 'file')}, "
        f"{c.human_size(result.size)}) to {'standard output' if piped else c.printable_line(result.archive)} "
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
        "it (the rest is imported, then exit 3); 30, 2.5, 90s, 5m. Default: 60.")] = None,
    cache_dir: o.CacheDirOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """Verify an archive made by `kcache export`, then publish it.

    Its entries go into the cache.

    The cache: --cache-dir or KCACHE_DIR, else where the archive's layout's compiler looks (a Triton
    archive goes to Triton's cache, a hidet one to hidet's), else hidet's.

    Every member is checked against the manifest (names, types, sizes, sha256) before anything is
    published; a rejected archive leaves the cache unchanged. Each entry appears with one rename.
    Complete entries already present are skipped. Warns when a kernel's arch does not suit this
    machine's GPU.

    A torch Mega-Cache blob (torch.compiler.save_cache_artifacts()) is imported too: each fx graph,
    AOTAutograd entry, autotune record and PGO state goes where torch's load_cache_artifacts() writes
    it (TORCHINDUCTOR_CACHE_DIR, else torch's default), checked, never unpickled, atomically; a damaged
    blob writes nothing.

    Example: kcache import kernels.tar.zst --dry-run
    """
    opts = o.use(ctx, cache_dir, as_json)
    if not archive.strip():  # "" would read the current directory
        raise UsageError("ARCHIVE is empty (an unset shell variable?): name the archive, or - for a pipe")
    defaults = manifest.ImportLimits()
    limits = manifest.ImportLimits(max_member=_size(max_file_size, "--max-file-size", defaults.max_member),
                          max_total=_size(max_total_size, "--max-total-size", defaults.max_total))
    wait = c.lock_timeout(lock_timeout, 60.0)
    if archive != "-":
        _import(opts, archive, dry_run, limits, wait)
        return
    # a tar holds headers and padding besides the files: twice the files' bound bounds the stream
    with _Bar(opts, "receiving", unit="bytes", delay=0.5) as bar, \
            stdio.spooled_stdin(2 * limits.max_total + (1 << 20), bar) as path:
        bar.close()  # the import's own bar follows
        try:
            _import(opts, path, dry_run, limits, wait, shown="-")
        except KcacheError as exc:  # say where it came from, not where it was kept
            exc.args = (str(exc).replace(path, stdio.SHOWN), *exc.args[1:])
            raise


def _import(opts: o.GlobalOptions, archive: str, dry_run: bool, limits, wait: float, shown: str = "") -> None:
    """Import the archive file `archive` (`shown`: what the user named, when not that file)."""
    if is_blob(archive):  # a torch Mega-Cache blob: each artifact where torch's load would write it
        import_blob(opts, archive, dry_run, wait)
        return
    root = _import_root(opts, archive)
    with _Bar(opts, "verifying" if dry_run else "importing", unit="bytes") as bar:
        result = importer.import_archive(root, archive, dry_run=dry_run, limits=limits, lock_timeout=wait,
                                note=lambda m: c.info(opts, m), progress=bar)
    if shown:
        result = dataclasses.replace(result, archive=shown)
    fit = gpu.arch_fit({e.relpath: e.arch if e.action != "skip" else None for e in result.entries},
                       {e.relpath: layout_of(e.layout).runs_on for e in result.entries})
    out = c.Output(opts)
    c.warn_arch_misfits(out, result.entries, fit, "imported")
    out.result(result.to_json(fit.gpus, fit.fits), lambda: _import_human(out, result, dry_run))
    if result.obstructed:  # importing again mends nothing: exit 1, said under -q too
        raise importer.in_the_way(result, "import")
    if result.lock_timeouts:  # the rest is in; these wait for a build that holds them (as build says: exit 3)
        raise importer.held_locks(result.lock_timeouts, wait, "import")


def _import_root(opts: o.GlobalOptions, archive: str):
    """--cache-dir or KCACHE_DIR; else the default root of the one layout the archive's entries are of
    (a Triton archive goes where Triton looks), else the build layout's (hidet's rule)."""
    if c.explicit_root(opts):
        return c.cache_root(opts)

    layouts = importer.archive_layouts(archive)
    if len(layouts) == 1:
        try:
            return locate.named_cache(layouts[0]).path
        except locate.UntrustedRoot:  # another user's directory there: never the place to import into
            raise
        except UsageError:  # a layout without a default place (or one refused as a root)
            pass
    return c.cache_root(opts)


def _import_human(out: c.Output, result, dry_run: bool) -> None:
    """A row per entry, then the totals; -q: nothing (a report, like tar's -v: a CI step is silent when it
    works; warnings and errors still show)."""
    if out.opts.quiet:
        return
    shown = list(result.entries)
    if sys.stdout.isatty() and len(shown) > TTY_ROWS:  # a terminal gets the skips first, then a sample
        shown = sorted(shown, key=lambda e: e.action != "skip")[:TTY_ROWS]
    if shown:
        rows = [[e.action, e.layout, e.kind, e.space or "-", e.op or "-", e.hash, str(e.files),
                 c.human_size(e.size), e.arch or "-", e.reason or ""] for e in shown]

        c.print_table([Column("action"), Column("layout", drop=1), Column("kind", drop=2), Column("space", drop=8),
                       Column("op", drop=7), Column("hash", spill=True), Column("files", right=True, drop=3),
                       Column("size", right=True, drop=6), Column("arch", drop=7), Column("note", wrap=True)], rows)
    if len(shown) < len(result.entries):
        more = c.plural(len(result.entries) - len(shown), "more entry", "more entries")
        out.info(f"({more} not shown: see --json)")
    verb = "would import" if dry_run else "imported"
    came, replaced = result.count("import") + result.count("replace"), result.count("replace")
    held = [f"{result.lock_timeouts} whose lock was held"] if result.lock_timeouts else []
    held += [f"{len(result.obstructed)} with something in the way"] if result.obstructed else []
    locked = f" ({', '.join(held)})" if held else ""
    out.info(f"{verb} {c.plural(came, 'entry')} ({replaced} replacing incomplete ones), skipped "
             f"{result.count('skip')}{locked}; {c.plural(result.files, 'file')} ({c.human_size(result.size)}) verified "
             f"{'' if dry_run else 'into ' + result.root}".rstrip())


@c.selectors(size_age=True)
def verify_command(
    ctx: typer.Context,
    sel: c.Selection,
    fix: Annotated[bool, typer.Option("--fix", help="Rewrite the absolute paths entries record about themselves "
                                                    "to where they lie now (a cache moved or copied by hand), "
                                                    "for layouts kcache can relocate (Triton's group files; "
                                                    "not a moved torch extension, which torch builds again); "
                                                    "and remove lock files a killed build left, that no live "
                                                    "process holds (torch extensions' lock).")
                   ] = False,
    all_caches: c.AllCachesOpt = False,
    cache: c.CacheOpt = None,
    cache_dir: o.CacheDirOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """Check every byte of every entry; exit 1 on any problem.

    Each entry is checked against its layout's rules and recorded checksums.

    Reads every byte: every file the compiler's loader reads on a hit, files against kcache.json or
    tilelang's manifests, tilus links, binaries, Triton's group files. Entries that are not complete are
    problems; entries being built are skipped. --fix rewrites the paths an entry records about itself
    when they point at another root (the layout's relocation hook, as import uses). Without --cache-dir
    or KCACHE_DIR: every cache found (--json: a list, one result per cache), or the one the current
    directory lies in.

    A torch Mega-Cache blob named alone is checked instead: its CRC32, version and framing (exit 1
    naming the checksum when a byte changed); nothing in it is unpickled.

    Example: kcache verify --layout tilelang --json
    """
    opts = o.use(ctx, cache_dir, as_json)

    named = c.ref_list(sel.hashes)
    if len(named) == 1 and is_blob(named[0]):  # a torch Mega-Cache blob: checksum and framing
        show_blob(opts, named[0], verify=True)
        return

    locs = c.cache_locations(opts, all_caches, cache, sel.hashes, all_caches_option=True)
    chosen = []
    for loc in locs:
        refs = c.refs_in(loc.path, sel.hashes) if opts.many or len(locs) > 1 else sel.hashes
        if not sel.hashes or refs:  # else the entries named are in other caches
            chosen.append((loc.path, sel.filter(loc.path, refs), refs))
    missing = set(c.ref_list(sel.hashes))
    results = []
    for root, flt, refs in chosen:
        started = time.monotonic()
        with _Bar(opts, "scanning", unit="judged") as bar:  # the scan's count, then the entries verified
            result = verify.verify_cache(root, flt, warn=lambda m: c.warn(opts, m), progress=Phase(bar, "verifying"),
                                  fix=fix, scanning=bar)
        results.append((root, result, time.monotonic() - started))
        missing -= c.matched_refs(root, refs, [*(ch.entry for ch in result.checked), *result.skipped])
    c.hint_unknown_many(opts, [(root, flt) for root, flt, _ in chosen],
                        [e for _, r, _ in results for e in (*(ch.entry for ch in r.checked), *r.skipped)])
    if missing:
        raise c.no_match([r for r in c.ref_list(sel.hashes) if r in missing], [loc.path for loc in locs],
                         selectors=sel.has_selectors())
    _verify_report(opts, results, fix, sel.has_selectors() or bool(named))


def _verify_report(opts: o.GlobalOptions, results: list, fix: bool, selected: bool) -> None:
    """Each cache's result (--json: one object, or a list over every cache found); exit 1 on any problem.
    In text, every cache found and a selection (`--layout hidet`, entries named): the caches it names
    nothing in are no news, as clear's."""
    out = c.Output(opts, collect=opts.many)
    if opts.many and selected and not out.json and any(r.checked or r.skipped for _, r, _ in results):
        results = [(root, r, took) for root, r, took in results if r.checked or r.skipped or r.fix_errors]
    for n, (root, result, took) in enumerate(results):
        for e, error in result.fix_errors:
            out.warn(f"{e.relpath}: {error}")
        if opts.many and not out.json:
            out.text(("\n" if n else "") + f"==> {c.printable_line(str(root))} <==")
        out.result(result, functools.partial(_verify_human, out, result, root, fix, took))
    out.done(empty="no kernel cache found (see kcache dir --all)" if opts.many else None)
    if any(result.failed or result.unlisted for _, result, _ in results):
        raise typer.Exit(1)


def _verify_human(out: c.Output, result, root, fix: bool, took: float) -> None:
    failed = result.failed
    if failed:
        rows = []
        for ch in failed:
            for i, p in enumerate(ch.problems):
                e = ch.entry
                rows.append([e.layout, e.kind, e.space or "-", e.op or "-", e.hash, ch.status, p]
                            if i == 0 else ["", "", "", "", "", "", p])

        c.print_table([Column("layout", drop=1), Column("kind", drop=2), Column("space", drop=8),
                       Column("op", drop=7), Column("hash", spill=True), Column("status", styles=c.STATUS_STYLE),
                       Column("problem", wrap=True)], rows)
    if not result.exists:
        out.info(f"no cache at {root}: nothing to verify")
        return
    building = f", skipped {len(result.skipped):,} being built" if result.skipped else ""
    out.info(f"checked {c.plural(len(result.checked), 'entry')} in {took:.1f}s: "
             f"{len(result.checked) - len(failed):,} ok, {len(failed):,} with problems{building}"
             f"{_fix_words(result) if fix else ''}")


def _fix_words(result) -> str:
    """What `verify --fix` did, each kind of mending named only where it happened: paths rewritten (the
    layouts that relocate: Triton's group files), left locks removed (torch extensions); else that it
    changed nothing (a JAX cache's damaged file, a moved torch extension: nothing --fix mends)."""
    rewrote = len(result.fixed) - result.unlocked
    done = [f"rewrote the paths of {c.plural(rewrote, 'entry')}"] if rewrote else []
    if result.unlocked:
        notes = "".join(f" ({note})" for note in result.unlock_notes)
        done.append(f"removed the left lock of {c.plural(result.unlocked, 'entry')}{notes}")
    return ", " + ", ".join(done) if done else ", --fix changed nothing"
