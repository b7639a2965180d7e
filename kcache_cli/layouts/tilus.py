"""tilus 0.2.0: <root>/programs/<h12>/ (compiled programs) and <root>/scripts/<name>/<jit key>-<h8>/
(scripts whose programs/<i> and latency/<key>/<i> are relative symlinks to programs).

A copy made by a tool that does not keep symlinks (some archivers, some git set-ups) turns each
link into a small file holding the link's target; kcache reads those "flattened links" as links."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Iterator

from kcache_cli import fsread
from kcache_cli.checks import changed_since, elf_truncated, list_files
from kcache_cli.model import (COMPLETE, CORRUPT, FAILED, PARTIAL, Details, Entry, LogFile, ScanFilter, TensorInfo,
                              measure_tree)

NAME = "tilus"
TARGET = "cuda"  # tilus compiles for NVIDIA GPUs only
_PROGRAM_NAME = re.compile(rb"^def (\w+)\(")
_FLAT_LINK = re.compile(r"^(\.\./)+programs/[0-9a-f]+/?$")
LINK_DIRS = ("programs", "latency")


def detect(root: Path) -> bool:
    return (root / "programs").is_dir() or (root / "scripts").is_dir()


def read_link(path: str) -> str | None:
    """The target of a symlink, or of a flattened link (a tiny file holding `../../programs/<h>`)."""
    try:
        return os.readlink(path)
    except OSError:
        pass
    try:
        text = fsread.read_bytes(path, 256).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):  # also a FIFO or device where a link belongs: never read
        return None
    return text if _FLAT_LINK.match(text) else None


def script_links(script_path: str) -> list[tuple[str, str, str | None]]:
    """(name inside the script, link text, resolved program dir or None when dangling) for every
    programs/<i> and latency/<key>/<i> link of a script."""
    out = []
    for sub in LINK_DIRS:
        base = os.path.join(script_path, sub)
        try:  # iterative, fd-relative, depth-limited: a hostile tree cannot exhaust the stack
            found = list(fsread.walk_files(base))
        except OSError:
            continue  # missing, unreadable or absurdly deep: no links from it
        for rel, st, link in found:
            full = os.path.join(base, rel)
            text = link if link is not None else read_link(full) if stat.S_ISREG(st.st_mode) else None
            if text is None:
                continue
            target = os.path.normpath(os.path.join(os.path.dirname(full), text))
            ok = target if os.path.isdir(target) else None
            out.append((os.path.relpath(full, script_path), text, ok))
    return out


def _program_name(path: str) -> str | None:
    try:
        m = _PROGRAM_NAME.match(fsread.read_bytes(os.path.join(path, "program.txt"), 256, strict=False))
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
        try:
            head = fsread.read_bytes(os.path.join(module, "lib.so"), 64, strict=False, base=path)
        except OSError as exc:
            return CORRUPT, f"cannot read module/lib.so: {exc.strerror}"
        truncated = elf_truncated("lib.so", head, lib)
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
    files = list_files(p, problems.append)
    command = output = None
    binaries: tuple[str, ...] = ()
    inputs: tuple[TensorInfo, ...] = ()
    if entry.kind == "program":
        options = _exact_text(p, "options.txt", problems)
        program = _exact_text(p, "program.txt", problems)
        if options is not None and program is not None:
            actual = hashlib.sha256((options + program).encode()).hexdigest()[:12]
            if actual != entry.hash:
                problems.append(f"options.txt + program.txt hash to {actual}, not {entry.hash}: "
                                "edited after the build, tilus will never load this program")
        if options:
            m = re.search(r"arch='(\w+)'", options)
            if m:
                facts.append(("options arch", m.group(1)))
        script = fsread.read_text(os.path.join(p, "module", "compile.sh"), base=p)
        if script is not None:
            from kcache_cli.layouts.hidet import command_from_script

            command = command_from_script(script)
        output = fsread.read_text(os.path.join(p, "module", "nvcc_output.txt"), base=p)
        lib = os.path.join(p, "module", "lib.so")
        binaries = (lib,) if os.path.lexists(lib) else ()  # a FIFO or link: the ELF reader says so
        users = referrers(root, p)
        facts.append(("used by scripts", ", ".join(os.path.relpath(u, root) for u in users) or "none"))
    else:
        for name, text, target in script_links(p):
            if target is None:
                problems.append(f"dangling link {name} -> {text}")
            else:
                facts.append((f"link {name}", f"{text} ({program_status(target)[0]})"))
        meta, bad = fsread.json_problem(os.path.join(p, "meta.json"), base=p)
        if bad and not bad.endswith("missing"):
            problems.append(bad)
        elif meta is not None:
            try:
                params = meta.get("params", {})
                inputs = tuple(TensorInfo(n, str(t), ()) for n, t in zip(params.get("names", []),
                                                                           params.get("types", [])))
            except (ValueError, AttributeError, TypeError):
                problems.append("meta.json does not hold tilus's record")
        table = fsread.read_text(os.path.join(p, "dispatch_table.txt"), base=p)
        if table:
            facts.append(("dispatch table", table.strip()))
    status, reason = entry.status, entry.reason
    if problems and status == COMPLETE:
        status, reason = CORRUPT, problems[0]
    return Details(entry, status, reason, tuple(problems), files, entry.op, inputs, (), command, output,
                   binaries, tuple(facts))


def _exact_text(path: str, name: str, problems: list[str]) -> str | None:
    """A file whose every byte counts (it is hashed): whole or None, and a problem when it is there
    but cannot be read whole (a FIFO, a device, a link, over fsread.MAX_TEXT)."""
    try:
        return fsread.read_bytes(os.path.join(path, name), fsread.MAX_TEXT, base=path).decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        problems.append(f"cannot read {name}: {exc.strerror}")
        return None


def log_files(entry: Entry) -> list[LogFile]:
    if entry.kind == "program":
        dirs = [entry.path]
    else:  # a program directory that is itself a symlink is a stray, never read through
        dirs = sorted({t for _, _, t in script_links(entry.path) if t and not os.path.islink(t)})
    out = []
    for d in dirs:
        for n in ("compile.sh", "nvcc_output.txt"):
            full = os.path.join(d, "module", n)
            if os.path.lexists(full):
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
