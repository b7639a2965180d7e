"""Triton's kernel cache (triton 3.x, `triton/runtime/cache.py`): <root>/<key>/ per compiled kernel.

`<key>` is the base32 (no padding) of a sha256 (older Triton: its hex). A kernel directory holds the
compile stages `<name>.source/.ttir/.ttgir/.llir/.ptx/.cubin` (AMD: `.amdgcn/.hsaco`), the metadata
`<name>.json` and, written last, `__grp__<name>.json` whose `child_paths` maps each file name to its
ABSOLUTE path. Triton uses a kernel only when the group file parses and every child path exists, so a
cache copied to another path is a miss for every kernel until the paths are rewritten (`relocate`).
Each file is written into `tmp.pid_<pid>_<uuid>/` inside the entry and `os.replace`d: a killed process
leaves that directory, or an entry without its group file. Triton's driver keeps its compiled launcher
modules (`cuda_utils.so`...) and the autotuner its results (`<fn>.autotune.json`) in key directories
too, as single files without a group; results the autotuner cannot read (not JSON, no configs_timings)
make it raise at every call, never written again: corrupt."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from stat import S_ISLNK, S_ISREG
from typing import TYPE_CHECKING

from kcache_cli.formats.gpu import runs_on_node
from kcache_cli.fs import read as fsread
from kcache_cli.fs import readmarks
from kcache_cli.fs import write as fswrite
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.layouts._common import leads_here
from kcache_cli.layouts.base import (
    HIT,
    MISS,
    TEMP,
    UNKNOWN,
    Facts,
    Here,
    InnerLeftover,
    Judging,
    Layout,
    ScanContext,
    Verdict,
    not_installed,
    unasked,
)
from kcache_cli.layouts.shapes import (
    TRITON,
    TRITON_GROUP,
    TRITON_TMP,
    triton_evidence,
    triton_kernel_name,
)
from kcache_cli.layouts.shapes import (
    triton_target_arch as arch_of,
)
from kcache_cli.model.checks import elf_truncated, first_not_regular, list_files, not_regular
from kcache_cli.model.records import (
    BUILDING,
    COMPLETE,
    CORRUPT,
    MOVED,
    PARTIAL,
    UNREADABLE,
    UNREADABLE_REASON,
    Details,
    Entry,
    Judgement,
    LogFile,
    ScanFilter,
    Status,
    TreeUsage,
    measure_tree,
    usage_of,
)
from kcache_cli.util.lazy import lazy_module

if TYPE_CHECKING:  # the real imports, for mypy; at run time each loads at its first use (push, pull and
    # OCI only: 1.5 ms that every listing of a Triton cache paid)
    from kcache_cli.layouts import triton_image, triton_remote
    from kcache_cli.layouts.image_format import ImageFormat
    from kcache_cli.layouts.remote_format import RemoteFormat
else:
    triton_image = lazy_module("kcache_cli.layouts.triton_image")
    triton_remote = lazy_module("kcache_cli.layouts.triton_remote")

NAME = TRITON.name
KEY_RE = TRITON.kinds[0].segment(0)  # anchored: base32(sha256) since Triton 3.2, hex before
GROUP_PREFIX, TMP_PREFIX = TRITON_GROUP, TRITON_TMP
BINARY_TARGETS = {".cubin": "cuda", ".hsaco": "hip"}
BINARY_EXT = {"cuda": ".cubin", "hip": ".hsaco"}  # the backend's binary_ext: the file CompiledKernel needs
IR_SUFFIXES = (".source", ".ttir", ".ttgir", ".llir", ".ptx", ".amdgcn")
STALE_AFTER = 3600.0  # a temp dir or group-less entry untouched for an hour belongs to no live writer
KIND_KERNEL, KIND_BINARY = "kernel", "binary"
BASE32_KEY = re.compile(r"[A-Z2-7]{52}\Z")  # Triton >= 3.3's keys


def is_key(name: str) -> bool:
    return KEY_RE.match(name) is not None


def is_group(name: str) -> bool:
    return name.startswith(GROUP_PREFIX) and name.endswith(".json")


# ---- reading one key directory -------------------------------------------------------------------

def group_children(group: object) -> dict[str, str] | None:
    """The group's child_paths when it is the {file name: path} map Triton writes, else None."""
    children = group.get("child_paths") if isinstance(group, dict) else None
    if not isinstance(children, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in children.items()):
        return None
    return children


def plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..") and "\0" not in name



class Where:
    """Where a group's child paths lead: `here` (to this entry's own file, held as `d`; a path through a
    symlinked root too: Triton hits it), into `root` (each the same-named file of this key under one other
    root: the cache was moved or copied), or `astray` (anywhere else: other names, other keys, several
    roots). Names in the group's order."""

    def __init__(self, d: EntryDir, children: dict[str, str]) -> None:
        key = os.path.basename(d.path)
        self.children = children
        self.here = [n for n, p in children.items() if leads_here(d, n, p)]
        self.elsewhere = [n for n in children if n not in self.here]
        self.copies: dict[str, list[str]] = {}  # root -> the names whose path leads into a copy there
        self.other: list[str] = []  # the names whose path leads to no copy of this entry
        for n in self.elsewhere:
            root = _copy_root(n, children[n], key)
            (self.other if root is None else self.copies.setdefault(root, [])).append(n)
        # the one root every path that leads elsewhere leads into, else None (none does, or not so)
        self.root = next(iter(self.copies)) if len(self.copies) == 1 and not self.other else None
        self.astray = [] if self.root is not None else self.elsewhere

    def shown(self, names: list[str]) -> str:
        """The first of `names` with its path, and how many more."""
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        return f"{names[0]} -> {self.children[names[0]]}{more}"


def _copy_root(name: str, path: str, key: str) -> str | None:
    """The root `path` lies under when it names the file `name` of the key directory `key` there, as
    Triton writes the path in a cache at another root (relative, as it writes them under a relative
    TRITON_CACHE_DIR: found only from where it ran; `verify --fix` and import make them absolute); else
    None."""
    if not plain_name(name) or path != os.path.normpath(path):
        return None
    head, base = os.path.split(path)
    return (os.path.dirname(head) or ".") if base == name and os.path.basename(head) == key else None


def _by_name(de: os.DirEntry) -> str:
    return de.name


