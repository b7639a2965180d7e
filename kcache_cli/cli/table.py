"""Tables that fit the terminal: whole hashes and status words always, the least useful columns
dropped first, a long free-text column (reason, why, problem) wrapped or moved to its own line.

One renderer for terminals and pipes, so what a test sees at COLUMNS=80 is what a user sees in an
80-column terminal. Colour is plain ANSI (no Rich import: a 100,000-row `ls` prints in one write)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

# Below this width a wrapped free-text column reads as a column of fragments: give it its own line.
WRAP_MIN = 28
# Columns a wrapped free-text column may push out of a row (layout, kind, files); beyond these the
# text goes to its own line instead, so it never squeezes out what identifies or judges an entry.
MINOR = 3
INDENT = "    "  # before a free-text value on its own line
SPILL_SHORT = 32  # hidet's hashes have 16 digits, tilus's 12; tilelang's 64 spill

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
    spill: bool = False  # never cut (a hash): a value too wide for the column goes whole on its own line


@dataclass(frozen=True)
class Layout:
    kept: tuple[int, ...]  # indices of the columns shown in the row, in order
    widths: dict[int, int]  # each kept column's width (the wrapped column's is its wrap width)
    below: int | None  # index of the free-text column printed on its own line, if any
    spill: int | None = None  # index of the column whose wider values go on their own line


def _natural(columns: list[Column], rows: list[list[str]]) -> list[int]:
    return [max([len(col.name)] + [len(r[i]) for r in rows]) for i, col in enumerate(columns)]


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


def plan(columns: list[Column], rows: list[list[str]], width: int | None) -> Layout:
    """Which columns show, how wide, and where the free text goes, for a terminal `width` wide (None: no limit)."""
    widths = _natural(columns, rows)
    every = list(range(len(columns)))
    text = next((i for i in every if columns[i].wrap), None)
    if width is None or _span(widths, every) <= width:
        return Layout(tuple(every), dict(enumerate(widths)), None)
    others = [i for i in every if i != text]
    spill = next((i for i in every if columns[i].spill), None)
    if spill is not None:
        # A few long values (tilelang's 64-digit hashes among hidet's 16) go on lines of their own rather
        # than pushing out what tells the other rows apart; when most are long, columns go instead.
        short = [len(r[spill]) for r in rows if len(r[spill]) <= SPILL_SHORT]
        if len(short) < len(rows) and 2 * len(short) > len(rows):
            widths[spill] = max(short + [len(columns[spill].name)])
        else:
            spill = None
    if text is not None:
        room = min(WRAP_MIN, widths[text])
        inline = _fit(columns, widths, others, width - 2 - room, MINOR)
        if _span(widths, inline) + 2 + room <= width:
            sized = {i: widths[i] for i in inline}
            sized[text] = width - 2 - _span(widths, inline)
            return Layout(tuple(inline + [text]), sized, None, spill)
    kept = _fit(columns, widths, others, width, None)
    return Layout(tuple(kept), {i: widths[i] for i in kept}, text, spill)


def paint(text: str, style: str | None, colour: bool) -> str:
    code = _ANSI.get(style or "") if colour else None
    return f"\x1b[{code}m{text}\x1b[0m" if code else text


def _chunks(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, max(width, 8), break_on_hyphens=False) or [""]


def render(columns: list[Column], rows: list[list[str]], width: int | None, colour: bool = False,
           clean: Callable[[str], str] | None = None) -> list[str]:
    """The table's lines: header, (a rule on a colour terminal), rows. No line is wider than `width`
    unless the columns that are never dropped (hash, status) alone are. `clean` makes each cell safe
    to print (the terminal-escaping of names and reasons), before widths are measured."""
    if clean is not None:
        rows = [[clean(cell) for cell in row] for row in rows]
    layout = plan(columns, rows, width)
    kept, sized = layout.kept, layout.widths
    if not kept:
        return []
    last = kept[-1]
    # One format string for the row (a 100,000-row ls formats in one pass); a styled cell comes padded
    # and painted, the last column unpadded (no trailing blanks).
    styled = [i for i in kept if colour and columns[i].styles]
    fmt = "  ".join("{}" if i in styled or i == last else f"{{:{'>' if columns[i].right else '<'}{sized[i]}}}"
                    for i in kept)
    special = [i for i in kept if columns[i].wrap or i == layout.spill]
    lead = " " * (_span([sized.get(i, 0) for i in range(len(columns))], list(kept)) - sized[last])
    room = (width or 80) - len(INDENT)

    def pad(i: int, value: str) -> str:
        return value.rjust(sized[i]) if columns[i].right else (value if i == last else value.ljust(sized[i]))

    lines = ["  ".join(paint(pad(i, columns[i].name), "bold", colour) for i in kept).rstrip()]
    if colour:
        lines.append("\u2500" * len(lead + "x" * sized[last]))
    for row in rows:
        values = {i: row[i] for i in special}
        extra: list[str] = []
        spilled = ""
        for i in special:
            if i == layout.spill and len(row[i]) > sized[i]:
                spilled, values[i] = row[i], ""
            elif columns[i].wrap and len(row[i]) > sized[i]:
                parts = _chunks(row[i], sized[i])
                values[i], extra = parts[0], parts[1:]
        for i in styled:
            values[i] = paint(pad(i, values.get(i, row[i])), columns[i].styles.get(row[i]), True)
        lines.append(fmt.format(*[values[i] if i in values else row[i] for i in kept]).rstrip())
        lines.extend(lead + part for part in extra)
        if spilled:
            lines.extend(INDENT + part for part in _chunks(spilled, room))
        if layout.below is not None and row[layout.below]:
            lines.extend(INDENT + part for part in _chunks(row[layout.below], room))
    return lines


def fold(text: str, width: int | None, indent: int = 0) -> list[str]:
    """`text` as lines no wider than `width` (None: one line), later lines indented by `indent`."""
    if width is None or len(text) <= width:
        return [text]
    return textwrap.wrap(text, max(width, indent + 8), subsequent_indent=" " * indent, break_on_hyphens=False,
                         drop_whitespace=True) or [text]
