// All-to-all-v's split checks (all_to_all.cuh, all_to_all_ll.cuh): what makes a call's
// split rows wrong, and which problem every rank finds first. Plain C++ that compiles on
// the host too: tests/unit/test_all_to_all_v_ll.py compiles this very file and checks, on
// thousands of random and edge-case rows of 1 to 8 ranks, that the serial checks find the
// problem its Python model finds, and that the LL kernel's parallel verdict (every lane's
// split_lane_finds_problem) is true exactly where they find one.
//
// Rows. rows[q] is rank q's split row (SplitRow in all_to_all.cuh; any type whose
// rows[q][w] is a long long here): words 0..n-1 its sends to each rank, n..2n-1 the
// receives it expects (where it said them), 2n whether it said them, 2n+1 the elements of
// its input, 2n+2 those of its output.
#pragma once

#include <ipcshare/host_device.cuh>

namespace ipcshare {
typedef unsigned long long u64;  // as signal.cuh has it
}  // namespace ipcshare
using ipcshare::u64;

// Error-word codes of all-to-all-v's split checks: the code in the top 16 bits, the
// problem (kSplit*) in the next 8, then two ranks (8 bits each) and the call's epoch in
// the low 24 bits. collectives/split_args.py spells them.
constexpr u64 kSplitsProblem = 0xFFFEull << 48;
constexpr u64 kSplitNegative = 1;         // rank a's input_splits[b] < 0
constexpr u64 kSplitSendsTooMany = 2;     // rank a's input_splits add up past its input
constexpr u64 kSplitReceivesTooMany = 3;  // rank a receives more than its output holds
constexpr u64 kSplitMismatch = 4;         // rank a's output_splits[b] != rank b's input_splits[a]
constexpr u64 kSplitTooLargeForLL = 5;    // all_to_all_v_ll: rank a sends rank b more bytes
                                          // than an LL slot holds
constexpr u64 kSplitTooLargeForInbox = 6; // all_to_all_v_push: rank a, whose output the peers
                                          // cannot reach, receives more bytes than its inbox
                                          // holds
constexpr u64 kSplitTooLargeForSlot = 7;  // all_to_all_v_eager: rank a sends rank b more bytes
                                          // than a slot of b's inbox holds
constexpr u64 kSplitTooLargeForLL128 = 8; // all_to_all_v_ll128: rank a sends rank b more
                                          // bytes than an LL128 slot holds

// The first problem of every rank's rows, in one fixed order (0: none), as the error
// word's bits 24-47 hold it: every rank that checks the same rows finds the same one.
// all_to_all_v_ll makes these checks and one more of its own after them
// (first_ll_split_problem). Run by one thread.
template <class Row>
IPCSHARE_HD u64 first_split_problem(const Row* rows, int n) {
  u64 problem = 0;
  // 1. every row's counts are at least 0 and fit its sender's input
  for (int q = 0; q < n && !problem; ++q) {
    long long total = 0;
    for (int r = 0; r < n && !problem; ++r) {
      if (rows[q][r] < 0) problem = (kSplitNegative << 40) | ((u64)q << 32) | ((u64)r << 24);
      // One count past the input is enough (and keeps the sum from overflowing).
      else if (rows[q][r] > rows[q][2 * n + 1])
        problem = (kSplitSendsTooMany << 40) | ((u64)q << 32);
      total += rows[q][r];
    }
    if (!problem && total > rows[q][2 * n + 1])
      problem = (kSplitSendsTooMany << 40) | ((u64)q << 32);
  }
  // 2. what each rank receives fits its output
  for (int r = 0; r < n && !problem; ++r) {
    long long total = 0;
    for (int q = 0; q < n; ++q) total += rows[q][r];
    if (total > rows[r][2 * n + 2]) problem = (kSplitReceivesTooMany << 40) | ((u64)r << 32);
  }
  // 3. where a rank said what it expects, it is what is sent
  for (int r = 0; r < n && !problem; ++r) {
    if (!rows[r][2 * n]) continue;
    for (int q = 0; q < n && !problem; ++q)
      if (rows[r][n + q] != rows[q][r])
        problem = (kSplitMismatch << 40) | ((u64)r << 32) | ((u64)q << 24);
  }
  return problem;
}

