"""The default `Layout.facts`: what an export manifest records about an entry's build."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Iterable, Mapping, NamedTuple, Protocol

from kcache_cli.formats.gpu import archs_from_command
from kcache_cli.fs.read import parse_json

if TYPE_CHECKING:
    from kcache_cli.model.records import Entry

RECORD = "kcache.json"  # what kcache's own build recorded
BINARY_SUFFIXES = (".so", ".cubin", ".fatbin", ".o", ".a", ".hsaco", ".dylib", ".dll")


class Facts(NamedTuple):
    """What an export manifest records about an entry's build, where known."""

    compiler: str | None
    arch: str | None  # "sm_90a" or "sm_80,compute_80"
    platform: str | None


class FactSource(Protocol):
    """What `entry_facts` asks of the entry's layout (a `layouts.base.Layout`)."""

    def compile_command(self, small: Mapping[str, bytes]) -> str | None: ...

    def options_arch(self, small: Mapping[str, bytes]) -> str | None: ...

    def platform(self, entry: Entry) -> str | None: ...


def is_binary_name(name: str) -> bool:
    return name.lower().endswith(BINARY_SUFFIXES)


def _recorded(small: Mapping[str, bytes]) -> list[str | None]:
    record = small.get(RECORD)
    if record:
        try:
            data = parse_json(record, RECORD)  # nesting-limited: the entry may hold anything
            return [str(data[k]) if data.get(k) else None for k in ("compiler", "arch", "platform")]
        except (ValueError, AttributeError, TypeError):
            pass
    return [None, None, None]


def _binary_archs(paths: list[str]) -> str | None:
    try:
        from kcache_cli.formats.binary import read_binary
    except ImportError:  # the ELF reader is optional here
        return None
    found: list[str] = []
    for b in paths:
        info = read_binary(b)
        found.extend(info.archs)
        found.extend(info.ptx_archs)
    return ",".join(dict.fromkeys(found)) or None


def entry_facts(layout: FactSource, entry: Entry, small: Mapping[str, bytes], names: Iterable[str]) -> Facts:
    """What the entry recorded (kcache.json), else its compile command, else its options' arch, else
    (no command at all) the archs inside its binaries."""
    compiler, arch, platform = _recorded(small)
    command = layout.compile_command(small)
    if command:
        words = command.split()
        if compiler is None and words:
            compiler = os.path.basename(words[0])
        arch = arch or archs_from_command(command)
    arch = arch or layout.options_arch(small)
    platform = platform or layout.platform(entry)
    if arch is None and not command and entry.target != "cpu":
        arch = _binary_archs([os.path.join(entry.path, n) for n in names if is_binary_name(n)])
    return Facts(compiler, arch, platform)
