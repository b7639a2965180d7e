"""Triton's kernel cache (triton 3.x, `triton/runtime/cache.py`): <root>/<key>/ per compiled kernel.

`<key>` is the base32 (no padding) of a sha256 (older Triton: its hex). A kernel directory holds the
compile stages `<name>.source/.ttir/.ttgir/.llir/.ptx/.cubin` (AMD: `.amdgcn/.hsaco`), the metadata
`<name>.json` and, written last, `__grp__<name>.json` whose `child_paths` maps each file name to its
ABSOLUTE path. Triton uses a kernel only when the group file parses and every child path exists, so a
cache copied to another path is a miss for every kernel until the paths are rewritten (`relocate`).
Each file is written into `tmp.pid_<pid>_<uuid>/` inside the entry and `os.replace`d: a killed process
leaves that directory, or an entry without its group file. Triton's driver keeps its compiled launcher
modules (`cuda_utils.so`...) and the autotuner its results (`<fn>.autotune.json`) in key directories
too, as single files without a group."""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from kcache_cli.checks import changed_since, elf_truncated, list_files
from kcache_cli.fsread import json_object as read_json
from kcache_cli.layouts.base import TEMP, Facts, Leftover, ModuleLayout
from kcache_cli.layouts.shapes import (
    TRITON,
    TRITON_GROUP,
    TRITON_STAGES,
    TRITON_TMP,
    triton_evidence,
    triton_kernel_name,
)
from kcache_cli.model import (
    BUILDING,
    COMPLETE,
    CORRUPT,
    PARTIAL,
    UNREADABLE,
    UNREADABLE_REASON,
    Details,
    Entry,
    Judgement,
    LogFile,
    ScanFilter,
    TreeUsage,
    measure_tree,
)

NAME = TRITON.name
KEY_RE = TRITON.kinds[0].segments[0]  # anchored: base32(sha256) since Triton 3.2, hex before
GROUP_PREFIX, TMP_PREFIX, STAGE_SUFFIXES = TRITON_GROUP, TRITON_TMP, TRITON_STAGES
BINARY_TARGETS = {".cubin": "cuda", ".hsaco": "hip"}
IR_SUFFIXES = (".source", ".ttir", ".ttgir", ".llir", ".ptx", ".amdgcn")
STALE_AFTER = 3600.0  # a temp dir or group-less entry untouched for an hour belongs to no live writer
KIND_KERNEL, KIND_BINARY = "kernel", "binary"


def is_key(name: str) -> bool:
    return KEY_RE.match(name) is not None


def is_group(name: str) -> bool:
    return name.startswith(GROUP_PREFIX) and name.endswith(".json")


# ---- reading one key directory -------------------------------------------------------------------

def arch_of(meta: dict | None) -> tuple[str | None, str | None]:
    """(target, arch) from Triton's metadata: ("cuda", "sm_90a"), ("hip", "gfx942"). Triton's CUDA
    backend compiles capability >= 90 for the arch-specific "a" variant (sm_arch_from_capability)."""
    target = (meta or {}).get("target")
    if not isinstance(target, dict):
        return None, None
    backend = target.get("backend") if isinstance(target.get("backend"), str) else None
    arch = target.get("arch")
    if isinstance(arch, int) and not isinstance(arch, bool):
        return backend, f"sm_{arch}{'a' if arch >= 90 else ''}"
    return backend, arch if isinstance(arch, str) and arch else None


def child_problem(name: str, size: int | None, head: bytes | None) -> str | None:
    """Why a listed child breaks the kernel (missing, empty, or a binary that is not the ELF it claims)."""
    if size is None:
        return f"{name} is missing (its group file lists it)"
    if size == 0:
        return f"{name} is empty"
    if head is not None and name.endswith(tuple(BINARY_TARGETS)):
        return elf_truncated(name, head, size)
    return None


def group_children(group: dict | None) -> dict[str, str] | None:
    """The group's child_paths when it is the {file name: path} map Triton writes, else None."""
    children = (group or {}).get("child_paths")
    if not isinstance(children, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in children.items()):
        return None
    return children


def plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..") and "\0" not in name


