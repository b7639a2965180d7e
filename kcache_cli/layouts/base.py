"""The interface every cache layout implements: `Layout`. One instance per layout (`LAYOUT` in
`kcache_cli/layouts/<name>.py`), found through the registry in `kcache_cli/layouts/__init__.py`.

Everything kcache does that depends on how a compiler lays out its cache goes through these methods:
scanning and judging entries (ls, stats, verify, inspect, log), what removing an entry means and what
it must wait for (prune, clear), what an archive may hold and how an imported entry is made to work
at its new place (export, import), and where `kcache build` publishes. The rest of kcache never names
a layout. Defaults here are right for a layout whose entries are self-contained directories; a layout
overrides what differs.

The methods fall into concerns, each a small typed `Protocol` below (`Shaped`, `EntryReader`,
`Dependencies`, `Removal`, `Transport`) for code that needs only one of them; `Layout` is the one base
class that satisfies them all with defaults. A layout is a plain subclass whose methods are real
overrides: the usual one is a one-line delegation to the module-level function of its layout module
(`def scan(self, ctx, flt): return scan(ctx, flt)`), so mypy checks every signature against `Layout`
and "find usages" leads from the hook to the code. Nothing is looked up by name.

Paths: `root` is the cache root; an entry's `path` is absolute and its `relpath` is '/'-separated
relative to the root. The scan hands out `Entry` records (kcache_cli.model); statuses are the words
of kcache_cli.model.terms.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Protocol

from kcache_cli.formats.gpu import runs_on_node
from kcache_cli.fs.locking import probe_locked
from kcache_cli.layouts import _facts, homes
from kcache_cli.layouts._facts import Facts
from kcache_cli.layouts.shapes import KindShape, LayoutShape, top_dirs

if TYPE_CHECKING:
    from kcache_cli.fs.entrydir import EntryDir
    from kcache_cli.fs.read import Anchor
    from kcache_cli.layouts.image_format import ImageFormat
    from kcache_cli.layouts.remote_format import RemoteFormat
    from kcache_cli.model.records import Details, Entry, EntryKey, Judgement, LogFile, ScanFilter, TreeUsage, Warn

# What a leftover is (`Leftover.what`): a kcache build's temp dir, or a compiler's staging write.
TEMP, STAGING = "temp", "staging"
STALE_AFTER = 3600.0  # leftovers untouched for an hour belong to no live writer


class Leftover(NamedTuple):
    """What an interrupted writer left: removable by prune once `STALE_AFTER` untouched, or where its writer
    held a kcache entry lock (`lock`: a kcache build's temp dir), as soon as that lock is free."""

    what: str  # TEMP or STAGING
    why: str  # shown by prune: "temp directory of an interrupted kcache build"
    lock: str | None  # relpath whose kcache entry lock its writer held (from before it made it), or None


class CompiledAgain(NamedTuple):
    """What the installed compiler does with the entries `kcache build` writes, where it compiles them again in
    place rather than loading them (Layout.build_compiled_again)."""

    by: str  # the installed compiler, with its version: "hidet 0.6.1"
    needs: str  # what it needs that kcache build does not write: "version.txt, meta.json and func_types.pickle"


class MegaPlace(NamedTuple):
    """Where torch's `populate_cache` writes one Mega-Cache artifact under a cache root: the file
    `<dir>/<name>`, which is an entry of `entry_kind` at `dir` (or, None, a file inside some entry)."""

    entry_kind: str | None
    dir: str  # '/'-separated, relative to the root
    name: str


class MegaFile(NamedTuple):
    """One file of a cache that a Mega-Cache blob carries: its artifact type, key and relpath."""

    type: str
    key: str
    relpath: str


HIT, MISS, UNKNOWN = "hit", "miss", "unknown"  # `kcache explain`'s verdicts


class Here(NamedTuple):  # not a frozen dataclass: a tenth of the cost to define
    """The environment that will run a model, as `kcache explain` compares an entry with it: the Python
    (`--python`), the versions of the distributions the layouts name (`Layout.packages`; None: not
    installed), the GPU arch (`--gpu`, else nvidia-smi's first GPU) and the environment switches
    (`Layout.env_switches`) set in kcache's own environment (the consumer's)."""

    python: str | None  # the interpreter's version, None when it could not be run
    executable: str | None
    versions: Mapping[str, str | None]
    gpu: str | None  # "sm_90a", "sm_80"; None: no GPU here (or none asked)
    gpu_source: str  # "--gpu", "nvidia-smi" or "none"
    env: Mapping[str, str]
    problem: str | None = None  # why the Python could not be asked


class Verdict(NamedTuple):
    """Whether the consumer here uses an entry: HIT (nothing it records differs from here), MISS (the
    factor, its recorded value and the value here) or UNKNOWN (why kcache cannot tell; never a guess)."""

    verdict: str
    why: str
    factor: str | None = None
    recorded: str | None = None
    here: str | None = None


def unasked(here: Here) -> Verdict | None:
    """UNKNOWN, saying why, when the Python here could not be asked (a --python that does not run): the
    first answer of every explain that goes by the packages installed there; else None."""
    return Verdict(UNKNOWN, f"the Python here could not be asked: {here.problem}") if here.problem else None


def not_installed(name: str, package: str, recorded: str | None = None, why: str = "") -> Verdict:
    """The MISS of an entry whose compiler (`name` as people write it; its distribution `package`) is not
    installed here: `recorded` the version the entry says it was made by, `why` what follows from it."""
    return Verdict(MISS, f"{name} is not installed here{why}", f"{package} version", recorded, "not installed")


@dataclass(frozen=True)
class Judging:
    """What a judgement is told besides the files of its entry (the `EntryDir` it reads through): how
    deep to read, and everything it would otherwise take from outside the entry. A judgement looks
    nothing up in module or per-thread state; the caller makes this with `Layout.judging`."""

    deep: bool = False  # every byte (verify, inspect, prune --broken, import), or names, sizes, links (ls)
    # The version of the layout's compiler in use, where it decides what the compiler does with an entry
    # (hidet's installed version: another one rewrites the metadata and reuses lib.so); "" when none is
    # installed where kcache runs, or when no status is shown.
    version: str = ""
    now: float = field(default_factory=time.time)  # the time leftovers' ages are measured at
    # Deep, for a caller that reads every byte of the entry itself right after (export): each file is
    # checked to be there, regular and readable by its mode; the reading is the caller's.
    caller_reads: bool = False
    # The fx graphs judged cheaply so far, by path, in one scan of an Inductor cache or one judgement of a
    # tree holding several Inductor entries (a vLLM unit's unpacked artifact): an aotautograd entry asks for
    # the graphs it names. None: each judgement on its own.
    graphs: dict | None = field(default=None, compare=False, repr=False)


class StaleLock(NamedTuple):
    """A lock file its compiler left that no live process holds (`Layout.stale_locks`)."""

    name: str  # relative to the entry: "lock"
    seen: os.stat_result  # its lstat when judged stale: removed only while it is still that file
    after: str = ""  # what its removal means for the compiler's processes already waiting on it, for --fix to say


class InnerLeftover(NamedTuple):
    """A directory (hidet's candidates/) or file (numba's temp file) inside an entry that prune may remove
    while the entry stays."""

    name: str  # relative to the entry: "candidates"
    why: str  # "auto-tuning leftovers (candidates/)"
    busy: str  # why it stays when the entry is being written: "candidates/ kept: hidet holds the entry's lock"
    what: str = "candidates"  # prune's word for it (`removed[].what`): "temp" for a writer's temp dir


class ScanContext(Protocol):
    """What a layout's scan is handed (kcache_cli.catalog.scan_context.ScanContext, or the index's subclass): the root,
    where warnings go, and the readers whose results the scan engine may record, index or spread over
    worker processes. A layout never imports the scan engine."""

    @property
    def root(self) -> Path: ...

    @property
    def warn(self) -> Warn: ...

    @property
    def statuses(self) -> bool: ...  # False when no status is shown (`log`): whole-cache lookups may be skipped

    def rel(self, path: str) -> str: ...

    def entry(self, *, path: str, usage: TreeUsage, **fields: Any) -> Entry: ...

    def link_entry(self, path: str, where: str = ..., **fields: Any) -> Entry: ...

    def listdir(self, path: str | Path, keep: Callable[[os.DirEntry], bool] | None = None) -> list[os.DirEntry]: ...

    def subdirs(self, path: str | Path, prefixes: tuple[str, ...] = ()) -> list[str]: ...  # real subdirectories, sorted

    def links(self, path: str | Path) -> list[str]: ...  # the symbolic links in a directory, sorted

    # func(ctx, job) of each job, in order; unfiltered(job): the job without its op and target filter, and
    # that filter (a ScanFilter)
    def map_entries(self, func: Any, jobs: list, unfiltered: Any = None) -> Iterator[Any]: ...

    @property
    def anchor(self) -> Anchor | None: ...  # the root held open, that entry directories are opened from

    def open_entry(self, path: str) -> EntryDir: ...  # the entry directory held open from the root

    def read_dir(self, where: str | EntryDir) -> tuple[dict[str, int] | None, TreeUsage, dict[str, float]]: ...


# ---- the concerns: what each part of kcache asks of a layout ------------------------------------------
# Each is satisfied by `Layout` (so by every layout: mypy holds a subclass's overrides to `Layout`'s
# signatures, and tests/test_layouts.py compares every registered layout's signatures with these).


class Shaped(Protocol):
    """Names and paths: the registry, `--layout`/`--kind`, the archive's path checks, `dir --all`."""

    shape: LayoutShape
    hidden_names: bool

    @property
    def name(self) -> str: ...

    @property
    def kinds(self) -> tuple[str, ...]: ...

    def kind_shape(self, kind: str) -> KindShape | None: ...

    def entry_path_problem(self, kind: str, relpath: str) -> str | None: ...

    def key_problem(self, kind: str, relpath: str, key: EntryKey) -> str | None: ...

    def default_root(self) -> tuple[Path, str] | None: ...

    def default_roots(self) -> list[tuple[Path, str]]: ...

    def shown_path(self, root: Path) -> Path: ...


class EntryReader(Protocol):
    """Reading entries: detection, the scan, one entry's judgement and details, its compile log."""

    def detect(self, root: Path) -> bool: ...

    def scan(self, ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]: ...

    def stray_links(self, ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]: ...

    def judging(self, deep: bool = False, *, statuses: bool = True, caller_reads: bool = False) -> Judging: ...

    def judge(self, d: EntryDir, kind: str, jc: Judging) -> Judgement: ...

    def nested_entry(self, ctx: ScanContext, d: EntryDir, path: str) -> Entry | None: ...

    def describe(self, root: Path, entry: Entry) -> Details: ...

    def log_files(self, entry: Entry) -> list[LogFile]: ...

    def no_log(self, entry: Entry) -> str: ...

    def build_reuses(self, path: str, judgement: Judgement) -> bool: ...

    def build_replacing(self, path: str) -> str | None: ...

    def build_compiled_again(self) -> CompiledAgain | None: ...

    def nested(self, root: Path) -> list[tuple[str, Path]]: ...


class Dependencies(Protocol):
    """Entries that use other entries: export brings providers along, removal keeps or takes users."""

    provider_kinds: frozenset[str]

    def uses(self, root: Path, entry: Entry) -> list[str]: ...

    def users(self, root: Path, providers: list[str]) -> dict[str, list[str]]: ...

    def users_break(self, kind: str) -> bool: ...

    def use_words(self, kind: str) -> tuple[str, str]: ...

    def link_target(self, kind: str, resolved: list[str]) -> str | None: ...


class Removal(Protocol):
    """What prune and clear may remove, what they wait for, and what a removal leaves."""

    writer_locks: tuple[str, ...]

    def shape_problem(self, relpath: str, kind: str, names: frozenset[str] | None, root: Path | None = None
                      ) -> str | None: ...

    def busy(self, entry_path: str) -> str | None: ...

    def in_use(self, entry: Entry) -> str | None: ...

    def stale_locks(self, d: EntryDir, jc: Judging) -> list[StaleLock]: ...

    def leftover(self, entry: Entry) -> Leftover | None: ...

    def leftover_parts(self, entry: Entry, warn: Warn) -> list[Entry]: ...

    def inner_leftovers(self, entry: Entry) -> list[InnerLeftover]: ...

    def empty_parent_levels(self, kind: str) -> int: ...


class Transport(Protocol):
    """Moving entries between machines and places: export's facts, import's relocation, the remote's keys."""

    fact_files: tuple[str, ...]
    binary_kinds: frozenset[str]
    mega_types: frozenset[str]
    packages: tuple[str, ...]
    env_switches: tuple[str, ...]
    relocates: bool

    def facts(self, entry: Entry, small: Mapping[str, bytes], names: Iterable[str]) -> Facts: ...

    def compile_command(self, small: Mapping[str, bytes]) -> str | None: ...

    def options_arch(self, small: Mapping[str, bytes]) -> str | None: ...

    def platform(self, entry: Entry) -> str | None: ...

    def relocate(self, staged: str, final: str, root: Path) -> None: ...

    def relocation_problem(self, entry: Entry) -> str | None: ...

    def records_paths(self, kind: str) -> bool: ...

    def landed_elsewhere(self, path: str) -> str | None: ...

    def remote_format(self) -> RemoteFormat | None: ...

    def image_format(self) -> ImageFormat: ...

    def mega_place(self, kind: str, key: str, content: bytes) -> MegaPlace | str | None: ...

    def mega_artifacts(self, root: Path) -> list[MegaFile]: ...

    def explain(self, root: Path, entry: Entry, here: Here) -> Verdict: ...

    def explain_mega(self, kind: str, recorded: Mapping[str, object], here: Here) -> Verdict: ...

    def explain_record(self, record: Mapping[str, object], here: Here) -> Verdict: ...

    def runs_on(self, arch: str, gpus: Iterable[str]) -> bool: ...


CONCERNS: tuple[type, ...] = (Shaped, EntryReader, Dependencies, Removal, Transport)


class Layout:
    """One cache layout: the defaults of every concern above. Subclasses set `shape` and override `scan`,
    `judge` and `describe` (and `log_files` when the compiler keeps a log); the other methods have defaults
    for self-contained entries with no links between them. An override keeps the signature given here."""

    shape: LayoutShape  # from kcache_cli.layouts.shapes: the name and every kind's path
    # Whether an entry's own name may start with "." (its shape then says which): an archive takes no other
    # hidden path part (a temp, staging or state directory).
    hidden_names: bool = False
    # Lock files inside an entry that its compiler holds while it writes or reads the entry: removing
    # the entry takes each non-blocking and skips the entry when one is held.
    writer_locks: tuple[str, ...] = ()
    # Kinds that other entries use (tilus programs, tilelang binaries): removed after their users,
    # published before them on import, kept while a user stays.
    provider_kinds: frozenset[str] = frozenset()
    # Files (relative to the entry) whose bytes export reads to find the compiler, arch and platform.
    fact_files: tuple[str, ...] = ("kcache.json",)
    # Kinds whose entries hold nothing but compiled binaries: `export --sources-only` leaves them out.
    binary_kinds: frozenset[str] = frozenset()
    # The torch Mega-Cache artifact types (`CacheArtifact.type()`) whose files this layout holds.
    mega_types: frozenset[str] = frozenset()
    # Distributions whose installed versions decide whether the consumer uses an entry (`kcache explain`),
    # and the environment variables that change its keys (a name ending in "*" is a prefix).
    packages: tuple[str, ...] = ()
    env_switches: tuple[str, ...] = ()
    # Whether `relocate` makes an entry that records where it was made whole at another path (Triton's
    # group files, vLLM's handles): export then ships a `moved` entry as complete, import rewriting it.
    # A layout whose moved entries kcache cannot mend (torch extensions) keeps False.
    relocates: bool = False

    # ---- name, kinds, paths -------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The layout's name, as `ls --json` and `--layout` spell it."""
        return self.shape.name

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of entries this layout holds, in listing order."""
        return tuple(k.kind for k in self.shape.kinds)

    def kind_shape(self, kind: str) -> KindShape | None:
        """The path shape of `kind`, or None when this layout has no such kind."""
        return self.shape.kind(kind)

    def detect(self, root: Path) -> bool:
        """Does `root` hold this layout? The default looks at the root's top-level directory names only;
        layouts that delete or write ask for evidence (their own files under those names)."""
        try:
            tops = top_dirs(root)
        except OSError:
            return False
        return self.shape.held_by(os.fspath(root), tops)

    def entry_path_problem(self, kind: str, relpath: str) -> str | None:
        """Why `relpath` is not where an entry of `kind` lives in this layout, or None. `relpath` has
        been checked to be a safe relative path already (the archive's rules)."""
        k = self.kind_shape(kind)
        if k is None or not k.fits(relpath):
            return f"{relpath!r} is not where a {self.name} {kind} entry lives"
        return None

    def shape_problem(self, relpath: str, kind: str, names: frozenset[str] | None, root: Path | None = None
                      ) -> str | None:
        """Why the directory at `relpath` is not exactly an entry of `kind` (its path, and when `names` is
        given, the files in it: at least one this layout's compiler writes), or None. Prune and clear
        remove only what has an entry's exact shape (positive evidence); leftovers (temp, staging) are
        judged by their path. Default: the path shape alone."""
        return self.entry_path_problem(kind, relpath)

    def key_problem(self, kind: str, relpath: str, key: EntryKey) -> str | None:
        """Why the key fields an archive record gives (hash, space, op) disagree with its path, or None."""
        k = self.kind_shape(kind)
        got = k.match(relpath) if k else None
        if got is None:
            return self.entry_path_problem(kind, relpath)
        for name in ("hash", "space", "op"):
            if got[name] is not None and getattr(key, name) != got[name]:
                return f"its {name} disagrees with its path"
        return None

    # ---- scanning: the cheap judgement -----------------------------------------------------------

    def scan(self, ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]:
        """Every entry of this layout under `ctx.root` that the names in `flt` allow (ops, spaces,
        targets, hash prefixes: skip whole directories rather than filter afterwards), judged cheaply
        (names, sizes, links; contents only where something changed since the entry was completed).
        Leftovers (temp, staging) are entries too, with their status. Unreadable directories are
        `ctx.warn`ings, never exceptions. Build entries with `ctx.entry(...)`; big fan-outs of entry
        directories can be read in worker processes with `ctx.map_entries`."""
        raise NotImplementedError

    def stray_links(self, ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]:
        """Symlinks where a directory of this layout belongs (a space, an op, an entry): the scan never
        follows them; prune --broken and clear remove them as links (`ctx.link_entry`)."""
        return iter(())

    # ---- judging one entry -------------------------------------------------------------------------

    def judging(self, deep: bool = False, *, statuses: bool = True, caller_reads: bool = False) -> Judging:
        """The context this layout's judgements are handed: `deep` or cheap, and what the layout's compiler
        in use is (looked up here, once per command, when `statuses` are shown)."""
        return Judging(deep, caller_reads=caller_reads)

    def judge(self, d: EntryDir, kind: str, jc: Judging) -> Judgement:
        """The one judgement of the entry of `kind` whose directory `d` holds open, read from disk now
        through `d` (by name: no path is resolved again, no link on the way followed): cheap (names,
        sizes, links: what ls shows) or `jc.deep` (every byte: what verify, inspect, prune --broken and
        import's "already present" go by). The scan, delete's re-check before removing a broken entry
        and the archive all call this, so they cannot disagree on the same files. Everything else it
        goes by is in `jc`."""
        raise NotImplementedError

    def nested_entry(self, ctx: ScanContext, d: EntryDir, path: str) -> Entry | None:
        """The entry at `path`, held open as `d`, as this layout's own scan makes it: its judgement, and
        the names, sizes and index key (recorded in `ctx.recording`, catalog/index.py) that one listing
        of it gives. For a layout whose caches another holds nested (Inductor's triton/<device>/), which
        then names the entry as its own. None: the layout makes none this way."""
        return None

    def build_reuses(self, path: str, judgement: Judgement) -> bool:
        """Whether `kcache build` takes the entry at `path`, judged `judgement`, as a cache hit: by default
        when it is complete (hidet's layout also takes its own builds, which hidet 0.6 compiles again)."""
        return judgement.status == "complete"

    def build_replacing(self, path: str) -> str | None:
        """What to tell people when `kcache build --force` replaces the entry at `path` (one the layout's own
        compiler made, that kcache's build may serve less well), or None."""
        return None

    def build_compiled_again(self) -> CompiledAgain | None:
        """Whether the compiler installed here compiles the entries `kcache build` writes again in place
        rather than loading them (hidet 0.6 and later: they lack its metadata files), and what it needs; None
        where it loads them as built (or none is installed)."""
        return None

    def describe(self, root: Path, entry: Entry) -> Details:
        """Everything about one entry after the deep checks that read every byte (inspect, verify):
        problems, files, task and tensors, compile command and output, binaries, layout facts."""
        raise NotImplementedError

    def log_files(self, entry: Entry) -> list[LogFile]:
        """The entry's compile log files, in reading order ([] when the compiler keeps none)."""
        return []

    def no_log(self, entry: Entry) -> str:
        """What `kcache log` says (as its error) when `log_files` finds none: a layout whose compiler
        never keeps a log says where to look instead."""
        return f"no compile log recorded for {self.name} {entry.kind} {entry.hash}"

    def busy(self, entry_path: str) -> str | None:
        """Why the entry's own writer is using it right now (one of `writer_locks` is held), or None."""
        for name in self.writer_locks:
            if probe_locked(os.path.join(entry_path, name)):
                return f"{self.name} holds the entry's {name}"
        return None

    def in_use(self, entry: Entry) -> str | None:
        """Why the entry must not be removed right now although no lock says so (the CUDA driver's JIT
        cache while a process has the driver loaded), or None. Asked by every removal just before it acts."""
        return None

    def stale_locks(self, d: EntryDir, jc: Judging) -> list[StaleLock]:
        """Lock files in the entry `d` holds open (names relative to it) that its compiler left and no
        live process holds, which make the compiler wait for ever (torch's FileBaton `lock`): `verify`
        reports the entry, `verify --fix` removes them. Default: none (flock files block nobody)."""
        return []

    def nested(self, root: Path) -> list[tuple[str, Path]]:
        """Caches of other layouts that lie inside this layout's entries under `root` (Inductor's
        triton/<device>/), as (layout, path): `dir --all` shows them with this root, never as roots."""
        return []

    # ---- dependencies between entries ------------------------------------------------------------

    def uses(self, root: Path, entry: Entry) -> list[str]:
        """Relpaths of the entries `entry` needs to work (a tilus script's programs). Export brings
        them along. Default: none."""
        return []

    def users(self, root: Path, providers: list[str]) -> dict[str, list[str]]:
        """For each provider entry path (of a `provider_kinds` kind), the paths of the entries that use
        it (a tilus program's scripts, a tilelang binary's kernels). Default: nobody uses anything."""
        return {p: [] for p in providers}

    def users_break(self, kind: str) -> bool:
        """Whether removing a broken entry of this provider kind breaks its users, so that they go with
        it (tilus scripts link to their programs; tilelang kernels embed their binaries and do not)."""
        return False

    def use_words(self, kind: str) -> tuple[str, str]:
        """How an entry uses a provider of `kind`, both ways, for prune's and clear's reasons: (what a
        user does to it, what is done to it by its users): tilus ("links to", "linked from")."""
        return "uses", "used by"

    def link_target(self, kind: str, resolved: list[str]) -> str | None:
        """For a symlink inside an entry of `kind` whose target, resolved from the root, is `resolved`
        (path components) and lies outside the entry: the relpath of the entry it may point to (then it
        must be in the archive or in the cache), or None when such a link is not allowed."""
        return None

    # ---- leftovers and removal ---------------------------------------------------------------------

    def leftover(self, entry: Entry) -> Leftover | None:
        """What `entry` is if it is no entry but what an interrupted writer left (a kcache temp dir,
        a staging dir), or None."""
        return None

    def leftover_parts(self, entry: Entry, warn: Warn) -> list[Entry]:
        """A leftover that holds several writers' leftovers, one entry each (tilelang's
        .staging/cuda-binaries/); default: the leftover itself."""
        return [entry]

    def inner_leftovers(self, entry: Entry) -> list[InnerLeftover]:
        """Directories inside an entry that stays which prune may remove (hidet's candidates/)."""
        return []

    def empty_parent_levels(self, kind: str) -> int:
        """How many directories above an entry of `kind` are removed when a removal leaves them empty
        (hidet's op and space directories: 2). Containers a compiler recreates between its own mkdir
        and rename must not be removed (0)."""
        return 0

    # ---- where ---------------------------------------------------------------------------------------

    def default_root(self) -> tuple[Path, str] | None:
        """Where this layout's compiler keeps its cache on this machine when nothing says otherwise
        (`kcache dir --all`), with the rule that chose it; None when there is no such place. The rules
        live in the light module layouts/homes.py (kcache's own default root is one of them)."""
        home = homes.default_root(self.name)
        return (home.path, home.reason) if home is not None else None

    def default_roots(self) -> list[tuple[Path, str]]:
        """Every place this layout's compiler keeps a cache on this machine (`dir --all`, kcache's default
        scope): default_root, or several where the compiler keeps one per Python or build (torch's
        extensions folders), each a root."""
        return [(home.path, home.reason) for home in homes.default_roots(self.name)]

    def shown_path(self, root: Path) -> Path:
        """The directory people know as this layout's cache at `root` (`dir --all`'s path): the root,
        unless the layout lists its cache from the directory holding it."""
        return root

    # ---- export and import -------------------------------------------------------------------------

    def facts(self, entry: Entry, small: Mapping[str, bytes], names: Iterable[str]) -> Facts:
        """(compiler, arch, platform) for an export manifest: from what kcache recorded (kcache.json),
        else the compile command (`compile_command`), else `options_arch`, else the archs inside the
        entry's binaries. `small` holds the bytes of the entry's `fact_files` that exist."""
        return _facts.entry_facts(self, entry, small, names)

    def compile_command(self, small: Mapping[str, bytes]) -> str | None:
        """The compile command from the entry's `fact_files`, or None."""
        return None

    def options_arch(self, small: Mapping[str, bytes]) -> str | None:
        """The arch the entry's recorded options name, or None."""
        return None

    def platform(self, entry: Entry) -> str | None:
        """The platform an entry was built for when its path says so (tilelang's <platform>)."""
        return None

    def relocate(self, staged: str, final: str, root: Path) -> None:
        """Called on import for each entry before it is published: `staged` is the entry's directory as
        extracted, `final` the absolute path it is about to be renamed to under `root`. A layout whose
        files hold absolute paths (Triton's group files) rewrites them here to point under `final`.
        Must write atomically (temp file + rename) and never outside `staged`. `verify --fix` calls it
        with `staged == final == entry.path` for an entry that `relocation_problem` reports. Default:
        nothing."""

    def remote_format(self) -> RemoteFormat | None:
        """How this layout's entries are stored on a remote (kcache_cli/layouts/remote_format.py): None for
        kcache's own keys; a layout whose compiler has its own remote cache (Triton's Redis backend)
        returns a format that keeps the files under that tool's keys, so both share one store."""
        return None

    def image_format(self) -> ImageFormat:
        """How this layout's entries sit in an OCI image (kcache_cli/layouts/image_format.py): kcache's
        own shape under io.<layout>.cache/; Triton and vLLM return MCV's."""
        from kcache_cli.layouts.image_format import ImageFormat

        return ImageFormat(self.name)

    def relocation_problem(self, entry: Entry) -> str | None:
        """Why the paths the entry records about itself point elsewhere than where it lies (a cache moved
        or copied by hand), or None. `verify` reports it as a problem. Default: entries record none."""
        return None

    def records_paths(self, kind: str) -> bool:
        """Whether a `kind` entry records absolute paths of where it lies, which `relocate` rewrites when it
        is imported or pulled (and which a copy made otherwise keeps). Default: `relocates`."""
        return self.relocates

    def landed_elsewhere(self, path: str) -> str | None:
        """Called by import (and pull) after publishing an entry at `path`, for a layout that does not
        relocate: why the compiler will not use it as it is there because it was made at another path and
        kcache cannot rewrite what records that (a torch extension: torch builds it again), or None.
        Default: None."""
        return None

    def mega_place(self, kind: str, key: str, content: bytes) -> MegaPlace | str | None:
        """Where torch's Mega-Cache load (`populate_cache`) writes the artifact of type `kind`, or why it
        cannot be placed safely (a key that would leave the root), or None: this layout holds no such
        artifact (kcache_cli/formats/megacache.py reads the blob; its contents are never unpickled)."""
        return None

    def mega_artifacts(self, root: Path) -> list[MegaFile]:
        """The files under `root` a Mega-Cache blob carries, as `save_cache_artifacts` records them."""
        return []

    def explain(self, root: Path, entry: Entry, here: Here) -> Verdict:
        """Whether the consumer `here` uses `entry` for the work it was made for: from what the entry
        records (compiler versions, key shape, target, options) against `here`. Never HIT by default."""
        return Verdict(UNKNOWN, f"kcache does not know what {self.name}'s consumer compares before it uses an entry")

    def explain_mega(self, kind: str, recorded: Mapping[str, object], here: Here) -> Verdict:
        """`explain` for a Mega-Cache blob's artifact of type `kind` (one of `mega_types`), from what the
        blob's sidecar manifest `recorded` (torch version, device)."""
        return Verdict(UNKNOWN, "kcache does not know what decides a hit for this artifact")

    def explain_record(self, record: Mapping[str, object], here: Here) -> Verdict:
        """`explain` for an entry of an archive, from its manifest record (compiler, arch, status, relpath)."""
        return Verdict(UNKNOWN, f"kcache does not judge {self.name} entries from what an archive or image records")

    def runs_on(self, arch: str, gpus: Iterable[str]) -> bool:
        """Whether this layout's consumer, on a node whose GPUs are the arch words `gpus` (sm_86, gfx90a),
        uses code built for `arch` (`cpu` anywhere): the rule a pull keeps or refuses entries by. Default:
        a binary the CUDA driver loads (SASS on the same major and a newer minor, `sm_90a` only on 9.0, PTX
        on anything newer). A consumer that keys its cache by the exact GPU (Triton) says so here, and its
        `explain` goes by the same rule."""
        return runs_on_node(arch, gpus)


if TYPE_CHECKING:  # mypy's proof that the defaults, and so every subclass, satisfy each concern
    _CONCERNS: tuple[Shaped, EntryReader, Dependencies, Removal, Transport] = (
        Layout(), Layout(), Layout(), Layout(), Layout())
