"""kcache's own settings: the budget `kcache prune` keeps when given no criteria (issue 25, as ccache's
`max_size`). A small TOML file, `$KCACHE_CONFIG`, else `$XDG_CONFIG_HOME/kcache/config.toml`, else
`~/.config/kcache/config.toml`:

    [all]                  # every cache together
    max-size = "50G"

    [cache.<layout>]       # one cache, by its layout's name (`kcache dir --all` shows them)
    max-size = "20G"
    max-age = "30d"

Values are strings in the one size and age grammar (kcache_cli.util.units). kcache rewrites the whole file on
`config set`/`unset` (comments are not kept): atomically, a temp file renamed over it in the same
directory, under a lock on that directory, never through a symlinked file."""

from __future__ import annotations

import fcntl
import os
import pwd
import re
import shlex
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kcache_cli.fs import locking, state
from kcache_cli.fs import read as fsread
from kcache_cli.fs import write as fswrite
from kcache_cli.fs.state import state_dir
from kcache_cli.model.terms import LAYOUT_NAMES
from kcache_cli.util import textsafe
from kcache_cli.util.errors import KcacheError, UsageError
from kcache_cli.util.units import parse_age, parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[import-not-found, no-redef, unused-ignore]

ENV = "KCACHE_CONFIG"
KEYS = ("max-size", "max-age")
ALL = "all"
MAX_BYTES = 64 << 10  # a config file larger than this is not one kcache wrote


@dataclass(frozen=True)
class Budget:
    """What one section asks for: bytes and seconds, None when not set."""

    max_size: int | None = None
    max_age: float | None = None

    def __bool__(self) -> bool:
        return self.max_size is not None or self.max_age is not None

    def to_json(self) -> dict:
        return {"max_size": self.max_size, "max_age": self.max_age}


@dataclass(frozen=True)
class Config:
    """The file's contents: `sections` maps "all" or a cache's name to its key -> value text, as written."""

    path: Path
    exists: bool
    sections: dict[str, dict[str, str]] = field(default_factory=dict)

    def budget(self, section: str) -> Budget:
        """The parsed values of one section (every value was checked when the file was read)."""
        values = self.sections.get(section, {})
        size, age = values.get("max-size"), values.get("max-age")
        return Budget(None if size is None else parse_size(size), None if age is None else parse_age(age))

    def budget_for(self, layouts: tuple[str, ...]) -> Budget:
        """The budget of a cache whose root holds `layouts`: its `[cache.<layout>]` section (the tighter
        value of each key when the root holds several layouts that have one)."""
        sizes = [b.max_size for b in map(self.budget, layouts) if b.max_size is not None]
        ages = [b.max_age for b in map(self.budget, layouts) if b.max_age is not None]
        return Budget(min(sizes) if sizes else None, min(ages) if ages else None)

    @property
    def caches(self) -> list[str]:
        return sorted(s for s in self.sections if s != ALL)

    def to_json(self) -> dict:
        return {"path": str(self.path), "exists": self.exists, "all": self.budget(ALL).to_json(),
                "caches": [{"cache": name, **self.budget(name).to_json()} for name in self.caches]}

    def to_toml(self) -> str:
        """The file as kcache writes it: [all] first, then each cache's table, keys in KEYS' order."""
        blocks = []
        for section in ([ALL] if ALL in self.sections else []) + self.caches:
            values = self.sections[section]
            if not values:
                continue
            head = f"[{section}]" if section == ALL else f"[cache.{section}]"
            blocks.append("\n".join([head] + [f"{k} = {_quoted(values[k])}" for k in KEYS if k in values]))
        return "".join(b + "\n\n" for b in blocks).rstrip("\n") + ("\n" if blocks else "")


def config_path() -> Path:
    """Where the file is: KCACHE_CONFIG, else the XDG config directory (an absolute XDG_CONFIG_HOME, as
    the XDG spec asks), else ~/.config."""
    env = os.environ.get(ENV)
    if env:
        return Path(env).expanduser().absolute()
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".config"
    return base / "kcache" / "config.toml"


