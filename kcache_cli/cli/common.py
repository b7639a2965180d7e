"""What every command shares: the cache root, filters, and output helpers (the global options are in
options.py). Rich is imported inside the helpers that draw, the engines at their first use: help and
a TAB load this module without either."""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
import time
import typing
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, List, Optional

import typer

from kcache_cli.cli import (
    complete,  # light: the TAB path imports nothing heavy
    options,
)
from kcache_cli.cli.options import GlobalOptions, no_color, plain_output, schema_id
from kcache_cli.cli.table import Column, fold, render
from kcache_cli.fs import read as fsread
from kcache_cli.layouts import detect
from kcache_cli.model.records import ScanFilter, space_matches
from kcache_cli.model.terms import BROKEN, BROKEN_WORD, KINDS, LAYOUT_NAMES, STATUSES, is_status
from kcache_cli.util.errors import UsageError
from kcache_cli.util.lazy import lazy_module
from kcache_cli.util.textsafe import printable, printable_line
from kcache_cli.util.units import format_ago, format_size, parse_age, parse_seconds, parse_size, plural

if TYPE_CHECKING:  # the real imports, for mypy; at run time each loads at its first use
    from kcache_cli.catalog import locate, scan
    from kcache_cli.catalog import names as _names  # (`names` is a selector list below)
    from kcache_cli.util import jsonout, suggest
else:
    suggest = lazy_module("kcache_cli.util.suggest")
    jsonout = lazy_module("kcache_cli.util.jsonout")
    _names = lazy_module("kcache_cli.catalog.names")
    locate = lazy_module("kcache_cli.catalog.locate")
    scan = lazy_module("kcache_cli.catalog.scan")


def cache_location(opts: GlobalOptions, existing: bool = False):
    """The cache root. With `existing`, an explicit --cache-dir that is missing or not a directory is a usage
    error (exit 2): a typo must not read as an empty cache; so is one that holds no cache but has one a
    level or two down (D/triton/cache). An explicit root that holds no cache but lies inside one is a usage
    error for every command: read there, a damaged cache would pass; written there, entries would land in
    another cache's tree. The default root missing stays "nothing there"."""
    loc = locate.resolve_cache_dir(opts.cache_dir)
    if explicit_root(opts):
        locate.hold_explicit(loc, lambda m: warn(opts, m))
    else:  # hidet's rule (build's root): vetted like every root kcache finds by itself

        loc = locate.vetted(loc)
    if existing and opts.cache_dir and not fsread.is_dir(loc.path):
        what = "is not a directory" if loc.path.exists() else "does not exist"
        raise UsageError(f"--cache-dir {loc.path} {what}")
    if explicit_root(opts):
        _holds_a_cache(loc, below=existing)
    return loc


def _holds_a_cache(loc, below: bool) -> None:
    """Unless the explicit root holds a cache (or nothing yet, where no cache is around it), say where the
    cache is (exit 2): the one it lies inside (an entry, a level of its tree: JAX's cache directory is its
    layout's one entry) or, where that directory may never be a root ($HOME), that none holds it; or with
    `below` one a level or two down."""
    found = detect(loc.path) if fsread.is_dir(loc.path) else ()
    if found:
        fsread.hand_on(loc.path, "layouts", found)  # the scan that follows detects them once, not again
        return
    around = locate.cache_holding(loc.path, [])
    if around is not None and os.path.realpath(around.path) != os.path.realpath(loc.path):  # (made meanwhile)
        raise UsageError(f"no cache at {loc.path} ({loc.reason}): it lies inside {_a(around.cache)} cache, "
                         f"whose root is {around.path}: --cache-dir {around.path}")
    lone = locate.lone_entry(loc.path)
    if lone is not None:  # its root would be $HOME: never one, so no root kcache uses holds this cache
        owner, parent, why = lone
        raise UsageError(f"no cache at {loc.path} ({loc.reason}): it is {_a(owner)} cache itself, which kcache "
                         f"lists as the one entry of the directory holding it, and {parent} is never a cache "
                         f"root ({why}): keep the cache a level down, in a directory of its own, and pass that")
    below_it = (locate.caches_below(loc.path) or locate.caches_as_in_a_home(loc.path)) if below else []
    if below_it:
        names, path = below_it[0]
        more = f" (and {plural(len(below_it) - 1, 'other cache')})" if len(below_it) > 1 else ""
        raise UsageError(f"no cache at {loc.path} ({loc.reason}); {path} holds {_a(names)} cache{more}: "
                         f"--cache-dir {path}")


def _a(word: str) -> str:
    """`word` after its indefinite article: "a hidet", "an inductor"."""
    return f"{'an' if word and word[0].lower() in 'aeiou' else 'a'} {word}"


