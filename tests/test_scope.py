"""Every cache by default (issue 25): without --cache-dir/KCACHE_DIR the commands see every kernel cache
the compilers' own rules find (HOME and the temp dir are the test's own, holding copies of the real
fixtures); `--cache NAME` narrows; an entry's path or the current directory finds its root; a directory
holding a cache one level down says so."""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES, copy_tree, run_kcache


def _home() -> Path:
    return Path(os.environ["HOME"])


@pytest.fixture
def triton_only() -> Path:
    root = copy_tree(FIXTURES / "triton" / "cache", _home() / ".triton" / "cache")
    assert run_kcache("--cache-dir", str(root), "verify", "--fix").exit_code == 0  # as Triton wrote them here
    return root


@pytest.fixture
def both(triton_only) -> dict[str, Path]:
    hidet = copy_tree(FIXTURES / "hidet", _home() / ".cache" / "hidet")
    return {"hidet": hidet, "triton": triton_only}


def _entries(root: Path) -> set[str]:
    return {r["path"] for r in run_kcache("--cache-dir", str(root), "ls", "--json").json()["entries"]}


def test_a_machine_whose_only_cache_is_tritons_lists_it(triton_only):
    run = run_kcache("ls")
    assert run.exit_code == 0, run.stderr
    assert "no cache at" not in run.stderr and ".cache/hidet" not in run.stderr + run.stdout
    assert f"in {triton_only}" in run.stderr
    rows = run_kcache("ls", "--json").json()["entries"]
    assert {r["layout"] for r in rows} == {"triton"} and {r["cache"] for r in rows} == {"triton"}
    assert {r["path"] for r in rows} == _entries(triton_only)
    stats = run_kcache("stats", "--json").json()["caches"]
    assert [s["cache"] for s in stats] == ["triton"] and stats[0]["entry_count"] == len(rows)


def test_hidet_and_triton_are_both_listed_with_a_cache_column(both):
    run = run_kcache("ls", env={"COLUMNS": "200"})
    assert run.exit_code == 0, run.stderr
    head, *lines = run.stdout.splitlines()
    assert head.split()[0] == "cache"
    caches = {ln.split()[0] for ln in lines if ln and not ln.startswith(" ")}
    assert caches == {"hidet", "triton"}
    assert "in 2 caches (hidet, triton)" in run.stderr  # in dir --all's order
    rows = run_kcache("ls", "--json").json()["entries"]
    assert {r["path"] for r in rows} == _entries(both["hidet"]) | _entries(both["triton"])
    assert {(r["cache"], r["root"]) for r in rows} == {(k, str(v)) for k, v in both.items()}
    # --all-caches is the same scope, still accepted
    every = run_kcache("ls", "--all-caches", "--json").json()["entries"]
    assert {r["path"] for r in every} == {r["path"] for r in rows}
    # one --limit and one order across both caches
    biggest = run_kcache("ls", "--sort", "size", "--limit", "3", "--json").json()["entries"]
    assert [r["size"] for r in biggest] == sorted((r["size"] for r in rows), reverse=True)[:3]


def test_cache_option_narrows_to_one(both):
    run = run_kcache("ls", "--cache", "triton", env={"COLUMNS": "200"})
    assert run.exit_code == 0, run.stderr
    assert run.stdout.split()[0] != "cache"  # one cache: no cache column
    triton = run_kcache("ls", "--cache", "triton", "--json").json()["entries"]
    assert {r["path"] for r in triton} == _entries(both["triton"])
    stats = run_kcache("stats", "--cache", "hidet", "--json").json()
    assert isinstance(stats, dict) and stats["root"] == str(both["hidet"])
    bad = run_kcache("ls", "--cache", "tritn")
    assert bad.exit_code == 2 and "unknown cache 'tritn'" in bad.stderr
    clash = run_kcache("ls", "--cache", "triton", "--cache-dir", str(both["hidet"]))
    assert clash.exit_code == 2 and "do not go together" in clash.stderr
    from kcache_cli.cli.complete import complete_cache

    offered = [name for name, _ in complete_cache(None, "tr")]  # type: ignore[arg-type]
    assert offered == ["triton"]


def test_op_selects_over_every_cache(both):
    run = run_kcache("ls", "--op", "matmul", "--json")
    assert run.exit_code == 0 and "warning" not in run.stderr, run.stderr
    assert {(r["layout"], r["op"]) for r in run.json()["entries"]} == {("hidet", "matmul")}
    run = run_kcache("ls", "--op", "matmul_kernel", "--json")
    assert {(r["layout"], r["op"]) for r in run.json()["entries"]} == {("triton", "matmul_kernel")}
    nowhere = run_kcache("ls", "--op", "matmull")
    assert nowhere.exit_code == 0 and "no op 'matmull'" in nowhere.stderr