def moved_paths(entry_path: str, children: dict[str, str]) -> list[str]:
    """The child paths that do not lead to the file in this entry (the cache was copied or moved). A path
    through a symlinked root still leads here, and Triton hits it: not moved."""
    def here(name: str, path: str) -> bool:
        own = os.path.join(entry_path, name)
        try:
            return path == own or os.path.samefile(path, own)
        except (OSError, ValueError):
            return False

    return [p for n, p in sorted(children.items()) if not here(n, p)]


class _Listing:
    """One key directory read once: top-level files with sizes and mtimes, temp dirs, other subdirs."""

    def __init__(self, path: str, warn) -> None:
        self.sizes: dict[str, int] = {}
        self.mtimes: dict[str, float] = {}
        self.temps: list[tuple[str, TreeUsage]] = []
        self.links: set[str] = set()
        self.path = path
        self._json: dict[str, dict | None] = {}
        self.denied: set[str] = set()
        self.size = self.files = 0
        self.readable = True
        try:
            self.newest = os.lstat(path).st_mtime
            with os.scandir(path) as it:
                items = sorted(it, key=lambda d: d.name)
        except OSError as exc:
            warn(f"cannot read {path}: {exc.strerror}")
            self.readable, items = False, []
        for de in items:
            try:
                if de.is_dir(follow_symlinks=False):
                    usage = measure_tree(de.path, warn)
                    if de.name.startswith(TMP_PREFIX):
                        self.temps.append((de.name, usage))  # listed as entries of their own
                        continue
                    self.size, self.files = self.size + usage.size, self.files + usage.files
                    self.newest = max(self.newest, usage.mtime)
                    continue
                st = de.stat(follow_symlinks=False)
            except OSError:
                continue
            if de.is_symlink():
                self.links.add(de.name)  # Triton writes none: a link is never read through
            self.sizes[de.name], self.mtimes[de.name] = st.st_size, st.st_mtime
            self.size, self.files = self.size + st.st_size, self.files + 1
            self.newest = max(self.newest, st.st_mtime)

    @property
    def usage(self) -> TreeUsage:
        return TreeUsage(self.size, self.files, self.newest)

    def json(self, name: str) -> dict | None:
        """The JSON object in the top-level file `name`, read once; None when it is absent, a symlink
        (never read through), unreadable (noted in `denied`) or not a JSON object."""
        if name not in self._json:
            ok = name in self.sizes and name not in self.links and self.readable_file(name)
            self._json[name] = read_json(os.path.join(self.path, name)) if ok else None
        return self._json[name]

    def readable_file(self, name: str) -> bool:
        """False (and `name` in `denied`) when permissions keep kcache, and Triton, from reading it."""
        if not os.access(os.path.join(self.path, name), os.R_OK):
            self.denied.add(name)
        return name not in self.denied

    def head(self, name: str) -> bytes | None:
        """The first 64 bytes of `name` (an ELF header), or None when it cannot be read."""
        try:
            with open(os.path.join(self.path, name), "rb") as f:
                return f.read(64)
        except PermissionError:
            self.denied.add(name)
        except OSError:
            return b""
        return None


