"""The JSON the README calls stable is made at the core: each result a command prints with --json has a
`to_json()`, tested here without the CLI (key order included: scripts read these). The CLI's Output
object only writes it."""

from __future__ import annotations

import json

import pytest

from kcache_cli import archive
from kcache_cli.catalog.scan import resolve_entry
from kcache_cli.cli.common import GlobalOptions, Output
from kcache_cli.formats.binary import read_binary
from kcache_cli.layouts import get
from kcache_cli.model.records import EntryKey, ScanFilter
from kcache_cli.ops.delete import plan_clear
from kcache_cli.remote.manage import RemoteEntry, RemotePruneResult, RemoteRemoval
from kcache_cli.remote.moved import MovedEntry, named
from kcache_cli.remote.pull import PullResult
from kcache_cli.remote.push import PushResult

MOVED_KEYS = ["layout", "kind", "relpath", "file_count", "size", "action", "done", "reason", "arch"]


def _moved(action: str, done: bool, size: int = 10) -> MovedEntry:
    return MovedEntry(named("hidet", "op", f"ops/cuda_space_0/add/{action[:4]:0>16}"), 2, size, action, done, None,
                      "sm_90")


def test_push_and_pull_results():
    push = PushResult("file:///r", "/c", False, (_moved("push", True, 10), _moved("skip", False, 5),
                                                 _moved("left out", False, 7)))
    data = push.to_json()
    assert list(data) == ["remote", "root", "dry_run", "pushed", "skipped", "left_out", "size", "entries"]
    assert (data["pushed"], data["skipped"], data["left_out"], data["size"]) == (1, 1, 1, 10)
    assert list(data["entries"][0]) == MOVED_KEYS and data["entries"][0]["arch"] == "sm_90"
    pull = PullResult("file:///r", "/c", True, (_moved("pull", False, 10), _moved("replace", False, 3),
                                                _moved("refuse", False, 4)))
    data = pull.to_json()
    assert list(data) == ["remote", "root", "dry_run", "pulled", "skipped", "lock_timeouts", "refused", "size",
                          "entries"]
    assert (data["pulled"], data["refused"], data["size"], data["dry_run"]) == (2, 1, 13, True)  # what would come
    json.dumps(data)


def test_remote_prune_result():
    key = EntryKey("hidet", "op", "cuda", "cuda_space_0", "add", "8d1f7691cdf75e90",
                   "ops/cuda_space_0/add/8d1f7691cdf75e90")
    e = RemoteEntry(key=key, files=3, size=100, arch=None,
                    pushed=1.0, last_pulled=None)
    data = RemotePruneResult("file:///r", True, (RemoteRemoval(e, "too old"),), 100).to_json()
    assert list(data) == ["remote", "dry_run", "removed", "entry_count", "freed"]
    assert data["removed"][0] == {**e.to_json(), "why": "too old"} and data["entry_count"] == 1


def test_export_and_import_results(fixture_copy, tmp_path):
    src = fixture_copy("hidet")
    plan = archive.plan_export(src, ScanFilter(ops=("add",)))
    result = archive.export_archive(plan, str(tmp_path / "a.tar"))
    data = result.to_json(str(src))
    assert list(data) == ["archive", "root", "compression", "sources_only", "entry_count", "file_count", "size",
                          "archive_size", "exported", "left_out"]
    assert data["entry_count"] == len(data["exported"]) > 0 and data["root"] == str(src)
    assert list(data["exported"][0]) == ["layout", "kind", "target", "space", "op", "hash", "relpath", "file_count",
                                         "size", "compiler", "arch", "platform", "omitted"]
    dest = tmp_path / "dest"
    imported = archive.import_archive(dest, str(tmp_path / "a.tar"))
    first = imported.entries[0].relpath
    data = imported.to_json(((9, 0),), {first: True})
    assert list(data) == ["archive", "root", "dry_run", "archive_kcache_version", "imported", "replaced", "skipped",
                          "lock_timeouts", "file_count", "size", "gpu", "entries"]
    assert data["imported"] == len(imported.entries) and data["gpu"] == ["9.0"]
    assert list(data["entries"][0]) == ["layout", "kind", "target", "space", "op", "hash", "relpath", "action", "done",
                                        "reason", "file_count", "size", "arch", "arch_ok", "compiler", "platform"]
    assert data["entries"][0]["arch_ok"] is True
    assert imported.to_json()["gpu"] is None and imported.to_json()["entries"][0]["arch_ok"] is None


