"""push, pull, remote ls | stats | prune when --remote is an OCI registry (oci://HOST/REPO:TAG): the CLI
half of kcache_cli/remote/oci_ops.py. Their --json documents have their own schemas (`push-oci`,
`pull-oci`, `remote-ls-oci`, `remote-stats-oci`, `remote-prune-oci`): a registry holds tags of images,
not a Redis index of entries."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator, Optional

from kcache_cli.cli import common as c
from kcache_cli.cli import options as o
from kcache_cli.cli.table import Column
from kcache_cli.util.lazy import lazy_module

if TYPE_CHECKING:  # the real imports, for mypy; at run time each loads at its first use
    from kcache_cli.archive import importer
    from kcache_cli.remote import oci, oci_ops
else:
    importer = lazy_module("kcache_cli.archive.importer")
    oci = lazy_module("kcache_cli.remote.oci")
    oci_ops = lazy_module("kcache_cli.remote.oci_ops")


@contextlib.contextmanager
def opened(ref: Any, timeout: float, deadline: Optional[float], user: Optional[str]) -> Iterator[Any]:
    """A registry client for `ref` (an OciRef: oci.parse_ref, or oci.parse_repository for a command that acts
    on every tag), under the command's deadline."""
    reg = oci.Registry(ref, connect_timeout=timeout, user=user)
    reg.set_deadline(deadline)
    try:
        yield reg
    finally:
        reg.close()


def _output(opts: o.GlobalOptions, command: str) -> c.Output:
    opts.command = command
    return c.Output(opts)


def _entry_table(rows: list[list[str]]) -> None:
    """push's and pull's table of an image's entries (as import's): the entry by op and hash (a unique prefix
    on a narrow terminal), the least useful columns dropped first, the note wrapped or on its own line."""
    if rows:
        c.print_table([Column("action"), Column("layout", drop=1), Column("kind", drop=2), Column("space", drop=8),
                       Column("op", drop=7), Column("hash", spill=True), Column("files", right=True, drop=3),
                       Column("size", right=True, drop=6), Column("arch", drop=5), Column("note", wrap=True)], rows)


def push(opts: o.GlobalOptions, root, flt, url: str, timeouts: tuple[float, Optional[float]], user: Optional[str],
         dry_run: bool) -> None:
    with opened(oci.parse_ref(url), *timeouts, user) as reg:
        result = oci_ops.push_image(root, reg, flt, dry_run=dry_run, warn=lambda m: c.warn(opts, m))
    out = _output(opts, "push-oci")

    def human() -> None:
        if opts.quiet:  # as export's: a CI step is silent when it works
            return
        moved = sorted([("push", e, e.arch, "") for e in result.entries]
                       + [("left out", e, None, why) for e, why in result.left], key=lambda m: m[1].relpath)
        _entry_table([[action, e.layout, e.kind or "-", e.space or "-", e.op or "-", e.hash, f"{e.files:,}",
                       c.human_size(e.size), arch or "-", why] for action, e, arch, why in moved])
        if dry_run:
            out.info(f"would push {c.plural(result.planned, 'entry')} ({c.human_size(result.size)}) as "
                     f"{result.remote}", whole_words=True)
            return
        out.info(f"pushed {c.plural(len(result.entries), 'entry')} ({c.human_size(result.size)}, layer "
                 f"{c.human_size(result.layer_size)}) as {result.remote}@{result.digest}", whole_words=True)

    out.result(result, human)


def pull_image_of(url: str, timeouts: tuple[float, Optional[float]], user: Optional[str]):
    """The image the pull names (manifest and config read), before the local root is chosen."""
    with opened(oci.parse_ref(url), *timeouts, user) as reg:
        return oci_ops.read_image(reg, reg.ref.reference)


def pull(opts: o.GlobalOptions, root, flt, image, url: str, timeouts: tuple[float, Optional[float]],
         user: Optional[str], node: Optional[list[str]], dry_run: bool, lock_timeout: float) -> None:
    with opened(oci.parse_ref(url), *timeouts, user) as reg:
        result = oci_ops.pull_image(root, reg, image, node, flt, dry_run=dry_run, lock_timeout=lock_timeout,
                            warn=lambda m: c.warn(opts, m))
    out = _output(opts, "pull-oci")
    imported = result.imported

    def human() -> None:
        if opts.quiet:  # as import's: a CI step is silent when it works
            return
        rows = [[oci_ops.pull_action(e.action), e.layout, e.kind or "-", e.space or "-", e.op or "-", e.hash,
                 f"{e.files:,}", c.human_size(e.size), e.arch or "-", e.reason or ""] for e in imported.entries]
        rows += [["skip", s.layout or "-", s.kind or "-", s.space or "-", s.op or "-", s.hash or s.relpath, "-",
                  "-", s.arch or "-", s.why] for s in result.skipped]
        _entry_table(rows)
        verb = "would pull" if dry_run else "pulled"
        n = imported.count("import") + imported.count("replace")
        other = len(result.skipped) - result.other_arch
        locked = f", {imported.lock_timeouts} whose lock was held" if imported.lock_timeouts else ""
        blocked = len(imported.obstructed)
        locked += f", {blocked} with something in the way" if blocked else ""
        out.info(f"{verb} {c.plural(n, 'entry')} ({c.human_size(result.size)}) from {result.remote}; skipped "
                 f"{imported.count('skip') - imported.lock_timeouts - blocked} present here{locked}, "
                 f"{result.other_arch} built "
                 "for other archs" + (f", {other} not selected" if other else ""), whole_words=True)

    out.result(result, human)
    if imported.obstructed:  # pulling again mends nothing: exit 1, as import's
        raise importer.in_the_way(imported, "pull")
    if imported.lock_timeouts:  # the rest is in; these wait for a build that holds them: exit 3, as import's
        raise importer.held_locks(imported.lock_timeouts, lock_timeout, "pull")