def test_an_entry_path_finds_its_root(both, tmp_path):
    kernel = sorted(p for p in both["triton"].iterdir() if p.is_dir())[0]
    run = run_kcache("inspect", str(kernel), "--json")
    assert run.exit_code == 0, run.stderr
    assert run.json()["path"] == str(kernel)
    log = run_kcache("inspect", str(both["hidet"] / "ops" / "cuda_space_0" / "softmax"
                                   / "ad252b064b266eea"), "--json")
    assert log.exit_code == 0 and log.json()["path"].endswith("ad252b064b266eea"), log.stderr
    # a cache in no known place: found by walking up to a directory its layout detection accepts
    elsewhere = copy_tree(FIXTURES / "hidet", tmp_path / "projects" / "kernels")
    entry = elsewhere / "ops" / "cpu_space_0" / "matmul" / "064b4a6c035246e8"
    run = run_kcache("inspect", str(entry), "--json")
    assert run.exit_code == 0, run.stderr
    assert run.json()["path"] == str(entry)
    assert {r["path"] for r in run_kcache("ls", str(entry), "--json").json()["entries"]} == {str(entry)}
    # a path in no cache at all is a miss, exit 2
    stray = tmp_path / "not-a-cache"
    stray.mkdir()
    miss = run_kcache("inspect", str(stray))
    assert miss.exit_code == 2 and "no entry matches" in miss.stderr
    # a hash prefix is looked for in every cache
    assert run_kcache("inspect", "ad252b06", "--json").json()["layout"] == "hidet"
    assert run_kcache("inspect", kernel.name[:10], "--json").json()["layout"] == "triton"


def test_the_current_directory_inside_a_cache_is_the_scope(both, monkeypatch):
    monkeypatch.chdir(both["triton"])
    rows = run_kcache("ls", "--json").json()["entries"]
    assert {r["path"] for r in rows} == _entries(both["triton"])
    assert "cache" not in rows[0]  # one cache: the plain rows
    assert len(run_kcache("ls", "--all-caches", "--json").json()["entries"]) > len(rows)
    monkeypatch.chdir(both["hidet"] / "ops" / "cuda_space_0")
    assert {r["layout"] for r in run_kcache("ls", "--json").json()["entries"]} == {"hidet"}
    stats = run_kcache("stats", "--json").json()
    assert isinstance(stats, dict) and stats["root"] == str(both["hidet"])


@pytest.mark.parametrize("below", ["triton/cache", "hidet"])
def test_a_directory_holding_a_cache_one_level_down_says_so(tmp_path, below, monkeypatch):
    d = tmp_path / "data"
    src = FIXTURES / "triton" / "cache" if below.startswith("triton") else FIXTURES / "hidet"
    copy_tree(src, d / below)
    for args in (("--cache-dir", str(d), "ls"), ("--cache-dir", str(d), "stats"), ("--cache-dir", str(d), "verify")):
        run = run_kcache(*args)
        assert run.exit_code == 2, (args, run.stdout, run.stderr)
        assert f"no cache at {d}" in run.stderr and f"--cache-dir {d / below}" in run.stderr
    monkeypatch.setenv("KCACHE_DIR", str(d))
    run = run_kcache("ls")
    assert run.exit_code == 2 and f"--cache-dir {d / below}" in run.stderr
    monkeypatch.delenv("KCACHE_DIR")
    empty = tmp_path / "empty"
    empty.mkdir()
    run = run_kcache("--cache-dir", str(empty), "ls")
    assert run.exit_code == 0 and "no entries" in run.stderr


