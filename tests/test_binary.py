"""kcache_cli.formats.binary: CUDA archs and exported symbols from the bytes of kernel binaries.

Three groups: the real cache fixtures (skipped when absent), real nvcc/g++ builds in
tmp_path (marked ``nvcc``), and synthetic/hostile inputs that must never raise.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kcache_cli.formats.binary import BinaryInfo, read_binary

# ----------------------------------------------------------------------- fixtures


def _fixtures_root() -> Path | None:
    env = os.environ.get("KCACHE_FIXTURES")
    candidates = [Path(env)] if env else []
    candidates += [
        Path(__file__).parent / "fixtures" / "real",
        Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real",
    ]
    for c in candidates:
        if c.is_dir():
            return c
    return None


FIXTURES = _fixtures_root()
HIDET_CUDA_SO = "hidet/ops/cuda_space_0/softmax/ad252b064b266eea/lib.so"
HIDET_CPU_SO = "hidet/ops/cpu_space_0/matmul/064b4a6c035246e8/lib.so"
TILUS_SO = "tilus/programs/f006237ca7a5/module/lib.so"
TILELANG_CUBIN = ("tilelang/0.1.15/cuda-binaries/"
                  "4bc9129df33af894bfd1791f214310dc6766749861079ac4b7eafa97e565e687/kernel.cubin")
TILELANG_SO = ("tilelang/0.1.15/linux-x86_64/kernels/"
               "cb68ca6910905a22415eeff34244c6b161f51a79389abd03689b1d0f2155a46e/executable.so")


def fixture(rel: str) -> Path:
    if FIXTURES is None:
        pytest.skip("real fixtures not found: set KCACHE_FIXTURES, or provide tests/fixtures/real "
                    "or ../shared/fixtures/real")
    p = FIXTURES / rel
    if not p.is_file():
        pytest.skip(f"fixture {rel} missing under {FIXTURES}")
    return p


def test_fixture_hidet_cuda_so():
    info = read_binary(fixture(HIDET_CUDA_SO))
    assert info.error is None
    assert (info.format, info.machine) == ("elf-so", "x86-64")
    assert info.archs == ("sm_90a",)
    assert info.ptx_archs == ()
    for name in ("hidet_launch_0", "hidet_get_input_shape", "hidet_get_output_shape"):
        assert name in info.symbols
    assert list(info.symbols) == sorted(set(info.symbols))


def test_fixture_hidet_cpu_so_has_no_archs():
    info = read_binary(str(fixture(HIDET_CPU_SO)))
    assert info.error is None
    assert (info.format, info.machine, info.archs, info.ptx_archs) == ("elf-so", "x86-64", (), ())
    assert "hidet_launch_0" in info.symbols


def test_fixture_tilus_so():
    info = read_binary(fixture(TILUS_SO))
    assert info.error is None
    assert info.format == "elf-so"
    assert info.archs == ("sm_90a",)
    assert "_Z12tilus_launchi6void_pS_" in info.symbols  # mangled, as stored
    assert "__tvm_ffi_launch" in info.symbols
    assert "tilus_context" in info.symbols  # an exported OBJECT


def test_fixture_tilelang_cubin():
    info = read_binary(fixture(TILELANG_CUBIN))
    assert info.error is None
    assert (info.format, info.machine) == ("cubin", "cuda")
    assert info.archs == ("sm_90a",)
    assert info.symbols == ("main_kernel",)


def test_fixture_tilelang_executable_so_embedded_cubin():
    # no .nv_fatbin: TVM keeps the cubin in __tvm_ffi__library_bin (.rodata)
    info = read_binary(fixture(TILELANG_SO))
    assert info.error is None
    assert info.format == "elf-so"
    assert info.archs == ("sm_90a",)
    assert "__tvm_ffi_main" in info.symbols


def test_fixture_truncated_so_never_raises(tmp_path):
    data = fixture(HIDET_CUDA_SO).read_bytes()
    fb = 0x30D8  # .nv_fatbin's offset in this file: cut inside headers, entries, payloads
    cuts = {1, 4, 15, 16, 52, 63, 64, 100, 1000, fb, fb + 20, fb + 200, fb + 1800,
            len(data) // 2, len(data) - 64, len(data) - 1}
    _check_prefixes(tmp_path, data, sorted(cuts))


# --------------------------------------------------------------- real nvcc builds


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    return "/usr/local/bin/nvcc" if os.path.exists("/usr/local/bin/nvcc") else None


NVCC = _nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (PATH or /usr/local/bin/nvcc)")

KERNEL_SRC = r"""
extern "C" __global__ void addk(float* a, float b) { a[threadIdx.x] += b; }
template <int N> __global__ void scalek(float* a) { a[threadIdx.x] *= N; }
template __global__ void scalek<3>(float*);
__device__ __noinline__ float helper(float x) { return x * 3.0f; }
__global__ void usehelper(float* a) { a[0] = helper(a[1]); }
extern "C" void launch(float* a) { addk<<<1, 32>>>(a, 1.0f); }
"""
KERNELS = ("_Z6scalekILi3EEvPf", "_Z9usehelperPf", "addk")


def _nvcc_build(tmp_path: Path, out: str, *args: str) -> Path:
    src = tmp_path / "k.cu"
    src.write_text(KERNEL_SRC)
    target = tmp_path / out
    proc = subprocess.run([NVCC, *args, str(src), "-o", str(target)], capture_output=True,
                          text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"nvcc {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return target


SHARED = ("-shared", "-Xcompiler", "-fPIC", "-O3")


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize(
    "args, archs, ptx",
    [
        (("-arch=sm_90",), ("sm_90",), ("compute_90",)),
        (("-gencode", "arch=compute_90a,code=sm_90a"), ("sm_90a",), ()),
        (("-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
          "-gencode", "arch=compute_90,code=compute_90"), ("sm_80", "sm_90"), ("compute_90",)),
        (("-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
          "-gencode", "arch=compute_90,code=compute_90", "--compress-mode=none"),
         ("sm_80", "sm_90"), ("compute_90",)),
        (("-gencode", "arch=compute_100f,code=sm_100f"), ("sm_100f",), ()),
        (("-gencode", "arch=compute_90a,code=[sm_90a,compute_90a]", "-gencode",
          "arch=compute_120a,code=sm_120a"), ("sm_90a", "sm_120a"), ("compute_90a",)),
    ],
    ids=["sm_90", "sm_90a", "multi", "multi-uncompressed", "sm_100f", "sm_90a+sm_120a"],
)
def test_nvcc_shared_object(tmp_path, args, archs, ptx):
    info = read_binary(_nvcc_build(tmp_path, "k.so", *SHARED, *args))
    assert info.error is None
    assert (info.format, info.machine) == ("elf-so", "x86-64")
    assert info.archs == archs  # sorted by SM number: sm_90a before sm_120a
    assert info.ptx_archs == ptx
    assert "launch" in info.symbols


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("arch, expected", [("sm_80", "sm_80"), ("sm_90", "sm_90"),
                                            ("sm_90a", "sm_90a"), ("sm_100a", "sm_100a"),
                                            ("sm_100f", "sm_100f"), ("sm_120", "sm_120")])
def test_nvcc_cubin(tmp_path, arch, expected):
    info = read_binary(_nvcc_build(tmp_path, "k.cubin", "-cubin", f"-arch={arch}"))
    assert info.error is None
    assert (info.format, info.machine) == ("cubin", "cuda")
    assert info.archs == (expected,)
    assert info.ptx_archs == ()
    # kernels only: the template instance, the extern "C" one; not the device function
    assert info.symbols == KERNELS


@pytest.mark.nvcc
@needs_nvcc
def test_nvcc_debug_cubin_lists_only_kernels(tmp_path):
    info = read_binary(_nvcc_build(tmp_path, "k.cubin", "-cubin", "-G", "-arch=sm_90"))
    assert info.archs == ("sm_90",)
    assert info.symbols == KERNELS  # helper is a GLOBAL FUNC here, but not an entry


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("mode", ["none", "default", "speed"])
def test_nvcc_fatbin_file(tmp_path, mode):
    info = read_binary(_nvcc_build(tmp_path, "k.fatbin", "-fatbin", "-arch=sm_90a",
                                   f"--compress-mode={mode}"))
    assert info.error is None
    assert (info.format, info.machine) == ("fatbin", "cuda")
    assert info.archs == ("sm_90a",)
    # nvcc 13 -arch=sm_90a embeds compute_90 PTX as well as compute_90a
    assert "compute_90a" in info.ptx_archs
    assert info.symbols == KERNELS  # from the (small, so uncompressed) embedded cubin


@pytest.mark.nvcc
@needs_nvcc
def test_nvcc_fatbin_all_compressed(tmp_path):
    for mode in ("speed", "size"):  # LZ4, zstd
        info = read_binary(_nvcc_build(tmp_path, f"k-{mode}.fatbin", "-fatbin", "-arch=sm_90a",
                                       f"--compress-mode={mode}", "-Xfatbin", "-compress-all"))
        assert info.error is None
        assert info.archs == ("sm_90a",)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_gxx_shared_object(tmp_path):
    src = tmp_path / "cpu.cc"
    src.write_text(
        'extern "C" int cpu_entry(int x) { return x + 1; }\n'
        'extern "C" int exported_table[4] = {1, 2, 3, 4};\n'
        "int cpp_func(double d) { return (int)d; }\n"
        "static int local_func(int x) { return x * 2; }\n"
        '__attribute__((visibility("hidden"))) int hidden_func(int x) { return local_func(x); }\n'
    )
    so = tmp_path / "libcpu.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O2", str(src), "-o", str(so)], check=True,
                   timeout=300)
    info = read_binary(so)
    assert info.error is None
    assert info.format == "elf-so" and info.archs == () and info.ptx_archs == ()
    assert {"cpu_entry", "exported_table", "_Z8cpp_funcd"} <= set(info.symbols)
    assert "hidden_func" not in " ".join(info.symbols)
    assert "local_func" not in " ".join(info.symbols)
    assert "printf" not in info.symbols  # undefined symbols are imports, not exports


# ---------------------------------------------------------- synthetic binaries


def fatbin_entry(kind: int, arch: int, payload: bytes, flags: int = 0x11,
                 header_size: int = 64, size: int | None = None) -> bytes:
    size = len(payload) if size is None else size
    hdr = struct.pack("<HHIQIIHHIIIQ", kind, 0x101, header_size, size, 0, 0, 0, 1, arch,
                      0, 0, flags)
    return hdr + b"\0" * (header_size - len(hdr)) + payload


def fatbin(*entries: bytes, size: int | None = None) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body) if size is None else size) + body


def elf(sections: list[tuple[str, int, bytes, int, int]], *, machine: int = 62,
        e_flags: int = 0, osabi: int = 0, abiversion: int = 0, e_type: int = 3) -> bytes:
    """ELF64 LE image; sections are (name, sh_type, data, sh_link, sh_entsize)."""
    names = b"\0"
    name_offs = []
    for name, *_ in sections:
        name_offs.append(len(names))
        names += name.encode() + b"\0"
    shstr_off = len(names)
    names += b".shstrtab\0"
    all_secs = list(sections) + [(".shstrtab", 3, names, 0, 0)]
    name_offs.append(shstr_off)
    body = b""
    offsets = []
    for _name, _t, data, _l, _e in all_secs:
        offsets.append(64 + len(body))
        body += data + b"\0" * (-len(data) % 8)
    shoff = 64 + len(body)
    shdrs = b"\0" * 64
    for (_name, typ, data, link, entsize), off, noff in zip(all_secs, offsets, name_offs):
        shdrs += struct.pack("<IIQQQQIIQQ", noff, typ, 2, 0, off, len(data), link, 0, 8, entsize)
    ident = b"\x7fELF" + bytes([2, 1, 1, osabi, abiversion]) + b"\0" * 7
    hdr = ident + struct.pack("<HHIQQQIHHHHHH", e_type, machine, 1, 0, 0, shoff, e_flags, 64,
                              56, 0, 64, len(all_secs) + 1, len(all_secs))
    return hdr + body + shdrs


def symtab(names: list[tuple[str, int, int, int]]) -> tuple[bytes, bytes]:
    """(symbols, strings) for entries (name, st_info, st_other, st_shndx)."""
    strs = b"\0"
    syms = b"\0" * 24
    for name, info, other, shndx in names:
        syms += struct.pack("<IBBHQQ", len(strs), info, other, shndx, 0, 0)
        strs += name.encode() + b"\0"
    return syms, strs


def host_so(fatbin_bytes: bytes = b"", exports=("launch",)) -> bytes:
    syms, strs = symtab([(n, 0x12, 0, 5) for n in exports] + [("undef_import", 0x12, 0, 0),
                                                               ("a_local", 0x02, 0, 5)])
    secs = [(".dynsym", 11, syms, 2, 24), (".dynstr", 3, strs, 0, 0)]
    if fatbin_bytes:
        secs.append((".nv_fatbin", 1, fatbin_bytes, 0, 0))
    return elf(secs)


def cubin(e_flags: int, abiversion: int = 8, compat: bytes | None = None,
          tkinfo: bytes | None = None, kernels=("k",)) -> bytes:
    syms, strs = symtab([(k, 0x12, 0x10, 4) for k in kernels] + [("devfn", 0x12, 0, 4)])
    secs = [(".symtab", 2, syms, 2, 24), (".strtab", 3, strs, 0, 0),
            (".text.k", 1, b"\0" * 16, 0, 0)]
    if compat is not None:
        secs.append((".nv.compat", 0x70000086, compat, 0, 0))
    if tkinfo is not None:
        secs.append((".note.nv.tkinfo", 7, tkinfo, 0, 0))
    return elf(secs, machine=190, e_flags=e_flags, osabi=0x41, abiversion=abiversion, e_type=2)


def write(tmp_path: Path, data: bytes, name: str = "f.bin") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_synthetic_host_so_with_fatbin(tmp_path):
    fb = fatbin(fatbin_entry(2, 80, b"sass80"), fatbin_entry(2, 90, b"sass90a", flags=0x100011),
                fatbin_entry(1, 90, b"ptx"), fatbin_entry(8, 90, b"lto-ir"))
    fb2 = fatbin(fatbin_entry(2, 100, b"x", flags=0x200011),
                 fatbin_entry(1, 120, b"p", flags=0x100011))
    info = read_binary(write(tmp_path, host_so(fb + fb2, exports=("launch", "hidet_launch_0"))))
    assert info.error is None
    assert info.archs == ("sm_80", "sm_90a", "sm_100f")
    assert info.ptx_archs == ("compute_90", "compute_120a")
    assert info.symbols == ("hidet_launch_0", "launch")


@pytest.mark.parametrize("e_flags, abiversion, compat, tkinfo, expected", [
    (0x06005A04, 8, None, None, "sm_90"),  # nvcc 13 sm_90
    (0x06006402, 8, None, None, "sm_100"),  # nvcc 13 sm_100
    (0x06005A04, 8, b"\x02\x09\x01\x00\x02\x02\x01\x00\x04\x0b\x08\x00" + b"\0" * 8, None,
     "sm_90a"),  # nvcc 13 sm_90a: .nv.compat attribute 9
    (0x0600640A, 8, None, None, "sm_100a"),  # EF_CUDA_ACCELERATORS (0x8) of ABI 8
    (0x005A0D5A, 7, None, None, "sm_90a"),  # ABI 7: SM in low byte, 0x800 = "a"
    (0x00500550, 7, None, None, "sm_80"),  # ABI 7 sm_80, virtual compute_80
    (0x003C0D3C, 7, None, None, "sm_60"),  # old sm_60 cubins (CUPTI) set 0x800 too: no "a"
    (0x06006402, 8, None, b"....ptxas\0-arch sm_100f -m 64 \0", "sm_100f"),
    (0x06006402, 8, None, b"-arch sm_120a", "sm_100"),  # disagreeing command line ignored
])
def test_synthetic_cubin_flags(tmp_path, e_flags, abiversion, compat, tkinfo, expected):
    info = read_binary(write(tmp_path, cubin(e_flags, abiversion, compat, tkinfo)))
    assert info.error is None
    assert info.format == "cubin"
    assert info.archs == (expected,)
    assert info.symbols == ("k",)  # entry-flagged kernels only, not devfn


def test_embedded_in_rodata(tmp_path):
    # TVM/tilelang style: a length-prefixed cubin in .rodata, no .nv_fatbin section
    image = cubin(0x06005A04, compat=b"\x02\x09\x01\x00")
    blob = b"\0" * 24 + struct.pack("<Q", len(image)) + image + b"tail"
    syms, strs = symtab([("__tvm_ffi_main", 0x12, 0, 3)])
    data = elf([(".dynsym", 11, syms, 2, 24), (".dynstr", 3, strs, 0, 0),
                (".rodata", 1, blob, 0, 0)])
    info = read_binary(write(tmp_path, data))
    assert info.error is None
    assert info.archs == ("sm_90a",) and info.symbols == ("__tvm_ffi_main",)
    # a fatbin in .rodata: its header's "f" counts, the cubin inside is not read twice
    fb = fatbin(fatbin_entry(2, 100, cubin(0x06006402), flags=0x200011))
    data = elf([(".rodata", 1, b"\0" * 8 + fb, 0, 0)])
    assert read_binary(write(tmp_path, data)).archs == ("sm_100f",)


def test_lz4_compressed_cubin_entry_refines_suffix(tmp_path):
    # an ABI 7 cubin whose "a" is only in e_flags, LZ4-compressed (literal-only block)
    image = cubin(0x005A0D5A, abiversion=7)
    ext = b""
    rest = len(image) - 15
    while rest >= 255:
        ext += b"\xff"
        rest -= 255
    block = b"\xf0" + ext + bytes([rest]) + image
    entry = fatbin_entry(2, 90, block, flags=0x2011)
    info = read_binary(write(tmp_path, fatbin(entry)))
    assert info.error is None
    assert info.archs == ("sm_90a",)


# ---------------------------------------------------------------------- hostile

def _read_fast(path) -> BinaryInfo:
    """read_binary on a hostile file: it returns (no exception, no hang; how fast is bench/'s business,
    never a wall-clock assertion here) with a one-line error at most."""
    info = read_binary(path)
    assert isinstance(info, BinaryInfo)
    assert info.error is None or "\n" not in info.error
    return info


def _check_prefixes(tmp_path: Path, data: bytes, sizes) -> None:
    """Every cut of ``data`` (whose header tables come last) is read quickly and reported."""
    p = tmp_path / "truncated"
    for n in sizes:
        p.write_bytes(data[:n])
        info = _read_fast(p)
        if n < len(data):
            assert info.error is not None, f"cut at {n} of {len(data)} bytes went unnoticed"


def test_empty_file(tmp_path):
    info = _read_fast(write(tmp_path, b""))
    assert info.format == "unknown" and info.error == "empty file"
    assert (info.archs, info.ptx_archs, info.symbols) == ((), (), ())


def test_missing_directory_and_odd_paths(tmp_path):
    assert _read_fast(tmp_path / "nope").error.startswith("cannot read file")
    assert _read_fast(tmp_path).error == "not a regular file: a directory, never read"
    assert read_binary(str(tmp_path / "nul\0byte")).error is not None
    assert read_binary(12345).format == "unknown"  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [1, 3, 4, 17, 64, 1000, 100_000])
def test_random_bytes(tmp_path, size):
    rnd = random.Random(size)
    for prefix in (b"", b"\x7fELF", b"\x50\xed\x55\xba", b"\x7fELF\x02\x01\x01\x41"):
        data = (prefix + rnd.randbytes(size))[:max(size, len(prefix))]
        info = _read_fast(write(tmp_path, data))
        assert info.error is not None or info.format != "unknown"


def test_short_elf_magic(tmp_path):
    info = _read_fast(write(tmp_path, b"\x7fEL"))
    assert info.format == "unknown" and info.error


def test_elf_section_headers_past_end(tmp_path):
    data = bytearray(host_so(fatbin(fatbin_entry(2, 90, b"x"))))
    struct.pack_into("<Q", data, 40, 1 << 62)  # e_shoff
    info = _read_fast(write(tmp_path, bytes(data)))
    assert info.format == "elf-so" and info.machine == "x86-64"
    assert "past the end" in info.error


def test_elf_sections_point_past_end(tmp_path):
    data = bytearray(host_so(fatbin(fatbin_entry(2, 90, b"x"))))
    shoff = struct.unpack_from("<Q", data, 40)[0]
    shnum = struct.unpack_from("<H", data, 60)[0]
    for i in range(1, shnum):
        struct.pack_into("<QQ", data, shoff + i * 64 + 24, 1 << 40, 1 << 40)  # offset, size
    info = _read_fast(write(tmp_path, bytes(data)))
    assert info.format == "elf-so" and info.error
    assert info.archs == ()


def test_elf_lying_counts(tmp_path):
    data = bytearray(host_so(fatbin(fatbin_entry(2, 90, b"x"))))
    struct.pack_into("<H", data, 60, 0xFFFF)  # e_shnum far beyond the file
    info = _read_fast(write(tmp_path, bytes(data)))
    assert "truncated" in info.error
    data = bytearray(host_so())
    shoff = struct.unpack_from("<Q", data, 40)[0]
    struct.pack_into("<Q", data, shoff + 64 + 32, 1 << 60)  # .dynsym sh_size
    info = _read_fast(write(tmp_path, bytes(data)))
    assert info.error and "launch" in info.symbols


def test_symbol_strings_without_terminator(tmp_path):
    syms, _ = symtab([("x", 0x12, 0, 5)] * 5000)
    strs = b"\0" + b"A" * 200_000  # no NUL: every name runs to the end of the table
    data = elf([(".dynsym", 11, syms, 2, 24), (".dynstr", 3, strs, 0, 0)])
    info = _read_fast(write(tmp_path, data))
    assert len(info.symbols) == 1


def test_fatbin_huge_sizes(tmp_path):
    raw = fatbin(fatbin_entry(2, 90, b"abc"), size=(1 << 64) - 1)
    info = _read_fast(write(tmp_path, raw))
    assert info.format == "fatbin" and info.error
    assert info.archs == ("sm_90",)  # what was there is still reported

    raw = fatbin(fatbin_entry(2, 90, b"abc", size=1 << 62), fatbin_entry(1, 90, b"p"))
    info = _read_fast(write(tmp_path, raw))
    assert info.error and info.archs == ("sm_90",)

    info = _read_fast(write(tmp_path, host_so(raw)))
    assert info.format == "elf-so" and info.error and info.symbols == ("launch",)


def test_fatbin_zero_sized_entries_do_not_loop(tmp_path):
    raw = fatbin(b"\0" * 4096)
    info = _read_fast(write(tmp_path, raw))
    assert info.error and info.archs == ()
    raw = fatbin(fatbin_entry(2, 0xFFFFFFFF, b""), fatbin_entry(2, 0, b""))
    info = _read_fast(write(tmp_path, raw))
    assert info.error and info.archs == ()


def test_many_magics(tmp_path):
    info = _read_fast(write(tmp_path, b"\x50\xed\x55\xba" * 250_000))
    assert info.format == "fatbin" and info.error
    data = host_so(fatbin(fatbin_entry(2, 90, b"x")) + b"\x7fELF\x02\x01\x01\x41" * 50_000)
    info = _read_fast(write(tmp_path, data))
    assert info.archs == ("sm_90",)


def test_cubin_with_garbage_flags(tmp_path):
    info = _read_fast(write(tmp_path, cubin(0xFFFF0000 | 0x0101)))
    assert info.format == "cubin" and info.machine == "cuda"
    assert info.archs == () and "e_flags" in info.error
    assert info.symbols == ("k",)


def test_truncated_synthetic(tmp_path):
    fb = fatbin(fatbin_entry(2, 90, cubin(0x06005A04)), fatbin_entry(1, 90, b"ptx" * 50))
    for data in (host_so(fb), fb, cubin(0x06005A04)):
        _check_prefixes(tmp_path, data, range(0, len(data), 7))


def test_bit_flip_fuzz(tmp_path):
    samples = [host_so(fatbin(fatbin_entry(2, 90, cubin(0x06005A04)), fatbin_entry(1, 90, b"p"))),
               cubin(0x06005A04, compat=b"\x02\x09\x01\x00", tkinfo=b"-arch sm_90a")]
    if FIXTURES is not None and (FIXTURES / HIDET_CUDA_SO).is_file():
        samples.append((FIXTURES / HIDET_CUDA_SO).read_bytes())
    rnd = random.Random(1234)
    p = tmp_path / "fuzz"
    for data in samples:
        for _ in range(150):
            buf = bytearray(data)
            for _ in range(rnd.randint(1, 8)):
                pos = rnd.randrange(len(buf))
                if rnd.random() < 0.5:
                    buf[pos] = rnd.randrange(256)
                else:  # plant an extreme value
                    width = rnd.choice((2, 4, 8))
                    if pos + width <= len(buf):
                        buf[pos:pos + width] = rnd.choice((b"\xff", b"\x00", b"\x7f")) * width
            p.write_bytes(bytes(buf))
            _read_fast(p)


def test_import_is_cheap_and_standalone():
    code = ("import sys, kcache_cli.formats.binary; "
            "bad = [m for m in ('typer', 'rich', 'elftools', 'subprocess') if m in sys.modules]; "
            "print(','.join(bad))")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root)}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_many_sections_over_the_same_bytes(tmp_path):
    # 30k section headers, all naming the same ~160 kB of magic-laden bytes, each shifted:
    # the reader must not rescan them 30k times
    blob = (b"\x50\xed\x55\xba\x01\x00\x10\x00" + b"\x7fELF\x02\x01\x01\x41") * 10_000
    base = bytearray(elf([(".rodata", 1, blob, 0, 0),
                          (".nv_fatbin", 1, fatbin(fatbin_entry(2, 90, b"x")), 0, 0)]))
    shoff = struct.unpack_from("<Q", base, 40)[0]
    headers = [bytes(base[shoff:shoff + 4 * 64])]  # null, .rodata, .nv_fatbin, .shstrtab
    for i in range(30_000):
        h = bytearray(base[shoff + 64 * (1 + i % 2):shoff + 64 * (2 + i % 2)])
        struct.pack_into("<Q", h, 24, struct.unpack_from("<Q", h, 24)[0] + i // 2)  # sh_offset
        headers.append(bytes(h))
    data = bytearray(base[:shoff]) + b"".join(headers)
    struct.pack_into("<H", data, 60, len(headers))  # e_shnum
    info = _read_fast(write(tmp_path, bytes(data)))
    assert info.format == "elf-so" and info.archs == ("sm_90",)
    assert info.error  # shifted .nv_fatbin copies are unreadable; the rest is cut short