def judge_files(path: str, lst: _Listing, now: float, deep: bool = False) -> tuple[str, str | None]:
    """Triton's rule. Complete: the group file parses and every child it lists is present (by name in
    this entry), non-empty, and a binary child is a whole ELF. Group file missing or a temp dir left:
    partial, or building while something in it is less than an hour old (a Triton process may be
    writing it). With `deep`, every binary's ELF header is read; otherwise only those changed after
    the group file was written (checks.changed_since)."""
    if not lst.readable:
        return UNREADABLE, UNREADABLE_REASON
    groups = sorted(n for n in lst.sizes if is_group(n))
    fresh = now - lst.newest < STALE_AFTER
    if not groups:
        if single_file_kind(lst.sizes) is not None and not lst.temps:
            return COMPLETE, None  # the driver's launcher module or autotuner results: no group by design
        what = "empty: Triton created it and wrote nothing" if not lst.sizes and not lst.temps else \
            "no __grp__ file: Triton was killed before it finished writing the kernel"
        if fresh:
            return BUILDING, (f"{what.split(':')[0]} yet, touched {now - lst.newest:.0f}s ago: a Triton process "
                              "may still be writing it (partial once untouched for an hour)")
        return PARTIAL, what
    for g in groups:
        if g in lst.links:
            return CORRUPT, f"{g} is a symlink (Triton writes files; kcache never reads through it)"
        children = group_children(lst.json(g))
        if g in lst.denied:
            return UNREADABLE, f"{g} cannot be read (permission denied)"
        if children is None:
            return CORRUPT, f"{g} does not parse as Triton's group file"
        meta = g[len(GROUP_PREFIX):]
        if meta not in children:
            return CORRUPT, f"{g} does not list {meta}: Triton treats the kernel as a miss"
        for name in sorted(children):
            if not plain_name(name):
                return CORRUPT, f"{g} lists {name!r}, not a file name"
            size = lst.sizes.get(name)
            if name in lst.links:
                return CORRUPT, f"{name} is a symlink (Triton writes files; kcache never reads through it)"
            head = None
            if size and name.endswith(tuple(BINARY_TARGETS)) and (deep or changed_since(lst.mtimes, g, (name,))):
                head = lst.head(name)
                if name in lst.denied:
                    return UNREADABLE, f"{name} cannot be read (permission denied)"
            bad = child_problem(name, size, head)
            if bad:
                return CORRUPT, bad
        if meta not in lst.links and lst.sizes.get(meta) and lst.json(meta) is None:
            if meta in lst.denied:
                return UNREADABLE, f"{meta} cannot be read (permission denied)"
            return CORRUPT, f"{meta} does not parse (Triton fails loading the kernel)"
    if lst.temps:
        name, usage = lst.temps[0]
        if now - usage.mtime < STALE_AFTER:
            return BUILDING, f"a Triton process is writing {name} (touched less than an hour ago)"
        return PARTIAL, f"{name} left by a Triton process killed between a write and its rename"
    return COMPLETE, None


def judge(path: str, kind: str, deep: bool = False, *, root: object = None) -> Judgement:
    """The one judgement of a Triton key directory (or a temp dir inside one), read from disk now."""
    if os.path.basename(path).startswith(TMP_PREFIX):
        return Judgement.of(PARTIAL, "Triton temp directory")
    return Judgement.of(*judge_files(path, _Listing(path, lambda m: None), time.time(), deep))


def single_file_kind(sizes: dict[str, int]) -> str | None:
    """Key dirs Triton fills with one file and no group: a compiled launcher/driver module (`*.so`, a
    binary) or autotuner results (`<fn>.autotune.json`, kept with the kernels)."""
    if len(sizes) != 1:
        return None
    (name, size), = sizes.items()
    if size == 0:
        return None
    if name.endswith(".so"):
        return KIND_BINARY
    if name.endswith(".autotune.json"):
        return KIND_KERNEL
    return None


# ---- scan ----------------------------------------------------------------------------------------

def scan(ctx, flt: ScanFilter) -> Iterator[Entry]:
    jobs = []
    for de in ctx.listdir(ctx.root):
        if not is_key(de.name) or not de.is_dir(follow_symlinks=False):
            continue
        jobs.append(de.path)
    for entries in ctx.map_entries(_key_entries, [(p, flt) for p in jobs]):
        yield from entries


def _key_entries(ctx, job: tuple[str, ScanFilter]) -> list[Entry]:
    """The entry of one key directory, and one leftover entry per temp dir inside it."""
    path, flt = job
    key = os.path.basename(path)
    lst = _Listing(path, ctx.warn)
    names = list(lst.sizes)
    single = single_file_kind(lst.sizes) if not any(is_group(n) for n in names) else None
    op = triton_kernel_name(names)
    if not flt.wants_op(op):
        return []
    if flt.hash_prefixes and not any(key.startswith(p) or TMP_PREFIX.startswith(p) or p.startswith(TMP_PREFIX)
                                     for p in flt.hash_prefixes):
        return []
    meta = lst.json(f"{op}.json") if op and single is None else None
    target, arch = arch_of(meta)
    if target is None and single == KIND_BINARY:
        target = next((t for t in ("cuda", "hip") if op and op.startswith(t)), None)
    if not (flt.wants_target(target) and flt.wants_space(arch)):
        return []
    status, reason = judge_files(path, lst, time.time())
    common = {"layout": NAME, "target": target, "space": arch, "op": op}
    out = [ctx.entry(path=path, usage=lst.usage, kind=single or KIND_KERNEL, hash=key, status=status,
                     reason=reason, **common)]
    for name, usage in lst.temps:
        out.append(ctx.entry(path=os.path.join(path, name), usage=usage, kind=KIND_KERNEL, hash=name,
                             status=PARTIAL, reason="Triton temp directory (a write in flight, or left by a "
                             "killed process; stale after an hour)", **common))
    return out


