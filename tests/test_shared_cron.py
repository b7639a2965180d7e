"""A shared cache an admin runs from cron (issue 32): controls that fail closed, state the whole group can
use, a budget kept in the cache, sizes on disk, reads that are not uses, output fit for cron mail.

Three users where the point is about users: root (the admin's cron, umask 022), a member of the cache's
group (uid 65534, umask 002) and a non-member (uid 65533, no group of the cache), run as in
tests/test_shared_attacks.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FIXTURES
from test_shared_attacks import GROUP, PY, TIMEOUT, as_user_kcache, member_kcache, share

NON_MEMBER = 65533


def as_outsider() -> None:
    """preexec_fn: a user outside the cache's group."""
    os.setgroups([])
    os.setresgid(NON_MEMBER, NON_MEMBER, NON_MEMBER)
    os.setresuid(NON_MEMBER, NON_MEMBER, NON_MEMBER)


def root_kcache(*args: object, umask: int = 0o022, env: dict | None = None) -> subprocess.CompletedProcess:
    """Root's kcache as cron runs it: umask 022, no terminal."""
    full = {k: v for k, v in os.environ.items() if k != "KCACHE_SAFE_DIRECTORY"}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "kcache_cli", *map(str, args)], capture_output=True, text=True,
                          timeout=TIMEOUT, env=full, stdin=subprocess.DEVNULL, preexec_fn=lambda: os.umask(umask))


def group_cache(area: Path, name: str = "cache") -> Path:
    """The hidet fixture as a 2775 cache of GROUP."""
    import shutil

    root = area / name
    shutil.copytree(FIXTURES / "hidet", root, symlinks=True)
    return share(root)


def entries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.glob("ops/*/*/*") if p.is_dir())


# ---- controls fail closed ---------------------------------------------------------------------------

def test_a_trust_file_whose_keys_were_all_revoked_refuses_every_record(kcache, tmp_path):
    """A trusted_keys file that exists trusts only what it lists: all keys commented out, or an empty
    file, refuses every archive (one line saying so), where a missing file trusts all."""
    pytest.importorskip("cryptography")
    import shutil

    conf = tmp_path / "conf"
    env = {"XDG_CONFIG_HOME": str(conf), "KCACHE_SIGNING_KEY": "", "KCACHE_TRUSTED_KEYS": ""}
    key = kcache("remote", "keygen", "--json", env=env).json()["public_key"]
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "hidet", src)
    signed = tmp_path / "a.tar"
    assert kcache("export", "--cache-dir", src, signed, env=env).exit_code == 0
    trust = conf / "kcache" / "trusted_keys"
    for text in (f"# revoked 2026-11-01\n# {key}\n", "", "\n  \n"):
        trust.write_text(text)
        os.chmod(trust, 0o644)
        run = kcache("import", "--cache-dir", tmp_path / "dst", signed, env=env)
        lines = run.stderr.splitlines()
        assert run.exit_code == 1 and len(lines) == 1 and "lists no key" in lines[0], (text, run.stderr)
        assert not (tmp_path / "dst" / "ops").exists()
    trust.write_text(key + "\n")
    assert kcache("import", "--cache-dir", tmp_path / "dst", signed, env=env).exit_code == 0
    trust.unlink()  # no trust list at all: every record is taken (the documented default)
    assert kcache("import", "--cache-dir", tmp_path / "open", signed, env=env).exit_code == 0


WORKERS = r"""
import os, sys, time
from kcache_cli.util import parallel
out = sys.argv[1]
def first(i, advance, abort):
    open(os.path.join(out, f"w{i}-{os.getpid()}"), "w").close()
    time.sleep(60)
def part(shared, p):
    open(os.path.join(out, f"p{p}-{os.getpid()}"), "w").close()
    time.sleep(60)
if sys.argv[2] == "phased":
    parallel.run_phased(3, first)
else:
    parallel.map_parts(part, None, [0, 1, 2])
"""


