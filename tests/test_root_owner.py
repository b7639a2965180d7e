"""Root's kcache in a user's own cache (an admin's cron over users' caches): all it makes there, `.kcache/`
included, is the user's (fswrite.owner_for / give_to), so the user can still prune and clear the cache and
their compiler can still write into the op directories kcache published; a `.kcache/` an older root run
left root's is given back by root's next run. The user is uid 65534, run as in test_shared_attacks."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import CXX, FIXTURES
from test_shared_attacks import PY, TIMEOUT, as_user_kcache
from test_shared_cron import root_kcache

pytestmark = [pytest.mark.second_user]
USER = 65534


def as_owner() -> None:
    """preexec_fn: the cache's owner, in no other group, umask 022."""
    os.setgroups([])
    os.setresgid(USER, USER, USER)
    os.setresuid(USER, USER, USER)
    os.umask(0o022)


def owner_kcache(*args: object) -> subprocess.CompletedProcess:
    return as_user_kcache(as_owner, *args)


def user_cache(area: Path, name: str, src: Path | None = FIXTURES / "hidet") -> Path:
    """A cache of USER's own (a copy of `src`, or empty), everything in it USER's, mode as copied (0755)."""
    root = area / name
    if src is None:
        root.mkdir()
    else:
        shutil.copytree(src, root, symlinks=True)
    for dirpath, dirs, files in os.walk(root):
        for p in [dirpath, *(os.path.join(dirpath, n) for n in dirs + files)]:
            os.lchown(p, USER, USER)
    return root


def not_the_users(root: Path) -> list[str]:
    """What under `root` (itself included) is not USER's, uid and gid."""
    bad = []
    for dirpath, dirs, files in os.walk(root):
        for p in [dirpath, *(os.path.join(dirpath, n) for n in dirs + files)]:
            st = os.lstat(p)
            if (st.st_uid, st.st_gid) != (USER, USER):
                bad.append(f"{p} {st.st_uid}:{st.st_gid}")
    return bad


def op_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("ops/*/*") if p.is_dir())


def owner_mkdir(path: Path) -> subprocess.CompletedProcess:
    """The user's compiler making a new entry directory in `path`."""
    return subprocess.run([PY, "-c", "import os, sys; os.mkdir(sys.argv[1]); os.rmdir(sys.argv[1])",
                           str(path / "new-entry")], capture_output=True, text=True, timeout=TIMEOUT,
                          preexec_fn=as_owner, cwd="/")


def assert_still_the_users(root: Path) -> None:
    """Everything the user's: their compiler writes in every op directory, their clear empties the cache."""
    assert not_the_users(root) == []
    assert op_dirs(root), "nothing published"
    for op in op_dirs(root):
        made = owner_mkdir(op)
        assert made.returncode == 0, made.stderr
    cleared = owner_kcache("--cache-dir", root, "clear", "--all", "--yes")
    assert cleared.returncode == 0, cleared.stderr
    assert op_dirs(root) == [] or not any(p.iterdir() for p in op_dirs(root))


def test_roots_clear_and_prune_leave_the_users_cache_the_users(area):
    root = user_cache(area, "own")
    run = root_kcache("-q", "--cache-dir", root, "clear", "--op", "matmul", "--yes")
    assert run.returncode == 0, run.stderr
    run = root_kcache("--cache-dir", root, "prune", "--broken", "--yes")
    assert run.returncode == 0, run.stderr
    assert (root / ".kcache" / "locks").is_dir() and not_the_users(root) == []
    relu = owner_kcache("--cache-dir", root, "clear", "--op", "relu", "--yes")
    assert relu.returncode == 0, relu.stderr
    pruned = owner_kcache("--cache-dir", root, "prune", "--broken", "--yes")
    assert pruned.returncode == 0, pruned.stderr
    assert_still_the_users(root)


def test_roots_import_and_pull_publish_the_users_entries(area):
    src = area / "src"
    shutil.copytree(FIXTURES / "hidet", src)
    arc = area / "h.tar"
    assert root_kcache("--cache-dir", src, "export", arc).returncode == 0
    imported = user_cache(area, "imported", None)
    run = root_kcache("--cache-dir", imported, "import", arc)
    assert run.returncode == 0, run.stderr
    assert_still_the_users(imported)

    (area / "remote").mkdir()
    url = f"file://{area / 'remote'}"
    assert root_kcache("--cache-dir", src, "push", "--remote", url).returncode == 0
    pulled = user_cache(area, "pulled", None)
    run = root_kcache("--cache-dir", pulled, "pull", "--remote", url)
    assert run.returncode == 0, run.stderr
    assert_still_the_users(pulled)


