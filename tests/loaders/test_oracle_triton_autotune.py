"""The loader oracle for Triton 3.9's autotuner results (`@triton.autotune(..., cache_results=True)`): the
autotuner's own `check_disk_cache` (tests/loaders/probe_triton_autotune.py) against a key directory that
holds only `<fn>.autotune.json`, in a cache Triton 3.9 made. As written, Triton takes the timings from it
(no benchmark) and kcache says complete; cut short, emptied or without its `configs_timings`, Triton's
lookup raises on every call and never writes it again, so kcache must say corrupt."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import run_kcache
from loaders.test_oracle_triton import make_cache
from loaders.venvs import python_for

pytestmark = pytest.mark.slow
PROBE = Path(__file__).with_name("probe_triton_autotune.py")
DAMAGE = {
    "cut short": lambda data: data[:100],
    "emptied": lambda data: b"",
    "without configs_timings": lambda data: json.dumps({"key": json.loads(data)["key"]}).encode(),
    "a config's kwargs not a map": lambda data: _timings(data, lambda t: [[{**t[0][0], "kwargs": [64]}, t[0][1]]]),
    "a kwarg a list": lambda data: _timings(data, lambda t: [[{**t[0][0], "kwargs": {"BLOCK": [64]}}, t[0][1]]]),
    "timings that do not compare": lambda data: _timings(data, lambda t: [t[0], [t[1][0], "fast"]]),
}


def _timings(data: bytes, change) -> bytes:
    doc = json.loads(data)
    doc["configs_timings"] = change(doc["configs_timings"])
    return json.dumps(doc).encode()


def tuned(root: Path) -> dict:
    done = subprocess.run([str(python_for("triton39")), str(PROBE)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TRITON_CACHE_DIR=str(root), HOME=str(root.parent)))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def status(root: Path) -> tuple[str, int]:
    """(kcache's status of the autotuner's key directory, verify's exit status)."""
    rows = run_kcache("--cache-dir", root, "ls", "--json").json()["entries"]
    [row] = [r for r in rows if r["op"] == "kc_tuned"]
    return row["status"], run_kcache("--cache-dir", root, "verify").exit_code


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, bytes]:
    root = tmp_path_factory.mktemp("autotune") / "cache"
    make_cache("triton39", root)
    assert tuned(root) == {"used": False}  # benchmarked, and written
    assert tuned(root) == {"used": True}
    [results] = root.glob("*/kc_tuned.autotune.json")
    assert status(root) == ("complete", 0)
    return root, results.read_bytes()


@pytest.mark.parametrize("case", list(DAMAGE))
def test_autotuner_results_triton_cannot_read_are_corrupt(made, case):
    root, data = made
    [results] = root.glob("*/kc_tuned.autotune.json")
    results.write_bytes(DAMAGE[case](data))
    try:
        assert status(root) == ("corrupt", 1)
        assert "error" in tuned(root) and "error" in tuned(root)  # raises every time, never written again
    finally:
        results.write_bytes(data)
    assert tuned(root) == {"used": True}
