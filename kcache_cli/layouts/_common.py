"""Helpers more than one layout module uses, so that no layout imports another (tests/test_imports.py):
reading a compile script (hidet, tilus), the stats of a whole entry's tree for the index's key (vLLM).
Replacing one file of an entry in place (Triton's group files, vLLM's indexes) is
fswrite.replace_file_via_dir."""

from __future__ import annotations

import errno
import os
from stat import S_ISDIR

from kcache_cli.fs import read as fsread
from kcache_cli.fs.entrydir import EntryDir


def command_from_script(text: str) -> str:
    """The command lines of a compile.sh, without the shebang and blank lines."""
    return "\n".join(line for line in text.splitlines() if line.strip() and not line.startswith("#!")).strip()



def leads_here(d: EntryDir, name: str, path: str) -> bool:
    """Whether the absolute `path` an entry records about itself (Triton's child paths, the sources
    torch's build.ninja names) is, or leads to, its file `name`, reached through `d`: a path through a
    link to this directory names the same file, as the compiler resolving it finds."""
    if path == d.join(name):
        return True
    try:
        return os.path.samestat(os.stat(path), d.stat(name))
    except (OSError, ValueError):
        return False


def tree_stats(d: EntryDir) -> tuple[os.stat_result, list[tuple[str, os.stat_result]]] | None:
    """For the index's key of an entry that is a whole tree (a vLLM unit): the directory's own fstat and
    the lstat of every name beneath it ('/'-separated, directories included: a name added or removed
    anywhere changes its directory's), read through fds, no link followed; None when some part cannot be
    read (such an entry is not stored)."""
    if d.fd is None:
        return None
    out: list[tuple[str, os.stat_result]] = []
    try:
        own = os.fstat(d.fd)
        _walk(d.fd, "", out, 0)
    except OSError:
        return None
    return own, out


def _walk(fd: int, prefix: str, out: list[tuple[str, os.stat_result]], depth: int) -> None:
    with os.scandir(fd) as it:
        items = sorted((de.name, de.stat(follow_symlinks=False)) for de in it)
    for name, st in items:
        out.append((prefix + name, st))
        if S_ISDIR(st.st_mode):
            if depth >= fsread.MAX_TREE_DEPTH:
                raise OSError(errno.ELOOP, "too deep", prefix + name)
            sub = os.open(name, fsread.DIR_FLAGS, dir_fd=fd)
            try:
                _walk(sub, f"{prefix}{name}/", out, depth + 1)
            finally:
                os.close(sub)