def cache_root(opts: GlobalOptions, existing: bool = False) -> Path:
    return cache_location(opts, existing).path


def explicit_root(opts: GlobalOptions) -> bool:
    """Whether --cache-dir or KCACHE_DIR names the one cache (else the default scope: every cache)."""
    return opts.cache_dir is not None or bool(os.environ.get("KCACHE_DIR"))


def cache_locations(opts: GlobalOptions, all_caches: bool, cache: Optional[str] = None,
                    refs: Optional[List[str]] = None, all_caches_option: bool = False) -> list:
    """The roots a command works on. --cache-dir or KCACHE_DIR: that one; `--cache NAME`: that layout's
    cache; else the cache the current directory lies in; else every cache `dir --all` finds that exists
    (--all-caches says so explicitly), plus the caches that absolute entry paths in `refs` lie in.
    Sets `opts.many` when the scope is the set of every cache (JSON lists, one per cache).
    `all_caches_option`: the command has --all-caches (a hint may offer it; else it offers --cache)."""
    opts.many = False
    if cache is not None:
        if opts.cache_dir is not None or all_caches:
            raise UsageError(f"--cache and {'--cache-dir' if opts.cache_dir is not None else '--all-caches'} "
                             "do not go together")
        return [locate.named_cache(cache)]
    if all_caches and opts.cache_dir:
        raise UsageError("--all-caches and --cache-dir do not go together")
    if not all_caches and explicit_root(opts):
        return [cache_location(opts, existing=True)]
    known = locate.existing_caches(lambda m: warn(opts, m))
    here = None if all_caches else _cwd_cache(known, lambda m: warn(opts, m))
    named = ref_list(refs)
    if here is None and not all_caches and not (named and all(os.path.isabs(r) for r in named)):
        # (entries named by absolute paths say where they are, wherever this runs)
        refused = caches_under_cwd(known, all_caches_option)
        if refused is not None:
            raise UsageError(refused)
    out = [here] if here is not None else known
    opts.many = here is None
    for ref in ref_list(refs):
        if os.path.isabs(ref) and os.path.lexists(ref):
            holder = locate.cache_holding(ref, known, lambda m: warn(opts, m))
            if holder is not None and all(os.path.realpath(holder.path) != os.path.realpath(o.path) for o in out):
                out.append(holder)
    return out


def refs_in(root: Path, refs: Optional[List[str]]) -> list[str]:
    """With --all-caches, the entry references that can name an entry of `root`: hash prefixes and
    relative paths, and the absolute paths inside it. A caller that gets [] for a non-empty `refs` must
    skip the root (no reference left is not "everything")."""
    if not refs:
        return []

    out = []
    for ref in refs:
        if os.path.isabs(ref):
            try:
                scan.split_refs(root, [ref])
            except UsageError:
                continue
        out.append(ref)
    return out


def caches_under_cwd(known: list, all_caches_option: bool) -> str | None:
    """Why the default scope is refused here, or None: a current directory that holds caches one level down
    which are not this machine's own (a copy, a CI workspace) is said so, as --cache-dir does (exit 2),
    instead of working on every cache of the machine (`clear --all` there must not mean HOME's caches).
    Only this user's copies count: a cache another user put in a shared directory (/tmp) is not one, and
    must not stop this user's commands there."""
    try:
        cwd = Path(os.getcwd())
    except OSError:
        return None

    mine = {os.path.realpath(loc.path) for loc in known}
    # entries, not merely a CACHEDIR.TAG (.mypy_cache has one): positive evidence, judged by names only
    below = [(names, p) for names, p in locate.caches_below(cwd, levels=1)
             if os.path.realpath(p) not in mine and _owned_here(p) and scan.scan_cache(p, statuses=False).entries]
    if below:
        names, path = below[0]
        more = f" (and {plural(len(below) - 1, 'other cache')})" if len(below) > 1 else ""
        other = ("--all-caches for this machine's caches" if all_caches_option
                 else "--cache NAME for one of this machine's caches")  # only an option the command has
        return (f"no cache at {cwd} (the current directory); {path} holds {_a(names)} cache{more}: "
                f"--cache-dir {path}, or {other}")
    return None


def cwd_scope(opts: GlobalOptions) -> tuple[Any, str | None]:
    """(the cache the current directory lies in, among this machine's, or None; where it lies in none, why
    ls, stats, prune... refuse to work on every cache from here (caches_under_cwd), or None). Both None
    where --cache-dir or KCACHE_DIR names the root. This machine's caches are looked for once."""
    if explicit_root(opts):
        return None, None
    known = locate.existing_caches(lambda m: warn(opts, m))
    here = _cwd_cache(known, lambda m: warn(opts, m))
    return here, caches_under_cwd(known, True) if here is None else None


