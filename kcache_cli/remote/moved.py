"""What push and pull report: one record per entry they moved (or did not), and the run's result."""

from __future__ import annotations

from dataclasses import dataclass

from kcache_cli.model.records import EntryKey, Keyed
from kcache_cli.model.terms import MoveAction


def named(layout: str, kind: str, relpath: str) -> EntryKey:
    """The key of an entry known only by its layout, kind and path (a remote's record that was refused
    unread or unchecked): its hash is the path's last part."""
    return EntryKey(layout, kind, None, None, None, relpath.rsplit("/", 1)[-1], relpath)


@dataclass(frozen=True)
class MovedEntry(Keyed):
    """One entry push or pull handled, and what it did (push, pull, skip, refuse...)."""

    key: EntryKey
    files: int
    size: int
    # push: push, skip (the remote has it), left out (not complete, or fails its own checks);
    # pull: pull, replace (an incomplete local entry), skip (present here), refuse (breaks a rule)
    action: MoveAction
    done: bool  # published (False in a dry run, for skips and refusals)
    reason: str | None
    arch: str | None = None
    lock_timed_out: bool = False  # pull: skipped, another process held its lock past --lock-timeout (exit 3)

    def to_json(self) -> dict[str, object]:
        """The entry as `push --json` and `pull --json` list it (field order is docs/remote.md's)."""
        k = self.key
        return {"layout": k.layout, "kind": k.kind, "relpath": k.relpath, "file_count": self.files, "size": self.size,
                "action": self.action, "done": self.done, "reason": self.reason, "arch": self.arch}


@dataclass(frozen=True)
class MoveResult:
    """What push or pull did between one root and one remote."""

    remote: str
    root: str
    dry_run: bool
    entries: tuple[MovedEntry, ...]

    def count(self, *actions: MoveAction) -> int:
        return sum(1 for e in self.entries if e.action in actions)

    def _json(self, counts: dict[str, int], size: int) -> dict[str, object]:
        return {"remote": self.remote, "root": self.root, "dry_run": self.dry_run, **counts, "size": size,
                "entries": [e.to_json() for e in self.entries]}
