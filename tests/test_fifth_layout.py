"""The layout interface is real: a fifth layout kcache does not ship (tests/fifth_layout/objcache.py, written
only against layouts.base and shapes) works through every command once its shape is registered, with no
edit anywhere else (tests/fifth_layout/run_kcache.py registers it at run time, as one line in
shapes.SHAPES would)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "fifth_layout" / "run_kcache.py"
GOOD, HALF, EMPTIED = "0123456789abcdef", "fedcba9876543210", "00000000deadbeef"


def kc(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "NO_COLOR": "1", **(env or {})}
    full.pop("KCACHE_DIR", None)
    return subprocess.run([sys.executable, str(RUNNER), *args], capture_output=True, text=True, env=full, timeout=120)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """objects/<GOOD> compiled for real by g++, <HALF> interrupted (no done), <EMPTIED> emptied after done,
    and objects/not-a-hash/, which has no entry's shape."""
    root = tmp_path / "objc"
    good = root / "objects" / GOOD
    good.mkdir(parents=True)
    (good / "a.cc").write_text("int objcache_answer() { return 42; }\n")
    done = subprocess.run(["g++", "-c", "a.cc", "-o", "obj.o"], cwd=good, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (good / "stderr.txt").write_text("a.cc: note: compiled by the test\n")
    (good / "done").touch()
    (root / "objects" / HALF).mkdir()
    (root / "objects" / HALF / "stderr.txt").write_text("interrupted\n")
    emptied = root / "objects" / EMPTIED
    emptied.mkdir()
    (emptied / "obj.o").touch()
    (emptied / "done").touch()
    (root / "objects" / "not-a-hash").mkdir()
    (root / "objects" / "not-a-hash" / "keep.txt").write_text("not kcache's\n")
    return root


def test_ls_judges_its_entries_by_the_layout_rules(cache):
    run = kc("--cache-dir", str(cache), "ls", "--json", "--layout", "objcache", "--kind", "object")
    assert run.returncode == 0, run.stderr
    rows = {r["hash"]: r for r in json.loads(run.stdout)["entries"]}
    assert {h: (r["layout"], r["kind"], r["target"], r["status"]) for h, r in rows.items()} == {
        GOOD: ("objcache", "object", "cpu", "complete"), HALF: ("objcache", "object", "cpu", "partial"),
        EMPTIED: ("objcache", "object", "cpu", "corrupt")}
    assert kc("--cache-dir", str(cache), "ls", "--layout", "objcachex").returncode == 2  # choices from the registry


def test_inspect_log_and_verify_use_its_hooks(cache):
    shown = kc("--cache-dir", str(cache), "inspect", GOOD[:6], "--json")
    assert shown.returncode == 0, shown.stderr
    details = json.loads(shown.stdout)
    assert details["status"] == "complete" and details["layout"] == "objcache"
    assert any("objcache_answer" in json.dumps(b) for b in details["binaries"])  # g++'s symbol, read from obj.o
    log = kc("--cache-dir", str(cache), "log", GOOD[:6])
    assert log.returncode == 0 and "compiled by the test" in log.stdout
    verify = kc("--cache-dir", str(cache), "verify", "--json")
    assert verify.returncode == 1
    assert sorted(p["hash"] for p in json.loads(verify.stdout)["problems"]) == sorted([HALF, EMPTIED])


def test_prune_removes_only_its_broken_entries(cache):
    run = kc("--cache-dir", str(cache), "prune", "--broken", "--yes", "--json")
    assert run.returncode == 0, run.stderr
    assert sorted(os.listdir(cache / "objects")) == sorted([GOOD, "not-a-hash"])
    assert (cache / "objects" / "not-a-hash" / "keep.txt").read_text() == "not kcache's\n"
    assert (cache / "objects" / GOOD / "obj.o").stat().st_size > 0


def test_export_import_round_trip(cache, tmp_path):
    archive = tmp_path / "objc.tar.gz"
    assert kc("--cache-dir", str(cache), "export", str(archive)).returncode == 0
    other = tmp_path / "other"
    run = kc("--cache-dir", str(other), "import", str(archive), "--json")
    assert run.returncode == 0, run.stderr
    assert sorted(os.listdir(other / "objects")) == [GOOD]  # only the complete entry travels
    for name in ("obj.o", "stderr.txt", "done", "a.cc"):
        assert (other / "objects" / GOOD / name).read_bytes() == (cache / "objects" / GOOD / name).read_bytes()
    again = kc("--cache-dir", str(other), "ls", "--json")
    assert [(r["hash"], r["status"]) for r in json.loads(again.stdout)["entries"]] == [(GOOD, "complete")]


def test_completion_offers_it(cache):
    def complete(line: str) -> list[str]:
        run = kc(env={"_KCACHE_COMPLETE": "complete_fish", "_TYPER_COMPLETE_FISH_ACTION": "get-args",
                      "_TYPER_COMPLETE_ARGS": line})
        assert run.returncode == 0 and run.stderr == "", run.stderr
        return [ln for ln in run.stdout.splitlines() if ln]

    assert "objcache\tobjects/<hash>/" in complete(f"kcache --cache-dir {cache} ls --layout ")
    assert "object\tobjcache object" in complete(f"kcache --cache-dir {cache} ls --kind ob")
    assert [c.split("\t")[0] for c in complete(f"kcache --cache-dir {cache} inspect 0123")] == [GOOD]


def test_nothing_in_kcache_names_it():
    src = HERE.parent / "kcache_cli"
    assert not [p for p in src.rglob("*.py") if "objcache" in p.read_text()]
