"""Shell completion: the values `--op`, `--space`, `--layout`, `--status`, `--target`, `--kind` and HASH
arguments complete to, read from the cache the command line points at (`--cache-dir` before or after the
subcommand, else KCACHE_DIR, else `--cache NAME`'s, else every layout's default place that exists); and the
fixed values of `--cache`, `--sort`, `--format`, build's `--target`/`--space`, config's KEY and `--cache`,
each from where the command checks them.

Every option with a closed set of values (all of the above but HASH, which may be any path) says so
(typer_compat.closed_set_asked): when none of its values matches, the shell offers nothing, never file names.

The callbacks run on every TAB in a fresh process, so they read directory names only (kcache_cli.catalog.names)
and import nothing heavy. The shells' scripts are Typer's own (`kcache --show-completion SHELL`); the
copies shipped in completions/ are regenerated with `python -m kcache_cli.cli.complete`.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

import typer

from kcache_cli.cli import typer_compat
from kcache_cli.layouts.shapes import SHAPES
from kcache_cli.model.terms import EXPORT_FORMATS, LAYOUT_NAMES, SORT_KEYS
from kcache_cli.util.lazy import lazy_module
from kcache_cli.util.textsafe import has_unsafe, printable_line

if TYPE_CHECKING:  # the real imports, for mypy; at run time each loads at its first use
    from kcache_cli.catalog import names
    from kcache_cli.layouts import homes
    from kcache_cli.ops import build, config
else:
    names = lazy_module("kcache_cli.catalog.names")
    homes = lazy_module("kcache_cli.layouts.homes")
    build = lazy_module("kcache_cli.ops.build")
    config = lazy_module("kcache_cli.ops.config")

SHELLS = ("bash", "zsh", "fish")
COMPLETIONS_DIR = Path(__file__).resolve().parents[2] / "completions"

TARGETS = (("cuda", "NVIDIA GPU"), ("cpu", "host CPU"), ("hip", "AMD GPU"))
STATUSES = (("complete", "usable"), ("partial", "interrupted or unfinished"), ("failed", "the compiler failed"),
            ("corrupt", "damaged: the compiler will not load it"), ("building", "a build holds its lock"),
            ("stale", "built by another compiler version"), ("unreadable", "permission denied"),
            ("moved", "paths point into another root: verify --fix"),
            ("broken", "partial, failed or corrupt: what prune --broken removes"))
SORT_HELP = {"op": "by layout, op and space (the default)", "size": "biggest first",
             "age": "least recently used first"}
FORMAT_HELP = {"tar": "kcache's archive (the default)", "torch-mega": "a blob torch's load_cache_artifacts() loads"}
KEY_HELP = {"max-size": "a size: 20G, 500M, 2GiB", "max-age": "an age: 30d, 12h, 2w, 6mo"}


def _layouts() -> list[tuple[str, str]]:
    return [(s.name, s.summary) for s in SHAPES]


def _kinds() -> list[tuple[str, str]]:
    owners: dict[str, list[str]] = {}  # a kind several layouts have (kernel, binary) is offered once
    for s in SHAPES:
        for k in s.kinds:
            owners.setdefault(k.kind, []).append(s.name)
    return [(kind, f"{'/'.join(names)} {kind}") for kind, names in owners.items()]


# ---- what the command line says -------------------------------------------------------------------
def _given(ctx: typer.Context, name: str) -> list:
    """The values of parameter `name` parsed so far, on this command first, then on its parents."""
    out: list = []
    c: typer.Context | None = ctx
    while c is not None:
        value = (c.params or {}).get(name)
        if value is not None:
            out.extend([value] if isinstance(value, str) else value)
        c = c.parent  # type: ignore[assignment]  # click's Context, the same object
    return [v for v in out if isinstance(v, str)]


def _param_values(ctx: typer.Context, name: str) -> list[str]:
    """The values given so far for a list option, commas split (`--status complete,partial`)."""
    return [p.strip() for v in _given(ctx, name) for p in v.split(",") if p.strip()]


def completion_root(ctx: typer.Context) -> Path | None:
    """The cache root the command being completed would use, or None if it cannot be resolved."""
    own = (ctx.params or {}).get("cache_dir")  # the command's own --cache-dir
    after = getattr(ctx.find_root().obj, "cache_dir", None)  # a hidden global copy after the command
    before = _given(ctx.find_root(), "cache_dir")  # type: ignore[arg-type]  # the global option before the command
    explicit = own or after or (before[0] if before else None)
    try:
        from kcache_cli.catalog.locate import resolve_cache_dir

        return resolve_cache_dir(explicit).path
    except Exception:  # noqa: BLE001 - a TAB must never print a traceback into the command line
        return None


def completion_roots(ctx: typer.Context) -> list[Path]:
    """The roots the command being completed would read: --cache-dir or KCACHE_DIR; `--cache NAME`'s;
    else every layout's default place that exists (the default scope; light: no layout is imported)."""
    own = (ctx.params or {}).get("cache_dir") or getattr(ctx.find_root().obj, "cache_dir", None) \
        or _given(ctx.find_root(), "cache_dir") or os.environ.get("KCACHE_DIR")  # type: ignore[arg-type]
    if own:
        root = completion_root(ctx)
        return [root] if root is not None else []
    named = _given(ctx, "cache")
    out: list[Path] = []
    for name, _ in _layouts():
        for home in homes.default_roots(name) if not named or name == named[0] else ():
            if home.path.is_dir() and home.path not in out:
                out.append(home.path)
    return out


