"""Deleting and writing that no race, link, mount, full disk or look-alike directory can turn against the
user (issue 9): a victim directory outside the cache is unchanged in every case, every command runs
under a timeout, and no command prints a traceback."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kcache_cli.fs import delete as fsdelete
from kcache_cli.fs import state

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 120
ADD = "ops/cuda_space_0/add/8d1f7691cdf75e90"
SOFTMAX = "ops/cuda_space_0/softmax/ad252b064b266eea"
HOUR = 3600.0
# Another process holding a flock on argv[1] until its stdin closes (a build, an export, a prune).
HOLD_FLOCK = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
              "print('held', flush=True)\nsys.stdin.read()")


# ---- helpers -------------------------------------------------------------------------------------
def cli(*args, check_clean: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """`kcache ARGS` in its own process, under a timeout; never a traceback."""
    p = subprocess.run([sys.executable, "-m", "kcache_cli", *map(str, args)], capture_output=True, text=True,
                       check=False,
                       timeout=TIMEOUT, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    if check_clean:
        assert "Traceback" not in p.stderr, p.stderr
        assert p.returncode in (0, 1, 2, 3), p.stderr
    return p


def snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` with its type and content hash (links: their text): to compare."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = "link:" + os.readlink(p)
            elif os.path.isdir(p):
                out[rel] = "dir"
            else:
                with open(p, "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
    return out


def make_victim(tmp_path: Path) -> Path:
    """A directory outside the cache that looks like what kcache deletes (entry-shaped, old files)."""
    v = tmp_path / "victim"
    for rel in ("add/8d1f7691cdf75e90", "8d1f7691cdf75e90", "cuda_space_0/add/0123456789abcdef", "keep"):
        (v / rel).mkdir(parents=True)
        (v / rel / "lib.so").write_bytes(b"\x7fELF precious " + rel.encode())
        (v / rel / "task.txt").write_text("precious")
    old = time.time() - 90 * 86400
    for dirpath, dirnames, filenames in os.walk(v):
        for n in dirnames + filenames:
            os.utime(os.path.join(dirpath, n), (old, old))
    return v


def age(path: Path, seconds: float) -> None:
    ts = time.time() - seconds
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for n in filenames + dirnames:
            os.utime(os.path.join(dirpath, n), (ts, ts), follow_symlinks=False)
        os.utime(dirpath, (ts, ts))


def removed(p: subprocess.CompletedProcess) -> set[str]:
    data = json.loads(p.stdout)
    return {os.path.relpath(r["removed_path"], data["root"]) for r in data["removed"]}


_DEEP: list[Path] = []  # deep trees made by a test: removed at teardown whatever happened (pytest's own
# cleanup of old temp dirs recurses, and a 10,000-deep tree left behind would break later runs)


def deep_tree(parent: Path, name: str, depth: int) -> None:
    """A chain of `depth` directories, made fd-relative (paths that deep exceed PATH_MAX)."""
    _DEEP.append(parent / name)
    (parent / name).mkdir()
    fd = os.open(parent / name, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(depth):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
            if i % 1000 == 0:
                os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


def _can_mount() -> str | None:
    """None when this process can mount (root, mount(8) works), else why not."""
    if os.geteuid() != 0:
        return "not root: cannot mount"
    if shutil.which("mount") is None:
        return "mount(8) not found"
    return None


def _mount(*args: str) -> None:
    r = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"MOUNT FAILED, TEST NOT RUN: mount {' '.join(args)}: {r.stderr.strip()}")


@contextlib.contextmanager
def mounted(*args: str):
    target = args[-1]
    _mount(*args)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)


@pytest.fixture(autouse=True)
def _no_leaked_mounts(tmp_path):
    """Whatever a test mounted under tmp_path is unmounted, even where it was moved (into a trash)."""
    yield
    if _DEEP:
        _DEEP.clear()
        for trash in tmp_path.glob("*/.kcache/trash"):  # where a failed clear may have moved one
            fsdelete.remove_under(trash.parent, "trash")
        for top in tmp_path.iterdir():
            fsdelete.remove_under(tmp_path, top.name)
    if os.geteuid() == 0:
        for m in sorted(fsdelete.mount_points_under(os.path.realpath(tmp_path)), key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True, check=False)


need_mount = pytest.mark.skipif(_can_mount() is not None,
                                reason=f"SKIPPED LOUDLY: {_can_mount()} (mount and full-disk cases not exercised)")


# ---- 1. races with symlinks ----------------------------------------------------------------------
class Swapper(threading.Thread):
    """Replaces `targets` with symlinks to the victim, and back, as fast as it can."""

    def __init__(self, root: Path, targets: list[str], victim: Path):
        super().__init__(daemon=True)
        self.root, self.targets, self.victim = root, targets, victim
        self.stop = threading.Event()
        self.lock = threading.Lock()  # held by the test while it adds things to remove (never through a link)
        self.swaps = 0

    def run(self) -> None:
        while not self.stop.is_set():
            for rel in self.targets:
                with self.lock:
                    self._swap(rel)

    def _swap(self, rel: str) -> None:
        # set aside under a hidden name: `add.aside` would itself be an op directory (whose entry, judged
        # corrupt for sitting under the wrong op, prune --broken would rightly remove)
        p = self.root / rel
        aside = p.parent / f".{p.name}.aside"
        try:
            os.rename(p, aside)
        except OSError:
            return
        try:
            os.symlink(self.victim, p)
            self.swaps += 1
            time.sleep(0.0005)
            os.unlink(p)
        except OSError:
            pass
        finally:
            try:
                os.rename(aside, p)
            except OSError:
                pass


@pytest.mark.parametrize("command", ["prune", "--yes", "clear"])
def test_swapper_never_redirects_a_deletion(fixture_copy, tmp_path, command):
    victim = make_victim(tmp_path)
    before = snapshot(victim)
    root = fixture_copy("hidet")
    (root / ".kcache/trash").mkdir(parents=True)
    targets = [".kcache/trash", "ops/cuda_space_0", "ops/cuda_space_0/add", "ops/cpu_space_0"]
    swapper = Swapper(root, targets, victim)
    swapper.start()
    try:
        for i in range(6):
            # something to remove each round: a stale temp dir, leftovers in the trash, an entry
            tmp = root / f"ops/cpu_space_0/relu/.kcache-tmp-31857fe085635b31-{i:04x}"
            with swapper.lock:
                tmp.mkdir(parents=True)
                (tmp / "lib.so").write_bytes(b"x" * 100)
                age(tmp, 2 * HOUR)
                (root / ".kcache/trash" / f"old-{i}" / "sub").mkdir(parents=True)
            args = (["prune", "--yes", "--broken", "--json"] if command == "prune"
                    else ["clear", "--op", "relu", "--yes", "--json"])
            p = cli("--cache-dir", root, *args)
            assert p.returncode in (0, 1), p.stderr
            if p.returncode == 1:
                assert p.stderr.strip().splitlines()[-1].startswith("Error: "), p.stderr
    finally:
        swapper.stop.set()
        swapper.join(10)
    assert swapper.swaps > 0
    assert snapshot(victim) == before
    # the cache keeps what it should: the complete entries the commands did not select
    assert (root / ADD / "lib.so").is_file() and (root / SOFTMAX / "lib.so").is_file()


def test_trash_swapped_while_waiting_for_the_gc_lock(fixture_copy, tmp_path):
    victim = make_victim(tmp_path)
    before = snapshot(victim)
    root = fixture_copy("hidet")
    locks = root / ".kcache/locks"
    locks.mkdir(parents=True)
    (root / ".kcache/trash/leftover").mkdir(parents=True)
    gc = locks / ".gc.lock"
    gc.touch()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_FLOCK, str(gc)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        prune = subprocess.Popen([sys.executable, "-m", "kcache_cli", "--cache-dir", str(root), "clear", "--all",
                                  "--yes"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert "waiting" in prune.stderr.readline()
        # while it waits: the trash becomes a link to the victim
        os.rename(root / ".kcache/trash", root / ".kcache/trash.real")
        os.symlink(victim, root / ".kcache/trash")
    finally:
        holder.stdin.close()
        holder.wait(TIMEOUT)
    _, err = prune.communicate(timeout=TIMEOUT)
    assert "Traceback" not in err
    assert prune.returncode == 1 and "symlink" in err.strip().splitlines()[-1], err
    assert snapshot(victim) == before
    assert (root / ADD / "lib.so").is_file()  # refused before removing anything


def test_locks_swapped_while_waiting_is_refused(fixture_copy, tmp_path):
    victim = make_victim(tmp_path)
    before = snapshot(victim)
    root = fixture_copy("hidet")
    locks = root / ".kcache/locks"
    locks.mkdir(parents=True)
    gc = locks / ".gc.lock"
    gc.touch()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_FLOCK, str(gc)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        prune = subprocess.Popen([sys.executable, "-m", "kcache_cli", "--cache-dir", str(root), "prune", "--yes",
                                  "--max-size", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert "waiting" in prune.stderr.readline()
        os.rename(root / ".kcache", root / ".kcache-moved")
        os.mkdir(root / ".kcache")
        os.symlink(victim, root / ".kcache/locks")
    finally:
        holder.stdin.close()
        holder.wait(TIMEOUT)
    _, err = prune.communicate(timeout=TIMEOUT)
    assert "Traceback" not in err and prune.returncode == 1, err
    assert err.strip().splitlines()[-1].startswith("Error: ") and "nothing was removed" in err
    assert snapshot(victim) == before
    assert (root / ADD / "lib.so").is_file()


# ---- 2. mounts -----------------------------------------------------------------------------------
@need_mount
def test_bind_mount_inside_an_entry_is_never_crossed(fixture_copy, tmp_path):
    victim = make_victim(tmp_path)
    before = snapshot(victim)
    root = fixture_copy("hidet")
    inside = root / ADD / "candidates"
    inside.mkdir()
    with mounted("--bind", str(victim), str(inside)):
        p = cli("--cache-dir", root, "clear", "--all", "--yes", "--json")
        assert p.returncode == 0, p.stderr
        data = json.loads(p.stdout)
        assert ADD not in removed(p) and SOFTMAX in removed(p)
        assert any(s["why"].startswith("holds the mount point") for s in data["skipped"])
        assert snapshot(victim) == before
        # a mount that appears inside the trash: reported, never crossed, and it blocks no later prune
        junk = root / ".kcache/trash/old-batch/0-entry/sub"
        junk.mkdir(parents=True)
        with mounted("--bind", str(victim), str(junk)):
            p = cli("--cache-dir", root, "prune", "--yes", "--max-size", "0", "--json")
            assert p.returncode == 1 and "never crossed" in p.stderr, p.stderr
            assert snapshot(victim) == before
            assert not (root / "ops/cpu_space_0").exists()  # the prune still did its work
    assert snapshot(victim) == before


@need_mount
def test_entry_on_another_filesystem_is_removed_in_place(fixture_copy, tmp_path):
    """The op directory is a tmpfs: renaming its entries into the trash fails with EXDEV, so they are
    removed in place, fd-relative; an entry that is itself a mount point is left alone."""
    victim = make_victim(tmp_path)
    before = snapshot(victim)
    root = fixture_copy("hidet")
    op = root / "ops/cuda_space_0/add"
    saved = tmp_path / "saved"
    shutil.copytree(op, saved)
    with mounted("-t", "tmpfs", "-o", "size=4m", "tmpfs", str(op)):
        shutil.copytree(saved, op, dirs_exist_ok=True)
        os.symlink(victim, op / "8d1f7691cdf75e90" / "victim-link")
        entry_mount = root / SOFTMAX
        with mounted("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(entry_mount)):
            (entry_mount / "lib.so").write_bytes(b"\x7fELF")
            p = cli("--cache-dir", root, "clear", "--space", "cuda_space_0", "--yes", "--json")
            assert p.returncode == 0, p.stderr
            assert removed(p) == {ADD}
            assert not (root / ADD).exists() and op.is_dir()
            assert (entry_mount / "lib.so").is_file()
            skipped = {s["path"]: s["why"] for s in json.loads(p.stdout)["skipped"]}
            assert "mount point" in skipped[str(root / SOFTMAX)]
    assert snapshot(victim) == before


# ---- 3. positive evidence ------------------------------------------------------------------------
def make_fake_home(home: Path) -> None:
    for rel in ("scripts/backup", "programs/editor/bin", "graphs/2024", "ops/notes/old", "1.2/notes",
                "3.10.4/linux-x86_64/.staging/draft", "0.1/.staging/work", "ops/cuda_space/add/0123456789abcdef",
                "programs/abcdefabcdef", "scripts/tool/v1-0123abcd", "graphs/0123456789abcdef"):
        (home / rel).mkdir(parents=True)
        (home / rel / "file.txt").write_text("mine")
    (home / "scripts/deploy.sh").write_text("#!/bin/sh\n")
    age(home, 30 * 86400)


def test_a_home_like_directory_is_not_a_cache(tmp_path):
    home = Path(os.environ["HOME"])
    make_fake_home(home)
    lookalike = tmp_path / "lookalike"
    make_fake_home(lookalike)
    before = snapshot(lookalike)
    assert cli("--cache-dir", home, "clear", "--all", "--yes").returncode == 2
    p = cli("--cache-dir", home, "prune")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "home directory" in p.stderr
    for args in (["clear", "--all", "--yes"], ["prune", "--broken"], ["prune", "--max-size", "0"],
                 ["prune", "--yes", "--older-than", "1d"]):
        p = cli("--cache-dir", lookalike, *args)
        assert p.returncode == 0, p.stderr
    assert json.loads(cli("--cache-dir", lookalike, "ls", "--json").stdout)["entries"] == []
    assert snapshot(lookalike) == before


@pytest.mark.parametrize("value", ["", "/"])
def test_empty_and_root_cache_dir_are_refused(value):
    for args in (["--cache-dir", value, "clear", "--all", "--yes"], ["clear", "--all", "--yes", "--cache-dir", value]):
        p = cli(*args)
        assert p.returncode == 2 and p.stderr.startswith("Error: ") and p.stderr.count("\n") == 1, p.stderr


def test_only_entry_shaped_directories_are_removed(fixture_copy):
    root = fixture_copy("hidet")
    odd = {"ops/cuda_space_0/add/not-a-hash": "lib.so", "ops/cuda_space_0/add/0123456789abcdef": "notes.txt",
           "ops/cuda_space_0/add/.hidden": "lib.so"}
    for rel, name in odd.items():
        (root / rel).mkdir()
        (root / rel / name).write_text("mine")
    age(root / "ops", 40 * 86400)
    p = cli("--cache-dir", root, "clear", "--all", "--yes", "--json")
    assert p.returncode == 0, p.stderr
    assert all((root / rel / name).is_file() for rel, name in odd.items())
    kept = {os.path.relpath(s["path"], root): s["why"] for s in json.loads(p.stdout)["skipped"]}
    assert set(odd) <= set(kept) and all(kept[rel].startswith("left alone: not shaped like") for rel in odd)
    assert ADD in removed(p)


def test_tilelang_staging_only_under_a_real_version_directory(fixture_copy):
    root = fixture_copy("tilelang")
    real = root / "0.1.15/linux-x86_64/.staging/old"
    fake = root / "9.9/linux/.staging/old"
    for d in (real, fake):
        d.mkdir(parents=True)
        (d / "executable.so").write_bytes(b"1" * 10)
        age(d, 3 * HOUR)
    p = cli("--cache-dir", root, "prune", "--yes", "--json")
    assert p.returncode == 0, p.stderr
    assert removed(p) == {"0.1.15/linux-x86_64/.staging/old"}
    assert (fake / "executable.so").is_file()


def test_roots_kcache_creates_are_tagged_and_the_tag_is_evidence(fixture_copy, tmp_path):
    src = fixture_copy("hidet")
    arc = tmp_path / "a.tar"
    assert cli("--cache-dir", src, "export", arc).returncode == 0
    dst = tmp_path / "new" / "cache"
    assert cli("--cache-dir", dst, "import", arc).returncode == 0
    tag = (dst / "CACHEDIR.TAG").read_bytes()
    assert tag.startswith(b"Signature: 8a477f597d28d172789f06886806bc55")
    assert state.has_cachedir_tag(dst)
    # a tagged root is a cache even before it holds a space: ops/ alone counts with the tag
    bare = tmp_path / "bare"
    (bare / "ops").mkdir(parents=True)
    from kcache_cli.catalog.scan import detect_layouts

    assert detect_layouts(bare) == ()
    state.write_cachedir_tag(bare)
    assert detect_layouts(bare) == ("hidet",)


# ---- 4. full disk ---------------------------------------------------------------------------------
@need_mount
@pytest.mark.parametrize("state_dir", ["none", "locks only"])
def test_full_disk_prune_and_clear_free_space_in_place(fixture_copy, tmp_path, state_dir):
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("SKIPPED LOUDLY: mkfs.ext4 not found: the full-disk case is not exercised")
    img, mnt = tmp_path / "disk.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(8 << 20)
    r = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-N", "256", str(img)], capture_output=True, text=True,
                       check=False)
    if r.returncode != 0:
        pytest.skip(f"SKIPPED LOUDLY: mkfs.ext4 failed: {r.stderr.strip()}")
    with mounted("-o", "loop", str(img), str(mnt)):
        root = mnt / "cache"
        shutil.copytree(fixture_copy("hidet"), root, symlinks=True)
        if state_dir == "locks only":
            (root / ".kcache/locks").mkdir(parents=True)
        with contextlib.suppress(OSError), open(mnt / "filler", "wb") as f:  # until the disk is full
            while True:
                f.write(b"\0" * (64 << 10))
        with contextlib.suppress(OSError):  # and its inodes: no directory or file can be created
            for i in range(10_000):
                (mnt / f"i{i}").touch()
        with pytest.raises(OSError):
            (root / "probe").mkdir()
        p = cli("--cache-dir", root, "clear", "--op", "add", "--yes", "--json")
        assert p.returncode == 0, p.stderr
        assert removed(p) == {ADD} and not (root / ADD).exists()
        assert any("in place" in w for w in json.loads(p.stdout)["warnings"])
        p = cli("--cache-dir", root, "prune", "--yes", "--max-size", "0", "--json")
        assert p.returncode == 0, p.stderr
        assert not list(root.glob("ops/*/*/*/lib.so"))


# ---- 5. build refuses the links prune refuses -----------------------------------------------------
CPU_TASK = "ops/cpu_space_0/relu/31857fe085635b31"


def _task(fixture_copy, tmp_path) -> Path:
    src = fixture_copy("hidet", "task-src")
    t = tmp_path / "task"
    t.mkdir()
    shutil.copy(src / CPU_TASK / "task.txt", t / "task.txt")
    (t / "source.cc").write_text('extern "C" int relu_probe() { return 1; }\n')  # compiles without hidet
    return t / "task.txt"


@pytest.mark.parametrize("link", [".kcache", ".kcache/locks", ".kcache/used", "ops/cpu_space_0",
                                  "ops/cpu_space_0/relu"])
def test_build_refuses_symlinked_state_and_op_dirs(fixture_copy, tmp_path, link):
    if shutil.which("g++") is None:
        pytest.skip("g++ not found")
    victim = make_victim(tmp_path)
    before = snapshot(victim)
    task = _task(fixture_copy, tmp_path)
    root = tmp_path / "cache"
    (root / link).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(victim, root / link)
    p = cli("--cache-dir", root, "build", task, "--force")
    assert p.returncode == 1, p.stderr
    assert p.stderr.startswith("Error: ") and "symlink" in p.stderr, p.stderr
    assert snapshot(victim) == before


def test_build_hit_never_stamps_through_a_linked_used_dir(fixture_copy, tmp_path):
    victim = make_victim(tmp_path)
    before = snapshot(victim)
    task = _task(fixture_copy, tmp_path)
    root = fixture_copy("hidet")
    (root / ".kcache").mkdir()
    os.symlink(victim, root / ".kcache/used")
    p = cli("--cache-dir", root, "build", task)
    assert p.returncode == 0 and p.stdout.strip() == str(root / CPU_TASK), p.stderr
    assert snapshot(victim) == before


def test_build_tags_a_root_it_creates(fixture_copy, tmp_path):
    if shutil.which("g++") is None:
        pytest.skip("g++ not found")
    task = _task(fixture_copy, tmp_path)
    root = tmp_path / "brand" / "new"
    p = cli("--cache-dir", root, "build", task)
    assert p.returncode == 0, p.stderr
    assert state.has_cachedir_tag(root) and (root / CPU_TASK / "lib.so").is_file()


# ---- 6. deep trees ---------------------------------------------------------------------------------
# 2,500 levels is past Python's recursion limit (1,000) and past PATH_MAX as a path ("d/" a level): it proves
# that removal neither recurses nor builds paths. The slow tier also runs the 10,000 levels users met.
DEPTHS = [2_500, pytest.param(10_000, marks=pytest.mark.slow)]


@pytest.mark.parametrize("depth", DEPTHS)
def test_ten_thousand_deep_tree_cleared_then_pruned(fixture_copy, tmp_path, depth):
    root = fixture_copy("hidet")
    deep_tree(root / ADD, "candidates", depth)
    p = cli("--cache-dir", root, "clear", "--op", "add", "--yes")
    assert p.returncode == 0, p.stderr
    assert not (root / ADD).exists() and not os.listdir(root / ".kcache/trash")
    # a deep tree a killed run left in the trash blocks no later prune
    deep_tree(root / ".kcache/trash", "killed-run", depth)
    p = cli("--cache-dir", root, "prune", "--yes", "--max-size", "0")
    assert p.returncode == 0, p.stderr
    assert not os.listdir(root / ".kcache/trash") and not list(root.glob("ops/*/*/*"))


@pytest.mark.parametrize("depth", DEPTHS)
def test_deep_removal_keeps_few_descriptors_open(tmp_path, depth):
    """With RLIMIT_NOFILE at 64, a 10,000-deep tree still goes: descriptors are reopened, not kept."""
    deep_tree(tmp_path, "deep", depth)
    code = ("import os, resource, sys\nfrom kcache_cli.fs import delete as fsdelete\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
            "r = fsdelete.remove_tree(fd, 'deep')\nprint(r.gone, r.problems)\n")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                       timeout=TIMEOUT, check=False)
    assert p.returncode == 0 and p.stdout.startswith("True []"), p.stderr
    assert not (tmp_path / "deep").exists()


def test_fsdelete_unlinks_links_and_makes_its_own_dirs_writable(tmp_path):
    victim = make_victim(tmp_path)
    before = snapshot(victim)
    top = tmp_path / "t"
    (top / "a/b").mkdir(parents=True)
    (top / "a/b/f").write_text("x")
    os.symlink(victim, top / "a/link")
    os.symlink(victim / "keep", top / "a/b/dirlink")
    (top / "a/b").chmod(0o500)
    (top / "a").chmod(0o500)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        r = fsdelete.remove_tree(fd, "t")
    finally:
        os.close(fd)
    assert r.gone and not top.exists()
    assert snapshot(victim) == before


# ---- 7. leftovers of killed imports and exports ----------------------------------------------------
@contextlib.contextmanager
def flock_held(path: Path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD_FLOCK, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.stdin.close()
        holder.wait(TIMEOUT)


def test_killed_import_and_export_leftovers_are_listed_and_pruned(fixture_copy):
    root = fixture_copy("hidet")
    staging = root / ".kcache/import-999999999-abcd"
    (staging / "ops").mkdir(parents=True)
    (staging / "ops/lib.so").write_bytes(b"x" * 1000)
    temp = root / ".kernels.tar.abc123.kcache-tmp"
    temp.write_bytes(b"y" * 500)
    live_temp = root / ".other.tar.def456.kcache-tmp"
    live_temp.write_bytes(b"z" * 10)
    age(staging, 2 * HOUR)
    os.utime(temp, (time.time() - HOUR, time.time() - HOUR))
    os.utime(live_temp, (time.time() - HOUR, time.time() - HOUR))
    with flock_held(live_temp):
        rows = json.loads(cli("--cache-dir", root, "ls", "--status", "partial", "--json").stdout)["entries"]
        got = {(r["layout"], r["kind"], r["hash"]) for r in rows}
        assert got == {("kcache", "import", staging.name), ("kcache", "export", temp.name)}
        stats = json.loads(cli("--cache-dir", root, "stats", "--json").stdout)
        # sizes on disk (issue 32): the staging tree's directories and each file's blocks, as du counts
        on_disk = subprocess.run(["du", "-sB1", "-c", str(staging), str(temp), str(live_temp)], capture_output=True,
                                 text=True, check=True).stdout.splitlines()[-1].split()[0]
        assert stats["by_layout"]["kcache"] == {"entry_count": 3, "size": int(on_disk)}
        p = cli("--cache-dir", root, "prune", "--yes", "--json")
        assert p.returncode == 0, p.stderr
        assert removed(p) == {".kcache/" + staging.name, temp.name}
        assert not staging.exists() and not temp.exists() and live_temp.is_file()
    assert (root / ADD / "lib.so").is_file()


def test_export_collects_stale_temps_and_leaves_live_ones(fixture_copy, tmp_path):
    root = fixture_copy("hidet")
    out = tmp_path / "out"
    out.mkdir()
    stale, live = out / ".a.tar.x1.kcache-tmp", out / ".a.tar.x2.kcache-tmp"
    for f in (stale, live):
        f.write_bytes(b"0" * 10)
        os.utime(f, (time.time() - HOUR, time.time() - HOUR))
    with flock_held(live):
        assert cli("--cache-dir", root, "export", out / "a.tar").returncode == 0
        assert not stale.exists() and live.exists()


def test_export_killed_by_sigterm_removes_its_temp_files(tmp_path):
    sys.path.insert(0, str(REPO / "bench"))
    from gen_cache import generate

    root = tmp_path / "gen"
    generate(str(root), 3000)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "kcache_cli", "-q", "--cache-dir", str(root), "export",
                             str(out / "big.tar.gz"), "--status", "complete,partial,corrupt,failed"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None and not list(out.glob(".*.kcache-tmp")):
        time.sleep(0.01)
    proc.terminate()
    _, err = proc.communicate(timeout=TIMEOUT)
    assert "Traceback" not in err
    assert not list(out.glob(".*.kcache-tmp"))


def test_a_reopened_directory_must_be_the_one_entered(tmp_path, monkeypatch):
    """With few descriptors kept, going back up reopens `..`; when the subtree was moved meanwhile
    (here: out of the tree, next to the victim's files), `..` is another directory: the removal stops
    there and deletes nothing of it."""
    monkeypatch.setattr(fsdelete, "_OPEN_WINDOW", 2)
    top = tmp_path / "t"
    (top / "b/c/d/e").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("x")
    real_rmdir = os.rmdir
    moved = []

    def rmdir(name, *, dir_fd=None):
        if name == "e" and not moved:  # the walk is at the bottom: move its branch away first
            os.rename(top / "b/c/d", elsewhere / "d")
            moved.append(True)
        return real_rmdir(name, dir_fd=dir_fd)

    monkeypatch.setattr(os, "rmdir", rmdir)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        r = fsdelete.remove_tree(fd, "t")
    finally:
        os.close(fd)
    assert moved and not r.gone and any("moved during the removal" in e for e in r.errors)
    assert (elsewhere / "precious").read_text() == "x" and (elsewhere / "d").is_dir()
