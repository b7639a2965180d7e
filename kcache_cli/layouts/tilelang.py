"""tilelang 0.1.15: <root>/<version>/<platform>/kernels/<sha256>/ (compiled kernels, with a
manifest.json of sizes and sha256s), <root>/<version>/cuda-binaries/<sha256>/ (cubins with a
metadata.json), and `.staging/` directories for writes in flight."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterator

from kcache_cli.checks import check_manifest, list_files, read_text, size_mismatch
from kcache_cli.model import (COMPLETE, CORRUPT, PARTIAL, UNREADABLE_REASON, Details, Entry, LogFile, ScanFilter,
                              measure_tree)

NAME = "tilelang"
TARGET = "cuda"
VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?([.+\-\w]*)$")
KERNEL_BINARIES = ("executable.so", "kernel_lib.so", "kernel.cubin")
CUBIN_BINARIES = ("kernel.cubin", "kernel.fatbin")
STAGING = ".staging"
UNREADABLE = (CORRUPT, UNREADABLE_REASON)
BINARIES_DIR = "cuda-binaries"


def detect(root: Path) -> bool:
    try:
        return any(VERSION_RE.match(d.name) and d.is_dir() for d in os.scandir(root))
    except OSError:
        return False


def _load_json(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def kernel_status(path: str, names: dict[str, int]) -> tuple[str, str | None]:
    binary = next((b for b in KERNEL_BINARIES if b in names), None)
    if "manifest.json" in names:
        manifest = _load_json(os.path.join(path, "manifest.json"))
        if manifest is None or not isinstance(manifest.get("files"), dict):
            return CORRUPT, "manifest.json is unreadable"
        bad = size_mismatch("manifest.json", manifest["files"], names)
        if bad:
            return CORRUPT, bad
    if binary is None:
        return PARTIAL, "no executable.so, kernel_lib.so or kernel.cubin"
    if names[binary] == 0:
        return PARTIAL, f"{binary} is empty"
    if binary == "kernel.cubin" and "kernel.py" not in names:
        return PARTIAL, "kernel.cubin without kernel.py"
    if "params.json" not in names and "params.pkl" not in names:
        return PARTIAL, "no params.json"
    return COMPLETE, None


def binary_status(path: str, names: dict[str, int]) -> tuple[str, str | None]:
    binary = next((b for b in CUBIN_BINARIES if b in names), None)
    if binary is None:
        return PARTIAL, "no kernel.cubin or kernel.fatbin"
    if "metadata.json" not in names:
        return PARTIAL, "no metadata.json"
    meta = _load_json(os.path.join(path, "metadata.json"))
    if meta is None:
        return CORRUPT, "metadata.json is unreadable"
    if meta.get("size") is not None and meta["size"] != names[binary]:
        return CORRUPT, f"{binary} is {names[binary]} bytes, metadata.json says {meta['size']}"
    return COMPLETE, None


def _staging(ctx, path: str, kind: str, space: str) -> Iterator[Entry]:
    for de in ctx.listdir(path):
        usage = measure_tree(de.path, ctx.warn)  # a file gives its own size
        yield ctx.entry(path=de.path, usage=usage, layout=NAME, kind=kind, target=TARGET, space=space, op=None,
                        hash=de.name, status=PARTIAL, reason="tilelang staging directory (a write in flight, "
                        "stale after an hour)")


def scan(ctx, flt: ScanFilter) -> Iterator[Entry]:
    if flt.ops or not flt.wants_target(TARGET):
        return  # tilelang kernels carry no op name
    for vdir in ctx.listdir(ctx.root):
        if not VERSION_RE.match(vdir.name) or not vdir.is_dir(follow_symlinks=False):
            continue
        version = vdir.name
        for sub in ctx.listdir(vdir.path):
            if not sub.is_dir(follow_symlinks=False):
                continue
            if sub.name == BINARIES_DIR:
                space = f"{version}/{BINARIES_DIR}"
                if not flt.wants_space(space):
                    continue
                for de in ctx.listdir(sub.path):
                    if de.is_dir(follow_symlinks=False):
                        names, usage = ctx.read_dir(de.path)
                        status, reason = binary_status(de.path, names) if names is not None else UNREADABLE
                        yield ctx.entry(path=de.path, usage=usage, layout=NAME, kind="binary", target=TARGET,
                                        space=space, op=None, hash=de.name, status=status, reason=reason)
            elif sub.name == STAGING:
                if flt.wants_space(version):
                    yield from _staging(ctx, sub.path, "binary", version)
            else:
                space = f"{version}/{sub.name}"
                if not flt.wants_space(space):
                    continue
                yield from _staging(ctx, os.path.join(sub.path, STAGING), "kernel", space)
                for de in ctx.listdir(os.path.join(sub.path, "kernels")):
                    if de.is_dir(follow_symlinks=False):
                        names, usage = ctx.read_dir(de.path)
                        status, reason = kernel_status(de.path, names) if names is not None else UNREADABLE
                        yield ctx.entry(path=de.path, usage=usage, layout=NAME, kind="kernel", target=TARGET,
                                        space=space, op=None, hash=de.name, status=status, reason=reason)


def describe(root: Path, entry: Entry) -> Details:
    p = entry.path
    problems: list[str] = []
    facts: list[tuple[str, str]] = []
    files = list_files(p) if os.path.isdir(p) else ()
    if entry.kind == "kernel":
        manifest = _load_json(os.path.join(p, "manifest.json"))
        if manifest is None:
            facts.append(("manifest", "none (nothing to check checksums against)"))
        else:
            problems.extend(check_manifest(p, "manifest.json", manifest.get("files") or {}))
        host = read_text(os.path.join(p, "host_kernel.cu"), 4096)
        if host and host.startswith("// tilelang target:"):
            facts.append(("host target", host.splitlines()[0].split(":", 1)[1].strip()))
        binaries = tuple(os.path.join(p, b) for b in KERNEL_BINARIES if os.path.isfile(os.path.join(p, b)))
    else:
        meta = _load_json(os.path.join(p, "metadata.json")) or {}
        binary = next((b for b in CUBIN_BINARIES if os.path.isfile(os.path.join(p, b))), None)
        if binary and meta.get("sha256"):
            problems.extend(check_manifest(p, "metadata.json", {binary: {"size": meta.get("size"),
                                                                         "sha256": meta["sha256"]}}))
        if meta.get("format"):
            facts.append(("format", str(meta["format"])))
        binaries = (os.path.join(p, binary),) if binary else ()
    status, reason = entry.status, entry.reason
    if problems and status == COMPLETE:
        status, reason = CORRUPT, problems[0]
    return Details(entry, status, reason, tuple(problems), files, None, (), (), None, None, binaries, tuple(facts))


def log_files(entry: Entry) -> list[LogFile]:
    return []  # tilelang keeps no compile log on disk
