"""The loader oracle's framework (DESIGN.md sections 2.8 and 10): damage cases, kcache's view, agreement.

A `Case` damages a copy of a real cache; the layout's probe (tests/loaders/probe_<layout>.py, run by the
loader's own venv) reports what the real loader does with the entry (its verdict, measured, never written
into the case), and `kcache_view` reports what kcache's `ls`, `verify`, `inspect`, `prune --broken --dry-run`
and a real `prune --broken --yes` (on a second copy) say about every entry. `agree` holds the two against
DESIGN section 2.8 and the four commands against each other.

Typical use (see tests/test_oracle_hidet.py):

    results = run_cases(cases, {"hidet": source_root}, tmp_path, {"hidet": python_for("hidet")})
    assert not [r.case.id for r in results if r.disagreements]
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
    deep_pruned: bool = False  # planned by `prune --broken --deep --dry-run` (every byte read, as verify)


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


def kcache(root: Path, *args: str, as_owner: bool = False, home: Path | None = None,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real CLI: in this process (its entry point, error handling included), or in a process of its
    own where it must run without root's file-mode override (`as_owner`, as root)."""
    extra = dict(NO_COLOR="1", KCACHE_DIR=str(root), **(env or {}))
    if home is not None:
        extra["HOME"] = str(home)
    if not owner_prefix(as_owner):
        return _in_process(["--json", *args], extra)
    cmd = [*owner_prefix(as_owner), sys.executable, "-c", "from kcache_cli.cli.app import main; main()"]
    return subprocess.run([*cmd, "--json", *args], capture_output=True, text=True, env={**os.environ, **extra},
                          timeout=300)


def _in_process(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """`kcache ARGS` through tests/conftest.py's runner, with `env` set; a PYTHONPATH there is put on sys.path
    for the call (where kcache looks for an installed compiler's metadata), as a process of its own would."""
    from conftest import run_kcache

    from kcache_cli.layouts import hidet

    extra = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep) if p]
    saved = list(sys.path)
    sys.path[:0] = extra
    hidet._INSTALLED.clear()  # the installed version is looked up once a process: this call is a new one
    try:
        run = run_kcache(*args, env=env)
    finally:
        sys.path[:] = saved
        hidet._INSTALLED.clear()
    return subprocess.CompletedProcess(args, run.exit_code, run.stdout, run.stderr)


def _json(done: subprocess.CompletedProcess, what: str):
    try:
        return json.loads(done.stdout)
    except ValueError:
        why = f"exit {done.returncode}, not JSON: {done.stdout!r} {done.stderr!r}"
        raise AssertionError(f"kcache {what}: {why}") from None


def _rel(root: Path, path: str) -> str:
    return os.path.relpath(path, root)


def kcache_view(root: Path, prune_root: Path, *, as_owner: bool = False, inspect: tuple[str, ...] | None = None,
                env: dict[str, str] | None = None) -> dict[str, EntryView]:
    """Every entry kcache lists in `root`, with what each command says; the real prune runs on `prune_root`
    (an identical copy), so the dry run and the real run are compared on the same damage. `inspect`: the
    entries (relative paths) to inspect, default all."""
    home = root.parent / "home"
    home.mkdir(exist_ok=True)

    def run(r: Path, *a: str) -> subprocess.CompletedProcess:
        return kcache(r, *a, as_owner=as_owner, home=home, env=env)

    listed = _json(run(root, "ls"), "ls")["entries"]
    problems = {_rel(root, p["path"]): p["status"] for p in _json(run(root, "verify"), "verify")["problems"]}
    dry_run = _json(run(root, "prune", "--broken", "--dry-run"), "prune -n")
    deep = {_rel(root, r.get("removed_path") or r["path"])
            for r in _json(run(root, "prune", "--broken", "--deep", "--dry-run"), "prune --deep -n")["removed"]}
    real = _json(run(prune_root, "prune", "--broken", "--yes"), "prune")
    # what was removed (an entry, or something inside one, e.g. hidet's candidates/: removed_path says)
    pruned = {_rel(prune_root, r.get("removed_path") or r["path"]) for r in real["removed"]}
    dry = {_rel(root, r.get("removed_path") or r["path"]) for r in dry_run["removed"]}
    view: dict[str, EntryView] = {}
    for e in listed:
        rel = _rel(root, e["path"])
        inspected = None
        if inspect is None or rel in inspect:
            shown = run(root, "inspect", rel)
            inspected = _json(shown, "inspect").get("status") if shown.stdout.strip() else None
        view[rel] = EntryView(
            ls=e["status"],
            reason=e["reason"],
            verify=problems.get(rel, "complete"),
            inspect=inspected,
            dry_pruned=rel in dry,
            pruned=rel in pruned or not os.path.lexists(prune_root / rel),
            deep_pruned=rel in deep,
        )
    return view


def _probe_cmd(layout: str, python: Path, as_owner: bool) -> list[str]:
    return [*owner_prefix(as_owner), str(python), str(HERE / f"probe_{layout}.py")]


def _verdict(line: str) -> dict | None:
    try:
        out = json.loads(line)
    except ValueError:
        return None
    return out if isinstance(out, dict) and "verdict" in out else None


