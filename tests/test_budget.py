"""A budget it keeps (issue 25): `kcache config` and the file it writes, `kcache prune` with no criteria
enforcing it per cache and across caches, LRU ties broken by size, and `stats` against the budget.
Everything through the real CLI, with the config in a temp directory."""

from __future__ import annotations

import os
import re
import subprocess
import time
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, copy_tree

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from gen_cache import generate  # noqa: E402

T = 1_700_000_000  # one time for every file and directory: a copied or untarred cache


@pytest.fixture(autouse=True)
def config_home(tmp_path, monkeypatch) -> Path:
    """XDG_CONFIG_HOME in the test's own directory; no KCACHE_CONFIG."""
    xdg = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    monkeypatch.delenv("KCACHE_CONFIG", raising=False)
    return xdg / "kcache" / "config.toml"


def same_times(root: Path, t: float = T) -> None:
    """Every file and directory under `root` (the root too) accessed and modified at `t`."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for n in filenames + dirnames:
            os.utime(os.path.join(dirpath, n), (t, t), follow_symlinks=False)
    os.utime(root, (t, t))


def entries(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.glob("ops/*/*/*")}


# ---- kcache config ---------------------------------------------------------------------------------
def test_config_set_show_unset_through_the_cli(kcache, config_home):
    assert kcache("config").exit_code == 0
    assert "kcache config set max-size 20G" in kcache("config").stderr
    assert kcache("config", "path").stdout.strip() == str(config_home)
    assert kcache("config", "set", "max-size", "20G").exit_code == 0
    assert kcache("config", "set", "--cache", "triton", "max-age", "30d").exit_code == 0
    assert kcache("config", "set", "--cache", "hidet", "max-size", "1.5GiB").exit_code == 0
    text = config_home.read_text()
    assert text == ('[all]\nmax-size = "20G"\n\n[cache.hidet]\nmax-size = "1.5GiB"\n\n'
                    '[cache.triton]\nmax-age = "30d"\n')
    shown = kcache("config", "--json").json()
    assert shown == {"schema": "kcache/config/1", "path": str(config_home), "exists": True,
                     "all": {"max_size": 20 * 10**9, "max_age": None},
                     "caches": [{"cache": "hidet", "max_size": 3 * 2**29, "max_age": None},
                                {"cache": "triton", "max_size": None, "max_age": 30 * 86400.0}]}
    human = kcache("config")
    assert human.stdout.splitlines()[0] == f"# {config_home}" and '[cache.triton]' in human.stdout
    assert kcache("config", "unset", "--cache", "triton", "max-age").exit_code == 0
    assert "[cache.triton]" not in config_home.read_text()
    again = kcache("config", "unset", "--cache", "triton", "max-age")
    assert again.exit_code == 0 and "was not set" in again.stderr


@pytest.mark.parametrize("args, message", [
    (("set", "max-size", "10"), "10 what? say 10G"),
    (("set", "max-size", "lots"), "bad size 'lots'"),
    (("set", "max-age", "30"), "bad age '30'"),
    (("set", "max-age", "6M"), "M is minutes or months? say 6m (minutes) or 6mo (months)"),
    (("set", "max-ram", "1G"), "unknown key 'max-ram'"),
    (("set", "--cache", "hidett", "max-size", "1G"), "unknown cache 'hidett'"),
    (("unset", "max-ram"), "unknown key 'max-ram'"),
])
def test_bad_values_are_one_line_usage_errors(kcache, config_home, args, message):
    run = kcache("config", *args)
    assert run.exit_code == 2, run
    assert message in run.stderr and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert not config_home.exists()  # nothing written


def test_kcache_config_overrides_the_place(kcache, tmp_path, monkeypatch):
    where = tmp_path / "elsewhere" / "k.toml"
    monkeypatch.setenv("KCACHE_CONFIG", str(where))
    assert kcache("config", "path").stdout.strip() == str(where)
    assert kcache("config", "set", "max-age", "2w").exit_code == 0
    assert where.read_text() == '[all]\nmax-age = "2w"\n'


@pytest.mark.parametrize("value, meant", [("20G", "(20.0 GB)"), ("6mo", "(180 days)"), ("90m", "(1.5 hours)"),
                                         ("1y", "(365 days)"), ("2w", "(14 days)")])
def test_a_value_set_is_echoed_as_it_was_read(kcache, value, meant):
    """`6M` once meant six minutes here, silently: every value set is said back as what it was read as."""
    key = "max-size" if value.endswith("G") else "max-age"
    run = kcache("config", "set", key, value)
    assert run.exit_code == 0 and f"{key} = {value} {meant}" in run.stderr, run


@pytest.mark.parametrize("text, message", [
    ("[all\n", "not valid TOML"),
    ("[all]\nmax-age = \"6M\"\n", "M is minutes or months?"),
    ("[all]\nmax-size = 10\n", "10 what? say 10G"),
    ("[all]\nmax-size = true\n", "must be a string"),
    ("[all]\nmax-files = \"3\"\n", "unknown key 'max-files'"),
    ("[cache.nope]\nmax-size = \"1G\"\n", "unknown cache 'nope'"),
    ("colour = \"red\"\n", "unknown setting 'colour'"),
])
def test_a_bad_file_is_a_one_line_error_naming_it(kcache, config_home, fixture_copy, text, message):
    config_home.parent.mkdir(parents=True)
    config_home.write_text(text)
    root = fixture_copy("hidet")
    for args in (("config",), ("--cache-dir", root, "prune", "-n")):
        run = kcache(*args)
        assert run.exit_code == 2 and message in run.stderr and str(config_home) in run.stderr, run
        assert "Traceback" not in run.stderr


def test_a_fifo_or_huge_file_is_refused_without_hanging(kcache, config_home):
    config_home.parent.mkdir(parents=True)
    os.mkfifo(config_home)
    run = kcache("config")
    assert run.exit_code == 1 and "FIFO" in run.stderr  # there, but no file kcache reads: exit 1
    os.unlink(config_home)
    config_home.write_text("#" * (100 << 10))
    assert kcache("config").exit_code == 2  # what it holds is wrong: a usage error


def test_a_symlinked_file_is_read_but_never_written_through(kcache, config_home, tmp_path):
    target = tmp_path / "dotfiles" / "kcache.toml"
    target.parent.mkdir()
    target.write_text('[all]\nmax-size = "5G"\n')
    config_home.parent.mkdir(parents=True)
    config_home.symlink_to(target)
    assert kcache("config", "--json").json()["all"]["max_size"] == 5 * 10**9
    run = kcache("config", "set", "max-size", "6G")
    assert run.exit_code == 1 and "symlink" in run.stderr
    assert target.read_text() == '[all]\nmax-size = "5G"\n' and config_home.is_symlink()
    assert [p.name for p in config_home.parent.iterdir()] == ["config.toml"]  # no temp file left


def test_concurrent_sets_all_land(config_home):
    """Eight processes each set their own cache's max-size at once: the lock keeps every one."""
    from kcache_cli.model.terms import LAYOUT_NAMES

    code = "import sys; from kcache_cli.cli.app import main; main(sys.argv[1:])"
    env = dict(os.environ, XDG_CONFIG_HOME=str(config_home.parent.parent))
    procs = [subprocess.Popen([sys.executable, "-c", code, "config", "set", "--cache", name, "max-size", f"{i + 1}G"],
                              env=env, stderr=subprocess.PIPE) for i, name in enumerate(LAYOUT_NAMES)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    from kcache_cli.ops import config

    cfg = config.load(config_home)
    assert {n: cfg.budget(n).max_size for n in LAYOUT_NAMES} == {n: (i + 1) * 10**9 for i, n in enumerate(LAYOUT_NAMES)}
    assert sorted(os.listdir(config_home.parent)) == ["config.toml"]


# ---- prune with no criteria ------------------------------------------------------------------------
def test_prune_without_config_or_criteria_names_the_config_command(kcache, fixture_copy):
    root = fixture_copy("hidet")
    before = entries(root)
    run = kcache("--cache-dir", root, "prune")
    assert run.exit_code == 0 and "kcache config set max-size 20G" in run.stderr
    assert entries(root) == before



def test_prune_without_criteria_over_every_cache_says_what_removes_entries_once(kcache):
    """`kcache prune --dry-run` over seven caches at their homes said, for each of them, `checked ROOT for
    what prune always removes: ...; none found.` and the same four lines of what else removes entries:
    seven times. Each cache gets its one line; the hint comes once."""
    home = Path(os.environ["HOME"])
    for name, where in (("hidet", ".cache/hidet"), ("tilus", ".cache/tilus"), ("tilelang", ".tilelang/cache")):
        copy_tree(FIXTURES / name, home / where)
    run = kcache("prune", "--dry-run", env={"COLUMNS": "200"})
    assert run.exit_code == 0, run.stderr
    checked = [ln for ln in run.stderr.splitlines() if ln.startswith("checked ")]
    assert len(checked) == 3 and all(ln.endswith("stale temp and staging directories; none found.") for ln in checked)
    assert run.stderr.count("--max-size, --older-than, --broken and --stale remove entries") == 1, run.stderr
    assert run.stderr.count("kcache config set max-size 20G") == 1, run.stderr

def test_prune_enforces_the_cache_budget_keeping_the_most_recent(kcache, fixture_copy):
    root = fixture_copy("hidet")
    same_times(root)
    ops = entries(root)
    relu, matmul = "ops/cpu_space_0/relu/31857fe085635b31", "ops/cpu_space_0/matmul/064b4a6c035246e8"
    os.utime(root / relu / "lib.so", (T + 500, T + 500))  # used most recently
    sizes = {e["path"]: e["size"] for e in kcache("--cache-dir", root, "ls", "--json").json()["entries"]}
    keep = sizes[str(root / relu)] + sizes[str(root / matmul)]  # bytes on disk (issue 32)
    assert kcache("config", "set", "--cache", "hidet", "max-size", f"{keep}B").exit_code == 0
    plan = kcache("--cache-dir", root, "prune", "--dry-run", "--json").json()
    assert plan["max_size"] == keep
    assert entries(root) == ops
    run = kcache("--cache-dir", root, "prune", "--yes")
    assert run.exit_code == 0, run.stderr
    assert "budget of" in run.stderr
    # the rest share one time: the larger go first (softmax 48 kB, add 42 kB, fused 29 kB), then it fits
    assert entries(root) == {relu, matmul}


def test_prune_budget_keeps_the_more_than_half_rule(kcache, fixture_copy):
    root = fixture_copy("hidet")
    assert kcache("config", "set", "max-size", "1k").exit_code == 0
    run = kcache("--cache-dir", root, "prune")
    assert run.exit_code == 2 and "more than half" in run.stderr and "--yes" in run.stderr
    assert len(entries(root)) == 5


def test_prune_enforces_max_age_from_config(kcache, fixture_copy):
    import time

    root = fixture_copy("hidet")
    same_times(root, time.time() - 40 * 86400)
    young = "ops/cpu_space_0/relu/31857fe085635b31"
    os.utime(root / young / "lib.so")
    assert kcache("config", "set", "--cache", "hidet", "max-age", "30d").exit_code == 0
    run = kcache("--cache-dir", root, "prune", "--yes")
    assert run.exit_code == 0, run.stderr
    assert entries(root) == {young}


def test_all_budget_is_shared_across_caches(kcache, tmp_path, monkeypatch):
    """[all] max-size over two caches: the least recently used entries go whichever cache holds them."""
    old, new = tmp_path / "old", tmp_path / "new"
    generate(str(old), 10, lib_size=8192)
    generate(str(new), 10, lib_size=8192)
    same_times(old, T)
    same_times(new, T + 1000)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    size_new = kcache("--cache-dir", new, "stats", "--json").json()["size"]  # on disk
    (tmp_path / "home").mkdir(exist_ok=True)
    from kcache_cli.ops.budget import configured
    from kcache_cli.ops.config import load, set_value

    set_value("all", "max-size", f"{size_new}B")
    budgets = configured([(old, ("hidet",)), (new, ("hidet",))], load(), lambda m: None)
    assert budgets[str(new)].max_size == size_new and budgets[str(old)].max_size == 0
    # what the prune line says: this cache's share of [all], not a max-size of its own (issue 32)
    assert budgets[str(new)].size_from.startswith("its share of [all] max-size")
    set_value("hidet", "max-size", f"{size_new // 2}B")
    budgets = configured([(old, ("hidet",)), (new, ("hidet",))], load(), lambda m: None)
    # each cache's own cap first: `new` keeps at most half of itself, the rest of [all] goes to `old`
    assert budgets[str(new)].max_size <= size_new // 2
    assert 0 < budgets[str(old)].max_size <= size_new // 2
    assert budgets[str(new)].max_size + budgets[str(old)].max_size <= size_new


# ---- LRU ties ----------------------------------------------------------------------------------------
def test_lru_tie_goes_to_the_largest_and_prune_stops_once_under(kcache, tmp_path):
    """23 entries with one mtime; a --max-size that removing the one 7.2 MB entry satisfies: exactly 1 removed."""
    root = tmp_path / "cache"
    generate(str(root), 23)
    big = sorted(entries(root))[7]
    with open(root / big / "lib.so", "ab") as f:
        f.write(os.urandom(7_200_000))
    same_times(root)
    total = kcache("--cache-dir", root, "stats", "--json").json()["size"]  # on disk
    limit = total - 7_200_000
    run = kcache("--cache-dir", root, "prune", "--max-size", f"{limit}B", "--yes", "--json")
    assert run.exit_code == 0, run.stderr
    assert [r["path"] for r in run.json()["removed"]] == [str(root / big)]
    assert len(entries(root)) == 22


# ---- stats against the budget ------------------------------------------------------------------------
def test_stats_shows_usage_against_the_budget(kcache, fixture_copy, monkeypatch):
    root = fixture_copy("hidet")
    plain = kcache("--cache-dir", root, "stats")
    assert " of " not in plain.stdout and kcache("--cache-dir", root, "stats", "--json").json()["budget"] is None
    used = kcache("--cache-dir", root, "stats", "--json").json()["size"]  # on disk (issue 32)
    limit = used * 100 // 83  # 83% used
    assert kcache("config", "set", "--cache", "hidet", "max-size", f"{limit}B").exit_code == 0
    assert kcache("config", "set", "max-size", f"{used * 100 // 17}B").exit_code == 0
    run = kcache("--cache-dir", root, "stats")
    assert run.exit_code == 0
    lines = run.stdout.splitlines()
    from kcache_cli.util.units import format_size

    assert lines[-2] == f"hidet  {format_size(used)} of {format_size(limit)}  " + "#" * 17 + "." * 3 + " 83%"  # a pipe
    assert lines[-1].startswith(f"all    {format_size(used)} of ") and lines[-1].endswith(" 17%"), lines[-1]
    assert kcache("--cache-dir", root, "stats", "--json").json()["budget"] == {"used": used, "limit": limit}


def test_stats_shows_the_budget_kept_in_the_cache_as_json_does(kcache, fixture_copy, tmp_path):
    """The budget kept in the cache binds every bare prune of it: stats draws its line, alone or with a
    personal budget set (which it wins over), and the line says what --json's `budget` says."""
    from kcache_cli.util.units import format_size

    root = fixture_copy("hidet")
    assert kcache("--cache-dir", root, "config", "set", "max-size", "30M").exit_code == 0
    used = kcache("--cache-dir", root, "stats", "--json").json()["size"]
    hidet = f"hidet  {format_size(used)} of 30.0 MB  "
    run = kcache("--cache-dir", root, "stats")
    assert run.exit_code == 0 and run.stdout.splitlines()[-1].startswith(hidet), run.stdout
    assert kcache("--cache-dir", root, "stats", "--json").json()["budget"] == {"used": used, "limit": 30 * 10**6}
    personal = {"KCACHE_CONFIG": str(tmp_path / "p.toml")}
    assert kcache("config", "set", "max-size", "100M", env=personal).exit_code == 0
    assert kcache("config", "set", "--cache", "hidet", "max-size", "50M", env=personal).exit_code == 0
    lines = kcache("--cache-dir", root, "stats", env=personal).stdout.splitlines()
    assert lines[-2].startswith(hidet) and lines[-1].startswith(f"all    {format_size(used)} of 100.0 MB"), lines
    assert kcache("--cache-dir", root, "stats", "--json", env=personal).json()["budget"]["limit"] == 30 * 10**6


def test_stats_shows_no_personal_budget_on_a_cache_it_does_not_bind(kcache, fixture_copy):
    """Personal settings bind only the user's own caches (a bare prune of another's ignores them): stats
    shows none of them there, in either form."""
    root = fixture_copy("hidet")
    assert kcache("config", "set", "--cache", "hidet", "max-size", "50M").exit_code == 0
    assert kcache("config", "set", "max-size", "100M").exit_code == 0
    assert kcache("--cache-dir", root, "stats", "--json").json()["budget"]["limit"] == 50 * 10**6
    for dirpath, dirs, files in os.walk(root):  # another user's cache
        for n in [dirpath, *(os.path.join(dirpath, f) for f in dirs + files)]:
            os.lchown(n, 4242, 4242)
    run = kcache("--cache-dir", root, "stats")
    assert run.exit_code == 0 and " of " not in run.stdout, run.stdout
    assert kcache("--cache-dir", root, "stats", "--json").json()["budget"] is None


def test_stats_with_a_bad_config_warns_and_shows_the_rest(kcache, fixture_copy, config_home):
    root = fixture_copy("hidet")
    config_home.parent.mkdir(parents=True)
    config_home.write_text("[all\n")
    run = kcache("--cache-dir", root, "stats")
    assert run.exit_code == 0 and "no budget shown" in run.stderr and "5 entries" in run.stdout


def test_a_config_that_cannot_be_read_is_exit_1_and_a_malformed_one_exit_2(kcache, fixture_copy, tmp_path):
    """A config file that exists but cannot be read (here a directory where it belongs) is an error, exit 1;
    one that says something wrong is a usage error, exit 2: each one line naming the file, for the user's
    own settings and for the budget kept in a cache. stats only warns."""
    root = fixture_copy("hidet")
    unreadable, malformed = tmp_path / "dir.toml", tmp_path / "bad.toml"
    unreadable.mkdir()
    malformed.write_text("[all\n")
    for cfg, code in ((unreadable, 1), (malformed, 2)):
        env = {"KCACHE_CONFIG": str(cfg)}
        for args in (("config",), ("config", "set", "max-size", "1G"), ("--cache-dir", root, "prune", "--dry-run")):
            run = kcache(*args, env=env)
            assert run.exit_code == code and len(run.stderr.splitlines()) == 1 and str(cfg) in run.stderr, \
                (args, run.exit_code, run.stderr)
        run = kcache("--cache-dir", root, "stats", env=env)
        assert run.exit_code == 0 and "no budget shown" in run.stderr
    kept = root / ".kcache" / "config.toml"
    kept.parent.mkdir(exist_ok=True)
    kept.mkdir()
    run = kcache("--cache-dir", root, "prune", "--dry-run")
    assert run.exit_code == 1 and f"cannot read {kept}" in run.stderr, run.stderr
    kept.rmdir()
    kept.write_text("max-size = 20\n")  # a size without its unit
    run = kcache("--cache-dir", root, "prune", "--dry-run")
    assert run.exit_code == 2 and str(kept) in run.stderr, run.stderr


@pytest.mark.parametrize("where", ["personal", "cache"])
def test_config_set_and_unset_leave_a_malformed_file_alone_and_say_how_to_recover(kcache, fixture_copy, config_home,
                                                                                   where):
    """`config set`/`unset` rewrite the whole file: one they cannot parse is never overwritten (an admin's
    file may hold what kcache does not know); the error names it and the way out, which works."""
    import shlex

    root = fixture_copy("hidet")
    path = root / ".kcache" / "config.toml" if where == "cache" else config_home
    scope = ("--cache-dir", root) if where == "cache" else ()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = '# the admin\'s notes\nmax-size = "30M"\n[all\n'
    path.write_text(text)
    for args in (("set", "max-size", "20G"), ("unset", "max-size")):
        run = kcache(*scope, "config", *args)
        assert run.exit_code == 2 and len(run.stderr.splitlines()) == 1, run.stderr
        assert str(path) in run.stderr and "not valid TOML" in run.stderr, run.stderr
        assert f"mv {shlex.quote(str(path))} {shlex.quote(str(path) + '.bad')}" in run.stderr, run.stderr
        assert path.read_text() == text  # untouched
    os.rename(path, f"{path}.bad")  # what the error says to do
    assert kcache(*scope, "config", "set", "max-size", "20G").exit_code == 0
    written = root / ".kcache" / "budget" / "config.toml" if where == "cache" else path  # the owner's own place
    assert 'max-size = "20G"' in written.read_text() and (path.parent / f"{path.name}.bad").read_text() == text


def test_a_prune_over_several_caches_asks_for_all_before_removing_from_any(kcache, tmp_path):
    """Over every cache found, a prune that must ask for one cache (all of tilus's entries are old) asks
    before it removes anything from any of them: without a terminal it refuses, exit 2, and the hidet
    cache, planned first and asking for nothing, is untouched too."""
    from conftest import FIXTURES, copy_tree

    home = tmp_path / "home"
    hidet, tilus = home / ".cache" / "hidet", home / ".cache" / "tilus"
    copy_tree(FIXTURES / "hidet", hidet)
    copy_tree(FIXTURES / "tilus", tilus)
    same_times(hidet, time.time())
    same_times(tilus, T)  # all of it unused for years
    old_op = hidet / "ops" / "cuda_space_0" / "add"
    same_times(old_op, T)  # one hidet entry of five: under half of that cache
    elsewhere = tmp_path / "elsewhere"  # (the CUDA JIT cache's root is its parent: not the current directory)
    env = {"HOME": str(home), "TORCHINDUCTOR_CACHE_DIR": str(elsewhere / "inductor"), "KCACHE_DIR": None,
           "CUDA_CACHE_PATH": str(elsewhere / "nv"), "VLLM_CACHE_ROOT": str(elsewhere / "vllm"),
           "TRITON_CACHE_DIR": None, "TILELANG_CACHE_DIR": None, "XDG_CACHE_HOME": None, "TRITON_HOME": None}
    def tree(root: Path) -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".kcache" not in p.parts)

    before = tree(hidet), tree(tilus)
    r = kcache("prune", "--older-than", "30d", env=env)
    assert r.exit_code == 2 and "more than half" in r.stderr, (r.stdout, r.stderr)
    assert (tree(hidet), tree(tilus)) == before
    r = kcache("prune", "--older-than", "30d", "--yes", env=env)
    assert r.exit_code == 0, r.stderr
    assert entries(hidet) == {e for e in entries(hidet) if "/add/" not in e} and len(entries(hidet)) == 4
    assert not list((tilus / "programs").iterdir())