def _owned_here(path) -> bool:
    """Whether the directory `path` (not followed if a link) is this user's."""
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return False


def _cwd_cache(known: list, said: Callable[[str], None]):
    """The cache the current directory lies in, or None (also when it was removed under us)."""
    try:
        return locate.cache_holding(os.getcwd(), known, said)
    except OSError:
        return None


def resolve_in_scope(opts: GlobalOptions, ref: str, cache: Optional[str], pick: Callable[[Path], Any],
                     statuses: bool = True, selectors: bool = True, locs: Optional[list] = None) -> tuple:
    """(location, entry) of the one entry `ref` names in the command's scope (cache_locations): found in
    exactly one cache; in several, a usage error naming them (--cache picks one); in none, no_match.
    `pick(root)` is the checked filter of the --space/--op... that tell entries apart. `locs`: the scope
    as the command found it for all its references (a command naming several finds the caches once)."""
    locs = locs if locs is not None else cache_locations(opts, False, cache, [ref])
    misses: list[UsageError] = []
    matches: list[tuple[Any, list, Optional[UsageError]]] = []  # (location, its entries, its ambiguity)
    narrowed = False  # whether --space, --op... left out entries the reference may name
    for loc in locs:
        if len(locs) > 1 and not refs_in(loc.path, [ref]):
            continue  # an absolute path into another cache
        flt = pick(loc.path)
        narrowed = narrowed or bool(flt.ops or flt.spaces or flt.layouts or flt.kinds)
        if not opts.many:
            hint_unknown(opts, loc.path, flt)
        try:
            matches.append((loc, [scan.resolve_entry(loc.path, ref, warn=lambda m: warn(opts, m), flt=flt,
                                                     statuses=statuses, selectors=selectors)], None))
        except scan.NoSuchEntry as exc:
            misses.append(exc)
        except scan.Ambiguous as exc:  # several here, and the other caches' matches belong in the answer
            matches.append((loc, exc.entries, exc))
    if len(matches) == 1:
        loc, entries, ambiguous = matches[0]
        if ambiguous is not None:
            raise ambiguous
        return loc, entries[0]
    if matches:
        raise _in_caches(ref, [(loc, entries) for loc, entries, _ in matches])
    if len(misses) == 1 and len(locs) == 1 and not fsread.is_dir(locs[0].path):
        raise misses[0]  # "(... does not exist)"
    raise no_match([ref], [loc.path for loc in locs], selectors=narrowed, one=True)


def _in_caches(ref: str, matches: list) -> UsageError:
    """The usage error for a reference that names entries in several caches: (location, entries) each."""
    def named(entries) -> str:
        more = f" and {len(entries) - 4} more" if len(entries) > 4 else ""
        shown = ", ".join(e.relpath for e in entries[:4]) + more
        return shown if len(entries) == 1 else f"{len(entries)} entries: {shown}"

    where = ", ".join(f"{loc.cache or loc.path} ({named(entries)})" for loc, entries in matches)
    picks = " or ".join(f"--cache {loc.cache}" for loc, _ in matches if loc.cache)
    return UsageError(f"'{ref}' names entries in {len(matches)} caches: {where}; pick one with "
                      f"{picks or 'the entry path'}")


def ref_list(refs: Optional[List[str]]) -> list[str]:
    """The entry references as make_filter reads them (repeatable, or comma-separated)."""
    return [p.strip() for r in refs or () for p in r.split(",") if p.strip()]


def unmatched_refs(root: Path, refs: Optional[List[str]], entries) -> list[str]:
    """The references in `refs` that name none of `entries` (what a command selected in `root`)."""
    if not refs:
        return []
    hashes = [e.hash for e in entries]
    relpaths = {e.relpath for e in entries}
    out = []
    for ref in ref_list(refs):
        try:
            prefixes, paths = scan.split_refs(root, [ref])
        except UsageError:  # an absolute path outside this root names nothing in it
            out.append(ref)
            continue
        if not any(h.startswith(p) for p in prefixes for h in hashes) and not relpaths.intersection(paths):
            out.append(ref)
    return out


def matched_refs(root: Path, refs: Optional[List[str]], entries) -> set[str]:
    """The references in `refs` that name at least one of `entries` (--all-caches: a reference is
    missing only when no cache had it)."""
    return set(ref_list(refs)) - set(unmatched_refs(root, refs, entries))


