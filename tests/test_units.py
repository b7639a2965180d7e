"""One size grammar and one age grammar for every option that takes one (kcache_cli.units)."""

from __future__ import annotations

import pytest

from kcache_cli.errors import UsageError
from kcache_cli.units import format_age, parse_age, parse_size


@pytest.mark.parametrize("text,want", [
    ("4096", 4096), ("10GB", 10 * 10**9), ("500M", 500 * 10**6), ("1.5GiB", int(1.5 * 2**30)), (".5G", 5 * 10**8),
    ("2 KiB", 2048), ("7b", 7), ("3.", 3), (" 1k ", 1000),
])
def test_sizes(text, want):
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["", "G", "1.2.3G", "-1G", "10 parsecs", "1e9", "5XB"])
def test_bad_sizes_name_the_option(text):
    with pytest.raises(UsageError, match="--max-size"):
        parse_size(text, "--max-size")


@pytest.mark.parametrize("text,want", [("30d", 30 * 86400), ("12h", 12 * 3600), ("90m", 5400), ("1w", 7 * 86400),
                                       ("1d12h", 36 * 3600), (".5d", 43200), ("45s", 45)])
def test_ages(text, want):
    assert parse_age(text) == want


@pytest.mark.parametrize("text", ["", "30", "d", "3 parsecs", "1d-2h"])
def test_bad_ages(text):
    with pytest.raises(UsageError, match="bad age"):
        parse_age(text)


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