@pytest.mark.parametrize("kind", ["phased", "map"])
def test_workers_die_within_a_second_of_a_kill_9_of_their_parent(tmp_path, kind):
    """import and export run in forked workers (run_phased), scans in a pool (map_parts): a kill -9 of
    kcache leaves none of them extracting under init (PR_SET_PDEATHSIG and a parent check)."""
    out = tmp_path / "pids"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", WORKERS, str(out), kind])
    deadline = time.monotonic() + 30
    while len(list(out.iterdir())) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int(p.name.split("-")[1]) for p in out.iterdir()]
    assert len(pids) == 3, pids
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = time.monotonic()

    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[-1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    while any(map(alive, pids)) and time.monotonic() - killed < 1.0:
        time.sleep(0.02)
    assert not any(map(alive, pids)), [p for p in pids if alive(p)]


def test_a_deeply_nested_config_value_is_exit_2_naming_file_and_line(kcache, tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text("[all]\nmax-size = \"1G\"\nmax-age = " + "[" * 5000 + "]" * 5000 + "\n")
    run = kcache("config", env={"KCACHE_CONFIG": str(cfg)})
    assert run.exit_code == 2 and len(run.stderr.splitlines()) == 1, run.stderr
    assert f"{cfg}:3:" in run.stderr and "nested too deeply" in run.stderr and "Traceback" not in run.stderr
    cfg.write_text("[all]\nmax-size = \"1G\n")
    (tmp_path / "empty").mkdir()
    run = kcache("prune", "--dry-run", "--cache-dir", tmp_path / "empty", env={"KCACHE_CONFIG": str(cfg)})
    assert run.exit_code == 2 and str(cfg) in run.stderr and "line 2" in run.stderr, run.stderr



@pytest.mark.parametrize("where", ["KCACHE_CONFIG", "cache"])
def test_a_number_past_pythons_digit_limit_is_exit_2_naming_file_and_line(kcache, tmp_path, where):
    """tomllib's int() refuses 5,000 digits with a plain ValueError: a config error, not an unexpected one."""
    root = tmp_path / "c"
    (root / ".kcache").mkdir(parents=True)
    if where == "KCACHE_CONFIG":
        cfg = tmp_path / "config.toml"
        text, env = "[all]\n\nmax-size = ", {"KCACHE_CONFIG": str(cfg)}
    else:
        cfg, text, env = root / ".kcache" / "config.toml", "\n\nmax-size = ", {}
    cfg.write_text(text + "9" * 5000 + "\n")
    for args in (("--cache-dir", root, "config"), ("--cache-dir", root, "prune", "--dry-run")):
        run = kcache(*args, env=env)
        assert run.exit_code == 2 and len(run.stderr.splitlines()) == 1, run.stderr
        assert f"{cfg}:3: not valid TOML: a number with too many digits" in run.stderr, run.stderr


# ---- state the group can use --------------------------------------------------------------------------


@pytest.mark.second_user
def test_roots_cron_prune_with_umask_022_leaves_members_able_to_clear_and_prune(area):
    root = group_cache(area)
    run = root_kcache("--cache-dir", root, "prune", "--older-than", "1d", "--dry-run")
    assert run.returncode == 0, run.stderr
    run = root_kcache("--cache-dir", root, "clear", "--op", "relu", "--yes")
    assert run.returncode == 0, run.stderr
    for d in ("", "locks", "trash"):
        st = os.stat(root / ".kcache" / d)
        assert st.st_gid == GROUP and stat.S_IMODE(st.st_mode) == 0o2775, (d, oct(st.st_mode))
    lock = os.stat(root / ".kcache/locks/.gc.lock")
    assert lock.st_gid == GROUP and stat.S_IMODE(lock.st_mode) == 0o660
    before = entries(root)
    run = member_kcache("--cache-dir", root, "clear", "--op", "matmul", "--yes")
    assert run.returncode == 0, run.stderr
    run = member_kcache("--cache-dir", root, "prune", "--max-size", "0", "--yes")
    assert run.returncode == 0, run.stderr
    assert entries(root) == [] != before


@pytest.mark.second_user
def test_root_mends_the_state_an_older_kcache_left_closed_to_the_group(area):
    """.kcache/trash made drwxr-sr-x by root (umask 022, an older kcache) and a 0644 gc lock: root's next
    run makes them the group's, and then a member's clear works."""
    root = group_cache(area)
    for d in (".kcache", ".kcache/locks", ".kcache/trash"):
        os.mkdir(root / d)
        os.chmod(root / d, 0o2755)
    (root / ".kcache/locks/.gc.lock").touch(mode=0o644)
    os.chmod(root / ".kcache/locks/.gc.lock", 0o644)
    denied = member_kcache("--cache-dir", root, "clear", "--op", "relu", "--yes")
    assert denied.returncode == 1 and "fix: its owner (uid 0)" in denied.stderr, denied.stderr
    assert root_kcache("--cache-dir", root, "prune", "--broken").returncode == 0
    run = member_kcache("--cache-dir", root, "clear", "--op", "relu", "--yes")
    assert run.returncode == 0, run.stderr


@pytest.mark.second_user
def test_a_non_member_is_told_it_is_not_in_the_group_not_to_chmod(area):
    """.kcache/ already the group's (root's prune made it so): a user outside the group is told that,
    not to have the owner run a chmod that is already done."""
    root = group_cache(area)
    assert root_kcache("--cache-dir", root, "prune", "--broken").returncode == 0
    run = other_member_kcache("--cache-dir", root, "clear", "--op", "relu", "--yes", preexec=as_outsider)
    assert run.returncode == 1, run.stderr
    assert "you are not a member" in run.stderr and "chmod" not in run.stderr, run.stderr


LOCKER = r"""
import fcntl, os, sys, time
try:
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
except PermissionError:
    print("refused", flush=True)
    sys.exit(0)
fcntl.flock(fd, fcntl.LOCK_EX)
print("holding", flush=True)
time.sleep(30)
"""


@pytest.mark.second_user
def test_a_non_member_cannot_hold_the_gc_lock_to_block_a_prune(area):
    root = group_cache(area)
    assert root_kcache("--cache-dir", root, "clear", "--op", "matmul", "--yes").returncode == 0
    lock = root / ".kcache/locks/.gc.lock"
    run = subprocess.run([PY, "-c", LOCKER, str(lock)], capture_output=True, text=True, timeout=TIMEOUT,
                         preexec_fn=as_outsider, env={"PATH": "/usr/bin:/bin"})
    assert run.stdout.strip() == "refused", run.stdout + run.stderr
    started = time.monotonic()
    run = root_kcache("--cache-dir", root, "clear", "--op", "relu", "--yes", "--lock-timeout", "5")
    assert run.returncode == 0 and time.monotonic() - started < 5, run.stderr


# ---- sizes are disk usage ---------------------------------------------------------------------------------

def test_stats_size_of_a_hidet_cache_is_within_3_percent_of_du(kcache, tmp_path):
    """hidet entries are 13-15 small files: apparent bytes are about half of what the disk holds. kcache's
    size is the disk's, as `du -sB1` counts it; apparent_size keeps the bytes."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from gen_cache import generate

    root = tmp_path / "cache"
    generate(str(root), 300)
    data = kcache("--cache-dir", root, "stats", "--json").json()
    du = int(subprocess.run(["du", "-sB1", str(root)], capture_output=True, text=True, check=True).stdout.split()[0])
    apparent = int(subprocess.run(["du", "-sb", "--apparent-size", str(root)], capture_output=True, text=True,
                                  check=True).stdout.split()[0])
    assert abs(data["size"] - du) <= 0.03 * du, (data["size"], du)
    assert data["apparent_size"] < data["size"] and data["apparent_size"] <= apparent
    rows = kcache("--cache-dir", root, "ls", "--json").json()["entries"]
    assert sum(r["size"] for r in rows) == data["size"]
    assert sum(r["apparent_size"] for r in rows) == data["apparent_size"]
    # a second scan says the same
    again = kcache("--cache-dir", root, "stats", "--json").json()
    assert (again["size"], again["apparent_size"]) == (data["size"], data["apparent_size"])


# ---- output fit for cron; garbage is removed without asking ---------------------------------------------

def generated(tmp_path: Path, n: int = 300) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from gen_cache import generate

    root = tmp_path / "cache"
    generate(str(root), n)
    return root


def test_prune_broken_needs_no_yes_and_no_terminal_on_a_mostly_broken_cache(kcache, tmp_path):
    root = generated(tmp_path, 60)
    libs = sorted(root.glob("ops/*/*/*/lib.so"))
    for lib in libs[:50]:  # 50 of 60 entries lost their library: partial, what hidet compiles over
        lib.unlink()
    run = kcache("--cache-dir", root, "prune", "--broken", "--json", input="")  # stdin is no terminal
    assert run.exit_code == 0, run.stderr
    assert len(run.json()["removed"]) == 50 and len(entries(root)) == 10
    # the same share of working entries (a --max-size) still asks, or needs --yes
    ask = kcache("--cache-dir", root, "prune", "--max-size", "1k", input="")
    assert ask.exit_code == 2 and "--yes" in ask.stderr and len(entries(root)) == 10


def test_a_prune_of_hundreds_prints_a_summary_and_lists_only_with_list(kcache, tmp_path):
    root = generated(tmp_path)
    total = kcache("--cache-dir", root, "stats", "--json").json()["size"]
    plan = kcache("--cache-dir", root, "prune", "--max-size", f"{total * 6 // 10}B", "--dry-run", "--json").json()
    assert len(plan["removed"]) > 100 and "summary" not in plan  # --json unchanged
    run = kcache("--cache-dir", root, "prune", "--max-size", f"{total * 6 // 10}B", "--dry-run")
    lines = run.stdout.splitlines() + run.stderr.splitlines()
    assert run.exit_code == 0 and len(lines) <= 25, "\n".join(lines)
    assert any("more" in line for line in lines) and "Would remove" in lines[-1]
    counted = sum(int(line.split()[-3]) for line in run.stdout.splitlines()[1:-1])
    assert counted == len(plan["removed"])  # every removal is in a group
    listed = kcache("--cache-dir", root, "prune", "--max-size", f"{total * 6 // 10}B", "--dry-run", "--list")
    assert len(listed.stdout.splitlines()) > len(plan["removed"])
    run = kcache("--cache-dir", root, "clear", "--all", "--yes", "--summary")
    assert run.exit_code == 0 and len(run.stdout.splitlines()) <= 25 and entries(root) == []


# ---- a budget kept in the cache ------------------------------------------------------------------------

@pytest.mark.second_user
def test_a_budget_root_keeps_in_the_cache_binds_a_members_bare_prune(area):
    """root (umask 022) sets max-size in a 2775 cache of hundreds of entries; a member with no settings
    of their own runs a bare `kcache prune`: the cache's budget is enforced, in at most 25 lines."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from gen_cache import generate

    root = area / "cache"
    generate(str(root), 300)
    share(root)
    total = json.loads(root_kcache("--cache-dir", root, "stats", "--json").stdout)["size"]
    limit = total * 4 // 10
    run = root_kcache("--cache-dir", root, "config", "set", "max-size", f"{limit}B")
    assert run.returncode == 0, run.stderr
    kept = os.stat(root / ".kcache" / "budget" / "config.toml")
    assert kept.st_gid == GROUP and stat.S_IMODE(kept.st_mode) == 0o644  # read, not written, by the group
    shown = member_kcache("--cache-dir", root, "config")
    assert shown.returncode == 0 and str(root / ".kcache" / "budget" / "config.toml") in shown.stdout, shown.stderr
    run = member_kcache("--cache-dir", root, "prune", "--yes")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines() + run.stderr.splitlines()
    assert len(lines) <= 25, "\n".join(lines)
    assert any(f"budget of {root}" in line and ".kcache/budget/config.toml" in line for line in lines), lines
    left = json.loads(member_kcache("--cache-dir", root, "stats", "--json").stdout)["size"]
    assert left <= limit and len(entries(root)) < 300


@pytest.mark.second_user
def test_a_file_of_roots_a_member_renamed_into_kcache_never_steers_roots_prune(area):
    """Root's import publishes an entry's files as root's, bytes the archive's maker chose; a member renamed
    one holding `max-size = "1B"` into .kcache/config.toml, and root's cron prune, trusting a budget file of
    root's, removed every entry. Root's budget lives in .kcache/budget/, which only its owner may write:
    a member cannot put a file there, and root's prune acts on no file of root's found in .kcache/ itself
    (one line, exit 1, nothing removed) nor, once root keeps a budget, looks at it."""
    from test_shared_attacks import as_attacker, attacker

    root = group_cache(area)
    before = entries(root)
    planted = root / before[0] / "notes.toml"  # as root's import of a member's archive leaves it
    planted.write_text('max-size = "1B"\n')
    os.chown(planted, 0, GROUP)
    os.chmod(planted, 0o644)
    (root / ".kcache").mkdir(mode=0o2775)
    os.chown(root / ".kcache", 0, GROUP)
    os.chmod(root / ".kcache", 0o2775)
    assert attacker("import os, sys; os.rename(sys.argv[1], sys.argv[2])", planted,
                    root / ".kcache" / "config.toml").returncode == 0
    for args in (("-q", "prune", "--yes"), ("prune", "--dry-run")):
        run = root_kcache("--cache-dir", root, *args)
        assert run.returncode == 1 and len(run.stderr.splitlines()) == 1, (args, run.stderr)
        assert "kept in .kcache/, which others may write" in run.stderr and run.stdout == "", run.stderr
    assert entries(root) == before
    assert root_kcache("--cache-dir", root, "config", "set", "max-age", "90d").returncode == 0
    budget = root / ".kcache" / "budget"
    st = os.stat(budget)
    assert st.st_uid == 0 and not st.st_mode & 0o022 and not (root / ".kcache" / "config.toml").exists()
    again = root / before[1] / "notes.toml"
    again.write_text('max-size = "1B"\n')
    os.chown(again, 0, GROUP)
    moved = subprocess.run([PY, "-c", "import os, sys; os.rename(sys.argv[1], sys.argv[2])", str(again),
                            str(budget / "config.toml")], preexec_fn=as_attacker, capture_output=True, text=True,
                           timeout=TIMEOUT, env={"PATH": "/usr/bin:/bin"})
    assert moved.returncode != 0 and "Permission denied" in moved.stderr
    assert attacker("import os, sys; os.rename(sys.argv[1], sys.argv[2])", again,
                    root / ".kcache" / "config.toml").returncode == 0  # beside root's: never read by root
    dry = root_kcache("--cache-dir", root, "prune", "--dry-run", "--json")
    assert dry.returncode == 0 and json.loads(dry.stdout)["removed"] == [], dry.stderr
    assert 'max-age = "90d"' in (budget / "config.toml").read_text()


@pytest.mark.second_user
def test_root_acts_on_no_budget_a_member_kept_in_the_cache(area):
    """A member keeps max-size 1B in root's 2775 cache: the members' own prunes follow it, but root's cron
    prune refuses it (one line naming the member, nothing removed: a member who may not remove the others'
    entries must not have root do it); root's `config set` takes it over, and then root's prune acts. A
    budget file anyone may write is refused, naming that as the reason."""
    root = group_cache(area)
    before = entries(root)
    kept = root / ".kcache" / "config.toml"
    assert member_kcache("--cache-dir", root, "config", "set", "max-size", "1B").returncode == 0
    assert os.stat(kept).st_uid != 0
    dry = member_kcache("--cache-dir", root, "prune", "--dry-run", "--json")
    assert dry.returncode == 0 and len(json.loads(dry.stdout)["removed"]) == len(before), dry.stderr
    for args in (("prune", "--yes"), ("-q", "prune", "--yes"), ("prune", "--dry-run")):
        run = root_kcache("--cache-dir", root, *args)
        assert run.returncode == 1 and len(run.stderr.splitlines()) == 1, (args, run.stderr)
        assert f"{kept}: written by " in run.stderr and "a member of the cache's group" in run.stderr
    assert entries(root) == before
    assert root_kcache("--cache-dir", root, "config", "set", "max-age", "90d").returncode == 0
    roots = root / ".kcache" / "budget" / "config.toml"  # root's own place, which the member's file gave way to
    assert not kept.exists() and os.stat(roots).st_uid == 0 and "max-size" not in roots.read_text()
    dry = root_kcache("--cache-dir", root, "prune", "--dry-run", "--json")
    assert dry.returncode == 0 and json.loads(dry.stdout)["removed"] == [], dry.stderr
    assert root_kcache("--cache-dir", root, "config", "set", "max-size", "1B").returncode == 0
    dry = root_kcache("--cache-dir", root, "prune", "--dry-run", "--json")
    assert dry.returncode == 0 and len(json.loads(dry.stdout)["removed"]) == len(before), dry.stderr
    kept = roots
    os.chmod(kept, 0o666)
    run = root_kcache("--cache-dir", root, "prune", "--dry-run")
    assert run.returncode == 1 and f"{kept}: writable by anyone: not trusted" in run.stderr, run.stderr


@pytest.mark.second_user
def test_a_member_cannot_rewrite_roots_budget_in_place_to_steer_roots_prune(area):
    """root's `config set` wrote the budget 0664 in the 2775 cache: a member wrote `max-size = "1B"` into
    it in place (it stayed root's) and root's cron prune removed every entry. The budget is now readable
    by the group but not writable; one the group may write (an older kcache's) is refused by root's prune,
    one line, nothing removed, and root's `config set` takes none of its values over."""
    from test_shared_attacks import as_attacker

    root = group_cache(area)
    before = entries(root)
    roots = root / ".kcache" / "budget" / "config.toml"
    assert root_kcache("--cache-dir", root, "config", "set", "max-size", "10G").returncode == 0
    st = os.stat(roots)
    assert st.st_gid == GROUP and stat.S_IMODE(st.st_mode) == 0o644, oct(st.st_mode)
    forge = "import sys; open(sys.argv[1], 'w').write('max-size = ' + chr(34) + '1B' + chr(34))"
    forged = subprocess.run([PY, "-c", forge, str(roots)], preexec_fn=as_attacker, capture_output=True, text=True,
                            timeout=TIMEOUT, env={"PATH": "/usr/bin:/bin"})
    assert forged.returncode != 0 and "Permission denied" in forged.stderr and "10G" in roots.read_text()
    # as an older kcache left it: root's, in .kcache/ itself, writable by the group
    shutil.rmtree(roots.parent)
    kept = root / ".kcache" / "config.toml"
    kept.write_text('max-size = "10G"\n')
    os.chown(kept, 0, GROUP)
    os.chmod(kept, 0o664)
    assert subprocess.run([PY, "-c", forge, str(kept)], preexec_fn=as_attacker, timeout=TIMEOUT).returncode == 0
    assert os.stat(kept).st_uid == 0 and "1B" in kept.read_text()
    for args in (("-q", "prune", "--yes"), ("prune", "--dry-run")):
        run = root_kcache("--cache-dir", root, *args)
        assert run.returncode == 1 and len(run.stderr.splitlines()) == 1, (args, run.stderr)
        assert f"{kept}: writable by the cache's group" in run.stderr and run.stdout == "", (args, run.stderr)
    assert entries(root) == before
    assert root_kcache("--cache-dir", root, "config", "set", "max-age", "90d").returncode == 0
    assert not kept.exists() and "1B" not in roots.read_text() and stat.S_IMODE(os.stat(roots).st_mode) == 0o644
    dry = root_kcache("--cache-dir", root, "prune", "--dry-run", "--json")
    assert dry.returncode == 0 and json.loads(dry.stdout)["removed"] == [], dry.stderr


@pytest.mark.second_user
def test_an_entry_roots_cron_imports_has_lock_files_a_members_hidet_can_take(area, tmp_path):
    """Root's import under umask 022 into a 2775 cache published hidet's `.lock` as root's 0644: hidet run by a
    member opens it for writing to use the entry, and failed. The writers' lock files of an entry (each
    layout's writer_locks) are the group's to write, as its directories are; its other files stay as the
    archive has them."""
    from test_shared_attacks import as_attacker

    src = group_cache(area, "src")
    arc = tmp_path / "h.tar"
    assert root_kcache("--cache-dir", src, "export", arc).returncode == 0
    root = area / "dst"
    root.mkdir()
    share(root)
    assert root_kcache("--cache-dir", root, "import", arc).returncode == 0
    locks = sorted(root.glob("ops/*/*/*/.lock"))
    assert locks, "the fixture's entries hold hidet's .lock"
    for lock in locks:
        st = os.stat(lock)
        assert st.st_uid == 0 and st.st_gid == GROUP and st.st_mode & 0o060 == 0o060, (lock, oct(st.st_mode))
        took = subprocess.run([PY, "-c", "import sys; open(sys.argv[1], 'a').close()", str(lock)],
                              preexec_fn=as_attacker, capture_output=True, text=True, timeout=TIMEOUT,
                              env={"PATH": "/usr/bin:/bin"})
        assert took.returncode == 0, took.stderr
    assert not os.stat(next(root.glob("ops/*/*/*/meta.json"))).st_mode & 0o020  # content as archived


@pytest.mark.second_user
def test_a_members_prune_left_over_its_limit_by_entries_it_may_not_remove_says_so(area):
    """Root's entries in 2755 op directories of the shared cache: a member's prune to a size fails on
    them. The line that says the cache is still over its limit counts what could not be removed (it said
    "1 entry planned to go was kept", a temp dir, as if the rest were in use), and each error says
    who may remove the entry."""
    root = group_cache(area)
    for op in ("cpu_space_0/matmul", "cpu_space_0/relu", "cuda_space_0/add"):
        os.chmod(root / "ops" / op, 0o2755)
    run = member_kcache("--cache-dir", root, "prune", "--max-size", "1B", "--yes")
    assert run.returncode == 1, run.stderr
    errors = [ln for ln in run.stderr.splitlines() if ln.startswith("error: cannot remove")]
    assert len(errors) == 3 and all(ln.endswith("(its owner or root may remove it)") for ln in errors), run.stderr
    over = [ln for ln in run.stderr.splitlines() if "over its limit" in ln]
    assert len(over) == 1 and "3 items could not be removed (the errors below say why)" in over[0], run.stderr
    assert "planned to go" not in over[0]


@pytest.mark.second_user
def test_a_cache_its_owner_made_unreadable_is_not_an_empty_one(area):
    """The owner (not root) chmods their cache 000: ls, verify and a budget prune said "no entries",
    "checked 0 entries", "Nothing removed", exit 0, without a word. Each now says the root cannot be read;
    verify and a prune to a size exit 1 (what it holds is not known), as for a directory inside it."""
    root = group_cache(area)
    for dirpath, dirs, files in os.walk(root):
        for n in [dirpath, *(os.path.join(dirpath, f) for f in dirs + files)]:
            os.lchown(n, 65534, GROUP)
    os.chmod(root, 0)
    said = f"cannot read {root}: Permission denied: the entries it may hold are not known"
    for args, code in ((("ls",), 0), (("verify",), 1), (("prune", "--max-size", "1G", "--yes"), 1),
                       (("stats",), 0)):
        run = member_kcache("--cache-dir", root, *args)
        assert run.returncode == code and said in run.stderr, (args, run.returncode, run.stderr)
        assert "Traceback" not in run.stderr
    os.chmod(root, 0o2775)


@pytest.mark.second_user
def test_a_kcache_dir_that_may_not_be_searched_is_not_called_a_link(area):
    """Its owner's chmod 000 of .kcache/: build said ".kcache/locks is a symlink or not a directory";
    it says the lock cannot be taken for want of permission."""
    from test_build import write_task

    task = write_task(area / "tasks", "plus", 7, kind="cc")
    root = area / "c"
    (root / ".kcache").mkdir(parents=True)
    for p in (area / "tasks", *(area / "tasks").rglob("*"), root, root / ".kcache"):
        os.lchown(p, 65534, GROUP)
    os.chmod(root / ".kcache", 0)
    run = member_kcache("--cache-dir", root, "build", task / "task.txt")
    assert run.returncode == 1 and "Permission denied" in run.stderr and "symlink" not in run.stderr, run.stderr
    os.chmod(root / ".kcache", 0o755)


@pytest.mark.second_user
def test_a_config_a_member_cannot_read_is_exit_1_naming_it(area):
    """root's budget file made 0600 in the shared cache, or a KCACHE_CONFIG the member cannot read: a file
    that exists but cannot be read is exit 1 (docs/output.md), one line naming it; stats only warns."""
    from test_shared_attacks import as_attacker

    root = group_cache(area)
    assert root_kcache("--cache-dir", root, "config", "set", "max-size", "1G").returncode == 0
    kept = root / ".kcache" / "budget" / "config.toml"
    os.chmod(kept, 0o600)
    for args in (("prune", "--dry-run"), ("prune", "--yes"), ("config",)):
        run = member_kcache("--cache-dir", root, *args)
        assert run.returncode == 1 and f"cannot read {kept}" in run.stderr, (args, run.returncode, run.stderr)
        assert len(run.stderr.splitlines()) == 1, run.stderr
    run = member_kcache("--cache-dir", root, "stats")
    assert run.returncode == 0 and f"budget of {root} not shown" in run.stderr, run.stderr
    os.chmod(kept, 0o664)
    personal = area / "personal.toml"
    personal.write_text('[all]\nmax-size = "1G"\n')
    os.chmod(personal, 0o600)  # root's: the member cannot read it
    for args in (("config",), ("config", "set", "max-size", "2G")):
        run = as_user_kcache(as_attacker, *args, env={"KCACHE_CONFIG": str(personal)})
        assert run.returncode == 1 and f"cannot read {personal}" in run.stderr, (args, run.returncode, run.stderr)
    assert personal.read_text() == '[all]\nmax-size = "1G"\n'


@pytest.mark.second_user
def test_a_members_prune_that_cannot_measure_part_of_the_cache_does_not_claim_it_fits(area):
    """A member's prune of a cache where a directory is root's 0700 (its size unknown, counted as 0): the
    last line and --json's `unreadable` name what was not counted, and a prune to a size exits 1 (it
    cannot tell that the cache fits); one without a size only says so."""
    root = group_cache(area)
    hidden = root / "ops" / "cpu_space_0" / "matmul"
    assert root_kcache("--cache-dir", root, "config", "set", "max-size", "10G").returncode == 0  # fits, it seems
    os.chmod(hidden, 0o2700)
    rel = "ops/cpu_space_0/matmul"
    for args in (("prune", "--yes"), ("prune", "--dry-run"), ("prune", "--max-size", "10G")):
        run = member_kcache("--cache-dir", root, *args)
        assert run.returncode == 1, (args, run.returncode, run.stderr)
        last = run.stdout.splitlines()[-1]
        assert f"1 directory it could not read ({rel})" in last and "not known" in last, (args, last)
        error = [ln for ln in run.stderr.splitlines() if ln.startswith("Error: ")]
        assert len(error) == 1 and "may still be over its max-size of 10.0 GB" in error[0], run.stderr
    run = member_kcache("--cache-dir", root, "prune", "--dry-run", "--json")
    doc = json.loads(run.stdout)
    assert run.returncode == 1 and doc["unreadable"] == [rel] and doc["max_size"] == 10**10, run.stdout
    run = member_kcache("--cache-dir", root, "prune", "--broken")  # no size to reach: a note, exit 0
    assert run.returncode == 0 and f"1 directory it could not read ({rel})" in run.stdout, (run.stdout, run.stderr)
    assert "not known" not in run.stdout
    os.chmod(hidden, 0o2775)
    run = member_kcache("--cache-dir", root, "prune", "--dry-run", "--json")  # all of it read: fits, exit 0
    assert run.returncode == 0 and json.loads(run.stdout)["unreadable"] == [], run.stderr


def test_the_budget_in_the_cache_wins_and_personal_budgets_bind_only_own_caches(kcache, tmp_path):
    import shutil

    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    for root in (mine, theirs):
        shutil.copytree(FIXTURES / "hidet", root)
    assert kcache("config", "set", "max-size", "1k").exit_code == 0  # personal: everything would go
    assert kcache("--cache-dir", mine, "config", "set", "max-size", "10G").exit_code == 0
    shown = kcache("--cache-dir", mine, "config", "--json").json()
    assert shown["effective"]["max_size"] == 10**10
    assert shown["effective"]["max_size_from"] == str(mine / ".kcache" / "budget" / "config.toml")
    run = kcache("--cache-dir", mine, "prune", "--yes")
    assert run.exit_code == 0 and len(entries(mine)) == 5, run.stderr  # the cache's 10G wins over 1k
    assert kcache("--cache-dir", mine, "config", "unset", "max-size").exit_code == 0
    dry = kcache("--cache-dir", mine, "prune", "--dry-run", "--json").json()
    assert len(dry["removed"]) == 5  # now the personal [all] applies: this user owns it
    for dirpath, dirs, files in os.walk(theirs):  # another user's cache: personal budgets do not bind it
        for n in [dirpath, *(os.path.join(dirpath, f) for f in dirs + files)]:
            os.lchown(n, 4242, 4242)
    assert kcache("--cache-dir", theirs, "ls", "--json").json()["entry_count"] == 5  # readable, listed
    run = kcache("--cache-dir", theirs, "prune", "--dry-run", "--json")
    assert run.exit_code == 0 and run.json()["removed"] == [], run.stderr
    text = kcache("--cache-dir", mine, "config")
    assert "max-size = 1.0 kB" in text.stdout and "[all]" in text.stdout  # whence: the personal file's [all]


# ---- kcache's own reads are not a use ----------------------------------------------------------------------

OTHER_MEMBER = 65532
T = 1_700_000_000


def as_other_member() -> None:
    """preexec_fn: a second member of the cache's group (not the entries' owner)."""
    os.setgroups([GROUP])
    os.setresgid(GROUP, GROUP, GROUP)
    os.setresuid(OTHER_MEMBER, OTHER_MEMBER, OTHER_MEMBER)
    os.umask(0o002)


def other_member_kcache(*args: object, preexec=as_other_member) -> subprocess.CompletedProcess:
    return as_user_kcache(preexec, *args)


def last_uses(run: subprocess.CompletedProcess) -> dict[str, str]:
    assert run.returncode == 0, run.stderr
    return {e["path"]: e["last_used"] for e in json.loads(run.stdout)["entries"]}


@contextlib.contextmanager
def members_copy(area: Path, fixture: str) -> Iterator[Path]:
    """A copy of the real `fixture` on a strictatime tmpfs (every read moves atime), shared with the group,
    member A's (its root included), everything in it read last at T; unmounted after."""
    import shutil

    mnt = area / "mnt"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "strictatime,size=64m,mode=755", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"SKIPPED LOUDLY: cannot mount a strictatime tmpfs ({done.stderr.strip()}): nothing proved "
                    "that a member's reads are not a use")
    try:
        root = mnt / "cache"
        shutil.copytree(FIXTURES / fixture, root, symlinks=True)
        share(root)
        for dirpath, dirs, files in os.walk(root, topdown=False):
            for n in files + dirs:
                os.lchown(os.path.join(dirpath, n), NON_MEMBER + 1, GROUP)
                os.utime(os.path.join(dirpath, n), (T, T), follow_symlinks=False)
        os.lchown(root, NON_MEMBER + 1, GROUP)
        yield root
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.second_user
def test_a_members_reads_leave_another_members_entries_last_use_alone(area):
    """strictatime: every read moves atime. Member B (not the owner: O_NOATIME is refused) lists, weighs,
    verifies, inspects, reads the log of, compares, exports and pushes member A's entries; each entry's
    last use stays where it was, for B, A and root alike; a compiler's read afterwards is still a use."""
    with members_copy(area, "hidet") as root:
        before = last_uses(root_kcache("--cache-dir", root, "ls", "--json"))
        lib = next(root.glob("ops/*/*/*/lib.so"))
        out = area / "out"  # where B may write its archive and a file remote
        (out / "remote").mkdir(parents=True)
        for d in (out, out / "remote"):
            d.chmod(0o777)
        for args in (("ls", "--limit", "1"), ("ls",), ("stats",), ("ls", "--json"), ("stats", "--json"),
                     ("verify",), ("inspect", "8d1f7691"), ("log", "8d1f7691"), ("diff", "8d1f7691", "ad252b06"),
                     ("export", out / "a.tar"), ("push", "--remote", f"file://{out / 'remote'}")):
            run = other_member_kcache("--cache-dir", root, *args)
            assert run.returncode == 0, (args, run.stderr)
        moved = [p for p in root.rglob("*") if p.is_file() and p.stat().st_atime_ns != T * 10**9 and ".kcache" not in
                 str(p)]
        assert moved, "B's reads moved no atime: the test proves nothing"
        assert last_uses(other_member_kcache("--cache-dir", root, "ls", "--json")) == before
        assert last_uses(root_kcache("--cache-dir", root, "ls", "--json")) == before
        assert json.loads(other_member_kcache("--cache-dir", root, "stats", "--json").stdout)["by_age"]["<1d"][
            "entry_count"] == 0
        subprocess.run(["cat", str(lib)], check=True, stdout=subprocess.DEVNULL)  # a compiler's hit
        after = last_uses(other_member_kcache("--cache-dir", root, "ls", "--json"))
        assert after[str(lib.parent)] != before[str(lib.parent)]
        assert {p: t for p, t in after.items() if p != str(lib.parent)} == \
            {p: t for p, t in before.items() if p != str(lib.parent)}


@pytest.mark.second_user
@pytest.mark.parametrize("name", ["tilus", "tilelang", "triton/cache"])
def test_a_members_reads_are_no_use_where_entries_are_measured_as_trees(area, name):
    """The same where an entry's usage is its whole tree's, measured after its judgement read it
    (records.measure_tree: tilus's programs with their module/; vLLM, JAX and Numba are measured alike): member
    B's judging reads move the atimes of member A's files, and each entry's last use stays where it was, for B
    and root alike (tilus's moved before: the reads of this very scan were not yet noted)."""
    with members_copy(area, name) as root:
        before = last_uses(root_kcache("--cache-dir", root, "ls", "--json", "--no-index"))
        assert before and all(t.startswith("2023-") for t in before.values()), before
        assert other_member_kcache("--cache-dir", root, "ls", "--json", "--no-index").returncode == 0
        moved = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()
                 and p.stat().st_atime_ns != T * 10**9 and ".kcache" not in str(p)]
        assert moved, "B's reads moved no atime: the test proves nothing"
        assert last_uses(other_member_kcache("--cache-dir", root, "ls", "--json", "--no-index")) == before
        assert last_uses(root_kcache("--cache-dir", root, "ls", "--json", "--no-index")) == before