class _Listing:
    """One key directory read once: top-level files with sizes and mtimes, and its subdirectories (a
    `tmp.pid_*` one is part of the kernel: Triton never looks into it)."""

    def __init__(self, d: EntryDir, warn, record: bool = False) -> None:
        self.sizes: dict[str, int] = {}
        self.mtimes: dict[str, float] = {}
        self.temps: list[tuple[str, TreeUsage]] = []
        self.links: set[str] = set()
        self.denied: set[str] = set()  # regular files nobody may read (mode bits): unreadable even to root
        self.d, self.path = d, d.path  # every file of the entry is read through `d`
        self._json: dict[str, object] = {}
        self._groups: list[str] | None = None
        self.size = self.files = self.apparent = 0
        self.accessed = self.newest = 0.0  # the files' newest atime (a hit reads them)
        self.ident = (0, 0)  # the entry directory's own (device, inode)
        self.readable = True
        # With `record`: (the directory's stat, [(name, lstat)] of its files), taken before anything is
        # read, for the index's key (kcache_cli/catalog/index.py); None when it holds a subdirectory.
        self.seen: tuple | None = None
        self.outside = False  # the judgement looked at a path outside the entry (the index stores none)
        self.special = False  # a FIFO, device or socket is listed (_not_regular looks closer)
        self.subdirs = 0  # directories listed in it (-1: it could not be listed)
        stats: list | None = [] if record else None
        try:
            st = d.own_lstat()
            self.newest, self.size = st.st_mtime, st.st_blocks * 512
            self.ident = (st.st_dev, st.st_ino)
            if not st.st_mode & 0o444:
                raise PermissionError(errno.EACCES, "Permission denied (mode 000)", d.path)
            if d.fd is None:
                raise d.error or FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), d.path)
            with os.scandir(d.fd) as it:
                items = sorted(it, key=_by_name)
            if stats is not None:
                self.seen = (st, stats)
        except OSError as exc:
            warn(f"cannot read {d.path}: {exc.strerror}")
            self.readable, items, self.subdirs = False, [], -1
        self._add(items, warn, stats)

    def _add(self, items: list[os.DirEntry], warn, stats: list | None) -> None:
        """Count the listed `items` in (one lstat each, kept in the EntryDir's listing for the reads)."""
        d, sizes, mtimes, listing = self.d, self.sizes, self.mtimes, self.d.listing
        size, files, apparent, newest, accessed = self.size, self.files, self.apparent, self.newest, self.accessed
        for de in items:
            try:
                if de.is_dir(follow_symlinks=False):
                    self.seen = None  # a temp dir's files are not in the key: such an entry is not indexed
                    self.subdirs += 1
                    usage = measure_tree(d.join(de.name), warn)
                    if de.name.startswith(TMP_PREFIX):
                        self.temps.append((de.name, usage))
                    size, files, apparent = size + usage.size, files + usage.files, apparent + usage.apparent
                    newest, accessed = max(newest, usage.mtime), max(accessed, usage.atime)
                    continue
                st = de.stat(follow_symlinks=False)
            except OSError:
                continue
            name = de.name
            if stats is not None:
                stats.append((name, st))
            listing[name] = st
            if S_ISLNK(st.st_mode):
                self.links.add(name)  # Triton opens through it: so does the judgement (fsread, follow)
            else:
                if not S_ISREG(st.st_mode):
                    self.special = True
                if not st.st_mode & 0o444:
                    self.denied.add(name)
                if st.st_atime > accessed:  # a link's atime is kcache's own readlink
                    accessed = max(accessed, readmarks.atime(st))  # not kcache's own reads (as read_dir)
            sizes[name], mtime = st.st_size, st.st_mtime
            mtimes[name] = mtime
            size, files = size + st.st_blocks * 512 // (st.st_nlink or 1), files + 1  # file_bytes, inline
            apparent += st.st_size
            if mtime > newest:
                newest = mtime
        self.size, self.files, self.apparent, self.newest, self.accessed = size, files, apparent, newest, accessed

    @property
    def usage(self) -> TreeUsage:
        return TreeUsage(self.size, self.files, self.newest, self.accessed, self.apparent, *self.ident)

    @property
    def groups(self) -> list[str]:
        """The group files listed, sorted (as the listing is), made once."""
        if self._groups is None:
            self._groups = [n for n in self.sizes if is_group(n)]
        return self._groups

    def own(self, path: str) -> str | None:
        """The name below this entry of the child path `path` when it names one of its files, else None."""
        prefix = self.path + "/"
        return path[len(prefix):] if path.startswith(prefix) and len(path) > len(prefix) else None

    def read(self, path: str, limit: int) -> bytes:
        """The bytes of a file Triton reads (through a link, as Triton does; never a FIFO or device): one
        of the entry's through its EntryDir, a child path leading elsewhere where the group says. A
        file nobody may read is PermissionError whoever runs kcache (root reads it anyway)."""
        name = self.own(path)
        if name is None:
            self.outside = True
            target = os.stat(path)
            if not target.st_mode & 0o444:
                raise PermissionError(errno.EACCES, "Permission denied", path)
            if fsread.EUID == 0:  # the group file that leads there is its maker's word: read what they may
                for group in self.groups:  # (each lstat as the listing took it)
                    fsread.linked_for(self.d.listing[group], target, path)
            return fsread.read_bytes(path, limit, follow=True)
        if name in self.denied:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        if name in self.sizes and name not in self.links:  # as listed: no link to follow, its lstat known
            return self.d.read_bytes(name, limit)
        if not self.d.stat(name).st_mode & 0o444:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return self.d.read_bytes(name, limit, follow=True)

    def json(self, name: str, path: str | None = None) -> object:
        """The JSON value in `name` (at `path` when the group records it elsewhere), read once; an
        OSError instance when it cannot be read, ValueError when it is not JSON."""
        key = path if path is not None and path != self.d.join(name) else name  # the metadata is read once
        if key not in self._json:
            try:
                self._json[key] = fsread.parse_json(self.read(path or self.d.join(name), MAX_META), name)
            except (OSError, ValueError) as exc:
                self._json[key] = exc
        return self._json[key]

    def meta(self, name: str) -> dict | None:
        """The metadata object `<name>.json` of this entry, or None (for listings: op, arch)."""
        value = self.json(name) if name in self.sizes else None
        return value if isinstance(value, dict) else None


MAX_META = 1 << 20  # a group or metadata file is a few kB
MAX_IR = 64 << 20


def _exists(lst: _Listing, name: str, path: str) -> bool:
    """os.path.exists(path), as Triton asks it; for a path into this entry, from the listing (through
    its EntryDir for a link)."""
    if path == lst.d.join(name) and name not in lst.links:
        return name in lst.sizes
    own = lst.own(path)
    if own is None:
        lst.outside = True
        return os.path.exists(path)
    try:
        lst.d.stat(own)
    except (OSError, ValueError):
        return False
    return True


def _unreadable(exc: object) -> bool:
    return isinstance(exc, PermissionError)


def old_triton(key_dir: str) -> bool:
    """A key Triton <= 3.2 named (64 hex up to 3.1, 43 base64url in 3.2; base32 since 3.3): its get_group
    lets a group that does not parse raise, and drops the children whose path is missing instead of
    missing the kernel."""
    return BASE32_KEY.match(os.path.basename(key_dir)) is None