def _quoted(text: str) -> str:
    """A TOML basic string (values are sizes and ages, checked: the escapes are for safety only)."""
    out = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(ch if ch.isprintable() else f"\\u{ord(ch):04x}" for ch in out) + '"'


def _names() -> tuple[str, ...]:
    return LAYOUT_NAMES


def section_names() -> tuple[str, ...]:
    """What `config --cache` takes (check_section): a layout's name, or all."""
    return (*_names(), ALL)


def check_section(name: str | None) -> str:
    """`--cache NAME` as a section: "all" for none; a layout's name; else a usage error naming them."""
    if name is None or name == ALL:
        return ALL
    if name not in _names():
        raise UsageError(f"unknown cache '{name}' (expected {', '.join(_names())} or all)")
    return name


def check_value(key: str, value: str, where: str = "") -> str:
    """`value` for `key`, stripped, after the units grammar has read it (a usage error otherwise)."""
    if key not in KEYS:
        raise UsageError(f"{where}unknown key '{key}' (expected {' or '.join(KEYS)})")
    value = value.strip()
    if key == "max-size":
        parse_size(value, f"{where}{key}")
    else:
        parse_age(value, f"{where}{key}")
    return value


def load(path: Path | None = None) -> Config:
    """The config at `path` (config_path() by default); a missing file is an empty config. One that is too
    big, not TOML or holds what kcache does not know is a usage error naming the file (exit 2, like a bad
    option); one that exists but cannot be read (permissions, not a regular file) is an error (exit 1)."""
    path = config_path() if path is None else path
    raw = _read(path)
    if raw is None:
        return Config(path, False)
    return Config(path, True, _sections(parse_toml(raw, path), path))


def parse_toml(raw: bytes, path: Path) -> dict:
    """The TOML document in `raw`; anything malformed (bad UTF-8, bad TOML, nested past the parser's
    recursion limit) is a usage error naming the file and, where known, the line."""
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise UsageError(f"{path}:{line}: not valid TOML: not UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}") from None
    except (RecursionError, MemoryError):
        raise UsageError(f"{path}:{_deep_line(raw)}: not valid TOML: a value nested too deeply") from None
    except ValueError:  # an integer past Python's limit on digits (4,300): int() refuses it in the parser
        long = _LONG_NUMBER.search(raw)
        at = f":{raw.count(_NEWLINE, 0, long.start()) + 1}" if long else ""
        raise UsageError(f"{path}{at}: not valid TOML: a number with too many digits") from None


_LONG_NUMBER = re.compile(rb"[0-9][0-9_]{4299,}")  # past int()'s limit of 4,300 digits
_NEWLINE = b"\n"


def _deep_line(raw: bytes, limit: int = 64) -> int:
    """The line where brackets first nest past `limit` deep (strings not told apart: a hint only)."""
    depth = 0
    for i, byte in enumerate(raw):
        depth += (byte in b"[{") - (byte in b"]}")
        if depth > limit:
            return raw[:i].count(b"\n") + 1
    return 1


def _read(path: Path) -> bytes | None:
    try:
        fd, st = fsread.open_regular(str(path), follow=True)  # the user's own link (dotfiles) is fine to read
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _cannot_read(path, exc) from None
    try:
        return _contents(fd, st, path)
    finally:
        os.close(fd)


def _cannot_read(path: Path, exc: OSError) -> KcacheError:
    """A config file that exists but cannot be read: what is wrong is the file's place or mode, not what it
    says, so an error (exit 1) rather than a usage error."""
    return KcacheError(f"cannot read {path}: {getattr(exc, 'kind', None) or exc.strerror or exc}")


def _contents(fd: int, st: os.stat_result, path: Path) -> bytes:
    if st.st_size > MAX_BYTES:
        raise UsageError(f"{path}: {st.st_size} bytes is too big for a kcache config")
    try:
        return os.read(fd, MAX_BYTES + 1)[:MAX_BYTES]
    except OSError as exc:  # EIO, or a file that cannot be read although it could be opened
        raise _cannot_read(path, exc) from None