def shape_problem(relpath: str, kind: str, names: frozenset[str] | None, root: Path | None = None) -> str | None:
    """None when `relpath` is exactly a Triton key directory (`<key>/`) holding files Triton writes (a
    group file, a compile stage, a temp dir, or the one launcher module / autotune result of a group-less
    key dir), or a `tmp.pid_*` write inside one; else why not. `names` is None when only the path counts."""
    parts = relpath.split("/")
    if not is_key(parts[0]):
        return "its name is not a Triton cache key (base32 or hex of a sha256)"
    if len(parts) == 2 and parts[1].startswith(TMP_PREFIX):
        return None
    if len(parts) != 1 or kind not in (KIND_KERNEL, KIND_BINARY):
        return f"not at <key>/ (a Triton {kind} entry)"
    listed = sorted(names) if names is not None else None
    if listed is not None and not (triton_evidence(listed) or triton_kernel_name(listed)):
        return "it holds none of the files Triton writes"
    return None


def is_leftover(e: Entry) -> bool:
    """A `tmp.pid_*` directory inside a key directory: prune removes it once untouched for an hour."""
    return e.layout == NAME and os.path.basename(e.path).startswith(TMP_PREFIX) and "/" in e.relpath


# ---- deep checks ---------------------------------------------------------------------------------

_META_FACTS = (("num_warps", "num_warps"), ("num_stages", "num_stages"), ("num_ctas", "num_ctas"),
               ("shared", "shared memory"), ("triton_version", "triton version"))


def describe(root: Path, entry: Entry) -> Details:
    p = entry.path
    files = list_files(p) if os.path.isdir(p) else ()
    if is_leftover(entry):
        return Details(entry, entry.status, entry.reason, (), files)
    lst = _Listing(p, lambda m: None)
    status, reason = judge_files(p, lst, time.time(), deep=True)
    problems = [reason] if status == CORRUPT and reason else []
    facts: list[tuple[str, str]] = []
    name = entry.op
    meta = lst.json(f"{name}.json") if name and entry.kind == KIND_KERNEL else None
    if meta is not None:
        target, arch = arch_of(meta)
        facts.append(("kernel", str(meta.get("name", name))))
        facts.append(("target", f"{target or '-'} {arch or '-'}"))
        facts.extend((label, str(meta[k]) + (" bytes" if k == "shared" else "")) for k, label in _META_FACTS
                     if k in meta)
    facts.extend(_group_facts(lst))
    binaries = tuple(os.path.join(p, n) for n in sorted(lst.sizes)
                     if n.endswith(tuple(BINARY_TARGETS)) and n not in lst.links)
    if problems and status == COMPLETE:
        status, reason = CORRUPT, problems[0]
    return Details(entry, status, reason, tuple(problems), files, name, (), (), None, None, binaries, tuple(facts))


def _group_facts(lst: _Listing) -> list[tuple[str, str]]:
    out = []
    for g in sorted(n for n in lst.sizes if is_group(n)):
        children = group_children(lst.json(g))
        if children is None:
            continue
        moved = moved_paths(lst.path, children)
        if moved:
            out.append(("group file", (f"{g}: {len(moved)} of {len(children)} child paths point elsewhere "
                                       f"({moved[0]}): Triton misses this kernel; `kcache verify --fix` "
                                       "rewrites them")))
        else:
            out.append(("group file", f"{g}: {len(children)} child paths, all in this entry"))
    return out


def relocation_problem(entry: Entry) -> str | None:
    """Why Triton would miss this entry where it now lies (group paths written under another root)."""
    if entry.kind != KIND_KERNEL or is_leftover(entry) or entry.status != COMPLETE:
        return None
    lst = _Listing(entry.path, lambda m: None)
    for g in sorted(n for n in lst.sizes if is_group(n)):
        children = group_children(lst.json(g))
        moved = moved_paths(entry.path, children) if children is not None else []
        if moved:
            return (f"{g} points into {os.path.dirname(moved[0])} (the cache was moved or copied): Triton "
                    "misses this kernel until `kcache verify --fix` rewrites the paths")
    return None