def _link_target(lst: _Listing, g: str) -> str | None:
    """Where the group file `g` leads when it is a symlink (Triton opens it through the link, and so
    does the judgement; `verify --fix` never writes through one), else None."""
    if g not in lst.links:
        return None
    try:
        return lst.d.readlink(g)
    except (OSError, ValueError):
        return "?"


def _not_regular(lst: _Listing, path: str) -> str | None:
    """checks.not_regular's reason when what Triton opens at `path` (a group file or a child path), links
    followed as Triton follows them, is a FIFO, device or socket: a FIFO blocks Triton's open, a device
    feeds it what it yields, and kcache opens neither, so it cannot judge the kernel (unreadable, never
    removed). This entry's own file by its listing (a link stat'ed through the EntryDir); a path
    elsewhere by that path."""
    own = lst.own(path)
    if own is not None:
        return _own_not_regular(lst, own)
    lst.outside = True
    try:
        st = os.lstat(path)
        linked = S_ISLNK(st.st_mode)
        return not_regular(path, os.stat(path).st_mode if linked else st.st_mode, "Triton", linked=linked)
    except (OSError, ValueError):
        return None


def _own_not_regular(lst: _Listing, name: str) -> str | None:
    """_not_regular of the entry's own file `name`: asked only where the listing holds a link or a FIFO,
    device or socket (else it is a listed regular file, or missing: the common case, 8% of a kernel)."""
    if not lst.special and name not in lst.links:
        return None
    return first_not_regular(lst.d, (name,), "Triton", follow=True)


def _unopened(g: str, exc: fsread.NotRegularFile) -> tuple[Status, str | None, None]:
    """A group file that leads (through a link) to no regular file: Triton's open of a directory fails (a
    miss). A FIFO, device or socket is found before the read (_not_regular); one swapped in since is not
    judged either."""
    if exc.kind == "a directory":
        return PARTIAL, f"{g} leads to a directory: Triton cannot read it, misses the kernel and compiles it " \
                        "again", None
    return UNREADABLE, f"{g} leads to {exc.kind}: Triton opens it, kcache never does", None


def _group_rule(lst: _Listing, g: str) -> tuple[Status, str | None, dict[str, str] | None]:
    """get_group's outcome for the group file `g`: (status, reason, child paths to go on with). A group
    file that is a symlink is read through it (Triton opens it so); the reason says where it leads."""
    old = old_triton(lst.path)
    target = _link_target(lst, g)
    if target is not None and not _exists(lst, g, lst.d.join(g)):
        return PARTIAL, (f"{g} is a symlink to {target}, which leads to no file: Triton misses the kernel and "
                         "compiles it again"), None
    odd = _own_not_regular(lst, g)
    if odd:
        return UNREADABLE, odd, None
    name = g if target is None else f"{g} (a symlink to {target}, which Triton follows)"
    group = lst.json(g)
    if isinstance(group, fsread.NotRegularFile):
        return _unopened(name, group)
    if _unreadable(group):
        return UNREADABLE, f"{name} cannot be read (permission denied)", None
    if isinstance(group, Exception) and old:
        return CORRUPT, f"{name} does not parse: Triton <= 3.2 fails on every lookup", None
    if isinstance(group, Exception):
        return PARTIAL, f"{name} does not parse: Triton misses the kernel and compiles it again", None
    if not isinstance(group, dict):
        return CORRUPT, f"{name} is not a JSON object: Triton fails reading it on every lookup", None
    if group.get("child_paths") is None:
        return PARTIAL, f"{name} has no child_paths: Triton misses the kernel and compiles it again", None
    children = group_children(group)
    if children is None:
        return CORRUPT, f"the child_paths of {name} is not a map of file names to paths: Triton fails on every " \
                        "lookup", None
    return _children_rule(lst, g, name, children, old)


def _children_rule(lst: _Listing, g: str, name: str, children: dict[str, str], old: bool
                   ) -> tuple[Status, str | None, dict[str, str] | None]:
    """get_group's outcome for the child paths of the group file `g` (`name`: how a reason names it; `old`:
    the key is an old Triton's, <= 3.2)."""
    meta = g[len(GROUP_PREFIX):]
    join = lst.d.join
    missing = []
    for n, p in children.items():
        if p != join(n):
            lst.outside = True  # the verdict may depend on files elsewhere: never served from the index
        if not _exists(lst, n, p):
            missing.append(n)
    if old and meta not in missing:  # Triton <= 3.2 goes on with the children it finds
        children = {n: p for n, p in children.items() if n not in missing}
        missing = []
    if missing:
        return _missing_rule(lst, g, name, children, missing)
    if meta not in children:
        return PARTIAL, f"{name} does not list {meta}: Triton misses the kernel and compiles it again", None
    return COMPLETE, None, children


def _missing_rule(lst: _Listing, g: str, name: str, children: dict[str, str], missing: list[str]
                  ) -> tuple[Status, str | None, None]:
    """A group listing a path that does not exist: Triton misses the kernel and compiles it again. Moved
    when every path that leads elsewhere names this key's same-named file under one other root and the
    files are here (`verify --fix` rewrites the paths; never through a link)."""
    where = Where(lst.d, children)
    lost = [n for n in missing if not (plain_name(n) and _exists(lst, n, lst.d.join(n)))]
    again = "Triton misses the kernel and compiles it again"
    if where.root is not None and not lost and g in lst.links:
        return PARTIAL, (f"{name} points into {where.root} (moved or copied), and `kcache verify --fix` never "
                         f"rewrites a file through a symlink: {again}, replacing the link"), None
    if where.root is not None and not lost:
        return MOVED, (f"{g} points into {where.root} (moved or copied): Triton misses it until "
                       "`kcache verify --fix` rewrites the paths"), None
    if where.astray:
        found = [n for n in where.astray if n not in missing]
        also = f" and {len(found)} to files outside this entry ({where.shown(found)})" if found else ""
        lead = "leads" if len(missing) == 1 else "lead"
        return PARTIAL, (f"{name} does not point into one moved copy of this entry: {len(missing)} of its "
                         f"{len(children)} child paths {lead} to no file ({where.shown(missing)}){also}: {again}"), None
    lost = lost or missing  # named: the files missing here too (in a moved entry, what --fix cannot mend)
    what = f"{lost[0]} and {len(lost) - 1} more are" if len(lost) > 1 else f"{lost[0]} is"
    also = f", and points into {where.root}: moved or copied" if where.root else ""
    return PARTIAL, f"{what} missing ({name} lists {'them' if len(lost) > 1 else 'it'}{also}): Triton compiles " \
                    "the kernel again", None


