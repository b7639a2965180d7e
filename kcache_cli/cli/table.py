"""Tables that fit the terminal: status words always, hashes cut to the longest prefix that fits (at
least 8 characters and unique among the rows: every command takes a hash prefix), the least useful
columns dropped first, a long free-text column (reason, why, problem) wrapped or moved to its own line.

Nothing is lost without a sign: a column with nothing in it (every value empty or `-`) goes before any
other column and before any value is cut; and a value cut short ends in `…`, but for a hash, whose prefix
is what a table shows by design (as git abbreviates a commit: reads_as_hash).

One renderer for terminals and pipes, so what a test sees at COLUMNS=80 is what a user sees in an
80-column terminal. Colour is plain ANSI (no Rich import: a 100,000-row `ls` prints in one write)."""

from __future__ import annotations

import re
import sys
import textwrap
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

# Below this width a wrapped free-text column reads as a column of fragments: give it its own line.
WRAP_MIN = 28
# Columns a wrapped free-text column may push out of a row (layout, kind, files); beyond these the
# text goes to its own line instead, so it never squeezes out what identifies or judges an entry.
MINOR = 3
INDENT = "    "  # before a free-text value on its own line
HASH_MIN = 8  # the fewest characters of a hash a table shows (git's abbreviations start at 7)
ELLIPSIS = "\u2026"  # ends a value cut short (one terminal column)
BLANK = ("", "-")  # a cell with nothing in it
# hex; base32 with a digit (a word has none); Triton's 43-character base64url key; a count and a hex hash (tilus)
# (at a hash's length: `conv2d` or `matmul4bit`, an extension's name, is marked where it is cut)
_HASH = re.compile(r"[0-9a-fA-F]{8,}|(?=.*[2-7])(?:[A-Z2-7]{26,}|[a-z2-7]{26,})|[A-Za-z0-9_-]{43}|[0-9]+-[0-9a-f]{8,}")

_ANSI = {"green": "32", "yellow": "33", "red": "31", "bold red": "1;31", "cyan": "36", "bold": "1",
         "magenta": "35", "dim": "2"}


@dataclass(frozen=True)
class Column:
    """A column. `drop`: the lower, the sooner it goes when the row is too wide (None: never dropped).
    `wrap`: the free-text column (last in the row): wrapped, or printed on its own line."""

    name: str
    right: bool = False
    drop: int | None = None
    wrap: bool = False
    styles: dict[str, str] = field(default_factory=dict)
    spill: bool = False  # a hash: cut to the longest prefix that fits, never shorter than `hash_floor`


class Layout(NamedTuple):  # not a frozen dataclass: a tenth of the cost to define
    """How a table's rows fit the width: the columns kept, their widths, the text set below."""

    kept: tuple[int, ...]  # indices of the columns shown in the row, in order
    widths: dict[int, int]  # each kept column's width (the wrapped column's is its wrap width)
    below: int | None  # index of the free-text column printed on its own line, if any
    spill: int | None = None  # index of the hash column whose values are cut to its width


