"""Cache root resolution and `kcache dir`."""

from __future__ import annotations

from pathlib import Path

from kcache_cli.catalog.locate import resolve_cache_dir


def test_cli_value_wins_over_env(tmp_path, monkeypatch):
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "env"))
    loc = resolve_cache_dir(str(tmp_path / "cli"))
    assert loc.path == tmp_path / "cli" and loc.reason == "--cache-dir"


def test_env_then_default(tmp_path, monkeypatch):
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "env"))
    assert resolve_cache_dir().path == tmp_path / "env"
    monkeypatch.delenv("KCACHE_DIR")
    loc = resolve_cache_dir()
    assert loc.path == Path.home() / ".cache" / "hidet"
    assert "default" in loc.reason


def test_hidet_toml_cache_dir(tmp_path):
    cfg = Path.home() / ".config" / "hidet"
    cfg.mkdir(parents=True)
    (cfg / "hidet.toml").write_text('cache_dir = "/srv/hidet-cache"\n[cuda]\narch = "sm_90"\n')
    loc = resolve_cache_dir()
    assert loc.path == Path("/srv/hidet-cache")
    assert "hidet.toml" in loc.reason


def test_hidet_toml_without_cache_dir_falls_through(tmp_path):
    cfg = Path.home() / ".config" / "hidet"
    cfg.mkdir(parents=True)
    (cfg / "hidet.toml").write_text("[cuda]\ncache_dir = 'not top level'\n")
    assert resolve_cache_dir().path == Path.home() / ".cache" / "hidet"


def test_git_rule_follows_the_hidet_package_not_the_cwd(tmp_path, monkeypatch):
    """hidet looks for a git work tree from where its own package lies (a source checkout), never
    from the current directory (hidet's rule: README "Where the cache is")."""
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    package = repo / "python" / "hidet"
    package.mkdir(parents=True)
    loc = resolve_cache_dir(package_dir=package)
    assert loc.path == repo / ".hidet_cache" and "git work tree" in loc.reason and "installed" in loc.reason
    worktree = tmp_path / "wt"
    (worktree / "x").mkdir(parents=True)
    (worktree / ".git").write_text("gitdir: /elsewhere\n")  # a worktree's .git is a file
    assert resolve_cache_dir(package_dir=worktree / "x").path == worktree / ".hidet_cache"
    # A user inside their own project's repository: still ~/.cache/hidet when hidet is a plain install.
    site = tmp_path / "site-packages" / "hidet"
    site.mkdir(parents=True)
    monkeypatch.chdir(repo)
    loc = resolve_cache_dir(package_dir=site)
    assert loc.path == Path.home() / ".cache" / "hidet" and "not in a git work tree" in loc.reason


def test_cwd_in_a_git_repo_plays_no_part(kcache, tmp_path, monkeypatch):
    """The real lookup (find_spec, no import): hidet is not installed in the test venv, so a git
    repository around the current directory changes nothing."""
    monkeypatch.delenv("KCACHE_DIR", raising=False)
    repo = tmp_path / "project"
    (repo / ".git").mkdir(parents=True)
    monkeypatch.chdir(repo)
    data = kcache("dir", "--json").json()
    assert data["path"] == str(Path.home() / ".cache" / "hidet")
    assert "hidet is not installed" in data["reason"]


def test_find_spec_locates_an_installed_hidet_without_importing_it(tmp_path, monkeypatch):
    import sys

    repo = tmp_path / "hidet-src"
    (repo / ".git").mkdir(parents=True)
    pkg = repo / "python" / "hidet"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('kcache must not import hidet')\n")
    monkeypatch.syspath_prepend(str(repo / "python"))
    monkeypatch.delenv("KCACHE_DIR", raising=False)
    loc = resolve_cache_dir()
    assert loc.path == repo / ".hidet_cache"
    assert "hidet" not in sys.modules


def test_dir_command_prints_path_and_reason(kcache, tmp_path, monkeypatch):
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "k"))
    r = kcache("dir")
    assert r.exit_code == 0
    assert r.stdout.strip() == str(tmp_path / "k")
    assert "KCACHE_DIR" in r.stderr
    data = kcache("dir", "--json").json()
    assert data == {"schema": "kcache/dir/1", "path": str(tmp_path / "k"),
                    "reason": "KCACHE_DIR environment variable", "exists": False,
                    "layouts": []}


def test_dir_all_lists_known_caches(kcache, fixture_copy, monkeypatch):
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(fixture_copy("tilelang")))
    rows = {r["cache"]: r for r in kcache("dir", "--all", "--json").json()["caches"]}
    assert set(rows) == {"hidet", "tilus", "tilelang", "triton", "inductor", "cudajit", "vllm",
                         "torchext", "numba"}
    assert rows["tilelang"]["layouts"] == ["tilelang"] and rows["tilelang"]["entry_count"] == 2
    assert rows["hidet"]["exists"] is False and rows["hidet"]["entry_count"] == 0


def test_a_killed_imports_staging_is_no_cache_to_point_at(kcache, tmp_path):
    """An import killed before it published anything leaves only its staging directory (entries inside
    .kcache/): the root is an empty cache with a leftover prune removes, never "a cache one level down"
    that --cache-dir should name."""
    import shutil

    from conftest import FIXTURES

    dst = tmp_path / "dst"
    staging = dst / ".kcache" / "import-4242-0123abcd"
    shutil.copytree(FIXTURES / "hidet" / "ops", staging / "ops")
    r = kcache("--cache-dir", dst, "ls", "--json")
    assert r.exit_code == 0, r.stderr
    assert [e["kind"] for e in r.json()["entries"]] == ["import"]
    r = kcache("--cache-dir", dst, "prune", "--yes")
    assert r.exit_code == 0, r.stderr
    assert not staging.exists()


def test_a_home_given_as_the_cache_dir_names_the_caches_it_keeps(kcache, tmp_path):
    """--cache-dir of a home (a copied one, a container's volume): its caches lie where the compilers keep
    them, in hidden directories (.cache/hidet, .triton/cache) the one-or-two-levels-down hint never looks
    into. It said "no entries" and exit 0; it names them, at the places this machine's caches have below
    HOME. A staging directory in .kcache/ (the case above) is still no cache to point at."""
    import shutil

    from conftest import FIXTURES

    home = tmp_path / "copied-home"
    shutil.copytree(FIXTURES / "hidet", home / ".cache" / "hidet")
    shutil.copytree(FIXTURES / "triton" / "cache", home / ".triton" / "cache")
    r = kcache("--cache-dir", home, "ls")
    assert r.exit_code == 2, r.stdout
    assert f"{home}/.cache/hidet holds a hidet cache (and 1 other cache): --cache-dir {home}/.cache/hidet" \
        in r.stderr, r.stderr
    shutil.rmtree(home / ".cache")
    r = kcache("--cache-dir", home, "ls")
    assert r.exit_code == 2 and f"--cache-dir {home}/.triton/cache" in r.stderr, r.stderr
    shutil.rmtree(home / ".triton")
    (home / ".cache" / "hidet").mkdir(parents=True)  # where hidet keeps its cache, but none in it yet
    r = kcache("--cache-dir", home, "ls")
    assert r.exit_code == 0 and "no entries" in r.stderr, (r.stdout, r.stderr)