@pytest.mark.parametrize("inside", ["jax/cache", "hidet/ops"])
def test_a_directory_inside_a_cache_names_its_root(tmp_path, inside, monkeypatch):
    """JAX_COMPILATION_CACHE_DIR itself (the JAX layout's one entry) or a level of hidet's tree as the root:
    exit 2 naming the root, not "no entries" (a `verify` there passed a damaged JAX cache)."""
    layout = inside.split("/")[0]
    root = copy_tree(FIXTURES / layout, tmp_path / layout)
    if layout == "jax":
        next((root / "cache").glob("*-cache")).write_bytes(b"abcd")  # cut short: corrupt
    d = tmp_path / inside
    for args in (("--cache-dir", str(d), "verify"), ("--cache-dir", str(d), "ls")):
        run = run_kcache(*args)
        assert run.exit_code == 2, (args, run.stdout, run.stderr)
        assert f"inside a {layout} cache" in run.stderr and f"--cache-dir {root}" in run.stderr
    monkeypatch.setenv("KCACHE_DIR", str(d))
    assert run_kcache("verify").exit_code == 2
    monkeypatch.delenv("KCACHE_DIR")
    assert run_kcache("--cache-dir", str(root), "verify").exit_code == (1 if layout == "jax" else 0)
    (d / "new").mkdir()  # no level of any cache: an empty root of its own
    run = run_kcache("--cache-dir", str(d / "new"), "ls")
    assert (run.exit_code, "no entries" in run.stderr) == ((2, False) if layout == "jax" else (0, True))


def test_clear_space_2_removes_only_hidets_space_2(both):
    ops = both["hidet"] / "ops"
    shutil.copytree(ops / "cuda_space_0", ops / "cuda_space_2", symlinks=True)
    space2 = {str(p) for p in (ops / "cuda_space_2").glob("*/*")}
    assert len(space2) == 2
    before_triton = _entries(both["triton"])
    before_hidet = _entries(both["hidet"])
    plan = run_kcache("clear", "--space", "cuda_space_2", "--dry-run", "--json")
    assert plan.exit_code == 0, plan.stderr
    assert {r["path"] for section in plan.json()["caches"] for r in section.get("removed", section.get("removals", []))
            if r.get("what", "entry") == "entry"} <= space2
    run = run_kcache("clear", "--space", "cuda_space_2", "--yes")
    assert run.exit_code == 0, run.stderr
    assert "warning" not in run.stderr  # Triton has no cuda_space_2: no news, not an error
    assert _entries(both["hidet"]) == before_hidet - space2
    assert _entries(both["triton"]) == before_triton
    assert not any((ops / "cuda_space_2").glob("*/*"))
    miss = run_kcache("clear", "deadbeef", "--yes")
    assert miss.exit_code == 2 and "no entry matches 'deadbeef' in 2 caches" in miss.stderr
    assert _entries(both["hidet"]) == before_hidet - space2


def test_verify_of_one_layout_shows_the_caches_that_hold_it(both):
    """`verify --layout hidet` over every cache: the caches holding no hidet entry are no news in text
    (as clear's); --json keeps one result per cache."""
    run = run_kcache("verify", "--layout", "hidet")
    assert run.exit_code == 0, run.stderr
    assert f"==> {both['hidet']} <==" in run.stdout and str(both["triton"]) not in run.stdout + run.stderr
    assert run.stderr.count("checked ") == 1 and "checked 0 entries" not in run.stderr
    doc = run_kcache("verify", "--layout", "hidet", "--json").json()["caches"]
    assert sorted(r["root"] for r in doc) == sorted(str(p) for p in both.values())
    assert sorted(r["checked"] for r in doc)[0] == 0


def test_verify_of_named_entries_shows_only_the_caches_that_hold_them(both):
    """`verify ad252b06` over every cache printed a `==> ROOT <==` heading and a `checked 0 entries` line for
    each cache the prefix names nothing in: like a selection, they are no news in text; --json keeps one
    result per cache, as for a selection."""
    softmax = "ad252b064b266eea"
    run = run_kcache("verify", softmax[:8])
    assert run.exit_code == 0, run.stderr
    assert run.stdout.count("==> ") == 1 and f"==> {both['hidet']} <==" in run.stdout, run.stdout
    assert run.stderr.count("checked ") == 1 and "checked 1 entry" in run.stderr, run.stderr
    kernel = sorted(r["hash"] for r in run_kcache("ls", "--cache", "triton", "--json").json()["entries"])[0]
    two = run_kcache("verify", softmax[:8], kernel[:10])
    assert two.exit_code == 0, two.stderr
    assert two.stdout.count("==> ") == 2 and two.stderr.count("checked 1 entry") == 2, two.stderr
    doc = run_kcache("verify", softmax[:8], "--json").json()["caches"]
    assert sorted(r["root"] for r in doc) == sorted(str(p) for p in both.values())
    assert sorted(r["checked"] for r in doc) == [0, 1]