def no_match(refs: list[str], roots: list[Path], selectors: bool = False, one: bool = False) -> UsageError:
    """The usage error (exit 2) for entry references that matched nothing, with the nearest hash
    prefixes and op names present ("did you mean 8d1f7691 or --op add?"). A command that names `one` entry
    (inspect, log) has no --op to list an op's entries with: it offers `kcache ls --op add` instead."""
    shown = ", ".join(f"'{r}'" for r in refs[:5]) + (f" and {len(refs) - 5} more" if len(refs) > 5 else "")
    where = str(roots[0]) if len(roots) == 1 else f"{len(roots)} caches" if roots else "any cache"
    also = " with the other selectors given" if selectors else ""
    hint = _hint(_names.nearest(refs[0], roots), one) if refs else ""
    if not hint and not selectors:  # nothing near it: where to see what is there
        hint = " (kcache ls lists its entries)" if len(roots) == 1 else " (kcache ls lists their entries)"
    return UsageError(f"no entry matches {shown} in {where}{also}{hint}")


def _hint(near, one: bool) -> str:
    """"; did you mean ..." for what names.nearest found (names shown escaped: they come from the cache)."""
    hashes = [printable_line(h) for h in near.hashes]
    ops = [printable_line(o) for o in near.ops]
    if not one:
        return suggest.did_you_mean(hashes + [f"--op {o}" for o in ops])
    hint = suggest.did_you_mean(hashes + [f"the op {o}" for o in ops])
    return hint + (f" (kcache ls --op {ops[0]} lists its entries)" if ops else "")


AllCachesOpt = Annotated[bool, typer.Option(
    "--all-caches", help="Every cache `kcache dir --all` finds, even from inside one cache (without "
    "--cache-dir/KCACHE_DIR that is the default anyway).")]
CacheOpt = Annotated[Optional[str], typer.Option(
    "--cache", metavar="NAME", help="Only this cache, where its compiler keeps it: hidet, triton, inductor... "
    "(default: every cache found, or the one the current directory or an entry's path lies in).",
    autocompletion=complete.complete_cache)]


# ---- waiting for locks ---------------------------------------------------------------------------
def lock_timeout_option(what: str, default: str) -> Any:
    """The --lock-timeout option (one name on every command that waits for a lock), its help saying what
    the command waits for and its default: `Annotated[Optional[str], c.lock_timeout_option(...)]`."""
    return typer.Option("--lock-timeout", metavar="SECONDS", help=f"Wait at most this long for {what} (then exit "
                        f"3, naming the holder); 30, 2.5, 90s, 5m. Default: {default}.")


# The name `build` used before --lock-timeout: still read, no longer shown.
OldTimeoutOpt = Annotated[Optional[str], typer.Option("--timeout", metavar="SECONDS", hidden=True,
                                                      help="Old name of --lock-timeout.")]


def lock_timeout(value: Optional[str], default: float, old: Optional[str] = None) -> float:
    """The checked --lock-timeout (or its old name --timeout) in seconds: finite and not negative, else a
    usage error (exit 2)."""
    if value is not None and old is not None:
        raise UsageError("--lock-timeout and --timeout are the same option: give one")
    if value is None and old is None:
        return default
    return parse_seconds(value if value is not None else old or "", "--lock-timeout" if value is not None
                         else "--timeout")


# ---- filters -------------------------------------------------------------------------------------
_LIST = "Repeatable, or comma-separated (a,b)."
OpOpt = Annotated[Optional[List[str]], typer.Option(
    "--op", metavar="NAME", help=f"Only this op; a glob works (--op 'mat*'). {_LIST}",
    autocompletion=complete.complete_op)]
SpaceOpt = Annotated[Optional[List[str]], typer.Option(
    "--space", metavar="SPACE", help=f"Only this space: cuda_space_2, or 2 for every target's level 2, a tilelang "
    f"0.1.15/linux-x86_64, or a Triton arch (sm_90a); a glob works. {_LIST}", autocompletion=complete.complete_space)]
TargetOpt = Annotated[Optional[List[str]], typer.Option("--target", metavar="TARGET",
                                                        help=f"Only this target: cuda, cpu, hip. {_LIST}",
                                                        autocompletion=complete.complete_target)]
LayoutOpt = Annotated[Optional[List[str]], typer.Option("--layout", metavar="LAYOUT",
                                                        help=f"Only this layout: {', '.join(LAYOUT_NAMES)}. {_LIST}",
                                                        autocompletion=complete.complete_layout)]
StatusOpt = Annotated[Optional[List[str]], typer.Option(
    "--status", metavar="STATUS", help=f"Only this status: {', '.join(STATUSES)}, or broken (partial, failed "
    f"and corrupt: what prune --broken removes). {_LIST}",
    autocompletion=complete.complete_status)]
KindOpt = Annotated[Optional[List[str]], typer.Option(
    "--kind", metavar="KIND", help=f"Only this kind: {', '.join(KINDS)}. {_LIST}",
    autocompletion=complete.complete_kind)]
