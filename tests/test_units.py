"""One size grammar and one age grammar for every option that takes one (kcache_cli.util.units)."""

from __future__ import annotations

import pytest

from kcache_cli.util.errors import UsageError
from kcache_cli.util.units import describe_age, format_age, parse_age, parse_seconds, parse_size


@pytest.mark.parametrize("text,want", [
    ("4096B", 4096), ("0", 0),
    ("10GB", 10 * 10**9), ("500M", 500 * 10**6), ("1.5GiB", int(1.5 * 2**30)), (".5G", 5 * 10**8),
    ("2 KiB", 2048), ("7b", 7), ("3.B", 3), (" 1k ", 1000),
])
def test_sizes(text, want):
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["", "G", "1.2.3G", "-1G", "10 parsecs", "1e9", "5XB", "nan", "infG", "1_000G",
                                  "\u0663G", "\u0661\u0660", "\uff11G", "1" * 5000 + "G", "1" * 5000, "9" * 20 + "P"])
def test_bad_sizes_name_the_option(text):
    with pytest.raises(UsageError, match="--max-size"):
        parse_size(text, "--max-size")


@pytest.mark.parametrize("text,want", [("30d", 30 * 86400), ("12h", 12 * 3600), ("90m", 5400), ("1w", 7 * 86400),
                                       ("1d12h", 36 * 3600), (".5d", 43200), ("45s", 45), ("30D", 30 * 86400),
                                       ("6mo", 180 * 86400), ("1y", 365 * 86400), ("2 weeks", 14 * 86400),
                                       ("1 month", 30 * 86400), ("90 minutes", 5400), ("1yr6mo", 545 * 86400),
                                       ("6MO", 180 * 86400), ("5 Min", 300)])
def test_ages(text, want):
    assert parse_age(text) == want


@pytest.mark.parametrize("text", ["", "30", "d", "3 parsecs", "1d-2h", "nand", "infd", "-1d", "\u0663d",
                                  "1" * 5000 + "d", "999999999999w"])
def test_bad_ages(text):
    with pytest.raises(UsageError, match="bad age"):
        parse_age(text)


@pytest.mark.parametrize("text", ["6M", "1d6M", "6 M"])
def test_a_bare_capital_m_is_refused_minutes_or_months(text):
    """6M is six months to systemd and Java, six minutes to Go: read as either, a cron prune of `--older-than
    6M` could empty a cache, so it is refused, naming both readings."""
    with pytest.raises(UsageError, match=r"M is minutes or months\? say 6m \(minutes\) or 6mo \(months\)"):
        parse_age(text, "--older-than")


@pytest.mark.parametrize("seconds, words", [(180 * 86400, "180 days"), (86400, "1 day"), (5400, "1.5 hours"),
                                            (360, "6 minutes"), (60, "1 minute"), (45, "45 seconds")])
def test_an_age_is_described_in_words(seconds, words):
    assert describe_age(seconds) == words


def test_age_text_reads_back():
    for seconds in (40, 12 * 60, 5 * 3600, 30 * 86400):
        assert parse_age(format_age(seconds)) == seconds


@pytest.mark.parametrize("size", [".5G", "1.5GiB", "10GB"])
def test_prune_and_import_read_sizes_alike(kcache, fixture_copy, tmp_path, size):
    """`.5G` means the same to prune --max-size and import --max-file-size (one grammar)."""
    root = fixture_copy("hidet")
    prune = kcache("--cache-dir", root, "prune", "--max-size", size, "--dry-run")
    assert prune.exit_code == 0, prune.stderr
    archive = tmp_path / "a.tar.gz"
    assert kcache("--cache-dir", root, "export", archive).exit_code == 0
    imported = kcache("--cache-dir", tmp_path / "new", "import", archive, "--max-file-size", size, "--dry-run")
    assert imported.exit_code == 0, imported.stderr
    for cmd in (("prune", "--max-size", "5XB", "--dry-run"), ("import", archive, "--max-file-size", "5XB")):
        bad = kcache("--cache-dir", root, *cmd)
        assert bad.exit_code == 2 and bad.stderr.startswith("Error: bad size '5XB'"), bad.stderr