def test_a_budget_that_cannot_be_read_stops_the_prune_of_its_cache_only(kcache, tmp_path):
    """A bare prune over every cache found (root's cron): one cache whose kept budget cannot be read (here a
    directory where config.toml belongs; a member can make its .kcache/ a link) is not pruned, one line
    naming its file, exit 1; the other cache's budget is still enforced."""
    from conftest import FIXTURES, copy_tree

    home = tmp_path / "home"
    hidet, tilus = home / ".cache" / "hidet", home / ".cache" / "tilus"
    copy_tree(FIXTURES / "hidet", hidet)
    copy_tree(FIXTURES / "tilus", tilus)
    same_times(hidet, T)
    same_times(tilus, T)
    elsewhere = tmp_path / "elsewhere"
    env = {"HOME": str(home), "TORCHINDUCTOR_CACHE_DIR": str(elsewhere / "inductor"), "KCACHE_DIR": None,
           "CUDA_CACHE_PATH": str(elsewhere / "nv"), "VLLM_CACHE_ROOT": str(elsewhere / "vllm"),
           "TRITON_CACHE_DIR": None, "TILELANG_CACHE_DIR": None, "XDG_CACHE_HOME": None, "TRITON_HOME": None}
    for root in (hidet, tilus):
        assert kcache("--cache-dir", root, "config", "set", "max-age", "30d").exit_code == 0
    broken = tilus / ".kcache" / "budget" / "config.toml"
    broken.unlink()
    broken.mkdir()
    before = sorted(p.name for p in (tilus / "programs").iterdir())
    r = kcache("prune", "--yes", env=env)
    assert r.exit_code == 1 and f"cannot read {broken}" in r.stderr and "that cache was not pruned" in r.stderr, \
        (r.stdout, r.stderr)
    assert not entries(hidet)  # its own budget, enforced: every entry unused for years
    assert sorted(p.name for p in (tilus / "programs").iterdir()) == before


