"""The commands that free space: prune (what is safe and useful to remove) and clear (what you select).

Both are thin: scan -> plan (kcache_cli.ops.delete) -> show -> confirm (clear) -> execute -> report."""

import contextlib
import sys
from typing import TYPE_CHECKING, Annotated, Iterator, Optional

import typer

from kcache_cli.cli import common as c
from kcache_cli.cli import options as o
from kcache_cli.cli.progress import Bar, Phase, scanning
from kcache_cli.cli.table import Column, render
from kcache_cli.util import interrupts
from kcache_cli.util.errors import KcacheError, UsageError
from kcache_cli.util.lazy import lazy_module
from kcache_cli.util.units import format_age, parse_age, parse_size

if TYPE_CHECKING:  # the real imports, for mypy; at run time each loads at its first use
    from kcache_cli.catalog import scan
    from kcache_cli.model.records import ScanResult
    from kcache_cli.ops import budget, config, delete
else:
    budget = lazy_module("kcache_cli.ops.budget")
    delete = lazy_module("kcache_cli.ops.delete")
    scan = lazy_module("kcache_cli.catalog.scan")
    config = lazy_module("kcache_cli.ops.config")


def register(app: typer.Typer) -> None:
    app.command("prune")(prune_command)
    app.command("clear")(clear_command)


DryRunOpt = Annotated[bool, typer.Option("--dry-run", "-n", help="Show what would be removed; change nothing.")]
GC_WAIT = 600.0  # seconds a prune or clear waits for another one of the same cache (a default deadline)
LockTimeoutOpt = Annotated[Optional[str], c.lock_timeout_option("another prune or clear of the same cache",
                                                                f"{GC_WAIT:g}")]


SCREENFUL = 20  # more removals than this are shown grouped unless --list (issue 32: output fit for cron)
SUMMARY_ROWS = 15  # at most this many groups, then one line for the rest
SummaryOpt = Annotated[bool, typer.Option(
    "--summary", help="Show the plan (or what was removed) grouped by target, space and op, one line each with "
                      "the count and size (the default past 20 entries), instead of one line per entry.")]
ListOpt = Annotated[bool, typer.Option(
    "--list", "-v", help="List every entry removed or kept, one line each, however many (past 20 the "
                         "default is a summary: count and size per target, space and op, kept entries per reason).")]


def prune_command(
    ctx: typer.Context,
    max_size: Annotated[Optional[str], typer.Option(
        "--max-size", metavar="SIZE", help="Remove least recently used entries until the cache fits in SIZE on disk "
        "(over every cache found, the default without --cache-dir: until all of them together fit, least "
        "recently used first across them) "
        "(10GB, 500M, 2GiB; K/M/G/T are powers of 1000, Ki/Mi/Gi/Ti of 1024).")] = None,
    older_than: Annotated[Optional[str], typer.Option(
        "--older-than", metavar="AGE", help="Remove entries not used for AGE (30d, 12h, 90m, 2w, 6mo, 1d12h).")] = None,
    broken: Annotated[bool, typer.Option(
        "--broken", help="Remove partial, failed and corrupt entries (and symlinks where entries belong); "
        "never unreadable or stale ones.")] = False,
    stale: Annotated[bool, typer.Option(
        "--stale", help="Remove stale entries: another compiler version's, which the installed loader never "
        "looks up again (another environment may still use them).")] = False,
    deep: Annotated[bool, typer.Option(
        "--deep", help="With --broken: judge entries by reading every byte, as verify does (slow on a big "
        "cache); without it, as ls does, from names, sizes and headers.")] = False,
    dry_run: DryRunOpt = False,
    summary: SummaryOpt = False,
    listing: ListOpt = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Remove more than half of the cache without asking "
                                                         "(needed without a terminal); otherwise prune never "
                                                         "asks.")] = False,
    all_caches: c.AllCachesOpt = False,
    cache: c.CacheOpt = None,
    lock_timeout: LockTimeoutOpt = None,
    no_index: o.NoIndexOpt = False,
    cache_dir: o.CacheDirOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """Free space safely, while the cache is in use.

    Removes the least recently used entries beyond --max-size, entries unused for --older-than,
    broken entries with --broken, stale ones with --stale; always what interrupted writers left (a
    kcache build's temp directory once its lock is free, other temp/staging directories untouched for
    an hour; --broken names those it keeps). hidet's candidates/ (kept under debug_cache_tuning) stay.
    Builds in progress are skipped; nothing outside the cache is touched. Without --cache-dir or KCACHE_DIR: every cache
    found, or the one the current directory lies in; --cache NAME picks one. With none of these criteria,
    the budget `kcache config` holds (max-size and max-age per cache, and for all caches together).

    Example: kcache prune --max-size 10GB --older-than 30d --dry-run
    """
    opts = o.use(ctx, cache_dir, as_json)
    if deep and not broken:
        raise UsageError("--deep goes with --broken (it says how broken entries are judged)")
    limit = parse_size(max_size, "--max-size") if max_size is not None else None
    age = parse_age(older_than, "--older-than") if older_than is not None else None
    opts.lock_timeout = c.lock_timeout(lock_timeout, GC_WAIT)
    locs = c.cache_locations(opts, all_caches, cache, all_caches_option=True)
    out, scans = _Out(opts, opts.many), _Scans(opts, not no_index)
    limits, ages = _prune_limits(opts, locs, limit, age, broken or stale, scans)
    out.summary, out.listing = summary, listing
    plans = [(loc, _plan_one(opts, loc, limits[str(loc.path)], ages[str(loc.path)], (broken, stale, deep), scans))
             for loc in locs if str(loc.path) in limits]
    _criteria_hint(opts, plans, limits, ages, broken or stale)
    shared = limit if opts.many and limit is not None and len(locs) > 1 else None  # one --max-size for all
    _prune_planned(opts, out, plans, (limits, ages, shared), dry_run, yes)
    out.done(empty="no kernel cache found (see kcache dir --all)" if opts.many else None)
    _unmeasured_fails(opts, plans, limits, scans.unread)


