"""Where everything lies in a window: the byte layout (data, signal pad, relay staging)
and every word of the signal pad and of the pinned inboxes. The one owner of these
numbers; the CUDA headers that share them are checked against it by a test."""

from __future__ import annotations

import dataclasses

from ..topology.peer_paths import PathPlan

__all__ = [
    "round_up", "WindowLayout", "PAD_ALIGN", "SIGNAL_PAD_BYTES", "PAD_WORDS",
    "BARRIER_SLOTS", "USER_SLOT_BASE", "USER_SLOTS", "ERROR_SLOT", "KERNEL_SLOT_BASE",
    "RING_KERNEL_SLOT_BASE", "FLAG_BARRIER_SLOT_BASE", "FLAG_BARRIER_RANKS",
    "DEVICE_BARRIER_SLOT_BASE", "EPOCH_SLOT_BASE", "ONE_SHOT_EPOCH_SLOT",
    "RING_KERNEL_EPOCH_SLOT", "DEVICE_BARRIER_EPOCH_SLOT", "LL_EPOCH_SLOT",
    "RING_SIGNAL_SLOT", "HEADER_WORDS", "HEADER_DIGEST", "HEADER_INPUT", "HEADER_FLAGS",
    "HEADER_REGISTRATION", "HEADER_OUTPUT", "HEADER_OUTPUT_FLAGS",
    "HEADER_OUTPUT_REGISTRATION", "FLAG_ZERO_COPY", "FLAG_REGISTERED", "LL_CLEANED_SLOT",
    "GUEST_CALL_SLOT", "GUEST_CALL_WORDS", "GUEST_DIGEST", "GUEST_INPUT", "GUEST_OUTPUT",
    "GUEST_ROW_SHIFT", "GUEST_OFFSET_SHIFT", "GUEST_REGISTERED", "GUEST_LEADER_STAGES",
    "GUEST_IMPORTED", "TRITON_BARRIER_SLOT_BASE", "TRITON_BARRIER_RANKS",
    "TRITON_EPOCH_SLOT", "TRITON_USER_SLOT_BASE",
    "GUEST_READY_SLOT", "GUEST_DONE_SLOT", "DISAGREEMENT_DIGESTS_SLOT", "GUEST_RESULT_SLOT",
    "STAGING_SLOTS", "INBOX_HEADER_BYTES", "INBOX_BARRIER_WORD_BASE",
    "INBOX_READY_WORD_BASE", "INBOX_FREE_WORD_BASE", "slot_bytes_for", "slot_stride",
    "relay_staging_bytes", "inbox_bytes",
]


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is at least ``value``."""
    return -(-value // multiple) * multiple


# -- the signal pad ------------------------------------------------------------------
# 8192 64-bit words after the data (shared with kernels/include/ipcshare/signal.cuh).
# Words [0, 256) belong to the host barrier (word i is written only by local rank i);
# [256, 511) are free for patterns and users; word 511 is where a kernel that gave up
# records why; [512, 8192) belong to ipcshare's kernels. One writer per word means no
# atomics are needed, only ordered stores.
SIGNAL_PAD_BYTES = 65536
PAD_WORDS = SIGNAL_PAD_BYTES // 8
BARRIER_SLOTS = 256
USER_SLOT_BASE = BARRIER_SLOTS
ERROR_SLOT = 511
USER_SLOTS = ERROR_SLOT - USER_SLOT_BASE
KERNEL_SLOT_BASE = 512
# The kernels' barrier words. The one-shot kernels (all-gather push and pull, the
# collectives) share the region from KERNEL_SLOT_BASE; the ring all-gather, whose flags
# count steps rather than operations, has its own, so algorithms can alternate on one
# window.
RING_KERNEL_SLOT_BASE = KERNEL_SLOT_BASE + 3840
# Graph-safe barriers of ranks sharing a GPU: two sets of one word per local rank, used in
# turn (Engine.make_flag_barrier), just below the device barrier's words.
FLAG_BARRIER_SLOT_BASE = 7872
FLAG_BARRIER_RANKS = 64
# The device barrier kernel's words (one per local rank).
DEVICE_BARRIER_SLOT_BASE = 8000
# Device-side epochs of ipcshare's kernel families (kEpochWordBase in the header), two
# words per family: the epoch and a count of blocks done. Nothing on the host changes
# between launches, so CUDA graphs of these kernels replay correctly.
EPOCH_SLOT_BASE = 8064
ONE_SHOT_EPOCH_SLOT = EPOCH_SLOT_BASE
RING_KERNEL_EPOCH_SLOT = EPOCH_SLOT_BASE + 2
DEVICE_BARRIER_EPOCH_SLOT = EPOCH_SLOT_BASE + 4
# The low-latency collectives count their own calls (their buffers alternate by it).
LL_EPOCH_SLOT = EPOCH_SLOT_BASE + 6

# -- user words of the patterns and the collectives ----------------------------------
# The ring pattern: the word of the receiver's pad that the previous rank bumps after
# each block it wrote.
RING_SIGNAL_SLOT = USER_SLOT_BASE
# A collective call publishes a header in its own pad: the digest of its signature, the
# offset of its input in its window, and flags (kHeader* in kernels/src/collectives/args.cuh);
# the push kernels add where their output lies, when peers can store into it. Two
# headers, used by calls in turn (parity), so a rank one call ahead never overwrites the
# header a slow peer is about to read.
HEADER_WORDS = 7
HEADER_DIGEST = 0
HEADER_INPUT = 1
HEADER_FLAGS = 2
# Flag: the input is the user's own memory in the heap (not a staging copy), so peers
# must be done reading it before the call returns on any rank.
FLAG_ZERO_COPY = 1
# Flag: the input lies in a registered array (Communicator.register), not in the
# window: HEADER_INPUT is its offset there, HEADER_REGISTRATION the registration's number
# (host calls) or its row of the GPU path's registrations table (GPU calls), the same on
# every rank.
FLAG_REGISTERED = 2
HEADER_REGISTRATION = 3
# The output, as the input's three words describe the input: its offset, its flags
# (FLAG_ZERO_COPY: in the window's heap; with FLAG_REGISTERED: in a registered array; 0:
# peers cannot reach it) and its registration's row.
HEADER_OUTPUT = 4
HEADER_OUTPUT_FLAGS = 5
HEADER_OUTPUT_REGISTRATION = 6
# Two own-pad words (one per parity) where the LL kernels record the call at which they
# last re-flagged that parity's buffer: after the two call headers.
LL_CLEANED_SLOT = USER_SLOT_BASE + 2 * HEADER_WORDS
# Stepped calls on a time-sliced GPU (collectives/time_sliced.py): a guest rank's stream
# writes its call's digest and where its input and output lie into GUEST_CALL_WORDS
# own-pad words from GUEST_CALL_SLOT (kGuest* in kernels/src/collectives/args.cuh), then sets
# GUEST_READY_SLOT; the leader of its GPU runs the call's kernels for it and sets
# GUEST_DONE_SLOT. A place is one word: offset << GUEST_OFFSET_SHIFT | registration row <<
# GUEST_ROW_SHIFT | flags (for an imported array, the leader's address in the offset field).
GUEST_CALL_SLOT = LL_CLEANED_SLOT + 2
GUEST_CALL_WORDS = 3
GUEST_DIGEST, GUEST_INPUT, GUEST_OUTPUT = 0, 1, 2
GUEST_ROW_SHIFT, GUEST_OFFSET_SHIFT = 3, 9
# Flags of a place: in a registered array (else in the guest's window, at the offset);
# for an input, the leader stages it before peers read it; in an allocation of the guest
# that its leader imported (collectives/guest_imports.py): the offset field is the
# leader's address of it, and an input there is always staged (only the leader maps it).
GUEST_REGISTERED = 1
GUEST_LEADER_STAGES = 2
GUEST_IMPORTED = 4
GUEST_READY_SLOT = GUEST_CALL_SLOT + GUEST_CALL_WORDS
GUEST_DONE_SLOT = GUEST_READY_SLOT + 1
# A kernel that records a disagreement in the error word leaves the digests it compared in
# MAX_KERNEL_RANKS own-pad words from here: word r holds rank r's where it differed from
# the rank's own (its own at its rank, 0 where the same), so the error names every rank's
# call (kDisagreementDigests in kernels/src/collectives/args.cuh).
DISAGREEMENT_DIGESTS_SLOT = GUEST_DONE_SLOT + 1
# After those 8 (MAX_KERNEL_RANKS) words: set to 1 by the leader's work kernel where it did
# a guest's stepped call (every rank's digest agreed); the guest's stream clears it with the
# call's words. A guest whose output its leader cannot reach copies the result out of its
# result area 0 only where it is 1 (guest_copy_out in kernels/src/collectives/stepped.cuh),
# so a call that failed, for instance one a rank refused, leaves the output as it was
# (kGuestResultSlot).
GUEST_RESULT_SLOT = DISAGREEMENT_DIGESTS_SLOT + 8

# -- user words that ipcshare.triton's device functions own ----------------------------
# The top of the user words, far above what the communicator's calls use (up to
# GUEST_RESULT_SLOT): ``barrier_all`` of a Triton kernel stores into word
# TRITON_BARRIER_SLOT_BASE + i of every peer's pad (written only by rank i) and keeps
# its epoch, which the kernel increments on the device, in TRITON_EPOCH_SLOT of the own
# pad; words TRITON_USER_SLOT_BASE up to ERROR_SLOT are left for users' Triton signals.
TRITON_BARRIER_SLOT_BASE = 384
TRITON_BARRIER_RANKS = 64
TRITON_EPOCH_SLOT = TRITON_BARRIER_SLOT_BASE + TRITON_BARRIER_RANKS
TRITON_USER_SLOT_BASE = TRITON_EPOCH_SLOT + 1

# -- staged copies (pairs without peer access) ---------------------------------------
STAGING_SLOTS = 2
# Inbox words (64-bit): [0, 256) the barrier (word i written by local rank i), [256, 512)
# READY (word i: chunks local rank i has posted to the inbox's owner), [512, 768) FREE
# (word i: chunks local rank i has taken of what the owner sent it). Host-staged slots
# follow the header, STAGING_SLOTS per host-staged sender, in rank order.
INBOX_HEADER_BYTES = 64 << 10
INBOX_BARRIER_WORD_BASE = 0
INBOX_READY_WORD_BASE = 256
INBOX_FREE_WORD_BASE = 512
_SLOT_ALIGN = 4096
_PAGE = 4096

# -- the window's bytes ----------------------------------------------------------------
# The pad and the relay staging start on page boundaries.
PAD_ALIGN = 4096


def slot_bytes_for(window_bytes: int, chunk_bytes: int) -> int:
    """Bytes per staging slot for a window of ``window_bytes``: a chunk, or less when no
    copy in the window can be that long."""
    return max(1, min(chunk_bytes, round_up(max(window_bytes, 1), _SLOT_ALIGN)))


def slot_stride(slot_bytes: int) -> int:
    """Distance between two slots (page-aligned starts)."""
    return round_up(slot_bytes, _SLOT_ALIGN)


def relay_staging_bytes(plan: PathPlan, slot_bytes: int) -> int:
    """Bytes each window of the node adds for the pairs it may relay."""
    return plan.most_relayed() * STAGING_SLOTS * slot_stride(slot_bytes)


def inbox_bytes(plan: PathPlan, slot_bytes: int) -> int:
    """Bytes of each rank's pinned inbox: the flag header and its host-staged slots."""
    return round_up(INBOX_HEADER_BYTES + plan.most_host_staged() * STAGING_SLOTS
                    * slot_stride(slot_bytes), _PAGE)


