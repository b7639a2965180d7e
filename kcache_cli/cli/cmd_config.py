"""`kcache config`: the budget `kcache prune` keeps (kcache_cli/config.py owns the file)."""

from typing import Annotated, Optional

import typer

from kcache_cli.cli import common as c

config_app = typer.Typer(name="config", invoke_without_command=True)

CacheOpt = Annotated[Optional[str], typer.Option(
    "--cache", metavar="NAME", help="The cache the setting is for: a layout's name (as `kcache dir --all` "
    "shows it). Default: all caches together ([all]).")]
KeyArg = Annotated[str, typer.Argument(metavar="KEY", help="max-size or max-age.", show_default=False)]


def register(app: typer.Typer) -> None:
    config_app.command("set")(config_set)
    config_app.command("unset")(config_unset)
    config_app.command("path")(config_path)
    config_app.info.cls = app.info.cls  # global options after `config set` too (KcacheGroup)
    app.add_typer(config_app, name="config")


@config_app.callback()
def config_show(ctx: typer.Context, as_json: c.JsonOpt = False) -> None:
    """The budget `kcache prune` keeps: max-size and max-age.

    What prune keeps when given no criteria: max-size and max-age for every cache
    together ([all]) or for one ([cache.NAME]), in a TOML file (`kcache config path`; KCACHE_CONFIG
    overrides where it is). With no subcommand, shows it.

    Example: kcache config set max-size 20G
    """
    if ctx.invoked_subcommand is not None:
        return
    from kcache_cli import config

    opts = c.use(ctx, None, as_json)
    cfg = config.load()
    c.Output(opts).result(cfg, lambda: _show(opts, cfg))


def _show(opts: c.GlobalOptions, cfg) -> None:
    text = cfg.to_toml()
    if not text:
        c.info(opts, f"no budget set ({c.printable_line(str(cfg.path))} "
                     f"{'holds none' if cfg.exists else 'does not exist'}): kcache config set max-size 20G")
        return
    c.print_lines([f"# {c.printable_line(str(cfg.path))}", *text.rstrip("\n").split("\n")])


def config_set(
    ctx: typer.Context,
    key: KeyArg,
    value: Annotated[str, typer.Argument(metavar="VALUE", help="A size with a unit (20G, 500M, 2GiB) for "
                                         "max-size; an age (30d, 12h, 2w) for max-age.", show_default=False)],
    cache: CacheOpt = None,
    as_json: c.JsonOpt = False,
) -> None:
    """Set max-size or max-age, for all caches or (--cache NAME) one.

    Example: kcache config set --cache triton max-age 30d
    """
    from kcache_cli import config

    opts = c.use(ctx, None, as_json)
    cfg = config.set_value(cache or config.ALL, key, value)
    section = config.check_section(cache)
    shown = cfg.sections[section][key]
    human = f" ({c.human_size(cfg.budget(section).max_size or 0)})" if key == "max-size" else ""
    c.info(opts, f"{key} = {shown}{human} for {_which(section)}, in {cfg.path}")
    c.Output(opts).result(cfg)


def config_unset(
    ctx: typer.Context,
    key: KeyArg,
    cache: CacheOpt = None,
    as_json: c.JsonOpt = False,
) -> None:
    """Remove max-size or max-age, for all caches or (--cache NAME) one.

    Example: kcache config unset max-size
    """
    from kcache_cli import config

    opts = c.use(ctx, None, as_json)
    section = config.check_section(cache)
    cfg, was_set = config.unset_value(section, key)
    c.info(opts, f"{key} unset for {_which(section)}" if was_set
           else f"{key} was not set for {_which(section)}: nothing changed")
    c.Output(opts).result(cfg)


def config_path(ctx: typer.Context, as_json: c.JsonOpt = False) -> None:
    """Print where the config file is (whether or not it exists yet).

    Example: $EDITOR "$(kcache config path)"
    """
    from kcache_cli import config

    opts = c.use(ctx, None, as_json)
    path = config.config_path()
    c.Output(opts).result({"path": str(path), "exists": path.exists()},
                          lambda: c.print_lines([c.tty_safe(str(path))]))


def _which(section: str) -> str:
    return "every cache together" if section == "all" else f"the {section} cache"