def _unread_fails(unread: dict[str, str]) -> None:
    """A cache whose budget could not be read was not pruned (the others were): a failed check, exit 1."""
    if unread:
        more = f" (and {c.plural(len(unread) - 1, 'other cache')})" if len(unread) > 1 else ""
        raise KcacheError(f"{next(iter(unread.values()))}; that cache{more} was not pruned")


def _unmeasured_fails(opts: o.GlobalOptions, plans: list, limits: dict, unread: dict[str, str]) -> None:
    """A prune to a size (--max-size, a budget) that could not measure part of a cache cannot tell whether
    that cache fits: a failed check, exit 1, once every cache has been pruned and reported; and so is one
    whose budget could not be read (`unread`, _unread_fails: a warning as well, when the error is the
    other one)."""
    short = [(plan, limits[str(loc.path)]) for loc, plan in plans
             if plan.unreadable and limits[str(loc.path)] is not None]
    if not short:
        return _unread_fails(unread)
    for why in unread.values():  # not pruned at all: said, not hidden behind the error below
        c.warn(opts, f"{why}; that cache was not pruned")
    plan, limit = short[0]
    more = f" (and {c.plural(len(short) - 1, 'other cache')})" if len(short) > 1 else ""
    n = len(plan.unreadable)
    raise KcacheError(f"{c.plural(n, 'directory')} of {plan.root}{more} could not be read: "
                      f"{'its size is' if n == 1 else 'their sizes are'} not counted, so the cache may still be "
                      f"over its max-size of {c.human_size(limit)}")


def _prune_planned(opts: o.GlobalOptions, out: "_Out", plans: list, budgets: tuple[dict, dict, int | None],
                   dry_run: bool, yes: bool) -> None:
    """Every root's plan asks for the confirmation it needs first (a refusal removes nothing from any
    cache), then each is reported or carried out."""
    if not dry_run and not yes:
        with _nothing_removed_yet():
            for _, plan in plans:
                if plan.exists:
                    _confirm_big_prune(opts, plan)
    limits, ages, shared = budgets
    for loc, plan in plans:
        if not _idle(out, plan):
            out.section(loc, idle=plan.exists and not plan.removals and not plan.skipped)
        _act_one(opts, out, loc, plan, {"max_size": limits[str(loc.path)], "older_than": ages[str(loc.path)],
                                        "max_size_shared": shared}, dry_run)