// all_to_all_v_ll's first problem: first_split_problem's, then
// 4. every block that travels fits an LL slot (`capacity` bytes, every rank's alike); a
//    rank's block to itself never enters a slot. Counts are at least 0 and fit their
//    inputs here, so the product does not overflow. A block past it is problem
//    `too_large` (the eager all-to-all-v's slots are its inbox's: kSplitTooLargeForSlot).
// Run by one thread, and only on a call that has a problem (split_lane_finds_problem).
template <class Row>
IPCSHARE_HD u64 first_ll_split_problem(const Row* rows, int n, u64 itemsize, u64 capacity,
                                       u64 too_large = kSplitTooLargeForLL) {
  u64 problem = first_split_problem(rows, n);
  for (int q = 0; q < n && !problem; ++q)
    for (int r = 0; r < n && !problem; ++r)
      if (q != r && (u64)rows[q][r] * itemsize > capacity)
        problem = (too_large << 40) | ((u64)q << 32) | ((u64)r << 24);
  return problem;
}

// all_to_all_v_push's first problem: first_split_problem's, then one more (problem
// kSplitTooLargeForInbox): what each rank whose output is out of the peers' reach (bit r
// of `reachable` clear) receives fits its inbox (`capacity` bytes, every rank's alike).
// The bytes land there at their place in the output, so the whole received run must fit.
// Counts are at least 0 and fit their inputs here, so the sums do not overflow.
// Run by one thread.
template <class Row>
IPCSHARE_HD u64 first_push_split_problem(const Row* rows, int n, u64 itemsize, u64 capacity,
                                         unsigned reachable) {
  u64 problem = first_split_problem(rows, n);
  for (int r = 0; r < n && !problem; ++r) {
    if ((reachable >> r) & 1u) continue;
    u64 received = 0;
    for (int q = 0; q < n; ++q) received += (u64)rows[q][r];
    if (received * itemsize > capacity) problem = (kSplitTooLargeForInbox << 40) | ((u64)r << 32);
  }
  return problem;
}

// Lane `lane` of `lanes`' share of first_ll_split_problem's checks, made in no particular
// order: for each pair i = lane, lane + lanes, ... of the n x n (q = i / n, r = i % n),
// what q sends r is at least 0, within q's input (1) and within a slot if it travels (4),
// and what q expects from r, where q said it, is what r sends q (3); and for each rank
// p = lane, lane + lanes, ... below n, p's sends add up within its input (1) and its
// receives within its output (2). Some lane of the `lanes` returns true exactly where
// first_ll_split_problem finds a problem: each of its checks is made by some lane, and
// each check a lane makes is one of its checks. (The sums are unsigned, so that no
// count, however wrong, makes them undefined; a wrong count fails a lane's count checks
// anyway, and where every count is right they are first_split_problem's sums.)
template <class Row>
IPCSHARE_HD bool split_lane_finds_problem(const Row* rows, int n, u64 itemsize, u64 capacity,
                                          int lane, int lanes) {
  bool bad = false;
  for (int i = lane; i < n * n; i += lanes) {
    const int q = i / n, r = i % n;
    const long long c = rows[q][r];
    bad |= c < 0 || c > rows[q][2 * n + 1];                       // 1
    bad |= q != r && (u64)c * itemsize > capacity;                // 4
    bad |= rows[q][2 * n] != 0 && rows[q][n + r] != rows[r][q];  // 3
  }
  for (int p = lane; p < n; p += lanes) {
    u64 sent = 0, received = 0;
    for (int k = 0; k < n; ++k) {
      sent += (u64)rows[p][k];
      received += (u64)rows[k][p];
    }
    bad |= (long long)sent > rows[p][2 * n + 1];      // 1: the sum
    bad |= (long long)received > rows[p][2 * n + 2];  // 2
  }
  return bad;
}