def _sections(doc: dict, path: Path) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for top, value in doc.items():
        if top not in (ALL, "cache") or not isinstance(value, dict):
            raise UsageError(f"{path}: unknown setting '{top}' (expected [all] or [cache.NAME] tables)")
        tables = {ALL: value} if top == ALL else value
        for name, table in tables.items():
            where = "[all]" if top == ALL else f"[cache.{name}]"
            if top != ALL:
                if not isinstance(table, dict):
                    raise UsageError(f"{path}: cache.{name} is not a table")
                try:
                    check_section(name)
                except UsageError as exc:
                    raise UsageError(f"{path}: {exc}") from None
            out[name if top != ALL else ALL] = _values(table, f"{path}: {where} ")
    return out


def _values(table: dict, where: str) -> dict[str, str]:
    values = {}
    for key, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise UsageError(f"{where}{key} must be a string like \"20G\" or \"30d\"")
        values[key] = check_value(key, str(value), where)
    return values


# ---- writing -------------------------------------------------------------------------------------
def set_value(section: str, key: str, value: str, path: Path | None = None) -> Config:
    """Set `key` in `section` ("all" or a cache's name) to `value` (checked), and write the file."""
    section, value = check_section(section), check_value(key, value)

    def change(cfg: Config) -> dict[str, dict[str, str]]:
        sections = {s: dict(v) for s, v in cfg.sections.items()}
        sections.setdefault(section, {})[key] = value
        return sections

    return _update(config_path() if path is None else path, change)[0]


def unset_value(section: str, key: str, path: Path | None = None) -> tuple[Config, bool]:
    """Remove `key` from `section`; (the config, whether it was set). A file that had nothing to remove
    is left as it was."""
    section = check_section(section)
    if key not in KEYS:
        raise UsageError(f"unknown key '{key}' (expected {' or '.join(KEYS)})")

    def change(cfg: Config) -> dict[str, dict[str, str]] | None:
        if key not in cfg.sections.get(section, {}):
            return None
        sections = {s: dict(v) for s, v in cfg.sections.items()}
        del sections[section][key]
        return {s: v for s, v in sections.items() if v}

    return _update(config_path() if path is None else path, change)


def _update(path: Path, change) -> tuple[Config, bool]:
    """Read, change and write the file under an flock of its directory (two `config set`s at once both
    land); `change` returns the new sections, or None for no write."""
    dfd = _open_config_dir(path)
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)
        cfg = _before_rewrite(path, lambda: load(path))
        sections = change(cfg)
        if sections is None:
            return cfg, False
        new = Config(path, True, sections)
        _write(dfd, path, new.to_toml().encode())
        return new, True
    finally:
        os.close(dfd)


def _before_rewrite(path: Path, read):
    """What `read` reads of the file at `path` that `config set`/`unset` rewrites whole: a file it cannot
    read or parse is never overwritten (it may be an admin's, with more in it than kcache knows); the error
    (its exit code kept) says how to get going again."""
    try:
        return read()
    except KcacheError as exc:
        aside = f"mv {shlex.quote(str(path))} {shlex.quote(str(path) + '.bad')}"
        raise type(exc)(f"{exc}; kcache rewrites the whole file and leaves one it cannot read alone: fix it, or "
                        f"move it aside ({aside}) and run this again") from None


def _open_config_dir(path: Path) -> int:
    parent = path.parent
    try:
        if not parent.is_dir():
            fswrite.make_dirs(parent)
        return fswrite.open_root(parent)
    except FileExistsError:
        return fswrite.open_root(parent)
    except OSError as exc:
        raise KcacheError(f"cannot create {parent}: {exc.strerror or exc}") from None