class _Scans:
    """Each root's one scan in this command: a budget over several caches weighs them with it, and each
    root's plan is made from the same scan (`done`, taken by the plan), never a second one. `use_index`:
    unchanged entries answered from the index."""

    def __init__(self, opts: o.GlobalOptions, use_index: bool = True) -> None:
        self.opts, self.use_index = opts, use_index
        self.done: dict[str, ScanResult] = {}
        self.unread: dict[str, str] = {}  # root -> why its budget could not be read (it is not pruned)

    def __call__(self, root):
        key = str(root)
        if key not in self.done:
            self.done[key] = scan.scan_cache(root, warn=lambda m: c.warn(self.opts, m), use_index=self.use_index)
        return self.done[key]


def _prune_limits(opts: o.GlobalOptions, locs: list, limit, age, damaged: bool, scans: _Scans) -> tuple[dict, dict]:
    """Each root's max-size and max-age: the ones given; with no criteria at all, the budget `kcache
    config` holds; over several caches one --max-size for all of them, least recently used first."""
    limits = {str(loc.path): limit for loc in locs}
    ages = {str(loc.path): age for loc in locs}
    if limit is None and age is None and not damaged:
        return _configured_budget(opts, locs, scans)
    if opts.many and limit is not None and len(locs) > 1:

        with Bar(opts, "weighing every cache"):
            limits.update(budget.shared_limits([loc.path for loc in locs], limit, lambda m: c.warn(opts, m),
                                               scan=scans))
    return limits, ages

def _plan_one(opts: o.GlobalOptions, loc, limit, age, damaged: tuple[bool, bool, bool], scans: "_Scans"):
    """The prune plan of one root (made from its scan in this command, when the budget weighed it)."""
    broken, stale, deep = damaged
    with _nothing_removed_yet(), _busy(opts, f"scanning {c.printable_line(str(loc.path))}") as bar:
        plan = delete.plan_prune(loc.path, max_size=limit, older_than=age, broken=broken, stale=stale, deep=deep,
                          warn=lambda m: c.warn(opts, m), progress=bar, judging=Phase(bar, "reading every byte"),
                          scanned=scans.done.pop(str(loc.path), None), use_index=scans.use_index)
    if _found_nothing(plan, limit, age, broken or stale):
        c.info(opts, f"checked {plan.root} ({c.human_size(plan.scanned_size)}) for what prune always removes: "
                     "stale temp and staging directories; none found.")
    return plan


def _found_nothing(plan, limit, age, damaged: bool) -> bool:
    """Whether a prune with no criteria for this root (no size, age, --broken or --stale) found nothing."""
    return plan.exists and limit is None and age is None and not damaged and not plan.removals


def _criteria_hint(opts: o.GlobalOptions, plans: list, limits: dict, ages: dict, damaged: bool) -> None:
    """After the `checked ROOT ...; none found.` of a prune without criteria, what removes entries: once,
    however many caches were checked."""
    if any(_found_nothing(plan, limits[str(loc.path)], ages[str(loc.path)], damaged) for loc, plan in plans):
        c.info(opts, "--max-size, --older-than, --broken and --stale remove entries, and so does a budget "
                     "(kcache config set max-size 20G).")


def _act_one(opts: o.GlobalOptions, out: "_Out", loc, plan, extra: dict, dry_run: bool) -> None:
    """One root's planned prune, reported (--dry-run) or carried out and reported."""
    if not plan.exists:
        return _missing(opts, out, loc, dry_run, extra)
    if dry_run:
        return _report_plan(opts, out, plan, extra)
    result = _execute(opts, plan)
    _report_result(opts, out, plan, result, extra)


def _configured_budget(opts: o.GlobalOptions, locs, scans: _Scans) -> tuple[dict, dict]:
    """Each root's (max size, max age): the budget kept in the cache, else (caches this user owns) the
    user's `kcache config` ({root: None} for none); said on stderr with where each value comes from."""
    cfg = config.load()
    roots = [(loc.path, scan.detect_layouts(loc.path) if loc.path.is_dir() else ()) for loc in locs]
    with _busy(opts, "weighing every cache"):
        budgets = budget.effective(roots, cfg, lambda m: c.warn(opts, m), scan=scans,
                                   unread=scans.unread if len(roots) > 1 else None)
    for root, b in budgets.items():
        parts = ([f"max-size {c.human_size(b.max_size)} ({b.size_from})"] if b.max_size is not None else []) + \
                ([f"max-age {format_age(b.max_age)} ({b.age_from})"] if b.max_age is not None else [])
        if parts:
            c.info(opts, f"budget of {c.printable_line(root)}: {', '.join(parts)}")
    return {r: b.max_size for r, b in budgets.items()}, {r: b.max_age for r, b in budgets.items()}


