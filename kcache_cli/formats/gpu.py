"""CUDA archs: one grammar for arch names, what a compile command builds for, which GPUs run what,
and the local GPUs (nvidia-smi). Only the standard library; nvidia-smi runs only when asked."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Callable, Iterable, Mapping, NamedTuple

# sm_90, sm_90a, sm_100f, compute_90: the one arch grammar of kcache.
ARCH_RE = re.compile(r"^(sm|compute)_(\d+)([af]?)$")
CPU = "cpu"  # the arch word of code that runs on the host: any node runs it


class CudaArch(NamedTuple):
    kind: str  # "sm" (SASS) or "compute" (PTX)
    cc: tuple[int, int]  # compute capability (major, minor)
    suffix: str  # "", "a" (arch-specific) or "f" (family)


def cuda_archs(arch: str) -> list[CudaArch]:
    """Each CUDA arch named in "sm_90a,compute_90"; other words are ignored."""
    parsed = []
    for item in arch.split(","):
        m = ARCH_RE.match(item.strip())
        if m:
            n = int(m.group(2))
            parsed.append(CudaArch(m.group(1), (n // 10, n % 10), m.group(3)))
    return parsed


def archs_from_command(command: str) -> str | None:
    """CUDA archs from an nvcc command line: -gencode code=..., else -arch/--gpu-architecture."""
    found: list[str] = []
    if "code=" in command:
        for codes in re.findall(r"code=\[?([\w,]+)\]?", command):
            found.extend(c for c in codes.split(",") if ARCH_RE.match(c))
    if not found and "-arch" in command:  # "--gpu-architecture" holds it too
        for a in re.findall(r"(?:-arch|--gpu-architecture)[= ]+((?:sm|compute)_\d+[af]?)\b", command):
            found.append(a)
            if a.startswith("sm_"):  # nvcc -arch=sm_XY also embeds compute_XY PTX
                found.append("compute_" + a[3:])
    out = list(dict.fromkeys(found))
    return ",".join(out) or None


def arch_runs_on(arch: str, caps: Iterable[tuple[int, int]]) -> bool | None:
    """Whether code built for `arch` ("sm_90a", "sm_80,compute_80") runs on any GPU of compute
    capability in `caps`; None when `arch` names no CUDA arch."""
    parsed = cuda_archs(arch)
    if not parsed:
        return None
    for cap in caps:
        for kind, cc, suffix in parsed:
            if suffix == "a":
                ok = cc == cap
            elif kind == "sm":  # SASS runs on the same major, same or newer minor
                ok = cc[0] == cap[0] and cc[1] <= cap[1]
            else:  # PTX is compiled by the driver for any newer GPU
                ok = cc <= cap
            if ok:
                return True
    return False


def runs_on_node(arch: str, node: Iterable[str], exact: bool = False) -> bool:
    """Whether code built for `arch` (an arch word: sm_80, sm_90a, compute_90, gfx90a; `cpu` runs anywhere)
    is used on a node whose GPUs are the arch words `node`: CUDA code by the driver's rule for a binary
    (arch_runs_on), or with `exact` only on a GPU of the compute capability it names (a consumer that
    keys its cache by the capability, as Triton does); another word only on a GPU of the same word."""
    if arch == CPU:
        return True
    node = list(node)
    caps = [a.cc for n in node for a in cuda_archs(n)]
    built = cuda_archs(arch)
    if not (caps and built):
        return arch in node
    if exact:
        return any(a.cc == cap for a in built for cap in caps)
    return bool(arch_runs_on(arch, caps))


def local_compute_caps(timeout: float = 10.0) -> tuple[tuple[int, int], ...] | None:
    """Compute capabilities of this machine's GPUs from nvidia-smi, in its order; None when there is
    no GPU (or no nvidia-smi) to ask."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             stdin=subprocess.DEVNULL, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    caps = []
    for line in out.stdout.splitlines():
        m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", line)
        if m:
            caps.append((int(m.group(1)), int(m.group(2))))
    return tuple(caps) if out.returncode == 0 and caps else None


def local_gpu_arch(timeout: float = 30.0) -> str | None:
    """The first local GPU's arch (`9.0` -> `sm_90`), or None without a GPU."""
    caps = local_compute_caps(timeout)
    return f"sm_{caps[0][0]}{caps[0][1]}" if caps else None


class ArchFit(NamedTuple):
    """Which entries' archs run on this machine's GPUs."""

    gpus: tuple[tuple[int, int], ...] | None  # compute capabilities found; None: no GPU to ask
    fits: dict[str, bool | None]  # key -> runs here (None: unknown, no CUDA arch or no GPU)
    checked: tuple[str, ...]  # the keys whose arch names a CUDA arch

    @property
    def misfits(self) -> list[str]:
        return [k for k in self.checked if self.fits.get(k) is False]


def arch_fit(archs: dict[str, str | None], rules: Mapping[str, Callable[[str, list[str]], bool]]) -> ArchFit:
    """For each key (an entry's relpath) and the arch its entry was built for, whether its consumer uses it
    here, by the key's rule in `rules` (its layout's Layout.runs_on, given the GPUs as arch words).
    nvidia-smi is asked only when some arch names a CUDA arch."""
    checked = tuple(k for k, a in archs.items() if a and cuda_archs(a))
    caps = local_compute_caps() if checked else None
    node = [f"sm_{a}{b}" for a, b in caps or ()]
    fits = {k: (rules[k](archs[k] or "", node) if caps and k in checked else None) for k in archs}
    return ArchFit(caps, fits, checked)