# B's kcache with its scan in worker processes however small the cache (PARALLEL_MIN_JOBS: 4,000 jobs)
IN_WORKERS = ("import sys; import kcache_cli.catalog.scan_context as s; s.PARALLEL_MIN_JOBS = 1; "
              "sys.argv[0] = 'kcache'; from kcache_cli.cli.entry import run; run()")


@pytest.mark.second_user
def test_a_members_reads_in_scan_workers_are_no_use_whichever_process_notes_first(area):
    """A tilus script's judgement (in the command's process) reads the program it names, then the program's
    (in a worker, on a big cache) reads its files again. The worker noted its reads at its end and the
    command at the scan's: the command's note of the earlier read (atime before, after it) went over the
    worker's of the later one, and the atime that later read left counted as a use, for B and root alike,
    run after run."""
    import site

    from kcache_cli.util import parallel

    if parallel.cpus() < 2:
        pytest.skip("SKIPPED LOUDLY: one CPU, no scan workers: nothing proved")
    with members_copy(area, "tilus") as root:
        before = last_uses(root_kcache("--cache-dir", root, "ls", "--json", "--no-index"))
        assert before and all(t.startswith("2023-") for t in before.values()), before
        here = Path(__file__).resolve().parents[1]
        paths = ":".join([str(here), *(p for p in site.getsitepackages() if "site-packages" in p)])
        for _ in range(3):
            run = subprocess.run([PY, "-c", IN_WORKERS, "--cache-dir", str(root), "ls", "--json", "--no-index"],
                                 capture_output=True, text=True, timeout=TIMEOUT, preexec_fn=as_other_member, cwd="/",
                                 env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "PYTHONPATH": paths})
            assert run.returncode == 0, run.stderr
        assert [p for p in root.rglob("*") if p.is_file() and p.stat().st_atime_ns != T * 10**9], "no read moved"
        assert last_uses(other_member_kcache("--cache-dir", root, "ls", "--json", "--no-index")) == before
        assert last_uses(root_kcache("--cache-dir", root, "ls", "--json", "--no-index")) == before


