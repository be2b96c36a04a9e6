"""Every kernel source compiles with NVRTC to CUBIN (no GPU needed; each source once per
run: tests/kernel_builds.py), errors carry the NVRTC log, and compiled kernels are cached
by source, architecture and NVRTC version."""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import pytest

import ipcshare
import ipcshare.kernels
from ipcshare.collectives.algorithms.gpu_kernel import THREADS
from ipcshare.kernels import KERNEL_SOURCES, compile_kernel_source, nvrtc_version
from ipcshare.kernels.compiler import COLLECTIVE_UNITS, compile_uncached, kernel_build
from ipcshare.kernels.launcher import CollectiveArgs
from ipcshare.kernels.shipped import cubin_arch, find_shipped
from ipcshare.runtime.errors import KernelCompileError

from ..kernel_builds import run_cubin

pytestmark = pytest.mark.nvrtc


@pytest.fixture(autouse=True)
def _needs_nvrtc(tmp_path, monkeypatch):
    try:
        nvrtc_version()
    except KernelCompileError as exc:
        pytest.skip(f"needs NVRTC: {exc}")
    monkeypatch.setenv("IPCSHARE_KERNEL_CACHE", str(tmp_path / "cache"))


def _is_cubin(blob: bytes) -> bool:
    return blob[:4] == b"\x7fELF"


# What a multiprocessor of sm_80 / sm_90 gives one block: 64K 32-bit registers.
_REGISTERS_PER_BLOCK = 65536
# .nv.info's attribute of a kernel's registers a thread (EIATTR_REGCOUNT), an entry of
# format EIFMT_SVAL (4): u8 format, u8 attribute, u16 size, then (u32 symbol, u32 count).
_EIFMT_SVAL, _EIATTR_REGCOUNT = 4, 0x2F


def _section_headers(cubin: bytes) -> tuple[list[tuple], dict[str, tuple]]:
    """A CUBIN's (ELF64) section headers, in order and by name."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    entsize, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * entsize)
               for i in range(count)]
    names_at = headers[names_index][4]
    return headers, {_text(cubin, names_at + header[0]): header for header in headers}


def _text(cubin: bytes, offset: int) -> str:
    return cubin[offset:cubin.index(b"\0", offset)].decode()


def _registers_per_thread(cubin: bytes) -> dict[str, int]:
    """{kernel: registers a thread} from a CUBIN (ELF64): the REGCOUNT attributes of its
    .nv.info section, each naming its kernel by a .symtab index."""
    headers, sections = _section_headers(cubin)

    def text(offset: int) -> str:
        return _text(cubin, offset)
    symtab = sections[".symtab"]
    strtab_offset = headers[symtab[6]][4]

    def symbol(index: int) -> str:
        name, = struct.unpack_from("<I", cubin, symtab[4] + index * 24)
        return text(strtab_offset + name)
    info = sections[".nv.info"]
    found, at, end = {}, info[4], info[4] + info[5]
    while at < end:
        fmt, attribute = cubin[at], cubin[at + 1]
        if fmt != _EIFMT_SVAL:
            at += 4
            continue
        size, = struct.unpack_from("<H", cubin, at + 2)
        if attribute == _EIATTR_REGCOUNT:
            index, registers = struct.unpack_from("<II", cubin, at + 4)
            found[symbol(index)] = registers
        at += 4 + size
    return found


@pytest.mark.parametrize("source", sorted(KERNEL_SOURCES))
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_every_kernel_compiles_to_cubin(source, arch):
    cubin = run_cubin(source, arch)
    assert _is_cubin(cubin) and cubin_arch(cubin) == arch
    for entry in KERNEL_SOURCES[source]:
        assert entry.encode() in cubin  # extern "C": the entry point keeps its name
    if source in COLLECTIVE_UNITS:
        # The launcher finds a collective's unit by the list: every kernel is on it.
        kernels = {name[len(".text."):] for name in _section_headers(cubin)[1]
                   if name.startswith(".text.")}
        assert kernels == set(KERNEL_SOURCES[source])
        # Every collective launches THREADS a block: a kernel given more registers than
        # such a block may have fails every launch (the LL two-shot had 146 on sm_90).
        registers = _registers_per_thread(cubin)
        for entry in KERNEL_SOURCES[source]:
            assert 0 < registers[entry] * THREADS <= _REGISTERS_PER_BLOCK, (
                entry, registers[entry])


def test_the_probe_kernels_compile_to_cubin():
    """tools/probes/timing/allgather_probe.py's experimental kernels break with the shared
    header too."""
    source = (Path(__file__).resolve().parents[2] / "tools" / "probes" / "timing"
              / "allgather_probe_kernels.cu")
    cubin = compile_kernel_source(source, arch="sm_90")
    assert _is_cubin(cubin)
    for entry in ("probe_push4", "probe_push8", "probe_pull2", "probe_pull4"):
        assert entry.encode() in cubin


def test_the_link_probe_kernels_compile_to_cubin():
    """tools/probes/links/link_probe.py's copies (one process, plain peer pointers)."""
    source = (Path(__file__).resolve().parents[2] / "tools" / "probes" / "links"
              / "link_probe_kernels.cu")
    cubin = compile_kernel_source(source, arch="sm_90")
    assert _is_cubin(cubin)
    for unroll in (2, 4, 8, 16):
        assert f"probe_u{unroll}".encode() in cubin


