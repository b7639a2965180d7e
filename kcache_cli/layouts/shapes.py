"""Where each layout keeps its entries, as plain data: the path shape of every kind.

This module is light on purpose (only `re`, not even `dataclasses`): shell completion (kcache_cli/names.py)
and option parsing (kcache_cli/terms.py) read these shapes without importing the layouts' code. The
layout modules (hidet.py, tilus.py, tilelang.py) take their shapes from here, and the archive checks an
entry path against them, so a shape is written exactly once.

Registering a layout is adding its `LayoutShape` to `SHAPES`; its code is the module
`kcache_cli/layouts/<name>.py`, which defines `LAYOUT`, an instance of `layouts.base.Layout`.

A template names the directories from the cache root down to an entry, one segment per directory.
`{field}` parts match a name (by default any visible name: not empty, not starting with '.'):
`hash` is the entry's own directory name, `op` its op name, `target` its target; a kind's `space` is a
template over the fields. Fixed text matches itself.
"""

from __future__ import annotations

import re

VISIBLE = r"[^/.][^/]*"  # a name that is not hidden (temp, staging and state directories are)
_FIELD = re.compile(r"\{(\w+)\}")


def _segment_regex(segment: str, patterns: dict[str, str]) -> re.Pattern[str]:
    out, pos = [], 0
    for m in _FIELD.finditer(segment):
        out.append(re.escape(segment[pos:m.start()]))
        out.append(f"(?P<{m.group(1)}>{patterns.get(m.group(1), VISIBLE)})")
        pos = m.end()
    out.append(re.escape(segment[pos:]))
    return re.compile("^" + "".join(out) + "$")  # anchored: .match() takes whole names only


class KindShape:
    """The path of one kind of entry, relative to the cache root."""

    __slots__ = ("kind", "template", "space", "target", "segments")

    def __init__(self, kind: str, template: str, space: str | None = None, target: str | None = None,
                 patterns: tuple[tuple[str, str], ...] = ()) -> None:
        self.kind = kind  # "op", "program", "kernel"...
        self.template = template  # "ops/{target}_space_{level}/{op}/{hash}"
        self.space = space  # "{target}_space_{level}"; None: entries of this kind have no space
        self.target = target  # a fixed target ("cuda"); None: the {target} field, or no target
        # `patterns`: (field, regex) for the fields that are not just any visible name
        self.segments = tuple(_segment_regex(s, dict(patterns)) for s in template.split("/"))

    def __repr__(self) -> str:
        return f"KindShape({self.kind!r}, {self.template!r})"

    @property
    def depth(self) -> int:
        return len(self.segments)

    def fields_in(self, i: int) -> tuple[str, ...]:
        """The fields segment `i` of the template names."""
        return tuple(_FIELD.findall(self.template.split("/")[i]))

    def has(self, name: str) -> bool:
        """Whether the path carries `name` ("op", "space", "target"), so a filter on it can apply."""
        if name == "space":
            return self.space is not None
        if name == "target":
            return self.target is not None or "{target}" in self.template
        return "{" + name + "}" in self.template

    def match_segment(self, i: int, name: str) -> dict[str, str] | None:
        m = self.segments[i].fullmatch(name)
        return m.groupdict() if m else None

    def match(self, relpath: str) -> dict[str, str | None] | None:
        """The entry's key fields (hash, op, space, target) if `relpath` is where such an entry lives."""
        parts = relpath.split("/")
        if len(parts) != self.depth:
            return None
        found: dict[str, str] = {}
        for i, part in enumerate(parts):
            got = self.match_segment(i, part)
            if got is None:
                return None
            found.update(got)
        return self.key(found)

    def key(self, found: dict[str, str]) -> dict[str, str | None]:
        """hash, op, space and target from the template's fields."""
        return {"hash": found.get("hash"), "op": found.get("op"), "space": self.space_of(found),
                "target": self.target or found.get("target")}

    def space_of(self, found: dict[str, str]) -> str | None:
        if self.space is None:
            return None
        return _FIELD.sub(lambda m: found.get(m.group(1), ""), self.space)

    def relpath(self, **values: str) -> str:
        """The template filled in: `relpath(target="cuda", level="0", op="matmul", hash="ab12")`."""
        return _FIELD.sub(lambda m: values[m.group(1)], self.template)


class LayoutShape:
    """A layout's name and the shapes of its kinds."""

    __slots__ = ("name", "kinds", "summary", "build_kind")

    def __init__(self, name: str, kinds: tuple[KindShape, ...], summary: str, build_kind: str | None = None) -> None:
        self.name = name
        self.kinds = kinds
        self.summary = summary  # one line for help texts: where its entries are
        self.build_kind = build_kind  # the kind `kcache build` writes into this layout (one layout has one)

    def __repr__(self) -> str:
        return f"LayoutShape({self.name!r})"

    def kind(self, kind: str) -> KindShape | None:
        return next((k for k in self.kinds if k.kind == kind), None)

    def tops(self, names) -> list[str]:
        """The names among `names` (a root's top-level directories) that start one of this layout's paths."""
        return [n for n in names if any(k.segments[0].fullmatch(n) for k in self.kinds)]

    def locate(self, relpath: str) -> tuple[str, dict[str, str | None]] | None:
        """(kind, key fields) of the entry that lives at `relpath`, or None."""
        for k in self.kinds:
            got = k.match(relpath)
            if got is not None:
                return k.kind, got
        return None


HIDET = LayoutShape("hidet", (
    KindShape("op", "ops/{target}_space_{level}/{op}/{hash}", space="{target}_space_{level}",
              patterns=(("target", r"[a-z0-9]+"), ("level", r"\d+"))),
    KindShape("graph", "graphs/{hash}"),
    KindShape("ir_module", "ir_modules/{hash}"),
), "ops/<space>/<op>/<hash>, graphs/, ir_modules/", build_kind="op")

TILUS = LayoutShape("tilus", (
    KindShape("program", "programs/{hash}", target="cuda"),
    KindShape("script", "scripts/{op}/{hash}", target="cuda"),
), "programs/, scripts/")

_TILELANG_VERSION = (("version", r"\d+\.\d+(?:\.\d+)?[.+\-\w]*"), ("platform", r"(?!cuda-binaries$)[^/.][^/]*"))
TILELANG = LayoutShape("tilelang", (
    KindShape("kernel", "{version}/{platform}/kernels/{hash}", space="{version}/{platform}", target="cuda",
              patterns=_TILELANG_VERSION),
    KindShape("binary", "{version}/cuda-binaries/{hash}", space="{version}/cuda-binaries", target="cuda",
              patterns=_TILELANG_VERSION),
), "<version>/<platform>/kernels/, cuda-binaries/")

# Triton: <root>/<key>/, the key the base32 of a sha256 (Triton >= 3.2) or its hex (before). The target
# and arch (the entries' space) are in the kernel's metadata file, not in the path.
_TRITON_KEY = (("hash", r"[A-Z2-7]{52}|[0-9a-f]{64}"),)
TRITON = LayoutShape("triton", (
    KindShape("kernel", "{hash}", patterns=_TRITON_KEY),
    KindShape("binary", "{hash}", patterns=_TRITON_KEY),  # the driver's compiled launcher module
), "<base32 key>/ per kernel")

# The registry: one shape per layout, in the order layouts are scanned and listed.
SHAPES: tuple[LayoutShape, ...] = (HIDET, TILUS, TILELANG, TRITON)
BY_NAME = {s.name: s for s in SHAPES}
BUILD_SHAPE = next(s for s in SHAPES if s.build_kind)  # where `kcache build` publishes
