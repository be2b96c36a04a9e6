"""The 128-byte lines' payload layout (kernels/include/ipcshare/ll128_words.cuh), compiled
for this host: a sender's lanes load every byte of a run exactly once into the words they
carry, and a receiver's lanes store them back, at any length and any alignment of either
end, without a byte written past the run."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from ..host_kernels import build_for_host

_SHIM = r"""
#include <ipcshare/ll128_words.cuh>
using namespace ipcshare;
extern "C" {
// Every line's words as the eight lanes would carry them (15 a line), from `src`.
void pack(const char* src, unsigned long long nbytes, int aligned, unsigned long long* words) {
  const unsigned long long lines = ll128_lines(nbytes);
  for (unsigned long long j = 0; j < lines; ++j)
    for (int k = 0; k < kLL128Lanes; ++k)
      for (int w = 0; w < ll128_words(k); ++w)
        words[j * 15 + 2 * k + w] = ll128_load_word(src, j, 2 * k + w, nbytes, aligned != 0);
}
// The receiver's side: every lane stores its words of every line into `dst`.
void unpack(const unsigned long long* words, unsigned long long nbytes, int aligned, char* dst) {
  const unsigned long long lines = ll128_lines(nbytes);
  for (unsigned long long j = 0; j < lines; ++j)
    for (int k = 0; k < kLL128Lanes; ++k)
      for (int w = 0; w < ll128_words(k); ++w)
        ll128_store_word(dst, j, 2 * k + w, nbytes, aligned != 0, words[j * 15 + 2 * k + w]);
}
unsigned long long lines(unsigned long long nbytes) { return ll128_lines(nbytes); }
}
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    library = build_for_host(tmp_path_factory.mktemp("ll128"), _SHIM, "ll128_words.cuh")
    library.pack.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_int,
                             ctypes.c_void_p]
    library.unpack.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_int,
                               ctypes.c_void_p]
    library.lines.restype = ctypes.c_ulonglong
    library.lines.argtypes = [ctypes.c_ulonglong]
    return library


@pytest.mark.parametrize("nbytes", [1, 7, 8, 9, 119, 120, 121, 240, 1000, 4099, 65536])
# 4: the two-halves path of a word at a 4-byte boundary, on either side or both.
@pytest.mark.parametrize(("src_shift", "dst_shift"), [(0, 0), (3, 0), (0, 5), (1, 7), (4, 0),
                                                      (0, 4), (4, 4), (4, 2)])
def test_lanes_carry_every_byte_once_and_store_nothing_past_the_run(shim, nbytes, src_shift,
                                                                    dst_shift):
    lines = shim.lines(nbytes)
    assert lines == -(-nbytes // 120)
    rng = np.random.default_rng([nbytes, src_shift, dst_shift])
    src_buffer = np.zeros(nbytes + 64, np.uint8)
    src = src_buffer[8 + src_shift:8 + src_shift + nbytes]   # 8-aligned base + shift
    src[:] = rng.integers(0, 256, nbytes, dtype=np.uint8)
    words = np.zeros(lines * 15, np.uint64)
    src_aligned = int(src.ctypes.data % 8 == 0)
    shim.pack(src.ctypes.data, nbytes, src_aligned, words.ctypes.data)
    # The words are the run's bytes in order, zero past its end.
    carried = words.view(np.uint8)
    assert np.array_equal(carried[:nbytes], src)
    assert not carried[nbytes:].any()
    dst_buffer = np.full(nbytes + 64, 0xA5, np.uint8)
    dst = dst_buffer[8 + dst_shift:8 + dst_shift + nbytes]
    shim.unpack(words.ctypes.data, nbytes, int(dst.ctypes.data % 8 == 0), dst.ctypes.data)
    assert np.array_equal(dst, src)
    # Nothing outside the run was touched.
    assert (dst_buffer[:8 + dst_shift] == 0xA5).all()
    assert (dst_buffer[8 + dst_shift + nbytes:] == 0xA5).all()
