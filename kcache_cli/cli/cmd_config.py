"""`kcache config`: the budget `kcache prune` keeps (kcache_cli/ops/config.py owns the file)."""

from typing import TYPE_CHECKING, Annotated, Optional

import typer

from kcache_cli.cli import common as c
from kcache_cli.cli import options as o
from kcache_cli.util.errors import UsageError
from kcache_cli.util.lazy import lazy_module
from kcache_cli.util.units import describe_age, format_age

if TYPE_CHECKING:  # the real imports, for mypy; at run time each loads at its first use
    from kcache_cli.catalog import scan
    from kcache_cli.ops import budget, config
else:
    budget = lazy_module("kcache_cli.ops.budget")
    scan = lazy_module("kcache_cli.catalog.scan")
    config = lazy_module("kcache_cli.ops.config")

config_app = typer.Typer(name="config", invoke_without_command=True)

CacheOpt = Annotated[Optional[str], typer.Option(
    "--cache", metavar="NAME", help="The cache the setting is for: a layout's name (as `kcache dir --all` "
    "shows it). Default: all caches together ([all]).", autocompletion=c.complete.complete_config_cache)]
KeyArg = Annotated[str, typer.Argument(metavar="KEY", help="max-size or max-age.", show_default=False,
                                       autocompletion=c.complete.complete_config_key)]


def register(app: typer.Typer) -> None:
    config_app.command("set")(config_set)
    config_app.command("unset")(config_unset)
    config_app.command("path")(config_path)
    config_app.info.cls = app.info.cls  # global options after `config set` too (KcacheGroup)
    app.add_typer(config_app, name="config")


@config_app.callback()
def config_show(ctx: typer.Context, as_json: o.JsonOpt = False) -> None:
    """The budget `kcache prune` keeps: max-size and max-age.

    What prune keeps when given no criteria: max-size and max-age for every cache
    together ([all]) or for one ([cache.NAME]), in a TOML file (`kcache config path`; KCACHE_CONFIG
    overrides where it is). With no subcommand, shows it.

    With --cache-dir ROOT the budget is kept in that cache (ROOT/.kcache/budget/config.toml, as ccache keeps
    ccache.conf): it binds every user's bare `kcache prune` of the cache and wins over personal
    settings, which apply only to caches you own; shown with where each value comes from.

    Example: kcache config set max-size 10G --cache-dir /shared/hidet
    """
    if ctx.invoked_subcommand is not None:
        return

    opts = o.use(ctx, None, as_json)
    cfg = config.load()
    root = _cache_root(opts)
    if root is None:
        c.Output(opts).result(cfg, lambda: _show(opts, cfg))
        return
    doc = _with_cache(cfg, root)
    c.Output(opts).result(doc, lambda: _show_cache(root, doc))


def _cache_root(opts: o.GlobalOptions, cache: str | None = None):
    """The cache whose own budget is meant: --cache-dir given (None without it)."""
    if opts.cache_dir is None:
        return None
    if cache is not None:
        raise UsageError("--cache names a section of your own config; with --cache-dir the budget is kept in "
                         "that cache (drop one of them)")
    return c.cache_location(opts, existing=True).path


def _with_cache(cfg, root) -> dict:
    """The config's JSON with the cache's own budget and the one in effect there (and whence)."""
    b = budget.effective([(root, scan.detect_layouts(root))], cfg, lambda m: None)[str(root)]
    return {**cfg.to_json(), "cache": config.load_cache(root).to_json(),
            "effective": {"max_size": b.max_size, "max_age": b.max_age,
                          "max_size_from": b.size_from if b.max_size is not None else "",
                          "max_age_from": b.age_from if b.max_age is not None else ""}}


def _show_cache(root, doc: dict) -> None:
    """What a bare prune of the cache keeps it to, each value with the file (and part) it comes from."""
    eff = doc["effective"]
    lines = [f"# what a bare `kcache prune` of {c.printable_line(str(root))} keeps it to"]
    for key, value, where in (("max-size", eff["max_size"], eff["max_size_from"]),
                              ("max-age", eff["max_age"], eff["max_age_from"])):
        shown = "unset" if value is None else c.human_size(value) if key == "max-size" else format_age(value)
        lines.append(f"{key} = {shown}" + (f"  # {c.printable_line(where)}" if where else ""))
    c.print_lines(lines)


def _show(opts: o.GlobalOptions, cfg) -> None:
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
                                         "max-size; an age (30d, 12h, 2w, 6mo) for max-age.", show_default=False)],
    cache: CacheOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """Set max-size or max-age, for all caches or (--cache NAME) one.

    Example: kcache config set --cache triton max-age 30d
    """
    opts = o.use(ctx, None, as_json)
    root = _cache_root(opts, cache)
    if root is not None:
        kept = config.set_cache_value(root, key, value)
        human = _meaning(key, kept.budget())
        c.info(opts, f"{key} = {kept.values[key]}{human} kept in {kept.path}: binds every user's bare prune of "
                     "this cache")
        c.Output(opts).result(_with_cache(config.load(), root))
        return
    cfg = config.set_value(cache or config.ALL, key, value)
    section = config.check_section(cache)
    shown = cfg.sections[section][key]
    human = _meaning(key, cfg.budget(section))
    c.info(opts, f"{key} = {shown}{human} for {_which(section)}, in {cfg.path}")
    c.Output(opts).result(cfg)


def _meaning(key: str, budget: config.Budget) -> str:
    """What a value set was read as, echoed beside it: ' (50.0 GB)', ' (180 days)'."""
    if key == "max-size":
        return f" ({c.human_size(budget.max_size or 0)})"
    return f" ({describe_age(budget.max_age)})" if budget.max_age is not None else ""


def config_unset(
    ctx: typer.Context,
    key: KeyArg,
    cache: CacheOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """Remove max-size or max-age, for all caches or (--cache NAME) one.

    Example: kcache config unset max-size
    """
    opts = o.use(ctx, None, as_json)
    root = _cache_root(opts, cache)
    if root is not None:
        kept, was_set = config.unset_cache_value(root, key)
        c.info(opts, f"{key} unset in {kept.path}" if was_set else f"{key} was not set in {kept.path}: nothing changed")
        c.Output(opts).result(_with_cache(config.load(), root))
        return
    section = config.check_section(cache)
    cfg, was_set = config.unset_value(section, key)
    c.info(opts, f"{key} unset for {_which(section)}" if was_set
           else f"{key} was not set for {_which(section)}: nothing changed")
    c.Output(opts).result(cfg)


def config_path(ctx: typer.Context, as_json: o.JsonOpt = False) -> None:
    """Print where the config file is (whether or not it exists yet).

    Example: $EDITOR "$(kcache config path)"
    """
    opts = o.use(ctx, None, as_json)
    path = config.config_path()
    c.Output(opts).result({"path": str(path), "exists": path.exists()},
                          lambda: c.print_lines([c.tty_safe(str(path))]))


def _which(section: str) -> str:
    return "every cache together" if section == "all" else f"the {section} cache"