@dataclasses.dataclass(frozen=True)
class WindowLayout:
    """The bytes of one rank's window: ``[data][signal pad][relay staging]``, rounded up
    to the backend's ``granularity``. The relay staging holds the chunks this window may
    relay between pairs of the node without peer access (none where every pair is
    direct)."""

    nbytes: int
    granularity: int
    # Bytes per staging slot (0: every pair of the node is direct).
    slot_bytes: int = 0
    relay_bytes: int = 0

    @classmethod
    def plan(cls, nbytes: int, granularity: int, paths: PathPlan) -> WindowLayout:
        """The layout of a window of ``nbytes`` on a node whose pairs go by ``paths``."""
        if not paths.has_fallbacks:
            return cls(nbytes, granularity)
        slot_bytes = slot_bytes_for(nbytes, paths.chunk_bytes)
        return cls(nbytes, granularity, slot_bytes, relay_staging_bytes(paths, slot_bytes))

    @property
    def pad_offset(self) -> int:
        return round_up(self.nbytes, PAD_ALIGN)

    @property
    def relay_offset(self) -> int:
        return round_up(self.pad_offset + SIGNAL_PAD_BYTES, PAD_ALIGN)

    @property
    def total_bytes(self) -> int:
        """What each rank allocates."""
        return round_up(self.relay_offset + self.relay_bytes, self.granularity)