def _write(dfd: int, path: Path, data: bytes) -> None:
    """Replace the file in the held directory: never through a symlink planted (or kept) at its name."""
    try:
        st = os.stat(path.name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise KcacheError(f"refusing to write {path}: it is {what} (edit the file it stands for, or remove it)")
    mode = stat.S_IMODE(st.st_mode) if st is not None else 0o644
    try:
        fswrite.replace_file(dfd, path.name, data, mode=mode, prefix=f".{path.name}.tmp-")
    except OSError as exc:
        raise KcacheError(f"cannot write {path}: {exc.strerror or exc}") from None


# ---- the budget kept in a cache (as ccache's ccache.conf) --------------------------------------------
CACHE_FILE = "config.toml"  # max-size and max-age, top-level keys
# Root's and the cache owner's budget: <root>/.kcache/budget/config.toml, in a directory only its owner may
# write. A group-shared cache's .kcache/ is the members' to write (their imports stage there), so a member
# could rename into .kcache/config.toml any file root or the owner owns, bytes of the member's choosing
# among them (a file of an entry root's import published): root acts on a budget only from where no
# member can put one. .kcache/config.toml itself is a member's budget (and a private cache's, before).
BUDGET_DIR = "budget"
CONFIG_LOCK = ".config.lock"  # in .kcache/locks/: writers of the file take it (0660, writers only)


@dataclass(frozen=True)
class CacheConfig:
    """The budget kept in one cache: it binds every user's bare `kcache prune` of that cache and wins
    over each user's own settings. `values` maps a key to its text as written."""

    root: Path
    exists: bool
    values: dict[str, str] = field(default_factory=dict)
    members: bool = False  # kept in .kcache/config.toml (a member's, or a private cache's), not in budget/

    @property
    def path(self) -> Path:
        return state_dir(self.root) / CACHE_FILE if self.members else state_dir(self.root) / BUDGET_DIR / CACHE_FILE

    def budget(self) -> Budget:
        return Config(self.path, self.exists, {ALL: self.values}).budget(ALL)

    def to_toml(self) -> str:
        lines = [f"{k} = {_quoted(self.values[k])}" for k in KEYS if k in self.values]
        return "".join(line + "\n" for line in lines)

    def to_json(self) -> dict:
        return {"path": str(self.path), "exists": self.exists, **self.budget().to_json()}


def load_cache(root: Path, rewriting: bool = False) -> CacheConfig:
    """The budget kept in the cache at `root` (empty when it has none). A file that is malformed is a usage
    error naming it (exit 2); one that cannot be read, or that belongs to someone the cache does not trust
    (not you, not root, nor the group of a group-shared cache), is an error (exit 1)."""
    root = Path(root)
    raw, members = _read_cache_file(root, rewriting)
    empty = CacheConfig(root, False, members=members)
    if raw is None:
        return empty
    doc = parse_toml(raw, empty.path)
    values: dict[str, str] = {}
    for key, value in doc.items():
        if key not in KEYS:
            raise UsageError(f"{empty.path}: unknown key '{key}' (expected {' or '.join(KEYS)})")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise UsageError(f"{empty.path}: {key} must be a string like \"20G\" or \"30d\"")
        values[key] = check_value(key, str(value), f"{empty.path}: ")
    return CacheConfig(root, True, values, members)


def _read_cache_file(root: Path, rewriting: bool) -> tuple[bytes | None, bool]:
    """(the budget file's bytes, None for none; whether they are .kcache/config.toml's, not budget/'s)."""
    where = state_dir(root) / BUDGET_DIR
    try:
        rfd = fswrite.open_root(root)
    except OSError:
        return None, False
    try:
        group = state.shared_group(rfd)
        owner = os.fstat(rfd).st_uid
        sfd = state.open_state(rfd, root)  # last: nothing after it may fail and leave it open
    except FileNotFoundError:  # no .kcache/: no budget
        return None, False
    except OSError as exc:  # a link, another user's, one this user may not search: the budget is not known
        raise _cannot_read(where, exc) from None
    finally:
        os.close(rfd)
    try:
        bfd = fswrite.open_dir(sfd, BUDGET_DIR)
    except FileNotFoundError:  # none of root's or the owner's: a member's, or a private cache's, if any
        try:
            others = bool(os.fstat(sfd).st_mode & 0o022)  # .kcache/ others may write: anyone's file may be put there
            return _read_in(sfd, state_dir(root) / CACHE_FILE, root, group, owner, rewriting, others), True
        finally:
            os.close(sfd)
    except OSError as exc:
        os.close(sfd)
        raise _cannot_read(where, exc) from None
    os.close(sfd)
    try:
        why = _budget_dir_problem(os.fstat(bfd), owner)
        if why:
            raise KcacheError(f"{where}: {why}: not trusted as this cache's budget; root or the cache's owner can "
                              "remove it and set one anew")
        return _read_in(bfd, where / CACHE_FILE, root, group, owner, rewriting, False), False
    finally:
        os.close(bfd)


def _budget_dir_problem(st: os.stat_result, owner: int) -> str | None:
    """Why .kcache/budget/ (`st`) may hold a file root or the owner did not put there, or None: it must be
    theirs and writable by nobody else (a member renames a file into a directory the member may write)."""
    if st.st_uid not in (0, owner):
        return f"owned by {_user(st.st_uid)}, not root or the cache's owner"
    if st.st_mode & 0o022:
        return "writable by others than its owner"
    return None


def _read_in(dfd: int, path: Path, root: Path, group: int | None, owner: int, rewriting: bool,
             placed: bool) -> bytes | None:
    """The budget file `path` (its name CACHE_FILE in the directory `dfd`), as the cache trusts it; `placed`:
    in a directory others may write, where a file of root's or the owner's may have been put by anyone."""
    try:
        fd, st = fsread.open_regular(CACHE_FILE, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _cannot_read(path, exc) from None
    try:
        if rewriting and (_members_budget(st, group, owner) or placed and os.geteuid() == 0):
            return None  # root sets a budget anew: a member's values are never taken over unseen
        why = _untrusted(st, group, owner, placed)
        if why:
            raise KcacheError(f"{path}: {why}: not trusted as this cache's budget; root or the cache's owner can "
                              f"set one anew (`kcache --cache-dir {root} config set KEY VALUE` keeps only what "
                              "they set) or remove it")
        return _contents(fd, st, path)
    finally:
        os.close(fd)


def _untrusted(st: os.stat_result, group: int | None, owner: int, placed: bool = False) -> str | None:
    """Why the budget file (`st`) of a cache owned by `owner` must not steer this user's prune, or None.
    A member of a group-shared cache may keep a budget for every member's prune, but root's acts only on
    one that root or the cache's owner wrote: a member's max-size of 0 would otherwise have root's cron
    remove the other members' entries, which that member may not remove. `placed`: the file lies in a
    directory others may write (.kcache/ of a group-shared cache), where anyone may have put it, whoever
    owns it (BUDGET_DIR)."""
    if st.st_mode & 0o002:
        return "writable by anyone"
    if _members_budget(st, group, owner) and st.st_uid in (0, owner):
        return "writable by the cache's group, so a member may have written it (root acts on a budget only root " \
               "or the cache's owner wrote; their `config set` makes it the group's to read only)"
    if placed and os.geteuid() == 0 and st.st_uid in (0, owner):
        return ("kept in .kcache/, which others may write: anyone may have put a file of root's or the owner's there "
                "(root acts on their budget only in .kcache/budget/, where their `config set` keeps it)")
    if st.st_uid in (os.geteuid(), 0, owner):
        return None
    writer = _user(st.st_uid)
    if group is None or st.st_gid != group:
        return f"written by {writer}, who is not you, root or the cache's owner, in a cache no group shares"
    if _members_budget(st, group, owner):
        return f"written by {writer}, a member of the cache's group (root acts on a budget only root or the " \
               "cache's owner wrote)"
    return None


def _members_budget(st: os.stat_result, group: int | None, owner: int) -> bool:
    """Whether root reads a budget file a member of the cache's group wrote (not root, not the owner), or
    may have written: one the group may write in place keeps its writer's name."""
    return (os.geteuid() == 0 and group is not None and st.st_gid == group and not st.st_mode & 0o002
            and (st.st_uid not in (0, owner) or bool(st.st_mode & 0o020)))


def _user(uid: int) -> str:
    try:
        return f"{textsafe.printable_line(pwd.getpwuid(uid).pw_name)} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def set_cache_value(root: Path, key: str, value: str) -> CacheConfig:
    """Keep `key` = `value` (checked) in the cache's own budget file."""
    value = check_value(key, value)
    return _update_cache(root, lambda values: {**values, key: value})[0]


def unset_cache_value(root: Path, key: str) -> tuple[CacheConfig, bool]:
    """Remove `key` from the cache's budget file; (the budget, whether it was set)."""
    if key not in KEYS:
        raise UsageError(f"unknown key '{key}' (expected {' or '.join(KEYS)})")
    return _update_cache(root, lambda values: {k: v for k, v in values.items() if k != key} if key in values
                         else None)


def _update_cache(root: Path, change) -> tuple[CacheConfig, bool]:
    """Read, change and write the cache's budget under its config lock (in .kcache/locks/, opened only by
    writers), through the held state directory (never a link): root's or the owner's in .kcache/budget/
    (_write_budget), a member's in .kcache/config.toml, shared with the group of a group-shared cache."""
    where = state.state_dir(root) / CACHE_FILE
    sfd, lock = _open_for_update(root, where)
    try:
        locking.wait_flock(lock, 60.0, f"the config lock of {root}")
        cfg = _before_rewrite(where, lambda: load_cache(root, rewriting=True))
        values = change(cfg.values)
        if values is None:
            return cfg, False
        owner = _owner(root)
        theirs = os.geteuid() in (0, owner)  # root's or the owner's: in budget/, theirs alone
        new = CacheConfig(Path(root), True, values, members=not theirs)
        try:
            if theirs:
                _write_budget(sfd, new, owner)
            else:
                fswrite.replace_file_shared(sfd, CACHE_FILE, new.to_toml().encode(), group_reads_only=True)
        except OSError as exc:
            raise KcacheError(f"cannot write {new.path}: {exc.strerror or exc}") from None
        return new, True
    finally:
        os.close(lock)
        os.close(sfd)


def _owner(root: Path) -> int:
    """The cache's owner: its root's, as held (fsread.hold_root)."""
    return fsread.stat_path(root).st_uid


def _write_budget(sfd: int, new: CacheConfig, owner: int) -> None:
    """Root's or the owner's budget into .kcache/budget/ (the owner's, 0755: every user's prune reads it, no
    one else may put a file in it; root's in a user's cache is the user's, who may then set it too); the
    members' .kcache/config.toml it supersedes is removed."""
    if fswrite.mkdir_at(sfd, BUDGET_DIR, 0o755, exist_ok=True):
        made = fswrite.open_dir(sfd, BUDGET_DIR)
        try:
            # whatever the umask: every user's prune reads it, only its owner writes it (a setgid bit inherited
            # from a group-shared .kcache/ is kept: the file is the group's, to read)
            mode = 0o755 | (os.fstat(made).st_mode & stat.S_ISGID)
            if os.geteuid() == 0 and owner != 0:
                os.fchown(made, owner, -1)  # (which may drop the setgid bit: the mode is set after it)
            os.fchmod(made, mode)
        finally:
            os.close(made)
    bfd = fswrite.open_dir(sfd, BUDGET_DIR)
    try:
        why = _budget_dir_problem(os.fstat(bfd), owner)
        if why:
            raise KcacheError(f"{new.path.parent}: {why}: remove it and set the budget again")
        fswrite.replace_file_shared(bfd, CACHE_FILE, new.to_toml().encode(), group_reads_only=True)
    finally:
        os.close(bfd)
    fswrite.unlink_at(sfd, CACHE_FILE)


def _open_for_update(root: Path, where: Path) -> tuple[int, int]:
    """(.kcache/ descriptor, config lock descriptor), made if missing; a one-line error otherwise."""
    try:
        rfd = fswrite.open_root(root)
    except OSError as exc:
        raise KcacheError(f"cannot open the cache {root}: {exc.strerror or exc}") from None
    sfd = lfd = -1
    try:
        sfd = state.open_state(rfd, root, create=True)
        lfd = state.open_state(rfd, root, "locks", create=True)
        return sfd, locking.open_lock(CONFIG_LOCK, lfd, create=True)
    except OSError as exc:
        if sfd >= 0:
            os.close(sfd)
        raise KcacheError(f"cannot write {where}: {exc.strerror or exc} (a cache's budget is set by those who "
                          "may write the cache)") from None
    finally:
        os.close(rfd)
        if lfd >= 0:
            os.close(lfd)
