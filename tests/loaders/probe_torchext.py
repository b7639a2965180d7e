"""Run by the torch venv's python (tests/loaders/venvs.py "torch"): torch's own `load_inline` of the small
extension of tests/fixtures/real/make/make_torch.py with $TORCH_EXTENSIONS_DIR set, printing one JSON
line: {"value": 42, "rebuilt": bool} (rebuilt: the module's mtime changed, ninja built it again), or
{"error": "..."} when torch's import of the module failed. A `lock` left in the build directory makes
torch wait for ever: the caller's timeout is the verdict then. With arguments, one load per argument in this
one process, argument k loading `x + 1 + k` (a changed source: torch builds it as kc_add_one_v1, ...), each
printing its line, rebuilt then meaning the module that load imported."""

import json
import os
import sys

from torch.utils.cpp_extension import load_inline

NAME = "kc_add_one"
SOURCE = "int64_t kc_add_one(int64_t x) {{ return x + {}; }}"


def mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def main() -> None:
    where = os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], NAME)
    for k in map(int, sys.argv[1:] or ["0"]):
        before = {n: mtime(os.path.join(where, n)) for n in os.listdir(where)} if os.path.isdir(where) else {}
        try:
            source = SOURCE.format(1 + k)
            m = load_inline(name=NAME, cpp_sources=[source], functions=[NAME], extra_cflags=["-Os", "-g0"])
            module = os.path.basename(m.__file__)
            out: dict = {"value": m.kc_add_one(41)}
        except Exception as exc:  # what torch raised is the verdict
            module, out = f"{NAME}.so", {"error": f"{type(exc).__name__}: {exc}"[:400]}
        out["rebuilt"] = mtime(os.path.join(where, module)) != before.get(module)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
