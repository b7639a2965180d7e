"""Where the cache is: --cache-dir, KCACHE_DIR, then the default root of the layout `kcache build`
publishes into (its compiler's own rule: kcache_cli/layouts/homes.py)."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from kcache_cli.fs import read as fsread
from kcache_cli.fs import state
from kcache_cli.layouts import all_layouts, detect, get, homes
from kcache_cli.layouts.shapes import BUILD_SHAPE, SHAPES
from kcache_cli.model.terms import LAYOUT_NAMES
from kcache_cli.util.errors import UsageError
from kcache_cli.util.lazy import lazy_module

if TYPE_CHECKING:
    from kcache_cli.util import suggest
else:
    suggest = lazy_module("kcache_cli.util.suggest")  # an error's hint only


@dataclass(frozen=True)
class CacheLocation:
    """A cache root and why it was chosen (the flag, variable or rule that named it)."""

    path: Path
    reason: str
    cache: str = ""  # the layout whose cache this is (`--cache NAME`, the `cache` column), when known


def resolve_cache_dir(cli_value: str | os.PathLike | None = None, package_dir: Path | None = None) -> CacheLocation:
    """The cache root. `--cache-dir ""` (an unset shell variable), `/` and the home directory itself
    are refused (UsageError): kcache deletes inside its root, and neither of those is a cache."""
    if cli_value is not None:
        if not os.fspath(cli_value):
            raise UsageError("--cache-dir is empty (an unset variable?): give the cache's path")
        return _checked(CacheLocation(Path(cli_value).expanduser().absolute(), "--cache-dir"))
    env = os.environ.get("KCACHE_DIR")
    if env:
        return _checked(CacheLocation(Path(env).expanduser().absolute(), "KCACHE_DIR environment variable"))
    return _checked(default_cache_dir(package_dir))


def _checked(loc: CacheLocation) -> CacheLocation:
    why = refused_root(loc.path)
    if why is not None:
        raise UsageError(f"refusing {loc.path} ({loc.reason}) as a cache root: {why}")
    return loc


def refused_root(path: str | os.PathLike) -> str | None:
    """Why `path` can never be a cache root (kcache deletes inside its root): the filesystem root or
    the home directory itself (through any symlink); None when it may be one. --cache-dir, KCACHE_DIR
    and every root `--all-caches` finds are held to it."""
    real = os.path.realpath(path)
    if real == os.path.realpath(os.sep):
        return "it is the filesystem root"
    if real == os.path.realpath(Path.home()):
        return "it is the home directory"
    return None


def lone_entry(path: str | os.PathLike) -> tuple[str, str, str] | None:
    """(layout, the directory holding it, why that is no root) when the directory `path` is itself a cache
    that kcache lists as the one entry of the directory holding it (JAX's, the CUDA driver's JIT cache: told
    by `path`'s own files, as detecting that directory would) and that directory may never be a root
    (refused_root: $HOME, /): no root holds it. Only `path` is read, never the directory around it."""
    where = os.path.abspath(path)
    parent, name = os.path.split(where)
    why = refused_root(parent) if name else None
    if why is None or not os.path.isdir(where):
        return None
    owner = next((s.name for s in SHAPES if s.locate(name) is not None and s.held_by(parent, [name])), None)
    return (owner, parent, why) if owner is not None else None


def default_cache_dir(package_dir: Path | None = None) -> CacheLocation:
    """The cache the build layout's compiler uses when nothing says otherwise (`package_dir`: where its
    Python package lies, for tests; None: found without importing it)."""
    home = homes.default_root(BUILD_SHAPE.name, package_dir)
    assert home is not None, "the build layout has a default root"
    return CacheLocation(home.path.absolute(), home.reason)


def known_caches() -> list[tuple[str, Path]]:
    """Every kernel cache kcache knows where to look for on this machine (`dir --all`): each layout's
    own default places (torch's extensions: one per Python and accelerator), each directory once. A root
    that is another's (two variables naming one place) is listed with the first layout; a root that lies
    inside another known cache's entries (a TRITON_CACHE_DIR inside Inductor's triton/<device>/ or a
    vLLM unit) is shown only with that cache, whose entries hold it."""
    found = []
    for name, layout in all_layouts().items():
        found += [(name, where) for where, _ in layout.default_roots()]
    reals = [os.path.realpath(p) for _, p in found]
    out = []
    for i, (name, path) in enumerate(found):
        if reals[i] in reals[:i]:
            continue
        if any(j != i and reals[j] != reals[i] and inside_entries(reals[i], reals[j], found[j][0])
               for j in range(len(found))):
            continue
        out.append((name, path))
    return out


def inside_entries(path: str, root: str, owner: str) -> bool:
    """Whether `path` lies in what the `owner` layout's cache at `root` holds: a nested cache it declares
    (Layout.nested) or one of its entries (by the entry's exact shape, positive evidence)."""
    if not path.startswith(root.rstrip("/") + "/") or not os.path.isdir(root):
        return False
    layout = get(owner)
    for _, nested in layout.nested(Path(root)):
        real = os.path.realpath(nested)
        if path == real or path.startswith(real + "/"):
            return True
    parts = os.path.relpath(path, root).split(os.sep)
    for k in range(1, len(parts) + 1):
        prefix = "/".join(parts[:k])
        found = layout.shape.locate(prefix)
        if found is None:
            continue
        try:
            names = frozenset(os.listdir(os.path.join(root, prefix)))
        except OSError:
            continue
        if layout.shape_problem(prefix, found[0], names, Path(root)) is None:
            return True
    return False


def existing_caches(warn: Callable[[str], None] | None = None) -> list[CacheLocation]:
    """The caches `known_caches` finds that exist and may be roots: kcache's default scope without
    --cache-dir or KCACHE_DIR. One that is refused (hidet.toml `cache_dir = "~"`, TRITON_CACHE_DIR=$HOME)
    or that kcache may not trust (vet_root: a link, another user's directory) is left out, and `warn`
    told why; the others are held (fsread.hold_root)."""
    out = []
    for owner, path in known_caches():
        why = refused_root(path)
        if why is not None:
            if warn is not None:
                warn(f"skipping the {owner} cache at {path}: {why}, never a cache root")
        elif found_root(path, f"the {owner} cache", warn):
            out.append(CacheLocation(path, f"{owner} cache (dir --all)", owner))
    return out


def found_root(path: str | os.PathLike, what: str, warn: Callable[[str], None] | None) -> bool:
    """Whether the root kcache found by itself at `path` exists and may be used: vetted and held (True), or
    missing, or untrusted (False; `warn` told why and how to opt in)."""
    if fsread.held_root(path) is not None:
        return True
    try:
        fd, why = vet_root(path)
    except FileNotFoundError:
        return False
    if why is not None:
        if warn is not None:
            where = os.path.abspath(path)
            warn(f"skipping {what} at {where}: {why}; to use it anyway, pass --cache-dir {where} or set "
                 f"KCACHE_SAFE_DIRECTORY={where}")
        return False
    fsread.hold_root(path, fd)
    return True


def vet_root(path: str | os.PathLike) -> tuple[int, str | None]:
    """(fd, None): the root at `path`, a directory kcache found by itself, opened once without following
    a link in its last component, belonging to this user or root (or a group-shared cache of one of this
    user's groups, DESIGN §5) and not another user's directory in a world-writable one (/tmp: anyone may
    make `torchinductor_<you>` first). (-1, why) when it may not be used. A root listed in
    KCACHE_SAFE_DIRECTORY is trusted as it is. FileNotFoundError when it is missing."""
    where = os.path.abspath(path)
    if state.trusted_root(where):
        return fsread.open_root(where), None
    parent, name = os.path.split(where)
    pfd = os.open(parent or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fd = os.open(name, fsread.DIR_FLAGS, dir_fd=pfd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            if not stat.S_ISLNK(st.st_mode):
                raise FileNotFoundError(errno.ENOTDIR, "not a directory", where) from None
            return -1, f"it is a symlink (to {_link_text(pfd, name)}) owned by uid {st.st_uid}, never followed"
        why = _untrusted(os.fstat(fd), os.fstat(pfd), parent)
    finally:
        os.close(pfd)
    if why is not None:
        os.close(fd)
        return -1, why
    return fd, None


def _link_text(dir_fd: int, name: str) -> str:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return "?"


def _untrusted(st: os.stat_result, parent: os.stat_result, parent_path: str) -> str | None:
    """Why a root found by itself with stat `st`, in the directory with stat `parent`, is not to be used."""
    me = os.geteuid()
    if st.st_uid in (me, 0):
        return None
    owner = f"it is owned by uid {st.st_uid}, not by you (uid {me}){'' if me == 0 else ' or root'}"
    if parent.st_mode & stat.S_IWOTH:
        return f"{owner}, in the world-writable {parent_path} (anyone may make it there)"
    shared = st.st_mode & stat.S_ISGID and st.st_mode & stat.S_IWGRP
    if shared and st.st_gid in (os.getegid(), *os.getgroups()) and parent.st_uid in (me, 0) \
            and not parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None  # a group-shared cache (chmod 2775) of one of your groups, in a directory no one else controls
    return f"{owner}, and is not a group-shared cache of one of your groups"


def hold_explicit(loc: CacheLocation, warn: Callable[[str], None] | None) -> None:
    """Hold the root given explicitly (--cache-dir, KCACHE_DIR), opened once (a link there followed once,
    here, and named in a warning); nothing when it is missing."""
    if fsread.held_root(loc.path) is not None:
        return
    try:
        fd = fsread.open_root(loc.path)
    except OSError:
        return
    if os.path.islink(loc.path) and warn is not None:
        warn(f"{loc.path} ({loc.reason}) is a symlink to {os.path.realpath(loc.path)}: kcache uses the "
             "directory it names now, for the whole command")
    fsread.hold_root(loc.path, fd)


def named_cache(name: str) -> CacheLocation:
    """The cache of the layout `name` (`--cache triton`) where its compiler's own rule puts it."""
    known = homes.named_caches(LAYOUT_NAMES)
    home = known.get(name)
    if home is None and name in LAYOUT_NAMES:  # jax without JAX_COMPILATION_CACHE_DIR: known, no place
        raise UsageError(f"the {name} cache has no place here: {homes.NO_DEFAULT.get(name, 'none is set')} "
                         "(or pass --cache-dir)")
    if home is None:
        raise suggest.unknown_choice("cache", name, known)
    own = homes.default_root(name)
    many = homes.default_roots(name) if name in homes.ROOTS else []
    if len(many) > 1 and own is not None and many[0].path != own.path:  # none where the compiler here builds
        raise UsageError(f"--cache {name} names {len(many)} caches here ({', '.join(str(h.path) for h in many)}), "
                         f"none of them where {name} here would build ({own.path}): pick one with --cache-dir")
    return vetted(_checked(CacheLocation(home.path.absolute(), home.reason, name)))


class UntrustedRoot(UsageError):
    """A root kcache found by itself that it may not use (vet_root): the message says why and how to opt in."""


def vetted(loc: CacheLocation) -> CacheLocation:
    """`loc`, a root found by a compiler's rule, held when it exists (found_root); UntrustedRoot when it
    may not be used (another user's directory, a link)."""
    why: list[str] = []
    if os.path.lexists(loc.path) and not found_root(loc.path, f"the {loc.cache or 'default'} cache ({loc.reason})",
                                                    why.append):
        raise UntrustedRoot(why[0].replace("skipping", "refusing", 1) if why else f"{loc.path} is not a directory")
    return loc


def cache_holding(path: str | os.PathLike, known: list[CacheLocation] | None = None,
                  warn: Callable[[str], None] | None = None) -> CacheLocation | None:
    """The cache `path` lies in (an entry's path, or a directory inside a root, like git finding .git):
    the deepest known cache holding it, else the nearest ancestor whose layout detection says it is a
    root and whose layout's path shapes lead from there to `path`, when it may be trusted (found_root:
    else `warn` is told why, and there is none). $HOME and / are never one."""
    real = os.path.realpath(path)
    known = existing_caches() if known is None else known
    holders = [loc for loc in known if _under(real, os.path.realpath(loc.path))]
    if holders:
        return max(holders, key=lambda loc: len(os.path.realpath(loc.path)))

    here = Path(real)
    for above in (here, *here.parents):
        if refused_root(above) is not None:
            return None
        if not above.is_dir():  # a root still to be made, and the levels above it to be made with it
            continue
        parts = [p for p in os.path.relpath(real, above).split(os.sep) if p not in ("", ".")]
        for name in detect(above):
            if _leads_to_entry(get(name).shape, parts):
                if not found_root(above, f"the {name} cache holding {real}", warn):
                    return None
                return CacheLocation(above, f"{name} cache holding {real}", name)
    return None


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _leads_to_entry(shape, parts: list[str]) -> bool:
    """Whether the relative path `parts` is on the way to, or inside, an entry of some kind of `shape`."""
    for kind in shape.kinds:
        if all(kind.match_segment(i, p) is not None for i, p in enumerate(parts[:kind.depth])):
            return True
    return False


def caches_as_in_a_home(path: Path) -> list[tuple[str, Path]]:
    """(layouts, directory) of the caches `path` holds where compilers keep theirs in a home: each cache
    kcache knows on this machine that lies below HOME (`dir --all`), looked for at the same place below
    `path`. The hint for a --cache-dir that is a home (a copied one, a container's), whose caches lie in
    hidden directories (~/.cache/hidet, ~/.triton/cache) caches_below never looks into."""
    home = Path(os.path.abspath(os.path.expanduser("~")))
    found: list[tuple[str, Path]] = []
    for _, where in known_caches():
        try:
            rel = Path(os.path.abspath(where)).relative_to(home)
        except ValueError:
            continue
        there = path / rel
        names = detect(there) if rel.parts and fsread.is_dir(there) else ()
        if names:  # (each known cache once: known_caches leaves out a second name of one)
            found.append((", ".join(names), there))
    return found


def caches_below(path: Path, limit: int = 64, levels: int = 2) -> list[tuple[str, Path]]:
    """(layouts, directory) of the caches one or two (`levels`) levels below `path`, which holds none
    itself (`--cache-dir D` where D/triton/cache or D/hidet is the cache): the hint for a root given one
    level too high. At most `limit` directories per level are looked at; hidden ones never (a killed
    import's staging directory in .kcache/ holds entries, and is no cache to point anyone at)."""
    found: list[tuple[str, Path]] = []
    level = [path]
    for _ in range(levels):
        below: list[Path] = []
        for d in level:
            try:
                with os.scandir(d) as it:
                    kids = sorted(Path(e.path) for e in it
                                  if not e.name.startswith(".") and e.is_dir(follow_symlinks=False))[:limit]
            except OSError:
                continue
            for kid in kids:
                names = detect(kid)
                if names:
                    found.append((", ".join(names), kid))
                else:
                    below.append(kid)
        level = below[:limit]
    return found