def _loaded(lst: _Listing, g: str, children: dict[str, str], changed) -> tuple[Status, str | None]:
    """CompiledKernel's reads of a hit: the first .json child as metadata (a JSON object with a target),
    the binary (the child whose path ends in .cubin/.hsaco) a whole ELF, every child whose path ends
    otherwise text. `changed(name)`: whether to read it."""
    meta_name = next(n for n in children if n.endswith(".json"))
    # every child one of this entry's files, none a link nor a FIFO, device or socket (_children_rule set
    # `outside` for any other path): no file Triton opens needs a closer look (the common case, 5% of it)
    plain = not (lst.special or lst.links or lst.outside)
    odd = None if plain else _not_regular(lst, children[meta_name])  # Triton reads the metadata first
    if odd:
        return UNREADABLE, odd
    meta = lst.json(meta_name, children[meta_name])
    if _unreadable(meta):
        return UNREADABLE, f"{meta_name} cannot be read (permission denied)"
    backend = _metadata_backend(meta)
    if backend is None:
        return CORRUPT, f"{meta_name} is not Triton's metadata: Triton fails loading the kernel on every lookup"
    odd = None if plain else next((why for p in children.values() if (why := _not_regular(lst, p))), None)
    if odd:  # then every child, before it finds the binary among them
        return UNREADABLE, odd
    ext = BINARY_EXT.get(backend, ".cubin")
    binary, why = _binary_child(g, children, ext)
    if binary is None:
        return CORRUPT, why
    for name, path in sorted(children.items()):
        if name in lst.denied and path == lst.d.join(name):
            return UNREADABLE, f"{name} cannot be read (no read permission)"
        if name.endswith(".json") or not changed(name):
            continue
        as_bytes = path.endswith(ext) and _suffix_is(path, ext)  # CompiledKernel: read_bytes, else read_text
        try:
            data = lst.read(path, 64 << 20 if as_bytes else MAX_IR)
        except PermissionError:
            return UNREADABLE, f"{name} cannot be read (permission denied)"
        except fsread.NotRegularFile as exc:
            if exc.kind != "a directory":  # a FIFO, device... swapped in since the listing: as _unopened
                return UNREADABLE, f"{name} is {exc.kind}: Triton opens it, kcache never does"
            return CORRUPT, f"{name} is a directory: Triton fails loading the kernel"
        except OSError as exc:
            return CORRUPT, f"{name} cannot be read ({exc.strerror or exc}): Triton fails loading the kernel"
        bad = _bad_binary(name, data) if name == binary else None if as_bytes else _bad_text(name, data)
        if bad:
            return CORRUPT, bad
    return COMPLETE, None


def _metadata_backend(meta: object) -> str | None:
    """The backend of Triton's metadata `meta` (a JSON object whose target is a map naming its backend and
    warp size), else None: CompiledKernel fails loading the kernel."""
    backend, _ = arch_of(meta if isinstance(meta, dict) else None)
    target = meta.get("target") if isinstance(meta, dict) else None
    return backend if backend is not None and isinstance(target, dict) and "warp_size" in target else None


def _suffix_is(path: str, ext: str) -> bool:
    """Whether `path`'s suffix is `ext`, as pathlib's (which Triton asks) reads it: cheaply, per child
    of every kernel (a PurePosixPath costs ~2 us; callers ask path.endswith(ext) first, in C)."""
    name = path.rpartition("/")[2]
    if name in ("", "."):  # a trailing "/" or "/.": as pathlib reads it
        name = PurePosixPath(path).name
    i = name.rfind(".")
    return 0 < i < len(name) - 1 and name[i:] == ext


def _binary_child(g: str, children: dict[str, str], ext: str) -> tuple[str | None, str]:
    """The child CompiledKernel loads as the kernel: it keys each non-JSON child by its PATH's suffix
    (the last path ending in the backend's binary_ext wins), and fails when none ends so. (name, ""), or
    (None, why Triton fails)."""
    found = [n for n, p in children.items() if p.endswith(ext) and not n.endswith(".json") and _suffix_is(p, ext)]
    if found:
        return found[-1], ""
    binary = f"{g[len(GROUP_PREFIX):-len('.json')]}{ext}"
    if binary in children:
        return None, (f"{g} lists {binary} at {children[binary]}, whose name does not end in {ext}: Triton reads "
                      "it as text, finds no binary, and fails loading the kernel on every lookup")
    return None, f"{binary} is missing or not listed in {g}: Triton fails loading the kernel on every lookup"


def _bad_binary(name: str, data: bytes) -> str | None:
    if not data:
        return f"{name} is empty: the kernel Triton loads from it is broken"
    why = elf_truncated(name, data[:64], len(data))
    return f"{why}: the kernel Triton loads from it is broken" if why else None


def _bad_text(name: str, data: bytes) -> str | None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return f"{name} is not text: Triton fails reading it on every lookup"
    return None


def judge_files(lst: _Listing, jc: Judging) -> tuple[Status, str | None]:
    """Triton's rule (runtime/cache.py get_group, compiler.py compile and CompiledKernel), the same in
    3.1, 3.2 and 3.9. No group file: partial (Triton compiles it again), or building while something
    in it is less than an hour old. Then get_group: a group that does not parse, or that lists a path
    that does not exist, or that does not list the metadata, is a miss (partial; moved when the files
    are here and the paths lead into another root); then the hit's reads: the metadata, the binary and
    every text stage must load, else Triton fails on every lookup and never compiles again (corrupt).
    Temp dirs are ignored (Triton never looks into them). With `deep`, every listed file is read;
    otherwise only those changed after the group file was written (checks.changed_since). Ages are
    counted from `jc.now`."""
    deep = jc.deep
    if not lst.readable:
        return UNREADABLE, UNREADABLE_REASON
    groups = lst.groups
    if not groups:
        return _groupless(lst, jc.now)
    for g in groups:
        status, reason, children = _group_rule(lst, g)
        if children is None:
            return status, reason
        status, reason = _loaded(lst, g, children, _changed_after(lst, g, children, deep))
        if status != COMPLETE:
            return status, reason
    return COMPLETE, None


def _changed_after(lst: _Listing, g: str, children: dict[str, str], deep: bool) -> Callable[[str], bool]:
    """Whether to read a child: every one when `deep`, else (checks.changed_since for one name) those
    not listed, links, files modified at or after the group file `g` was written, and those the group
    sends astray (outside this entry, to no copy of it: their mtimes are not this entry's)."""
    mtimes, links = lst.mtimes, lst.links
    limit = mtimes.get(g)
    if deep or limit is None:
        return lambda n: True
    astray = set(Where(lst.d, children).astray) if lst.outside else set()  # (_children_rule: a path elsewhere)
    return lambda n: n in links or n in astray or (n != g and mtimes.get(n, limit) >= limit)