def _age(created: Optional[float]) -> str:
    """An image's age for a table: "-" only when its config gives no time (the epoch, SOURCE_DATE_EPOCH=0, is one)."""
    return c.human_age(created) if created is not None else "-"


def ls(opts: o.GlobalOptions, url: str, timeouts: tuple[float, Optional[float]], user: Optional[str]) -> None:
    out = _output(opts, "remote-ls-oci")
    with opened(oci.parse_repository(url, "remote ls", out.warn), *timeouts, user) as reg:
        images = oci_ops.list_images(reg, out.warn)

    def human() -> None:
        rows = [[i.ref.tag or "-", i.layout or "-", f"{i.entry_count:,}" if i.entry_count is not None else "-",
                 c.human_size(i.size), ",".join(i.targets) or "-", _age(i.created), i.digest[7:19]] for i in images]
        if rows:
            c.print_table(["tag", "layout", "entries", "size", "targets", "age", "digest"], rows, right=(2, 3))
        out.info(f"{c.plural(len(images), 'tag')} in {reg.url}")

    out.result({"remote": reg.url, "images": [i.to_json() for i in images], "tag_count": len(images),
                "size": sum({i.digest: i.size for i in images}.values())}, human)


def stats(opts: o.GlobalOptions, url: str, timeouts: tuple[float, Optional[float]], user: Optional[str]) -> None:
    out = _output(opts, "remote-stats-oci")
    with opened(oci.parse_repository(url, "remote stats", out.warn), *timeouts, user) as reg:
        result = oci_ops.image_stats(reg.url, oci_ops.list_images(reg, out.warn))

    def human() -> None:
        rows = [[what, name, f"{g['tags']:,}", "?" if g["entry_count"] is None else f"{g['entry_count']:,}",
                 "?" if g["size"] is None else c.human_size(g["size"])]
                for what in ("target", "layout") for name, g in result[f"by_{what}"].items()]  # type: ignore[attr-defined]
        if rows:
            c.print_table(["by", "name", "tags", "entries", "size"], rows, right=(2, 3, 4))
        if any(row[3] == "?" for row in rows):
            out.info("?: a tag an older kcache pushed holds several targets and its labels do not count them apart")
        if result["by_target"]:
            out.info("a target's size is its entries' files; a layout's, its images in the registry")
        out.text(f"{c.plural(result['tags'], 'tag')} ({c.plural(result['images'], 'image')}), "  # type: ignore[arg-type]
                 f"{c.plural(result['entry_count'], 'entry')}, {c.human_size(result['size'])} in {result['remote']}")  # type: ignore[arg-type]

    out.result(result, human)


def prune(opts: o.GlobalOptions, url: str, timeouts: tuple[float, Optional[float]], user: Optional[str],
          limits: tuple[Optional[int], Optional[float], Optional[int]], dry_run: bool) -> None:
    out = _output(opts, "remote-prune-oci")
    keep, age, max_size = limits
    with opened(oci.parse_repository(url, "remote prune"), *timeouts, user) as reg:
        unread: list[str] = []
        images = oci_ops.list_images(reg, out.warn, unread)
        done = oci_ops.prune_images(reg, images, oci_ops.plan_prune(images, keep, age, max_size), dry_run, unread)
    removed = [r for r in done if r.skipped is None]
    freed = sum({r.image.digest: r.image.size for r in removed}.values())

    def human() -> None:
        rows = [[r.image.ref.tag or "-", c.human_size(r.image.size), _age(r.image.created), r.why,
                 r.skipped or ("" if r.done or dry_run else "?")] for r in done]
        if rows:
            c.print_table(["tag", "size", "age", "why", "kept because"], rows, right=(1,))
        out.info(f"{'would remove' if dry_run else 'removed'} {c.plural(len(removed), 'tag')} "
                 f"({c.human_size(freed)}) from {reg.url}; kept {len(images) - len(removed)}")

    out.result({"remote": reg.url, "dry_run": dry_run, "removed": [r.to_json() for r in done],
                "tag_count": len(removed), "freed": freed}, human)