def _names(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def log_files(entry: Entry) -> list[LogFile]:
    return []  # Triton keeps no compile log: `no_log` says where to look instead


def no_log(entry: Entry) -> str:
    """What `kcache log` says instead of a log."""
    stages = sorted(n for n in _names(entry.path) if n.endswith(IR_SUFFIXES))
    where = ", ".join(stages) if stages else "none left"
    return f"Triton keeps no compile log; the compile stages are in {entry.path}: {where}"


# ---- relocation ----------------------------------------------------------------------------------

def relocate(src: str, dest: str) -> int:
    """Rewrite every group file in the entry directory `src` so that each child path names the file
    in `dest` (where the entry is or will be published): the rule Triton's get_group applies. Each
    file is replaced atomically, written as Triton writes (a `tmp.pid_*` directory inside the entry,
    fsync, os.replace). Child names that are not plain file names are dropped, so a group can never
    point outside its entry. Every read and write goes through one fd of `src` (fsread.held: inside a
    cache, resolved from its root without following a link), so a directory swapped for a link
    between the scan and this rewrite makes it write nothing rather than write elsewhere. Returns how
    many group files changed."""
    import stat

    from kcache_cli import fsread

    changed = 0
    with fsread.held(src):
        dfd = fsread.held_fd(src)
        if dfd is None:
            raise OSError(errno.ELOOP, "cannot open the entry's directory without following a link", src)
        for g in sorted(n for n in os.listdir(dfd) if is_group(n)):
            if not stat.S_ISREG(os.stat(g, dir_fd=dfd, follow_symlinks=False).st_mode):
                continue  # never read through a link; the entry is corrupt anyway
            group = read_json(os.path.join(src, g))  # through the held fd
            children = group_children(group)
            if group is None or children is None:
                continue
            fixed = {n: os.path.join(dest, n) for n in children if plain_name(n)}
            if fixed == children:
                continue
            _replace_file(dfd, g, json.dumps({**group, "child_paths": fixed}).encode())
            changed += 1
    return changed


def _replace_file(dfd: int, name: str, data: bytes) -> None:
    """Replace the file `name` in the directory `dfd` with `data`, atomically and durably, as Triton
    writes (a `tmp.pid_*` directory beside it), every step through descriptors (fswrite)."""
    import secrets

    from kcache_cli import fswrite

    tmp_name = f"{TMP_PREFIX}{os.getpid()}_{secrets.token_hex(16)}"
    fswrite.mkdir_at(dfd, tmp_name, 0o700)
    try:
        tfd = fswrite.open_dir(dfd, tmp_name)
        try:
            fswrite.write_file(tfd, name, data, 0o644, sync=True)
            fswrite.rename_at(tfd, name, dfd, name)
            os.fsync(dfd)
        finally:
            fswrite.unlink_at(tfd, name)
            os.close(tfd)
    finally:
        fswrite.rmdir_at(dfd, tmp_name)


# ---- the layout ----------------------------------------------------------------------------------

class TritonLayout(ModuleLayout):
    """Triton's cache: self-contained key directories; no lock (Triton writes through temp dirs and
    os.replace), absolute paths in the group files (rewritten on import)."""

    shape = TRITON
    fact_files = ()  # the facts are in the kernel's metadata, read by `facts`
    # Triton cannot rebuild a kernel from the IR in its cache, and one whose group lists a missing cubin
    # makes it fail: `export --sources-only` leaves Triton entries out whole.
    binary_kinds = frozenset({KIND_KERNEL, KIND_BINARY})

    def leftover(self, entry: Entry) -> Leftover | None:
        if not is_leftover(entry):
            return None
        return Leftover(TEMP, "Triton temp directory left by an interrupted write", None)

    def relocate(self, staged: str, final: str, root: Path) -> None:
        relocate(staged, final)

    def remote_format(self):
        """Triton's own Redis keys (`triton:{key}:{filename}`), shared with Triton's remote cache."""
        from kcache_cli.layouts.triton_remote import TritonFormat

        return TritonFormat()

    def facts(self, entry: Entry, small, names) -> Facts:
        meta = _Listing(entry.path, lambda m: None).json(f"{entry.op}.json") if entry.op else None
        version = (meta or {}).get("triton_version")
        return Facts(f"triton {version}" if isinstance(version, str) else "triton", arch_of(meta)[1], None)


LAYOUT = TritonLayout()