@pytest.mark.second_user
def test_a_readers_unnoted_reads_are_said_once_and_not_under_quiet(area):
    """A user outside the group may read a 2775 cache (its mode lets others read) but neither read
    without moving atimes nor write the note: kcache says, once, how many files its reads moved."""
    root = group_cache(area)
    for dirpath, dirs, files in os.walk(root, topdown=False):
        for n in files + dirs:
            os.utime(os.path.join(dirpath, n), (T, T), follow_symlinks=False)
    run = other_member_kcache("--cache-dir", root, "ls", preexec=as_outsider)
    assert run.returncode == 0, run.stderr
    moved = [p for p in root.rglob("*") if p.is_file() and p.stat().st_atime_ns != T * 10**9]
    if not moved:
        pytest.skip("SKIPPED LOUDLY: reads move no atime on this mount (noatime): nothing to say")
    said = [ln for ln in run.stderr.splitlines() if "moved the last use of" in ln]
    assert len(said) == 1 and f"moved the last use of {len(moved)} files" in said[0], run.stderr
    assert not list(root.glob(".kcache/reads*"))  # no note: it cannot write the cache
    for p in moved:
        os.utime(p, (T, T), follow_symlinks=False)
    quiet = other_member_kcache("--cache-dir", root, "ls", "-q", preexec=as_outsider)
    assert quiet.returncode == 0 and quiet.stderr == ""


