"""One JSON (issue 25): every data command's --json output, run on the real fixtures, validates against
its schema in kcache_cli/schemas/<command>.json (JSON Schema 2020-12, checked with `jsonschema`),
carries "schema": "kcache/<command>/1", uses machine keys, says null for nothing (never "-"), and
names counts entry_count / file_count (entries and files are lists wherever they appear).

The schemas share their definitions (issue 31): defs.json holds them under $defs, and a command's schema
names one as "defs.json#/$defs/<name>", resolved against its $id (https://kcache.invalid/schemas/<command>.json),
so a validator is given every schema of the folder by its $id (a `referencing` Registry here)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path

import pytest
from conftest import CXX, FIXTURES, SHARED_FIXTURES, copy_tree

jsonschema = pytest.importorskip("jsonschema")
referencing = pytest.importorskip("referencing")  # jsonschema >= 4.18 brings it
DRAFT202012 = pytest.importorskip("referencing.jsonschema").DRAFT202012

NAMES = ("hidet", "tilus", "tilelang", "triton/cache")
ROOTS = [(w, n) for w in ("repo", "shared") for n in NAMES]
# keys whose values are maps keyed by names (ops, spaces...), not by machine keys
NAME_MAPS = {"by_layout", "by_space", "by_op", "by_status", "by_kind", "by_age", "versions", "env"}


SCHEMAS = resources.files("kcache_cli").joinpath("schemas")
MACHINE_KEY = "^[a-z][a-z0-9_]*$"


def schema_of(command: str) -> dict:
    return json.loads(SCHEMAS.joinpath(f"{command}.json").read_text())


@cache
def all_schemas() -> dict[str, dict]:
    """Every schema shipped, by its file's stem: the commands' and defs.json."""
    return {p.name[:-5]: json.loads(p.read_text()) for p in SCHEMAS.iterdir() if p.name.endswith(".json")}


@cache
def registry():
    """Each schema under its $id, as a user's validator is given them (docs/output.md)."""
    return referencing.Registry().with_resources(
        (s["$id"], DRAFT202012.create_resource(s)) for s in all_schemas().values())


def validator_of(command: str):
    return jsonschema.Draft202012Validator(schema_of(command), registry=registry(),
                                           format_checker=jsonschema.FormatChecker())


def check(doc: dict, command: str) -> None:
    assert doc["schema"] == f"kcache/{command}/1", doc.get("schema")
    validator = validator_of(command)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, [f"{list(e.absolute_path)}: {e.message[:200]}" for e in errors[:5]]
    _walk(doc, command, [])


