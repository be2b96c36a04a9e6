// The arguments of every collective kernel and the words a call writes in its pad: the
// header that peers read (where the input and the output lie) and the words a guest of a
// time-sliced GPU hands its leader. kernels/launcher.py mirrors CollectiveArgs field for
// field, window/layout.py owns the word numbers (tests/unit/test_layout.py compares them).
#pragma once

#include <ipcshare/signal.cuh>

using ipcshare::u64;
using ipcshare::kMaxRanks;

// Header words of a call, in the caller's own pad (two sets, by parity): the signature's
// digest, where the input lies in the caller's window, flags (window/layout.py).
constexpr int kHeaderDigest = 0;
constexpr int kHeaderInput = 1;
constexpr int kHeaderFlags = 2;
constexpr int kHeaderRegistration = 3;
// Where the output lies, for the push kernels (their peers store results into it): its
// offset, flags (kFlagZeroCopy: our heap; with kFlagRegistered: a registered array; 0: out
// of the peers' reach) and registration row.
constexpr int kHeaderOutput = 4;
constexpr int kHeaderOutputFlags = 5;
constexpr int kHeaderOutputRegistration = 6;
constexpr int kHeaderWords = 7;
constexpr u64 kFlagZeroCopy = 1;
// The input lies in an array the user registered (Communicator.register): kHeaderInput is
// its offset there and kHeaderRegistration the row of the registrations table (the same
// row on every rank: rows are handed out in the collective order of register calls).
constexpr u64 kFlagRegistered = 2;
// A guest's call as its stream describes it (GUEST_* in window/layout.py): the words of
// CollectiveArgs::guest; a place is offset << kGuestOffsetShift | row << kGuestRowShift |
// flags.
constexpr int kGuestDigest = 0;
constexpr int kGuestInput = 1;
constexpr int kGuestOutput = 2;
constexpr int kGuestRowShift = 3;
constexpr int kGuestOffsetShift = 9;
constexpr u64 kGuestRegistered = 1;
constexpr u64 kGuestLeaderStages = 2;
constexpr u64 kGuestImported = 4;
// The first of a guest's call words in its pad (GUEST_CALL_SLOT in window/layout.py).
constexpr int kGuestCallSlot = 272;
// Error-word code of a call whose ranks disagree (peer field all ones; see gpu_path.py).
constexpr u64 kDisagreement = 0xFFFFull << 48;
// Where the call whose disagreement the error word holds leaves the digests it found: word
// kDisagreementDigests + r of the own pad holds rank r's digest where it differed from
// ours (ours at our own rank; 0: the same as ours), so synchronize() names every rank's
// call (DISAGREEMENT_DIGESTS_SLOT in window/layout.py).
constexpr int kDisagreementDigests = 277;
// The guest's word that the leader's work kernel sets to 1 where it did the call (every
// digest agreed), after the kMaxRanks digest words: guest_copy_out copies the result out
// only then (GUEST_RESULT_SLOT).
constexpr int kGuestResultSlot = 285;

struct CollectiveArgs {
  char* windows[kMaxRanks];        // every rank's window, mapped here
  u64* pads[kMaxRanks];            // every rank's signal pad, mapped here
  const char* input;               // this rank's input (the user's array, or in the heap)
  char* output;                    // this rank's output
  unsigned long long count;        // elements of the call's input
  unsigned long long digest;       // of the call's signature
  unsigned long long input_offset; // where the input lies in our window (or registered
                                   // array), if zero_copy
  unsigned long long staging_offset[2];
  unsigned long long result_offset[2];
  u64 timeout_ns;                  // 0: wait forever
  int rank;
  int nranks;
  int zero_copy;                   // peers read the input in place: 1 in our heap,
                                   // 2 in a registered array (row registration_row)
  int slot_base;                   // first pad word of the block barriers
  int header_base;                 // first pad word of the two headers
  int epoch_word;                  // own-pad word counting calls (device-side epoch)
  // Low-latency protocol (ll.cuh): where the buffers of each parity lie in every window
  // (one slot of ll_slot_bytes per source rank), how often the owner re-flags them, the
  // own-pad words counting LL calls (and finished blocks) and recording the call at which
  // each parity was last re-flagged.
  int ll_epoch_word;
  int ll_cleaned_word;
  unsigned long long ll_offset[2];
  unsigned long long ll_slot_bytes;
  unsigned long long ll_clean_every;
  // Registered arrays: row k holds, for every rank r, where rank r's array of the
  // registration in row k is mapped here (kMaxRanks addresses a row).
  const u64* registrations;
  unsigned long long registration_row;
  // Stepped calls on a time-sliced GPU: non-null when the leader of the GPU runs this
  // kernel for `rank`, a guest; the guest's own pad words (kGuest*) say where its input
  // and output lie (resolve_guest).
  const u64* guest;
  // The push kernels' tile (bytes; 0: kPushTileBytes), the same on every rank
  // (gpu_push.py sets it).
  unsigned long long push_tile_bytes;
  // Where the output lies, when peers can reach it (the kHeaderOutput* words): 0 not, 1 in
  // our heap at output_offset, 2 in the registered array of row output_registration_row.
  int output_mapped;
  unsigned long long output_offset;
  unsigned long long output_registration_row;
  // Stepped kernels launched by the leader of a time-sliced GPU: bit r set for each guest
  // rank r it runs them for in the same launch, one row of blocks (blockIdx.y) per guest
  // after its own (as_party in stepped.cuh).
  unsigned long long guest_mask;
  // All-to-all-v (all_to_all.cuh). This rank's input_splits: a device array of
  // send_splits_itemsize-byte integers (4 or 8), read at run time, or, where null, the
  // host's counts in splits_inline[0]. The output_splits the host gave are in
  // splits_inline[1] where expect_receives is 1 (every rank checks them); receive_splits,
  // where not null, is a device array the kernel fills with the counts received. count is
  // then the input's elements, output_count the output's, itemsize their size; each
  // rank's split row lies at splits_offset[parity] of its window.
  const void* send_splits;
  void* receive_splits;
  long long splits_inline[2][kMaxRanks];
  unsigned long long splits_offset[2];
  unsigned long long output_count;
  int send_splits_itemsize;
  int receive_splits_itemsize;
  int expect_receives;
  int itemsize;
  // 128-byte lines (ll128.cuh): where the buffers of each parity lie in every window (one
  // slot of ll128_slot_bytes per source rank). Their calls count with the LL ones.
  unsigned long long ll128_offset[2];
  unsigned long long ll128_slot_bytes;
};
