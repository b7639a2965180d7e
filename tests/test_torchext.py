"""torch extensions (torch.utils.cpp_extension.load / load_inline): the real build directory torch 2.13
made here (tests/fixtures/real/torch_ext/), judged by torch's loader rules, and the `lock` a killed build
leaves (torch's FileBaton: every later load waits for ever) found and removed by verify --fix, never one
that a live process holds. The real torch agrees in tests/test_oracle_torchext.py (slow)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_kcache

from kcache_cli.fs import delete as fsdelete

REAL = Path(__file__).parent / "fixtures" / "real" / "torch_ext"
EXT = "kc_add_one"
HOLDER = """
import os, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL)  # torch's FileBaton.try_acquire
print("held", flush=True)
sys.stdin.read()
"""


BUILT_IN = "/tmp/wt37fx/torch_ext"  # where the fixture's build.ninja says torch built it


def built_here(where: Path) -> Path:
    """The real build directory copied to `where`, with build.ninja as torch writes it for a build there
    (the source load_inline wrote in it named by its path there): complete, not a copy from elsewhere."""
    shutil.copytree(REAL, where)
    ninja = where / EXT / "build.ninja"
    ninja.write_text(ninja.read_text().replace(f"{BUILT_IN}/{EXT}/", f"{where}/{EXT}/"))
    return where


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return built_here(tmp_path / "torch_extensions" / "py311_cpu")


def rows(root: Path) -> dict[str, dict]:
    return {r["hash"]: r for r in run_kcache("--cache-dir", root, "ls", "--json").json()["entries"]}


def old_lock(path: Path) -> None:
    path.touch()
    then = time.time() - 60
    os.utime(path, (then, then))


def test_the_real_build_is_one_complete_extension(root, monkeypatch):
    got = rows(root)[EXT]
    assert (got["layout"], got["kind"], got["target"], got["status"], got["file_count"]) == (
        "torchext", "extension", "cpu", "complete", 6)
    shown = run_kcache("--cache-dir", root, "inspect", EXT, "--json").json()
    assert shown["status"] == "complete" and f"-DTORCH_EXTENSION_NAME={EXT}" in shown["compile_command"]
    assert run_kcache("--cache-dir", root, "verify").exit_code == 0
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    row = next(r for r in run_kcache("dir", "--all", "--json").json()["caches"] if r["cache"] == "torchext")
    assert row["path"] == str(root) and row["entry_count"] == 1


@pytest.mark.parametrize(("damage", "status", "words"), [
    ("rm:kc_add_one.so", "partial", "kc_add_one.so missing"),
    ("rm:main.o", "partial", "main.o missing"),
    ("rm:build.ninja", "moved", f".ninja_deps records its build directory as {BUILT_IN}"),  # torch writes it again
    ("empty:build.ninja", "moved", f".ninja_deps records its build directory as {BUILT_IN}"),
    ("rm:build.ninja,.ninja_log", "partial", "no module in ninja's log"),
    ("empty:kc_add_one.so", "corrupt", "kc_add_one.so is empty"),
    ("cut:kc_add_one.so", "corrupt", "truncated"),
])
def test_damage_is_judged_as_torch_would_load_it(root, damage, status, words):
    how, name = damage.split(":")
    target = root / EXT / name.split(",")[0]
    if how == "rm":
        for each in name.split(","):
            (root / EXT / each).unlink()
    else:
        target.write_bytes(b"" if how == "empty" else target.read_bytes()[:4096])
    run = run_kcache("--cache-dir", root, "verify", "--json")
    assert run.exit_code == 1
    [problem] = run.json()["problems"]
    assert problem["status"] == status and words in problem["reason"]


def test_a_module_cut_short_is_corrupt_to_the_cheap_checks_too(root):
    """Cut to half with its mtime kept: ninja takes it as up to date and torch's import dies of it (the
    oracle saw a Bus error). ls and prune --broken without --deep read its ELF header (64 bytes)."""
    module = root / EXT / f"{EXT}.so"
    st = module.stat()
    module.write_bytes(module.read_bytes()[:st.st_size // 2])
    os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns))
    row = rows(root)[EXT]
    assert row["status"] == "corrupt" and "ELF header needs" in row["reason"], row
    dry = run_kcache("--cache-dir", root, "prune", "--broken", "--dry-run", "--json")
    assert [r["hash"] for r in dry.json()["removed"]] == [EXT], dry.stdout


def test_a_module_that_is_a_link_is_never_read_through(root, tmp_path):
    """The module as a symlink (torch follows it): kcache, maybe root over another user's build directory,
    opens nothing a link names (a link to /proc/kmsg took the kernel's messages from its log); a link to a
    whole copy was judged by the link's own size: corrupt, and prune --broken would have removed it. It is
    unreadable (checks.not_regular: never judged, never removed), in ls and verify alike."""
    module = root / EXT / f"{EXT}.so"
    copy = tmp_path / "elsewhere.so"
    shutil.copy(module, copy)
    module.unlink()
    module.symlink_to(copy)
    assert rows(root)[EXT]["status"] == "unreadable"
    module.unlink()
    module.symlink_to("/proc/self/pagemap")
    assert rows(root)[EXT]["status"] == "unreadable" and f"{EXT}.so is a symlink" in rows(root)[EXT]["reason"]
    assert run_kcache("--cache-dir", root, "verify").exit_code == 1


def test_a_long_build_ninja_is_read_whole(root):
    """A build.ninja over the 1 MiB kcache read of text files (a long comment first): it was cut there,
    lost its `default` line, and a working extension was corrupt (prune --broken would remove it)."""
    ninja = root / EXT / "build.ninja"
    ninja.write_text("# " + "x" * (1100 << 10) + "\n" + ninja.read_text())
    assert rows(root)[EXT]["status"] == "complete"


def test_a_module_nobody_may_read_is_unreadable_not_broken(root):
    module = root / EXT / f"{EXT}.so"
    module.chmod(0)
    try:
        assert rows(root)[EXT]["status"] == "unreadable"
        dry = run_kcache("--cache-dir", root, "prune", "--broken", "--dry-run", "--json")
        assert dry.json()["removed"] == [], dry.stdout
    finally:
        module.chmod(0o644)


def test_a_copy_elsewhere_is_moved_and_names_where_it_was_built(root, tmp_path):
    """`cp -a` of a build directory to another root: torch writes build.ninja with the new path, ninja
    finds the compile command changed and builds it all again (the oracle times it): moved, not complete."""
    elsewhere = tmp_path / "moved" / "py311_cpu"
    shutil.copytree(root, elsewhere, symlinks=True)
    row = rows(elsewhere)[EXT]
    assert row["status"] == "moved", row
    assert f"records its build directory as {root / EXT} " in row["reason"]
    assert "torch builds it again here" in row["reason"] and "cannot relocate" in row["reason"]
    assert rows(root)[EXT]["status"] == "complete"  # the original stays a hit
    run = run_kcache("--cache-dir", elsewhere, "verify", "--json")
    assert run.exit_code == 1 and run.json()["problems"][0]["status"] == "moved"
    before = (elsewhere / EXT / "build.ninja").read_bytes()
    fixed = run_kcache("--cache-dir", elsewhere, "verify", "--fix")
    assert fixed.exit_code == 1 and "--fix changed nothing" in fixed.stderr and "rewrote" not in fixed.stderr
    assert (elsewhere / EXT / "build.ninja").read_bytes() == before  # no relocation ninja would not honour
    pruned = run_kcache("--cache-dir", elsewhere, "prune", "--broken", "--yes", "--json")
    assert pruned.exit_code == 0 and (elsewhere / EXT / f"{EXT}.so").exists()  # not damage: kept


def test_the_shipped_fixture_is_a_copy_from_elsewhere(tmp_path):
    where = tmp_path / "tx"
    shutil.copytree(REAL, where)
    row = rows(where)[EXT]
    assert row["status"] == "moved" and f"{BUILT_IN}/{EXT} " in row["reason"]


def test_a_path_through_a_link_is_the_same_build_directory(root, tmp_path):
    alias = tmp_path / "alias"
    alias.symlink_to(root.parent)
    assert rows(alias / root.name)[EXT]["status"] == "complete"


def test_sources_outside_the_build_directory_say_nothing_of_where_it_lies(root, tmp_path):
    """torch.utils.cpp_extension.load of a project's files: build.ninja names them where they are, which
    stays true wherever the build directory goes (the commands ninja compares do not change)."""
    ninja = root / EXT / "build.ninja"
    ninja.write_text(ninja.read_text().replace(f"{root}/{EXT}/main.cpp", f"{tmp_path}/project/main.cpp"))
    (root / EXT / "main.cpp").unlink()  # load() writes no source into the build directory
    assert rows(root)[EXT]["status"] == "complete"


def test_a_recorded_path_with_an_escaped_space_is_read_as_ninja_reads_it(tmp_path):
    root = built_here(tmp_path / "with space")
    ninja = root / EXT / "build.ninja"
    ninja.write_text(ninja.read_text().replace(str(root), str(root).replace(" ", "$ ")))
    assert rows(root)[EXT]["status"] == "complete"
    elsewhere = tmp_path / "other"
    shutil.copytree(root, elsewhere)
    assert f"as {root / EXT} (moved" in rows(elsewhere)[EXT]["reason"]


def test_export_and_import_say_what_torch_does_with_an_extension_elsewhere(root, tmp_path):
    """A complete extension exported and imported under another path is published and said to be built
    elsewhere (torch builds it again there: moved); imported back at its own path it is complete. A moved
    one is left out of an export unless --status moved asks for it."""
    archive = tmp_path / "tx.tar"
    assert run_kcache("--cache-dir", root, "export", archive).exit_code == 0
    other = tmp_path / "other" / "py311_cpu"
    run = run_kcache("--cache-dir", other, "import", archive, "--json")
    assert run.exit_code == 0, run.stderr
    [entry] = run.json()["entries"]
    assert entry["done"] and f"built in {root / EXT}: torch builds it again here" in entry["reason"], entry
    assert rows(other)[EXT]["status"] == "moved"
    left = run_kcache("--cache-dir", other, "export", tmp_path / "again.tar", "--json")
    assert left.exit_code == 0 and left.json()["archive"] is None, left.stderr  # nothing to export: nothing to do
    assert "select it with --status moved" in left.stderr and not (tmp_path / "again.tar").exists()
    shipped = run_kcache("--cache-dir", other, "export", tmp_path / "again.tar", "--status", "moved", "--json")
    assert shipped.exit_code == 0 and len(shipped.json()["exported"]) == 1, shipped.stderr
    shutil.rmtree(root / EXT)
    back = run_kcache("--cache-dir", root, "import", tmp_path / "again.tar", "--json")
    assert back.exit_code == 0 and back.json()["entries"][0]["reason"] is None, back.stdout
    assert rows(root)[EXT]["status"] == "complete"  # at the path it was built at: a hit again


def test_a_left_lock_is_reported_and_removed_by_verify_fix(root):
    old_lock(root / EXT / "lock")
    assert rows(root)[EXT]["status"] == "corrupt"  # every load waits for ever: it never compiles again
    run = run_kcache("--cache-dir", root, "verify", "--json")
    assert run.exit_code == 1 and "waits for ever" in run.json()["problems"][0]["reason"]
    fixed = run_kcache("--cache-dir", root, "verify", "--fix", "--json")
    assert fixed.exit_code == 0, fixed.stderr
    assert [e["hash"] for e in fixed.json()["fixed"]] == [EXT]
    assert not (root / EXT / "lock").exists() and (root / EXT / f"{EXT}.so").exists()
    assert rows(root)[EXT]["status"] == "complete"


def test_verify_fix_says_it_removed_the_lock(root):
    old_lock(root / EXT / "lock")
    run = run_kcache("--cache-dir", root, "verify", "--fix")
    assert run.exit_code == 0 and "removed the left lock of 1 entry" in run.stderr, run.stderr


def test_a_left_lock_says_loads_already_waiting_fail(root):
    """torch's FileBaton.wait returns when the lock vanishes and torch imports the module unbuilt: a load
    waiting on a killed build's lock dies of ImportError once --fix removes it (the real torch does). The
    reason and --fix say so: only new loads build."""
    (root / EXT / f"{EXT}.so").unlink()
    old_lock(root / EXT / "lock")
    reason = rows(root)[EXT]["reason"]
    assert "already waiting" in reason and "restarted" in reason and "finishes" not in reason, reason
    run = run_kcache("--cache-dir", root, "verify", "--fix")
    assert run.exit_code == 1 and "removed the left lock of 1 entry (a torch load already waiting" in run.stderr
    assert "restart it (new loads build)" in run.stderr, run.stderr


def test_verify_fix_json_says_what_removing_a_lock_means_for_waiting_loads(root):
    """The text of verify --fix says that a torch load already waiting on the lock it removed fails and must
    be restarted; --json said nothing of it. It carries the same note, and none when no lock was removed."""
    from kcache_cli.layouts.torchext import UNLOCKED

    (root / EXT / f"{EXT}.so").unlink()
    old_lock(root / EXT / "lock")
    run = run_kcache("--cache-dir", root, "verify", "--fix", "--json")
    assert run.exit_code == 1 and run.json()["lock_removal_notes"] == [UNLOCKED], run.stdout
    from test_json_schemas import check

    check(run.json(), "verify")
    again = run_kcache("--cache-dir", root, "verify", "--fix", "--json")
    assert again.json()["lock_removal_notes"] == [], again.stdout


def test_a_lock_a_live_process_holds_is_never_removed(root):
    lock = root / EXT / "lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        then = time.time() - 600
        os.utime(lock, (then, then))  # old, but held open: the holder decides, not the age
        got = rows(root)[EXT]
        assert got["status"] == "building" and str(holder.pid) in got["reason"]
        _nothing_removes(root, lock)
    finally:
        holder.communicate("")
    assert rows(root)[EXT]["status"] == "corrupt"  # the holder ended without removing it: now it is stale


def test_a_left_lock_is_never_removed_while_a_process_works_in_the_build_directory(root):
    """torch killed alone leaves ninja and its compilers building in the directory, without the lock's
    descriptor: while one of them works there (its cwd) the entry is building and nothing removes it."""
    lock = root / EXT / "lock"
    old_lock(lock)
    worker = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], cwd=root / EXT,
                              stdin=subprocess.PIPE, text=True)
    try:
        got = rows(root)[EXT]
        assert got["status"] == "building" and f"process {worker.pid} still builds in it" in got["reason"], got
        _nothing_removes(root, lock)
    finally:
        worker.communicate("")
    assert rows(root)[EXT]["status"] == "corrupt"


def _nothing_removes(root: Path, lock: Path) -> None:
    """A building entry: `verify --fix` skips it and keeps its lock, `prune --broken` keeps the lock and module."""
    fixed = run_kcache("--cache-dir", root, "verify", "--fix", "--json")
    assert fixed.exit_code == 0 and fixed.json()["skipped_building"] == 1 and lock.exists()
    pruned = run_kcache("--cache-dir", root, "prune", "--broken", "--yes", "--json")
    assert pruned.exit_code == 0 and lock.exists() and (root / EXT / f"{EXT}.so").exists()


def test_prune_broken_takes_an_entry_with_a_stale_lock_as_garbage(root):
    old_lock(root / EXT / "lock")
    run = run_kcache("--cache-dir", root, "prune", "--broken", "--yes", "--json")
    assert run.exit_code == 0, run.stderr
    assert not (root / EXT).exists()


def test_a_lock_that_is_a_link_is_not_followed(root, tmp_path):
    outside = tmp_path / "precious"
    outside.write_text("keep\n")
    os.symlink(outside, root / EXT / "lock")
    run = run_kcache("--cache-dir", root, "verify", "--fix", "--json")
    assert run.exit_code == 1 and "not torch's lock file" in run.json()["problems"][0]["reason"]
    assert outside.read_text() == "keep\n" and os.path.islink(root / EXT / "lock")
    assert "a directory" not in run.json()["problems"][0]["reason"]  # a link's reason says a link's


def test_a_lock_that_is_a_directory_is_what_torch_waits_on(root):
    """torch's O_CREAT|O_EXCL fails on a directory named `lock` as on its file, and every load then waits for
    ever: the entry was listed complete (the file listing leaves subdirectories out). Nothing is read."""
    (root / EXT / "lock").mkdir()
    row = rows(root)[EXT]
    assert row["status"] == "corrupt" and "is a directory, not torch's lock file" in row["reason"]
    assert "a a " not in row["reason"]
    run = run_kcache("--cache-dir", root, "verify", "--json")
    assert run.exit_code == 1


def test_a_flock_left_by_a_killed_holder_is_never_stale(tmp_path):
    """Inductor's locks/*.lock and kcache's own are flocks (filelock): the kernel drops one with its holder,
    so a lock file left behind blocks no one and kcache reports none of them."""
    from filelock import FileLock

    from kcache_cli.fs.locking import probe_locked

    lock = tmp_path / "locks" / "key.lock"
    lock.parent.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, filelock; l = filelock.FileLock(sys.argv[1]); "
                               "l.acquire(); print('held', flush=True); sys.stdin.read()", str(lock)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    assert probe_locked(lock)
    holder.kill()
    holder.wait()
    assert lock.exists() and not probe_locked(lock)
    with FileLock(str(lock)).acquire(timeout=1):
        pass


def test_remove_held_file_removes_only_the_file_judged(tmp_path):
    tmp_path = tmp_path / "d"
    tmp_path.mkdir()
    (tmp_path / "lock").touch()
    seen = os.lstat(tmp_path / "lock")
    (tmp_path / "lock").unlink()
    (tmp_path / "lock").touch()  # a new builder's lock, made after the judgement (its inode number reused)
    os.utime(tmp_path / "lock", ns=(seen.st_mtime_ns + 1000, seen.st_mtime_ns + 1000))
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError):
            fsdelete.remove_held_file(fd, "lock", seen)
        assert (tmp_path / "lock").exists() and sorted(os.listdir(tmp_path)) == ["lock"]
        fsdelete.remove_held_file(fd, "lock", os.lstat(tmp_path / "lock"))
        assert os.listdir(tmp_path) == []
    finally:
        os.close(fd)


@pytest.mark.parametrize(("version_py", "folder"), [
    ("cuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n", "cu128"),
    ("cuda = None\nhip = '6.4.1'\n", "rocm641"),
    ("cuda: Optional[str] = None\nhip: Optional[str] = None\n", "cpu"),
])
def test_the_default_root_follows_torchs_rule(tmp_path, monkeypatch, version_py, folder):
    from kcache_cli.layouts import homes

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "version.py").write_text(version_py)
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    got = homes.torchext(tmp_path / "torch")
    assert got.path == Path(os.path.realpath(tmp_path / "xdg" / "torch_extensions")) / (
        f"py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}_{folder}")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    assert homes.torchext(tmp_path / "torch").path == tmp_path / "mine"


def test_every_python_and_accelerator_folder_is_a_torchext_cache(tmp_path, monkeypatch):
    """torch builds in py<XY>_<accelerator>/ of the torch that loads: a CUDA torch on another Python
    (py312_cu128) keeps its extensions where kcache's own rule (its Python, cpu without torch beside it)
    never looks. Each such folder is a root: dir --all names it, and ls's default scope reads it."""
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    base = tmp_path / ".cache" / "torch_extensions"
    cuda = built_here(base / "py312_cu128")
    (base / "not_torchs").mkdir()
    rows = [r for r in run_kcache("dir", "--all", "--json").json()["caches"] if r["cache"] == "torchext"]
    assert [(r["path"], r["entry_count"]) for r in rows] == [(str(cuda), 1)]
    listed = run_kcache("ls", "--layout", "torchext", "--json").json()["entries"]
    assert [(e["hash"], e["status"]) for e in listed] == [(EXT, "complete")]
    own = built_here(base / f"py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}_cpu")
    rows = [r for r in run_kcache("dir", "--all", "--json").json()["caches"] if r["cache"] == "torchext"]
    assert [r["path"] for r in rows] == [str(own), str(cuda)]
    assert all(str(p) in run_kcache("dir", "--all").stdout for p in (own.name, cuda.name))
    assert "another Python's or torch build's" in rows[1]["reason"] and rows[0]["reason"] != rows[1]["reason"]


def test_cache_torchext_names_the_folder_that_is_there(tmp_path, monkeypatch):
    """`--cache torchext` took the folder torch here would use (py311_cpu) even when only another Python's
    was there: "no cache at .../py311_cpu", exit 0, beside a `dir --all` that lists py310_cpu. It takes the
    one folder that is there, and with several, none of them torch's here, names them: pick one."""
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    base = tmp_path / ".cache" / "torch_extensions"
    built_here(base / "py39_cpu")
    listed = run_kcache("ls", "--cache", "torchext", "--json")
    assert listed.exit_code == 0 and [e["hash"] for e in listed.json()["entries"]] == [EXT], listed.stderr
    built_here(base / "py312_cu128")
    two = run_kcache("ls", "--cache", "torchext")
    assert two.exit_code == 2 and "names 2 caches here" in two.stderr and "py39_cpu" in two.stderr, two.stderr
    assert "--cache-dir" in two.stderr


def here_python(tmp_path: Path, torch: str | None, python: str = "3.11.7") -> str:
    """explain's --python as a Python with `torch` (a version, or None)."""
    from conftest import fake_python

    return fake_python(tmp_path, "torch", torch, python)


def verdict(root: Path, python: str) -> dict:
    r = run_kcache("--cache-dir", root, "--json", "explain", "--python", python)
    assert r.exit_code == 0, r.stderr
    (item,) = r.json()["items"]
    return item


def test_explain_judges_an_extension_by_what_torch_loads(root, tmp_path):
    """A dead lock (every load hangs), a moved build (torch builds it all again), torch absent, or a folder
    another Python's or accelerator's torch uses: a miss, saying why. A whole one at its own path: unknown,
    as ninja on the load compares the load's own flags and sources, which kcache cannot know."""
    cpu = here_python(tmp_path, "2.13.0+cpu")
    whole = verdict(root, cpu)
    assert whole["verdict"] == "unknown" and "flags" in whole["why"] and "does not know" not in whole["why"]
    assert verdict(root, here_python(tmp_path, None))["verdict"] == "miss"
    other_py = verdict(root, here_python(tmp_path, "2.13.0+cpu", "3.12.1"))
    assert (other_py["verdict"], other_py["recorded"], other_py["here"]) == ("miss", "3.11", "3.12")
    cuda = verdict(root, here_python(tmp_path, "2.13.0+cu128"))
    assert (cuda["verdict"], cuda["recorded"], cuda["here"]) == ("miss", "cpu", "cu128")
    old_lock(root / EXT / "lock")
    locked = verdict(root, cpu)
    assert locked["verdict"] == "miss" and "waits for ever" in locked["why"], locked
    (root / EXT / "lock").unlink()
    moved = built_here(tmp_path / "elsewhere" / "py311_cpu")
    shutil.rmtree(moved / EXT)
    shutil.copytree(root / EXT, moved / EXT)
    got = verdict(moved, cpu)
    assert got["verdict"] == "miss" and "moved" in got["why"], got
