"""tilus's damage matrix: the real cache (tests/fixtures/real/tilus, tilus 0.2.0: one program, the script
add_one linking to it), damaged one way per case. The probe (probe_tilus.py) measures what tilus does;
nothing here says it."""

from __future__ import annotations

from pathlib import Path

from loaders.matrix import (
    Case,
    add_file,
    chain,
    dangling_link,
    empty,
    garbage,
    link_to_good,
    missing,
    mode000,
    one_mtime,
    replace_text,
    truncated,
)

HERE = Path(__file__).resolve().parent
FIXTURE = HERE.parent / "fixtures" / "real" / "tilus"
PROGRAM = "programs/f006237ca7a5"
SCRIPT = "scripts/add_one/1-845a0ed6"


def _program() -> list[Case]:
    p = PROGRAM
    out = [Case("tilus", "program: pristine", p, lambda root: None)]
    for n in ("program.txt", "options.txt", "module/lib.so", "module/func_types.pickle", "module/source.cu",
              "module/nvcc_output.txt", "module/compile.sh", ".lock"):
        out.append(Case("tilus", f"{n} missing", p, missing(f"{p}/{n}")))
    out += [
        Case("tilus", "module/lib.so empty", p, empty(f"{p}/module/lib.so")),
        Case("tilus", "module/lib.so truncated", p, truncated(f"{p}/module/lib.so")),
        Case("tilus", "module/lib.so garbage", p, garbage(f"{p}/module/lib.so")),
        Case("tilus", "module/lib.so link to a good copy", p, link_to_good(f"{p}/module/lib.so")),
        Case("tilus", "module/lib.so dangling link", p, dangling_link(f"{p}/module/lib.so")),
        Case("tilus", "module/lib.so mode 000", p, mode000(f"{p}/module/lib.so"), as_owner=True),
        Case("tilus", "program.txt mode 000", p, mode000(f"{p}/program.txt"), as_owner=True),
        Case("tilus", "program.txt empty", p, empty(f"{p}/program.txt")),
        Case("tilus", "program.txt edited", p, replace_text(f"{p}/program.txt", "def add_one():\n    pass\n")),
        Case("tilus", "options.txt garbage", p, garbage(f"{p}/options.txt")),
        Case("tilus", "module/func_types.pickle garbage", p, garbage(f"{p}/module/func_types.pickle")),
        Case("tilus", "junk file added", p, add_file(f"{p}/junk.txt")),
        Case("tilus", "program: one mtime for every file", p, one_mtime()),
        Case("tilus", "killed while nvcc wrote lib.so", p,
             chain(truncated(f"{p}/module/lib.so"), missing(f"{p}/module/nvcc_output.txt"))),
        Case("tilus", "killed before nvcc", p,
             chain(missing(f"{p}/module/lib.so"), missing(f"{p}/module/nvcc_output.txt"))),
    ]
    return out


def _script() -> list[Case]:
    s = SCRIPT
    out = [Case("tilus", "script: pristine", s, lambda root: None)]
    for n in ("dispatch_table.pickle", "dispatch_table.txt", "meta.json", "source.txt", "schedule.txt",
              "build_options.txt", "programs/0", "latency"):
        out.append(Case("tilus", f"script {n} missing", s, missing(f"{s}/{n}")))
    out += [
        Case("tilus", "script dispatch_table.pickle empty", s, empty(f"{s}/dispatch_table.pickle")),
        Case("tilus", "script dispatch_table.pickle garbage", s, garbage(f"{s}/dispatch_table.pickle")),
        Case("tilus", "script dispatch_table.pickle truncated", s, truncated(f"{s}/dispatch_table.pickle")),
        Case("tilus", "script dispatch_table.pickle mode 000", s, mode000(f"{s}/dispatch_table.pickle"),
             as_owner=True),
        Case("tilus", "script programs/0 dangling link", s, dangling_link(f"{s}/programs/0")),
        Case("tilus", "script latency/1024/0 dangling link", s, dangling_link(f"{s}/latency/1024/0")),
        Case("tilus", "script: one mtime for every file", s, one_mtime()),
        Case("tilus", "script: its program's lib.so missing", s, missing(f"{PROGRAM}/module/lib.so")),
        Case("tilus", "script: its program's program.txt missing", s, missing(f"{PROGRAM}/program.txt")),
        Case("tilus", "script: its program's lib.so truncated", s, truncated(f"{PROGRAM}/module/lib.so")),
        Case("tilus", "script: killed before linking its programs", s,
             chain(missing(f"{s}/programs"), missing(f"{s}/dispatch_table.pickle"),
                   missing(f"{s}/dispatch_table.txt"), missing(f"{s}/latency"))),
    ]
    return out


def cases() -> list[Case]:
    return [*_program(), *_script()]
