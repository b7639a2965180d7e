"""The loader oracle's framework (DESIGN.md sections 2.8 and 10): damage cases, kcache's view, agreement.

A `Case` damages a copy of a real cache; the layout's probe (tests/loaders/probe_<layout>.py, run by the
loader's own venv) reports what the real loader does with the entry (its verdict, measured, never written
into the case), and `kcache_view` reports what kcache's `ls`, `verify`, `inspect`, `prune --broken --dry-run`
and a real `prune --broken --yes` (on a second copy) say about every entry. `agree` holds the two against
DESIGN section 2.8 and the four commands against each other.

Typical use (see tests/test_oracle_hidet.py):

    result = run_case(case, source_root, tmp_path, python_for(case.venv or case.layout))
    assert not agree(result.verdict, result.view.get(case.entry), case)
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# What the loader does with an entry: the probe's words.
HIT = "hit"  # loaded without compiling, the entry as it is
REUSE = "reuse"  # rewrote some metadata and loaded the old binary without compiling
RECOMPILE = "recompile"  # missed and compiled again over the entry (or beside it)
CRASH = "crash"  # raised on the entry, or loaded something broken
MISS_FOREVER = "miss-forever"  # misses on every run and never replaces the entry
UNUSED = "unused"  # never looks this entry up again (another compiler version's key space)
VERDICTS = (HIT, REUSE, RECOMPILE, CRASH, MISS_FOREVER, UNUSED)

# DESIGN section 2.8: the statuses each verdict allows, and whether prune --broken may remove the entry.
ALLOWED: dict[str, frozenset[str]] = {
    HIT: frozenset({"complete"}),
    REUSE: frozenset({"complete"}),
    RECOMPILE: frozenset({"partial", "failed", "moved"}),
    CRASH: frozenset({"corrupt"}),
    MISS_FOREVER: frozenset({"corrupt"}),
    UNUSED: frozenset({"stale"}),
}
# Statuses that prune --broken removes; everything else (complete, stale, unreadable, building, ...) it keeps.
BROKEN = frozenset({"partial", "failed", "corrupt"})
# A damage kcache cannot read (mode 000 as the owner) may be reported as `unreadable` when the loader
# cannot use the entry either: kcache never removes it (DESIGN 2.8), which is safe.
UNREADABLE_OK = frozenset({RECOMPILE, CRASH, MISS_FOREVER})

Damage = Callable[[Path], None]


@dataclass(frozen=True)
class Case:
    """One damage to one entry of a real cache. `entry` is the entry's path relative to the root."""

    layout: str  # kcache's layout name: hidet, tilus, tilelang, triton
    name: str  # what was done, e.g. "lib.so empty"
    entry: str
    damage: Damage  # applied to a fresh copy of the whole root
    venv: str = ""  # the loader venv (tests/loaders/venvs.py); default: the layout's name
    as_owner: bool = False  # kcache and the probe run as the files' owner without root's override
    ls_blind: str = ""  # why the cheap `ls` cannot see this damage by design ("" when it must)
    source: str = ""  # which source tree the case damages (the test's choice of fixture)

    @property
    def id(self) -> str:
        return f"{self.layout}:{self.entry.rsplit('/', 2)[-2] if '/' in self.entry else self.entry}:{self.name}"


@dataclass(frozen=True)
class Verdict:
    verdict: str
    detail: str


@dataclass(frozen=True)
class EntryView:
    """What kcache's commands say about one entry. A status is None when the command did not list it."""

    ls: str | None
    reason: str | None
    verify: str | None
    inspect: str | None
    dry_pruned: bool
    pruned: bool


@dataclass(frozen=True)
class CaseResult:
    case: Case
    verdict: Verdict
    view: dict[str, EntryView] = field(default_factory=dict)

    @property
    def entry_view(self) -> EntryView | None:
        return self.view.get(self.case.entry)

    @property
    def disagreements(self) -> list[str]:
        return agree(self.verdict, self.entry_view, self.case)


# ---------------------------------------------------------------------------------------------- running


def owner_prefix(as_owner: bool) -> list[str]:
    """Run as root without the capabilities that override file modes: root is then just the owner."""
    if not as_owner or os.getuid() != 0:
        return []
    caps = "-dac_override,-dac_read_search,-fowner"
    return ["setpriv", "--bounding-set", caps, "--inh-caps", caps]


