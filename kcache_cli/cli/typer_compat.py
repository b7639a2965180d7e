"""Every place kcache reaches into Typer (and the Click it vendors) beyond its documented API, in one
module, with the range of Typer releases this was tested with (pyproject.toml's `typer` dependency).

A Typer release outside that range may move or change what is patched here: `warn_if_untested` says
so in one line on stderr at start (the CLI calls it once). Nothing here imports Rich; Typer's private
modules are imported only when a patch needs them."""

from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager
from typing import Any, Iterator

import typer

from kcache_cli.cli.options import terminal_width
from kcache_cli.util.errors import UsageError

# pyproject.toml: "typer>=0.27,<0.29" (tests/test_typer_compat.py keeps the two the same)
TESTED_FROM, TESTED_BELOW = (0, 27), (0, 29)
TESTED_RANGE = f">={TESTED_FROM[0]}.{TESTED_FROM[1]},<{TESTED_BELOW[0]}.{TESTED_BELOW[1]}"
# Typer's own switch that makes --show-completion take the shell's name instead of detecting it
SHOW_COMPLETION_FOR_NAMED_SHELL = "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION"
_COMPLETION_OPTIONS = ("--show-completion", "--install-completion")
TYPER_SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")  # the shells Typer has a completion script for


@contextmanager
def shell_named(args: list[str]) -> Iterator[None]:
    """While `args` run: Typer takes the shell `args` name after a completion option (names_a_shell)."""
    named = names_a_shell(args) and SHOW_COMPLETION_FOR_NAMED_SHELL not in os.environ
    if named:
        os.environ[SHOW_COMPLETION_FOR_NAMED_SHELL] = "1"
    try:
        yield
    finally:
        if named:  # main runs many times in one process (tests)
            os.environ.pop(SHOW_COMPLETION_FOR_NAMED_SHELL, None)


def names_a_shell(args: list[str]) -> bool:
    """Whether `args` name the shell of --show-completion or --install-completion (`--show-completion zsh`,
    `--install-completion=fish`): then Typer must take the name (which it checks) rather than detect the
    shell and ignore the word after it, printing bash's script to a zsh user."""
    for i, a in enumerate(args):
        if a.startswith(tuple(o + "=" for o in _COMPLETION_OPTIONS)):
            return True
        if a in _COMPLETION_OPTIONS:
            return i + 1 < len(args) and not args[i + 1].startswith("-")
    return False


# ---- the version check -------------------------------------------------------------------------------

def version_problem(version: str) -> str | None:
    """Why Typer `version` is not one kcache was tested with, or None."""
    m = re.match(r"(\d{1,6})\.(\d{1,6})", version)
    if m is None:
        return f"Typer reports an unreadable version {version!r} (kcache is tested with typer{TESTED_RANGE})"
    if TESTED_FROM <= (int(m.group(1)), int(m.group(2))) < TESTED_BELOW:
        return None
    return (f"Typer {version} is outside the releases kcache is tested with (typer{TESTED_RANGE}); "
            f"if a command misbehaves: pip install 'typer{TESTED_RANGE}'")


def warn_if_untested() -> None:
    """One warning line on stderr when the installed Typer is outside the tested range (not while a
    shell is completing a command line, nor under -q/--quiet)."""
    if any(k.startswith("_KCACHE_COMPLETE") for k in os.environ) or {"-q", "--quiet"} & set(sys.argv[1:]):
        return
    problem = version_problem(str(getattr(typer, "__version__", "")))
    if problem is not None:
        sys.stderr.write(f"warning: {problem}\n")


# ---- Click's modules, as Typer vendors them ----------------------------------------------------------

def click_exceptions() -> Any:
    """Click's exceptions module (Typer vendors Click: kcache never imports `click` itself)."""
    from typer._click import exceptions

    return exceptions


# ---- parameters: usage metavars, ASCII numbers ------------------------------------------------------

def plain_metavar(param: Any) -> None:
    """Usage shows `ENTRY` and `TASK...` as written, not Typer's `{ENTRY}` for a required argument."""
    metavar = param.metavar

    def make_metavar(ctx: Any, usage: bool = False) -> str:
        return metavar if param.required or metavar.startswith("[") or not usage else f"[{metavar}]"

    param.make_metavar = make_metavar