def test_verify_export_and_diff_over_every_cache(both, tmp_path):
    run = run_kcache("verify", "--json")
    assert run.exit_code == 0, run.stderr
    assert sorted(r["root"] for r in run.json()["caches"]) == sorted(str(p) for p in both.values())
    spans = run_kcache("export", str(tmp_path / "all.tar"))
    assert spans.exit_code == 2 and "2 caches" in spans.stderr and "--cache" in spans.stderr
    assert not (tmp_path / "all.tar").exists()
    one = run_kcache("export", str(tmp_path / "mm.tar"), "--op", "matmul", "--json")
    assert one.exit_code == 0, one.stderr
    assert one.json()["root"] == str(both["hidet"])
    adds = run_kcache("ls", "--cache", "triton", "--op", "add_kernel", "--json").json()["entries"]
    kernels = sorted(r["hash"] for r in adds)
    diff = run_kcache("diff", kernels[0][:10], kernels[1][:10], "--json")
    assert diff.exit_code == 0, diff.stderr


def _help_examples(group, words=("kcache",)):
    """(command, its help's example line) for every command and subcommand."""
    for name, cmd in sorted(group.commands.items()):
        if getattr(cmd, "commands", None):
            yield from _help_examples(cmd, (*words, name))
            continue
        lines = (cmd.callback.__doc__ or "").strip().splitlines()
        yield " ".join((*words, name)), lines[-1].strip().removeprefix("Example: ")


def _jq(doc, program: str) -> list:
    """What jq prints for `program`, for the filters help examples use: pipes of paths (`.a`, `.a[]`,
    `.a[].b`) and objects of keys (`{cache, by_status}`); a key jq finds nothing under reads null."""
    values = [doc]
    for stage in (s.strip() for s in program.split("|")):
        if (keys := re.fullmatch(r"\{\s*(\w+(?:\s*,\s*\w+)*)\s*\}", stage)) is not None:
            names = [k.strip() for k in keys[1].split(",")]
            values = [{k: v.get(k) for k in names} for v in values]
        elif re.fullmatch(r"(?:\.\w+(?:\[\])?)+", stage):
            for key, each in re.findall(r"\.(\w+)(\[\])?", stage):
                values = [v.get(key) if isinstance(v, dict) else None for v in values]
                if each:
                    assert all(isinstance(v, list) for v in values), f"jq: cannot iterate over {values!r}"
                    values = [x for v in values for x in v]
        else:
            pytest.fail(f"teach _jq the filter {stage!r}, or give the example a simpler one")
    return values


def test_every_help_example_piped_to_jq_finds_its_keys_over_every_cache(both):
    """`kcache stats --json | jq .by_status`, the help's example, printed null in the default scope: the
    reports are under `caches` there. Every example that pipes --json to jq, as typed, in that scope."""
    from typer.main import get_command

    from kcache_cli.cli.app import full_app

    piped = [(cmd, ex) for cmd, ex in _help_examples(get_command(full_app())) if "--json | jq" in ex]
    assert [cmd for cmd, _ in piped] == ["kcache stats"]  # (a new one is checked here too)
    for _, example in piped:
        words = shlex.split(example)
        bar = words.index("|")
        assert words[bar + 1] == "jq" and len(words) == bar + 3, example
        run = run_kcache(*words[1:bar])
        assert run.exit_code == 0, run.stderr
        values = _jq(run.json(), words[bar + 2])
        assert values and all(v is not None for v in values), (example, values)
        assert all(x is not None for v in values if isinstance(v, dict) for x in v.values()), (example, values)


def test_import_goes_to_the_archives_layouts_own_cache(both, tmp_path):
    archive = tmp_path / "triton.tar"
    assert run_kcache("export", str(archive), "--cache", "triton").exit_code == 0
    before = _entries(both["triton"])
    for p in list(both["triton"].iterdir()):
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    run = run_kcache("import", str(archive), "--json")
    assert run.exit_code == 0, run.stderr
    assert run.json()["root"] == str(both["triton"].resolve())
    assert _entries(both["triton"]) == before
    assert not any(p.is_dir() and len(p.name) == 52 for p in both["hidet"].iterdir())


def _completed(line: str) -> list[str]:
    run = run_kcache(env={"_KCACHE_COMPLETE": "complete_fish", "_TYPER_COMPLETE_FISH_ACTION": "get-args",
                          "_TYPER_COMPLETE_ARGS": line})
    assert run.exit_code == 0 and run.stderr == "", run.stderr
    return [ln.partition("\t")[0] for ln in run.stdout.splitlines() if ln]


def test_completion_reads_every_cache_and_cache_narrows_it(both):
    ops = _completed("kcache ls --op ")
    assert "matmul" in ops and "matmul_kernel" in ops  # hidet's and Triton's
    assert "matmul" not in _completed("kcache ls --cache triton --op ")
    assert _completed("kcache clear --cache hi") == ["hidet"]
    assert "ad252b064b266eea" in _completed("kcache inspect ad")