def test_entry_counts_in_tables_group_their_digits_as_every_other_count(kcache, tmp_path):
    """`kcache stats` of an 8,000-entry cache said `hidet  8000  294.9 MB` under the line `hidet, 8,000
    entries`, and the last row of a prune's summary `...  49 more  4043  149.0 MB` above `Would remove
    5,288 entries`: `dir --all`, the files column and every message group the digits."""
    root = tmp_path / "big"
    generate(str(root), 2000)
    stats = kcache("--cache-dir", root, "stats", env={"COLUMNS": "100"}).stdout
    rows = {ln.split()[0]: ln.split() for ln in stats.splitlines() if ln.split()}
    assert rows["hidet"][1] == "2,000" and rows["complete"][1] == "2,000", stats
    pruned = kcache("--cache-dir", root, "prune", "--max-size", "1M", "--dry-run", "--summary", "--yes",
                    env={"COLUMNS": "100"}).stdout
    more = next(ln for ln in pruned.splitlines() if ln.startswith("..."))
    assert re.search(r"more +\d{1,3}(,\d{3})+ ", more), pruned


def test_a_cache_left_unpruned_is_said_when_another_could_not_be_measured(capsys):
    """Two failed checks at the end of a prune over several caches: one cache not pruned at all (its budget
    could not be read), another pruned but not measured whole. The error is the second's, one line; the
    first was dropped, so nobody learnt that a cache had not been pruned. It is now a warning above it."""
    from types import SimpleNamespace

    from kcache_cli.cli import cmd_delete
    from kcache_cli.cli.options import GlobalOptions
    from kcache_cli.util.errors import KcacheError

    loc = SimpleNamespace(path=Path("/caches/a"))
    plan = SimpleNamespace(unreadable=["ops/cpu_space_0/matmul"], root=Path("/caches/a"))
    unread = {"/caches/b": "cannot read /caches/b/.kcache/config.toml: a directory"}
    with pytest.raises(KcacheError, match="could not be read: its size is not counted"):
        cmd_delete._unmeasured_fails(GlobalOptions(), [(loc, plan)], {"/caches/a": 10**9}, unread)
    assert "/caches/b/.kcache/config.toml: a directory; that cache was not pruned" in capsys.readouterr().err
