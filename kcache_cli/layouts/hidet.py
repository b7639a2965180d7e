"""hidet's operator cache, as real hidet 0.6.1 writes it and as kcache itself builds it (the seed
layout): <root>/ops/<target>_space_<level>/<op>/<hash>/, plus graphs/ and ir_modules/."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

from kcache_cli import state
from kcache_cli.layouts.base import TEMP, InnerLeftover, Layout, Leftover, top_sizes as _top_sizes
from kcache_cli.model import Judgement
from kcache_cli.layouts.shapes import HIDET
from kcache_cli.checks import (changed_since, check_manifest, elf_truncated, list_files, read_head, read_text,
                              size_mismatch)
from kcache_cli.locking import entry_build_locked, probe_locked
from kcache_cli.model import (BUILDING, COMPLETE, CORRUPT, FAILED, PARTIAL, UNREADABLE_REASON, Details, Entry,
                              LogFile, ScanFilter, TensorInfo, measure_tree)

NAME = HIDET.name
SPACE_RE = HIDET.kinds[0].segments[1]  # <target>_space_<level>: groups 1 (target) and 2 (level)
BINARY = "lib.so"
LOGS = ("nvcc_log.txt", "nvcc_output.txt", "gcc_output.txt")  # kcache/seed, real hidet cuda, real hidet cpu
MANIFEST = "kcache.json"  # kcache's own record: per-file size and sha256, arch, compiler, command
# Files only real hidet writes; their presence means hidet's completion rules apply.
HIDET_MARKERS = ("version.txt", "compile.sh", "meta.json", "task.pickle", "func_types.pickle")
OTHER_KINDS = tuple((k.template.split("/")[0], k.kind) for k in HIDET.kinds[1:])  # (("graphs", "graph"), ...)


def _manifest_mismatch(path: str, names: dict[str, int]) -> str | None:
    """Compare sizes with kcache.json (cheap: sizes only; checksums are for inspect/verify)."""
    try:
        with open(os.path.join(path, MANIFEST), "rb") as f:
            listed = json.load(f).get("files", {})
    except (OSError, ValueError, AttributeError):
        return f"{MANIFEST} is unreadable"
    return size_mismatch(MANIFEST, listed, names)


def op_status(path: str, names: dict[str, int], head: bytes | None = None,
              mtimes: dict[str, float] | None = None) -> tuple[str, str | None]:
    """The cheap checks. With the files' `mtimes`, contents (lib.so's ELF header, kcache.json) are
    read only if something changed after the entry was completed (checks.changed_since)."""
    lib = names.get(BINARY)
    log = next((n for n in LOGS if n in names), None)
    if lib is None:
        if log:
            return FAILED, f"compile failed: {log} but no {BINARY}"
        return PARTIAL, f"no {BINARY}: the build was interrupted or is still running"
    if lib == 0:
        return PARTIAL, f"{BINARY} is empty"
    if any(m in names for m in HIDET_MARKERS) and "func_types.pickle" not in names:
        return PARTIAL, "no func_types.pickle: hidet did not finish writing the entry"
    marker = MANIFEST if MANIFEST in names else "func_types.pickle"
    if changed_since(mtimes, marker, (BINARY,)):
        if head is None:
            head = read_head(os.path.join(path, BINARY))
        truncated = elf_truncated(BINARY, head, lib)
        if truncated:
            return CORRUPT, truncated
    if MANIFEST in names and changed_since(mtimes, MANIFEST):
        bad = _manifest_mismatch(path, names)
        if bad:
            return CORRUPT, bad
    return COMPLETE, None


def _space_dirs(ctx, ops: Path, flt: ScanFilter) -> Iterator[tuple[str, str, str]]:
    if flt.spaces:
        candidates = [(s, str(ops / s)) for s in flt.spaces if (ops / s).is_dir()]
    else:
        candidates = [(d.name, d.path) for d in ctx.listdir(ops) if d.is_dir(follow_symlinks=False)]
    for name, path in candidates:
        m = SPACE_RE.match(name)
        if m and flt.wants_target(m.group(1)):
            yield name, m.group(1), path


def scan(ctx, flt: ScanFilter) -> Iterator[Entry]:
    ops = ctx.root / "ops"
    jobs = []  # listing the entry directories is cheap; reading them is the work, done in parallel
    prefixes = flt.name_prefixes()
    for space, target, space_path in _space_dirs(ctx, ops, flt):
        if flt.ops:
            op_dirs = [(o, os.path.join(space_path, o)) for o in flt.ops if os.path.isdir(os.path.join(space_path, o))]
        else:
            op_dirs = [(d.name, d.path) for d in ctx.listdir(space_path) if d.is_dir(follow_symlinks=False)]
        for op, op_path in op_dirs:
            for de in ctx.listdir(op_path):
                if not de.is_dir(follow_symlinks=False):
                    continue  # lock files and strays
                if prefixes and not any(de.name.startswith(p) or de.name.startswith(state.TEMP_PREFIX)
                                        for p in prefixes):
                    continue
                jobs.append((de.path, de.name, target, space, op))
    yield from ctx.map_entries(_op_entry, jobs)
    if flt.ops or flt.spaces or flt.targets:
        return  # graphs and ir_modules have no op, space or target
    for dirname, kind in OTHER_KINDS:
        for de in ctx.listdir(ctx.root / dirname):
            if de.is_dir(follow_symlinks=False):
                yield ctx.entry(path=de.path, usage=measure_tree(de.path, ctx.warn), layout=NAME, kind=kind,
                                target=None, space=None, op=None, hash=de.name, status=COMPLETE, reason=None)


def _op_entry(ctx, job: tuple[str, str, str, str, str]) -> Entry:
    path, name, target, space, op = job
    names, usage, mtimes = ctx.read_dir(path)
    building = state.temp_hash(name)
    if names is None:
        status, reason, key = CORRUPT, UNREADABLE_REASON, name
    elif building is not None:
        final = f"{ctx.rel(os.path.dirname(path))}/{building}"
        if entry_build_locked(ctx.root, final):
            status, reason = BUILDING, "kcache build in progress"
        else:
            status, reason = PARTIAL, "temp directory left by an interrupted kcache build"
        key = name[len(state.TEMP_PREFIX):]
    elif name.startswith("."):
        status, reason, key = PARTIAL, "hidden directory (not a hidet entry)", name
    else:
        status, reason = op_status(path, names, mtimes=mtimes)
        key = name
        if status == PARTIAL and ".lock" in names and probe_locked(os.path.join(path, ".lock")):
            status, reason = BUILDING, "hidet holds the entry's lock (compiling)"
    return ctx.entry(path=path, usage=usage, layout=NAME, kind="op", target=target, space=space, op=op,
                     hash=key, status=status, reason=reason)


# ---- deep checks ---------------------------------------------------------------------------------

def command_from_script(text: str) -> str:
    """The command lines of a compile.sh, without the shebang and blank lines."""
    return "\n".join(line for line in text.splitlines() if line.strip() and not line.startswith("#!")).strip()


def describe(root: Path, entry: Entry) -> Details:
    from kcache_cli.taskfile import TaskFormatError, parse_task, task_hash

    p = entry.path
    problems: list[str] = []
    facts: list[tuple[str, str]] = []
    files = list_files(p)
    task_op = entry.op
    inputs: tuple[TensorInfo, ...] = ()
    outputs: tuple[TensorInfo, ...] = ()
    if entry.kind != "op":
        return Details(entry, entry.status, entry.reason, (), files)

    task_path = os.path.join(p, "task.txt")
    try:
        with open(task_path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        data = None
        facts.append(("task", "no task.txt in this entry"))
    except OSError as exc:
        data = None
        problems.append(f"cannot read task.txt: {exc.strerror}")
    if data is not None:
        actual = task_hash(data)
        if not entry.relpath.rsplit("/", 1)[-1].startswith(state.TEMP_PREFIX) and actual != entry.hash:
            problems.append(f"task.txt hashes to {actual}, not {entry.hash}: its hash no longer matches "
                            "(edited after the build?), so hidet will never load this entry")
        try:
            task = parse_task(data)
            task_op = task.name
            inputs = tuple(TensorInfo(t.name, t.dtype, t.shape) for t in task.inputs)
            outputs = tuple(TensorInfo(t.name, t.dtype, t.shape) for t in task.outputs)
            if task.name != entry.op:
                problems.append(f"task.txt names op '{task.name}' but the entry sits under '{entry.op}'")
        except TaskFormatError as exc:
            problems.append(str(exc))

    meta_text = read_text(os.path.join(p, "meta.json"))
    if meta_text:
        try:
            meta = json.loads(meta_text)
            facts.append(("hidet version", str(meta.get("hidet_version"))))
            if meta.get("target"):
                facts.append(("meta target", str(meta["target"])))

            def tensors(key, given):
                got = []
                for i, t in enumerate(meta.get(key) or []):
                    name = given[i].name if i < len(given) else None
                    got.append(TensorInfo(name, str(t.get("dtype")), tuple(t.get("shape") or ())))
                return tuple(got) or given

            inputs, outputs = tensors("inputs", inputs), tensors("outputs", outputs)
        except (ValueError, AttributeError, TypeError):
            problems.append("meta.json is not valid JSON")
    version = read_text(os.path.join(p, "version.txt"))
    if version is not None:
        facts.append(("version.txt", version.strip()))

    manifest_text = read_text(os.path.join(p, MANIFEST))
    if manifest_text is not None:
        try:
            manifest = json.loads(manifest_text)
            problems.extend(check_manifest(p, MANIFEST, manifest.get("files") or {}))
            for key in ("arch", "compiler", "kcache_version"):
                if manifest.get(key):
                    facts.append((f"recorded {key}", str(manifest[key])))
        except (ValueError, AttributeError):
            problems.append(f"{MANIFEST} is not valid JSON")

    command = output = None
    log = read_text(os.path.join(p, "nvcc_log.txt"))
    script = read_text(os.path.join(p, "compile.sh"))
    if script is not None:
        command = command_from_script(script)
    elif log:
        command = log.splitlines()[0].strip() if log.strip() else None
    for name in ("nvcc_output.txt", "gcc_output.txt"):
        output = output or read_text(os.path.join(p, name))
    if output is None and log:
        output = "\n".join(log.splitlines()[1:])
    if os.path.isdir(os.path.join(p, "candidates")):
        facts.append(("candidates/", "auto-tuning leftovers (prune removes them)"))

    binaries = tuple(os.path.join(p, BINARY) for _ in [0] if os.path.isfile(os.path.join(p, BINARY)))
    status, reason = entry.status, entry.reason
    if problems and status == COMPLETE:
        status, reason = CORRUPT, problems[0]
    return Details(entry, status, reason, tuple(problems), files, task_op, inputs, outputs, command, output,
                   binaries, tuple(facts))


def log_files(entry: Entry) -> list[LogFile]:
    p = entry.path
    if os.path.isfile(os.path.join(p, "nvcc_log.txt")):
        return [LogFile("nvcc_log.txt", os.path.join(p, "nvcc_log.txt"))]
    return [LogFile(n, os.path.join(p, n)) for n in ("compile.sh", "nvcc_output.txt", "gcc_output.txt")
            if os.path.isfile(os.path.join(p, n))]


# ---- for prune/clear -----------------------------------------------------------------------------

def stray_links(ctx, flt: ScanFilter) -> Iterator[Entry]:
    """Symlinks where ops/, a space, an op or an entry belongs: the scan never follows them (it skips
    them); prune --broken and clear remove them as links, leaving their targets alone."""
    def link(path: str, kind: str, target, space, op, h: str) -> Entry:
        return ctx.link_entry(path, layout=NAME, kind=kind, target=target, space=space, op=op, hash=h)

    plain = not (flt.ops or flt.spaces or flt.targets)
    for top, kind in (("ops", "op"), *OTHER_KINDS):
        path = ctx.root / top
        if path.is_symlink():
            if plain:
                yield link(str(path), kind, None, None, None, "")
        elif kind != "op" and plain:
            for de in ctx.listdir(path):
                if de.is_symlink():
                    yield link(de.path, kind, None, None, None, de.name)
    ops = ctx.root / "ops"
    if ops.is_symlink():
        return
    for sd in ctx.listdir(ops):
        m = SPACE_RE.match(sd.name)
        target = m.group(1) if m else None
        if not (flt.wants_space(sd.name) and flt.wants_target(target)):
            continue
        if sd.is_symlink():
            if not flt.ops:
                yield link(sd.path, "op", target, sd.name, None, "")
            continue
        if not sd.is_dir(follow_symlinks=False):
            continue
        for od in ctx.listdir(sd.path):
            if not flt.wants_op(od.name):
                continue
            if od.is_symlink():
                yield link(od.path, "op", target, sd.name, od.name, "")
            elif od.is_dir(follow_symlinks=False):
                for de in ctx.listdir(od.path):
                    if de.is_symlink():
                        yield link(de.path, "op", target, sd.name, od.name, de.name)


# ---- the layout ----------------------------------------------------------------------------------

_TEMP_MARK = "/" + state.TEMP_PREFIX


class HidetLayout(Layout):
    """hidet's operator cache; also where `kcache build` publishes (kcache's temp dirs are its leftovers)."""

    shape = HIDET
    writer_locks = (".lock", "dispatch_table.txt.lock")
    fact_files = (MANIFEST, "compile.sh", "nvcc_log.txt")

    def scan(self, ctx, flt: ScanFilter) -> Iterator[Entry]:
        return scan(ctx, flt)

    def stray_links(self, ctx, flt: ScanFilter) -> Iterator[Entry]:
        return stray_links(ctx, flt)

    def judge(self, path: str, kind: str, deep: bool = False, *, root=None) -> Judgement:
        if kind != "op":
            return Judgement(COMPLETE)
        names = _top_sizes(path)
        if names is None:
            return Judgement.of(CORRUPT, UNREADABLE_REASON)
        return Judgement.of(*op_status(path, names))

    def describe(self, root: Path, entry: Entry) -> Details:
        return describe(root, entry)

    def log_files(self, entry: Entry) -> list[LogFile]:
        return log_files(entry)

    def leftover(self, entry: Entry) -> Leftover | None:
        name = os.path.basename(entry.path)
        if _TEMP_MARK not in entry.relpath or not name.startswith(state.TEMP_PREFIX):
            return None
        return Leftover(TEMP, "temp directory of an interrupted kcache build",
                        f"{os.path.dirname(entry.relpath)}/{state.temp_hash(name)}")

    def inner_leftovers(self, entry: Entry) -> list[InnerLeftover]:
        if entry.kind != "op":
            return []
        return [InnerLeftover("candidates", "auto-tuning leftovers (candidates/)",
                              "candidates/ kept: hidet holds the entry's lock (tuning)")]

    def empty_parent_levels(self, kind: str) -> int:
        return 2 if kind == "op" else 0  # the op and space directories; ops/ itself tells the layout

    def compile_command(self, small) -> str | None:
        if small.get("compile.sh") is not None:
            return command_from_script(small["compile.sh"].decode("utf-8", "replace"))
        if small.get("nvcc_log.txt"):
            return (small["nvcc_log.txt"].decode("utf-8", "replace").splitlines() or [""])[0]
        return None

    def default_root(self):
        from kcache_cli.locate import hidet_cache_dir

        loc = hidet_cache_dir()
        return loc.path, loc.reason


LAYOUT = HidetLayout()
