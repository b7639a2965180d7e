"""Roots kcache finds by itself are vetted once and held (DESIGN §1.1): a co-user's
`<tmp>/torchinductor_<user>` (their own directory, a link, or a swap between the scan and the removal)
is never listed, budgeted, read into an archive or removed from by root's kcache.

The second user is uid 65534; as these tests run as root, its directories are made by chown (what
matters is who owns them). In-process: a swap between the scan and the removal is made by wrapping the
executor, deterministically."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest
import test_shared_attacks as sa
from conftest import FIXTURES, copy_tree, patch_everywhere, run_kcache
from test_all_caches import inductor_graph

from kcache_cli.fs import read as fsread
from kcache_cli.layouts import homes
from kcache_cli.ops import delete

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another user's directories")

ATTACKER = 65534


def snapshot(path: Path) -> dict:
    """Every name under `path` with its type, owner, size, mtime and link target (or bytes)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            body = os.readlink(p) if stat.S_ISLNK(st.st_mode) else \
                Path(p).read_bytes() if stat.S_ISREG(st.st_mode) else None
            out[os.path.relpath(p, path)] = (st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns, body)
    return out


def chown_tree(path: Path, uid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(path):
        os.lchown(dirpath, uid, uid)
        for n in dirnames + filenames:
            os.lchown(os.path.join(dirpath, n), uid, uid)


@pytest.fixture
def scene(tmp_path) -> dict[str, Path]:
    """Root's own hidet cache in ~/.cache/hidet; a sticky world-writable temp dir (like /tmp) where torch's
    default Inductor root of root, `torchinductor_<user>`, is to be planted; an inductor cache elsewhere
    (the victim: another user's files, a link's target)."""
    tmp = Path(os.environ["TMPDIR"])
    os.chmod(tmp, 0o1777)
    hidet = Path(os.environ["HOME"]) / ".cache" / "hidet"
    copy_tree(FIXTURES / "hidet", hidet)
    victim = tmp_path / "victim" / "inductor"
    for i in range(3):
        inductor_graph(victim, {"graph": i})
    return {"tmp": tmp, "hidet": hidet, "victim": victim, "planted": homes.inductor().path}


def plant_dir(scene) -> Path:
    """The co-user's own directory at root's torch default, with inductor entries in it."""
    planted = scene["planted"]
    copy_tree(scene["victim"], planted)
    chown_tree(planted, ATTACKER)
    return planted


def plant_link(scene) -> Path:
    """The co-user's symlink at root's torch default, to the victim's inductor cache."""
    planted = scene["planted"]
    planted.symlink_to(scene["victim"])
    os.lchown(planted, ATTACKER, ATTACKER)
    return planted


def layouts_of(run) -> set[str]:
    return {e["layout"] for e in json.loads(run.stdout)["entries"]}


def warned_once(run, planted: Path) -> None:
    lines = [line for line in run.stderr.splitlines() if str(planted) in line and "skipping" in line]
    assert len(lines) == 1, run.stderr
    assert "--cache-dir" in lines[0] and f"KCACHE_SAFE_DIRECTORY={planted}" in lines[0], lines[0]


@pytest.mark.parametrize("plant", [plant_dir, plant_link])
def test_a_planted_torch_root_is_not_listed(scene, plant):
    planted = plant(scene)
    before = snapshot(scene["victim"])
    run = run_kcache("dir", "--all", "--json")
    assert run.exit_code == 0, run.stderr
    assert [r["cache"] for r in json.loads(run.stdout)["caches"] if r["cache"] == "inductor"] == []
    warned_once(run, planted)
    why = "symlink" if plant is plant_link else "uid 65534"
    assert why in run.stderr
    run = run_kcache("ls", "--json")
    assert run.exit_code == 0, run.stderr
    assert layouts_of(run) == {"hidet"}
    warned_once(run, planted)
    assert snapshot(scene["victim"]) == before


@pytest.mark.parametrize("plant", [plant_dir, plant_link])
def test_a_planted_torch_root_is_neither_budgeted_nor_cleared_nor_exported(scene, plant, tmp_path):
    planted = plant(scene)
    seen = scene["victim"] if plant is plant_link else planted
    before = snapshot(seen)
    arc = tmp_path / "out.tar"
    run = run_kcache("export", str(arc))
    assert run.exit_code == 0, run.stderr
    with tarfile.open(arc) as tar:
        names = tar.getnames()
    assert any("ops/" in n for n in names) and not any("fxgraph" in n for n in names), names
    assert run_kcache("config", "set", "max-size", "1B").exit_code == 0
    run = run_kcache("prune", "--yes", "--json")
    assert run.exit_code == 0, run.stderr
    gone = [r for doc in _docs(run.stdout) for r in doc["removed"]]
    assert gone and {r["layout"] for r in gone} == {"hidet"}, gone
    assert snapshot(seen) == before
    copy_tree(FIXTURES / "hidet", scene["hidet"] / "again")  # something for clear to take
    run = run_kcache("clear", "--all", "--yes", "--json")
    assert run.exit_code == 0, run.stderr
    assert all(r["layout"] != "inductor" for doc in _docs(run.stdout) for r in doc["removed"])
    assert snapshot(seen) == before
    assert not (scene["victim"] / ".kcache").exists()


def test_the_opt_ins_use_it(scene):
    planted = plant_dir(scene)
    run = run_kcache("ls", "--json", env={"KCACHE_SAFE_DIRECTORY": str(planted)})
    assert run.exit_code == 0 and layouts_of(run) == {"hidet", "inductor"}, run.stderr
    run = run_kcache("--cache-dir", str(planted), "ls", "--json")
    assert run.exit_code == 0 and layouts_of(run) == {"inductor"}, run.stderr


def test_an_explicit_link_is_named(scene):
    link = scene["tmp"].parent / "hidet-link"
    link.symlink_to(scene["hidet"])
    run = run_kcache("--cache-dir", str(link), "ls", "--json")
    assert run.exit_code == 0 and layouts_of(run) == {"hidet"}, run.stderr
    assert f"{link} (--cache-dir) is a symlink to {scene['hidet']}" in run.stderr


def test_root_owned_and_own_roots_in_tmp_are_used(scene):
    own = scene["planted"]
    copy_tree(scene["victim"], own)
    run = run_kcache("ls", "--json")
    assert run.exit_code == 0 and layouts_of(run) == {"hidet", "inductor"}, run.stderr
    assert "skipping" not in run.stderr


def _docs(stdout: str) -> list[dict]:
    doc = json.loads(stdout)
    return doc["caches"] if "caches" in doc else [doc]


# ---- a swap between the scan and the removal --------------------------------------------------------------

def _swap_before_removal(monkeypatch, swap) -> None:
    real = delete.DeletePlan.execute

    def execute(self, *args, **kwargs):
        swap(Path(self.root))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(delete.DeletePlan, "execute", execute)


@pytest.mark.parametrize("command", [("prune", "--yes", "--json"), ("clear", "--all", "--yes", "--json")])
def test_a_root_swapped_for_a_link_after_the_scan_redirects_nothing(scene, monkeypatch, command):
    """Root's own torch cache, renamed away and replaced by a link to the victim (with entries of the same
    names) between the scan and the removal: the victim is untouched; what goes, goes from the directory
    scanned (held from the start)."""
    own = scene["planted"]
    copy_tree(scene["victim"], own)
    before = snapshot(scene["victim"])
    assert run_kcache("config", "set", "max-size", "1B").exit_code == 0
    moved = own.with_name("moved-away")

    def swap(root: Path) -> None:
        if root == own:
            own.rename(moved)
            own.symlink_to(scene["victim"])

    _swap_before_removal(monkeypatch, swap)
    run = run_kcache(*command)
    assert run.exit_code == 0, run.stderr
    assert snapshot(scene["victim"]) == before
    assert not (scene["victim"] / ".kcache").exists()
    assert not list(moved.glob("fxgraph/*/*")), "the held directory's entries went"


def test_an_entry_replaced_after_the_scan_is_skipped(scene, monkeypatch):
    """An entry swapped for another directory of the same name (mtime older than the scan's) between the
    scan and the removal: skipped and reported, for a budget prune (not only --broken)."""
    root = scene["hidet"]
    swapped: list[str] = []

    def swap(where: Path) -> None:
        if where != root:
            return
        for e in sorted(root.glob("ops/*/*/*"))[:1]:
            e.rename(e.with_name(e.name + ".away"))
            e.mkdir()
            (e / "decoy").write_text("not what was scanned")
            os.utime(e, (1, 1))
            swapped.append(str(e))

    _swap_before_removal(monkeypatch, swap)
    run = run_kcache("--cache-dir", str(root), "prune", "--max-size", "0", "--yes", "--json")
    assert run.exit_code == 0, run.stderr
    doc = json.loads(run.stdout)
    assert swapped and all(Path(p, "decoy").exists() for p in swapped)
    skipped = {s["path"]: s["why"] for s in doc["skipped"]}
    assert all("replaced since the scan" in skipped.get(p, "") for p in swapped), doc["skipped"]
    assert doc["removed"], "the others went"


def test_scanned_identity_is_in_every_entry(scene):
    from kcache_cli.catalog.scan import scan_cache

    for root in (scene["hidet"], scene["victim"], FIXTURES / "triton" / "cache", FIXTURES / "tilus"):
        for e in scan_cache(root).entries:
            st = os.lstat(e.path)
            assert (e.dev, e.ino) == (st.st_dev, st.st_ino), e.relpath


def test_held_roots_are_released_after_each_command(scene):
    assert run_kcache("ls", "--json").exit_code == 0
    assert fsread._HELD == {}


# ---- one scan per root per command -----------------------------------------------------------------------

@pytest.fixture
def scans(monkeypatch) -> dict[str, int]:
    """scan_cache wrapped: how many times each root was scanned (a lookup of entries named by their paths,
    which judges only those, is not a scan)."""
    from kcache_cli.catalog import scan
    from kcache_cli.model.records import ScanFilter

    counted: dict[str, int] = {}
    real = scan.scan_cache

    def scan_cache(root, flt=ScanFilter(), *args, **kwargs):
        if not flt.paths:
            key = os.path.realpath(root)
            counted[key] = counted.get(key, 0) + 1
        return real(root, flt, *args, **kwargs)

    patch_everywhere(monkeypatch, scan, "scan_cache", scan_cache)
    return counted


@pytest.fixture
def three(scene) -> list[Path]:
    """Three caches of root's own in the default scope: hidet, tilus, Triton."""
    home = Path(os.environ["HOME"])
    copy_tree(FIXTURES / "tilus", home / ".cache" / "tilus")
    copy_tree(FIXTURES / "triton" / "cache", home / ".triton" / "cache")
    return [scene["hidet"], home / ".cache" / "tilus", home / ".triton" / "cache"]


@pytest.mark.parametrize("command", [
    ("ls", "--json"), ("stats", "--json"), ("prune", "--max-size", "1M", "--dry-run", "--json"),
    ("prune", "--max-size", "1M", "--yes", "--json"), ("clear", "--all", "--yes", "--json"),
    ("clear", "--op", "*", "--dry-run", "--json"), ("clear", "--kind", "program", "--dry-run", "--json"),
    ("clear", "--kind", "script", "--dry-run", "--json")])
def test_each_command_scans_each_root_once(three, scans, command, tmp_path):
    args = [str(tmp_path / "out.tar") if a == "ARCHIVE" else a for a in command]
    run = run_kcache(*args)
    assert run.exit_code == 0, run.stderr
    assert {os.path.realpath(r): 1 for r in three} == scans, scans


def test_a_budget_over_the_default_scope_scans_each_root_once(three, scans):
    assert run_kcache("config", "set", "max-size", "1M").exit_code == 0
    run = run_kcache("prune", "--yes", "--json")
    assert run.exit_code == 0, run.stderr
    assert {os.path.realpath(r): 1 for r in three} == scans, scans


@pytest.mark.parametrize("kind", [(), ("--kind", "script")])  # a script brings its program along
def test_export_scans_its_root_once(three, scans, tmp_path, kind):
    run = run_kcache("export", "--cache", "tilus", *kind, str(tmp_path / "out.tar"), "--json")
    assert run.exit_code == 0, run.stderr
    assert len(json.loads(run.stdout)["exported"]) == 2
    assert scans == {os.path.realpath(three[1]): 1}, scans


# ---- a co-user swapping the root's path, spawned ------------------------------------------------------------
# Root's own Triton cache (TRITON_CACHE_DIR) in a group-writable directory of the co-user's group: the
# co-user may rename it, and flips it (renameat2 RENAME_EXCHANGE) for a link to a victim holding entries of
# the same names while root's bare `prune` (the [all] budget of kcache's config) runs. Whenever the flips
# fall (vetting, scan, plan, removal), the victim never changes and nothing appears beside the cache.

FLIPPER = r"""
import ctypes, os, random, sys, time
libc = ctypes.CDLL(None, use_errno=True)
ren = libc.renameat2
ren.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
path, target, stop, rnd = sys.argv[1], sys.argv[2], sys.argv[3], random.Random(int(sys.argv[4]))
link = path + ".lnk"
os.symlink(target, link)
flips = 0
print("ready", flush=True)
while not os.path.exists(stop):
    time.sleep(rnd.random() * 0.02)  # mostly the real directory: the flips fall on every step in turn
    if ren(-100, path.encode(), -100, link.encode(), 2) == 0:  # RENAME_EXCHANGE: path is now the link
        flips += 1
        time.sleep(rnd.random() * 0.005)
        ren(-100, path.encode(), -100, link.encode(), 2)
os.unlink(link)
print(flips)
"""


def _swap_races(area: Path, n: int, seed: int) -> int:
    from kcache_cli.fs import delete as fsdelete

    seeds = sa.schedules(n, seed)
    parent = area / "shared"
    parent.mkdir()
    os.chown(parent, 0, sa.GROUP)
    os.chmod(parent, 0o2775)
    victim = copy_tree(FIXTURES / "triton" / "cache", area / "victim")
    watched = {victim: sa.snapshot(victim)}
    config = area / "kcache.toml"
    config.write_text('[all]\nmax-size = "1B"\n')
    total = removed = 0
    for i in range(n):
        root = copy_tree(FIXTURES / "triton" / "cache", parent / "triton")
        stop = area / f"stop-{i}"
        swapper = subprocess.Popen([sa.PY, "-c", FLIPPER, root, victim, stop, str(seeds[i])],
                                   preexec_fn=sa.as_attacker, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env={"PATH": "/usr/bin:/bin"})
        try:
            assert swapper.stdout is not None and swapper.stdout.readline().strip() == "ready"
            env = {"TRITON_CACHE_DIR": str(root), "KCACHE_CONFIG": str(config)}
            run = sa.kcache("prune", "--yes", "--json", env=env)
        finally:
            stop.touch()
            out, err = swapper.communicate(timeout=sa.TIMEOUT)
            stop.unlink()
        assert swapper.returncode == 0, err
        total += int(out.strip() or 0)
        sa.assert_held(run, watched, area, {"shared", "victim", "kcache.toml"})
        removed += sum(len(doc["removed"]) for doc in _docs(run.stdout)) if run.returncode == 0 else 0
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fsdelete.remove_tree(fd, "triton")
        finally:
            os.close(fd)
    print(f"{n} races, {total} flips, {removed} removals from the cache held")
    return total


@pytest.mark.second_user
def test_a_root_swapped_by_a_co_user_during_prune_redirects_nothing(area, stress_seed):
    assert _swap_races(area, 2, stress_seed) > 0, "the swapper never flipped anything: the race proved nothing"


@pytest.mark.slow
@pytest.mark.second_user
def test_a_root_swapped_by_a_co_user_during_prune_many_times(area):
    """A sample of the full run's schedules, as test_shared_attacks' slow races (KCACHE_SLOW_RACES=300: all)."""
    assert _swap_races(area, sa.SLOW_RACES, sa._seed()) > 0


@pytest.mark.parametrize("command", [("ls", "--json"), ("ls", "--op", "matmul", "--json"), ("stats", "--json"),
                                     ("prune", "--max-size", "1M", "--dry-run", "--json")])
def test_an_explicit_root_is_detected_once(scene, monkeypatch, command):
    from kcache_cli import layouts

    seen: list[str] = []
    real = layouts.detect

    def detect(root):
        seen.append(str(root))
        return real(root)

    patch_everywhere(monkeypatch, layouts, "detect", detect)
    run = run_kcache("--cache-dir", str(scene["hidet"]), *command)
    assert run.exit_code == 0, run.stderr
    assert seen == [str(scene["hidet"])], seen


@pytest.mark.parametrize("plant", [plant_dir, plant_link])
def test_a_planted_torch_root_is_refused_by_name_and_as_the_place_to_import(scene, plant, tmp_path):
    arc = tmp_path / "inductor.tar"
    assert run_kcache("--cache-dir", str(scene["victim"]), "export", str(arc)).exit_code == 0
    planted = plant(scene)
    seen = scene["victim"] if plant is plant_link else planted
    before = snapshot(seen)
    run = run_kcache("ls", "--cache", "inductor", "--json")
    assert run.exit_code == 2 and run.stderr.startswith("Error: refusing the inductor cache"), run.stderr
    assert f"KCACHE_SAFE_DIRECTORY={planted}" in run.stderr
    run = run_kcache("import", str(arc))
    assert run.exit_code == 2 and "refusing the inductor cache" in run.stderr, run.stderr
    assert snapshot(seen) == before


def test_hidets_rule_naming_another_users_directory_is_refused_for_build(scene, tmp_path):
    other = scene["tmp"] / "hidet-cache"
    copy_tree(FIXTURES / "hidet", other)
    chown_tree(other, ATTACKER)
    config = Path(os.environ["HOME"]) / ".config" / "hidet" / "hidet.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'cache_dir = "{other}"\n')
    before = snapshot(other)
    run = run_kcache("dir")
    assert run.exit_code == 2 and "uid 65534" in run.stderr and "--cache-dir" in run.stderr, run.stderr
    task = next(iter((FIXTURES / "hidet").glob("ops/*/*/*/task.txt")))
    run = run_kcache("build", str(task))
    assert run.exit_code == 2 and "refusing the default cache" in run.stderr, run.stderr
    assert snapshot(other) == before


def test_a_planted_torch_root_does_not_count_in_the_shared_budget(scene):
    """[all] max-size fits root's own caches exactly: a co-user's newer entries at root's torch default,
    were they counted, would evict root's own entries run after run."""
    run = run_kcache("--cache-dir", str(scene["hidet"]), "stats", "--json")
    size = json.loads(run.stdout)["size"]
    planted = plant_dir(scene)
    for e in planted.glob("fxgraph/*/*"):
        os.utime(e, None)  # used just now: the most recently used of all
    assert run_kcache("config", "set", "max-size", f"{size}B").exit_code == 0
    run = run_kcache("prune", "--yes", "--json")
    assert run.exit_code == 0, run.stderr
    assert [r["path"] for doc in _docs(run.stdout) for r in doc["removed"]] == []
    assert "uid 65534" in run.stderr
