"""kcache's fixed vocabulary. A module of its own so that start-up (option parsing, completion)
can name layouts, kinds and statuses without creating the core's dataclasses. Layout names and
kinds come from the layouts' registry (kcache_cli/layouts/shapes.py): a layout adds its own, so they
stay `str`. The closed vocabularies (statuses, what import/push/pull did with an entry, what a removal
takes away, build and repair outcomes) are `Literal` types (kcache supports Python 3.10, which has no
StrEnum): mypy checks every value, and at run time they are the same strings JSON writes. Each
constant is `Final`, so mypy reads it as its word."""

from typing import Final, Literal, TypeGuard, get_args

from kcache_cli.layouts.shapes import SHAPES
from kcache_cli.util.textsafe import printable_line

Status = Literal["complete", "partial", "failed", "corrupt", "building", "stale", "unreadable", "moved"]
COMPLETE: Final = "complete"
PARTIAL: Final = "partial"
FAILED: Final = "failed"
CORRUPT: Final = "corrupt"
BUILDING: Final = "building"
# stale: whole and valid, but built by another version of the compiler, which will rebuild it.
STALE: Final = "stale"
# unreadable: permissions keep kcache (and the compiler) from reading it; never judged broken.
UNREADABLE: Final = "unreadable"
# moved: whole, but the paths it records lead into another root (a relocatable layout copied by hand):
# the compiler misses it until `verify --fix` rewrites them; a torch extension recorded at another build
# directory is rebuilt by torch where it lies, and kcache cannot rewrite it (Layout.relocates is False).
# Never removed by prune --broken.
MOVED: Final = "moved"
STATUSES: tuple[Status, ...] = get_args(Status)
# `--status broken`: the statuses `prune --broken` removes, one word for the three (never unreadable, stale
# or moved: a permission problem, another version's entry and a copied one are not damage).
BROKEN_WORD: Final = "broken"
BROKEN: tuple[Status, ...] = (PARTIAL, FAILED, CORRUPT)


def is_status(word: str) -> TypeGuard[Status]:
    return word in STATUSES


# What import did with an archive's entry.
ImportAction = Literal["import", "replace", "skip"]
# What push did with a local entry: pushed, skipped (the remote has it), left out (not complete, or fails
# its own checks); what pull did with a remote's: pulled, replaced an incomplete local entry, skipped
# (present here), refused (breaks a rule).
PushAction = Literal["push", "skip", "left out"]
PullAction = Literal["pull", "replace", "skip", "refuse"]
MoveAction = Literal[PushAction, PullAction]
# What a removal (prune, clear) takes away: a whole entry, an entry's leftover candidates/, a stale temp
# or staging directory, a symlink, a killed import's staging dir or export's temp file.
RemovalWhat = Literal["entry", "candidates", "temp", "staging", "link", "leftover"]
BuildOutcome = Literal["built", "hit", "failed"]
RepairOutcome = Literal["repaired", "fine", "failed"]

# `ls --sort`: by op, size (biggest first) or age (least recently used first).
SortKey = Literal["op", "size", "age"]
SORT_KEYS: tuple[SortKey, ...] = get_args(SortKey)
# `export --format`: kcache's archive, or the blob torch's load_cache_artifacts() loads.
ExportFormat = Literal["tar", "torch-mega"]
EXPORT_FORMATS: tuple[ExportFormat, ...] = get_args(ExportFormat)

LAYOUT_NAMES = tuple(s.name for s in SHAPES)


def unknown_layout(name: object) -> str | None:
    """Why `name` (a layout as a manifest, a remote record or an image gave it) is none this kcache
    knows, with the name quoted and shown printable ("unknown layout '../../etc'"); None for a known one.
    Said before anything else uses the name."""
    if name in LAYOUT_NAMES:
        return None
    if name is None:
        return "no layout given"
    if not isinstance(name, str):
        return f"unknown layout {printable_line(repr(name))[:80]} (not a name)"
    shown = printable_line(name)
    return f"unknown layout '{shown[:80]}{'...' if len(shown) > 80 else ''}'"
KINDS = tuple(dict.fromkeys(k.kind for s in SHAPES for k in s.kinds))  # tilelang and triton share two
