"""Cache root resolution and `kcache dir`."""

from __future__ import annotations

from pathlib import Path

from kcache_cli.locate import resolve_cache_dir


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


def test_git_work_tree_rule_dir_and_file(tmp_path):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    sub = repo / "a" / "b"
    sub.mkdir(parents=True)
    loc = resolve_cache_dir(cwd=sub)
    assert loc.path == repo / ".hidet_cache" and "git" in loc.reason
    worktree = tmp_path / "wt"
    (worktree / "x").mkdir(parents=True)
    (worktree / ".git").write_text("gitdir: /elsewhere\n")  # a worktree's .git is a file
    assert resolve_cache_dir(cwd=worktree / "x").path == worktree / ".hidet_cache"


def test_dir_command_prints_path_and_reason(kcache, tmp_path, monkeypatch):
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "k"))
    r = kcache("dir")
    assert r.exit_code == 0
    assert r.stdout.strip() == str(tmp_path / "k")
    assert "KCACHE_DIR" in r.stderr
    data = kcache("dir", "--json").json()
    assert data == {"path": str(tmp_path / "k"), "reason": "KCACHE_DIR environment variable", "exists": False,
                    "layouts": []}


def test_dir_all_lists_known_caches(kcache, fixture_copy, monkeypatch):
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(fixture_copy("tilelang")))
    rows = {r["cache"]: r for r in kcache("dir", "--all", "--json").json()}
    assert set(rows) == {"hidet", "tilus", "tilelang", "triton"}
    assert rows["tilelang"]["layouts"] == ["tilelang"] and rows["tilelang"]["entries"] == 2
    assert rows["hidet"]["exists"] is False and rows["hidet"]["entries"] == 0