def test_a_hash_in_two_caches_is_ambiguous_until_cache_picks_one(both, tmp_path, monkeypatch):
    other = copy_tree(FIXTURES / "hidet", tmp_path / "other")  # a second known cache holding the same entries
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(other))
    run = run_kcache("inspect", "ad252b06")
    assert run.exit_code == 2 and "names entries in 2 caches" in run.stderr
    assert "--cache hidet or --cache tilelang" in run.stderr
    picked = run_kcache("inspect", "ad252b06", "--cache", "tilelang", "--json")
    assert picked.exit_code == 0 and picked.json()["path"].startswith(str(other))
    assert run_kcache("log", "ad252b06", "--cache", "hidet").exit_code == 0


def test_a_prefix_several_entries_of_one_cache_share_counts_every_cache(both, tmp_path, monkeypatch):
    """'a' names two hidet entries and one of a second cache: the error names both caches and all three
    entries, not the first cache's two alone (whose --space hint would leave the other cache's entry)."""
    other = copy_tree(FIXTURES / "hidet", tmp_path / "other")
    shutil.rmtree(other / "ops/cpu_space_0/fused")  # af30...: the other cache keeps ad252b06 alone
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(other))
    run = run_kcache("inspect", "a")
    assert run.exit_code == 2, run.stderr
    assert "'a' names entries in 2 caches" in run.stderr and "--cache hidet or --cache tilelang" in run.stderr
    assert "2 entries match" not in run.stderr and "af3046266c6abdd1" in run.stderr
    assert run.stderr.count("ad252b064b266eea") == 2, run.stderr
    alone = run_kcache("inspect", "a", "--cache", "hidet")  # one cache: its own ambiguity, as before
    assert alone.exit_code == 2 and "'a' is ambiguous: 2 entries match" in alone.stderr


def test_a_removed_current_directory_is_no_scope(both, tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    run = run_kcache("ls", "--json")
    assert run.exit_code == 0, run.stderr
    assert {r["cache"] for r in run.json()["entries"]} == {"hidet", "triton"}


def test_the_cache_one_level_down_is_named_with_its_article():
    from kcache_cli.cli.common import _a

    assert (_a("hidet"), _a("inductor"), _a("triton")) == ("a hidet", "an inductor", "a triton")


def test_writers_never_plant_entries_inside_another_cache(tmp_path, kcache):
    """build and import took a --cache-dir inside a cache as a new root and wrote hidet/ops/ops/... and
    jax/cache/ops/... (the real root then listed partial entries, which a prune --broken would remove).
    A root still to be made is checked from what exists above it."""
    hidet = copy_tree(FIXTURES / "hidet", tmp_path / "hidet")
    jax = copy_tree(FIXTURES / "jax", tmp_path / "jax")
    archive = tmp_path / "a.tar"
    assert kcache("--cache-dir", hidet, "export", archive).exit_code == 0
    task = tmp_path / "task"
    task.mkdir()
    (task / "task.txt").write_text("Task(\n  name: planted\n)")
    (task / "source.cc").write_text('extern "C" int f() { return 1; }\n')
    for root, args in ((hidet / "ops", ("build", task, "--cxx", "/bin/false")), (jax / "cache", ("import", archive)),
                       (hidet / "ops" / "cpu_space_9", ("import", archive))):
        before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
        run = kcache("--cache-dir", root, *args)
        assert run.exit_code == 2 and "lies inside" in run.stderr, (root, run.stderr)
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert kcache("--cache-dir", hidet, "verify").exit_code == 0


def test_tilelangs_binaries_are_no_triton_cache(tmp_path, kcache):
    """cuda-binaries/<64 hex>/kernel.cubin looked like Triton 3.1's keys and a compile stage: the directory
    was listed (and pruned) as a Triton cache of broken kernels, and its parent sent there."""
    root = copy_tree(FIXTURES / "tilelang", tmp_path / "tl")
    for inside in (root / "0.1.15", root / "0.1.15" / "cuda-binaries"):
        run = kcache("--cache-dir", inside, "prune", "--broken", "--dry-run")
        assert run.exit_code == 2 and f"inside a tilelang cache, whose root is {root}" in run.stderr, run.stderr
    assert {e["layout"] for e in kcache("--cache-dir", root, "ls", "--json").json()["entries"]} == {"tilelang"}