def _walk(value, command: str, where: list) -> None:
    """Machine keys everywhere, no "-" standing for null, `entries`/`files` lists wherever they are."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not (where and where[-1] in NAME_MAPS):
                assert k.replace("_", "").isalnum() and k == k.lower() and " " not in k, (command, where, k)
            if k in ("entries", "files", "caches"):
                assert isinstance(v, list), (command, where, k, v)
            _walk(v, command, where + [k])
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _walk(v, command, where + [i])
    else:
        assert value != "-", (command, where)


@pytest.fixture(params=ROOTS, ids=[f"{w}-{n.split('/')[0]}" for w, n in ROOTS])
def real(request, tmp_path) -> tuple[str, Path]:
    where, name = request.param
    src = (FIXTURES if where == "repo" else SHARED_FIXTURES) / name
    if not src.is_dir():
        pytest.skip(f"fixture {src} not found (set KCACHE_SHARED_FIXTURES)")
    return name.split("/")[0], copy_tree(src, tmp_path / name.split("/")[0])


def run_json(kcache, command: str, *args, code: int = 0) -> dict:
    r = kcache(*args, "--json")
    assert r.exit_code == code, (args, r.stdout[-500:], r.stderr[-500:])
    doc = r.json()
    check(doc, command)
    return doc


def test_read_commands_match_their_schemas(kcache, real):
    name, root = real
    c = ("--cache-dir", str(root))
    ls = run_json(kcache, "ls", *c, "ls")
    assert ls["entry_count"] == ls["total"] == len(ls["entries"]) > 0
    limited = run_json(kcache, "ls", *c, "ls", "--limit", "1")
    assert limited["entry_count"] == 1 and limited["total"] == ls["total"]
    assert limited["size"] == limited["entries"][0]["size"]  # the shown entries' (the text footer's)
    stats = run_json(kcache, "stats", *c, "stats")
    assert stats["entry_count"] == ls["total"] and stats["size"] == ls["size"] == sum(e["size"] for e in ls["entries"])
    assert sum(g["entry_count"] for g in stats["by_space"].values()) + (stats["no_space"] or {"entry_count": 0})[
        "entry_count"] == stats["entry_count"]
    run_json(kcache, "dir", *c, "dir")
    for e in ls["entries"]:
        doc = run_json(kcache, "inspect", *c, "inspect", e["path"], code=0 if e["status"] == "complete" else 1)
        assert doc["file_count"] == e["file_count"] and isinstance(doc["files"], list)
    broken = any(e["status"] != "complete" for e in ls["entries"])
    run_json(kcache, "verify", *c, "verify", code=1 if broken else 0)
    if name == "triton":  # two kernels of one op: diff has something to say
        a, b = [e["hash"] for e in ls["entries"] if e["op"] == "add_kernel"][:2]
        assert run_json(kcache, "diff", *c, "diff", a, b)["differences"]


def test_delete_commands_match_their_schemas(kcache, real):
    _, root = real
    c = ("--cache-dir", str(root))
    prune = run_json(kcache, "prune", *c, "prune", "--max-size", "1B", "--dry-run", "--yes")
    assert prune["dry_run"] and prune["max_size"] == 1 and prune["entry_count"] == len(
        [r for r in prune["removed"] if r["what"] != "candidates"])
    run_json(kcache, "prune", *c, "prune", "--broken", "--dry-run")
    op = run_json(kcache, "ls", *c, "ls")["entries"][0]
    clear = run_json(kcache, "clear", *c, "clear", op["path"], "--dry-run")
    # removed, or kept with why (a tilus program a script still uses)
    assert clear["entry_count"] + len(clear["skipped"]) == 1 and clear["freed"] in (0, op["size"])


def test_archive_and_remote_commands_match_their_schemas(kcache, real, tmp_path):
    name, root = real
    c = ("--cache-dir", str(root))
    complete = [e for e in run_json(kcache, "ls", *c, "ls")["entries"] if e["status"] == "complete"]
    if not complete:  # the Triton fixture's kernels were copied from another home: verify --fix mends them
        r = kcache(*c, "verify", "--fix", "--json")
        check(r.json(), "verify")
        assert r.json()["fixed"], r.stderr
        complete = [e for e in run_json(kcache, "ls", *c, "ls")["entries"] if e["status"] == "complete"]
    assert complete, name
    tar = tmp_path / "x.tar"
    exp = run_json(kcache, "export", *c, "export", str(tar))
    assert exp["entry_count"] == len(exp["exported"]) and exp["file_count"] > 0
    empty = copy_tree(root, tmp_path / "other")
    # the same layout, without its complete entries: import and pull have work
    gone = run_json(kcache, "clear", "--cache-dir", str(empty), "clear", "--yes",
                    *[str(empty / Path(e["path"]).relative_to(root)) for e in complete])["removed"]
    assert len(gone) == len(complete)
    imp = run_json(kcache, "import", "--cache-dir", str(empty), "import", str(tar), "--dry-run")
    assert imp["imported"] == len(complete) and imp["file_count"] > 0
    url = f"file://{tmp_path / 'shared'}"
    (tmp_path / "shared").mkdir()
    push = run_json(kcache, "push", *c, "push", "--remote", url)
    assert push["pushed"] == len(complete) and push["size"] == sum(e["size"] for e in push["entries"]) > 0
    rls = run_json(kcache, "remote-ls", "remote", "ls", "--remote", url)
    assert rls["entry_count"] == len(rls["entries"]) == len(complete)
    run_json(kcache, "remote-stats", "remote", "stats", "--remote", url)
    dry = run_json(kcache, "pull", "--cache-dir", str(empty), "pull", "--remote", url, "--dry-run")
    assert dry["pulled"] == len(complete) and dry["size"] >= 0.9 * push["size"]  # real sizes, not 0
    pulled = run_json(kcache, "pull", "--cache-dir", str(empty), "pull", "--remote", url)
    assert pulled["size"] == dry["size"]
    run_json(kcache, "remote-prune", "remote", "prune", "--remote", url, "--max-size", "1B", "--dry-run")


def test_dir_all_and_stats_all_caches_wrap_their_lists(kcache, tmp_path):
    home = tmp_path / "home"
    copy_tree(FIXTURES / "hidet", home / ".cache" / "hidet")
    env = {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "KCACHE_DIR": None,
           "HIDET_CACHE_DIR": None, "TRITON_CACHE_DIR": None, "TRITON_HOME": None}
    r = kcache("dir", "--all", "--json", env=env)
    assert r.exit_code == 0, r.stderr
    check(r.json(), "dir")
    assert any(c["cache"] == "hidet" and c["entry_count"] == 5 for c in r.json()["caches"])
    triton = kcache("dir", "--all", "--json", env={**env, "TRITON_CACHE_DIR": str(tmp_path / "tc")}).json()
    assert any(c["cache"] == "triton" and "TRITON_CACHE_DIR" in c["reason"] for c in triton["caches"]), triton
    r = kcache("stats", "--all-caches", "--json", env=env)
    assert r.exit_code == 0, r.stderr
    check(r.json(), "stats")
    for command in ("prune", "clear"):
        r = kcache(command, "--all-caches", *(["--broken"] if command == "prune" else ["--op", "add"]), "--dry-run",
                   "--json", env=env)
        assert r.exit_code == 0, r.stderr
        check(r.json(), command)
        assert r.json()["caches"]


# what each command that has --all-caches needs to run over every cache (a new one must say it here)
MULTI_CACHE_ARGS = {"ls": [], "stats": [], "verify": [], "prune": ["--broken", "--dry-run"],
                    "clear": ["--op", "add_kernel", "--dry-run"]}


def test_every_multi_cache_document_matches_its_schema(kcache, tmp_path):
    """verify's multi-cache document (`caches`, one report each) was not in verify.json: every command
    that can work over several caches, in the default scope and with --all-caches, validates."""
    from typer.main import get_command

    from kcache_cli.cli.app import full_app

    commands = {name for name, cmd in get_command(full_app()).commands.items()
                if any("--all-caches" in p.opts for p in cmd.params)}
    assert commands == set(MULTI_CACHE_ARGS)
    home = tmp_path / "home"
    copy_tree(FIXTURES / "hidet", home / ".cache" / "hidet")
    copy_tree(FIXTURES / "triton" / "cache", home / ".triton" / "cache")
    env = {"HOME": str(home), "XDG_CACHE_HOME": None, "XDG_CONFIG_HOME": None, "KCACHE_CONFIG": None,
           "KCACHE_DIR": None, "HIDET_CACHE_DIR": None, "TRITON_CACHE_DIR": None, "TRITON_HOME": None}
    for command in sorted(commands):
        for scope in ([], ["--all-caches"]):
            r = kcache(command, *scope, *MULTI_CACHE_ARGS[command], "--json", env=env)
            assert r.exit_code in (0, 1), (command, scope, r.stderr)  # verify: the copied Triton kernels fail
            check(r.json(), command)
            roots = ({e["root"] for e in r.json()["entries"]} if command == "ls"
                     else {c["root"] for c in r.json()["caches"]})
            assert roots == {str(home / ".cache" / "hidet"), str(home / ".triton" / "cache")}, (command, roots)


def test_errors_are_json_with_their_schema(kcache, fixture_copy):
    root = fixture_copy("hidet")
    for args in (["ls", "deadbeef"], ["inspect", "nothing"], ["ls", "--min-size", "10"]):
        r = kcache("--cache-dir", root, *args, "--json")
        assert r.exit_code == 2
        check(r.json(), "error")


def test_every_schema_is_a_valid_schema_and_shipped():
    names = sorted(p.name for p in resources.files("kcache_cli").joinpath("schemas").iterdir()
                   if p.name.endswith(".json"))
    for must in ("ls", "stats", "inspect", "verify", "prune", "clear", "export", "import", "diff", "dir",
                 "push", "pull", "remote-ls", "remote-stats", "remote-prune", "error", "explain"):
        assert f"{must}.json" in names
    for n in names:
        schema = schema_of(n[:-5])
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$id"] == f"https://kcache.invalid/schemas/{n}"


def _command_names(cmd, words: tuple[str, ...] = ()):
    """Each command's name as options.command_name gives it ("ls", "remote-ls", "config" for the group that
    runs without a subcommand), walking the command tree."""
    subs = getattr(cmd, "commands", None)
    if subs is None or getattr(cmd, "invoke_without_command", False):
        if words:
            yield "-".join(words)
    for name, sub in (subs or {}).items():
        yield from _command_names(sub, (*words, name))


NO_JSON = {"log"}  # its output is the log's text: --json is a usage error (checked below)


def _emitted_schema_ids() -> set[str]:
    """Every `schema` kcache can write: kcache/<command>/1 for each command of the tree, and, read from the
    source, each literal `"schema": "kcache/..."` (a core record's, as the torch Mega-Cache documents) and
    each name given to schema_id() or to an output (cmd_oci's "push-oci")."""
    import ast

    from typer.main import get_command

    from kcache_cli.cli.app import full_app
    from kcache_cli.cli.options import schema_id

    ids = {schema_id(n) for n in _command_names(get_command(full_app())) if n not in NO_JSON}
    for path in (Path(__file__).parents[1] / "kcache_cli").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                ids |= {v.value for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)
                        and k.value == "schema" and isinstance(v, ast.Constant) and isinstance(v.value, str)}
            elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                    "schema_id", "_output"):
                ids |= {schema_id(a.value) for a in node.args
                        if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return ids


def test_every_schema_id_kcache_can_emit_has_its_file(kcache):
    """`inspect BLOB` said kcache/torch-mega-inspect/1 with no torch-mega-inspect.json (nor config set/unset/path
    theirs): each id found has its file, whose `schema` is that id."""
    ids = _emitted_schema_ids()
    assert {"kcache/ls/1", "kcache/remote-ls/1", "kcache/push-oci/1", "kcache/torch-mega-inspect/1",
            "kcache/config/1", "kcache/config-path/1", "kcache/error/1"} <= ids, sorted(ids)
    missing = []
    for sid in sorted(ids):
        name = sid.split("/")[1]
        if name not in all_schemas():
            missing.append(sid)
            continue
        consts = {node["const"] for _, node in _walk_schema(all_schemas()[name], name) if "const" in node}
        assert sid in consts, (sid, consts)
    assert missing == []
    for name in NO_JSON:
        r = kcache(name, "x", "--json")
        assert r.exit_code == 2 and r.json()["schema"] == "kcache/error/1" and "no --json" in r.json()["error"]


def test_torch_mega_documents_match_their_schemas(kcache, tmp_path):
    """inspect, verify, import (dry run, then for real) and export --format torch-mega of the blob torch
    saved, and inspect of a damaged one."""
    blob = tmp_path / "sin_cos_cpu.bin"
    blob.write_bytes((FIXTURES / "torch-mega" / "sin_cos_cpu.bin").read_bytes())
    inspected = run_json(kcache, "torch-mega-inspect", "inspect", str(blob))
    assert inspected["ok"] and len(inspected["artifacts"]) == 3
    assert run_json(kcache, "torch-mega-inspect", "verify", str(blob))["state"] == "ok"
    root = tmp_path / "inductor"
    dry = run_json(kcache, "torch-mega-import", "--cache-dir", str(root), "import", str(blob), "--dry-run")
    assert dry["dry_run"] and dry["imported"] == 3 and not root.exists()
    assert run_json(kcache, "torch-mega-import", "--cache-dir", str(root), "import", str(blob))["imported"] == 3
    assert run_json(kcache, "torch-mega-import", "--cache-dir", str(root), "import", str(blob))["skipped"] == 3
    out = tmp_path / "out.bin"
    exported = run_json(kcache, "torch-mega-export", "--cache-dir", str(root), "export", str(out), "--format",
                        "torch-mega", "--python", "/bin/false")
    assert len(exported["artifacts"]) == 3 and exported["size"] == out.stat().st_size
    cut = tmp_path / "cut.bin"
    cut.write_bytes(blob.read_bytes()[:5000])
    damaged = run_json(kcache, "torch-mega-inspect", "inspect", str(cut), code=1)
    assert not damaged["ok"] and damaged["problems"] and damaged["crc32"]["ok"] is False


def test_config_documents_match_their_schemas(kcache, fixture_copy):
    """config set, unset and path wrote kcache/config-set/1 ... with no schema: they have theirs now."""
    root = str(fixture_copy("hidet"))
    assert run_json(kcache, "config-set", "config", "set", "max-size", "2G")["all"]["max_size"] == 2 * 10**9
    assert run_json(kcache, "config-set", "config", "set", "--cache-dir", root, "max-age", "30d")["cache"]["exists"]
    assert run_json(kcache, "config", "config", "--cache-dir", root)["effective"]["max_age"] == 30 * 86400
    assert run_json(kcache, "config-unset", "config", "unset", "max-size")["all"]["max_size"] is None
    unset = run_json(kcache, "config-unset", "config", "unset", "--cache-dir", root, "max-age")
    assert unset["cache"]["max_age"] is None
    assert run_json(kcache, "config-path", "config", "path")["exists"]


def _walk_schema(value, where: str):
    """(where, node) for every schema object in value, its $defs included."""
    if isinstance(value, dict):
        yield where, value
        for k, v in value.items():
            yield from _walk_schema(v, f"{where}/{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk_schema(v, f"{where}/{i}")


def test_every_ref_resolves_and_every_definition_is_used():
    """Each $ref is "#/$defs/<name>" (its own file) or "defs.json#/$defs/<name>" (relative, so that it
    resolves by $id and beside the file alike), and resolves to a schema; each definition is used."""
    used: set[str] = set()
    for name, schema in all_schemas().items():
        resolver = registry().resolver(base_uri=schema["$id"])
        for where, node in _walk_schema(schema, name):
            assert where == name or "$id" not in node, f"{where}: one $id per file, at its top"
            if "$ref" not in node:
                continue
            ref = node["$ref"]
            file, _, pointer = ref.partition("#")
            assert file in ("", "defs.json") and pointer.startswith("/$defs/"), f"{where}: {ref}"
            assert file or pointer.split("/")[2] in schema.get("$defs", {}), f"{where}: {ref}"
            target = resolver.lookup(ref).contents
            assert isinstance(target, dict) and target, f"{where}: {ref}"
            used.add(f"{file or name + '.json'}#{pointer}")
    defined = {f"{name}.json#/$defs/{d}" for name, schema in all_schemas().items() for d in schema.get("$defs", {})}
    assert defined - used == set(), "definitions no schema uses"
    assert all_schemas()["defs"]["$defs"], "defs.json defines nothing"


def test_no_definition_is_written_twice():
    """A record or a map (a schema with properties or additionalProperties) is written once in the whole
    set: a second use is a $ref. Leaf types (`{"type": ["string", "null"]}`, a count with its minimum, a
    date-time) may repeat: a $ref to one is no shorter (3 lines, against 4 to 7) and hides the type from
    the reader. The key rule (snake_case) is written once, in defs.json."""
    seen: dict[str, str] = {}
    twice = []
    for name, schema in sorted(all_schemas().items()):
        for where, node in _walk_schema(schema, name):
            if "properties" in node or "additionalProperties" in node:
                text = json.dumps(node, sort_keys=True)
                if text in seen:
                    twice.append(f"{where} repeats {seen[text]}")
                seen.setdefault(text, where)
    assert twice == []
    rules = [where for name, schema in all_schemas().items() for where, node in _walk_schema(schema, name)
             if node.get("pattern") == MACHINE_KEY]
    assert rules == ["defs/$defs/machine_key"]


def test_shared_definitions_bind_the_commands_that_use_them(kcache, fixture_copy):
    """A $ref is not a comment: breaking what defs.json defines (an entry's status, a group's count, a
    machine key) fails ls, stats and prune documents that were valid."""
    root = str(fixture_copy("hidet"))
    ls = run_json(kcache, "ls", "--cache-dir", root, "ls")
    stats = run_json(kcache, "stats", "--cache-dir", root, "stats")
    prune = run_json(kcache, "prune", "--cache-dir", root, "prune", "--max-size", "1B", "--dry-run", "--yes")
    assert ls["entries"] and stats["by_layout"] and prune["removed"]
    broken = [(json.loads(json.dumps(ls)), "ls", lambda d: d["entries"][0].update(status="fine")),
              (json.loads(json.dumps(ls)), "ls", lambda d: d["entries"][0].update({"Bad Key": 1})),
              (json.loads(json.dumps(stats)), "stats", lambda d: d["by_layout"]["hidet"].update(entry_count=-1)),
              (json.loads(json.dumps(stats)), "stats", lambda d: d["biggest"][0].pop("apparent_size")),
              (json.loads(json.dumps(prune)), "prune", lambda d: d["removed"][0].pop("hash"))]
    for doc, command, breaking in broken:
        assert not list(validator_of(command).iter_errors(doc))
        breaking(doc)
        assert list(validator_of(command).iter_errors(doc)), (command, doc)


def test_the_default_scope_and_config_match_their_schemas(kcache, tmp_path):
    """Without --cache-dir: every cache found, entries with their `cache`, stats per cache with its budget."""
    home = tmp_path / "home"
    copy_tree(FIXTURES / "hidet", home / ".cache" / "hidet")
    copy_tree(FIXTURES / "triton" / "cache", home / ".triton" / "cache")
    env = {"HOME": str(home), "XDG_CACHE_HOME": None, "XDG_CONFIG_HOME": None, "KCACHE_CONFIG": None,
           "KCACHE_DIR": None, "HIDET_CACHE_DIR": None, "TRITON_CACHE_DIR": None, "TRITON_HOME": None}
    assert kcache("config", "set", "--cache", "hidet", "max-size", "1G", env=env).exit_code == 0
    config = kcache("config", "--json", env=env)
    check(config.json(), "config")
    assert config.json()["caches"] == [{"cache": "hidet", "max_size": 10**9, "max_age": None}]
    ls = kcache("ls", "--json", env=env).json()
    check(ls, "ls")
    assert {e["cache"] for e in ls["entries"]} == {"hidet", "triton"}
    stats = kcache("stats", "--json", env=env).json()
    check(stats, "stats")
    budgets = {s["cache"]: s["budget"] for s in stats["caches"]}
    assert budgets["triton"] is None and budgets["hidet"]["limit"] == 10**9


def test_stats_pictures_and_prune_summary_match_their_schemas(kcache, fixture_copy):
    """stats' by_age and reclaimable, prune --summary's groups: machine keys, counts as entry_count."""
    root = fixture_copy("hidet")
    stats = run_json(kcache, "stats", "--cache-dir", str(root), "stats")
    assert sum(g["entry_count"] for g in stats["by_age"].values()) == stats["entry_count"]
    plan = run_json(kcache, "prune", "--cache-dir", str(root), "prune", "--max-size", "1B", "--dry-run", "--yes",
                    "--summary")
    assert sum(g["entry_count"] for g in plan["summary"]) == len(plan["removed"])
    assert stats["reclaimable"]["command"] == "kcache prune --broken"


@pytest.mark.skipif(CXX is None, reason="g++ not found")
def test_build_matches_its_schema(kcache, tmp_path):
    """`build --json` of a real C++ task: built, then a hit, beside a task file that is missing."""
    from test_build import write_task

    task = write_task(tmp_path / "tasks", "plus", 7, kind="cc") / "task.txt"
    root = tmp_path / "cache"
    first = kcache("--cache-dir", root, "build", task, str(tmp_path / "nope.txt"), "--cxx", CXX, "--json")
    assert first.exit_code == 1, first.stderr  # one task failed: exit 1, the JSON still whole
    check(first.json(), "build")
    assert [r["status"] for r in first.json()["results"]] == ["built", "failed"]
    again = kcache("--cache-dir", root, "build", task, "--cxx", CXX, "--json")
    check(again.json(), "build")
    assert again.json()["hits"] == 1 and again.json()["results"][0]["path"] == first.json()["results"][0]["path"]
    from kcache_cli.layouts import hidet

    with pytest.MonkeyPatch.context() as mp:  # a hidet 0.6+ installed: it compiles the entry again
        mp.setattr(hidet, "installed_version", lambda: "0.6.1")
        recompiled = kcache("--cache-dir", root, "build", task, "--cxx", CXX, "--json")
    check(recompiled.json(), "build")
    assert recompiled.json()["results"][0]["recompiled_by"] == "hidet 0.6.1"


# ---- explain: entries of every layout, archives, blobs, images ---------------------------------------
def _explained(kcache, *args: str, env: dict | None = None) -> dict:
    """`explain --json ARGS`, checked against explain.json; its counts are its items' verdicts."""
    r = kcache("explain", *args, "--json", env=env)
    assert r.exit_code == 0, (args, r.stderr[-500:])
    doc = r.json()
    check(doc, "explain")
    assert [doc[v] for v in ("hit", "miss", "unknown")] == [
        sum(i["verdict"] == v for i in doc["items"]) for v in ("hit", "miss", "unknown")]
    return doc


def test_explain_of_each_real_cache_matches_its_schema(kcache, real, tmp_path):
    """explain.json was missing while explain said "kcache/explain/1"."""
    from test_explain import fake_python

    name, root = real
    py = fake_python(tmp_path, {"hidet": "0.6.1", "tilelang": "0.1.15", "triton": "3.9.0", "torch": None})
    doc = _explained(kcache, "--cache-dir", str(root), "--python", py, "--gpu", "sm_90a",
                     env={"TRITON_DEBUG": "0"})
    assert doc["items"] and doc["here"]["gpu_source"] == "--gpu" and doc["here"]["env"] == {"TRITON_DEBUG": "0"}
    assert doc["here"]["versions"]["torch"] is None and doc["here"]["problem"] is None
    if name in ("hidet", "tilelang"):
        assert {i["verdict"] for i in doc["items"]} <= {"hit", "unknown"}, doc["items"]


def test_explain_of_archives_blobs_and_other_caches_matches_its_schema(kcache, tmp_path):
    from test_explain import fake_python

    from kcache_cli.formats import megacache

    for name in ("jax", "numba", "torch_ext"):
        assert _explained(kcache, "--cache-dir", str(copy_tree(FIXTURES / name, tmp_path / name)))["items"], name
    hidet = copy_tree(FIXTURES / "hidet", tmp_path / "hidet")
    archive = tmp_path / "hidet.tar.gz"
    assert kcache("--cache-dir", hidet, "export", archive).exit_code == 0
    py = fake_python(tmp_path, {"hidet": "0.6.1", "torch": "2.12.0"})
    doc = _explained(kcache, str(archive), "--python", py, "--gpu", "sm_90a")
    assert doc["items"] and {i["path"] for i in doc["items"]} == {str(archive)}
    blob = tmp_path / "sin_cos_cpu.bin"
    copy_tree(FIXTURES / "torch-mega", tmp_path / "mega")
    (tmp_path / "mega" / "sin_cos_cpu.bin").rename(blob)
    assert all(i["recorded"] is None for i in _explained(kcache, str(blob), "--python", py)["items"])
    inductor = tmp_path / "inductor"
    assert kcache("--cache-dir", inductor, "import", blob).exit_code == 0
    exported = tmp_path / "out.bin"
    assert kcache("--cache-dir", inductor, "export", exported, "--format", "torch-mega", "--python", py).exit_code == 0
    assert {i["recorded"] for i in _explained(kcache, str(exported), "--python", py)["items"]} == {None}
    odd = tmp_path / "odd.bin"  # a type no layout takes: its layout is null, not "-"
    odd.write_bytes(megacache.build([("future_type", "k1", b"x"), ("inductor", "k2", b"y")]))
    items = {i["what"]: i for i in _explained(kcache, str(odd), "--python", py)["items"]}
    assert items["k1"]["layout"] is None and items["k2"]["layout"] == "inductor"
    broken = tmp_path / "broken-python"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    here = _explained(kcache, str(odd), "--python", str(broken))["here"]
    assert here["python"] is None and here["versions"] == {} and here["problem"]


def test_explain_of_an_image_matches_its_schema(kcache, oci_registry, tmp_path):
    root = copy_tree(FIXTURES / "numba", tmp_path / "numba")
    url = oci_registry.url("team/explain-schema:v1")
    assert kcache("push", "--remote", url, "--cache-dir", root).exit_code == 0
    doc = _explained(kcache, "--cache-dir", str(tmp_path / "here"), url)
    assert doc["items"] and {i["path"] for i in doc["items"]} == {url}
