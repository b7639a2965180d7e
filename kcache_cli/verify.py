"""`verify`: every selected entry against its layout's rules and any recorded checksums.

The deep checks are the layouts' own `describe()` (task.txt's hash against the directory name,
files against kcache.json or tilelang's manifest.json / metadata.json, tilus links); on top of
them an entry that is not complete is a problem (its reason), and so is a binary that is not a
binary at all (not ELF, cubin or fatbin). Entries being built are left alone and counted."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kcache_cli.model import BUILDING, COMPLETE, CORRUPT, Entry, ScanFilter, Warn


@dataclass(frozen=True)
class EntryCheck:
    entry: Entry
    status: str  # after the deep checks (a complete entry that fails one is corrupt)
    problems: tuple[str, ...]


@dataclass(frozen=True)
class VerifyResult:
    root: str
    exists: bool
    checked: tuple[EntryCheck, ...]
    skipped: tuple[Entry, ...]  # being built
    warnings: tuple[str, ...]

    @property
    def failed(self) -> tuple[EntryCheck, ...]:
        return tuple(c for c in self.checked if c.problems)


def check_entry(root: Path, entry: Entry) -> EntryCheck:
    from kcache_cli.layouts import LAYOUTS

    try:
        details = LAYOUTS[entry.layout].describe(Path(root), entry)
    except OSError as exc:
        return EntryCheck(entry, CORRUPT, (f"cannot read the entry: {exc.strerror}",))
    except RecursionError:  # a second net: the walks and JSON reads are bounded (fsread)
        return EntryCheck(entry, CORRUPT, ("nested too deeply to check",))
    problems = list(details.problems)
    if entry.status != COMPLETE and entry.reason and entry.reason not in problems:
        problems.insert(0, entry.reason)
    try:
        from kcache_cli.binary import FORMAT_UNKNOWN, read_binary
    except ImportError:
        read_binary = None
    for path in details.binaries if read_binary else ():
        info = read_binary(path)
        if info.format == FORMAT_UNKNOWN:
            name = os.path.relpath(path, entry.path)
            problems.append(f"{name} is not a readable kernel binary ({info.error or 'unknown format'})")
    status = details.status
    if problems and status == COMPLETE:
        status = CORRUPT
    return EntryCheck(entry, status, tuple(problems))


def verify_cache(root: Path, flt: ScanFilter = ScanFilter(), warn: Warn | None = None, progress=None
                 ) -> VerifyResult:
    """Deep-check every entry `flt` selects. `progress` gets start(total entries) and advance(1)."""
    from kcache_cli.scan import scan_cache

    result = scan_cache(Path(root), flt, warn)
    todo = [e for e in result.entries if e.status != BUILDING]
    skipped = tuple(e for e in result.entries if e.status == BUILDING)
    if progress:
        progress.start(len(todo))
    checked = []
    for e in sorted(todo, key=lambda e: e.relpath):
        checked.append(check_entry(root, e))
        if progress:
            progress.advance(1)
    return VerifyResult(result.root, result.exists, tuple(checked), skipped, result.warnings)
