"""A group-shared cache (mode 2775, a made-up group, umask 002) attacked by a co-user.

The attacker is a second user: uid 65534 with the cache's group as a supplementary group, run by these
tests as root (skipped, loudly, otherwise: tests/conftest.py). Its swapper races root's command with
atomic renameat2(RENAME_EXCHANGE) of the directories kcache writes through (the staging directory, the
entry's directories, .kcache/ and its subdirectories) for symlinks to a victim directory, a root-only
directory standing for ~/.ssh or /etc/cron.d. After every race the victim is unchanged byte for byte,
nothing outside the cache was created, renamed or removed, and no traceback was printed.

Each race test runs KCACHE_RACES races (default 4); the slow-marked ones KCACHE_SLOW_RACES (default 30, a
sample of the full run's 300 schedules; KCACHE_SLOW_RACES=300 runs them all). A schedule is one seeded race:
the full run's schedules are fixed by its seed (KCACHE_STRESS_SEED, default below), and a sample takes a
window of them that moves every hour, so that CI runs over a day try them all. What a run took is printed,
with the variables that replay it (KCACHE_STRESS_SEED, KCACHE_RACE_OFFSET)."""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
from conftest import CXX, FIXTURES

from kcache_cli.fs import delete as fsdelete
from kcache_cli.fs import state

pytestmark = [pytest.mark.second_user]

ATTACKER = 65534  # nobody
GROUP = 54321  # a made-up group: setgroups needs no /etc/group entry
PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable  # one the attacker can run
RACES = int(os.environ.get("KCACHE_RACES", "4"))
FULL_RACES = 300  # the schedules of a full run
SLOW_RACES = int(os.environ.get("KCACHE_SLOW_RACES", "30"))
TIMEOUT = 180
needs_cxx = pytest.mark.skipif(CXX is None, reason="g++ not found")


def _seed() -> int:
    """The seed of the full run's schedules (KCACHE_RACE_SEED, the older name, too)."""
    return int(os.environ.get("KCACHE_STRESS_SEED") or os.environ.get("KCACHE_RACE_SEED") or 20261128)


