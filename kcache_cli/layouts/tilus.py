"""tilus 0.2.0: <root>/programs/<h12>/ (compiled programs) and <root>/scripts/<name>/<jit key>-<h8>/
(scripts whose programs/<i> and latency/<key>/<i> are relative symlinks to programs).

A copy made by a tool that does not keep symlinks (some archivers, some git set-ups) turns each
link into a small file holding the link's target; kcache reads those "flattened links" as links."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Iterator

from kcache_cli.layouts.base import Layout
from kcache_cli.model import Judgement
from kcache_cli.layouts.shapes import TILUS
from kcache_cli.checks import changed_since, elf_truncated, list_files, read_head, read_text
from kcache_cli.model import (COMPLETE, CORRUPT, FAILED, PARTIAL, Details, Entry, LogFile, ScanFilter, TensorInfo,
                              measure_tree)

NAME = TILUS.name
TARGET = TILUS.kinds[0].target  # tilus compiles for NVIDIA GPUs only
_PROGRAM_NAME = re.compile(rb"^def (\w+)\(")
_FLAT_LINK = re.compile(r"^(\.\./)+programs/[0-9a-f]+/?$")
LINK_DIRS = ("programs", "latency")


def read_link(path: str) -> str | None:
    """The target of a symlink, or of a flattened link (a tiny file holding `../../programs/<h>`)."""
    try:
        return os.readlink(path)
    except OSError:
        pass
    try:
        if os.path.getsize(path) > 256:
            return None
        with open(path, "rb") as f:
            text = f.read(257).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if _FLAT_LINK.match(text) else None


def script_links(script_path: str) -> list[tuple[str, str, str | None]]:
    """(name inside the script, link text, resolved program dir or None when dangling) for every
    programs/<i> and latency/<key>/<i> link of a script."""
    out = []
    for sub in LINK_DIRS:
        base = os.path.join(script_path, sub)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for n in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
                full = os.path.join(dirpath, n)
                text = read_link(full)
                if text is None:
                    continue
                target = os.path.normpath(os.path.join(dirpath, text))
                ok = target if os.path.isdir(target) else None
                out.append((os.path.relpath(full, script_path), text, ok))
    return out


def _program_name(path: str) -> str | None:
    try:
        with open(os.path.join(path, "program.txt"), "rb") as f:
            m = _PROGRAM_NAME.match(f.read(256))
    except OSError:
        return None
    return m.group(1).decode() if m else None


def program_status(path: str) -> tuple[str, str | None]:
    module = os.path.join(path, "module")
    mtimes = {}
    for name in ("lib.so", "func_types.pickle"):
        try:
            st = os.stat(os.path.join(module, name))
        except OSError:
            continue
        mtimes[name] = st.st_mtime
        if name == "lib.so":
            lib = st.st_size
    if "lib.so" not in mtimes:
        lib = None
    if lib is None:
        if os.path.exists(os.path.join(module, "nvcc_output.txt")):
            return FAILED, "compile failed: module/nvcc_output.txt but no module/lib.so"
        return PARTIAL, "no module/lib.so: the build was interrupted or is still running"
    if lib == 0:
        return PARTIAL, "module/lib.so is empty"
    if changed_since(mtimes, "func_types.pickle"):  # written after lib.so: tilus's completion marker
        truncated = elf_truncated("lib.so", read_head(os.path.join(module, "lib.so")), lib)
        if truncated:
            return CORRUPT, "module/" + truncated
    for name in ("program.txt", "options.txt"):
        if not os.path.isfile(os.path.join(path, name)):
            return PARTIAL, f"no {name}"
    return COMPLETE, None


def script_status(path: str) -> tuple[str, str | None]:
    links = script_links(path)
    for name, text, target in links:
        if target is None:
            return CORRUPT, f"dangling link {name} -> {text}"
    if not links and not os.path.isdir(os.path.join(path, "programs")):
        return PARTIAL, "no programs/ directory: tilus did not finish the script"
    return COMPLETE, None


def scan(ctx, flt: ScanFilter) -> Iterator[Entry]:
    if not flt.wants_target(TARGET) or flt.spaces:
        return  # tilus entries have no space
    scripts = ctx.root / "scripts"
    if flt.ops:
        script_dirs = [(o, str(scripts / o)) for o in flt.ops if (scripts / o).is_dir()]
    else:
        script_dirs = [(d.name, d.path) for d in ctx.listdir(scripts) if d.is_dir(follow_symlinks=False)]
    linked: dict[str, str] = {}  # program dir -> op of a script that links to it
    for op, sdir in script_dirs:
        for de in ctx.listdir(sdir):
            if not de.is_dir(follow_symlinks=False):
                continue
            status, reason = script_status(de.path)
            if flt.ops:
                for _, _, target in script_links(de.path):
                    if target:
                        linked.setdefault(target, op)
            yield ctx.entry(path=de.path, usage=measure_tree(de.path, ctx.warn), layout=NAME, kind="script",
                            target=TARGET, space=None, op=op, hash=de.name, status=status, reason=reason)
    if flt.ops:  # only the programs the selected scripts use: no need to read every program
        programs = [(os.path.basename(p), p, op) for p, op in sorted(linked.items())]
    else:
        programs = [(d.name, d.path, None) for d in ctx.listdir(ctx.root / "programs")
                    if d.is_dir(follow_symlinks=False)]
    for h, path, op in programs:
        status, reason = program_status(path)
        yield ctx.entry(path=path, usage=measure_tree(path, ctx.warn), layout=NAME, kind="program",
                        target=TARGET, space=None, op=op or _program_name(path), hash=h, status=status,
                        reason=reason)


def referrers(root: Path, program_path: str) -> list[str]:
    """Script directories with a link to the program at `program_path`."""
    return sorted(link_map(root).get(os.path.normpath(program_path), []))


def describe(root: Path, entry: Entry) -> Details:
    p = entry.path
    problems: list[str] = []
    facts: list[tuple[str, str]] = []
    files = list_files(p)
    command = output = None
    binaries: tuple[str, ...] = ()
    inputs: tuple[TensorInfo, ...] = ()
    if entry.kind == "program":
        options = read_text(os.path.join(p, "options.txt"))
        program = read_text(os.path.join(p, "program.txt"))
        if options is not None and program is not None:
            actual = hashlib.sha256((options + program).encode()).hexdigest()[:12]
            if actual != entry.hash:
                problems.append(f"options.txt + program.txt hash to {actual}, not {entry.hash}: "
                                "edited after the build, tilus will never load this program")
        if options:
            m = re.search(r"arch='(\w+)'", options)
            if m:
                facts.append(("options arch", m.group(1)))
        script = read_text(os.path.join(p, "module", "compile.sh"))
        if script is not None:
            from kcache_cli.layouts.hidet import command_from_script

            command = command_from_script(script)
        output = read_text(os.path.join(p, "module", "nvcc_output.txt"))
        lib = os.path.join(p, "module", "lib.so")
        binaries = (lib,) if os.path.isfile(lib) else ()
        users = referrers(root, p)
        facts.append(("used by scripts", ", ".join(os.path.relpath(u, root) for u in users) or "none"))
    else:
        for name, text, target in script_links(p):
            if target is None:
                problems.append(f"dangling link {name} -> {text}")
            else:
                facts.append((f"link {name}", f"{text} ({program_status(target)[0]})"))
        meta = read_text(os.path.join(p, "meta.json"))
        if meta:
            import json

            try:
                params = json.loads(meta).get("params", {})
                inputs = tuple(TensorInfo(n, str(t), ()) for n, t in zip(params.get("names", []),
                                                                           params.get("types", [])))
            except (ValueError, AttributeError):
                problems.append("meta.json is not valid JSON")
        table = read_text(os.path.join(p, "dispatch_table.txt"))
        if table:
            facts.append(("dispatch table", table.strip()))
    status, reason = entry.status, entry.reason
    if problems and status == COMPLETE:
        status, reason = CORRUPT, problems[0]
    return Details(entry, status, reason, tuple(problems), files, entry.op, inputs, (), command, output,
                   binaries, tuple(facts))


def log_files(entry: Entry) -> list[LogFile]:
    if entry.kind == "program":
        dirs = [entry.path]
    else:
        dirs = sorted({t for _, _, t in script_links(entry.path) if t})
    out = []
    for d in dirs:
        for n in ("compile.sh", "nvcc_output.txt"):
            full = os.path.join(d, "module", n)
            if os.path.isfile(full):
                label = f"module/{n}" if entry.kind == "program" else f"{os.path.basename(d)}/module/{n}"
                out.append(LogFile(label, full))
    return out


# ---- for prune/clear -----------------------------------------------------------------------------

def link_map(root: Path) -> dict[str, list[str]]:
    """Every program dir (normalized path) -> the script dirs that link to it, over all scripts.

    One walk of scripts/ (links are read, never followed out of the cache)."""
    out: dict[str, list[str]] = {}
    scripts = os.path.join(root, "scripts")
    try:
        names = sorted(os.scandir(scripts), key=lambda d: d.name)
    except OSError:
        return out
    for sdir in names:
        if not sdir.is_dir(follow_symlinks=False):
            continue
        try:
            jdirs = sorted(os.scandir(sdir.path), key=lambda d: d.name)
        except OSError:
            continue
        for jdir in jdirs:
            if not jdir.is_dir(follow_symlinks=False):
                continue
            for _, _, target in script_links(jdir.path):
                if target:
                    users = out.setdefault(os.path.normpath(target), [])
                    if jdir.path not in users:
                        users.append(jdir.path)
    return out


def stray_links(ctx, flt: ScanFilter) -> Iterator[Entry]:
    """Symlinks where a program, a script or a script's op directory belongs: never followed
    (scan skips them); prune --broken and clear remove them as links."""
    if not flt.wants_target(TARGET) or flt.spaces:
        return

    def link(de: os.DirEntry, kind: str, op: str | None, h: str) -> Entry:
        return ctx.link_entry(de.path, f"where a {kind} belongs", layout=NAME, kind=kind, target=TARGET,
                              space=None, op=op, hash=h)

    linked_tops = set()
    for top, kind in (("programs", "program"), ("scripts", "script")):
        path = ctx.root / top
        if path.is_symlink():
            linked_tops.add(top)
            if not flt.ops:
                yield ctx.link_entry(str(path), f"where {top}/ belongs", layout=NAME, kind=kind, target=TARGET,
                                     space=None, op=None, hash="")
    if "programs" not in linked_tops:
        for de in ctx.listdir(ctx.root / "programs"):
            if de.is_symlink() and not flt.ops:
                yield link(de, "program", None, de.name)
    if "scripts" in linked_tops:
        return
    for sdir in ctx.listdir(ctx.root / "scripts"):
        if flt.ops and sdir.name not in flt.ops:
            continue
        if sdir.is_symlink():
            yield link(sdir, "script", sdir.name, "")
        elif sdir.is_dir(follow_symlinks=False):
            for de in ctx.listdir(sdir.path):
                if de.is_symlink():
                    yield link(de, "script", sdir.name, de.name)


# ---- the layout ----------------------------------------------------------------------------------

_OPTIONS_ARCH = re.compile(rb"arch='sm_?(\d+)([af]?)'")


class TilusLayout(Layout):
    """tilus: scripts link to the programs they run (relative symlinks into programs/)."""

    shape = TILUS
    writer_locks = (".lock", "dispatch_table.txt.lock")
    provider_kinds = frozenset({"program"})
    fact_files = ("kcache.json", "module/compile.sh", "options.txt")

    def scan(self, ctx, flt: ScanFilter) -> Iterator[Entry]:
        return scan(ctx, flt)

    def stray_links(self, ctx, flt: ScanFilter) -> Iterator[Entry]:
        return stray_links(ctx, flt)

    def judge(self, path: str, kind: str, deep: bool = False, *, root=None) -> Judgement:
        return Judgement.of(*(program_status(path) if kind == "program" else script_status(path)))

    def describe(self, root: Path, entry: Entry) -> Details:
        return describe(root, entry)

    def log_files(self, entry: Entry) -> list[LogFile]:
        return log_files(entry)

    def uses(self, root: Path, entry: Entry) -> list[str]:
        if entry.kind != "script":
            return []
        return [os.path.relpath(t, root).replace(os.sep, "/") for _, _, t in script_links(entry.path) if t]

    def users(self, root: Path, providers: list[str]) -> dict[str, list[str]]:
        links = link_map(root)
        return {p: links.get(os.path.normpath(p), []) for p in providers}

    def users_break(self, kind: str) -> bool:
        return kind == "program"  # its scripts' links would dangle

    def link_target(self, kind: str, resolved: list[str]) -> str | None:
        if kind == "script" and len(resolved) == 2 and resolved[0] == "programs" and not resolved[1].startswith("."):
            return "/".join(resolved)
        return None

    def empty_parent_levels(self, kind: str) -> int:
        return 1 if kind == "script" else 0  # the script's op directory

    def compile_command(self, small) -> str | None:
        from kcache_cli.layouts.hidet import command_from_script

        script = small.get("module/compile.sh")
        return command_from_script(script.decode("utf-8", "replace")) if script is not None else None

    def options_arch(self, small) -> str | None:
        m = _OPTIONS_ARCH.search(small.get("options.txt") or b"")
        return f"sm_{m.group(1).decode()}{m.group(2).decode()}" if m else None

    def default_root(self):
        return Path.home() / ".cache" / "tilus", "tilus's default (~/.cache/tilus)"


LAYOUT = TilusLayout()