def cells(text: str) -> int:
    """The terminal columns `text` takes: an East Asian wide or fullwidth character two, a combining mark
    none, anything else one (kcache prints no other control: textsafe escapes them)."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
               for ch in text)


def reads_as_hash(value: str) -> bool:
    """Whether `value` is a hash (hex, base32, a base64url key), whose prefix a table shows cut without a
    mark; anything else a hash column holds (an extension's name, jax's `cache`) is marked where it is cut."""
    return _HASH.fullmatch(value) is not None


def _ellipsis() -> str:
    """`…`, or `~` where stdout cannot encode it (PYTHONIOENCODING=latin-1: the table must still print)."""
    try:
        ELLIPSIS.encode(getattr(sys.stdout, "encoding", None) or "utf-8")
        return ELLIPSIS
    except (UnicodeEncodeError, LookupError):
        return "~"


def _cut(text: str, width: int, measure: Callable[[str], int]) -> str:
    """The longest start of `text` that takes at most `width` columns."""
    if measure(text) <= width:
        return text
    if measure is len:
        return text[:width]
    out, used = [], 0
    for ch in text:
        used += cells(ch)
        if used > width:
            break
        out.append(ch)
    return "".join(out)


def _natural(columns: list[Column], rows: list[list[str]], measure: Callable[[str], int] = len) -> list[int]:
    return [max([len(col.name)] + [measure(r[i]) for r in rows]) for i, col in enumerate(columns)]


def _span(widths: list[int], kept: list[int]) -> int:
    return sum(widths[i] for i in kept) + 2 * max(0, len(kept) - 1)


def _fit(columns: list[Column], widths: list[int], kept: list[int], budget: int, most: int | None) -> list[int]:
    """Drop droppable columns (priority <= `most`, if given), lowest priority first, until `kept` fits `budget`."""
    kept = list(kept)
    limit = most if most is not None else float("inf")
    order = sorted((drop, i) for i in kept if (drop := columns[i].drop) is not None and drop <= limit)
    for _, i in order:
        if _span(widths, kept) <= budget:
            break
        kept.remove(i)
    return kept


def hash_floor(values: list[str]) -> int:
    """The fewest characters of each hash that still tell the rows apart: HASH_MIN, or the length of the
    shortest prefix unique among `values` (git's abbreviation rule), never more than the longest value."""
    hashes = sorted(set(v for v in values if v))
    need = HASH_MIN
    for a, b in zip(hashes, hashes[1:]):
        common = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        need = max(need, common + 1)
    return min(need, max((len(v) for v in hashes), default=0))


def _spill_floor(values: list[str]) -> int:
    """hash_floor, one more where a value that is no hash would be cut there: its `…` takes a column and
    the characters before it still tell the rows apart."""
    floor = hash_floor(values)
    return floor + 1 if any(len(v) > floor and not reads_as_hash(v) for v in values) else floor


def _name_width(values: list[str], measure: Callable[[str], int]) -> int:
    """The width that shows whole every value that is no hash (an extension's name: cut, it names nothing
    whole; a hash's prefix is what the table shows by design); 0 when every value is a hash."""
    return max((measure(v) for v in values if not reads_as_hash(v)), default=0)


def _with_something(columns: list[Column], rows: list[list[str]], every: list[int]) -> list[int]:
    """`every` less the columns with nothing in them (every value empty or `-`; a free-text one too): the
    first to go, before a column with something to say and before any value is cut. All of them, when
    nothing else is left."""
    if not rows:
        return every
    kept = [i for i in every if columns[i].spill or not all(r[i].strip() in BLANK for r in rows)]
    return kept or every


def plan(columns: list[Column], rows: list[list[str]], width: int | None,
         measure: Callable[[str], int] = len) -> Layout:
    """Which columns show, how wide, and where the free text goes, for a terminal `width` wide (None: no limit);
    `measure`: the columns a value takes (`cells` where some are wide)."""
    widths = _natural(columns, rows, measure)
    every = list(range(len(columns)))
    if width is None or _span(widths, every) <= width:
        return Layout(tuple(every), dict(enumerate(widths)), None)
    every = _with_something(columns, rows, every)  # a column with nothing in it: the first to go
    if _span(widths, every) <= width:  # and then nothing is cut
        return Layout(tuple(every), {i: widths[i] for i in every}, None)
    text = next((i for i in every if columns[i].wrap), None)
    others = [i for i in every if i != text]
    cut = next((i for i in every if columns[i].spill), None)
    full = widths[cut] if cut is not None else 0
    if cut is not None:
        # A hash of up to 16 characters (hidet's whole hash) is worth more than the minor columns; past
        # that, the hash is cut to its shortest, and what room is left over lengthens it again.
        widths[cut] = min(full, 2 * HASH_MIN)
        short = _fit(columns, widths, others, width, MINOR)
        if text is None and _span(widths, short) <= width:
            return _grown(widths, short, cut, full, width, None)
        long, values = widths[cut], [r[cut] for r in rows]
        floor = max(_spill_floor(values), len(columns[cut].name))
        # a name (no hash) whole, up to 16 characters, before free text gets a column: else the text goes below
        widths[cut] = max(floor, min(long, _name_width(values, measure)))
    if text is not None:
        room = min(WRAP_MIN, widths[text])
        inline = _fit(columns, widths, others, width - 2 - room, MINOR)
        if _span(widths, inline) + 2 + room <= width:
            # the hash up to hidet's 16 characters first, then the text; what the text does not need
            _grow(widths, cut, min(full, 2 * HASH_MIN), width - 2 - room - _span(widths, inline))
            _grow(widths, cut, full, width - 2 - widths[text] - _span(widths, inline))
            sized = {i: widths[i] for i in inline}
            sized[text] = width - 2 - _span(widths, inline)
            return Layout(tuple(inline + [text]), sized, None, cut)
    if cut is not None:  # the free text on its own line: the 16-character hash if the minor columns make room
        widths[cut] = long
        if _span(widths, short) <= width:
            return _grown(widths, short, cut, full, width, text)
        widths[cut] = floor
    return _grown(widths, _fit(columns, widths, others, width, None), cut, full, width, text)


def _grow(widths: list[int], cut: int | None, full: int, spare: int) -> None:
    """Lengthen the hash column `cut` by up to `spare` characters, back towards its natural width `full`."""
    if cut is not None and spare > 0:
        widths[cut] = min(full, widths[cut] + spare)


def _grown(widths: list[int], kept: list[int], cut: int | None, full: int, width: int, below: int | None) -> Layout:
    """The layout of the columns `kept`, the hash lengthened into the room they leave."""
    _grow(widths, cut, full, width - _span(widths, kept) if cut in kept else 0)
    return Layout(tuple(kept), {i: widths[i] for i in kept}, below, cut)


def paint(text: str, style: str | None, colour: bool) -> str:
    code = _ANSI.get(style or "") if colour else None
    return f"\x1b[{code}m{text}\x1b[0m" if code else text


def _chunks(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, max(width, 8), break_on_hyphens=False) or [""]


def render(columns: list[Column], rows: list[list[str]], width: int | None, colour: bool = False,
           clean: Callable[[str], str] | None = None) -> list[str]:
    """The table's lines: header, (a rule on a colour terminal), rows. No line is wider than `width`
    unless the columns that are never dropped (hash at its shortest, status) alone are. `clean` makes each cell safe
    to print (the terminal-escaping of names and reasons), before widths are measured."""
    if clean is not None:
        rows = [[clean(cell) for cell in row] for row in rows]
    # A CJK name takes two columns a character, a combining mark none: such rows are measured in cells
    measure = len if all(map(str.isascii, map("".join, rows))) else cells
    layout = plan(columns, rows, width, measure)
    kept, sized = layout.kept, layout.widths
    if not kept:
        return []
    last = kept[-1]
    # One format string for the row (a 100,000-row ls formats in one pass); a styled cell comes padded
    # and painted, the last column unpadded (no trailing blanks) unless it is right-aligned (a size whose
    # path went below); cells measured otherwise are padded here.
    styled = [i for i in kept if colour and columns[i].styles]
    padded = styled if measure is len else kept
    bare = last if not columns[last].right else None
    fmt = "  ".join("{}" if i in padded or i == bare else f"{{:{'>' if columns[i].right else '<'}{sized[i]}}}"
                    for i in kept)
    special = [i for i in kept if columns[i].wrap or i == layout.spill]
    lead = " " * (_span([sized.get(i, 0) for i in range(len(columns))], list(kept)) - sized[last])
    room = (width or 80) - len(INDENT)

    def pad(i: int, value: str) -> str:
        gap = " " * (sized[i] - measure(value))
        return gap + value if columns[i].right else (value if i == last else value + gap)

    lines = ["  ".join(paint(pad(i, columns[i].name), "bold", colour) for i in kept).rstrip()]
    if colour:
        lines.append("\u2500" * len(lead + "x" * sized[last]))
    for row in rows:
        values = {i: row[i] for i in special}
        extra: list[str] = []
        for i in special:
            if i == layout.spill:
                values[i] = _cut(row[i], sized[i], measure)
                if values[i] != row[i] and not reads_as_hash(row[i]):  # (asked only of a value cut)
                    values[i] = _cut(row[i], sized[i] - 1, measure) + _ellipsis()
            elif columns[i].wrap and measure(row[i]) > sized[i]:
                parts = _chunks(row[i], sized[i])
                values[i], extra = parts[0], parts[1:]
        for i in padded:
            value = pad(i, values.get(i, row[i]))
            values[i] = paint(value, columns[i].styles.get(row[i]), True) if i in styled else value
        lines.append(fmt.format(*[values[i] if i in values else row[i] for i in kept]).rstrip())
        lines.extend(lead + part for part in extra)
        if layout.below is not None and row[layout.below]:
            lines.extend(INDENT + part for part in _chunks(row[layout.below], room))
    return lines


_QUANTITY = r"(\d[\d,.]*) (B|kB|MB|GB|TB|PB|bytes?|entry|entries|files?)\b"  # compiled at its first use (re's cache)


def fold(text: str, width: int | None, indent: int = 0, whole_words: bool = False, keep: tuple[str, ...] = ()
         ) -> list[str]:
    """`text` as lines no wider than `width` (None: one line), later lines indented by `indent`; a number
    keeps its unit ("69.6 kB"). With `whole_words`, a word wider than that stays whole on a line of its
    own and each of `keep` (a path, spaces and all) stays on one line: for copy and paste."""
    if width is None or len(text) <= width:
        return [text]
    if whole_words:  # NUL never reaches here from a name (printable() escapes it): a space that holds
        for span in keep:
            text = text.replace(span, span.replace(" ", "\0"))
    text = re.sub(_QUANTITY, "\\1\0\\2", text)
    lines = textwrap.wrap(text, max(width, indent + 8), subsequent_indent=" " * indent, break_on_hyphens=False,
                          drop_whitespace=True, break_long_words=not whole_words) or [text]
    return [line.replace("\0", " ") for line in lines]
