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

from kcache_cli.checks import changed_since, elf_truncated, list_files, read_head, read_text
from kcache_cli.model import (COMPLETE, CORRUPT, FAILED, PARTIAL, Details, Entry, LogFile, ScanFilter, TensorInfo,
                              measure_tree)

NAME = "tilus"
TARGET = "cuda"  # tilus compiles for NVIDIA GPUs only
_PROGRAM_NAME = re.compile(rb"^def (\w+)\(")
_FLAT_LINK = re.compile(r"^(\.\./)+programs/[0-9a-f]+/?$")
LINK_DIRS = ("programs", "latency")


# ---- evidence: what makes a directory tilus's ----------------------------------------------------
PROGRAM_NAME = re.compile(r"^[0-9a-f]{12}$")  # sha256(options + program)[:12]
SCRIPT_NAME = re.compile(r"^[^/]+-[0-9a-f]{8}$")  # <jit key>-<h8>
SCRIPT_OP = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
PROGRAM_FILES = frozenset({"program.txt", "options.txt", ".lock", "module"})
SCRIPT_FILES = frozenset({"source.txt", "meta.json", "build_options.txt", "schedule.txt", "dispatch_table.txt",
                          "dispatch_table.pickle", "programs", "latency", "failed", ".lock"})


def shape_problem(relpath: str, kind: str, names: frozenset[str] | None, root: Path | None = None) -> str | None:
    """None when `relpath` has the exact shape of a tilus entry: programs/<12 hex>/ with tilus's program
    files, scripts/<op>/<jit key>-<8 hex>/ with a script's files; else why it is not one."""
    parts = relpath.split("/")
    if kind == "program":
        if len(parts) != 2 or parts[0] != "programs" or not PROGRAM_NAME.match(parts[1]):
            return "not at programs/<12 hex>/"
        known = PROGRAM_FILES
    elif kind == "script":
        if len(parts) != 3 or parts[0] != "scripts" or not SCRIPT_OP.match(parts[1]) \
                or not SCRIPT_NAME.match(parts[2]):
            return "not at scripts/<name>/<jit key>-<8 hex>/"
        known = SCRIPT_FILES
    else:
        return f"tilus has no {kind} entries"
    if names is not None and not names & known:
        return "it holds none of the files tilus writes"
    return None


def detect(root: Path) -> bool:
    """Evidence, not names alone: a CACHEDIR.TAG, or programs/<12 hex>/ or scripts/<name>/<key>-<8 hex>/
    holding tilus's files."""
    from kcache_cli import state

    tops = [d for d in ("programs", "scripts") if (root / d).is_dir() and not (root / d).is_symlink()]
    if not tops:
        return False
    if state.has_cachedir_tag(root):
        return True
    try:
        with os.scandir(root / "programs") as it:
            for i, de in enumerate(it):
                if i < 256 and PROGRAM_NAME.match(de.name) and de.is_dir(follow_symlinks=False) \
                        and set(os.listdir(de.path)) & PROGRAM_FILES:
                    return True
    except OSError:
        pass
    try:
        with os.scandir(root / "scripts") as it:
            for i, sd in enumerate(it):
                if i >= 64 or not sd.is_dir(follow_symlinks=False):
                    continue
                for de in os.scandir(sd.path):
                    if SCRIPT_NAME.match(de.name) and de.is_dir(follow_symlinks=False) \
                            and set(os.listdir(de.path)) & SCRIPT_FILES:
                        return True
    except OSError:
        pass
    return False


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
