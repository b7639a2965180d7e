"""`kcache diff A B`: what differs between two entries of the same layout and kind."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated

import typer

from kcache_cli.cli import common as c
from kcache_cli.cli import options as o
from kcache_cli.cli.table import fold
from kcache_cli.model.records import ScanFilter
from kcache_cli.util.errors import UsageError
from kcache_cli.util.lazy import lazy_module
from kcache_cli.util.units import is_digits

if TYPE_CHECKING:  # the real imports, for mypy; at run time each loads at its first use
    from kcache_cli.ops import diff
else:
    diff = lazy_module("kcache_cli.ops.diff")


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
    cache_dir: o.CacheDirOpt = None,
    as_json: o.JsonOpt = False,
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
    opts = o.use(ctx, cache_dir, as_json)
    loc_a, ea = c.resolve_in_scope(opts, a, cache, lambda root: ScanFilter(), selectors=False)
    loc_b, eb = c.resolve_in_scope(opts, b, cache, lambda root: ScanFilter(), selectors=False)
    if (ea.layout, ea.kind) != (eb.layout, eb.kind):
        raise UsageError(f"{a} is a {ea.layout} {ea.kind} and {b} a {eb.layout} {eb.kind}: "
                         "diff compares two entries of one layout and kind")
    if ea.path == eb.path:
        raise UsageError(f"{a} and {b} are the same entry ({ea.relpath})")
    result = diff.diff_entries(loc_a.path, ea, loc_b.path, eb)
    c.Output(opts).result(result.to_json(), lambda: _text(result))


MAX_TEXT_LINES = 8  # changed lines shown per text record (--json has them all)
_HASH = re.compile(r"[0-9a-f]{24,}|[A-Z2-7]{40,}|[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")
_ORDER = ("fact: ", "size", "files")  # what tells two builds apart first; records and texts after
_TELLING = ("arch", "target", "version", "candidates", "num_", "option", "constants")  # then these keys


def _text(result) -> None:
    """One screen: the entries, the differing facts as a table (values cut to where A and B differ),
    then each differing text record as a few changed lines, then the count. A summary for people (--json has
    every value whole): into a pipe it keeps 80 columns, as a terminal that says no width gets, where the A
    column padded to its longest value (a compile command) made every row 600 wide."""
    width = c.output_width() or o.FALLBACK_WIDTH
    for side, e in (("A", result.a), ("B", result.b)):
        name = c.printable_line(f"{e.op or '-'} {_hashes(e.relpath)}")  # names are data: inert on any output
        c.print_lines(_fit(f"{side}: {e.layout} {e.kind} {name} ({e.status})", width))
    if not result.differences:
        c.print_lines([f"no differences in {result.same} properties"])
        return
    facts = sorted((d for d in result.differences if not d.lines), key=_rank)
    if facts:
        c.print_lines(_facts(facts, width))
    for d in (d for d in result.differences if d.lines):
        c.print_lines(_text_diff(d, width))
    c.print_lines([f"{len(result.differences):,} differ, {result.same:,} the same"])


def _rank(d) -> tuple[int, str]:
    first = next((i for i, p in enumerate(_ORDER) if d.name.startswith(p)), None)
    if first is None:
        first = len(_ORDER) + (0 if any(w in d.name.rsplit(": ", 1)[-1] for w in _TELLING) else 1)
    return first, d.name


def _value(d, side: str) -> str:
    v = getattr(d, side)
    if v is None:
        return "(none)"
    if d.name == "size" and is_digits(v):
        return c.human_size(int(v))
    return c.printable_line(v.replace("\n", " "))


def _facts(facts, width: int | None) -> list[str]:
    """property | A | B, the values cut around where they differ; a name too long for its column goes
    on a line of its own, its values under it."""
    names = max(len("property"), *(len(d.name) for d in facts))
    name_w = names if width is None else min(names, max(16, width * 2 // 5))
    val_w = None if width is None else max(8, (width - name_w - 4) // 2)
    rows = [(d.name, *_pair(_value(d, "a"), _value(d, "b"), val_w)) for d in facts]
    a_w = max(len("A"), *(len(a) for _, a, _ in rows))
    lines = [f"{'property':<{name_w}}  {'A':<{a_w}}  B"]
    for name, a, b in rows:
        if len(name) > name_w:
            lines.extend(fold(c.printable_line(name), width))
            name = ""
        lines.append(f"{c.printable_line(name):<{name_w}}  {a:<{a_w}}  {b}".rstrip())
    return lines


def _pair(a: str, b: str, width: int | None) -> tuple[str, str]:
    """A and B as they fit `width`: hashes shortened, then the part around their difference."""
    if width is None or (len(a) <= width and len(b) <= width):
        return a, b
    a, b = _hashes(a), _hashes(b)
    if len(a) <= width and len(b) <= width:
        return a, b
    lo, hi = _around(a, b)
    return _cut(a, lo, len(a) - hi, width), _cut(b, lo, len(b) - hi, width)


def _around(a: str, b: str) -> tuple[int, int]:
    """Where A and B start to differ, and how many characters they end with in common."""
    lo = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    hi = 0
    while hi < min(len(a), len(b)) - lo and a[len(a) - 1 - hi] == b[len(b) - 1 - hi]:
        hi += 1
    return lo, hi


def _cut(s: str, lo: int, hi: int, width: int) -> str:
    """`s` within `width`, keeping s[lo:hi] (where it differs) with a little context, elided with '…'."""
    if len(s) <= width:
        return s
    if hi <= width - 1 or lo <= width - 4:  # the difference starts early: only the end goes
        return s[:width - 1] + "…"
    start = max(0, lo - max(4, (width - (hi - lo)) // 3))
    start = start if start == 0 else max(s.rfind(" ", 0, lo) + 1, s.rfind("/", 0, lo) + 1, start)
    end = min(len(s), start + width - (1 if start else 0))
    out = ("…" if start else "") + s[start:end]
    if end < len(s):
        out = out[:width - 1] + "…"
    return out


def _hashes(s: str) -> str:
    """Long hashes (hex, base32, base64url keys) cut to 12 characters: enough to tell them apart."""
    return _HASH.sub(lambda m: m.group(0)[:12] + "…", s)


def _text_diff(d, width: int | None) -> list[str]:
    """A text record's changed lines (a unified diff without context), each cut to the width around what
    changed from the line it pairs with, at most MAX_TEXT_LINES of them."""
    lines = [f"{d.name}: {c.plural(len(d.lines), 'changed line')}"]
    minus = [ln for ln in d.lines if ln.startswith("-")]
    plus = [ln for ln in d.lines if ln.startswith("+")]
    partner = dict(zip(minus, plus)) | dict(zip(plus, minus))
    room = None if width is None else width - 2
    for ln in d.lines[:MAX_TEXT_LINES]:
        text = c.printable_line(ln)
        if room is not None and len(text) > room:
            other = c.printable_line(partner.get(ln, ln))
            text = text[0] + _pair(text[1:], other[1:], room - 1)[0]
        lines.append("  " + text)
    if len(d.lines) > MAX_TEXT_LINES:
        lines.extend(fold(f"  ({len(d.lines) - MAX_TEXT_LINES:,} more: kcache diff --json has every line)", width, 4))
    return lines


def _fit(line: str, width: int | None) -> list[str]:
    return fold(line, width, 4)