def kcache(root: Path, *args: str, as_owner: bool = False, home: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_COLOR="1", KCACHE_DIR=str(root))
    if home is not None:
        env["HOME"] = str(home)
    cmd = [*owner_prefix(as_owner), sys.executable, "-c", "from kcache_cli.cli.app import main; main()"]
    return subprocess.run([*cmd, "--json", *args], capture_output=True, text=True, env=env, timeout=300)


def _json(done: subprocess.CompletedProcess, what: str):
    try:
        return json.loads(done.stdout)
    except ValueError:
        why = f"exit {done.returncode}, not JSON: {done.stdout!r} {done.stderr!r}"
        raise AssertionError(f"kcache {what}: {why}") from None


def _rel(root: Path, path: str) -> str:
    return os.path.relpath(path, root)


def kcache_view(root: Path, prune_root: Path, *, as_owner: bool = False) -> dict[str, EntryView]:
    """Every entry kcache lists in `root`, with what each command says; the real prune runs on `prune_root`
    (an identical copy), so the dry run and the real run are compared on the same damage."""
    home = root.parent / "home"
    home.mkdir(exist_ok=True)
    run = lambda r, *a: kcache(r, *a, as_owner=as_owner, home=home)  # noqa: E731
    listed = _json(run(root, "ls"), "ls")
    problems = {_rel(root, p["path"]): p["status"] for p in _json(run(root, "verify"), "verify")["problems"]}
    dry = {_rel(root, r["path"]) for r in _json(run(root, "prune", "--broken", "--dry-run"), "prune -n")["removed"]}
    real = _json(run(prune_root, "prune", "--broken", "--yes"), "prune")
    pruned = {_rel(prune_root, r["path"]) for r in real["removed"]}
    view: dict[str, EntryView] = {}
    for e in listed:
        rel = _rel(root, e["path"])
        shown = run(root, "inspect", e["hash"])
        inspected = _json(shown, "inspect").get("status") if shown.stdout.strip() else None
        gone = not os.path.lexists(prune_root / rel)
        view[rel] = EntryView(
            ls=e["status"],
            reason=e["reason"],
            verify=problems.get(rel, "complete"),
            inspect=inspected,
            dry_pruned=rel in dry,
            pruned=rel in pruned or gone,
        )
    return view


def run_probe(layout: str, python: Path, root: Path, entry: str, source: Path, *, as_owner: bool = False) -> Verdict:
    """The layout's probe, run by the loader venv's python on `root` (which the probe may change):
    `probe_<layout>.py ROOT ENTRY SOURCE`, SOURCE being the undamaged tree (where the probe finds what the
    entry was made from, e.g. hidet's task.pickle); it prints {"verdict": ..., "detail": ...} last."""
    script = HERE / f"probe_{layout}.py"
    cmd = [*owner_prefix(as_owner), str(python), str(script), str(root), entry, str(source)]
    env = dict(os.environ, HOME=str(root.parent / "probe-home"), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise AssertionError(f"probe_{layout} printed no verdict (exit {done.returncode}): {done.stderr[-2000:]}")
    out = json.loads(lines[-1])
    if out["verdict"] not in VERDICTS:
        raise AssertionError(f"probe_{layout}: unknown verdict {out['verdict']!r}")
    return Verdict(out["verdict"], out.get("detail", ""))


def copy_root(src: Path, dst: Path) -> Path:
    """A copy keeping links as links and modes as they are (mode 000 is applied by the damage, after)."""
    shutil.copytree(src, dst, symlinks=True)
    return dst


def run_case(case: Case, source: Path, workdir: Path, python: Path) -> CaseResult:
    """Three copies of `source` with the damage applied: one for the probe, one for the read-only commands
    and the dry run, one for the real prune."""
    roots = []
    for what in ("probe", "view", "prune"):
        base = workdir / what
        base.mkdir(parents=True, exist_ok=True)
        root = copy_root(source, base / "cache")
        case.damage(root)
        roots.append(root)
    verdict = run_probe(case.layout, python, roots[0], case.entry, source, as_owner=case.as_owner)
    view = kcache_view(roots[1], roots[2], as_owner=case.as_owner)
    return CaseResult(case, verdict, view)


# ---------------------------------------------------------------------------------------------- judging


def agree(verdict: Verdict, view: EntryView | None, case: Case | None = None) -> list[str]:
    """Where kcache's view of the entry disagrees with the loader's verdict (DESIGN 2.8), or its commands
    with each other; empty when all agree."""
    blind = bool(case and case.ls_blind)
    if view is None:
        return [f"kcache does not list the entry; the loader says {verdict.verdict} ({verdict.detail})"]
    allowed = set(ALLOWED[verdict.verdict])
    if verdict.verdict in UNREADABLE_OK:
        allowed.add("unreadable")
    out: list[str] = []
    judged = {"verify": view.verify, "inspect": view.inspect} | ({} if blind else {"ls": view.ls})
    for command, status in judged.items():
        if status not in allowed:
            out.append(f"{command} says {status}, the loader {verdict.verdict}s ({verdict.detail})")
    if not blind and view.ls != view.inspect:
        out.append(f"ls says {view.ls}, inspect {view.inspect}")
    if view.verify != view.inspect:
        out.append(f"verify says {view.verify}, inspect {view.inspect}")
    if view.dry_pruned != view.pruned:
        out.append(f"prune --dry-run {'lists' if view.dry_pruned else 'keeps'} it, the real prune "
                   f"{'removes' if view.pruned else 'keeps'} it")
    used = verdict.verdict in (HIT, REUSE, UNUSED)
    if view.pruned and (used or view.ls not in BROKEN and not blind):
        out.append(f"prune --broken removes it ({view.ls}); the loader {verdict.verdict}s ({verdict.detail})")
    if not view.pruned and not blind and view.ls in BROKEN:
        out.append(f"prune --broken keeps a {view.ls} entry")
    return out


def loses_used_entry(result: CaseResult) -> bool:
    """True when `prune --broken` removed an entry the loader would have used."""
    v = result.entry_view
    return bool(v and v.pruned and result.verdict.verdict in (HIT, REUSE, UNUSED))


# ---------------------------------------------------------------------------------------------- damages


def _target(root: Path, rel: str) -> Path:
    return root / rel


def missing(rel: str) -> Damage:
    def go(root: Path) -> None:
        p = _target(root, rel)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)  # test fixture copy only
        else:
            p.unlink()
    return go