def schedules(n: int, seed: int) -> list[int]:
    """The seeds of `n` races: all of the full run's schedules when n >= FULL_RACES (more repeat them), else
    a window of n of them that starts where KCACHE_RACE_OFFSET says, or moves on by n every hour."""
    full = random.Random(seed)
    every = [full.randrange(1 << 30) for _ in range(FULL_RACES)]
    offset = int(os.environ.get("KCACHE_RACE_OFFSET") or (int(time.time()) // 3600 * n) % FULL_RACES)
    if n >= FULL_RACES:
        offset = 0
    print(f"races {offset}..{offset + n - 1} (mod {FULL_RACES}) of the full run's schedules; replay with "
          f"KCACHE_STRESS_SEED={seed} KCACHE_RACE_OFFSET={offset} KCACHE_SLOW_RACES={n}")
    return [every[(offset + i) % FULL_RACES] for i in range(n)]


def as_attacker() -> None:
    """preexec_fn: become uid 65534 in the cache's group, with the umask group sharing needs."""
    os.setgroups([GROUP])
    os.setresgid(GROUP, GROUP, GROUP)
    os.setresuid(ATTACKER, ATTACKER, ATTACKER)
    os.umask(0o002)


def attacker(code: str, *args: object) -> subprocess.CompletedProcess:
    run = subprocess.run([PY, "-c", code, *map(str, args)], preexec_fn=as_attacker, capture_output=True, text=True,
                         timeout=TIMEOUT, env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    return run


SWAPPER = r"""
import ctypes, glob, os, random, sys, time
libc = ctypes.CDLL(None, use_errno=True)
ren = libc.renameat2
ren.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
base, stop, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
specs = [a.split("|", 1) for a in sys.argv[4:]]  # "glob|where the link points"
rnd = random.Random(seed)
flips = 0
me = os.getpid()
print("ready", flush=True)
while not os.path.exists(stop):
    found = [(d, t) for p, t in specs for d in glob.glob(os.path.join(base, p)) if ".lnk-" not in d]
    found = [(d, t) for d, t in found if not os.path.islink(d)]
    if not found:
        continue
    d, target = rnd.choice(found)
    link = f"{d}.lnk-{me}"
    try:
        os.symlink(target, link)
    except OSError:
        continue
    a, b = d.encode(), link.encode()
    if ren(-100, a, -100, b, 2) == 0:  # RENAME_EXCHANGE: d is now the link
        flips += 1
        time.sleep(rnd.random() * 0.002)
        ren(-100, a, -100, b, 2)
    try:
        os.unlink(link)
    except OSError:
        pass
print(flips)
"""


# ---- the scene -------------------------------------------------------------------------------------------

def make_victim(area: Path) -> Path:
    """Root's private directory (~/.ssh, /etc/cron.d, /var/lib/dpkg/info: names with a colon too)."""
    v = area / "victim"
    v.mkdir(mode=0o700)
    (v / "authorized_keys").write_text("ssh-ed25519 AAAAC3Nza root@here\n")
    (v / "libc6:amd64.list").write_text("/lib/x86_64-linux-gnu/libc.so.6\n")
    (v / "kcache:v1:index").write_text("not kcache's\n")
    os.utime(v / "authorized_keys", (1_000_000_000, 1_000_000_000))
    return v


def snapshot(path: Path) -> dict:
    """Every name under `path` with its type, owner, mode, size, mtime and bytes (or link target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            body = os.readlink(p) if stat.S_ISLNK(st.st_mode) else \
                Path(p).read_bytes() if stat.S_ISREG(st.st_mode) else None
            out[os.path.relpath(p, path)] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, body)
    st = os.lstat(path)
    out["."] = (st.st_mode, st.st_uid, st.st_mtime_ns)
    return out


def share(path: Path) -> Path:
    """Make `path` (and all in it) a group-shared cache: root:GROUP, directories 2775, files 664/775."""
    for dirpath, _dirs, filenames in os.walk(path):
        os.chown(dirpath, 0, GROUP)
        os.chmod(dirpath, 0o2775)
        for n in filenames:
            p = os.path.join(dirpath, n)
            if not os.path.islink(p):
                os.chown(p, 0, GROUP)
                os.chmod(p, 0o775 if os.stat(p).st_mode & 0o100 else 0o664)
    return path


def shared_dir(path: Path, src: Path | None = None) -> Path:
    if src is not None:
        shutil.copytree(src, path, symlinks=True)
    else:
        path.mkdir()
    return share(path)


def kcache(*args: object, env: dict | None = None, umask: int = 0o002) -> subprocess.CompletedProcess:
    """Root's kcache, in a process of its own (umask 002, as group sharing needs; 022: root's cron)."""
    full = dict(os.environ)
    full.pop("KCACHE_SAFE_DIRECTORY", None)
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "kcache_cli", *map(str, args)], capture_output=True, text=True,
                          timeout=TIMEOUT, env=full, preexec_fn=lambda: os.umask(umask))


def entry_dirs(root: Path) -> list[str]:
    """Relpaths of the hidet-shaped entries (ops/<space>/<op>/<hash>) under `root`."""
    return sorted(str(p.relative_to(root)) for p in root.glob("ops/*/*/*") if p.is_dir())


def race(area: Path, command: list, specs: list[str], seed: int) -> tuple[subprocess.CompletedProcess, int]:
    """Run root's `command` while the attacker flips the directories of `specs` ("glob under area|link
    target") for links; (the command's run, how many flips happened during it)."""
    stop = area / f"stop-{seed}"
    swapper = subprocess.Popen([PY, "-c", SWAPPER, *map(str, (area, stop, seed, *specs))], preexec_fn=as_attacker,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"})
    try:
        assert swapper.stdout is not None and swapper.stdout.readline().strip() == "ready"
        run = kcache(*command)
    finally:
        stop.touch()
        out, err = swapper.communicate(timeout=TIMEOUT)
        stop.unlink()
    assert swapper.returncode == 0, err
    return run, int(out.strip() or 0)


def assert_held(run: subprocess.CompletedProcess, watched: dict[Path, dict], area: Path, names: set[str]) -> None:
    assert "Traceback" not in run.stderr, run.stderr
    assert run.returncode in (0, 1), (run.returncode, run.stderr)
    if run.returncode == 1:
        assert run.stderr.strip(), "a failure says why"
    for path, before in watched.items():
        assert snapshot(path) == before, f"{path} (outside the cache) changed"
    assert {p.name for p in area.iterdir()} <= names, "something was created outside the cache"


def run_races(area: Path, n: int, command_for, entries: list[str], seed: int, extra=()) -> None:
    """`n` races, each in a fresh shared cache `area/cache-<i>` whose entry op directories the attacker
    made ahead (it may, in a group-shared cache): its swapper flips .kcache/, the staging directory,
    locks/, trash/, used/ and every directory on the entries' paths for links to the victim, and the
    staging directory also for a link to its decoy (a tree of its own whose entry directories are links
    to the victim: a write through the swapped staging path would land in the victim). After each race
    the victim and the decoy are unchanged and nothing new is beside the cache; some flips overall."""
    victim = make_victim(area)
    seeds = schedules(n, seed)
    total = published = 0
    said: set[str] = set()
    names = {p.name for p in area.iterdir()} | {"decoy"}
    decoy = area / "decoy"  # the attacker's own directory
    decoy.mkdir()
    os.chown(decoy, ATTACKER, GROUP)
    attacker("import os, sys\nfor e in sys.argv[3:]:\n    d = os.path.join(sys.argv[1], e)\n"
             "    os.makedirs(os.path.dirname(d), exist_ok=True)\n    os.symlink(sys.argv[2], d)",
             decoy, victim, *entries)
    watched = {victim: snapshot(victim), decoy: snapshot(decoy)}
    for i in range(n):
        root = shared_dir(area / f"cache-{i}")
        names.add(root.name)
        attacker("import os, sys\nfor d in sys.argv[1:]: os.makedirs(d, exist_ok=True)",
                 *sorted({str(root / e.rpartition("/")[0]) for e in entries}))
        r = root.name
        specs = [f"{r}/{g}|{victim}" for g in (".kcache", ".kcache/import-*", ".kcache/locks", ".kcache/trash",
                                                ".kcache/used", "ops", "ops/*", "ops/*/*", "ops/*/*/*")]
        specs += [f"{r}/.kcache/import-*|{decoy}"] * 4 + list(extra)
        run, flips = race(area, command_for(root), specs, seeds[i])
        assert_held(run, watched, area, names)
        total += flips
        published += run.returncode == 0
        said.update(line.replace(str(root), "<cache>")[:150] for line in run.stderr.splitlines()
                    if line.startswith(("Error", "warning")))
        fd = os.open(area, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fsdelete.remove_tree(fd, root.name)
        finally:
            os.close(fd)
        names.discard(root.name)
    print(f"{n} races, {total} flips, {published} commands succeeded; what they said:", *sorted(said), sep="\n  ")
    assert total > 0, "the swapper never flipped anything: the race proved nothing"


# ---- import ----------------------------------------------------------------------------------------------

@pytest.fixture
def archive(area):
    src = shared_dir(area / "src", FIXTURES / "hidet")
    arc = area / "hidet.tar"
    run = kcache("--cache-dir", src, "export", arc)
    assert run.returncode == 0, run.stderr
    return arc, entry_dirs(src)


def _import_races(area, archive, n):
    arc, entries = archive
    first = shared_dir(area / "baseline")  # without the attacker, the import works
    ok = kcache("--cache-dir", first, "import", arc)
    assert ok.returncode == 0, ok.stderr
    assert entry_dirs(first) == entries
    run_races(area, n, lambda root: ["--cache-dir", root, "import", arc], entries, _seed())


def test_import_races_a_swapper_and_writes_nothing_outside(area, archive):
    _import_races(area, archive, RACES)


@pytest.mark.slow
def test_import_races_a_sample_of_300_schedules(area, archive):
    _import_races(area, archive, SLOW_RACES)


# ---- pull (file:// and a real Redis) ---------------------------------------------------------------------

def _pushed(area: Path, url: str) -> list[str]:
    src = shared_dir(area / "src", FIXTURES / "hidet")
    run = kcache("push", "--cache-dir", src, "--remote", url)
    assert run.returncode == 0, run.stderr
    return entry_dirs(src)


def _pull_races(area, url, n, extra=()):
    entries = _pushed(area, url)
    first = area / "baseline"
    ok = kcache("pull", "--cache-dir", shared_dir(first), "--remote", url)
    assert ok.returncode == 0, ok.stderr
    assert entry_dirs(first) == entries
    victim = area / "victim"
    run_races(area, n, lambda root: ["pull", "--cache-dir", root, "--remote", url], entries, _seed(),
              [f"{g}|{victim}" for g in extra])


def test_pull_file_remote_races_a_swapper(area):
    remote = shared_dir(area / "remote")
    _pull_races(area, f"file://{remote}", RACES, ["remote/*.d"])


@pytest.mark.redis
def test_pull_redis_races_a_swapper(area, redis_server):
    _pull_races(area, redis_server().url, RACES)


@pytest.mark.slow
def test_pull_file_remote_races_a_sample_of_300_schedules(area):
    remote = shared_dir(area / "remote")
    _pull_races(area, f"file://{remote}", SLOW_RACES, ["remote/*.d"])


@pytest.mark.slow
@pytest.mark.redis
def test_pull_redis_races_a_sample_of_300_schedules(area, redis_server):
    _pull_races(area, redis_server().url, SLOW_RACES)


# ---- build --remote --------------------------------------------------------------------------------------

def _task(area: Path) -> Path:
    from test_build import write_task

    tasks = area / "tasks"
    tasks.mkdir()
    return write_task(tasks, name="vadd", n=64, kind="cc")


def _build_remote_races(area, url, n):
    task = _task(area)
    seed_cache = shared_dir(area / "seed")
    built = kcache("build", task, "--cache-dir", seed_cache, "--remote", url, "--cxx", CXX, "--json")
    assert built.returncode == 0, built.stderr
    relpath = json.loads(built.stdout)["results"][0]["relpath"]
    run_races(area, n, lambda root: ["build", task, "--cache-dir", root, "--remote", url, "--cxx", CXX],
              [relpath], _seed())


@needs_cxx
@pytest.mark.redis
def test_build_remote_races_a_swapper(area, redis_server):
    _build_remote_races(area, redis_server().url, RACES)


@needs_cxx
def test_build_remote_file_races_a_swapper(area):
    _build_remote_races(area, f"file://{shared_dir(area / 'remote')}", RACES)


@pytest.mark.slow
@needs_cxx
@pytest.mark.redis
def test_build_remote_races_a_sample_of_300_schedules(area, redis_server):
    _build_remote_races(area, redis_server().url, SLOW_RACES)


# ---- .kcache/used/<stamp> planted as a link --------------------------------------------------------------

@needs_cxx
def test_planted_stamp_links_make_a_build_hit_touch_nothing_outside(area):
    """A build hit refreshes the entry's last-used stamp: a stamp the attacker replaced with a link
    (to a missing /etc/nologin, to an existing file) or a used/ that is a link is never written
    through: no file is created or re-timed outside the cache; the stamp becomes a file of root's."""
    task = _task(area)
    victim = make_victim(area)
    root = shared_dir(area / "cache")
    built = kcache("build", task, "--cache-dir", root, "--cxx", CXX, "--json")
    assert built.returncode == 0, built.stderr
    stamp = root / ".kcache/used" / state.stamp_name(json.loads(built.stdout)["results"][0]["relpath"])
    before = snapshot(victim)
    for target in (victim / "nologin", victim / "authorized_keys"):
        attacker("import os, sys\nos.unlink(sys.argv[1])\nos.symlink(sys.argv[2], sys.argv[1])\n"
                 "os.utime(sys.argv[1], (1, 1), follow_symlinks=False)", stamp, target)
        hit = kcache("build", task, "--cache-dir", root, "--cxx", CXX, "--json")
        assert hit.returncode == 0 and "Traceback" not in hit.stderr, hit.stderr
        assert json.loads(hit.stdout)["results"][0]["status"] == "hit"
        assert snapshot(victim) == before
        st = os.lstat(stamp)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and st.st_mtime > 1000  # re-stamped, in the cache
    attacker("import os, sys\nos.rename(sys.argv[1], sys.argv[1] + '.old')\nos.symlink(sys.argv[2], sys.argv[1])",
             root / ".kcache/used", victim)
    os.utime(stamp.parent.parent / "used.old" / stamp.name, (1, 1))
    hit = kcache("build", task, "--cache-dir", root, "--cxx", CXX)
    assert hit.returncode == 0 and "Traceback" not in hit.stderr, hit.stderr
    assert snapshot(victim) == before


# ---- file:// remote: links planted for its hash directories ---------------------------------------------

def test_file_remote_links_for_index_and_pulled_dirs_reach_nothing_outside(area):
    """A member replaces the remote's index.d and pulled.d with links to a directory of names with a
    colon (dpkg's database has exactly such names): root's `remote prune --older-than 30d` unlinks
    nothing there, and push and pull write nothing there; each says what is wrong in one line."""
    remote = shared_dir(area / "remote")
    url = f"file://{remote}"
    _pushed(area, url)
    pulled = kcache("pull", "--cache-dir", shared_dir(area / "dst"), "--remote", url)
    assert pulled.returncode == 0, pulled.stderr
    victim = make_victim(area)
    before = snapshot(victim)
    hashes = sorted(p.name for p in remote.iterdir() if p.name.endswith(".d"))
    assert len(hashes) >= 2, hashes  # the index and the pulled times
    attacker("import os, sys\nfor d in sys.argv[2:]:\n    os.rename(d, d + '.real')\n    os.symlink(sys.argv[1], d)",
             victim, *(remote / h for h in hashes))
    for args in (["remote", "prune", "--remote", url, "--older-than", "30d"],
                 ["remote", "prune", "--remote", url, "--older-than", "0s"],
                 ["push", "--cache-dir", area / "src", "--remote", url],
                 ["pull", "--cache-dir", shared_dir(area / "dst2"), "--remote", url],
                 ["remote", "ls", "--remote", url]):
        run = kcache(*args)
        assert "Traceback" not in run.stderr, (args, run.stderr)
        assert snapshot(victim) == before, args
        if run.returncode != 0:
            lines = run.stderr.strip().splitlines()
            assert lines[-1].startswith("Error: ") and ("symlink" in lines[-1] or "link" in lines[-1]), run.stderr


# ---- who owns .kcache ------------------------------------------------------------------------------------

def test_state_dir_of_another_user_is_refused_with_the_opt_in(area, archive):
    """.kcache/ owned by another (non-root) user in a cache that is not group-shared: import stops with
    one line that names KCACHE_SAFE_DIRECTORY; with it set, the import goes ahead."""
    arc, entries = archive
    root = area / "private"
    root.mkdir(mode=0o755)
    (root / ".kcache").mkdir(mode=0o755)
    os.chown(root / ".kcache", ATTACKER, ATTACKER)
    run = kcache("--cache-dir", root, "import", arc)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith("Error: ") and "uid 65534" in line and f"KCACHE_SAFE_DIRECTORY={root}" in line, line
    assert entry_dirs(root) == []
    ok = kcache("--cache-dir", root, "import", arc, env={"KCACHE_SAFE_DIRECTORY": str(root)})
    assert ok.returncode == 0, ok.stderr
    assert entry_dirs(root) == entries


def test_group_shared_state_dir_made_by_a_member_is_used(area, archive):
    """In a group-shared cache a member made .kcache/ (2775 under umask 002): root's import uses it."""
    arc, entries = archive
    root = shared_dir(area / "cache")
    attacker("import os, sys\nos.mkdir(sys.argv[1])", root / ".kcache")
    st = os.stat(root / ".kcache")
    assert st.st_uid == ATTACKER and st.st_gid == GROUP and st.st_mode & stat.S_ISGID
    run = kcache("--cache-dir", root, "import", arc)
    assert run.returncode == 0, run.stderr
    assert entry_dirs(root) == entries


def test_private_directory_rule(area):
    """A staging or build temp directory is trusted only when it is this user's and closed to others."""
    from kcache_cli.fs import write as fswrite

    st = os.stat(area)
    assert fswrite.owner_problem(st, "x", private=True) is not None  # 0755: open to others
    mine = area / "mine"
    mine.mkdir(mode=0o700)
    assert fswrite.owner_problem(os.stat(mine), "x", private=True) is None
    os.chown(mine, ATTACKER, GROUP)
    assert "uid 65534" in (fswrite.owner_problem(os.stat(mine), "x", private=True) or "")


# ---- a group-shared cache keeps working for every member -------------------------------------------------

def as_user_kcache(preexec: Callable[[], None], *args: object, env: dict | None = None) -> subprocess.CompletedProcess:
    """kcache run by another user (`preexec` becomes them), from this checkout (`env`: more variables). A
    checkout that user cannot read (a clone under a 0700 /root, as root in a container) skips the test,
    loudly: no other user runs kcache there."""
    import site

    here = Path(__file__).resolve().parents[1]
    paths = [str(here), *(p for p in site.getsitepackages() if "site-packages" in p)]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "PYTHONPATH": ":".join(paths), "NO_COLOR": "1",
           **(env or {})}
    run = subprocess.run([PY, "-m", "kcache_cli", *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT,
                         env=env, preexec_fn=preexec, cwd="/")
    if run.returncode != 0 and "No module named kcache_cli" in run.stderr:
        pytest.skip(f"SKIPPED LOUDLY: another user cannot run kcache from this checkout ({here} is not readable "
                    "to them: clone it where others can read): nothing proved what this test is for")
    return run


def member_kcache(*args: object) -> subprocess.CompletedProcess:
    """kcache run by a member of the cache's group (uid 65534, umask 002), from this checkout."""
    return as_user_kcache(as_attacker, *args)


@needs_cxx
def test_every_member_of_a_shared_cache_builds_imports_and_hits(area, archive):
    """Root and a member take turns in one group-shared cache: what one made (.kcache/, locks, stamps,
    op directories) the other can use; each one's build hit re-stamps the entry (the other's stamp is
    replaced, not written through)."""
    arc, entries = archive
    task = _task(area)
    root = shared_dir(area / "cache")
    assert kcache("--cache-dir", root, "import", arc).returncode == 0
    assert member_kcache("--version").returncode == 0
    again = member_kcache("--cache-dir", root, "import", arc, "--json")
    assert again.returncode == 0, again.stderr
    assert {e["action"] for e in json.loads(again.stdout)["entries"]} == {"skip"}, again.stdout[:1500]
    built = member_kcache("build", task, "--cache-dir", root, "--cxx", CXX, "--json")
    assert built.returncode == 0, built.stderr
    rel = json.loads(built.stdout)["results"][0]["relpath"]
    entry = os.stat(root / rel)
    assert entry.st_uid == ATTACKER and entry.st_gid == GROUP and stat.S_IMODE(entry.st_mode) & 0o070 == 0o070
    stamp = root / ".kcache/used" / state.stamp_name(rel)
    for who, run in (("root", kcache), ("member", member_kcache)):
        os.utime(stamp, (1, 1), follow_symlinks=False)
        hit = run("build", task, "--cache-dir", root, "--cxx", CXX, "--json")
        assert hit.returncode == 0, (who, hit.stderr)
        assert json.loads(hit.stdout)["results"][0]["status"] == "hit"
        st = os.lstat(stamp)
        assert stat.S_ISREG(st.st_mode) and st.st_mtime > 1000, who
        assert st.st_uid == (0 if who == "root" else ATTACKER), who
    listing = member_kcache("--cache-dir", root, "ls", "--json")
    assert listing.returncode == 0 and len(json.loads(listing.stdout)["entries"]) == len(entries) + 1, listing.stderr


@needs_cxx
def test_roots_build_under_umask_022_leaves_directories_members_can_build_in(area):
    """root's cron builds into a fresh group-shared root under umask 022: the op and space directories it
    makes are the group's (setgid, group-writable), so a member then builds another op of that space and
    another task of that op."""
    from test_build import write_task

    root = shared_dir(area / "cache")
    first = write_task(area / "tasks", name="vadd", n=64, kind="cc")
    built = kcache("build", first, "--cache-dir", root, "--cxx", CXX, "--json", umask=0o022)
    assert built.returncode == 0, built.stderr
    rel = json.loads(built.stdout)["results"][0]["relpath"]
    for d in (Path(rel).parent, Path(rel).parent.parent, Path(rel).parent.parent.parent):
        st = os.stat(root / d)
        assert st.st_gid == GROUP and stat.S_IMODE(st.st_mode) & 0o2070 == 0o2070, (d, oct(st.st_mode))
    for name, n in (("vadd", 128), ("vmul", 64)):  # the same op, then another op in the same space
        task = write_task(area / "tasks", name=name, n=n, kind="cc")
        run = member_kcache("build", task, "--cache-dir", root, "--cxx", CXX)
        assert run.returncode == 0, (name, run.stderr)
    st = os.stat(root / rel)  # root's entry itself: a member may remove or replace it
    assert st.st_gid == GROUP and stat.S_IMODE(st.st_mode) & 0o2070 == 0o2070, oct(st.st_mode)
    forced = member_kcache("build", first, "--cache-dir", root, "--cxx", CXX, "--force")
    assert forced.returncode == 0, forced.stderr
    cleared = member_kcache("--cache-dir", root, "clear", "--op", "vadd", "--yes")
    assert cleared.returncode == 0 and not (root / rel).exists(), cleared.stderr


def test_roots_import_under_umask_022_leaves_entries_members_can_remove(area, archive):
    """root's cron imports into a group-shared root under umask 022: a member's clear removes them."""
    arc, entries = archive
    root = shared_dir(area / "cache")
    run = kcache("--cache-dir", root, "import", arc, umask=0o022)
    assert run.returncode == 0 and entry_dirs(root) == entries, run.stderr
    cleared = member_kcache("--cache-dir", root, "clear", "--all", "--yes")
    assert cleared.returncode == 0 and entry_dirs(root) == [], cleared.stderr


def test_a_members_compiler_memo_is_not_trusted(area):
    """.kcache/ holds what kcache learnt about the compilers (nvcc's default arch): a member's version of
    that file is ignored, root's own is read."""
    from kcache_cli.ops import build

    root = shared_dir(area / "cache")
    (root / ".kcache").mkdir()
    memo = root / ".kcache" / build.COMPILER_MEMO
    memo.write_text(json.dumps({"/usr/bin/nvcc:1:2": {"default_arch": "sm_35"}}))
    assert build._read_memo(root) == {"/usr/bin/nvcc:1:2": {"default_arch": "sm_35"}}
    os.chown(memo, ATTACKER, GROUP)
    assert build._read_memo(root) == {}


@needs_cxx
def test_build_in_a_cache_whose_state_dir_is_another_users(area):
    """build takes its lock in .kcache/locks: in another user's .kcache/ it stops with one line naming the
    opt-in, writes nothing there, and builds once the root is listed in KCACHE_SAFE_DIRECTORY."""
    task = _task(area)
    root = area / "private"
    (root / ".kcache").mkdir(parents=True)
    os.chown(root / ".kcache", ATTACKER, ATTACKER)
    run = kcache("build", task, "--cache-dir", root, "--cxx", CXX)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "uid 65534" in run.stderr and f"KCACHE_SAFE_DIRECTORY={root}" in run.stderr, run.stderr
    assert os.listdir(root / ".kcache") == [] and entry_dirs(root) == []
    ok = kcache("build", task, "--cache-dir", root, "--cxx", CXX, env={"KCACHE_SAFE_DIRECTORY": str(root)})
    assert ok.returncode == 0, ok.stderr
    assert len(entry_dirs(root)) == 1


# ---- what a co-user plants in .kcache/ (red team, stop 47) -----------------------------------------------
@pytest.mark.parametrize("shared", [True, False], ids=["group-shared", "private"])
def test_a_hard_linked_lock_never_changes_the_file_it_links(area, shared):
    """A member (or whoever may write .kcache/locks/) replaces the gc lock with a hard link to a root-owned
    file elsewhere: root's prune locks it as it is, and never chmods or chowns that file."""
    src = FIXTURES / "hidet"
    root = shared_dir(area / "cache", src) if shared else Path(shutil.copytree(src, area / "cache"))
    (root / ".kcache" / "locks").mkdir(parents=True)
    if shared:
        share(root / ".kcache")
    outside = area / "pub"
    outside.mkdir()
    victim = outside / "ww"
    victim.write_text("root's\n")
    os.chmod(victim, 0o666)
    before = os.stat(victim)
    lock = root / ".kcache" / "locks" / ".gc.lock"
    os.link(victim, lock)
    run = kcache("--cache-dir", root, "prune", "--max-size", "200K", "--yes")
    assert run.returncode == 0, run.stderr
    after = os.stat(victim)
    assert (after.st_mode, after.st_uid, after.st_gid) == (before.st_mode, before.st_uid, before.st_gid)
    assert victim.read_text() == "root's\n"


def test_prune_refuses_a_state_dir_another_user_made_in_a_world_writable_cache(area):
    """A 1777 cache (no group sharing): a co-user makes .kcache/locks and .kcache/trash first. Root's
    prune neither takes that user's lock nor stages removals in their trash: one line naming the owner and
    the opt-in, nothing removed; with KCACHE_SAFE_DIRECTORY it goes ahead."""
    root = Path(shutil.copytree(FIXTURES / "hidet", area / "cache"))
    os.chmod(root, 0o1777)
    attacker("import os, sys\nos.makedirs(sys.argv[1] + '/locks'); os.mkdir(sys.argv[1] + '/trash')\n"
             "os.symlink('/anything', sys.argv[1] + '/trash/x')", root / ".kcache")
    entries = entry_dirs(root)
    run = kcache("--cache-dir", root, "prune", "--max-size", "200K", "--yes")
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith("Error: ") and "uid 65534" in line and "KCACHE_SAFE_DIRECTORY=" in line, line
    assert "nothing was removed" in line and entry_dirs(root) == entries
    assert os.path.islink(root / ".kcache/trash/x")
    ok = kcache("--cache-dir", root, "prune", "--max-size", "200K", "--yes",
                env={"KCACHE_SAFE_DIRECTORY": str(root)})
    assert ok.returncode == 0 and len(entry_dirs(root)) < len(entries), ok.stderr


def test_roots_prune_makes_the_stamps_and_index_dirs_the_groups(area):
    """An older kcache (or root's build under umask 022) made .kcache/used/ and index/ 2755: a member's
    build hit could not stamp, silently, and prune then took the entry for unused. Root's prune of the
    group-shared cache makes them the group's, as it does locks/ and trash/."""
    root = shared_dir(area / "cache", FIXTURES / "hidet")
    for sub in ("used", "index"):
        (root / ".kcache" / sub).mkdir(parents=True)
        os.chmod(root / ".kcache" / sub, 0o2755)
    assert kcache("--cache-dir", root, "prune", "--max-size", "1G", "--yes").returncode == 0
    for sub in ("used", "index"):
        st = os.stat(root / ".kcache" / sub)
        assert st.st_gid == GROUP and stat.S_IMODE(st.st_mode) & 0o2070 == 0o2070, (sub, oct(st.st_mode))


@needs_cxx
def test_a_member_whose_hit_cannot_be_stamped_is_told(area):
    """used/ closed to the group (root-owned 2755): the member's build hit says that its use was not noted
    and how to fix it, instead of nothing."""
    task = _task(area)
    root = shared_dir(area / "cache")
    assert kcache("build", task, "--cache-dir", root, "--cxx", CXX).returncode == 0
    used = root / ".kcache" / "used"
    for p in used.iterdir():
        p.unlink()
    os.chmod(used, 0o2755)
    hit = member_kcache("build", task, "--cache-dir", root, "--cxx", CXX)
    assert hit.returncode == 0, hit.stderr
    assert "cannot note this use" in hit.stderr and f"chmod g+ws {used}" in hit.stderr, hit.stderr
    assert list(used.iterdir()) == []


def test_a_setgid_state_dir_of_the_roots_group_is_no_pass_where_the_root_is_not_shared(area):
    """A 1777 cache whose group is the attacker's (root:GROUP, not group-shared): .kcache/, locks/ and
    trash/ the attacker made 2777 in that group were trusted as a group-shared cache's are. Refused, and
    the line says how to move them aside."""
    root = Path(shutil.copytree(FIXTURES / "hidet", area / "cache"))
    os.chown(root, 0, GROUP)
    os.chmod(root, 0o1777)
    attacker("import os, sys\nfor d in ('', '/locks', '/trash'):\n    os.mkdir(sys.argv[1] + d)\n"
             "    os.chmod(sys.argv[1] + d, 0o2777)", root / ".kcache")
    entries = entry_dirs(root)
    run = kcache("--cache-dir", root, "prune", "--max-size", "200K", "--yes")
    assert run.returncode == 1 and entry_dirs(root) == entries, run.stderr
    line = run.stderr.strip().splitlines()[-1]
    assert "uid 65534" in line and f"mv {root}/.kcache" in line and ".untrusted" in line, line


def test_root_prunes_a_users_own_cache_with_that_users_state(area):
    """A user's personal cache (theirs, 0755) whose .kcache/ they made: root's cron prune uses it (the
    cache's owner's state is the cache's), where a third user's is refused."""
    root = Path(shutil.copytree(FIXTURES / "hidet", area / "cache"))
    for dirpath, _dirnames, filenames in os.walk(root):
        for n in [dirpath, *(os.path.join(dirpath, f) for f in filenames)]:
            os.lchown(n, ATTACKER, GROUP)
    attacker("import os, sys\nos.makedirs(sys.argv[1] + '/locks'); os.mkdir(sys.argv[1] + '/trash')", root / ".kcache")
    entries = entry_dirs(root)
    run = kcache("--cache-dir", root, "prune", "--max-size", "200K", "--yes")
    assert run.returncode == 0 and len(entry_dirs(root)) < len(entries), run.stderr


def test_a_members_budget_prune_is_not_failed_by_anothers_build_in_flight(area):
    """Root's build in flight holds a 0700 temp directory (private by design): a member's budget prune
    keeps it as a build in progress, not as a directory it could not read (exit 1, "may be over")."""
    from kcache_cli.fs import locking

    root = shared_dir(area / "cache", FIXTURES / "hidet")
    op = next(root.glob("ops/cpu_space_0/*"))
    final = f"{op.relative_to(root)}/0123456789abcdef"
    temp = op / f"{state.TEMP_PREFIX}0123456789abcdef-1a2b3c4d"
    temp.mkdir(mode=0o700)
    (temp / "source.cc").write_text("int main() {}\n")
    lock = locking.entry_lock(root, final)
    lock.acquire()
    try:
        run = member_kcache("--cache-dir", root, "prune", "--max-size", "1G", "--yes")
    finally:
        lock.release()
    assert run.returncode == 0 and "could not read" not in run.stderr, run.stderr
    assert "cannot read" not in run.stderr and temp.is_dir(), run.stderr  # a build in flight is no news


@needs_cxx
def test_a_hit_in_a_cache_that_is_not_shared_says_nothing_of_stamps(area):
    """A root-owned 0755 cache (not group-shared) another user hits: its use cannot be noted, as for any
    read-only cache, and that is no news (the chmod the group-cache warning names would not apply)."""
    task = _task(area)
    root = area / "cache"
    root.mkdir(mode=0o755)
    assert kcache("build", task, "--cache-dir", root, "--cxx", CXX).returncode == 0
    for stamp in (root / ".kcache" / "used").iterdir():
        os.utime(stamp, (1, 1))  # an hour old and more: the hit would re-stamp it
    hit = member_kcache("build", task, "--cache-dir", root, "--cxx", CXX)
    assert hit.returncode == 0 and "cannot note this use" not in hit.stderr, hit.stderr