ENTRY_HELP = "hash prefix, path in the cache (ops/cuda_space_0/add/8d1f7691cdf75e90) or absolute path"
HashesArg = Annotated[Optional[List[str]], typer.Argument(
    metavar="[ENTRY]...", help=f"Only these entries: {ENTRY_HELP}.", show_default=False,
    autocompletion=complete.complete_hash)]

MinSizeOpt = Annotated[Optional[str], typer.Option(
    "--min-size", metavar="SIZE", help="Only entries of at least SIZE on disk (1M, 500k, 2GiB; a unit is required).")]
MaxSizeOpt = Annotated[Optional[str], typer.Option(
    "--max-size", metavar="SIZE", help="Only entries of at most SIZE on disk (1M, 500k, 2GiB).")]
OlderThanOpt = Annotated[Optional[str], typer.Option(
    "--older-than", metavar="AGE", help="Only entries not used for AGE (30d, 12h, 90m, 2w, 6mo, 1d12h).")]
NewerThanOpt = Annotated[Optional[str], typer.Option(
    "--newer-than", metavar="AGE", help="Only entries used within AGE (1d, 12h, 90m).")]


class Selection:
    """The entry selectors a command was given (those of `ls`): ENTRY..., --op, --space, --target, --layout,
    --status, --kind, and where a command takes them --min-size, --max-size, --older-than, --newer-than,
    as typed. `filter()` checks them into a ScanFilter."""

    def __init__(self, hashes: Optional[List[str]] = None, op: Optional[List[str]] = None,
                 space: Optional[List[str]] = None, target: Optional[List[str]] = None,
                 layout: Optional[List[str]] = None, status: Optional[List[str]] = None,
                 kind: Optional[List[str]] = None, min_size: Optional[str] = None, max_size: Optional[str] = None,
                 older_than: Optional[str] = None, newer_than: Optional[str] = None) -> None:
        self.hashes, self.op, self.space, self.target = hashes, op, space, target
        self.layout, self.status, self.kind = layout, status, kind
        self.min_size, self.max_size, self.older_than, self.newer_than = min_size, max_size, older_than, newer_than
        for what, given in (("ENTRY", hashes), ("--op", op), ("--space", space), ("--target", target),
                            ("--layout", layout), ("--status", status), ("--kind", kind)):
            if given and not ref_list(given):  # "" (an unset shell variable) would select every entry
                raise UsageError(f"{what} is empty (an unset shell variable?): name what to select")
        # the fixed choices, checked before any cache is looked for: a typo is exit 2 where there is none too
        _checked(layout, LAYOUT_NAMES, "layout"), _statuses(status), _checked(kind, KINDS, "kind")

    def has_selectors(self) -> bool:
        """Whether anything but ENTRY arguments narrows the selection."""
        return any((self.op, self.space, self.target, self.layout, self.status, self.kind, self.min_size,
                    self.max_size, self.older_than, self.newer_than))

    def filter(self, root: Path | None = None, hashes: Optional[List[str]] = None):
        """The checked ScanFilter (entries given by path need `root`); `hashes` replaces the ENTRY
        arguments (--all-caches passes the ones that can name an entry of `root`)."""
        flt = make_filter(self.op, self.space, self.target, self.layout, self.status, self.kind,
                          self.hashes if hashes is None else hashes, root=root)
        return replace(flt, **size_age_filter(self.min_size, self.max_size, self.older_than, self.newer_than))


def size_age_filter(min_size: Optional[str], max_size: Optional[str], older_than: Optional[str],
                    newer_than: Optional[str]) -> dict[str, Any]:
    """The ScanFilter fields of --min-size/--max-size/--older-than/--newer-than (units.py's grammar), checked."""
    out: dict[str, Any] = {}
    for key, value, option in (("min_size", min_size, "--min-size"), ("max_size", max_size, "--max-size")):
        if value is not None:
            out[key] = parse_size(value, option)
    for key, value, option in (("older_than", older_than, "--older-than"), ("newer_than", newer_than, "--newer-than")):
        if value is not None:
            out[key] = parse_age(value, option)
            out["now"] = time.time()
    if out.get("min_size", 0) > out.get("max_size", float("inf")):
        raise UsageError("--min-size is more than --max-size: no entry can match")
    return out


_SELECTORS = ("hashes", "op", "space", "target", "layout", "status", "kind", "min_size", "max_size",
              "older_than", "newer_than")


