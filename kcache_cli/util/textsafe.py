"""Text from a cache (compile logs, names, paths, reasons) made safe to show on a terminal.

A compile log or a directory name can hold bytes a terminal obeys: ESC sequences that clear the
screen, set the window title or write the clipboard (OSC 52), C1 controls (U+0080-U+009F: 8-bit
CSI and OSC), and bidi overrides that make text read differently from what it is. `printable`
shows each of them as a visible escape (`\\x1b`, `\\u202e`) and leaves everything else alone."""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1, bidi marks, embeddings, overrides and isolates, line and
# paragraph separators, and lone surrogates (undecodable bytes of a file name, from os.fsdecode).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                     "\ud800-\udfff]")
_UNSAFE_LINE = re.compile("[\t\n" + _UNSAFE.pattern[1:])


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    if 0xDC80 <= c <= 0xDCFF:  # a byte os.fsdecode could not decode: show the byte
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: str) -> str:
    """`text` with every terminal control but newline and tab shown as an escape."""
    if text.isprintable():  # the common case, at C speed: no control, format or separator character
        return text
    return _UNSAFE.sub(_escape, text)


def printable_line(text: str) -> str:
    """Like `printable`, and newlines and tabs escaped too: for a name or a table cell, which must
    stay on its line."""
    if text.isprintable():
        return text
    return _UNSAFE_LINE.sub(_escape, text)


def has_unsafe(text: str) -> bool:
    """Whether `text` holds a character `printable` would escape (or a tab or newline)."""
    return not text.isprintable() and _UNSAFE_LINE.search(text) is not None


def one_line(text: str) -> str:
    """`text` for a list of names one per line (`ls -q`), as GNU `ls -q` shows them: every control
    character (newline and tab too), bidi control and undecodable byte becomes `?`. A name holding a
    newline can never become two lines (`x\\netc` is never the line `etc`); `-0` gives the raw names."""
    if text.isprintable():
        return text
    return _UNSAFE_LINE.sub("?", text)