@pytest.mark.parametrize("text,unit", [("10", "10G"), ("3.", "3G"), ("2.5", "2.5G")])
def test_a_size_needs_a_unit(text, unit):
    """ccache reads `-M 10` as 10 GB, du as 10 KiB: kcache asks (issue 25), and 0 stays 0."""
    with pytest.raises(UsageError) as err:
        parse_size(text, "--max-size")
    assert str(err.value).startswith(f"--max-size {text.rstrip('.')}: {text.rstrip('.')} what? say {unit}")


@pytest.mark.parametrize("text,want", [("30", 30.0), ("2.5", 2.5), ("0", 0.0), ("90s", 90.0), ("5m", 300.0),
                                       ("1h", 3600.0), (" 7 ", 7.0)])
def test_seconds(text, want):
    assert parse_seconds(text, "--lock-timeout") == want


@pytest.mark.parametrize("text", ["", "nan", "inf", "-inf", "-1", "1e3", "\u0663", "\u0663s", "1" * 5000, "0x10",
                                  "1_0", "+5", "5 parsecs"])
def test_bad_seconds(text):
    with pytest.raises(UsageError, match="--lock-timeout"):
        parse_seconds(text, "--lock-timeout")


@pytest.mark.parametrize("args", [
    ("prune", "--max-size", "1" * 5000, "--dry-run"), ("prune", "--max-size", "\u0663G", "--dry-run"),
    ("prune", "--max-size", "10", "--dry-run"), ("prune", "--older-than", "nand", "--dry-run"),
    ("prune", "--lock-timeout", "nan", "--dry-run"), ("prune", "--lock-timeout", "-1"),
    ("clear", "--all", "--lock-timeout", "inf", "--yes"), ("build", "t.txt", "--lock-timeout", "nan"),
    ("build", "t.txt", "--timeout", "-3"), ("build", "t.txt", "--remote-timeout", "inf"),
    ("build", "t.txt", "--remote-timeout", "nan"), ("import", "a.tar", "--lock-timeout", "1e400"),
    ("import", "a.tar", "--max-file-size", "\u0661\u0660G"), ("ls", "--limit", "\u0663"), ("ls", "--limit", "1" * 5000),
    ("ls", "--limit", "9" * 30), ("build", "t.txt", "-j", "\u0663"), ("stats", "--top", "\u0663"),
    ("pull", "--remote", "redis://127.0.0.1:1/0", "--connect-timeout", "nan"),
    ("push", "--remote", "redis://127.0.0.1:1/0", "--connect-timeout", "inf"),
    ("pull", "--remote", "redis://127.0.0.1:1/0", "--lock-timeout", "nan"),
])
def test_bad_values_are_usage_errors(kcache, fixture_copy, tmp_path, args):
    """Every option value that can be wrong is exit 2 with one line, never "unexpected" (issue 21)."""
    root = fixture_copy("hidet")
    (tmp_path / "t.txt").write_text("name: add\n")
    (tmp_path / "a.tar").write_bytes(b"")
    r = kcache("--cache-dir", root, *args)
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1 and "unexpected" not in r.stderr, r.stderr


def test_a_wild_columns_is_ignored(kcache, fixture_copy):
    root = fixture_copy("hidet")
    for value in ("9" * 5000, "\u0663\u0660", "-1", "nan"):
        r = kcache("--cache-dir", root, "ls", env={"COLUMNS": value})
        assert r.exit_code == 0 and "8d1f7691cdf75e90" in r.stdout, (value, r.stderr)


def test_entries_made_without_init_equal_those_made_with_it():
    """records.entry_of / entry_with build an Entry as __init__ and dataclasses.replace do; anything but
    exactly the fields goes to __init__, which refuses it."""
    import dataclasses

    from kcache_cli.model.records import ENTRY_FIELDS, Entry, entry_of, entry_with

    attrs = {name: i for i, name in enumerate(ENTRY_FIELDS)}
    made = entry_of(dict(attrs))
    assert made == Entry(**attrs) and made.dev == attrs["dev"] and made.ino == attrs["ino"]
    assert entry_with(made, layout="x", hash="h") == dataclasses.replace(made, layout="x", hash="h")
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.layout = "y"  # type: ignore[misc]
    with pytest.raises(TypeError):
        entry_of({**attrs, "extra": 1})
    with pytest.raises(TypeError):
        entry_of({k: v for k, v in attrs.items() if k != "layout"})
    with pytest.raises(TypeError):
        entry_with(made, nonsense=1)