def _groupless(lst: _Listing, now: float) -> tuple[Status, str | None]:
    tuned = _autotune_problem(lst)
    if tuned is not None:
        return CORRUPT, tuned
    if single_file_kind(lst.sizes) is not None and not lst.temps:
        return COMPLETE, None  # the driver's launcher module or autotuner results: no group by design
    what = "empty: Triton created it and wrote nothing" if not lst.sizes and not lst.temps else \
        "no __grp__ file: Triton was killed before it finished writing the kernel"
    if now - lst.newest < STALE_AFTER:
        return BUILDING, (f"{what.split(':')[0]} yet, touched {now - lst.newest:.0f}s ago: a Triton process "
                          "may still be writing it (partial once untouched for an hour)")
    return PARTIAL, what


def _autotune_problem(lst: _Listing) -> str | None:
    """Why the autotuner (3.3+, `check_disk_cache`) fails on the key directory's one file `<fn>.autotune.json`,
    or None: it reads any such file there, json.load, then ["configs_timings"] as [config, timing] pairs
    made Configs, and the lookup raises on every call, never writing the file again. Not read: not judged."""
    names = list(lst.sizes)
    if len(names) != 1 or not names[0].endswith(".autotune.json"):
        return None
    value = lst.json(names[0])
    if isinstance(value, OSError):
        return None
    if isinstance(value, ValueError):
        return f"{names[0]} is not JSON ({value}): Triton's autotuner fails on it at every call"
    if not _timings_read(value.get("configs_timings") if isinstance(value, dict) else None):
        return f"{names[0]} holds no configs_timings Triton reads: its autotuner fails on it at every call"
    return None


def _timings_read(timings: object) -> bool:
    """Whether check_disk_cache takes `timings`: [config, timing] pairs, each config made a Config (its kwargs
    a map) that keys a dict (hashed: every value but the kwargs map hashable, and so each of its values), the
    best one the min of the timings (comparable). Triton 3.9 raises TypeError at every call otherwise."""
    if not timings or not isinstance(timings, list) or not all(_pair_read(t) for t in timings):
        return False
    try:
        min(t[1] for t in timings)
    except TypeError:
        return False
    return True


def _pair_read(pair: object) -> bool:
    """Whether one [config, timing] pair makes a Config that keys a dict: its kwargs a map, and no value of
    the config or of its kwargs a list or a map (unhashable)."""
    if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], dict)
            and isinstance(pair[0].get("kwargs"), dict)):
        return False
    config = pair[0]
    values = [*config["kwargs"].values(), *(v for k, v in config.items() if k != "kwargs")]
    return not any(isinstance(v, (list, dict)) for v in values)


def judge(d: EntryDir, kind: str, jc: Judging) -> Judgement:
    """The one judgement of a Triton key directory held open as `d`, read from disk now through it, its
    age counted from `jc.now`."""
    return Judgement.of(*judge_files(_Listing(d, lambda m: None), jc))


def nested_entry(ctx: ScanContext, d: EntryDir, path: str) -> Entry | None:
    """Layout.nested_entry: the key directory's entry as the scan makes it (one listing: its judgement,
    op, target, sizes and index key)."""
    return _key_entry(ctx, d, path, None)


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

def scan(ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]:
    """Every key directory's entry. Names decide what is read (hash prefixes, paths); the rest of `flt`
    but the ops is applied by the caller to what comes back. A job is plain data (the path and the ops
    wanted), so that the index (kcache_cli/catalog/index.py) can answer an unchanged entry from its record."""
    prefixes = flt.name_prefixes()
    ops = tuple(flt.ops)
    base = os.path.join(ctx.root, "")
    jobs = [(base + name, ops) for name in filter(KEY_RE.match, ctx.subdirs(ctx.root, prefixes))]  # is_key, in C
    for entry in ctx.map_entries(_key_entries, jobs, _unfiltered):
        if entry is not None:
            yield entry


def _key_entries(ctx, job: tuple[str, tuple[str, ...]]) -> Entry | None:
    """The entry of one key directory (its temp dirs are part of it), None when its op is not wanted."""
    path, ops = job
    with ctx.open_entry(path) as d:
        return _key_entry(ctx, d, path, ScanFilter(ops=ops) if ops else None)


def _unfiltered(job: tuple[str, tuple[str, ...]]) -> tuple[tuple[str, tuple[str, ...]], ScanFilter]:
    """A job without its op filter, and the filter: `ls --op` is answered from the index's records of an
    unfiltered listing (catalog/index.py), the filter applied to each entry's op."""
    return (job[0], ()), ScanFilter(ops=job[1])


def _key_entry(ctx, d: EntryDir, path: str, flt: ScanFilter | None) -> Entry | None:
    """The entry of the key directory `path`, held open as `d` for its judgement. When the context
    records (the index), what the judgement went by: the listing's stats, or nothing when it looked
    outside the entry. The usual kernel is judged in one pass (_plain_entry); any other by the rule."""
    fast = _plain_entry(ctx, d, path, flt)
    if fast is None or isinstance(fast, Entry):
        return fast
    recording = getattr(ctx, "recording", None)
    lst = _Listing(d, ctx.warn, record=recording is not None)
    names = list(lst.sizes) if lst.readable else d.names()  # root lists a mode-000 dir: its name still
    single = single_file_kind(lst.sizes) if not lst.groups else None
    op = triton_kernel_name(names)
    if flt is not None and not flt.wants_op(op):
        return None
    meta = lst.meta(f"{op}.json") if op and single is None else None
    target, arch = arch_of(meta)
    if target is None and single == KIND_BINARY:
        target = next((t for t in ("cuda", "hip") if op and op.startswith(t)), None)
    status, reason = judge_files(lst, Judging())
    if recording is not None:
        recording[path] = None if lst.outside or lst.links else lst.seen
    return ctx.entry(path=path, usage=lst.usage, kind=single or KIND_KERNEL, hash=os.path.basename(path),
                     status=status, reason=reason, layout=NAME, target=target, space=arch, op=op,
                     subdirs=lst.subdirs)


# ---- the usual kernel, judged in one pass ----------------------------------------------------------
# Nearly every key directory is a kernel Triton finished writing, in its own files only. _plain_entry judges
# such a one with what the rule reads of it anyway (its listing, each group file, the metadata), in one pass
# without the rule's layers: about a third less per kernel, most of a cold listing. It answers only where
# judge_files would find it complete, and leaves everything else to the rule (tests/test_triton_plain.py
# holds the two to the same answer, case by case).

_NOT_PLAIN = object()