def empty(rel: str) -> Damage:
    return lambda root: _target(root, rel).write_bytes(b"")


def truncated(rel: str) -> Damage:
    def go(root: Path) -> None:
        p = _target(root, rel)
        data = p.read_bytes()
        p.write_bytes(data[: max(2, len(data) // 2)])
    return go


def garbage(rel: str) -> Damage:
    def go(root: Path) -> None:
        p = _target(root, rel)
        size = max(16, p.stat().st_size)
        p.write_bytes(bytes((i * 131 + 7) % 251 for i in range(size)))
    return go


def mode000(rel: str) -> Damage:
    return lambda root: os.chmod(_target(root, rel), 0)


def link_to_good(rel: str) -> Damage:
    """The file becomes a relative symlink to an identical copy kept beside the root (outside the entry)."""
    def go(root: Path) -> None:
        p = _target(root, rel)
        keep = root.parent / "kept" / rel
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, keep)
        p.unlink()
        p.symlink_to(os.path.relpath(keep, p.parent))
    return go


def dangling_link(rel: str) -> Damage:
    def go(root: Path) -> None:
        p = _target(root, rel)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)  # test fixture copy only
        elif os.path.lexists(p):
            p.unlink()
        p.symlink_to("does-not-exist")
    return go


def replace_text(rel: str, text: str) -> Damage:
    return lambda root: _target(root, rel).write_text(text)


def add_file(rel: str, data: bytes = b"junk\n") -> Damage:
    def go(root: Path) -> None:
        p = _target(root, rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return go


def one_mtime(when: float = 1_700_000_000.0) -> Damage:
    """Every file and directory gets the same mtime (a copy made without keeping times, then touched)."""
    def go(root: Path) -> None:
        for dirpath, dirnames, filenames in os.walk(root):
            for n in dirnames + filenames:
                os.utime(os.path.join(dirpath, n), (when, when), follow_symlinks=False)
        os.utime(root, (when, when))
    return go


def chain(*damages: Damage) -> Damage:
    def go(root: Path) -> None:
        for d in damages:
            d(root)
    return go


def files_of(entry_dir: Path) -> list[str]:
    """The regular files of an entry, relative to it, in a stable order (links and dirs left out)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(entry_dir):
        dirnames.sort()
        for n in sorted(filenames):
            p = Path(dirpath) / n
            if stat.S_ISREG(os.lstat(p).st_mode):
                out.append(str(p.relative_to(entry_dir)))
    return out