def selectors(status: Any = StatusOpt, size_age: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the command's `sel: Selection` parameter becomes `ls`'s selector options, declared once
    here (in this order, where `sel` stands, so --help reads the same), and the command gets them as one
    Selection. `status` is the --status option's declaration (a command may word its help), or None
    for a command without --status. `size_age`: --min-size, --max-size, --older-than, --newer-than too."""
    declared = {"hashes": HashesArg, "op": OpOpt, "space": SpaceOpt, "target": TargetOpt, "layout": LayoutOpt,
                "status": status, "kind": KindOpt, "min_size": MinSizeOpt if size_age else None,
                "max_size": MaxSizeOpt if size_age else None, "older_than": OlderThanOpt if size_age else None,
                "newer_than": NewerThanOpt if size_age else None}

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:

        hints = typing.get_type_hints(func, include_extras=True)
        params = []
        for p in inspect.signature(func).parameters.values():
            if p.name != "sel":
                params.append(p.replace(annotation=hints.get(p.name, p.annotation)))
                continue
            params += [inspect.Parameter(n, p.kind, default=None, annotation=declared[n])
                       for n in _SELECTORS if declared[n] is not None]
        names = [p.name for p in params if p.name in _SELECTORS]

        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            sel = Selection(**{n: kwargs.pop(n) for n in names})
            return func(*args, sel=sel, **kwargs)

        # Typer reads the parameters from the signature and the annotations: the selectors', not `sel`
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return wrap


_SPACE = re.compile(r"^[a-z0-9*?\[\]]+_space_[\d*?\[\]]+$|^[\w.+\-*?\[\]]+/[\w.+\-*?\[\]]+$|^[\w.+\-*?\[\]]+$")


def _checked(values: Optional[List[str]], allowed: tuple[str, ...] | None, what: str) -> tuple[str, ...]:
    out = []
    for v in values or ():
        for part in v.split(","):
            part = part.strip()
            if not part:
                continue
            if allowed is not None and part not in allowed:
                raise suggest.unknown_choice(what, part, allowed)
            out.append(part)
    return tuple(out)


def _statuses(values: Optional[List[str]]) -> tuple:
    """--status values, checked and lower-cased; `broken` stands for partial, failed and corrupt."""
    words = _checked([v.lower() for v in values or ()], (*STATUSES, BROKEN_WORD), "status")
    out = [s for w in words for s in (BROKEN if w == BROKEN_WORD else (w,)) if is_status(s)]
    return tuple(dict.fromkeys(out))


def make_filter(op=None, space=None, target=None, layout=None, status=None, kind=None, hashes=None,
                root: Path | None = None):
    """The selection as typed, checked. Entries given by path need `root`."""
    spaces = _checked(space, None, "space")
    for s in spaces:
        if not _SPACE.match(s) or any(part in (".", "..") for part in s.split("/")):
            raise UsageError(f"bad space '{s}' (expected e.g. cuda_space_0, 2, cpu_space_* or 0.1.15/linux-x86_64)")
    ops = _checked(op, None, "op")
    for o in ops:
        if "/" in o or o in (".", ".."):
            raise UsageError(f"bad op name '{o}'")
    prefixes, paths = scan.split_refs(root if root is not None else Path("."), _checked(hashes, None, "entry"))
    flt = ScanFilter(
        ops=ops,
        spaces=spaces,
        targets=_checked(target, None, "target"),
        layouts=_checked(layout, LAYOUT_NAMES, "layout"),
        statuses=_statuses(status),
        kinds=_checked(kind, KINDS, "kind"),
        hash_prefixes=prefixes,
        paths=paths,
    )
    if root is None:
        return flt

    return _names.expand_filter(root, flt)  # `--space 2`, `--op 'mat*'`: the names present, for every command


def hint_unknown(opts: GlobalOptions, root: Path, flt, found: list | None = None) -> None:
    """On stderr, each --op/--space/--target value that names nothing in `root`, with what there is (none
    for a value an entry `found` has: a target read from an entry's files, not its path)."""
    if not (flt.ops or flt.spaces or flt.targets) or not fsread.is_dir(root):
        return
    have = {"op": {e.op for e in found or ()}, "space": {e.space for e in found or ()},
            "target": {e.target for e in found or ()}}
    for line in _names.unknown_values(root, flt, have):
        warn(opts, line)


def hint_unknown_many(opts: GlobalOptions, selected: list, found: list | None = None) -> None:
    """hint_unknown over several caches ((root, filter) each): a value is hinted at only when it names
    nothing in any of them (`--space cuda_space_2` is hidet's; Triton's cache not having it is no news),
    once, and never for a value an entry `found` has (a space read from an entry's metadata, not its path)."""
    seen = {"ops": {e.op for e in found or ()}, "spaces": {e.space for e in found or ()},
            "targets": {e.target for e in found or ()}}

    if len(selected) == 1:
        root, flt = selected[0]
        return hint_unknown(opts, root, flt, found)
    roots = [(root, flt) for root, flt in selected if fsread.is_dir(root)]
    for field, what in (("ops", "op"), ("spaces", "space"), ("targets", "target")):
        values = {v for _, flt in roots for v in getattr(flt, field)}
        for v in sorted(values):
            if not all(v in getattr(flt, field) for _, flt in roots):
                continue  # a value one cache's expansion turned into its names: that cache has it
            if v in seen[field] or (field == "spaces" and any(s and space_matches(s, v) for s in seen[field])):
                continue
            line = _names.unknown_across(roots, what, v)
            if line is not None:  # once for every cache, not once per cache
                warn(opts, line)


# ---- output --------------------------------------------------------------------------------------
def _emit_json(data, command: str = "") -> None:
    """JSON on stdout, never through Rich; indented for people, compact for pipes (Output.result's writer).
    An object starts with its `schema` (kcache/<command>/1); a bare list is put in one as `entries`."""
    options.json_written = True
    if command:
        body = data if isinstance(data, dict) else {"entries": data}
        data = {"schema": schema_id(command), **body}
    text = jsonout.encode(data, indent=sys.stdout.isatty())
    options.keep_to_exit(data)
    sys.stdout.flush()  # anything written as text before goes first
    sys.stdout.buffer.write(text)  # (text + b"\n" would copy a listing's megabytes once more)
    sys.stdout.buffer.write(b"\n")
    sys.stdout.buffer.flush()


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, emoji=False, width=options.terminal_width(sys.stderr),
                   color_system=None if no_color() else "auto")


def stdout_console():
    from rich.console import Console

    return Console(highlight=False, emoji=False, soft_wrap=not sys.stdout.isatty(),
                   width=options.terminal_width(sys.stdout), color_system=None if no_color() else "auto")


class Output:
    """The one way a command emits (huggingface_hub's cli/_output.py): `result(data, human)` writes the
    command's result as JSON on stdout under --json (`data`, its `to_json()`, or what the function `data`
    returns), else calls `human()`,
    which renders it for people (tables and text on stdout); `info` and `warn` go to stderr, `info`
    saying nothing under -q, `warn` nothing only when silent (ls -q); `error` always does. Commands
    never branch on the format themselves.
    With `collect` (--all-caches: one result per cache), results are gathered and `done()` writes them
    as one JSON list."""

    def __init__(self, opts: GlobalOptions, collect: bool = False) -> None:
        self.opts, self.collect = opts, collect
        self.collected: list = []
        self.results = 0

    @property
    def json(self) -> bool:
        return self.opts.json

    def result(self, data: Any, human: Callable[[], None] | None = None) -> None:
        self.results += 1
        if not self.opts.json:
            if human is not None:
                human()
            return
        doc = data() if callable(data) else data  # a function: the JSON costs work the human form skips
        doc = doc.to_json() if hasattr(doc, "to_json") else doc
        if self.collect:
            self.collected.append(doc)
        else:
            _emit_json(doc, self.opts.command)

    def done(self, empty: str | None = None, over_all: dict | None = None) -> None:
        """With `collect`: the gathered results, as one JSON list (with `over_all`'s keys beside it: stats'
        total). `empty`: what to tell people when there was no result at all (--all-caches found no cache)."""
        if self.collect and self.opts.json:
            _emit_json({"caches": self.collected, **(over_all or {})}, self.opts.command)
        elif empty is not None and not self.results:
            self.info(empty)

    def text(self, line: str) -> None:
        """A line of the human rendering, on stdout (never under --json: call it from `human`)."""
        sys.stdout.write(line + "\n")

    def info(self, message: str, whole_words: bool = False) -> None:
        """A line for people on stderr (stdout stays data), escaped like a warning, folded to the width (with
        `whole_words`, between words only: an image reference or a path stays whole, for copy and paste)."""
        if not self.opts.quiet:
            sys.stderr.write("".join(f"{line}\n" for part in printable(message).split("\n")
                                     for line in fold_err(part, 2, whole_words)))

    def warn(self, message: str) -> None:
        """A warning on stderr, under -q too (a cron job's mail shows it); names and paths in it cannot act
        on the terminal (textsafe). On a terminal (or under COLUMNS) it is folded to the width, later lines
        indented."""
        if not self.opts.silent:
            sys.stderr.write("".join(f"{line}\n" for line in fold_err(f"warning: {printable_line(message)}", 2)))

    def error(self, message: str) -> None:
        """One failed item on stderr, shown under -q too (the command then fails as a whole)."""
        sys.stderr.write(f"error: {printable_line(message)}\n")


def warn(opts: GlobalOptions, message: str) -> None:
    """Output(opts).warn, for the `warn=` callbacks the core takes."""
    Output(opts).warn(message)


def info(opts: GlobalOptions, message: str) -> None:
    """Output(opts).info."""
    Output(opts).info(message)


def tty_safe(text: str) -> str:
    """`text` escaped when stdout is a terminal (a path printed as data stays byte-exact in a pipe)."""
    return printable(text) if sys.stdout.isatty() else text


def home_short(path: str) -> str:
    """`path` with the home directory written `~` (for people: tables; JSON keeps the whole path)."""
    home = os.path.expanduser("~")
    if home not in ("", "/") and (path == home or path.startswith(home.rstrip("/") + "/")):
        return "~" + path[len(home.rstrip("/")):]
    return path


def human_size(n: int) -> str:
    """The one size format (kcache_cli.util.units): powers of 1000, as `--max-size` reads them."""
    return format_size(n)


def human_age(ts: float) -> str:
    return format_ago(ts)


STATUS_STYLE = {"complete": "green", "partial": "yellow", "failed": "red", "corrupt": "bold red",
                "building": "cyan", "stale": "magenta", "unreadable": "red", "moved": "bold yellow"}


def output_width() -> int | None:
    """The width tables and text are fitted to: COLUMNS when set (so a pipe can ask for a width), else the
    terminal's (options.terminal_width: 80 where it says 0), else None (a pipe: whole rows, one per line, for
    grep and awk)."""
    if options.columns_asked() is not None or sys.stdout.isatty():
        return options.terminal_width(sys.stdout)
    return None


def stderr_width() -> int | None:
    """The width of stderr's lines: COLUMNS when set, else the terminal's when stderr is one (80 where it says
    0), else None (a log file or a pipe: one line per message, for grep)."""
    try:
        on_terminal = sys.stderr.isatty()
    except (OSError, ValueError, AttributeError):  # not a real file (tests)
        on_terminal = False
    if options.columns_asked() is not None or on_terminal:
        return options.terminal_width(sys.stderr)
    return None


def fold_err(text: str, indent: int, whole_words: bool = False) -> list[str]:
    """`text` as stderr lines no wider than stderr_width() (one line when there is none; table.fold)."""
    width = stderr_width()
    if width is None or len(text) <= width:
        return [text]

    return fold(text, width, indent, whole_words)


def print_lines(lines: list[str]) -> None:
    sys.stdout.write("".join(line + "\n" for line in lines))


def print_text(text: str, indent: int = 0, whole_words: bool = False, keep: tuple[str, ...] = ()) -> None:
    """A line for stdout, folded to the terminal's width (with `whole_words`, no word is cut, a number stays
    with its unit and each of `keep`, a path, on one line: table.fold)."""
    print_lines(fold(text, output_width(), indent, whole_words, keep))


def print_table(columns, rows: list[list[str]], styles: dict[int, dict[str, str]] | None = None,
                right: tuple[int, ...] = ()) -> None:
    """A table fitted to the terminal (kcache_cli.cli.table): coloured on a terminal, plain aligned columns
    (grep- and awk-friendly) in a pipe or under NO_COLOR. `columns` are names or table.Column."""
    cols = [col if isinstance(col, Column) else Column(col, right=i in right, styles=(styles or {}).get(i, {}))
            for i, col in enumerate(columns)]
    print_lines(render(cols, rows, output_width(), colour=not plain_output(), clean=printable_line))


def line_kind(line: str) -> str | None:
    """"error" or "warning" for a compiler's output line that reports one (how a log or a failed build's
    output is highlighted), else None."""
    low = line.lower()
    if "error" in low and ("error:" in low or low.startswith("error") or " error " in low or "error(s)" in low):
        return "error"
    if "fatal" in low:
        return "error"
    if "warning" in low:
        return "warning"
    return None


def warn_arch_misfits(out: Output, entries, fit, what: str) -> None:
    """Warn about `what` (imported, pulled) kernels among `entries` their consumer does not use on this
    machine's GPU, as `fit` (gpu.arch_fit by their layouts' rules, keyed by relpath) found, or that there is
    no GPU to ask (a note, which -q silences: a CPU runner has none, and nothing is wrong there)."""
    caps = fit.gpus
    if fit.checked and caps is None:
        out.info(f"no NVIDIA GPU found (nvidia-smi): the {what} kernels' archs were not checked against this machine")
    misfits = set(fit.misfits)
    bad = [e for e in entries if e.relpath in misfits]
    if bad and caps:
        local = ", ".join(f"{a}.{b}" for a, b in caps)
        for e in bad[:10]:
            out.warn(f"{e.relpath} is built for {e.arch}, which does not run on this machine's GPU "
                     f"(compute capability {local})")
        if len(bad) > 10:
            out.warn(f"{plural(len(bad) - 10, 'more entry', 'more entries')} built for archs this GPU cannot run")