def _plain_entry(ctx, d: EntryDir, path: str, flt: ScanFilter | None) -> Entry | None | object:
    """_key_entry's answer for the usual kernel (None: its op is not wanted), or _NOT_PLAIN for any other
    key directory: anything but regular files, a file nobody may read, no group file, another user's
    group or metadata (reading it moves its atime: the rule notes that), or _plain_judged's doubts."""
    fd = d.fd
    if fd is None or d.held:
        return _NOT_PLAIN
    listed = _plain_listing(d, fd)
    if listed is None:
        return _NOT_PLAIN
    st, stats = listed
    groups = [n for n, _ in stats if is_group(n)]
    if not groups:
        return _NOT_PLAIN
    op = groups[0][len(GROUP_PREFIX):-len(".json")]  # triton_kernel_name: the first group's
    if flt is not None and not flt.wants_op(op):
        return None
    listing = dict(stats)
    parsed: dict[str, object] = {}
    if not _plain_judged(d.path, fd, groups, listing, parsed):
        return _NOT_PLAIN
    meta = _plain_json(fd, f"{op}.json", listing, parsed)  # the listing's op and arch
    if meta is None:
        return _NOT_PLAIN
    target, arch = arch_of(meta if isinstance(meta, dict) else None)
    recording = getattr(ctx, "recording", None)
    if recording is not None:
        recording[path] = (st, stats)
    usage = usage_of(st, [s for _, s in stats])  # _Listing.usage of a directory of regular files only
    return ctx.entry(path=path, usage=usage, kind=KIND_KERNEL, hash=os.path.basename(path),
                     status=COMPLETE, reason=None, layout=NAME, target=target, space=arch, op=op, subdirs=0)


def _plain_listing(d: EntryDir, fd: int) -> tuple[os.stat_result, list[tuple[str, os.stat_result]]] | None:
    """The directory's own lstat and its files' (name, lstat), sorted by name, when it holds regular files
    only, each readable by its mode; else None. `fd`: the directory's, held by `d`."""
    try:
        st = d.own_lstat()
        with os.scandir(fd) as it:
            stats = [(de.name, de.stat(follow_symlinks=False)) for de in it]
    except OSError:
        return None
    if not st.st_mode & 0o444 or not all([S_ISREG(s.st_mode) and s.st_mode & 0o444 for _, s in stats]):
        return None
    stats.sort()
    return st, stats


def _plain_judged(path: str, fd: int, groups: list[str], listing: dict[str, os.stat_result], parsed: dict
                  ) -> bool:
    """Whether judge_files finds the kernel (the key directory `path`, held open as `fd`) whose files are
    `listing` complete without reading anything but its group files and metadata: every group parses and
    lists its metadata and this entry's own files only, each one there and written before the group (none
    the rule would read again), the metadata is Triton's and a binary is listed. False where it may find
    otherwise (the rule then judges it)."""
    own = path + "/"
    for g in groups:
        children = group_children(_plain_json(fd, g, listing, parsed))
        if children is None or g[len(GROUP_PREFIX):] not in children:
            return False
        written = listing[g].st_mtime
        for n, p in children.items():
            st = listing.get(n)
            if st is None or p != own + n or (n != g and st.st_mtime >= written):
                return False
        meta_name = next(n for n in children if n.endswith(".json"))  # CompiledKernel's metadata, as _loaded's
        backend = _metadata_backend(_plain_json(fd, meta_name, listing, parsed))
        if backend is None or _binary_child(g, children, BINARY_EXT.get(backend, ".cubin"))[0] is None:
            return False
    return True


def _plain_json(fd: int, name: str, listing: dict[str, os.stat_result], parsed: dict) -> object:
    """The JSON value of the listed file `name`, read once (fsread.read_listed); None when it is not
    listed, cannot be read so, or does not parse (the value null too: the rule then judges it)."""
    if name not in parsed:
        st = listing.get(name)
        data = None if st is None else fsread.read_listed(fd, name, st, MAX_META)
        try:
            parsed[name] = None if data is None else fsread.parse_json(data, name)
        except ValueError:
            parsed[name] = None
    return parsed[name]


def shape_problem(relpath: str, kind: str, names: frozenset[str] | None, root: Path | None = None) -> str | None:
    """None when `relpath` is exactly a Triton key directory (`<key>/`) holding files Triton writes (a
    group file, a compile stage, a temp dir, or the one launcher module / autotune result of a group-less
    key dir), or a `tmp.pid_*` write inside one; else why not. `names` is None when only the path counts."""
    parts = relpath.split("/")
    if not is_key(parts[0]):
        return "its name is not a Triton cache key (hex, base64url or base32 of a sha256)"
    if len(parts) == 2 and parts[1].startswith(TMP_PREFIX):
        return None
    if len(parts) != 1 or kind not in (KIND_KERNEL, KIND_BINARY):
        return f"not at <key>/ (a Triton {kind} entry)"
    listed = sorted(names) if names is not None else None
    if listed is not None and not (triton_evidence(listed) or triton_kernel_name(listed)):
        return "it holds none of the files Triton writes"
    return None


def inner_leftovers(entry: Entry) -> list[InnerLeftover]:
    """The `tmp.pid_*` directories of a kernel that stays, untouched for an hour (a killed write): Triton
    never looks into them, prune removes them. Not looked for where the scan listed no directory in the
    kernel's: one older than an hour was there then, and one made since is no leftover yet."""
    if entry.layout != NAME or entry.subdirs == 0:
        return []
    now, out = time.time(), []
    try:
        temps = fsread.scandir_list(entry.path, lambda de: de.name.startswith(TMP_PREFIX)
                                    and de.is_dir(follow_symlinks=False))
    except OSError:
        return []
    for de in sorted(temps, key=lambda d: d.name):
        if now - measure_tree(de.path, lambda m: None).mtime >= STALE_AFTER:
            out.append(InnerLeftover(de.name, f"Triton temp directory {de.name} left by a killed write",
                                     f"{de.name} kept: written to less than an hour ago", TEMP))
    return out


# ---- deep checks ---------------------------------------------------------------------------------

_META_FACTS = (("num_warps", "num_warps"), ("num_stages", "num_stages"), ("num_ctas", "num_ctas"),
               ("shared", "shared memory"), ("triton_version", "triton version"))


def _open(entry: Entry, root: Path | str | None = None) -> EntryDir:
    """The entry's directory held open from its cache root (`root`, else the one its relpath gives)."""
    if root is None and entry.relpath and entry.path.endswith("/" + entry.relpath):
        root = entry.path[:len(entry.path) - len(entry.relpath)] or "/"
    return EntryDir.open(entry.path, fsread.anchor(root) if root is not None else None)


def describe(root: Path, entry: Entry) -> Details:
    p = entry.path
    files = list_files(p) if os.path.isdir(p) else ()
    with _open(entry, root) as d:
        return _described(entry, files, _Listing(d, lambda m: None))