def _confirm_big_prune(opts: o.GlobalOptions, plan) -> None:
    """A prune that would remove more than half of the cache's bytes (`--max-size 10` read as bytes, a
    wrong --older-than) asks on a terminal and needs --yes elsewhere (issue 25): a usage error, exit 2,
    nothing removed."""
    # only working entries count: garbage (--broken, --stale, temp dirs) is removed without asking
    going = sum(r.size for r in plan.removals if r.what == "entry" and not r.recheck)
    if not plan.scanned_size or going * 2 <= plan.scanned_size:
        return
    share = f"{going * 100 // plan.scanned_size}%"
    summary = (f"{c.human_size(going)} of {c.human_size(plan.scanned_size)} ({share} of the cache) from "
               f"{c.printable_line(plan.root)}")
    if not _stdin_is_terminal():
        raise UsageError(f"not removing {summary} without confirmation: more than half of the cache (pass --yes, "
                         "or --dry-run to see what would go)")
    _preview(plan)
    if not typer.confirm(f"Remove {summary}?", default=False, err=True):
        raise KcacheError("aborted: nothing was removed")


def clear_command(
    ctx: typer.Context,
    hashes: Annotated[Optional[list[str]], typer.Argument(
        metavar="[ENTRY]...", help=f"Entries to remove: {c.ENTRY_HELP}.", show_default=False,
        autocompletion=c.complete.complete_hash)] = None,
    op: c.OpOpt = None,
    space: c.SpaceOpt = None,
    target: c.TargetOpt = None,
    layout: c.LayoutOpt = None,
    status: c.StatusOpt = None,
    kind: c.KindOpt = None,
    everything: Annotated[bool, typer.Option("--all", help="Everything in the cache.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation (needed without a "
                                                         "terminal).")] = False,
    summary: SummaryOpt = False,
    listing: ListOpt = False,
    dry_run: DryRunOpt = False,
    all_caches: c.AllCachesOpt = False,
    cache: c.CacheOpt = None,
    lock_timeout: LockTimeoutOpt = None,
    no_index: o.NoIndexOpt = False,
    cache_dir: o.CacheDirOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """Remove the entries you select, after showing them and asking.

    Select with --space, --op, --target, --layout, --status, --kind, entries by hash prefix or
    path, or --all. Builds in progress are skipped; tilus programs a kept
    script links to and tilelang binaries a kept kernel embeds are kept. Without --cache-dir or
    KCACHE_DIR the selection is made in every cache found (--space cuda_space_2 is hidet's space 2;
    other caches simply have none), or in the one the current directory lies in; --cache NAME picks one.

    Example: kcache clear --space cuda_space_2 --dry-run
    """
    opts = o.use(ctx, cache_dir, as_json)
    opts.lock_timeout = c.lock_timeout(lock_timeout, GC_WAIT)
    selected = bool(op or space or target or layout or status or kind)
    if not everything and not (hashes or selected):
        raise UsageError("clear needs a selection: --space, --op, --target, --layout, --status, --kind, "
                         "entries, or --all (see 'kcache clear --help')")
    locs = c.cache_locations(opts, all_caches, cache, hashes, all_caches_option=True)
    out = _Out(opts, opts.many)
    out.summary, out.listing = summary, listing
    plans = _clear_plans(opts, locs, hashes, lambda root, refs: c.make_filter(
        op, space, target, layout, status, kind, refs, root=root), everything, selected, not no_index)
    anywhere = any(plan.removals or plan.skipped for _, plan in plans)
    for loc, plan in plans:
        if opts.many and anywhere and not out.json and not (plan.removals or plan.skipped):
            continue  # every cache: the ones the selection names nothing in are no news
        if not _idle(out, plan):
            out.section(loc, idle=plan.exists and not plan.removals and not plan.skipped)
        _clear_one(opts, out, loc, plan, yes, dry_run)
    out.done(empty="no kernel cache found (see kcache dir --all)" if opts.many else None)



def _clear_plans(opts: o.GlobalOptions, locs: list, hashes, filter_of, everything: bool, selected: bool,
                 use_index: bool) -> list:
    """(location, plan) for each cache the selection reaches; an entry named that is in none of them is an
    error before anything is removed (a typo, not "no entries")."""
    missing = set(c.ref_list(hashes))
    chosen, plans = [], []
    for loc in locs:
        refs = c.refs_in(loc.path, hashes) if opts.many or len(locs) > 1 else hashes
        if hashes and not refs:
            continue  # the entries named are in other caches: nothing of this one is selected
        chosen.append((loc, refs, filter_of(loc.path, refs)))
    found: list = []
    for loc, refs, flt in chosen:
        plans.append((loc, _plan_clear(opts, loc, flt, everything, use_index)))
        picked = [*(r.entry for r in plans[-1][1].removals), *(s.entry for s in plans[-1][1].skipped)]
        missing -= c.matched_refs(loc.path, refs, picked)
        found += picked
    c.hint_unknown_many(opts, [(loc.path, flt) for loc, _, flt in chosen], found)
    if missing:
        raise c.no_match([r for r in c.ref_list(hashes) if r in missing], [loc.path for loc in locs],
                         selectors=selected)
    return plans

def _plan_clear(opts: o.GlobalOptions, loc, flt, everything: bool, use_index: bool):
    with _nothing_removed_yet(), _busy(opts, f"scanning {c.printable_line(str(loc.path))}") as bar:
        return delete.plan_clear(loc.path, flt, everything=everything, warn=lambda m: c.warn(opts, m), progress=bar,
                                 use_index=use_index)


def _clear_one(opts: o.GlobalOptions, out: "_Out", loc, plan, yes: bool, dry_run: bool) -> None:
    if not plan.exists:
        return _missing(opts, out, loc, dry_run, {})
    if dry_run:
        return _report_plan(opts, out, plan, {})
    if not plan.removals:
        if not plan.skipped:
            c.info(opts, f"no entries in {plan.root} match the selection")
        return _report_result(opts, out, plan, None, {})
    if not yes:
        summary = (f"{c.plural(plan.entries, 'entry')}, "
                   f"{c.human_size(plan.expected_freed_size)} ({c.plural(plan.expected_freed_size, 'byte')}) "
                   f"from {plan.root}")
        if not _stdin_is_terminal():
            raise UsageError(f"not removing {summary} without confirmation: stdin is not a terminal (pass --yes)")
        _preview(plan)
        for s in plan.skipped:
            c.warn(opts, f"kept {s.entry.relpath}: {s.why}")
        with _nothing_removed_yet():
            if not typer.confirm(f"Remove {summary}?", default=False, err=True):
                raise KcacheError("aborted: nothing was removed")
    result = _execute(opts, plan)
    _report_result(opts, out, plan, result, {})


class _Out(c.Output):
    """c.Output, with a heading naming each root for --all-caches (JSON: one object per root, in a list)."""

    def __init__(self, opts: o.GlobalOptions, all_caches: bool) -> None:
        super().__init__(opts, collect=all_caches)
        self.sections = 0
        self.idle_last = False  # the last root's report was one "Nothing to remove" line
        self.summary = False  # tables grouped by target, space and op (--summary)
        self.listing = False  # one row per entry however many (--list)

    def grouped(self, n: int) -> bool:
        """Whether `n` removals (or kept entries) are shown grouped: asked for, or more than a screenful
        without --list (cron mails stay short)."""
        return self.summary or (n > SCREENFUL and not self.listing)

    def section(self, loc, idle: bool = False) -> None:
        """The heading of the next root's report; `idle` (nothing to remove, nothing kept): none, its one line
        names the root, and idle roots in a row are not spaced apart (nine caches, nine lines)."""
        if self.collect and not self.json:
            if not idle:
                self.text(("\n" if self.sections else "") + f"==> {c.printable_line(str(loc.path))} <==")
            elif self.sections and not self.idle_last:
                self.text("")
        self.idle_last = idle
        self.sections += 1


# ---- helpers -------------------------------------------------------------------------------------
def _idle(out: _Out, plan) -> bool:
    """-q and nothing to say of this cache (nothing to remove, nothing kept): no heading and no "Nothing
    removed" line, so that a cron job that had nothing to do mails nothing; warnings and errors still show."""
    return out.opts.quiet and not out.json and not (plan.exists and (plan.removals or plan.skipped))


class Interrupted(KcacheError):
    """Ctrl-C (or SIGTERM, SIGHUP taken as it): what was done is said, exit 128 + the signal (130 for Ctrl-C,
    as a shell reports a SIGINT)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.exit_code = interrupts.exit_status()


@contextlib.contextmanager
def _nothing_removed_yet() -> Iterator[None]:
    """Ctrl-C while scanning, planning or asking: nothing was removed, and the message says so."""
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted("interrupted: nothing was removed") from None


def _stdin_is_terminal() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def _progress_wanted(opts: o.GlobalOptions) -> bool:
    return not opts.quiet and sys.stderr.isatty()


def _busy(opts: o.GlobalOptions, text: str):
    """What is going on while planning: the scan's counting bar, once it takes half a second."""
    return scanning(opts, text)


def _execute(opts: o.GlobalOptions, plan):
    def waiting() -> None:
        c.info(opts, f"waiting for another prune or clear of {plan.root} to finish...")

    wait = GC_WAIT if opts.lock_timeout is None else opts.lock_timeout
    if not _progress_wanted(opts) or len(plan.removals) < 2:
        return plan.execute(on_wait=waiting, lock_timeout=wait, interruptible=True)

    with Bar(opts, "removing") as bar:
        bar.start(len(plan.removals))
        return plan.execute(progress=lambda r: bar.advance(1), on_wait=waiting, lock_timeout=wait,
                            interruptible=True)


def _missing(opts: o.GlobalOptions, out: _Out, loc, dry_run: bool, extra: dict) -> None:
    """A cache that is not there: nothing to remove (exit 0). Named by KCACHE_DIR (--cache-dir's is an error
    before this), a warning, which -q does not hide: a cron line's mistyped variable must not pass unseen;
    among every cache found, a note."""
    say = out.warn if c.explicit_root(opts) else out.info
    out.result(delete.DeletePlan(str(loc.path), exists=False).to_json(extra, dry_run=dry_run),
               lambda: say(f"no cache at {loc.path} ({loc.reason}): nothing to remove"))


def _rows(removals) -> list[list[str]]:
    """One row per removal; `what` is the entry's kind (op, program, kernel...) or what else goes
    (candidates, temp, staging, link)."""
    return [[r.entry.kind if r.what == "entry" else r.what, r.entry.layout, r.entry.space or "-",
             r.entry.op or "-", r.entry.hash or "-", c.human_size(r.size), c.human_age(r.entry.last_used), r.why]
            for r in removals]


def _table(removals, to_stderr: bool = False, limit: int | None = None) -> None:
    """The removals as a table fitted to the terminal (hash and size always; the reason wraps)."""
    shown = list(removals)[:limit] if limit else list(removals)
    rows = [[c.printable_line(cell) for cell in row] for row in _rows(shown)]  # names stay inert
    if not rows:
        return
    cols = [Column("what", drop=2), Column("layout", drop=1), Column("space", drop=8), Column("op", drop=7),
            Column("hash", spill=True), Column("size", right=True, drop=4), Column("last used", drop=3),
            Column("why", wrap=True)]
    if to_stderr:
        width = c.stderr_width() if sys.stderr.isatty() else c.output_width()
        lines = render(cols, rows, width, colour=False)
        if limit and len(removals) > limit:
            lines.append(f"... and {len(removals) - limit} more")
        sys.stderr.write("".join(line + "\n" for line in lines))
        return
    c.print_table(cols, rows)


def _preview(plan) -> None:
    _table(plan.removals, to_stderr=True, limit=20)


def _summary(removals) -> list[dict]:
    """The removals grouped by target, space and op (and what goes: entries of a kind, temp directories...):
    one row each with the count and bytes, biggest first (prune --summary; JSON `summary`). A target is not
    a space: an Inductor C++ code shard is target cpu in no space, as ls lists it."""
    groups: dict[tuple, dict] = {}
    for r in removals:
        e = r.entry
        key = (e.target, e.space, e.op, e.kind if r.what == "entry" else r.what)
        g = groups.setdefault(key, {"target": key[0], "space": key[1], "op": key[2], "what": key[3],
                                    "entry_count": 0, "size": 0})
        g["entry_count"] += 1
        g["size"] += r.size
    return sorted(groups.values(), key=lambda g: (-g["size"], g["target"] or "", g["space"] or "", g["op"] or "",
                                                  g["what"]))


def _summary_table(removals) -> None:
    groups = _summary(removals)
    rows = [[g["target"] or "-", g["space"] or "-", g["op"] or "-", g["what"], f"{g['entry_count']:,}",
             c.human_size(g["size"])] for g in groups[:SUMMARY_ROWS]]
    if len(groups) > SUMMARY_ROWS:  # a few lines whatever the cache holds (cron mail)
        rest = groups[SUMMARY_ROWS:]
        rows.append(["...", "", f"{len(rest)} more", "", f"{sum(g['entry_count'] for g in rest):,}",
                     c.human_size(sum(g["size"] for g in rest))])
    c.print_table([Column("target", drop=0), Column("space", drop=2), Column("op"), Column("what", drop=1),
                   Column("entries", right=True), Column("size", right=True)], rows)


def _removals_table(out: _Out, removals) -> None:
    """One row per removal, or grouped by target, space and op (--summary, or more than a screenful without
    --list)."""
    if out.grouped(len(removals)):
        _summary_table(removals)
    else:
        _table(removals)


def _kept(out: _Out, skipped, verb: str) -> None:
    """One warning per entry kept; more than a screenful without --list: one per reason, with the count."""
    if not out.grouped(len(skipped)):
        for s in skipped:
            out.warn(f"{verb} {s.entry.relpath}: {s.why}")
        return
    whys: dict[str, int] = {}
    for s in skipped:
        whys[s.why] = whys.get(s.why, 0) + 1
    shown = sorted(whys.items(), key=lambda kv: (-kv[1], kv[0]))
    for why, n in shown[:SUMMARY_ROWS]:
        out.warn(f"{verb} {c.plural(n, 'entry')}: {why}")
    if len(shown) > SUMMARY_ROWS:
        out.warn(f"{verb} {c.plural(sum(n for _, n in shown[SUMMARY_ROWS:]), 'entry')} for "
                 f"{len(shown) - SUMMARY_ROWS} other reasons (--list names each)")


def _with_summary(out: _Out, doc: dict, removals) -> dict:
    return {**doc, "summary": _summary(removals)} if out.summary else doc


def _report_plan(opts: o.GlobalOptions, out: _Out, plan, extra: dict) -> None:
    out.result(lambda: _with_summary(out, plan.to_json(extra), plan.removals), lambda: _plan_human(out, plan, extra))


def _last_line(text: str, root: str) -> None:
    """prune's or clear's last line, folded to the width: the root's path, and each number with its unit,
    kept whole on a line (for copy and paste)."""
    c.print_text(text, 2, whole_words=True, keep=(c.printable_line(root),))


def _plan_human(out: _Out, plan, extra: dict) -> None:
    _kept(out, plan.skipped, "would keep")
    if not plan.removals:
        if out.opts.quiet:
            return
        _last_line(f"Nothing to remove in {c.printable_line(plan.root)} ({c.human_size(plan.scanned_size)} "
                   f"scanned){_unread(plan, extra)}{_trash(plan.trash, False)}.", plan.root)
        return
    _removals_table(out, plan.removals)
    _last_line(f"Would remove {_count(plan.removals)} and free {c.human_size(plan.expected_freed_size)} "
               f"({c.plural(plan.expected_freed_size, 'byte')}) from {c.printable_line(plan.root)}"
               f"{_sizes(plan, extra)}{_unread(plan, extra)}{_trash(plan.trash, False)}. Nothing was changed "
               "(--dry-run).", plan.root)


def _trash(size: int, done: bool) -> str:
    """What a prune or clear empties before anything else: what an interrupted one left in the trash (no entry's
    bytes any more: not in what is freed, nor in the cache's size)."""
    if not size:
        return ""
    return (f"; {'emptied' if done else 'would empty'} {c.human_size(size)} left in the trash by an interrupted "
            "prune or clear")


def _report_result(opts: o.GlobalOptions, out: _Out, plan, result, extra: dict) -> None:

    fresh = result.warnings[len(plan.warnings):] if result else ()  # the plan's were shown already
    if result is None:  # nothing was selected: nothing ran
        result = delete.DeleteResult(plan.root, (), plan.skipped, (), 0, (), plan.warnings, unreadable=plan.unreadable)
    plan = result.planned or plan  # made again after waiting for another prune: its sizes are today's
    done = (f"interrupted: removed {result.entries:,} of {c.plural(plan.entries, 'entry')}, "
            f"{c.human_size(result.freed)}; nothing half-removed")
    try:
        out.result(lambda: _with_summary(out, result.to_json(plan.scanned_size, extra), result.removed),
                   lambda: _result_human(out, plan, result, extra, fresh))
    except KeyboardInterrupt:  # Ctrl-C while a long table is printed: the removal itself is over
        raise Interrupted(done) from None
    if result.errors:
        for _, m in result.errors:
            out.error(m)
    if result.interrupted:
        raise Interrupted(done)
    if result.errors:
        raise KcacheError(f"{c.plural(len(result.errors), 'item')} could not be removed (see above)")


def _result_human(out: _Out, plan, result, extra: dict, fresh_warnings) -> None:
    gone = [s for s in result.skipped if s.why == delete.ALREADY_GONE]  # another prune's work: no warning
    kept = [s for s in result.skipped if s.why != delete.ALREADY_GONE]
    _kept(out, kept, "kept")
    if gone:
        one = len(gone) == 1
        out.info(f"{c.plural(len(gone), 'entry')} planned to go {'was' if one else 'were'} already gone "
                 f"(another prune or clear removed {'it' if one else 'them'} meanwhile)")
    for w in fresh_warnings:
        out.warn(w)
    if result.removed:
        _removals_table(out, result.removed)
        _last_line(f"Removed {_count(result.removed)}, freed {c.human_size(result.freed)} "
                   f"({c.plural(result.freed, 'byte')}) from {c.printable_line(plan.root)}"
                   f"{_sizes(plan, extra, result.freed)}{_unread(plan, extra)}{_trash(result.trash, True)}.",
                   plan.root)
    elif not out.opts.quiet:
        _last_line(f"Nothing removed from {c.printable_line(plan.root)}{_unread(plan, extra)}"
                   f"{_trash(result.trash, True)}.", plan.root)
    limit = extra["max_size"] if extra.get("max_size") is not None else 1 << 62
    over = plan.scanned_size - result.freed - sum(s.entry.size for s in gone) - limit
    if over > 0 and (kept or result.errors):  # what was kept or failed is not made up for by others
        out.warn(f"{c.printable_line(plan.root)} is still {c.human_size(over)} over its limit: "
                 f"{_not_gone(kept, result.errors)}")


def _not_gone(kept: list, errors) -> str:
    """Why a prune left the cache over its limit: what it kept, what it could not remove."""
    said = []
    if errors:
        said.append(f"{c.plural(len(errors), 'item')} could not be removed (the errors below say why)")
    if kept:
        one = len(kept) == 1
        said.append(f"{c.plural(len(kept), 'entry')} planned to go {'was' if one else 'were'} kept "
                    f"(prune again once {'it is' if one else 'they are'} free)")
    return "; ".join(said)


def _count(removals) -> str:
    kinds: dict[str, int] = {}
    for r in removals:
        kinds[r.what] = kinds.get(r.what, 0) + 1
    names = {"entry": ("entry", "entries"), "candidates": ("candidates/ directory", "candidates/ directories"),
             "temp": ("stale temp directory", "stale temp directories"),
             "staging": ("stale staging directory", "stale staging directories"), "link": ("symlink", "symlinks"),
             "leftover": ("leftover of an interrupted import or export", "leftovers of interrupted imports or exports")}
    return ", ".join(f"{n:,} {names[k][0] if n == 1 else names[k][1]}" for k, n in kinds.items())


def _unread(plan, extra: dict) -> str:
    """The last line's word on the directories the scan could not read: left out of every size above, so
    with a limit whether the cache fits it is not known."""
    n = len(plan.unreadable)
    if not n:
        return ""
    names = ", ".join(c.printable_line(p) for p in plan.unreadable[:3]) + (f" and {n - 3} more" if n > 3 else "")
    fits = ": whether it fits its limit is not known" if extra.get("max_size") is not None else ""
    return f"; not counted: {c.plural(n, 'directory')} it could not read ({names}){fits}"


def _sizes(plan, extra: dict, freed: int | None = None) -> str:
    if extra.get("max_size") is None:
        return ""
    after = plan.scanned_size - (plan.expected_freed_size if freed is None else freed)
    limit = f"limit {c.human_size(extra['max_size'])}"
    whole = extra.get("max_size_shared")
    if whole is not None:  # this cache's part of one --max-size over several, by last use
        limit = f"its share of --max-size {c.human_size(whole)} over every cache: {c.human_size(extra['max_size'])}"
    return f"; cache {c.human_size(plan.scanned_size)} -> {c.human_size(after)} ({limit})"