def _split_list(incomplete: str) -> tuple[str, str]:
    """`--status complete,par` completes the last comma-separated part: ("complete,", "par")."""
    head, sep, tail = incomplete.rpartition(",")
    return (head + sep, tail) if sep else ("", incomplete)


def _matching(choices: Iterable[tuple[str, str]], incomplete: str, taken: Iterable[str] = ()) -> list[tuple[str, str]]:
    head, tail = _split_list(incomplete)
    skip = set(taken) | {p for p in head.split(",") if p}
    # A name holding a terminal control or a newline is never offered: inserted into the command line
    # it would act on the terminal (or break the completion protocol); descriptions are escaped.
    return [(head + value, printable_line(help)) for value, help in choices
            if value.startswith(tail) and value not in skip and not has_unsafe(value)]


def _closed(callback: Callable[[typer.Context, str], list[tuple[str, str]]]) \
        -> Callable[[typer.Context, str], list[tuple[str, str]]]:
    """A callback of an option whose values are a closed set: none matching, the shell offers nothing (not
    the file names it falls back to)."""

    @functools.wraps(callback)
    def closed(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
        typer_compat.closed_set_asked()
        return callback(ctx, incomplete)

    return closed


# ---- dynamic: read from the cache -----------------------------------------------------------------
@_closed
def complete_op(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """Op names present in the cache (within the --space/--layout already given)."""
    places: dict[str, tuple[str, ...]] = {}
    for root in completion_roots(ctx):
        for op, where in names.op_places(root, spaces=_param_values(ctx, "space"),
                                         layouts=_param_values(ctx, "layout"), offer=True).items():
            places[op] = tuple(dict.fromkeys((*places.get(op, ()), *where)))
    return _matching(((op, ", ".join(where)) for op, where in sorted(places.items())), incomplete,
                     _param_values(ctx, "op"))


@_closed
def complete_space(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """Spaces present in the cache (holding the --op already given, if any)."""
    found: dict[str, str] = {}
    for root in completion_roots(ctx):
        for space, layout in names.space_layouts(root, ops=_param_values(ctx, "op"),
                                                 layouts=_param_values(ctx, "layout"), read=True).items():
            found.setdefault(space, layout)
    return _matching(sorted(found.items()), incomplete, _param_values(ctx, "space"))


def complete_hash(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """Hash prefixes of the entries present (within the --op/--space/--layout already given), with the
    op (or kind) and space as description."""
    if "/" in incomplete:
        return []
    taken = set(_param_values(ctx, "hashes"))
    described: dict[str, str] = {}
    for e in (e for root in completion_roots(ctx) for e in names.entries(
            root, incomplete, ops=_param_values(ctx, "op"), spaces=_param_values(ctx, "space"),
            layouts=_param_values(ctx, "layout"))):
        if e.hash in taken:
            continue
        what = e.op or f"{e.layout} {e.kind}"
        text = f"{what} ({e.space})" if e.space else what
        seen = described.get(e.hash)  # the same task hash in two spaces is one value
        described[e.hash] = text if seen is None else ", ".join(sorted({*seen.split(", "), text}))

    return sorted((h, printable_line(text)) for h, text in described.items() if not has_unsafe(h))


# ---- static choices -------------------------------------------------------------------------------
@_closed
def complete_layout(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    return _matching(_layouts(), incomplete, _param_values(ctx, "layout"))


@_closed
def complete_cache(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """`--cache NAME`: the caches it takes (homes.named_caches, as `kcache dir --all` names them), with
    their place."""
    return _matching(((name, str(home.path)) for name, home in homes.named_caches(LAYOUT_NAMES).items()),
                     incomplete)


@_closed
def complete_status(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    return _matching(STATUSES, incomplete, _param_values(ctx, "status"))


@_closed
def complete_target(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    return _matching(TARGETS, incomplete, _param_values(ctx, "target"))


@_closed
def complete_kind(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    return _matching(_kinds(), incomplete, _param_values(ctx, "kind"))


@_closed
def complete_sort(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """`ls --sort`: the keys ls takes (terms.SORT_KEYS)."""
    return _matching(((k, SORT_HELP.get(k, "")) for k in SORT_KEYS), incomplete)


@_closed
def complete_format(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """`export --format`: terms.EXPORT_FORMATS."""
    return _matching(((f, FORMAT_HELP.get(f, "")) for f in EXPORT_FORMATS), incomplete)


@_closed
def complete_build_target(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """`build --target`: the targets build compiles for (build.TARGETS)."""
    said = dict(TARGETS)
    return _matching(((t, said.get(t, "")) for t in build.TARGETS), incomplete)


@_closed
def complete_build_space(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """`build --space`: a level (0, 1, 2), or a space's name of the --target given (of every target else)."""
    targets = [t for t in build.TARGETS if t in (_given(ctx, "target") or build.TARGETS)]
    levels = [(str(n), f"search-space level {n}") for n in build.SPACE_LEVELS]
    spaces = [(f"{t}_space_{n}", f"{t}, level {n}") for t in targets for n in build.SPACE_LEVELS]
    return _matching(levels + spaces, incomplete)


@_closed
def complete_config_key(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """config set/unset KEY: config.KEYS."""
    return _matching(((k, KEY_HELP.get(k, "")) for k in config.KEYS), incomplete)


@_closed
def complete_config_cache(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """config's `--cache NAME`: the sections config takes (a layout's name, or all)."""
    return _matching(((n, "every cache together" if n == config.ALL else f"the {n} cache")
                      for n in config.section_names()), incomplete)


# ---- the shells' scripts --------------------------------------------------------------------------
typer_compat.fix_zsh_script()  # the zsh script completes on the first TAB
typer_compat.plain_completion_help()  # a long description stays on its candidate's line
typer_compat.plain_installed_shell()  # "zsh completion installed", not "Shells.zsh ..."
typer_compat.closed_sets_offer_no_files()  # no file names for a --sort, --status, --op... that nothing matches


def completion_script(shell: str) -> str:
    """The completion script for `shell`, from the app itself: what `kcache --show-completion` prints in
    that shell and `kcache --install-completion` writes."""
    env = dict(os.environ)
    env[typer_compat.SHOW_COMPLETION_FOR_NAMED_SHELL] = "1"  # the shell named, not detected
    env.pop("_KCACHE_COMPLETE", None)
    proc = subprocess.run([sys.executable, "-m", "kcache_cli", "--show-completion", shell], env=env,
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"kcache printed no {shell} completion script: {proc.stderr.strip()}")
    return proc.stdout


def script_path(shell: str) -> Path:
    return COMPLETIONS_DIR / f"kcache.{shell}"


def regenerate(check: bool = False) -> list[Path]:
    """Write completions/kcache.{bash,zsh,fish}; with `check`, write nothing and return the stale ones."""
    stale = []
    for shell in SHELLS:
        path, text = script_path(shell), completion_script(shell)
        try:
            current = path.read_text(encoding="utf-8")
        except OSError:
            current = None
        if current != text:
            stale.append(path)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)  # not under a root: the repo's completions/
                path.write_text(text, encoding="utf-8")  # not under a root: the repo's completions/
    return stale


def _main(argv: list[str]) -> int:
    check = "--check" in argv
    if set(argv) - {"--check"}:
        sys.stderr.write("usage: python -m kcache_cli.cli.complete [--check]\n")
        return 2
    stale = regenerate(check=check)
    for path in stale:
        rel = os.path.relpath(path)
        sys.stdout.write(f"{'out of date' if check else 'wrote'}: {rel}\n")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