def _described(entry: Entry, files, lst: _Listing) -> Details:
    p = entry.path
    status, reason = judge_files(lst, Judging(deep=True))
    problems = [reason] if status in (CORRUPT, MOVED) and reason else []
    facts: list[tuple[str, str]] = []
    name = entry.op
    meta = lst.meta(f"{name}.json") if name and entry.kind == KIND_KERNEL else None
    if meta is not None:
        target, arch = arch_of(meta)
        facts.append(("kernel", str(meta.get("name", name))))
        facts.append(("target", f"{target or '-'} {arch or '-'}"))
        facts.extend((label, str(meta[k]) + (" bytes" if k == "shared" else "")) for k, label in _META_FACTS
                     if k in meta)
    facts.extend(_group_facts(lst))
    facts.extend(("temp dir", f"{t} (Triton never reads it; prune removes it once untouched for an hour)")
                 for t, _ in lst.temps)
    binaries = tuple(os.path.join(p, n) for n in sorted(lst.sizes) if n.endswith(tuple(BINARY_TARGETS)))
    return Details(entry, status, reason, tuple(problems), files, name, (), (), None, None, binaries, tuple(facts))


def _group_facts(lst: _Listing) -> list[tuple[str, str]]:
    """One fact a group file: where its child paths lead, counted exactly (and where it leads, when it is
    a symlink), and whether `verify --fix` rewrites them."""
    out = []
    for g in lst.groups:
        target = _link_target(lst, g)
        link = "" if target is None else (f" (a symlink to {target}: Triton reads the group through it, and "
                                          "`kcache verify --fix` never rewrites a file through a link)")
        children = group_children(lst.json(g))
        if children is None:
            if link:
                out.append(("group file", g + link))
            continue
        where = Where(lst.d, children)
        if not where.elsewhere:
            out.append(("group file", f"{g}{link}: {len(children)} child paths, all in this entry"))
            continue
        parts = [f"{len(where.here)} in this entry"] if where.here else []
        parts += [f"{len(names)} into a copy of it under {root}" for root, names in where.copies.items()]
        parts += [f"{len(where.other)} elsewhere ({where.shown(where.other)})"] if where.other else []
        fix = "; `kcache verify --fix` rewrites them" if _fixable(lst, g) else ""
        out.append(("group file", f"{g}{link}: {len(children)} child paths: {', '.join(parts)}{fix}"))
    return out


def relocation_problem(entry: Entry) -> str | None:
    """Why Triton would miss this entry where it now lies, or would lose it with another root (group paths
    written under another root): what `verify --fix` repairs."""
    if entry.kind != KIND_KERNEL or entry.status not in (COMPLETE, MOVED):
        return None
    with _open(entry) as d:
        return _relocation_problem(_Listing(d, lambda m: None))


def _fixable(lst: _Listing, g: str) -> str | None:
    """Why `verify --fix` rewrites the child paths of the group file `g`, or None: Triton misses the kernel
    only because they point into a moved copy (`moved`), or it hits while they lead elsewhere and this
    entry holds every file they name (rewritten, they lead to those). Never a group reached through a link."""
    if g in lst.links:
        return None
    status, reason, _ = _group_rule(lst, g)
    if status == MOVED:
        return reason
    children = group_children(lst.json(g))
    if status != COMPLETE or children is None:
        return None
    where = Where(lst.d, children)
    if not where.elsewhere or not all(plain_name(n) and _exists(lst, n, lst.d.join(n)) for n in where.elsewhere):
        return None
    if where.root is not None:
        return (f"{g} points into {where.root} (the cache was copied): Triton reads that copy's files, and misses "
                "once it is gone, until `kcache verify --fix` rewrites the paths")
    return (f"{g} points {len(where.astray)} of its {len(children)} child paths outside this entry, not into a copy "
            f"of it ({where.shown(where.astray)}): Triton reads those files, not this entry's, until "
            "`kcache verify --fix` rewrites the paths")


def _relocation_problem(lst: _Listing) -> str | None:
    for g in lst.groups:
        why = _fixable(lst, g)
        if why:
            return why
    return None


def log_files(entry: Entry) -> list[LogFile]:
    return []  # Triton keeps no compile log: `no_log` says where to look instead


def no_log(entry: Entry) -> str:
    """What `kcache log` says instead of a log."""
    stages = sorted(n for n in fsread.names(entry.path) if n.endswith(IR_SUFFIXES))
    where = ", ".join(stages) if stages else "none left"
    return f"Triton keeps no compile log; the compile stages are in {entry.path}: {where}"


# ---- relocation ----------------------------------------------------------------------------------

def relocate(src: str, dest: str, root: str | os.PathLike | None = None) -> int:
    """Rewrite every group file in the entry directory `src` so that each child path names the file
    in `dest` (where the entry is or will be published): the rule Triton's get_group applies. Each
    file is replaced atomically, written as Triton writes (a `tmp.pid_*` directory inside the entry,
    fsync, os.replace). Child names that are not plain file names are dropped, so a group can never
    point outside its entry. Every read and write goes through one fd of `src` (an EntryDir: inside the
    cache `root`, opened from it without following a link), so a directory swapped for a link between
    the scan and this rewrite makes it write nothing rather than write elsewhere. Returns how many
    group files changed."""
    changed = 0
    with EntryDir.open(src, fsread.anchor(root) if root is not None else None) as d:
        dfd = d.fd
        if dfd is None:
            raise OSError(errno.ELOOP, "cannot open the entry's directory without following a link", src)
        for g in sorted(n for n in os.listdir(dfd) if is_group(n)):
            if not stat.S_ISREG(os.stat(g, dir_fd=dfd, follow_symlinks=False).st_mode):
                continue  # never read through a link; the entry is corrupt anyway
            group = d.json_object(g)  # through the held fd
            children = group_children(group)
            if group is None or children is None:
                continue
            fixed = {n: os.path.join(dest, n) for n in children if plain_name(n)}
            if fixed == children:
                continue
            fswrite.replace_file_via_dir(dfd, g, json.dumps({**group, "child_paths": fixed}).encode(), TMP_PREFIX)
            changed += 1
    return changed


# ---- the layout ----------------------------------------------------------------------------------

# ---- will Triton here use it (kcache explain) --------------------------------------------------------
# Triton's key hashes its own version (triton_key: the version and its sources), the target, the options
# and the environment switches its C++ names (get_cache_invalidating_env_vars): a different version, target
# or switch is another key, a miss. The key's shape tells the era: 64 hex (<=3.1), 43 base64url (3.2),
# 52 base32 (>=3.3); 3.3+ also records `triton_version` in the metadata.

