"""What vulture cannot see being used in kcache_cli (tests/test_code_rules.py runs it with this file).

Each name is used where no static reader looks: called by Typer, by pickle, by Python's import
machinery, or by a test or plugin through the library's public API. vulture matches by name, so one
line covers the name wherever it is defined. A name goes here only with the reason it is alive."""

from vulture.whitelist_utils import Whitelist

_ = Whitelist()

_used = (
    # called by Typer: the app's and the remote group's callbacks (their options are the signatures)
    _.main_options,
    _.remote_group,
    # read by Typer: the parameters of a command wrapped by common.selection (inspect.signature)
    _.__signature__,
    _.__annotations__,
    # read by Typer's zsh completion class (typer_compat patches its script)
    _.source_template,
    # read by Rich when it renders a help table's cells, and Typer's rich_utils name it sets the help in
    # (typer_compat._fold_rich_help: a narrow terminal's help folds words rather than cut them)
    _.overflow,
    _.Columns,
    # called by Click when it prints a command's usage line (typer_compat's help formatter)
    _.write_usage,
    # called by pickle.Unpickler for every global of a pickle (index._NoGlobals refuses them all)
    _.find_class,
    # PEP 562: the module attribute `kcache_cli.layouts.LAYOUTS`, computed on first use
    _.__getattr__,
    # read by Python's import machinery and its type checks: a lazy module's loader, and the class that
    # makes its first attribute read run it (util/lazy.py, as importlib.util.LazyLoader sets them)
    _.__loader__,
    _.__class__,
    # the shape registry a fifth layout adds itself to (tests/fifth_layout)
    _.BY_NAME,
    # dataclass and NamedTuple fields, read by asdict() / JSON output and by callers of the parsers
    _.arch_source,
    _.attributes,
    # public API the tests drive directly: kcache's per-entry lock (held as a concurrent writer would),
    # one entry published, one manifest record parsed, the root's trash and last-use directories
    _.entry_lock,
    _.publish_entry,
    _.from_json,
    _.trash_dir,
    _.used_dir,
    # the layout Protocols by concern, which tests/test_layouts.py checks every layout against
    _.CONCERNS,
    # `kcache config` with no subcommand: Typer calls the group's callback
    _.config_show,
    # a mountinfo field, kept with the others it is parsed with
    _.fstype,
    # Click reads a command's short_help for the commands panel (kcache_cli/cli/app.py tidy_help)
    _.short_help,
    # the keys Entry.to_json writes, in kcache_cli/schemas/ls.json's order: the tests hold to_json to it
    _.JSON_KEYS,
)
