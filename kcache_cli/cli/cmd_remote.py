"""Sharing a cache across machines: push, pull, and remote ls | stats | prune (docs/remote.md).

The redis client is imported by the core only when a redis:// remote is opened, never at start-up."""

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Iterator, NamedTuple, Optional

import typer

from kcache_cli.cli import cmd_oci
from kcache_cli.cli import common as c
from kcache_cli.cli import options as o
from kcache_cli.cli.progress import Bar
from kcache_cli.cli.table import Column, render
from kcache_cli.layouts import get as layout_of
from kcache_cli.util.errors import UsageError
from kcache_cli.util.lazy import lazy_module
from kcache_cli.util.signing import make_key

if TYPE_CHECKING:  # the real imports, for mypy; at run time each loads at its first use
    from kcache_cli.archive import importer
    from kcache_cli.catalog import locate
    from kcache_cli.formats import gpu as _gpu
    from kcache_cli.ops import delete
    from kcache_cli.remote import manage, oci, oci_ops
    from kcache_cli.remote import pull as _pull
    from kcache_cli.remote import push as _push
    from kcache_cli.remote import store as _store
else:
    _gpu = lazy_module("kcache_cli.formats.gpu")
    importer = lazy_module("kcache_cli.archive.importer")
    locate = lazy_module("kcache_cli.catalog.locate")
    _pull = lazy_module("kcache_cli.remote.pull")
    _push = lazy_module("kcache_cli.remote.push")
    _store = lazy_module("kcache_cli.remote.store")
    delete = lazy_module("kcache_cli.ops.delete")
    manage = lazy_module("kcache_cli.remote.manage")
    oci = lazy_module("kcache_cli.remote.oci")
    oci_ops = lazy_module("kcache_cli.remote.oci_ops")

RemoteOpt = Annotated[Optional[str], typer.Option(
    "--remote", metavar="URL", envvar="KCACHE_REMOTE", show_envvar=False,
    help="The shared cache: redis://[user:password@]host:port/db, rediss://... (TLS), file:///shared/dir, or an "
    "OCI registry image oci://host[:port]/repo:tag (pull: or repo@sha256:DIGEST, pinned; oci+http:// for plain "
    "HTTP). Default: KCACHE_REMOTE.")]
UserOpt = Annotated[Optional[str], typer.Option(
    "--remote-user", metavar="USER", envvar="KCACHE_REMOTE_USER", show_envvar=False,
    help="oci:// only: the registry user; the password comes from KCACHE_REMOTE_PASSWORD (default: the "
    "docker/podman auth file).")]


def _seconds(option: str, minimum: float = 0.1):
    """A Typer callback checking a timeout option (nan, inf, negative: usage errors, exit 2)."""
    def check(value: Optional[float]) -> Optional[float]:
        return None if value is None else _store.check_timeout(value, option, minimum)
    return check


TimeoutOpt = Annotated[float, typer.Option(
    "--connect-timeout", metavar="SECONDS", callback=_seconds("--connect-timeout"),
    help="Give up on a remote that does not answer this fast (0.1 to 604800).")]
DeadlineOpt = Annotated[Optional[float], typer.Option(
    "--remote-timeout", metavar="SECONDS", callback=_seconds("--remote-timeout"),
    help="Give up when the remote part of the command takes longer than this in all (default: no limit; "
    "each read still gives up after 30 s of silence).")]
PushRootOpt = Annotated[Optional[str], typer.Option(
    "--cache-dir", metavar="PATH", envvar=None,
    help="The local cache (default: KCACHE_DIR; else, with one --layout, that layout's own cache; else hidet's).")]