PACKAGE = "triton"
NEUTRAL_ENV = frozenset({"TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_CACHE_MANAGER", "TRITON_REMOTE_CACHE_BACKEND",
                         "TRITON_PRINT_AUTOTUNING", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR"})


def key_era(key: str) -> str | None:
    if re.fullmatch(r"[0-9a-f]{64}", key):
        return "<=3.1"
    if re.fullmatch(r"[A-Za-z0-9_-]{43}", key):
        return "3.2"
    if re.fullmatch(r"[A-Z2-7]{52}", key):
        return ">=3.3"
    return None


def version_era(version: str) -> str | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        return None
    v = (int(m.group(1)), int(m.group(2)))
    return "<=3.1" if v <= (3, 1) else "3.2" if v == (3, 2) else ">=3.3"


def runs_on(arch: str, gpus: Iterable[str]) -> bool:
    """Triton keys a kernel by its target, the GPU's exact compute capability (and the "a" variant from 9.0
    on), so it looks a kernel up only on a GPU of that capability: an sm_80 kernel is never found on 8.6,
    where a binary the driver loads would run. The rule explain and pull both go by."""
    return runs_on_node(arch, gpus, exact=True)


def explain(root: Path, entry: Entry, here: Here) -> Verdict:
    """Will Triton in `here` use `entry` for the kernel it was compiled for (same source, same launch)?"""
    meta = None
    if entry.op and not here.problem:
        with _open(entry, root) as d:
            meta = _Listing(d, lambda m: None).meta(f"{entry.op}.json")
    recorded = (meta or {}).get("triton_version")
    target = (meta or {}).get("target")
    return _verdict(entry.hash, recorded if isinstance(recorded, str) else None,
                    target if isinstance(target, dict) else None, entry.status, entry.reason, here)


def explain_record(record: Mapping[str, object], here: Here) -> Verdict:
    """`explain` for an archive's manifest record: the compiler ("triton 3.9.0") and arch export found."""
    compiler, arch = record.get("compiler"), record.get("arch")
    version = compiler.split(" ", 1)[1] if isinstance(compiler, str) and compiler.startswith("triton ") else None
    target = None
    if isinstance(arch, str):
        m = re.fullmatch(r"sm_(\d+)a?", arch)
        target = {"backend": "cuda", "arch": int(m.group(1)), "warp_size": 32} if m else \
            {"backend": "hip", "arch": arch, "warp_size": 64}
    status = record.get("status")
    key = str(record.get("relpath", "")).rsplit("/", 1)[-1]
    return _verdict(key, version, target, status if isinstance(status, str) else COMPLETE, None, here)


def _verdict(key: str, recorded: str | None, target: dict | None, status: str, reason: str | None,
             here: Here) -> Verdict:
    if (not_asked := unasked(here)) is not None:
        return not_asked
    have = here.versions.get(PACKAGE)
    era = key_era(key)
    said = recorded or (f"{era} (by its key's shape)" if era else None)
    if have is None:
        return not_installed("Triton", PACKAGE, said)
    if (recorded and recorded != have) or (era and version_era(have) != era):
        return Verdict(MISS, f"Triton {have} here keys kernels by its own version", "triton version", said, have)
    if status != COMPLETE:  # Triton uses no incomplete or moved entry, on any GPU
        return Verdict(MISS, f"Triton does not use a {status} entry: {reason}", "status", status, COMPLETE)
    if target is None:
        return Verdict(UNKNOWN, f"{key[:12]} records no target (no kernel metadata): kcache cannot tell what "
                       "Triton would key it for")
    backend, arch = arch_of({"target": target})
    if here.gpu is None:
        return Verdict(UNKNOWN, f"no GPU here to compare with {backend} {arch} (--gpu names the arch)")
    cc = int(here.gpu.split("_")[1].rstrip("af"))
    if backend != "cuda":
        return Verdict(MISS, "Triton here targets the CUDA GPU", "target backend", backend, "cuda")
    if not runs_on(str(arch), [here.gpu]):
        return Verdict(MISS, "Triton keys a kernel by the GPU's compute capability", "target arch", arch,
                       f"sm_{cc}{'a' if cc >= 90 else ''}")
    if target.get("warp_size") != 32:
        return Verdict(MISS, "CUDA warps are 32 threads", "target warp_size", str(target.get("warp_size")), "32")
    return _env_verdict(key, recorded, have, arch, here)


def _env_verdict(key: str, recorded: str | None, have: str, arch: str | None, here: Here) -> Verdict:
    if here.env.get("TRITON_ALWAYS_COMPILE", "0").lower() in ("1", "true", "on", "yes"):
        return Verdict(MISS, "TRITON_ALWAYS_COMPILE is set here: Triton never reads its cache",
                       "TRITON_ALWAYS_COMPILE", None, here.env["TRITON_ALWAYS_COMPILE"])
    odd = sorted(k for k in here.env if k.startswith("TRITON_") and k not in NEUTRAL_ENV)
    if odd:
        return Verdict(UNKNOWN, f"{odd[0]} is set here: Triton may hash it into every key, and the entry does "
                       "not record it")
    if recorded is None:
        return Verdict(UNKNOWN, f"the entry records no Triton version, and its key's shape allows several "
                       f"({key_era(key) or 'unknown'}); Triton {have} here")
    return Verdict(HIT, f"Triton {have}, {arch}, warp 32: as recorded, and the entry is complete")

class TritonLayout(Layout):
    """Triton's cache: self-contained key directories; no lock (Triton writes through temp dirs and
    os.replace), absolute paths in the group files (rewritten on import)."""

    shape = TRITON
    relocates = True  # import and verify --fix rewrite the group files
    fact_files = ()  # the facts are in the kernel's metadata, read by `facts`
    # Triton cannot rebuild a kernel from the IR in its cache, and one whose group lists a missing cubin
    # makes it fail: `export --sources-only` leaves Triton entries out whole.
    binary_kinds = frozenset({KIND_KERNEL, KIND_BINARY})
    packages = (PACKAGE,)
    env_switches = ("TRITON_*",)

    shape_problem = staticmethod(shape_problem)
    scan = staticmethod(scan)
    judge = staticmethod(judge)
    nested_entry = staticmethod(nested_entry)
    describe = staticmethod(describe)
    log_files = staticmethod(log_files)
    no_log = staticmethod(no_log)
    relocation_problem = staticmethod(relocation_problem)
    inner_leftovers = staticmethod(inner_leftovers)

    def relocate(self, staged: str, final: str, root: Path) -> None:
        relocate(staged, final, root)

    def remote_format(self) -> RemoteFormat | None:
        """Triton's own Redis keys (`triton:{key}:{filename}`), shared with Triton's remote cache."""
        return triton_remote.TritonFormat()

    def image_format(self) -> ImageFormat:
        """MCV's compat image of a Triton cache (triton_image.py)."""
        return triton_image.TritonImage()

    def facts(self, entry: Entry, small: Mapping[str, bytes], names: Iterable[str]) -> Facts:
        meta = None
        if entry.op:
            with _open(entry) as d:
                meta = _Listing(d, lambda m: None).meta(f"{entry.op}.json")
        version = (meta or {}).get("triton_version")
        return Facts(f"triton {version}" if isinstance(version, str) else "triton", arch_of(meta)[1], None)


    explain = staticmethod(explain)
    explain_record = staticmethod(explain_record)
    runs_on = staticmethod(runs_on)


LAYOUT = TritonLayout()
