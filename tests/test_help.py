"""Help that reads well (issue 36): a one-line summary per command in the commands panel, paragraphs
that reflow instead of keeping a docstring's line breaks, brackets shown rather than eaten by Rich's
markup, and a bare `kcache` that prints its help and exits 0. Both renderings: plain (into a pipe) and
Rich (a terminal), each at 80 columns."""

from __future__ import annotations

import re

import pytest

from kcache_cli.cli import app as app_module

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
COMMANDS = ("dir", "ls", "inspect", "log", "stats", "build", "prune", "clear", "export", "import", "verify",
            "push", "pull", "diff", "explain", "remote", "config")


@pytest.fixture(params=["plain", "rich"])
def render(request, monkeypatch, kcache):
    monkeypatch.setattr(app_module, "plain_output", lambda: request.param == "plain")

    def run(*args: str) -> str:
        result = kcache(*args, env={"COLUMNS": "80", "NO_COLOR": None, "TERMINAL_WIDTH": None})
        assert result.exit_code == 0, result
        return ANSI.sub("", result.stdout)
    run.mode = request.param
    return run


def _panel_rows(text: str, names: tuple[str, ...]) -> dict[str, list[str]]:
    """For each command name, the panel line naming it and the lines after it up to the next name."""
    lines = text[text.index("Commands"):].splitlines()[1:]
    rows: dict[str, list[str]] = {}
    current = None
    for line in lines:
        cell = line.strip("│ ").split(" ", 1)[0]
        if cell in names:
            current = cell
            rows[current] = [line]
        elif current is not None and line.strip("│ ╰─╯"):
            rows[current].append(line)
    return rows


def test_commands_panel_has_one_line_per_command(render):
    text = render("--help")
    rows = _panel_rows(text, COMMANDS)
    assert set(rows) == set(COMMANDS), text
    wrapped = {name: r for name, r in rows.items() if len(r) != 1}
    assert not wrapped, wrapped
    for (line,) in rows.values():
        assert "..." not in line, line  # a whole summary, not one cut short
    assert max(len(line) for line in text.splitlines()) <= 80


def test_subcommand_panels_are_one_line_each(render):
    for group, names in (("remote", ("ls", "stats", "prune", "keygen")), ("config", ("set", "unset", "path"))):
        rows = _panel_rows(render(group, "--help"), names)
        assert set(rows) == set(names) and all(len(r) == 1 for r in rows.values()), (group, rows)


def test_brackets_are_shown_not_taken_for_markup(render):
    text = render("config", "--help")
    assert "([all])" in text and "([cache.NAME])" in text, text
    assert "[all]" in render("config", "set", "--help")
    assert "redis://[user:password@]host" in re.sub(r"\s*│\s*", "", render("push", "--help"))


def test_paragraphs_reflow_instead_of_keeping_docstring_breaks(render):
    """stats' docstring breaks its first paragraph after `op`: the rendering fills every line instead."""
    text = render("stats", "--help")
    body = [line.strip("│ ") for line in text.splitlines()]
    para = next(i for i, line in enumerate(body) if line.startswith("Totals per layout"))
    first = body[para]
    assert len(first) > 70, first  # filled to the width, not cut where the docstring's line ended
    assert not first.endswith(" op"), first


def test_bare_kcache_prints_help_and_exits_0(kcache):
    for args in ((), ("remote",)):
        run = kcache(*args)
        assert run.exit_code == 0, run
        assert "Usage: kcache" in run.stdout and run.stderr == ""


def test_a_later_paragraph_reflows_too(render):
    """ls' second paragraph breaks after `with a` in the docstring; Rich used to keep that break."""
    body = [line.strip("│ ") for line in render("ls", "--help").splitlines()]
    start = next(i for i, line in enumerate(body) if line.startswith("Without --cache-dir or KCACHE_DIR"))
    end = next(i for i in range(start, len(body)) if not body[i].strip())
    para = body[start:end]
    assert "with a `cache` column" in " ".join(para), para
    short = [line for line in para[:-1] if len(line.rstrip()) < 60]  # every line but the last is filled
    assert not short, para


@pytest.mark.parametrize("cmd", ["ls", "verify", "export", "push"])
def test_entries_named_on_a_selecting_command_select_and_are_not_kept(kcache, cmd):
    """Entries named on ls, verify, export or push narrow what they act on, as --op does ("Only this op");
    "Entries to keep" read, on a tool that removes entries, as the ones spared."""
    r = kcache(cmd, "--help", env={"COLUMNS": "200"})
    assert r.exit_code == 0
    line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("[ENTRY]..."))
    assert "Only these entries:" in line and "to keep" not in line, line
