"""One vocabulary (issue 25): the same selectors on every selecting command, `--status broken` for the
three statuses `prune --broken` removes, and case-insensitive sort keys; driven through the real CLI on
the real hidet cache."""

from __future__ import annotations

RELU = "ops/cpu_space_0/relu/31857fe085635b31"


def _paths(run) -> set[str]:
    assert run.exit_code == 0, run.stderr
    return {e["path"] for e in run.json()["entries"]}


def test_status_broken_is_partial_failed_and_corrupt(kcache, fixture_copy):
    root = fixture_copy("hidet")
    (root / RELU / "lib.so").write_bytes(b"")  # partial: hidet compiles it again
    broken = _paths(kcache("--cache-dir", root, "ls", "--status", "broken", "--json"))
    assert broken == {str(root / RELU)}
    each = _paths(kcache("--cache-dir", root, "ls", "--status", "partial,failed,corrupt", "--json"))
    assert broken == each
    assert _paths(kcache("--cache-dir", root, "ls", "--status", "BROKEN", "--json")) == broken
    plan = kcache("--cache-dir", root, "prune", "--broken", "--dry-run", "--json").json()
    assert {r["path"] for r in plan["removed"] if r["what"] == "entry"} == broken
    bad = kcache("--cache-dir", root, "ls", "--status", "brokn")
    assert bad.exit_code == 2 and "broken" in bad.stderr and "Traceback" not in bad.stderr


def test_clear_takes_status_and_kind(kcache, fixture_copy):
    root = fixture_copy("hidet")
    (root / RELU / "lib.so").write_bytes(b"")
    before = _paths(kcache("--cache-dir", root, "ls", "--json"))
    graphs = _paths(kcache("--cache-dir", root, "ls", "--kind", "graph", "--json"))
    none = kcache("--cache-dir", root, "clear", "--status", "broken", "--kind", "graph", "--yes", "--json")
    assert none.exit_code == 0 and none.json()["entry_count"] == 0, none.stderr
    done = kcache("--cache-dir", root, "clear", "--status", "broken", "--kind", "op", "--yes", "--json")
    assert done.exit_code == 0, done.stderr
    assert [r["path"] for r in done.json()["removed"] if r["what"] == "entry"] == [str(root / RELU)]
    after = _paths(kcache("--cache-dir", root, "ls", "--json"))
    assert after == before - {str(root / RELU)} and graphs <= after
    assert "--status" in kcache("clear", "--help").stdout


def test_sort_keys_ignore_case(kcache, fixture_copy):
    root = fixture_copy("hidet")
    upper = kcache("--cache-dir", root, "ls", "--sort", "SIZE", "--json")
    lower = kcache("--cache-dir", root, "ls", "--sort", "size", "--json")
    assert upper.exit_code == 0 and upper.json()["entries"] == lower.json()["entries"]
    sizes = [e["size"] for e in lower.json()["entries"]]
    assert sizes == sorted(sizes, reverse=True) or sizes == sorted(sizes)
