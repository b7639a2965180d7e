"""Why are there two of these? What differs between two entries of one layout and kind (`kcache diff`).

An entry's properties are what its layout says about it (`Layout.describe`: facts such as Triton's
num_warps or vLLM's key factors, the compile command, the task's tensors) and what its small records say
(top-level JSON files flattened to dotted keys: Triton's metadata with its constants and target, hidet's
meta.json; text records such as task.txt, options.txt, version.txt line by line). Nothing is unpickled;
every read is bounded and goes through fsread (no links followed, no FIFOs opened)."""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from kcache_cli.fs import read as fsread
from kcache_cli.layouts import get
from kcache_cli.model.records import Entry

MAX_RECORD = 256 << 10  # bytes of one JSON or text record read
TEXT_RECORDS = ("task.txt", "options.txt", "version.txt", "build_options.txt", "program.txt", "compile.sh",
                "module/compile.sh", "params.json")
SKIP_JSON = ("manifest.json",)  # per-file checksums: they differ whenever anything does
SKIP_FACTS = ("group file", "paths", "variants")  # where the entry lies, not how it was built


@dataclass(frozen=True)
class Difference:
    """One property that differs between two entries, with the changed lines of a text."""

    name: str
    a: str | None  # None: A has no such property
    b: str | None
    lines: tuple[str, ...] = ()  # for text records: the changed lines, "-" from A, "+" from B

    def to_json(self) -> dict:
        return {"property": self.name, "a": self.a, "b": self.b, "lines": list(self.lines)}


@dataclass(frozen=True)
class EntryDiff:
    """Two entries compared: what differs and how many properties are the same."""

    a: Entry
    b: Entry
    differences: tuple[Difference, ...]
    same: int  # properties equal in both

    def to_json(self) -> dict:
        return {"a": self.a.to_json(), "b": self.b.to_json(), "same": self.same,
                "differences": [d.to_json() for d in self.differences]}


def properties(root: Path, entry: Entry) -> dict[str, str]:
    """Every property of `entry` that can tell two builds apart, by name."""
    d = get(entry.layout).describe(root, entry)
    props: dict[str, str] = {}
    for label, value in d.facts:
        if label not in SKIP_FACTS:
            props[f"fact: {label}"] = value
    if d.compile_command:
        props["compile command"] = d.compile_command
    for side, tensors in (("input", d.inputs), ("output", d.outputs)):
        for i, t in enumerate(tensors):
            props[f"{side} {t.name or i}"] = f"{t.dtype}{list(t.shape)}"
    props["size"], props["files"] = str(entry.size), str(entry.files)  # bytes and a count, as ls --json
    props.update(_records(entry))
    return props


def _records(entry: Entry) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        names = sorted(os.listdir(entry.path))
    except OSError:
        return out
    for name in names:
        if name.endswith(".json") and not name.startswith(("__grp__", ".")) and name not in SKIP_JSON:
            data = fsread.json_object(os.path.join(entry.path, name), MAX_RECORD)
            label = "<kernel>.json" if entry.op and name == f"{entry.op}.json" else name
            for key, value in _flatten(data).items() if data is not None else ():
                out[f"{label}: {key}"] = value
    for name in TEXT_RECORDS:
        text = fsread.read_text(os.path.join(entry.path, name), MAX_RECORD, base=entry.path)
        if text is not None and not name.endswith(".json"):
            out[name] = text
    return out


def _flatten(data: object, prefix: str = "") -> dict[str, str]:
    if isinstance(data, dict) and data:
        out: dict[str, str] = {}
        for k, v in data.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: json.dumps(data, sort_keys=True)} if prefix else {}


def diff_entries(a_root: Path, a: Entry, b_root: Path, b: Entry) -> EntryDiff:
    pa, pb = properties(a_root, a), properties(b_root, b)
    out: list[Difference] = []
    same = 0
    for name in sorted(set(pa) | set(pb)):
        va, vb = pa.get(name), pb.get(name)
        if va == vb:
            same += 1
            continue
        lines: tuple[str, ...] = ()
        if va is not None and vb is not None and ("\n" in va or "\n" in vb):
            lines = tuple(ln for ln in difflib.unified_diff(va.splitlines(), vb.splitlines(), lineterm="", n=0)
                          if ln[:1] in "+-" and not ln.startswith(("+++", "---")))
        out.append(Difference(name, va, vb, lines))
    return EntryDiff(a, b, tuple(out), same)