PullRootOpt = Annotated[Optional[str], typer.Option(
    "--cache-dir", metavar="PATH", envvar=None,
    help="The local cache (default: KCACHE_DIR; else, with one --layout or from an oci:// image, that layout's "
    "own cache: Triton's for triton; else hidet's).")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", "-n", help="Say what would move; change nothing.")]

remote_app = typer.Typer(name="remote", no_args_is_help=True)


@remote_app.callback()
def remote_group() -> None:
    """What a shared cache holds: ls, stats, prune; and keygen.

    ls, stats and prune read the index, without downloading it; keygen makes the key
    that signs what this node pushes.

    The remote is --remote URL on each subcommand, else KCACHE_REMOTE.

    Example: kcache remote ls --remote redis://cache-host:6379/0
    """


def register(app: typer.Typer) -> None:
    app.command("push")(push_command)
    app.command("pull")(pull_command)
    remote_app.command("ls")(remote_ls)
    remote_app.command("stats")(remote_stats_command)
    remote_app.command("prune")(remote_prune)
    remote_app.command("keygen")(remote_keygen)
    remote_app.info.cls = app.info.cls  # global options after `remote ls` too (KcacheGroup)
    app.add_typer(remote_app, name="remote")


@contextlib.contextmanager
def _opened(opts: o.GlobalOptions, remote: Optional[str], timeout: float, deadline: Optional[float] = None
            ) -> Iterator[Any]:
    """The remote store, closed when the command is done with it; what it skips is warned about."""
    if not remote:
        raise UsageError("no remote: pass --remote URL or set KCACHE_REMOTE (redis://host:6379/0, file:///shared/dir)")
    store = _store.open_store(remote, connect_timeout=timeout, deadline=deadline, warn=lambda m: c.warn(opts, m))
    try:
        yield store
    finally:
        store.close()


class _Moving(NamedTuple):
    opts: o.GlobalOptions
    root: Path
    flt: Any  # ScanFilter
    store: Any  # remote.store.Store
    bar: Any  # cli.progress.Bar


@contextlib.contextmanager
def _moving(ctx: typer.Context, sel: c.Selection, remote: Optional[str], timeout: tuple[float, Optional[float]],
            cache_dir: Optional[str], as_json: bool, doing: str) -> Iterator[_Moving]:
    """What push and pull start with: the options, the cache root, the selection, the open remote and a
    progress bar counting entries."""
    opts = o.use(ctx, cache_dir, as_json)
    flt = sel.filter()
    root = _local_root(opts, flt.layouts)
    with _opened(opts, remote, *timeout) as store, Bar(opts, doing, unit="entries") as bar:
        yield _Moving(opts, root, flt, store, bar)


def _local_root(opts: o.GlobalOptions, layouts: tuple[str, ...]):
    """The one local root push and pull work on: --cache-dir or KCACHE_DIR; else, for one --layout, where
    that layout's compiler keeps its cache (pull --layout triton fills Triton's); else hidet's rule."""
    if not c.explicit_root(opts) and len(set(layouts)) == 1:

        try:
            return locate.named_cache(layouts[0]).path
        except locate.UntrustedRoot:  # another user's directory there: never the place to pull into
            raise
        except UsageError:  # a layout without a default place
            pass
    return c.cache_root(opts)


@c.selectors(status=None, size_age=True)
def push_command(
    ctx: typer.Context,
    sel: c.Selection,
    remote: RemoteOpt = None,
    dry_run: DryRunOpt = False,
    connect_timeout: TimeoutOpt = 2.0,
    remote_timeout: DeadlineOpt = None,
    remote_user: UserOpt = None,
    cache_dir: PushRootOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """Upload the selected complete entries the remote lacks.

    Selectors are those of `ls`. Partial, failed, corrupt and in-flight entries never go. Each entry
    becomes visible at once, when its data is all there; a second pusher of the same entry leaves
    the first one's copy in place.

    To an oci:// remote the selection (one layout) becomes one image under the tag, in Red Hat MCV's
    compat layout that KServe and GKM mount (labels: entry count, size, target archs).

    Example: kcache push --remote redis://cache-host:6379/0 --space cuda_space_0
    """
    if oci.is_oci(remote):
        opts = o.use(ctx, cache_dir, as_json)
        flt = sel.filter()
        cmd_oci.push(opts, _local_root(opts, flt.layouts), flt, remote or "", (connect_timeout, remote_timeout),
                     remote_user, dry_run)
        return

    with _moving(ctx, sel, remote, (connect_timeout, remote_timeout), cache_dir, as_json, "pushing") as run:
        opts = run.opts
        result = _push.push(run.root, run.store, run.flt, dry_run=dry_run, warn=lambda m: c.warn(opts, m),
                      start=run.bar.start, advance=run.bar.advance)
    out = c.Output(opts)

    def human() -> None:
        if opts.quiet:  # as export's: a CI step is silent when it works
            return
        _table(result.entries)
        verb = "would push" if dry_run else "pushed"
        left = result.count("left out")
        out.info(f"{verb} {c.plural(result.count('push'), 'entry')} ({c.human_size(result.size)}) to "
                 f"{result.remote}; skipped {result.count('skip')} the remote has; left out {left}"
                 + (" (see the note)" if left else ""))

    out.result(result, human)


def _table(entries) -> None:
    """push's and pull's table: the entry by op and hash (a unique prefix on a narrow terminal), the note
    wrapped or on its own line."""
    rows = [[e.action, e.layout, e.kind or "-", e.space or "-", e.op or "-", e.hash, f"{e.files:,}",
             c.human_size(e.size), e.reason or ""] for e in entries]
    if rows:
        c.print_table([Column("action"), Column("layout", drop=4), Column("kind", drop=2), Column("space", drop=5),
                       Column("op", drop=6), Column("hash", spill=True), Column("files", right=True, drop=3),
                       Column("size", right=True), Column("note", wrap=True)], rows)


@c.selectors(status=None)
def pull_command(
    ctx: typer.Context,
    sel: c.Selection,
    remote: RemoteOpt = None,
    dry_run: DryRunOpt = False,
    lock_timeout: Annotated[float, typer.Option(
        "--lock-timeout", metavar="SECONDS", callback=_seconds("--lock-timeout", 0.0),
        help="How long to wait for an entry's lock before skipping it (the rest is pulled, then exit 3).")] = 60.0,
    connect_timeout: TimeoutOpt = 2.0,
    remote_timeout: DeadlineOpt = None,
    remote_user: UserOpt = None,
    gpu: Annotated[Optional[str], typer.Option(
        "--gpu", metavar="ARCH", help="oci:// only: this node's GPU archs (sm_90a; several with commas). "
        "Default: the local GPUs, from nvidia-smi.")] = None,
    no_gpu_check: Annotated[bool, typer.Option(
        "--no-gpu-check", help="oci:// only: pull without checking the image's targets against the GPUs.")] = False,
    cache_dir: PullRootOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """Fetch the selected remote entries missing here.

    Every check `import` makes applies: every file's size and sha256 must match the pushed record;
    names, links and paths follow import's rules; each entry appears with one rename. A bad entry is
    refused (exit 1) and the others still arrive. Complete local entries are kept; incomplete ones are
    replaced.

    From an oci:// image, its targets are checked against this node's GPUs before any write (none
    runs here: refused; no GPU here: only CPU code needs neither --gpu nor --no-gpu-check); entries of
    other archs are skipped and counted; the rest is imported.

    Example: kcache pull --remote redis://cache-host:6379/0 --op matmul
    """
    if oci.is_oci(remote):
        _pull_oci(ctx, sel, remote or "", (connect_timeout, remote_timeout), remote_user, (gpu, no_gpu_check),
                  (dry_run, lock_timeout), cache_dir, as_json)
        return

    with _moving(ctx, sel, remote, (connect_timeout, remote_timeout), cache_dir, as_json, "pulling") as run:
        opts = run.opts
        result = _pull.pull(run.root, run.store, run.flt, dry_run=dry_run, lock_timeout=lock_timeout,
                      warn=lambda m: c.warn(opts, m), start=run.bar.start, advance=run.bar.advance)
    out = c.Output(opts)
    refused = result.count("refuse")
    _check_archs(out, [e for e in result.entries if e.done])

    def human() -> None:
        if not opts.quiet:  # as import's: a CI step is silent when it works (refusals still warn)
            _table(result.entries)
        for e in result.entries:
            if e.action == "refuse":
                out.warn(f"refused {e.relpath}: {e.reason}")
        if opts.quiet:
            return
        verb = "would pull" if dry_run else "pulled"
        locked = f" ({result.lock_timeouts} whose lock was held)" if result.lock_timeouts else ""
        out.info(f"{verb} {c.plural(result.count('pull', 'replace'), 'entry')} ({c.human_size(result.size)}) from "
                 f"{result.remote}; skipped {result.count('skip')}{locked}; refused {refused}")

    out.result(result, human)
    _pull_status(out, result, lock_timeout)


def _pull_status(out: c.Output, result, lock_timeout: float) -> None:
    """A pull's exit, the rest being in: 3 when entries were skipped because a build held their lock (as
    import's: pull again), 1 when some were refused (then the held locks are a warning: a refusal is not
    mended by pulling again)."""
    refused = result.count("refuse")
    if result.lock_timeouts:
        held = importer.held_locks(result.lock_timeouts, lock_timeout, "pull")
        if not refused:
            raise held
        out.warn(str(held))
    if refused:
        raise typer.Exit(1)


def _pull_oci(ctx: typer.Context, sel: c.Selection, remote: str, timeouts, user: Optional[str],
              gpu: tuple[Optional[str], bool], run: tuple[bool, float], cache_dir: Optional[str],
              as_json: bool) -> None:
    """pull from an oci:// image: the node's archs and the image first, then the root its layout names."""
    opts = o.use(ctx, cache_dir, as_json)
    flt = sel.filter()
    node = oci_ops.node_archs(*gpu)
    image = cmd_oci.pull_image_of(remote, timeouts, user)
    oci_ops.preflight(image, node, flt)  # before the root is even chosen: nothing written
    root = _local_root(opts, (image.layout,))
    cmd_oci.pull(opts, root, flt, image, remote, timeouts, user, node, *run)


def _check_archs(out: c.Output, entries) -> None:
    """As import does: warn about pulled kernels their consumer does not use on this machine's GPU."""
    fit = _gpu.arch_fit({e.relpath: e.arch for e in entries}, {e.relpath: layout_of(e.layout).runs_on for e in entries})
    c.warn_arch_misfits(out, entries, fit, "pulled")


@c.selectors(status=None)
def remote_ls(
    ctx: typer.Context,
    sel: c.Selection,
    remote: RemoteOpt = None,
    connect_timeout: TimeoutOpt = 2.0,
    remote_timeout: DeadlineOpt = None,
    remote_user: UserOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """List what the remote holds, from its index (no download).

    Entries are printed as the index is read, a batch at a time (sorted within a batch), so a remote
    of millions of entries lists in bounded memory; --json is one list, streamed the same way.

    An oci:// repository lists its tags (a tag in the URL selects nothing: noted), with the entries,
    size, target archs and age of each image.

    Example: kcache remote ls --remote redis://cache-host:6379/0 --op 'mat*' --json
    """
    opts = o.use(ctx, None, as_json)
    if oci.is_oci(remote):
        return cmd_oci.ls(opts, remote or "", (connect_timeout, remote_timeout), remote_user)
    flt = sel.filter()
    out = c.Output(opts)
    count = size = 0
    with _opened(opts, remote, connect_timeout, remote_timeout) as store:
        for n, batch in enumerate(manage.scan_index(store, flt)):
            count += len(batch)
            size += sum(e.size for e in batch)
            (_json_batch if opts.json else _table_batch)(batch, n == 0)
    if opts.json:  # the object the first batch opened: its list closed, then the totals
        if not count:
            _json_batch([], True)
        sys.stdout.write(f"\n], \"entry_count\": {count}, \"size\": {size}}}\n")
    else:
        out.info(f"{c.plural(count, 'entry')} ({c.human_size(size)}) in {store.url}")


def _json_batch(batch, first: bool) -> None:
    """One batch of `remote ls --json`: the object and its `entries` list opened by the first, closed by
    the command."""
    head = f'{{"schema": "{o.schema_id("remote-ls")}", "entries": [\n'
    sys.stdout.write((head if first else ",\n") + ",\n".join(json.dumps(e.to_json()) for e in batch))
    sys.stdout.flush()


def _table_batch(batch, first: bool) -> None:
    """One batch of `remote ls`: the header before the first only."""
    rows = [[e.layout, e.kind or "-", e.space or "-", e.op or "-", e.hash, f"{e.files:,}",
             c.human_size(e.size), e.arch or "-", c.human_age(e.pushed or 0),
             c.human_age(e.last_pulled) if e.last_pulled else "never"] for e in batch]
    # key columns: op, hash (a unique prefix when narrow), size; the rest go first to last as listed
    cols = [Column("layout", drop=7), Column("kind", drop=2), Column("space", drop=8), Column("op"),
            Column("hash", spill=True), Column("files", right=True, drop=3), Column("size", right=True),
            Column("arch", drop=5), Column("pushed", drop=4), Column("pulled", drop=6)]
    lines = render(cols, rows, c.output_width(), colour=not o.plain_output(), clean=c.printable_line)
    c.print_lines(lines if first else lines[len(lines) - len(rows):])
    sys.stdout.flush()


def remote_stats_command(
    ctx: typer.Context,
    remote: RemoteOpt = None,
    connect_timeout: TimeoutOpt = 2.0,
    remote_timeout: DeadlineOpt = None,
    remote_user: UserOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """Totals of the remote per layout, space and op, from its index.

    Of an oci:// repository (a tag in the URL selects nothing: noted): per target arch (that target's entries and their
    files' bytes) and per layout (its images), over its tags.

    Example: kcache remote stats --remote file:///mnt/shared/kcache
    """
    opts = o.use(ctx, None, as_json)
    if oci.is_oci(remote):
        return cmd_oci.stats(opts, remote or "", (connect_timeout, remote_timeout), remote_user)
    with _opened(opts, remote, connect_timeout, remote_timeout) as store:
        stats = {"remote": store.url, **manage.remote_stats(manage.list_remote(store))}
    out = c.Output(opts)

    def human() -> None:
        rows = [[f"{what}", name, f"{g['entry_count']:,}", c.human_size(g["size"])]
                for what in ("layout", "space", "op")
                for name, g in [*stats[f"by_{what}"].items(), *([("-", stats[f"no_{what}"])] if what != "layout"
                                                                and stats[f"no_{what}"] else [])]]
        if rows:
            c.print_table(["by", "name", "entries", "size"], rows, right=(2, 3))
        out.text(f"{c.plural(stats['entry_count'], 'entry')}, {c.human_size(stats['size'])}, {stats['never_pulled']:,} "
                 f"never pulled, in {c.printable_line(stats['remote'])}")

    out.result(stats, human)


def remote_prune(
    ctx: typer.Context,
    max_size: Annotated[Optional[str], typer.Option(
        "--max-size", metavar="SIZE", help="Remove least recently pulled entries until the remote holds at most "
        "this (e.g. 100G).")] = None,
    older_than: Annotated[Optional[str], typer.Option(
        "--older-than", metavar="AGE", help="Remove entries not pulled (nor pushed) for this long (e.g. 30d).")] = None,
    keep: Annotated[Optional[int], typer.Option(
        "--keep", metavar="N", min=0, help="oci:// only: keep the N newest tags, remove the others.")] = None,
    remote: RemoteOpt = None,
    dry_run: DryRunOpt = False,
    connect_timeout: TimeoutOpt = 2.0,
    remote_timeout: DeadlineOpt = None,
    remote_user: UserOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """Remove remote entries by size and age, least recently pulled first.

    Each entry disappears whole: its record first, then the data its own record names (a record
    naming another entry, or claiming a file no cache holds, loses only itself, with a warning).
    Without --max-size or --older-than nothing is removed.

    Of an oci:// repository, named without a tag (it acts on every tag: a tag in the URL is a usage
    error), it removes tags (their manifests, by digest, through the registry's API): past the --keep N
    newest, older than --older-than, then the oldest until the images hold at most --max-size. A tag it
    did not select is never removed, even one naming the same image (that image is then kept).

    Example: kcache remote prune --max-size 200G --older-than 30d --dry-run
    """
    opts = o.use(ctx, None, as_json)
    limit = delete.parse_size(max_size) if max_size is not None else None
    age = delete.parse_age(older_than) if older_than is not None else None
    if oci.is_oci(remote):
        return cmd_oci.prune(opts, remote or "", (connect_timeout, remote_timeout), remote_user, (keep, age, limit),
                             dry_run)
    if keep is not None:
        raise c.UsageError("--keep counts tags: it applies to an oci:// remote only")
    out = c.Output(opts)
    with _opened(opts, remote, connect_timeout, remote_timeout) as store:
        plan = manage.plan_remote_prune(manage.list_remote(store), limit, age)
        freed = sum(r.entry.size for r in plan) if dry_run else manage.prune_remote(store, plan, out.warn)
    result = manage.RemotePruneResult(store.url, dry_run, tuple(plan), freed)

    def human() -> None:
        rows = [[r.entry.layout, r.entry.op or "-", r.entry.hash, c.human_size(r.entry.size),
                 c.human_age(r.entry.last_pulled) if r.entry.last_pulled else "never", r.why] for r in plan]
        if rows:
            c.print_table([Column("layout", drop=2), Column("op", drop=3), Column("hash", spill=True),
                           Column("size", right=True), Column("pulled", drop=1), Column("why", wrap=True)], rows)
        out.info(f"{'would remove' if dry_run else 'removed'} {c.plural(len(plan), 'entry')}, "
                 f"{c.human_size(freed)} from {store.url}")

    out.result(result, human)


def remote_keygen(
    ctx: typer.Context,
    as_json: o.JsonOpt = False,
) -> None:
    """Make this node's Ed25519 signing key; print its public key.

    The key goes to ~/.config/kcache/signing.key (XDG_CONFIG_HOME; KCACHE_SIGNING_KEY names another
    file), mode 0600; an existing key is never replaced. From then on `push` (and `build --remote`)
    sign every record with it. Nodes that list the public key in KCACHE_TRUSTED_KEYS or
    ~/.config/kcache/trusted_keys take only records signed by listed keys.

    Example: kcache remote keygen >> ~/fleet-keys.txt
    """
    opts = o.use(ctx, None, as_json)
    path, public = make_key()
    out = c.Output(opts)
    out.result({"key": str(path), "public_key": public}, lambda: out.text(public))
    out.info(f"signing key written to {path}; list {public} in the trust list of the nodes that pull")