_ASCII_INT = re.compile(r"[ \t]*[+-]?[0-9]{1,18}[ \t]*", re.ASCII)
_ASCII_FLOAT = re.compile(r"[ \t]*[+-]?(?:[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})[ \t]*", re.ASCII)


def ascii_numbers(param: Any) -> None:
    """Click reads numbers with int() and float(), which take other scripts' digits ("٣"), "nan",
    "inf", "1e400" and 5,000-digit strings: every number option of kcache reads ASCII decimals only
    (a usage error otherwise). The check wraps the option type's own conversion (ranges still apply)."""
    from typer._click import types

    kind = param.type
    if getattr(kind, "_kcache_ascii", False) or not isinstance(kind, (types.IntParamType, types.FloatParamType)):
        return
    grammar = _ASCII_INT if isinstance(kind, types.IntParamType) else _ASCII_FLOAT
    convert = kind.convert

    def checked(value, param, ctx):
        if isinstance(value, str) and not grammar.fullmatch(value):
            shown = value if len(value) <= 24 else value[:21] + "..."
            kind.fail(f"{shown!r} is not a plain {'whole ' if grammar is _ASCII_INT else ''}number "
                      "(ASCII digits)", param, ctx)
        return convert(value, param, ctx)

    kind.convert = checked  # type: ignore[method-assign]  # this instance only (one per option with a range)
    kind._kcache_ascii = True  # type: ignore[union-attr]


# ---- the app: one command's copy, the zsh script ------------------------------------------------------

def app_holding(app: typer.Typer, commands: list, groups: list | None = None) -> typer.Typer:
    """A copy of `app` with only `commands` (and `groups`, if given) registered, its callback, options and
    settings the same: Typer inspects every registered command's signature at each start."""
    one = typer.Typer()
    for key, value in vars(app).items():
        setattr(one, key, value)
    one.registered_commands = commands
    if groups is not None:
        one.registered_groups = groups
    return one


_ZSH_REGISTER = "compdef %(complete_func)s %(prog_name)s"
_ZSH_AUTOLOAD_AWARE = """compdef %(complete_func)s %(prog_name)s
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
  # autoloaded from fpath as _%(prog_name)s on the first TAB of a shell: complete this TAB too
  %(complete_func)s "$@"
fi"""


def plain_completion_help() -> None:
    """Typer renders each completion's description as Rich markup in an 80-column console: a description
    longer than that (a cache's path) is wrapped onto a line of its own, which the shell reads as another
    candidate, and `[...]` in it is eaten. kcache's descriptions are plain text, already one printable line
    (complete.py): pass them through as they are."""
    from typer import _completion_classes

    if callable(getattr(_completion_classes, "_sanitize_help_text", None)):
        _completion_classes._sanitize_help_text = _as_it_is


def _as_it_is(text: str) -> str:
    return text


def fix_zsh_script() -> None:
    """Typer 0.28's zsh script only registers its function with compdef, so autoloaded from fpath (where
    `--install-completion zsh` puts it) the first TAB of every shell completes nothing. Make it complete
    at once when autoloaded (and register the function for the TABs after). Leaves a Typer whose script
    differs alone."""
    from typer import _completion_classes, _completion_shared

    script = _completion_shared.COMPLETION_SCRIPT_ZSH
    if "loadautofunc" in script or script.count(_ZSH_REGISTER) != 1:
        return
    fixed = script.replace(_ZSH_REGISTER, _ZSH_AUTOLOAD_AWARE)
    _completion_shared._completion_scripts["zsh"] = fixed
    _completion_classes.ZshComplete.source_template = fixed


def plain_installed_shell() -> None:
    """Typer's `--install-completion zsh` says "Shells.zsh completion installed" (the named shell is its
    enum, formatted by name under Python 3.11): say the shell's name, as the detected one is said. A shell
    Typer has no script for (sh, tcsh, or none detected) is a usage error that says to name one, where
    Typer printed "Shell sh is not supported." (--install-completion: on stdout) and exited 1."""
    from typer import completion

    install, script = completion.install, completion.get_completion_script
    if getattr(install, "_kcache_plain", False):
        return

    def named(*args: Any, **kwargs: Any) -> Any:
        shell = kwargs.pop("shell", args[0] if args else None)
        if shell is None and SHOW_COMPLETION_FOR_NAMED_SHELL not in os.environ:
            shell = completion._get_shell_name()
        shell, path = install(_with_script(shell, "--install-completion"), *args[1:], **kwargs)
        return getattr(shell, "value", shell), path

    def script_of(*, shell: Any, **kwargs: Any) -> str:
        return script(shell=_with_script(shell, "--show-completion"), **kwargs)

    named._kcache_plain = True  # type: ignore[attr-defined]
    completion.install, completion.get_completion_script = named, script_of


