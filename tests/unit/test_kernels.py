"""Every shipped kernel compiles with NVRTC to CUBIN (no GPU needed), errors carry the
NVRTC log, and compiled kernels are cached by source, architecture and NVRTC version."""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import pytest

import ipcshare.kernels
from ipcshare.collectives.algorithms.gpu_kernel import THREADS
from ipcshare.kernels import KERNEL_SOURCES, compile_kernel_source, nvrtc_version
from ipcshare.kernels.launcher import CollectiveArgs
from ipcshare.runtime.errors import KernelCompileError

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
    cubin = compile_kernel_source(source, arch=arch)
    assert _is_cubin(cubin)
    for entry in KERNEL_SOURCES[source]:
        assert entry.encode() in cubin  # extern "C": the entry point keeps its name
    if source == "collectives.cu":
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


def test_compiled_kernels_are_cached(tmp_path):
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
    # or the kernels read garbage. NVRTC checks it at compile time, no GPU needed.
    source = (Path(ipcshare.kernels.__file__).parent / "src" / "collectives.cu").read_text()
    checks = [f"static_assert(sizeof(CollectiveArgs) == {ctypes.sizeof(CollectiveArgs)}, "
              '"size");']
    for field, *_ in CollectiveArgs._fields_:
        offset = getattr(CollectiveArgs, field).offset
        checks.append(f"static_assert(__builtin_offsetof(CollectiveArgs, {field}) == "
                      f'{offset}, "{field}");')
    code = source + "\n" + "\n".join(checks) + "\n"
    assert _is_cubin(compile_kernel_source("collectives_layout.cu", code=code, use_cache=False))


@pytest.mark.parametrize("part", sorted(p.name for p in (
    Path(ipcshare.kernels.__file__).parent / "src" / "collectives").glob("*.cuh")))
def test_each_part_of_the_collective_kernels_compiles_on_its_own(part):
    # collectives.cu is put together from one file per algorithm; each must include what
    # it uses, so that a part can be read, changed and reused alone.
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
    """kernels/include/ipcshare/trace.cuh: the usual build has no stamps buffer and the
    kernels are the machine code they were without marks (a kernel without marks is the
    same in both builds); the traced build (IPCSHARE_KERNEL_TRACE=1) has the buffer, and
    every kernel still fits a block of THREADS."""
    from ipcshare.kernels.trace import TRACE_CALLS_SYMBOL, TRACE_SPAN_SYMBOL, TRACE_SYMBOL

    usual = compile_kernel_source("collectives.cu")
    traced = compile_kernel_source("collectives.cu", options=("-DIPCSHARE_KERNEL_TRACE",))
    for symbol in (TRACE_SYMBOL, TRACE_SPAN_SYMBOL, TRACE_CALLS_SYMBOL):
        assert symbol.encode() not in usual and symbol.encode() in traced, symbol
    registers = _registers_per_thread(traced)
    for entry in KERNEL_SOURCES["collectives.cu"]:
        assert 0 < registers[entry] * THREADS <= _REGISTERS_PER_BLOCK, (entry, registers[entry])

    def code(cubin: bytes, kernel: str) -> bytes:
        header = _section_headers(cubin)[1][f".text.{kernel}"]
        return cubin[header[4]:header[4] + header[5]]
    assert code(usual, "all_reduce_one_shot_float32_sum") == code(
        traced, "all_reduce_one_shot_float32_sum")
    assert code(usual, "all_to_all_v_push_bytes") != code(traced, "all_to_all_v_push_bytes")