def _checked(layout: str, out: dict) -> Verdict:
    if out["verdict"] not in VERDICTS:
        raise AssertionError(f"probe_{layout}: {out['verdict']}: {out.get('detail')}")
    return Verdict(out["verdict"], out.get("detail", ""))


def _probe_env(home: Path) -> dict[str, str]:
    return dict(os.environ, HOME=str(home), PYTHONDONTWRITEBYTECODE="1", PYTHONFAULTHANDLER="1")


def run_probe(layout: str, python: Path, root: Path, entry: str, source: Path, *, as_owner: bool = False) -> Verdict:
    """The layout's probe, run by the loader venv's python on `root` (which the probe may change):
    `probe_<layout>.py ROOT ENTRY SOURCE`, SOURCE being the undamaged tree (where the probe finds what the
    entry was made from, e.g. hidet's task.pickle); it prints {"verdict": ..., "detail": ...} last. A
    loader that kills its process (SIGBUS on a truncated lib.so) crashed, unless it was compiling."""
    done = subprocess.run([*_probe_cmd(layout, python, as_owner), str(root), entry, str(source)],
                          capture_output=True, text=True, env=_probe_env(root.parent / "probe-home"), timeout=900)
    found = [v for v in map(_verdict, done.stdout.splitlines()) if v]
    if found:
        return _checked(layout, found[-1])
    if done.returncode < 0:
        events = root.parent / "probe-events"
        seen = set(events.read_text().split()) if events.exists() else set()
        where = " ".join(ln.strip() for ln in done.stderr.splitlines() if "File " in ln)[:300]
        word = RECOMPILE if seen & {"build", "compiler"} else CRASH
        return Verdict(word, f"the process died of signal {-done.returncode} ({where})")
    raise AssertionError(f"probe_{layout} printed no verdict (exit {done.returncode}): {done.stderr[-2000:]}")


def run_probes(layout: str, python: Path, jobs: list[tuple[Path, str, Path]], *, as_owner: bool = False
               ) -> list[Verdict]:
    """Many cases through one probe process (`--batch`, probe_common.py). A case that kills the process
    runs again in a process of its own (run_probe), and the batch goes on after it."""
    out: list[Verdict] = []
    while len(out) < len(jobs):
        rest = jobs[len(out):]
        lines = "".join(json.dumps([str(r), e, str(s)]) + "\n" for r, e, s in rest)
        done = subprocess.run([*_probe_cmd(layout, python, as_owner), "--batch"], input=lines, capture_output=True,
                              text=True, env=_probe_env(rest[0][0].parent.parent / "probe-home"), timeout=3600)
        answered = {v["index"]: v for v in map(_verdict, done.stdout.splitlines()) if v and "index" in v}
        i = 0
        while i in answered:
            out.append(_checked(layout, answered[i]))
            i += 1
        if len(out) < len(jobs):
            out.append(run_probe(layout, python, *jobs[len(out)], as_owner=as_owner))
    return out


def installed_for_kcache(python: Path, package: str, where: Path) -> dict[str, str]:
    """The environment that makes kcache see the loader venv's `package` as installed (its real
    `<package>-<version>.dist-info`, linked into a directory put on PYTHONPATH), without importing it:
    kcache judges entries against the installed compiler's version, as a user's venv would have it."""
    found = subprocess.run([str(python), "-c", "import importlib.metadata as m, sys; "
                            f"print(m.distribution({package!r})._path)"], capture_output=True, text=True)
    dist = Path(found.stdout.strip())
    if found.returncode != 0 or not dist.is_dir():
        raise AssertionError(f"{package} is not installed in {python}: {found.stderr[-500:]}")
    where.mkdir(parents=True, exist_ok=True)
    if not (where / dist.name).exists():
        (where / dist.name).symlink_to(dist)
    return {"PYTHONPATH": str(where)}


def copy_root(src: Path, dst: Path) -> Path:
    """A copy keeping links as links and modes as they are (mode 000 is applied by the damage, after)."""
    shutil.copytree(src, dst, symlinks=True)
    return dst


def only_selected(cases: list[Case]) -> list[Case]:
    """The cases whose id holds KCACHE_ORACLE_ONLY (a substring, to run a few again), or all of them."""
    only = os.environ.get("KCACHE_ORACLE_ONLY")
    return [c for c in cases if only in c.id] if only else cases


COPIES = ("probe", "view", "prune")


def prepare(case: Case, source: Path, workdir: Path, copies: tuple[str, ...] = COPIES) -> tuple[Path, ...]:
    """Copies of `source` with the damage applied: for the probe, for the read-only commands and the
    dry run, and for the real prune (a replay of recorded verdicts needs no probe's copy)."""
    roots = []
    for what in copies:
        base = workdir / what
        base.mkdir(parents=True, exist_ok=True)
        root = copy_root(source, base / "cache")
        case.damage(root)
        roots.append(root)
    return tuple(roots)


