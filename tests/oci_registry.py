"""A real OCI registry for the oci:// tests: Debian's docker-registry (the CNCF distribution registry)
on a free loopback port, its storage in the test's temp dir, deletes enabled; skopeo as a client that
is not kcache, to check what kcache pushed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from redis_server import free_port

DOCKER_REGISTRY = shutil.which("docker-registry") or (
    "/usr/bin/docker-registry" if os.access("/usr/bin/docker-registry", os.X_OK) else None)
SKOPEO = shutil.which("skopeo") or ("/usr/bin/skopeo" if os.access("/usr/bin/skopeo", os.X_OK) else None)


class Registry:
    """One docker-registry process; `.host` (127.0.0.1:PORT), `.url(repo_tag)` (oci+http://...)."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.log = open(workdir / "registry.log", "wb")
        for _ in range(5):  # a port another test worker took since free_port(): another port
            if self._start(free_port()):
                return
        raise RuntimeError(f"docker-registry did not start on {self.host}: "
                           f"{(workdir / 'registry.log').read_text()[-500:]}")

    def _start(self, port: int) -> bool:
        """Start on `port`; True once /v2/ answers and this process still runs (a registry that could not
        bind exits at once, while another worker's on that port would answer for it)."""
        self.port = port
        self.host = f"127.0.0.1:{self.port}"
        config = self.workdir / "config.yml"
        config.write_text(f"""version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {self.workdir / 'data'}
  delete:
    enabled: true
http:
  addr: {self.host}
""")
        self.proc = subprocess.Popen([DOCKER_REGISTRY, "serve", str(config)], stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 15
        while self.proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=0.5) as r:
                    if r.status == 200:
                        time.sleep(0.3)
                        if self.proc.poll() is None:
                            return True
            except OSError:
                pass
            time.sleep(0.05)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        return False

    def url(self, repo_tag: str) -> str:
        return f"oci+http://{self.host}/{repo_tag}"

    def stop(self) -> None:
        if self.proc.poll() is None:  # killed: its storage is a temp dir, and it drains for long on SIGTERM
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def skopeo(*args: str) -> str:
    """skopeo's stdout (it must succeed); TLS off for the loopback registry."""
    run = subprocess.run([SKOPEO, *args], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    return run.stdout


def skopeo_inspect(host: str, repo_tag: str) -> dict:
    return json.loads(skopeo("inspect", "--tls-verify=false", f"docker://{host}/{repo_tag}"))


@pytest.fixture(scope="module")
def oci_registry(tmp_path_factory):
    """One registry for a test module (starting one takes a moment); tests use their own repositories."""
    if DOCKER_REGISTRY is None or SKOPEO is None:
        pytest.skip("docker-registry or skopeo not found")
    reg = Registry(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.stop()
