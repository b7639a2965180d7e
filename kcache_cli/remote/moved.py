"""What push and pull report: one record per entry they moved (or did not), and the run's result."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MovedEntry:
    layout: str
    kind: str
    relpath: str
    files: int
    size: int
    # push: push, skip (the remote has it), left out (not complete, or fails its own checks);
    # pull: pull, replace (an incomplete local entry), skip (present here), refuse (breaks a rule)
    action: str
    done: bool  # published (False in a dry run, for skips and refusals)
    reason: str | None
    arch: str | None = None

    def to_json(self) -> dict[str, object]:
        """The entry as `push --json` and `pull --json` list it (field order is the README's)."""
        return {("file_count" if k == "files" else k): v for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class MoveResult:
    remote: str
    root: str
    dry_run: bool
    entries: tuple[MovedEntry, ...]

    def count(self, *actions: str) -> int:
        return sum(1 for e in self.entries if e.action in actions)

    def _json(self, counts: dict[str, int], size: int) -> dict[str, object]:
        return {"remote": self.remote, "root": self.root, "dry_run": self.dry_run, **counts, "size": size,
                "entries": [e.to_json() for e in self.entries]}