@pytest.mark.skipif(CXX is None, reason="g++ not found")
def test_roots_build_publishes_the_users_entry(area):
    from test_build import write_task

    task = write_task(area / "tasks", name="cpurelu", n=64, kind="cc")
    root = user_cache(area, "built", None)
    run = root_kcache("build", task, "--cache-dir", root, "--cxx", CXX, "--json")
    assert run.returncode == 0, run.stderr
    entry = root / json.loads(run.stdout)["results"][0]["relpath"]
    assert (entry / "lib.so").is_file()
    assert_still_the_users(root)


def test_an_older_roots_state_is_given_back_and_nothing_else(area):
    """A `.kcache/` an older kcache run as root left root's blocks the user's clear, with a hint that works;
    root's next run gives it back, all of it, but never what a link names nor a file with another name."""
    root = user_cache(area, "old")
    victim, hard = area / "victim", area / "hard"
    victim.write_text("root's\n")
    hard.write_text("root's too\n")
    for sub in ("locks", "trash/123-456/gone", "used"):
        (root / ".kcache" / sub).mkdir(parents=True, exist_ok=True)
    (root / ".kcache" / "locks" / "old.lock").write_text("")
    os.chmod(root / ".kcache" / "locks" / "old.lock", 0o600)
    os.chmod(root / ".kcache" / "trash" / "123-456", 0o700)
    os.symlink(victim, root / ".kcache" / "used" / "planted")
    os.link(hard, root / ".kcache" / "locks" / "linked.lock")
    secret = root / ".kcache" / "locks" / "moved.lock"  # a private file of root's the user moved in: stays root's
    secret.write_text("root's secret\n")
    os.chmod(secret, 0o600)

    blocked = owner_kcache("--cache-dir", root, "clear", "--op", "relu", "--yes")
    assert blocked.returncode == 1 and "Permission denied" in blocked.stderr, blocked.stderr
    assert "prune --broken" in blocked.stderr and "back to the cache's owner" in blocked.stderr, blocked.stderr

    run = root_kcache("--cache-dir", root, "prune", "--broken", "--yes")
    assert run.returncode == 0, run.stderr
    linked, planted = root / ".kcache" / "locks" / "linked.lock", root / ".kcache" / "used" / "planted"
    left = {p.split()[0] for p in not_the_users(root)}
    assert str(linked) in left and str(secret) in left, left
    assert left <= {str(linked), str(planted), str(secret)}, left  # (a stale stamp may be tidied)
    assert os.stat(victim).st_uid == 0 and os.stat(hard).st_uid == 0
    assert stat.S_IMODE(os.stat(root / ".kcache" / "locks" / "old.lock").st_mode) == 0o600
    linked.unlink()
    secret.unlink()
    if os.path.lexists(planted):
        planted.unlink()
    relu = owner_kcache("--cache-dir", root, "clear", "--op", "relu", "--yes")
    assert relu.returncode == 0, relu.stderr
    assert_still_the_users(root)


def test_roots_own_index_in_a_users_cache_stays_roots_and_is_used(area):
    """Root's scan index (.kcache/index/scan.0) is root's alone to trust (read_index_file takes only the
    reader's own): given to the user, every cron run would list the cache cold again. It stays root's; the
    user, who owns the directory, may still remove it."""
    from kcache_cli.fs import state

    root = user_cache(area, "indexed")
    started = state.start_index_write(str(root))
    assert started is not None
    state.finish_index_write(*started[:3], b"kcache index bytes", "scan")
    kept = root / ".kcache" / "index" / state.index_name("scan")
    assert os.stat(kept).st_uid == 0 and os.stat(kept.parent).st_uid == USER
    assert state.read_index_file(str(root), "scan", 1 << 20) == b"kcache index bytes"


def test_the_give_back_judges_what_it_holds_open_not_a_listed_name(area):
    """A name the user swaps between the listing and the open must not make a private file of root's
    theirs: the give-back's "nothing new to read" is judged on the descriptor it changes."""
    from kcache_cli.fs import write as fswrite

    private, public, empty = area / "private", area / "public", area / "empty"
    private.write_text("root's secret\n")
    os.chmod(private, 0o600)
    public.write_text("everyone's\n")
    empty.write_text("")
    os.chmod(empty, 0o600)
    given = {}
    for path in (private, public, empty):
        fd = os.open(path, os.O_RDONLY)
        try:
            given[path.name] = fswrite.give_to(fd, (USER, USER), public_only=True)
        finally:
            os.close(fd)
    assert given == {"private": False, "public": True, "empty": True}
    assert [os.stat(p).st_uid for p in (private, public, empty)] == [0, USER, USER]