def test_clear_plan_and_result(fixture_copy):
    root = fixture_copy("hidet")
    plan = plan_clear(root, ScanFilter(ops=("add",)))
    dry = plan.to_json({"max_size": None})
    assert list(dry) == ["root", "exists", "dry_run", "removed", "skipped", "errors", "entry_count", "freed",
                         "size_before", "size_after", "max_size", "warnings", "unreadable", "trash"]
    assert dry["dry_run"] is True and dry["entry_count"] == plan.entries > 0
    assert dry["freed"] == sum(r["size"] for r in dry["removed"])
    result = plan.execute()
    done = result.to_json(plan.scanned_size)
    assert list(done) == ["root", "exists", "dry_run", "removed", "skipped", "errors", "entry_count", "freed",
                          "size_before", "size_after", "removed_dirs", "warnings", "interrupted", "unreadable",
                          "trash"]
    assert done["interrupted"] is False and done["unreadable"] == dry["unreadable"] == []
    assert done["trash"] == dry["trash"] == 0
    assert done["dry_run"] is False and done["size_after"] == plan.scanned_size - done["freed"]
    assert done["entry_count"] == dry["entry_count"]


def test_inspect_details(fixture_copy):
    root = fixture_copy("hidet")
    entry = resolve_entry(root, "8d1f7691")
    d = get(entry.layout).describe(root, entry)
    bins = [read_binary(p) for p in d.binaries]
    data = d.to_json(bins)
    assert list(data)[:len(entry.to_json())] == list(entry.to_json())
    for key in ("status", "reason", "problems", "inputs", "outputs", "files", "compile_command", "compiler_output",
                "archs", "binaries", "facts"):
        assert key in data
    assert data["status"] == d.status and len(data["binaries"]) == len(bins) > 0
    assert list(data["binaries"][0]) == ["path", "format", "machine", "archs", "ptx", "symbols", "error"]
    json.dumps(data)


@pytest.mark.parametrize("as_json,quiet,silent", [(True, False, False), (False, False, False), (False, True, False),
                                                  (False, True, True)])
def test_output_renders_one_form(capsys, as_json, quiet, silent):
    opts = GlobalOptions(json=as_json, quiet=quiet)
    opts.silent = silent  # ls -q: paths only
    out = Output(opts)
    out.info("a note")
    out.warn("careful")
    out.result(PushResult("file:///r", "/c", False, ()), lambda: out.text("human form"))
    out.error("one item failed")
    got = capsys.readouterr()
    if as_json:
        assert json.loads(got.out)["pushed"] == 0 and "human form" not in got.out
    else:
        assert got.out == "human form\n"
    assert ("a note" in got.err) is not quiet  # -q: no notes
    assert ("warning: careful" in got.err) is not silent  # -q keeps warnings; only ls -q drops them
    assert "error: one item failed" in got.err


def test_output_collects_one_list(capsys):
    out = Output(GlobalOptions(json=True), collect=True)
    out.result({"a": 1})
    out.result(lambda: {"b": 2})  # made only under --json
    out.done(empty="nothing")
    assert json.loads(capsys.readouterr().out) == {"caches": [{"a": 1}, {"b": 2}]}
    people = Output(GlobalOptions(), collect=True)
    people.done(empty="no kernel cache found")
    assert capsys.readouterr().err == "no kernel cache found\n"
