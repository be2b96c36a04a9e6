// Where the payload of 128-byte lines (ll128.cuh) lies: line j carries bytes 120 j ..
// 120 j + 119 of a run as 15 words of 8 bytes; lane k of the line's eight threads carries
// words 2k and 2k + 1, lane 7 word 14 alone (its second word is the flag). Host and
// device alike (tests/unit/test_ll128_words.py runs them on the host).
#pragma once

#include <ipcshare/host_device.cuh>

namespace ipcshare {

constexpr int kLL128LineBytes = 128;
constexpr int kLL128Payload = 120;   // 15 words of 8 bytes
constexpr int kLL128Lanes = 8;

// Lines that carry `nbytes` of payload (the last one partly).
IPCSHARE_HD unsigned long long ll128_lines(unsigned long long nbytes) {
  return (nbytes + kLL128Payload - 1) / kLL128Payload;
}

// The payload words lane k of a line carries: 2k and 2k + 1, lane 7 word 14 alone.
IPCSHARE_HD int ll128_words(int k) { return k == kLL128Lanes - 1 ? 1 : 2; }

// Payload word w (0 .. 14) of line j of a run of `nbytes` at `base`: bytes
// 120 j + 8 w .. + 7, one 8-byte load where `aligned` (base is 8-byte aligned) and the
// word is whole, two 4-byte loads where the word is whole at a 4-byte boundary (an
// all-to-all-v block of 4-byte elements starts at one as often as at an 8-byte one), else
// byte by byte, zero past the end.
IPCSHARE_HD unsigned long long ll128_load_word(const char* base, unsigned long long j, int w,
                                               unsigned long long nbytes, bool aligned) {
  const unsigned long long first = j * kLL128Payload + 8ull * w;
  if (aligned && first + 8 <= nbytes)
    return *reinterpret_cast<const unsigned long long*>(base + first);
  if (first + 8 <= nbytes && ((unsigned long long)(base + first) & 3ull) == 0) {
    const unsigned* half = reinterpret_cast<const unsigned*>(base + first);
    return (unsigned long long)half[0] | (unsigned long long)half[1] << 32;
  }
  unsigned long long data = 0;
  for (int b = 0; b < 8 && first + b < nbytes; ++b)
    data |= (unsigned long long)(unsigned char)base[first + b] << (8 * b);
  return data;
}

// The counterpart of ll128_load_word: bytes past the end are not written.
IPCSHARE_HD void ll128_store_word(char* base, unsigned long long j, int w,
                                  unsigned long long nbytes, bool aligned,
                                  unsigned long long data) {
  const unsigned long long first = j * kLL128Payload + 8ull * w;
  if (aligned && first + 8 <= nbytes) {
    *reinterpret_cast<unsigned long long*>(base + first) = data;
    return;
  }
  if (first + 8 <= nbytes && ((unsigned long long)(base + first) & 3ull) == 0) {
    unsigned* half = reinterpret_cast<unsigned*>(base + first);
    half[0] = (unsigned)data;
    half[1] = (unsigned)(data >> 32);
    return;
  }
  for (int b = 0; b < 8 && first + b < nbytes; ++b) base[first + b] = (char)(data >> (8 * b));
}

}  // namespace ipcshare
