"""Helpers more than one layout module uses, so that no layout imports another (tests/test_imports.py):
reading a compile script (hidet, tilus), and one walk of an entry that is a whole tree (a vLLM unit, a tilus
program) that measures it, makes the index's key of it and lets its judgement list nothing again.
Replacing one file of an entry in place (Triton's group files, vLLM's indexes) is
fswrite.replace_file_via_dir."""

from __future__ import annotations

import os
from stat import S_ISDIR

from kcache_cli.fs import read as fsread
from kcache_cli.fs.entrydir import EntryDir, Walk
from kcache_cli.model.records import TreeUsage, Warn, usage_of


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


def walk_tree(d: EntryDir, warn: Warn, keyed: bool) -> tuple[TreeUsage, tuple | None]:
    """One walk of the whole tree held as `d` (directories opened beneath it, no link followed), where its
    usage, the index's key and its judgement each walked it: its usage as measure_tree measures it; with
    `keyed`, the index's key (its own fstat and every name beneath it, '/'-separated, directories
    included: a name added or removed anywhere changes its directory's; None when some part could not be
    read: not stored); and the walk shared with `d` (EntryDir.share_walk), so that its judgement lists
    and lstats nothing again. OSError when `d` itself cannot be listed (nothing is warned then)."""
    own = os.fstat(d._dir())
    walker = _Walker(d.path, warn, [] if keyed else None)
    walker.walk(d._dir(), "", 0)  # the top's failure is the caller's; a part's, a warning
    d.share_walk(Walk(d.path, walker.dirs))
    key = (own, walker.out) if walker.out is not None and walker.whole else None
    return usage_of(own, [st for listed in walker.dirs.values() for st in listed.values()]), key


class _Walker:
    """walk_tree's state: the directories listed, the key's stats (sorted names, each directory before
    what is in it), whether every part was read."""

    def __init__(self, path: str, warn: Warn, out: list | None) -> None:
        self.path, self.warn, self.out = path, warn, out
        self.dirs: dict[str, dict[str, os.stat_result]] = {}
        self.whole = True
        self.too_deep = False

    def walk(self, fd: int, rel: str, depth: int) -> None:
        items = []
        with os.scandir(fd) as it:
            for de in it:
                try:
                    items.append((de.name, de.stat(follow_symlinks=False)))
                except OSError:  # gone since the listing: not counted, as measure_tree counts it
                    self.whole = False
        items.sort()
        self.dirs[rel] = dict(items)
        for name, st in items:
            sub = f"{rel}/{name}" if rel else name
            if self.out is not None:
                self.out.append((sub, st))
            if S_ISDIR(st.st_mode):
                self._into(fd, name, sub, depth + 1)

    def _into(self, fd: int, name: str, sub: str, depth: int) -> None:
        if depth > fsread.MAX_TREE_DEPTH:
            self.whole = False
            if not self.too_deep:
                self.too_deep = True
                self.warn(f"{self.path}: directories nested more than {fsread.MAX_TREE_DEPTH} deep "
                          "(not counted below)")
            return
        try:
            sub_fd = os.open(name, fsread.DIR_FLAGS, dir_fd=fd)
            try:
                self.walk(sub_fd, sub, depth)
            finally:
                os.close(sub_fd)
        except OSError as exc:
            self.whole = False
            self.warn(f"cannot read {self.path}/{sub}: {exc.strerror}")
