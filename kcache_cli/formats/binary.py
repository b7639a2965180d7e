"""Which CUDA architectures a compiled kernel binary holds, and which symbols it exports.

A pure-Python reader (standard library only; no pyelftools, cuobjdump or subprocess) for:

* host ELF objects (``lib.so`` from ``nvcc -shared`` or ``g++``): the exported dynamic
  symbols, and the SASS/PTX architectures of the fatbin(s) in ``.nv_fatbin`` (also
  ``__nv_fatbin`` / ``__nv_relfatbin``), plus cubins or fatbins embedded in ``.rodata``/
  ``.data`` by runtimes that load them themselves (tilelang/TVM ``executable.so``);
* cubins (ELF, ``e_machine == EM_CUDA``): the architecture and the kernel names;
* raw fatbin files (``nvcc -fatbin``).

It never raises for bad input: a file that cannot be read or understood gives a
``BinaryInfo`` with ``error`` set (and whatever could be read before the problem).
Every offset and size read from the file is checked against the file's length.

Encodings, as measured with nvcc 13.0 (and LLVM's ELF.h for older ABIs):

Fatbin container: ``u32 magic 0xBA55ED50, u16 version (1), u16 header size (16),
u64 size of the entries``, then entries; several containers may follow each other.
Entry header (little-endian): ``+0 u16 kind`` (1 PTX, 2 ELF/SASS, 8 LTO-IR),
``+2 u16 version (0x101)``, ``+4 u32 header size``, ``+8 u64 payload size``,
``+16 u32 compressed size``, ``+24 u16 minor, u16 major`` (PTX ISA), ``+28 u32 SM number``,
``+32 u32 name offset, +36 u32 name length``, ``+40 u64 flags``, ``+56 u64 uncompressed
size``. Flags: 0x1 64-bit, 0x2 debug, 0x10 Linux, 0x2000 LZ4-compressed, 0x8000
zstd-compressed, 0x100000 arch-specific (``sm_90a``), 0x200000 family (``sm_100f``),
0x1000000 a copy of the cubin's ``.nv.compat`` is in the header.

Cubin ``e_flags``: for ``EI_ABIVERSION`` < 8 the SM number is the low byte and 0x800
(EF_CUDA_ACCELERATORS_V1) marks "a" (only for sm_90+: old sm_60 cubins set 0x800 for
something else); from ABI version 8 (CUDA 12.8+/13) the SM number is
bits 8-15 and 0x8 marks "a" -- but ptxas 13.0 does not set it: there the "a" is attribute
9 (value 1) of the ``.nv.compat`` section. Cubins for ``sm_100`` and ``sm_100f`` are
identical except for the ptxas command line in ``.note.nv.tkinfo`` ("-arch sm_100f"), which
is read for the suffix when its SM number agrees with ``e_flags``.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

from kcache_cli.fs.read import NotRegularFile, TooLarge, read_bytes

__all__ = ["BinaryInfo", "read_binary", "MAX_FILE_BYTES"]

#: Files larger than this are not read (kernel binaries are at most tens of MB).
MAX_FILE_BYTES = 512 * 1024 * 1024

FORMAT_ELF_SO = "elf-so"
FORMAT_CUBIN = "cubin"
FORMAT_FATBIN = "fatbin"
FORMAT_UNKNOWN = "unknown"

_ELF_MAGIC = b"\x7fELF"
_FATBIN_MAGIC = 0xBA55ED50
_FATBIN_MAGIC_BYTES = b"\x50\xed\x55\xba"
EM_CUDA = 190

_MACHINES = {
    2: "sparc", 3: "x86", 8: "mips", 20: "ppc", 21: "ppc64", 22: "s390", 40: "arm",
    43: "sparcv9", 50: "ia64", 62: "x86-64", 183: "aarch64", 190: "cuda", 224: "amdgpu",
    243: "riscv", 258: "loongarch",
}

# ELF constants
_SHT_SYMTAB, _SHT_NOBITS, _SHT_DYNSYM = 2, 8, 11
_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE = 1, 2, 10
_STT_OBJECT, _STT_FUNC = 1, 2
_STV_HIDDEN, _STV_INTERNAL = 2, 1
_STO_CUDA_ENTRY = 0x10  # st_other bit ptxas sets on kernels (vs. plain device functions)

# Fatbin entry kinds and flags
_KIND_PTX, _KIND_ELF = 1, 2
_FB_COMPRESSED_LZ4 = 0x2000
_FB_COMPRESSED_ZSTD = 0x8000
_FB_ARCH_SPECIFIC = 0x100000  # "a"
_FB_FAMILY = 0x200000  # "f"
_FB_ENTRY_MIN_HEADER = 48  # we read up to the flags word at +40
_ARCH_MIN, _ARCH_MAX = 10, 999  # plausible SM numbers (sm_10 .. sm_999)

# Limits that keep hostile files cheap
_MAX_SECTIONS = 1 << 18
_MAX_SYMBOL_NAME = 1 << 16
_NAME_BUDGET_MIN = 16 * 1024 * 1024
_MAX_ERRORS_KEPT = 8
_SCAN_SECTION_PREFIXES = (".rodata", ".data", ".lrodata", ".ldata")


class BinaryInfo(NamedTuple):
    """What :func:`read_binary` found in one file.

    ``archs`` and ``ptx_archs`` are sorted by SM number, then suffix. ``symbols`` are the
    exported (defined, global/weak/unique, FUNC or OBJECT, not hidden) dynamic symbols of a
    host ELF (``.symtab`` when there is no ``.dynsym``); for a cubin its kernels (defined
    global/weak ``STT_FUNC`` in ``.symtab``, restricted to ptxas's entry flag when present);
    for a raw fatbin the kernels of its uncompressed cubins. Names stay mangled.
    """

    path: str
    format: str
    machine: str | None
    archs: tuple[str, ...]
    ptx_archs: tuple[str, ...]
    symbols: tuple[str, ...]
    error: str | None

    def to_json(self) -> dict:
        """A binary of `inspect --json`."""
        return {"path": self.path, "format": self.format, "machine": self.machine, "archs": list(self.archs),
                "ptx": list(self.ptx_archs), "symbols": list(self.symbols), "error": self.error}


class _Bad(Exception):
    """The bytes are not what they claim to be (internal; never escapes read_binary)."""


class _Acc:
    """What has been found so far; kept even when parsing stops half-way."""

    __slots__ = ("format", "machine", "sass", "ptx", "symbols", "problems", "name_budget",
                 "work_budget")

    def __init__(self, size: int) -> None:
        self.format = FORMAT_UNKNOWN
        self.machine: str | None = None
        self.sass: set[tuple[int, str]] = set()
        self.ptx: set[tuple[int, str]] = set()
        self.symbols: set[str] = set()
        self.problems: list[str] = []
        self.name_budget = max(_NAME_BUDGET_MIN, 2 * size)
        # bytes of sections scanned or symbol tables walked: a few times the file at most,
        # however many section headers point at the same bytes
        self.work_budget = 4 * size + (1 << 20)

    def spend(self, nbytes: int) -> bool:
        """Account for reading ``nbytes`` more; False (and a problem noted) once over budget."""
        self.work_budget -= nbytes
        if self.work_budget < 0:
            self.problem("overlapping or repeated sections: reading cut short")
            return False
        return True

    def problem(self, msg: str) -> None:
        if len(self.problems) < _MAX_ERRORS_KEPT and msg not in self.problems:
            self.problems.append(msg)

    def info(self, path: str) -> BinaryInfo:
        error = None
        if self.problems:
            error = self.problems[0]
            if len(self.problems) > 1:
                error += f" (+{len(self.problems) - 1} more)"
            error = " ".join(error.split())  # one line
        return BinaryInfo(
            path=path,
            format=self.format,
            machine=self.machine,
            archs=tuple(f"sm_{n}{s}" for n, s in sorted(self.sass)),
            ptx_archs=tuple(f"compute_{n}{s}" for n, s in sorted(self.ptx)),
            symbols=tuple(sorted(self.symbols)),
            error=error,
        )


def read_binary(path: str | os.PathLike) -> BinaryInfo:
    """Read ``path`` once and tell its format, CUDA architectures and exported symbols."""
    try:
        spath = os.fsdecode(os.fspath(path))
    except Exception as exc:  # wrong type of argument: still no exception
        return BinaryInfo(str(path), FORMAT_UNKNOWN, None, (), (), (), f"bad path: {exc}")

    def fail(msg: str) -> BinaryInfo:
        return BinaryInfo(spath, FORMAT_UNKNOWN, None, (), (), (), msg)


    try:  # a regular file, opened without following a link or blocking on a FIFO, read up to the bound
        data = read_bytes(spath, MAX_FILE_BYTES)
    except TooLarge:
        return fail(f"file too large to inspect (> {MAX_FILE_BYTES} bytes)")
    except NotRegularFile as exc:
        return fail(f"not a regular file: {exc.kind}, never read")
    except OSError as exc:
        return fail(f"cannot read file: {exc.strerror or exc}")
    except Exception as exc:  # e.g. ValueError for an embedded NUL in the path
        return fail(f"cannot read file: {exc}")
    if len(data) > MAX_FILE_BYTES:
        return fail(f"file too large to inspect (> {MAX_FILE_BYTES} bytes)")
    return _analyse(spath, data)


def _analyse(path: str, data: bytes) -> BinaryInfo:
    acc = _Acc(len(data))
    try:
        if not data:
            acc.problem("empty file")
        elif data[:4] == _ELF_MAGIC:
            _read_elf_file(data, acc)
        elif data[:4] == _FATBIN_MAGIC_BYTES:
            acc.format = FORMAT_FATBIN
            acc.machine = "cuda"
            if not _scan_fatbins(data, 0, len(data), acc, strict=True, kernels=True):
                acc.problem("fatbin magic but no readable fatbin header")
        elif len(data) < 4:
            acc.problem(f"file too short ({len(data)} bytes) to be an ELF or fatbin")
        else:
            acc.problem(f"not an ELF or fatbin file (starts with {data[:4].hex()})")
    except MemoryError:
        acc.problem("out of memory while parsing")
    except Exception as exc:  # a bug or a case not foreseen: report, never raise
        acc.problem(f"unreadable ({type(exc).__name__}: {exc})")
    return acc.info(path)


# ---------------------------------------------------------------------------- ELF


class _Section:
    __slots__ = ("name", "type", "flags", "offset", "size", "link", "entsize")

    def __init__(self, name, type_, flags, offset, size, link, entsize):
        self.name, self.type, self.flags = name, type_, flags
        self.offset, self.size, self.link, self.entsize = offset, size, link, entsize


class _Elf:
    """Header and section table of one ELF image held in ``data`` (bounds-checked)."""

    def __init__(self, data: bytes, acc: _Acc, what: str = "ELF") -> None:
        self.data, self.acc, self.what = data, acc, what
        n = len(data)
        if n < 16 or data[:4] != _ELF_MAGIC:
            raise _Bad(f"not an {what} file")
        ei_class, ei_data = data[4], data[5]
        if ei_class not in (1, 2):
            raise _Bad(f"{what}: bad ELF class {ei_class}")
        if ei_data not in (1, 2):
            raise _Bad(f"{what}: bad ELF data encoding {ei_data}")
        self.is64 = ei_class == 2
        self.e = "<" if ei_data == 1 else ">"
        self.abiversion = data[8]
        if n < (64 if self.is64 else 52):
            raise _Bad(f"{what}: truncated ELF header ({n} bytes)")
        if self.is64:
            (self.type, self.machine, _ver, _entry, _phoff, shoff, self.flags, _ehsize,
             _phentsize, _phnum, shentsize, shnum, shstrndx) = struct.unpack_from(
                self.e + "HHIQQQIHHHHHH", data, 16)
        else:
            (self.type, self.machine, _ver, _entry, _phoff, shoff, self.flags, _ehsize,
             _phentsize, _phnum, shentsize, shnum, shstrndx) = struct.unpack_from(
                self.e + "HHIIIIIHHHHHH", data, 16)
        self.sections: list[_Section] = []
        self._read_sections(shoff, shentsize, shnum, shstrndx)

    def problem(self, msg: str) -> None:
        self.acc.problem(f"{self.what}: {msg}")

    def _read_sections(self, shoff: int, shentsize: int, shnum: int, shstrndx: int) -> None:
        data, n = self.data, len(self.data)
        if shoff == 0:
            self.problem("no section header table")
            return
        min_ent = 64 if self.is64 else 40
        if shentsize < min_ent:
            self.problem(f"bad section header size {shentsize}")
            return
        if shoff >= n:
            self.problem(f"section headers at offset {shoff} are past the end of the file "
                         f"({n} bytes)")
            return
        fmt = self.e + ("IIQQQQIIQQ" if self.is64 else "IIIIIIIIII")
        room = (n - shoff) // shentsize
        if room == 0:
            self.problem(f"section header table at {shoff} is truncated")
            return
        # section 0 carries the real count / string table index when they do not fit
        s0 = struct.unpack_from(fmt, data, shoff)
        if shnum == 0:
            shnum = s0[5]
        if shstrndx == 0xFFFF:
            shstrndx = s0[6]
        if shnum > room:
            self.problem(f"section header table truncated ({room} of {shnum} headers in the file)")
            shnum = room
        if shnum > _MAX_SECTIONS:
            self.problem(f"too many sections ({shnum}); reading the first {_MAX_SECTIONS}")
            shnum = _MAX_SECTIONS
        raw = [struct.unpack_from(fmt, data, shoff + i * shentsize) for i in range(shnum)]
        strtab = None
        if 0 < shstrndx < len(raw):
            st = raw[shstrndx]
            if st[1] != _SHT_NOBITS:
                strtab = self._clamp(st[4], st[5], "section name table")
        elif shstrndx != 0:
            self.problem(f"section name table index {shstrndx} out of range")
        for r in raw:
            name_off, type_, flags, _addr, offset, size, link, _info, _align, entsize = r
            name = ""
            if strtab is not None and name_off < strtab[1] - strtab[0]:
                name = self._cstr(strtab[0] + name_off, strtab[1], 4096)
            self.sections.append(_Section(name, type_, flags, offset, size, link, entsize))

    def _clamp(self, offset: int, size: int, what: str) -> tuple[int, int] | None:
        """File range of a section, cut at the end of the file (noted as a problem)."""
        n = len(self.data)
        if offset >= n:
            if size:
                self.problem(f"{what} at offset {offset} is past the end of the file ({n} bytes)")
            return None
        end = offset + size
        if end > n:
            self.problem(f"{what} ends at {end}, past the end of the file ({n} bytes)")
            end = n
        return offset, end

    def section_range(self, s: _Section) -> tuple[int, int] | None:
        if s.type == _SHT_NOBITS or s.size == 0:
            return None
        return self._clamp(s.offset, s.size, f"section {s.name or '?'}")

    def _cstr(self, start: int, end: int, limit: int = _MAX_SYMBOL_NAME) -> str:
        stop = min(end, start + limit)
        i = self.data.find(b"\0", start, stop)
        if i < 0:
            i = stop
        return self.data[start:i].decode("utf-8", "backslashreplace")

    def symbols(self, s: _Section):
        """Yield (name, bind, type, visibility, st_other, shndx) of a symbol table section."""
        rng = self.section_range(s)
        if rng is None:
            return
        ent_min = 24 if self.is64 else 16
        entsize = s.entsize if s.entsize >= ent_min else ent_min
        strtab = None
        if 0 < s.link < len(self.sections):
            strtab = self.section_range(self.sections[s.link])
        if strtab is None:
            self.problem(f"symbol table {s.name or '?'} has no readable string table")
        if not self.acc.spend(rng[1] - rng[0]):
            return
        count = (rng[1] - rng[0]) // entsize
        fmt = self.e + ("IBBHQQ" if self.is64 else "IIIBBH")
        data = self.data
        cache: dict[int, str] = {}
        for i in range(1, count):  # entry 0 is the null symbol
            fields = struct.unpack_from(fmt, data, rng[0] + i * entsize)
            if self.is64:
                name_off, info, other, shndx = fields[0], fields[1], fields[2], fields[3]
            else:
                name_off, info, other, shndx = fields[0], fields[3], fields[4], fields[5]
            name: str | None = ""
            if strtab is not None and 0 < name_off < strtab[1] - strtab[0]:
                name = cache.get(name_off)
                if name is None:
                    name = self._cstr(strtab[0] + name_off, strtab[1])
                    self.acc.name_budget -= len(name) + 1
                    if self.acc.name_budget < 0:
                        self.problem("symbol names exceed the size budget; list cut short")
                        return
                    cache[name_off] = name
            yield name or "", info >> 4, info & 0xF, other & 0x3, other, shndx


def _read_elf_file(data: bytes, acc: _Acc) -> None:
    try:
        elf = _Elf(data, acc)
    except _Bad as exc:
        acc.problem(str(exc))
        return
    acc.machine = _MACHINES.get(elf.machine, f"em_{elf.machine}")
    if elf.machine == EM_CUDA:
        acc.format = FORMAT_CUBIN
        arch = _cubin_arch(elf)
        if arch is None:
            acc.problem(f"cubin: no plausible SM number in e_flags {elf.flags:#x}")
        else:
            acc.sass.add(arch)
        acc.symbols.update(_cubin_kernels(elf))
        return
    acc.format = FORMAT_ELF_SO
    _host_symbols(elf, acc)
    # fatbins placed by nvcc
    covered: list[tuple[int, int]] = []  # fatbin sections (one or two in real files)
    seen: set[tuple[int, int]] = set()
    for s in elf.sections:
        if "fatbin" in s.name.lower():
            rng = elf.section_range(s)
            if rng is None or rng in seen:
                continue
            if not acc.spend(rng[1] - rng[0]):
                break
            seen.add(rng)
            if len(covered) < 64:
                covered.append(rng)
            # .nvFatBinSegment holds only the registration wrapper (pointers): no magic
            strict = s.name in (".nv_fatbin", "__nv_fatbin", "__nv_relfatbin", ".nv_relfatbin")
            found = _scan_fatbins(data, rng[0], rng[1], acc, strict=strict, kernels=False)
            if strict and not found:
                acc.problem(f"section {s.name} holds no readable fatbin")
    # cubins/fatbins embedded as data by runtimes that load them themselves (TVM, tilelang)
    for s in elf.sections:
        if s.name.startswith(_SCAN_SECTION_PREFIXES) and s.type != _SHT_NOBITS:
            rng = elf.section_range(s)
            if rng is None or rng in seen or any(a <= rng[0] and rng[1] <= b for a, b in covered):
                continue
            if not acc.spend(rng[1] - rng[0]):
                break
            seen.add(rng)
            spans = _scan_fatbins(data, rng[0], rng[1], acc, strict=False, kernels=False)
            _scan_cubins(data, rng[0], rng[1], acc, skip=spans)


def _host_symbols(elf: _Elf, acc: _Acc) -> None:
    tables = [s for s in elf.sections if s.type == _SHT_DYNSYM]
    if not tables:  # a relocatable object or a static executable: use the full table
        tables = [s for s in elf.sections if s.type == _SHT_SYMTAB]
    for t in tables:
        for name, bind, typ, vis, _other, shndx in elf.symbols(t):
            if (name and shndx != 0 and bind in (_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE)
                    and typ in (_STT_FUNC, _STT_OBJECT)
                    and vis not in (_STV_HIDDEN, _STV_INTERNAL)):
                acc.symbols.add(name)


# -------------------------------------------------------------------------- cubin


def _arch_from_flags(flags: int, abiversion: int) -> tuple[int, str] | None:
    """(SM number, "" or "a") from a cubin's e_flags and EI_ABIVERSION (None if implausible)."""
    v1 = (flags & 0xFF, bool(flags & 0x800))  # EF_CUDA_SM, EF_CUDA_ACCELERATORS_V1
    v2 = ((flags >> 8) & 0xFF, bool(flags & 0x8))  # EF_CUDA_SM_MASK (ABI 8+), EF_CUDA_ACCELERATORS
    for sm, accel in ((v2, v1) if abiversion >= 8 else (v1, v2)):
        if _ARCH_MIN <= sm <= _ARCH_MAX:
            return sm, _suffix(sm, "a" if accel else "")
    return None


def _suffix(sm: int, suffix: str) -> str:
    """``suffix`` if that variant exists for ``sm`` ("a" from sm_90, "f" from sm_100), else "".

    Old cubins (e.g. sm_60 ones in CUPTI) have 0x800 set in e_flags with another meaning.
    """
    if (suffix == "a" and sm >= 90) or (suffix == "f" and sm >= 100):
        return suffix
    return ""


def _cubin_arch(elf: _Elf) -> tuple[int, str] | None:
    """(SM number, "" / "a" / "f") of a cubin, from e_flags, .nv.compat and .note.nv.tkinfo."""
    arch = _arch_from_flags(elf.flags, elf.abiversion)
    if arch is None:
        return None
    sm, suffix = arch
    for s in elf.sections:
        if s.name == ".nv.compat":
            rng = elf.section_range(s)
            if rng is not None and _compat_attrs(elf.data, rng[0], rng[1]).get(9) == 1:
                suffix = "a"
    if not suffix:
        for s in elf.sections:
            if s.name == ".note.nv.tkinfo":
                rng = elf.section_range(s)
                named = None if rng is None else _tkinfo_arch(elf.data, rng[0], rng[1])
                if named is not None and named[0] == sm and named[1] in ("a", "f"):
                    suffix = named[1]
    return sm, _suffix(sm, suffix)


def _compat_attrs(data: bytes, start: int, end: int) -> dict[int, int]:
    """Attributes of a .nv.compat block: records of u8 format, u8 attribute, then a value.

    Format 1-3 records are 4 bytes (format 2: u8 value, format 3: u16 value); format 4
    has a u16 length and that many bytes of data. Attribute 9 is 1 for "a" targets.
    """
    out: dict[int, int] = {}
    p = start
    while p + 4 <= end:
        fmt, attr = data[p], data[p + 1]
        if fmt == 2:
            out[attr] = data[p + 2]
            p += 4
        elif fmt in (1, 3):
            out[attr] = data[p + 2] | (data[p + 3] << 8)
            p += 4
        elif fmt == 4:
            p += 4 + (data[p + 2] | (data[p + 3] << 8))
        else:
            break
    return out


def _tkinfo_arch(data: bytes, start: int, end: int) -> tuple[int, str] | None:
    """The "-arch sm_XY[a|f]" of the ptxas command line kept in .note.nv.tkinfo."""
    i = data.find(b"-arch", start, end)
    if i < 0:
        return None
    i += 5
    while i < end and data[i] in b" =":
        i += 1
    j = i
    while j < end and j - i < 16 and data[j] not in b" \t\0":
        j += 1
    return _parse_sm(data[i:j].decode("ascii", "replace"))


def _parse_sm(token: str) -> tuple[int, str] | None:
    if not token.startswith("sm_"):
        return None
    body = token[3:]
    digits = len(body) - len(body.lstrip("0123456789"))
    if digits == 0:
        return None
    rest = body[digits:]
    if rest not in ("", "a", "f"):
        return None
    return int(body[:digits]), rest


def _cubin_kernels(elf: _Elf) -> set[str]:
    funcs: list[tuple[str, int]] = []
    for s in elf.sections:
        if s.type == _SHT_SYMTAB:
            for name, bind, typ, _vis, other, shndx in elf.symbols(s):
                if name and shndx != 0 and typ == _STT_FUNC and bind in (_STB_GLOBAL, _STB_WEAK):
                    funcs.append((name, other))
    entries = {name for name, other in funcs if other & _STO_CUDA_ENTRY}
    return entries if entries else {name for name, _ in funcs}


# ------------------------------------------------------------------------- fatbin


def _scan_fatbins(data: bytes, start: int, end: int, acc: _Acc, *, strict: bool,
                  kernels: bool) -> list[tuple[int, int]]:
    """Parse every fatbin container found in data[start:end]; return their file ranges."""
    found: list[tuple[int, int]] = []
    pos = start
    while pos + 16 <= end:
        i = data.find(_FATBIN_MAGIC_BYTES, pos, end)
        if i < 0:
            break
        used = _parse_fatbin(data, i, end, acc, strict=strict, kernels=kernels)
        if used:
            found.append((i, i + used))
            pos = i + used
        elif strict:
            break  # where nvcc put fatbins, a bad header means what follows is not reliable
        else:
            pos = i + 4
    return found


def _parse_fatbin(data: bytes, off: int, end: int, acc: _Acc, *, strict: bool,
                  kernels: bool) -> int:
    """Parse the container at ``off``; return the bytes it spans (0 if it is not one)."""
    if off + 16 > end:
        if strict:
            acc.problem(f"truncated fatbin header at {off}")
        return 0
    _magic, version, hsize, fsize = struct.unpack_from("<IHHQ", data, off)
    if version != 1 or hsize < 16 or off + hsize > end:
        if strict:
            acc.problem(f"unreadable fatbin header at {off} "
                        f"(version {version}, header size {hsize})")
        return 0
    body = off + hsize
    body_end = body + fsize
    if body_end > end:
        if not strict and not _looks_like_entry(data, body, end):
            return 0
        acc.problem(f"fatbin at {off} claims {fsize} bytes of entries but only {end - body} remain")
        body_end = end
    elif not strict and not _looks_like_entry(data, body, body_end):
        return 0
    _parse_fatbin_entries(data, body, body_end, acc, kernels)
    return body_end - off


def _parse_fatbin_entries(data: bytes, body: int, body_end: int, acc: _Acc, kernels: bool) -> None:
    """Note the SASS and PTX of each entry of the fatbin body data[body:body_end] (and its problems)."""
    p = body
    while p + 16 <= body_end:
        kind, _ever, ehs, psize = struct.unpack_from("<HHIQ", data, p)
        if ehs < _FB_ENTRY_MIN_HEADER or p + ehs > body_end:
            acc.problem(f"fatbin entry at {p} has a bad header (size {ehs})")
            break
        arch = struct.unpack_from("<I", data, p + 28)[0]
        flags = struct.unpack_from("<Q", data, p + 40)[0]
        payload = p + ehs
        pend = payload + psize
        complete = pend <= body_end
        if not complete:
            acc.problem(f"fatbin entry at {p} claims a {psize}-byte payload "
                        "past the end of its fatbin")
        suffix = "a" if flags & _FB_ARCH_SPECIFIC else ("f" if flags & _FB_FAMILY else "")
        if kind == _KIND_ELF:
            cubin = None
            if complete and not flags & (_FB_COMPRESSED_LZ4 | _FB_COMPRESSED_ZSTD):
                cubin = _embedded_cubin(data, payload, pend, acc, kernels)
            elif complete and flags & _FB_COMPRESSED_LZ4:
                cubin = _lz4_cubin_arch(data, payload, pend)
            if not _ARCH_MIN <= arch <= _ARCH_MAX:
                if cubin is None:
                    acc.problem(f"fatbin entry at {p} has an implausible SM number {arch}")
                    arch = 0
                else:
                    arch = cubin[0]
            if cubin is not None and cubin[0] == arch and cubin[1] == "a":
                suffix = "a"
            if arch:
                acc.sass.add((arch, _suffix(arch, suffix)))
        elif kind == _KIND_PTX:
            if _ARCH_MIN <= arch <= _ARCH_MAX:
                acc.ptx.add((arch, _suffix(arch, suffix)))
            else:
                acc.problem(f"fatbin entry at {p} has an implausible SM number {arch}")
        # other kinds (8: LTO IR) carry no SASS or PTX
        if not complete:
            break
        p = pend


def _looks_like_entry(data: bytes, p: int, end: int) -> bool:
    """Heuristic check (for magic found in arbitrary data) that an entry starts at p."""
    if p + _FB_ENTRY_MIN_HEADER > end:
        return False
    kind, ever, ehs, _psize = struct.unpack_from("<HHIQ", data, p)
    return kind in (1, 2, 4, 8, 16) and ever == 0x101 and _FB_ENTRY_MIN_HEADER <= ehs <= 4096


def _embedded_cubin(data: bytes, start: int, end: int, acc: _Acc,
                    kernels: bool) -> tuple[int, str] | None:
    """Arch of the cubin stored uncompressed in data[start:end] (its problems are noted)."""
    if data[start:start + 4] != _ELF_MAGIC:
        return None
    sub = _Acc(end - start)
    try:
        elf = _Elf(data[start:end], sub, what=f"cubin at {start}")
        if elf.machine != EM_CUDA:
            return None
        arch = _cubin_arch(elf)
        if kernels:
            acc.symbols.update(_cubin_kernels(elf))
    except _Bad as exc:
        acc.problem(str(exc))
        return None
    for msg in sub.problems:
        acc.problem(msg)
    return arch


def _scan_cubins(data: bytes, start: int, end: int, acc: _Acc,
                 skip: list[tuple[int, int]]) -> None:
    """Find CUDA ELF images embedded in a data section (e.g. TVM's __tvm_ffi__library_bin).

    Images inside the ``skip`` ranges (fatbins already read, whose headers say more) are
    left alone.
    """
    pos = start
    k = 0  # skip is sorted and disjoint: walk it alongside
    while pos + 64 <= end:
        i = data.find(_ELF_MAGIC, pos, end)
        if i < 0 or i + 64 > end:
            break
        pos = i + 4
        while k < len(skip) and skip[k][1] <= i:
            k += 1
        if k < len(skip) and skip[k][0] <= i:
            pos = skip[k][1]
            continue
        # ELF64 little-endian with e_machine EM_CUDA
        if (data[i + 4] != 2 or data[i + 5] != 1
                or struct.unpack_from("<H", data, i + 18)[0] != EM_CUDA):
            continue
        phoff, shoff = struct.unpack_from("<QQ", data, i + 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, i + 54)
        # ptxas writes the header tables last, so they give the image's extent
        size = max(64, shoff + shentsize * shnum, phoff + phentsize * phnum)
        if size > end - i:
            continue  # does not fit: not a real image
        pos = i + size  # each byte is looked at (and copied) once, whatever the headers say
        try:
            elf = _Elf(data[i:i + size], _Acc(size), what="embedded cubin")
        except _Bad:
            continue
        arch = _cubin_arch(elf)
        if arch is not None:
            acc.sass.add(arch)


def _lz4_cubin_arch(data: bytes, start: int, end: int) -> tuple[int, str] | None:
    """Arch from the ELF header of an LZ4-compressed cubin (only its first 64 bytes are decoded)."""
    head = _lz4_prefix(data, start, end, 64)
    if head is None or len(head) < 64 or head[:4] != _ELF_MAGIC or head[5] != 1:
        return None
    if struct.unpack_from("<H", head, 18)[0] != EM_CUDA:
        return None
    return _arch_from_flags(struct.unpack_from("<I", head, 48)[0], head[8])


def _lz4_prefix(data: bytes, p: int, end: int, want: int) -> bytes | None:
    """Decode the first ``want`` bytes of an LZ4 block (None if it is corrupt)."""
    out = bytearray()
    while p < end and len(out) < want:
        token = data[p]
        p += 1
        lit = token >> 4
        if lit == 15:
            while p < end:
                b = data[p]
                p += 1
                lit += b
                if b != 255:
                    break
        lit = min(lit, end - p, want - len(out))
        out += data[p:p + lit]
        p += lit
        if len(out) >= want or p + 2 > end:
            break
        offset = data[p] | (data[p + 1] << 8)
        p += 2
        if offset == 0 or offset > len(out):
            return None
        mlen = token & 15
        if mlen == 15:
            while p < end:
                b = data[p]
                p += 1
                mlen += b
                if b != 255:
                    break
        mlen = min(mlen + 4, want - len(out))
        src = len(out) - offset
        for k in range(mlen):
            out.append(out[src + k])
    return bytes(out[:want])