def _with_script(shell: Any, option: str) -> Any:
    """`shell` when Typer has a completion script for it, else the usage error that says to name one."""
    name = getattr(shell, "value", shell)
    if name in TYPER_SHELLS:
        return shell
    said = f"kcache has no completion for {name}" if name else "kcache could not tell which shell runs it"
    raise UsageError(f"{said}: name yours: kcache {option} bash (or zsh, fish)")


# ---- completion: a closed set of values never falls back to file names --------------------------------

NO_FILES_STATUS = 3  # bash: the exit status that says "no candidates, and no file names either"
_closed_set_asked = False  # set while one completion runs, by a callback whose values are a closed set
_BASH_RETURN = """                   %(autocomplete_var)s=complete_bash $1 ) )
    return 0"""
_BASH_NO_FILES = """                   %(autocomplete_var)s=complete_bash $1 ) )
    if [[ $? == """ + str(NO_FILES_STATUS) + """ ]]; then
        # a value of a closed set (a status, a sort key, an op of the cache) and none matches: no file names
        compopt +o default 2>/dev/null
    fi
    return 0"""


def closed_set_asked() -> None:
    """Called by a completion callback whose values are a closed set (statuses, sort keys, the ops of
    the cache): when none matches, the shell offers nothing rather than the file names it falls back to."""
    global _closed_set_asked
    _closed_set_asked = True


def closed_sets_offer_no_files() -> None:
    """Typer's scripts make every shell complete file names when kcache offers nothing (bash's `-o default`,
    zsh's `_files`, fish's is-args failing), so `--sort <TAB>` with no match, or `--op <TAB>` in an empty
    cache, listed the current directory. When the value being completed is one of a closed set
    (closed_set_asked), none matching offers nothing: bash is told by an exit status its script reads (an
    older script ignores it and behaves as before), zsh by `return 1`, fish by is-args holding. Leaves a
    Typer whose classes or bash script differ alone."""
    from typer import _completion_classes, _completion_shared

    script = _completion_shared.COMPLETION_SCRIPT_BASH
    if getattr(_completion_classes.BashComplete.complete, "_kcache_closed", False) or \
            script.count(_BASH_RETURN) != 1:
        return
    _completion_shared._completion_scripts["bash"] = script.replace(_BASH_RETURN, _BASH_NO_FILES)
    _completion_classes.BashComplete.source_template = _completion_shared._completion_scripts["bash"]
    for cls, nothing in ((_completion_classes.BashComplete, None), (_completion_classes.ZshComplete, "return 1"),
                         (_completion_classes.FishComplete, "")):
        cls.complete = _closed_aware(cls.complete, nothing)  # type: ignore[method-assign]


def _closed_aware(complete: Any, nothing: str | None) -> Any:
    """`complete` (a shell class's), answering `nothing` (None: exit NO_FILES_STATUS) when a closed set
    was asked and none of it matched."""

    def closed_aware(self: Any) -> str:
        global _closed_set_asked
        _closed_set_asked = False
        fish_asks = os.environ.get("_TYPER_COMPLETE_FISH_ACTION") == "is-args"
        try:
            out = complete(self)
        except SystemExit as exc:  # fish's is-args: 1 lets fish complete file names
            if fish_asks and exc.code == 1 and _closed_set_asked:
                raise SystemExit(0) from None
            raise
        if _closed_set_asked and out in ("", "_files"):
            if nothing is None:
                raise SystemExit(NO_FILES_STATUS)
            return nothing
        return out

    closed_aware._kcache_closed = True  # type: ignore[attr-defined]
    return closed_aware


# ---- help: wrapped to the terminal, down to 40 columns ------------------------------------------------

HELP_MIN_WIDTH = 38  # a 40-column terminal less the 2 columns Click leaves free
_OPTION_TEXT_MIN = 24  # the help text beside an option is kept at least this wide