def test_every_collective_entry_lives_in_exactly_one_unit():
    for unit, entries in COLLECTIVE_UNITS.items():
        text = (Path(ipcshare.kernels.__file__).parent / "src" / unit).read_text()
        for entry in entries:
            name = entry.rsplit("_", 2)[0] if entry.endswith(("_sum", "_max", "_min")) else entry
            assert name in text, (unit, entry)
    every = [entry for entries in COLLECTIVE_UNITS.values() for entry in entries]
    assert len(every) == len(set(every))


def test_a_shipped_cubin_is_what_nvrtc_makes_of_its_source():
    """The install's CUBINs are the compiler's output for the same key, byte for byte (the
    smallest source: the others are the same path)."""
    build = kernel_build("barrier.cu", arch="sm_90")
    shipped = find_shipped(build)
    if shipped is None:
        pytest.skip("this install ships no sm_90 CUBIN of barrier.cu for this NVRTC")
    assert shipped == compile_uncached(build)


def test_compiled_kernels_are_cached(tmp_path, monkeypatch):
    # Nothing shipped: the cache path, as for an architecture the package does not carry.
    monkeypatch.setattr("ipcshare.kernels.shipped.shipped_dir", lambda: tmp_path / "none")
    first = compile_kernel_source("barrier.cu")
    files = list((tmp_path / "cache").glob("barrier-*-sm_90-nvrtc*.cubin"))
    assert len(files) == 1
    stamp = files[0].stat().st_mtime_ns
    assert compile_kernel_source("barrier.cu") == first
    assert files[0].stat().st_mtime_ns == stamp  # served from the cache, not rewritten
    compile_kernel_source("barrier.cu", arch="sm_80")
    assert len(list((tmp_path / "cache").glob("barrier-*.cubin"))) == 2


def test_user_kernels_can_include_the_signal_header():
    code = """
    #include <ipcshare/signal.cuh>
    extern "C" __global__ void ping(ipcshare::u64* peer_word, ipcshare::u64* my_word) {
      ipcshare::put_signal(peer_word, 1);
      ipcshare::wait_signal(my_word, 1, 1000000);
    }
    """
    assert _is_cubin(compile_kernel_source("user.cu", code=code, use_cache=False))


def test_a_kernel_that_does_not_compile_shows_the_nvrtc_log():
    code = 'extern "C" __global__ void broken() { undeclared_thing = 1; }'
    with pytest.raises(KernelCompileError, match=r"(?s)could not compile bad\.cu for sm_90:.*"
                                                 r"undeclared_thing"):
        compile_kernel_source("bad.cu", code=code, use_cache=False)


def test_bad_architecture_is_refused():
    with pytest.raises(KernelCompileError, match="not of the form sm_90"):
        compile_kernel_source("barrier.cu", arch="hopper")


