"""The `kcache` command: global options, command registration, and the one place where errors
become `Error: ...` and an exit status."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from kcache_cli import __version__
from kcache_cli.cli.common import GlobalOptions, settings

app = typer.Typer(
    name="kcache",
    help="See into, build, clean and ship the on-disk caches of compiled GPU and CPU kernels "
    "(hidet, tilus, tilelang).\n\nExample: kcache ls --op matmul",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"kcache {__version__}\n")
        raise typer.Exit()


@app.callback()
def main_options(
    ctx: typer.Context,
    cache_dir: Annotated[Optional[str], typer.Option(
        "--cache-dir", metavar="PATH", help="Cache root. Default: KCACHE_DIR, else hidet's own rule "
        "(hidet.toml cache_dir, <git root>/.hidet_cache, ~/.cache/hidet).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="No warnings or progress on stderr.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    ctx.obj = GlobalOptions(cache_dir=cache_dir, json=json_out, quiet=quiet, debug=debug)


def _register() -> None:
    from kcache_cli.cli import cmd_read

    for module in (cmd_read,):
        module.register(app)
    for name in ("cmd_build", "cmd_delete", "cmd_archive"):
        try:
            module = __import__(f"kcache_cli.cli.{name}", fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != f"kcache_cli.cli.{name}":
                raise
            continue
        module.register(app)


_register()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, turn errors into one line and an exit status."""
    from kcache_cli.errors import KcacheError

    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        rc = app(args=args, prog_name="kcache", standalone_mode=False)
    except KcacheError as exc:
        if debug:
            raise
        sys.stderr.write(f"Error: {exc}\n")
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.stderr.write("Error: aborted\n")
        sys.exit(1)
    except KeyboardInterrupt:
        sys.stderr.write("Error: interrupted\n")
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, no traceback
        if debug:
            raise
        from kcache_cli.cli.errors import describe_exception

        message, code = describe_exception(exc)
        sys.stderr.write(f"Error: {message}\n")
        sys.exit(code)
    sys.exit(rc if isinstance(rc, int) else 0)