def run_cases(cases: list[Case], sources: dict[str, Path], workdir: Path, pythons: dict[str, Path],
              kcache_env: dict[str, str] | None = None) -> list[CaseResult]:
    """Every case: damaged copies of `sources[case.source or case.layout]`, the probes in one batch per
    (venv, as_owner), then kcache's commands. `pythons` maps a venv name to its python."""
    prepared = [prepare(c, sources[c.source or c.layout], workdir / f"case{i:03d}") for i, c in enumerate(cases)]
    verdicts: dict[int, Verdict] = {}
    groups: dict[tuple[str, str, bool], list[int]] = {}
    for i, c in enumerate(cases):
        groups.setdefault((c.layout, c.venv or c.layout, c.as_owner), []).append(i)
    for (layout, venv_name, as_owner), idx in groups.items():
        jobs = [(prepared[i][0], cases[i].entry, sources[cases[i].source or cases[i].layout]) for i in idx]
        verdicts.update(zip(idx, run_probes(layout, pythons[venv_name], jobs, as_owner=as_owner)))
    return [CaseResult(c, verdicts[i], kcache_view(prepared[i][1], prepared[i][2], as_owner=c.as_owner,
                                                   inspect=(c.entry,), env=kcache_env))
            for i, c in enumerate(cases)]


def run_case(case: Case, source: Path, workdir: Path, python: Path,
             kcache_env: dict[str, str] | None = None) -> CaseResult:
    """One case on its own (three copies of `source`, the probe, kcache's commands)."""
    probe_root, view_root, prune_root = prepare(case, source, workdir)
    verdict = run_probe(case.layout, python, probe_root, case.entry, source, as_owner=case.as_owner)
    view = kcache_view(view_root, prune_root, as_owner=case.as_owner, inspect=(case.entry,), env=kcache_env)
    return CaseResult(case, verdict, view)


# ---------------------------------------------------------------------------------------------- judging


def agree(verdict: Verdict, view: EntryView | None, case: Case | None = None) -> list[str]:
    """Where kcache's view of the entry disagrees with the loader's verdict (DESIGN 2.8), or its commands
    with each other; empty when all agree."""
    blind = bool(case and case.ls_blind)
    if view is None:
        return [f"kcache does not list the entry; the loader: {verdict.verdict} ({verdict.detail[:160]})"]
    allowed = set(ALLOWED[verdict.verdict])
    if verdict.verdict in UNREADABLE_OK:
        allowed.add("unreadable")
    out: list[str] = []
    judged = {"verify": view.verify, "inspect": view.inspect} | ({} if blind else {"ls": view.ls})
    for command, status in judged.items():
        if status not in allowed:
            out.append(f"{command} says {status}; the loader: {verdict.verdict} ({verdict.detail[:160]})")
    if not blind and view.ls != view.inspect:
        out.append(f"ls says {view.ls}, inspect {view.inspect}")
    if view.verify != view.inspect:
        out.append(f"verify says {view.verify}, inspect {view.inspect}")
    if view.dry_pruned != view.pruned:
        out.append(f"prune --dry-run {'lists' if view.dry_pruned else 'keeps'} it, the real prune "
                   f"{'removes' if view.pruned else 'keeps'} it")
    used = verdict.verdict in (HIT, REUSE, UNUSED)
    if view.pruned and (used or view.ls not in BROKEN and not blind):
        out.append(f"prune --broken removes it ({view.ls}); the loader: {verdict.verdict}")
    if not view.pruned and not blind and view.ls in BROKEN:
        out.append(f"prune --broken keeps a {view.ls} entry")
    # --deep judges as verify does: it removes what verify calls broken, and never what the loader uses
    if view.deep_pruned and (used or view.verify not in BROKEN):
        out.append(f"prune --broken --deep removes it ({view.verify}); the loader: {verdict.verdict}")
    if not view.deep_pruned and view.verify in BROKEN:
        out.append(f"prune --broken --deep keeps a {view.verify} entry")
    return out


def record(result: CaseResult) -> dict:
    """One case's outcome as plain data (report.py makes docs/statuses.md's table from these)."""
    v = result.entry_view
    return {"layout": result.case.layout, "case": result.case.name, "entry": result.case.entry,
            "verdict": result.verdict.verdict, "detail": result.verdict.detail,
            "ls": v.ls if v else None, "verify": v.verify if v else None, "inspect": v.inspect if v else None,
            "reason": v.reason if v else None, "pruned": bool(v and v.pruned),
            "deep_pruned": bool(v and v.deep_pruned), "ls_blind": result.case.ls_blind,
            "as_owner": result.case.as_owner, "disagreements": result.disagreements}


def save_results(results: list[CaseResult], layout: str) -> None:
    """With KCACHE_ORACLE_RESULTS set (a directory), the records of a layout's run go to <layout>.json."""
    where = os.environ.get("KCACHE_ORACLE_RESULTS")
    if where:
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, f"{layout}.json"), "w") as f:
            json.dump([record(r) for r in results], f, indent=1)


def loses_used_entry(result: CaseResult) -> bool:
    """True when `prune --broken` removed (or `--deep` planned to remove) an entry the loader would have used."""
    v = result.entry_view
    return bool(v and (v.pruned or v.deep_pruned) and result.verdict.verdict in (HIT, REUSE, UNUSED))


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