def help_fits_narrow_terminals() -> None:
    """Plain help (a pipe, NO_COLOR; Rich's fits by itself) is Click's HelpFormatter's, which wraps to the
    terminal less 2 but never under 50 columns, and keeps the option column up to 30 wide with at least
    10 beside it: at COLUMNS=40 its lines ran to 50 (44 beside a long option). Wrap to the terminal down to
    40 columns (HELP_MIN_WIDTH), and under 60 narrow the option column so that its text keeps 24 columns
    (a longer option then stands on a line of its own, as Click does for one over the limit). A width
    given (docgen's) and the layout at 60 columns or more are Click's own."""
    from typer._click import core, formatting

    if getattr(core.Context.formatter_class, "_kcache_fits", False):
        return

    class FittingHelpFormatter(formatting.HelpFormatter):
        _kcache_fits = True

        def __init__(self, indent_increment: int = 2, width: int | None = None,
                     max_width: int | None = None) -> None:
            if width is None and formatting.FORCED_WIDTH is None:
                width = max(min(terminal_width(sys.stdout), max_width or 80) - 2, HELP_MIN_WIDTH)
            super().__init__(indent_increment, width, max_width)

        def write_dl(self, rows: Any, col_max: int = 30, col_spacing: int = 2) -> None:
            room = self.width - self.current_indent - col_spacing - _OPTION_TEXT_MIN
            super().write_dl(rows, max(8, min(col_max, room)), col_spacing)

        def write_usage(self, prog: str, args: str = "", prefix: str | None = None) -> None:
            # Click wants 20 columns for the arguments beside `Usage: kcache prune `, else moves them all
            # to lines of their own (after a trailing blank): at 40 columns `[OPTIONS]` went there though
            # the line fits whole. They stay beside it when each word fits there; below, a word too long
            # for Click's indent is indented less rather than cut (`[ENTRY|ARCHIVE|IM` `AGE|BLOB]...`).
            lead = f"{prefix or 'Usage: ':>{self.current_indent}}{prog} "
            width, longest = self.width - self.current_indent, max(map(formatting.term_len, args.split()), default=0)
            if longest and longest <= width - formatting.term_len(lead):
                indent = " " * formatting.term_len(lead)
                self.write(formatting.wrap_text(args, width, initial_indent=lead, subsequent_indent=indent) + "\n")
                return
            self.write(lead.rstrip() + "\n")
            if longest:
                indent = " " * max(2, min(max(self.current_indent, len(prefix or "Usage: ")) + 4, width - longest))
                self.write(formatting.wrap_text(args, width, initial_indent=indent, subsequent_indent=indent) + "\n")

    core.Context.formatter_class = FittingHelpFormatter


NARROW_HELP = 60  # below this many columns, Rich's help folds words rather than cut them


def rich_help_folds_words() -> None:
    """Rich's coloured help in a narrow terminal (40 columns) cut option names and words to fit its
    columns (`--cache-d…`, `Repeata…`: its tables and the Columns an option's help is set in end a cell
    with `…`). Below NARROW_HELP columns its tables fold a word onto the next line and an option's help
    parts stand one under the other, so nothing is lost; wider, Rich's layout is its own. Rich is imported
    only when help is printed: the change is made then (in format_help), never at start-up."""
    from typer import core

    for cls in (core.TyperCommand, core.TyperGroup):
        if not getattr(cls.format_help, "_kcache_folds", False):
            cls.format_help = _folding(cls.format_help)  # type: ignore[method-assign]


def _folding(format_help: Any) -> Any:
    def format_help_folding(self: Any, ctx: Any, formatter: Any) -> Any:
        if terminal_width(sys.stdout) < NARROW_HELP:
            _fold_rich_help()
        return format_help(self, ctx, formatter)

    format_help_folding._kcache_folds = True  # type: ignore[attr-defined]
    return format_help_folding


def _fold_rich_help() -> None:
    from rich.console import Group
    from typer import rich_utils

    if getattr(rich_utils.Table, "_kcache_folds", False):
        return
    base: Any = rich_utils.Table

    class FoldingTable(base):
        _kcache_folds = True

        def add_row(self, *renderables: Any, **kwargs: Any) -> None:
            super().add_row(*renderables, **kwargs)
            for column in self.columns:
                column.overflow = "fold"

    module: Any = rich_utils  # (its names are classes to mypy; here they are replaced)
    module.Table = FoldingTable
    module.Columns = lambda items: Group(*items)  # (a Columns cell cuts with `…` whatever its table)