def test_the_collective_kernels_argument_block_matches_its_ctypes_mirror():
    # The kernel takes CollectiveArgs by value: every field must sit where ctypes puts it,
    # or the kernels read garbage. NVRTC checks it at compile time, no GPU needed; the
    # struct is args.cuh's alone, so no kernel needs compiling for it.
    source = '#include "collectives/args.cuh"\n'
    checks = [f"static_assert(sizeof(CollectiveArgs) == {ctypes.sizeof(CollectiveArgs)}, "
              '"size");']
    for field, *_ in CollectiveArgs._fields_:
        offset = getattr(CollectiveArgs, field).offset
        checks.append(f"static_assert(__builtin_offsetof(CollectiveArgs, {field}) == "
                      f'{offset}, "{field}");')
    code = source + "\n".join(checks) + "\n"
    assert _is_cubin(compile_kernel_source("collectives_layout.cu", code=code, use_cache=False))
    # The checks bite: a field out of place stops the compile.
    moved = code.replace(f"{CollectiveArgs.rank.offset}, \"rank\"",
                         f"{CollectiveArgs.rank.offset + 4}, \"rank\"")
    with pytest.raises(KernelCompileError, match='"rank"'):
        compile_kernel_source("collectives_layout.cu", code=moved, use_cache=False)


@pytest.mark.parametrize("part", sorted(p.name for p in (
    Path(ipcshare.kernels.__file__).parent / "src" / "collectives").glob("*.cuh")))
def test_each_part_of_the_collective_kernels_compiles_on_its_own(part):
    # The collective units are put together from one file per algorithm; each must include
    # what it uses, so that a part can be read, changed and reused alone.
    code = f'#include "collectives/{part}"\n'
    assert _is_cubin(compile_kernel_source(f"part-{part}.cu", code=code, use_cache=False))


def test_user_kernels_can_use_the_low_latency_lines():
    code = """
    #include <ipcshare/ll.cuh>
    extern "C" __global__ void send_and_wait(char* peer_line, const char* my_line,
                                             unsigned flag, unsigned long long* out) {
      ipcshare::ll_store(peer_line, 0x0123456789abcdefull, flag);
      unsigned long long data;
      if (ipcshare::ll_wait(my_line, flag, data, 1000000)) *out = data;
    }
    """
    assert _is_cubin(compile_kernel_source("user_ll.cu", code=code, use_cache=False))


def test_the_phase_stamps_are_only_in_the_traced_build_and_it_still_fits_a_block():
    """kernels/include/ipcshare/trace.cuh: the usual build has no stamps buffer; the traced
    build (IPCSHARE_KERNEL_TRACE=1) of the one unit with marks has it, its marked kernels
    are other machine code, and every kernel still fits a block of THREADS."""
    from ipcshare.kernels.trace import (
        KERNEL_MARKS,
        TRACE_CALLS_SYMBOL,
        TRACE_SPAN_SYMBOL,
        TRACE_SYMBOL,
        TRACED_UNIT,
    )

    assert set(KERNEL_MARKS) <= set(COLLECTIVE_UNITS[TRACED_UNIT])
    usual = run_cubin(TRACED_UNIT)
    traced = run_cubin(TRACED_UNIT, options=("-DIPCSHARE_KERNEL_TRACE",))
    for symbol in (TRACE_SYMBOL, TRACE_SPAN_SYMBOL, TRACE_CALLS_SYMBOL):
        assert symbol.encode() not in usual and symbol.encode() in traced, symbol
    registers = _registers_per_thread(traced)
    for entry in COLLECTIVE_UNITS[TRACED_UNIT]:
        assert 0 < registers[entry] * THREADS <= _REGISTERS_PER_BLOCK, (entry, registers[entry])

    def code(cubin: bytes, kernel: str) -> bytes:
        header = _section_headers(cubin)[1][f".text.{kernel}"]
        return cubin[header[4]:header[4] + header[5]]
    assert code(usual, "all_to_all_v_push_bytes") != code(traced, "all_to_all_v_push_bytes")


def test_nvrtc_of_a_wheel_on_the_path_outside_site_packages_is_found(tmp_path):
    """pip's isolated build environment, where the package's kernels are compiled, puts
    the NVRTC wheel on sys.path but not in site-packages, where cuda-pathfinder looks: the
    base interpreter with this environment's site-packages on PYTHONPATH is such a place."""
    import os
    import subprocess
    import sys
    import sysconfig

    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    if sys.prefix == sys.base_prefix or not base.exists():
        pytest.skip("needs a virtual environment over a base interpreter")
    site_packages = sysconfig.get_paths()["purelib"]
    root = Path(ipcshare.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((site_packages, str(root)))}
    code = ("from ipcshare.kernels.compiler import compile_uncached, kernel_build\n"
            "cubin = compile_uncached(kernel_build('empty.cu', arch='sm_90'))\n"
            "assert cubin[:4] == b'\\x7fELF'\n")
    done = subprocess.run([str(base), "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