# ---- the recipes of docs/ ------------------------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[1] / "docs"
KCACHE = f"{sys.executable} -m kcache_cli"


@pytest.mark.second_user
def test_the_cron_line_of_the_docs(area):
    """The line of docs/shared-caches.md, as root's cron runs it (sh, umask 022, no terminal), on a 2775
    cache over its budget with broken entries: exit 0, broken gone, budget kept, a short mail."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from gen_cache import generate

    line = next(ln for ln in (DOCS / "shared-caches.md").read_text().splitlines() if ln.startswith("30 3 * * * "))
    command = line.split(" root ", 1)[1]
    root = area / "cache"
    generate(str(root), 300)
    share(root)
    for lib in sorted(root.glob("ops/*/*/*/lib.so"))[:40]:
        lib.unlink()  # 40 broken entries
    total = json.loads(root_kcache("--cache-dir", root, "stats", "--json").stdout)["size"]
    assert root_kcache("--cache-dir", root, "config", "set", "max-size", f"{total // 3}B").returncode == 0
    sh_line = command.replace("/srv/kcache/hidet", str(root)).replace("kcache ", KCACHE + " ")
    run = subprocess.run(["sh", "-c", sh_line],
                         capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
                         preexec_fn=lambda: os.umask(0o022))
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.splitlines() + run.stderr.splitlines()) <= 50  # two prunes, each a summary
    after = json.loads(root_kcache("--cache-dir", root, "stats", "--json").stdout)
    assert after["size"] <= total // 3 and after["by_status"].keys() == {"complete"}
    assert "Removed" in run.stdout  # the night it removed something mails what went
    again = subprocess.run(["sh", "-c", sh_line], capture_output=True, text=True, timeout=TIMEOUT,
                           stdin=subprocess.DEVNULL, preexec_fn=lambda: os.umask(0o022))
    assert again.returncode == 0 and (again.stdout, again.stderr) == ("", ""), again  # nothing to do: no mail
    assert member_kcache("--cache-dir", root, "prune", "--broken").returncode == 0  # still the group's


def test_quiet_prune_and_clear_with_nothing_to_do_print_nothing(kcache, fixture_copy, tmp_path):
    """-q: a prune or clear that removes nothing prints nothing at all, on stdout or stderr (a cron job mails
    nothing), over one cache or every cache found; what it removes, its warnings and its errors still show."""
    from conftest import copy_tree

    root = fixture_copy("hidet")
    assert kcache("--cache-dir", root, "config", "set", "max-size", "10G").exit_code == 0  # a note, without -q
    for args in (("prune", "--broken"), ("prune", "--yes"), ("prune", "--dry-run"), ("prune", "--max-size", "10G"),
                 ("clear", "--status", "partial", "--yes"), ("clear", "--status", "partial", "--dry-run")):
        loud = kcache("--cache-dir", root, *args)
        assert loud.exit_code == 0 and loud.stdout + loud.stderr, args  # without -q it says what it did
        run = kcache("-q", "--cache-dir", root, *args)
        assert run.exit_code == 0 and (run.stdout, run.stderr) == ("", ""), (args, run.stdout, run.stderr)
    home = tmp_path / "home"  # every cache found: no headings either
    copy_tree(FIXTURES / "hidet", home / ".cache" / "hidet")
    copy_tree(FIXTURES / "tilus", home / ".cache" / "tilus")
    away = tmp_path / "elsewhere"  # (the CUDA JIT cache's root is its parent)
    env = {"HOME": str(home), "KCACHE_DIR": None, "XDG_CACHE_HOME": None, "TRITON_CACHE_DIR": None,
           "TRITON_HOME": None, "TILELANG_CACHE_DIR": None, "TORCHINDUCTOR_CACHE_DIR": str(away / "inductor"),
           "CUDA_CACHE_PATH": str(away / "nv"), "VLLM_CACHE_ROOT": str(away / "vllm")}
    loud = kcache("prune", "--all-caches", "--broken", env=env).stdout  # one line a cache, no heading
    assert loud.splitlines() == [f"Nothing removed from {home / '.cache' / name}." for name in ("hidet", "tilus")]
    run = kcache("-q", "prune", "--all-caches", "--broken", env=env)
    assert run.exit_code == 0 and (run.stdout, run.stderr) == ("", ""), (run.stdout, run.stderr)
    run = kcache("-q", "--cache-dir", root, "clear", "--op", "nosuch", "--yes")  # a warning stays
    assert run.exit_code == 0 and run.stdout == "" and "warning: no op 'nosuch'" in run.stderr, run.stderr
    run = kcache("-q", "--cache-dir", root, "clear", "--op", "relu", "--yes")  # what went is data
    assert run.exit_code == 0 and "Removed 1 entry" in run.stdout and run.stderr == "", run.stderr
    run = kcache("-q", "--cache-dir", tmp_path / "nosuch", "prune")  # an error stays
    assert run.exit_code == 2 and run.stderr.startswith("Error: "), run.stderr


def test_the_ci_recipe_exits_0_on_a_cache_miss(tmp_path):
    """docs/ci.md's GitLab script, without the tests: a miss (no archive) imports nothing, exits 0 and
    exports nothing; so does a job whose cache holds only entries export leaves out (a torch extension or
    JAX cache moved from where it was built: its old `ls -q` guard passed, then export failed the job);
    with kernels compiled meanwhile, the export is the next run's hit."""
    import shutil

    text = (DOCS / "ci.md").read_text()
    script = text[text.index("  script:\n"):].split("```", 1)[0].splitlines()[1:]
    steps = [s.strip()[2:] for s in script if s.strip().startswith("- ") and "pytest" not in s]
    env = {**os.environ, "KCACHE_DIR": str(tmp_path / "cache")}

    def job(compiled: str | None) -> subprocess.CompletedProcess:
        shell = [s.replace("kcache ", KCACHE + " ") for s in steps]
        if compiled:  # stands for the tests compiling kernels
            shell.insert(2, f"cp -r {FIXTURES / compiled}/. \"$KCACHE_DIR\"")
        return subprocess.run(["sh", "-ec", "\n".join(shell)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT, stdin=subprocess.DEVNULL)

    miss = job(None)
    assert miss.returncode == 0 and not (tmp_path / "kernels.tar.zst").exists(), miss.stderr
    for unshippable in ("torch_ext", "jax"):
        moved = job(unshippable)
        assert moved.returncode == 0 and "nothing to export" in moved.stderr, moved.stderr
        assert not (tmp_path / "kernels.tar.zst").exists()
        shutil.rmtree(tmp_path / "cache")
    built = job("hidet")
    assert built.returncode == 0 and (tmp_path / "kernels.tar.zst").is_file(), built.stderr
    shutil.rmtree(tmp_path / "cache")
    hit = job(False)  # the next run: restored and imported
    assert hit.returncode == 0 and len(entries(tmp_path / "cache")) == 5, hit.stderr


def test_several_caches_idle_ones_say_one_line_and_a_shared_limit_says_its_share(kcache, tmp_path):
    """prune over every cache: a cache with nothing to remove is its one "Nothing to remove" line (no
    heading, no blank line between such lines: nine caches, nine lines); one with removals keeps its
    heading and table. One --max-size over several caches gives each its share, said as a share (not a
    limit of 0 B the user never asked for), and --json carries the whole limit beside it."""
    from conftest import copy_tree

    home = tmp_path / "home"
    copy_tree(FIXTURES / "hidet", home / ".cache" / "hidet")
    copy_tree(FIXTURES / "tilus", home / ".cache" / "tilus")
    away = tmp_path / "elsewhere"
    env = {"HOME": str(home), "KCACHE_DIR": None, "XDG_CACHE_HOME": None, "TRITON_CACHE_DIR": None,
           "TRITON_HOME": None, "TILELANG_CACHE_DIR": None, "TORCHINDUCTOR_CACHE_DIR": str(away / "inductor"),
           "CUDA_CACHE_PATH": str(away / "nv"), "VLLM_CACHE_ROOT": str(away / "vllm")}
    idle = kcache("prune", "--all-caches", "--dry-run", env=env)
    assert idle.exit_code == 0
    assert idle.stdout.splitlines() == [
        f"Nothing to remove in {home / '.cache' / name} ({_human(home / '.cache' / name, kcache, env)} scanned)."
        for name in ("hidet", "tilus")]
    cleared = kcache("clear", "--status", "partial", "--dry-run", env=env)  # clear: the same
    assert cleared.exit_code == 0 and "==> " not in cleared.stdout
    assert len(cleared.stdout.splitlines()) == 2 and cleared.stdout.startswith("Nothing to remove in ")
    tilus_size = kcache("--cache-dir", home / ".cache" / "tilus", "stats", "--json", env=env).json()["size"]
    limit = tilus_size + 1  # room for tilus's entries alone, used last: hidet's go
    _touch_all(home / ".cache" / "tilus")
    shared = kcache("prune", "--all-caches", "--max-size", str(limit) + "B", "--dry-run", env=env)
    assert shared.exit_code == 0, shared.stderr
    assert f"==> {home / '.cache' / 'hidet'} <==" in shared.stdout
    assert "its share of --max-size" in shared.stdout and "(limit 0 B)" not in shared.stdout
    doc = kcache("prune", "--all-caches", "--max-size", str(limit) + "B", "--dry-run", "--json", env=env).json()
    assert {c["max_size_shared"] for c in doc["caches"]} == {limit}
    assert sum(c["max_size"] for c in doc["caches"]) <= limit


def _human(root, kcache, env) -> str:
    from kcache_cli.cli.common import human_size

    return human_size(kcache("--cache-dir", root, "stats", "--json", env=env).json()["size"])


def _touch_all(root) -> None:
    """Every file of `root` used now: the most recently used cache."""
    import time

    now = time.time() + 60
    for dirpath, _, files in os.walk(root):
        for f in files:
            os.utime(os.path.join(dirpath, f), (now, now), follow_symlinks=False)


def test_a_root_s_heading_over_several_caches_cannot_act_on_the_terminal(kcache, tmp_path):
    """prune and clear over every cache head each root's table `==> ROOT <==`: a root whose name holds
    a terminal escape or a newline (TRITON_CACHE_DIR, or a directory someone else named) is shown escaped,
    as the lines that follow show it, never obeyed nor split into a line of its own."""
    from conftest import copy_tree

    home = tmp_path / "home"
    copy_tree(FIXTURES / "hidet", home / ".cache" / "hidet")
    odd = tmp_path / "tri\x1b]0;owned\x07\nx"
    copy_tree(FIXTURES / "triton" / "cache", odd)
    away = tmp_path / "elsewhere"
    env = {"HOME": str(home), "KCACHE_DIR": None, "XDG_CACHE_HOME": None, "TRITON_CACHE_DIR": str(odd),
           "TRITON_HOME": None, "TILELANG_CACHE_DIR": None, "TORCHINDUCTOR_CACHE_DIR": str(away / "inductor"),
           "CUDA_CACHE_PATH": str(away / "nv"), "VLLM_CACHE_ROOT": str(away / "vllm")}
    for args in (["prune", "--older-than", "0s"], ["clear", "--all"]):
        run = kcache(*args, "--all-caches", "--dry-run", env=env)
        assert run.exit_code == 0, run.stderr
        assert "\x1b" not in run.stdout and "\x07" not in run.stdout
        assert f"==> {tmp_path}/tri\\x1b]0;owned\\x07\\x0ax <==" in run.stdout.splitlines()
