"""``@triton.jit`` device functions on a peer table (``ipcshare.triton.table``): remote
addresses, loads, stores, block copies and atomics on a peer's memory, signals and waits
that keep the memory-ordering contract of ``ipcshare/signal.cuh``, and ``barrier_all``.

Imported only through ``ipcshare.triton`` when a kernel first names one of them (it
imports Triton). Every function takes *local* pointers, into this rank's own memory of a
table row, and the rank of the peer whose memory it means; ``translate`` turns one into
the other: ``address - base[me] + base[peer]`` (the peer's memory, mapped here).

Debug mode (``TRITON_DEBUG=1``, or ``@triton.jit(debug=True)`` on the kernel) checks every
peer rank with ``tl.device_assert``; otherwise the check costs nothing.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..window import layout as _layout
from . import table as _table

__all__ = ["CMP_EQ", "CMP_NE", "CMP_GT", "CMP_GE", "CMP_LT", "CMP_LE", "USER_WORD", "rank",
           "world_size",
           "check_peer", "translate", "load", "store", "get", "put", "atomic_add",
           "atomic_cas", "atomic_xchg", "pad", "signal", "release_fence", "signal_relaxed",
           "wait_until", "barrier_all",
           "barrier_all_kernel"]

# Comparisons of wait_until (NVSHMEM's order).
CMP_EQ = tl.constexpr(0)
CMP_NE = tl.constexpr(1)
CMP_GT = tl.constexpr(2)
CMP_GE = tl.constexpr(3)
CMP_LT = tl.constexpr(4)
CMP_LE = tl.constexpr(5)

# The atomics' default ordering and scope. Defaults of a @triton.jit function called from
# another one must be constexpr objects: Triton passes a plain string default through as
# a value and fails to compile the call ("'str' object has no attribute 'type'").
ACQ_REL = tl.constexpr("acq_rel")
SYSTEM = tl.constexpr("sys")

# The table's layout and the pad words, read from their owners (no copy to drift).
_HEADER = tl.constexpr(_table.HEADER_WORDS)
_RANK_WORD = tl.constexpr(_table.RANK_WORD)
_WORLD_WORD = tl.constexpr(_table.WORLD_WORD)
_TIMEOUT_WORD = tl.constexpr(_table.TIMEOUT_WORD)
_PAD_ROW = tl.constexpr(_table.PAD_ROW)

_BARRIER_BASE = tl.constexpr(_layout.TRITON_BARRIER_SLOT_BASE)
_EPOCH_WORD = tl.constexpr(_layout.TRITON_EPOCH_SLOT)
_ERROR_WORD = tl.constexpr(_layout.ERROR_SLOT)
_EPOCH_MASK = tl.constexpr(0xFFFFFFFFFFFF)
# The first pad word left to users' Triton signals (up to ERROR_SLOT - 1).
USER_WORD = tl.constexpr(_layout.TRITON_USER_SLOT_BASE)


@triton.jit
def rank(table):
    """This rank, as the table records it (int32)."""
    return tl.load(table + _RANK_WORD).to(tl.int32)


@triton.jit
def world_size(table):
    """The number of ranks in the table (int32)."""
    return tl.load(table + _WORLD_WORD).to(tl.int32)


@triton.jit
def check_peer(peer, table):
    """In debug mode, stop the kernel if ``peer`` is not a rank of the table."""
    tl.device_assert((peer >= 0) & (peer < world_size(table)),
                     "ipcshare.triton: peer rank out of range")


@triton.jit
def _row(table, row):
    """Pointer to the first word of ``row`` (each rank's base of that memory)."""
    return table + _HEADER + row * tl.load(table + _WORLD_WORD)


@triton.jit
def translate(ptr, peer, table, row: tl.constexpr = 1, align: tl.constexpr = 0):
    """``ptr`` (a pointer or a block of pointers into this rank's memory of ``row``) as
    the same place in ``peer``'s memory of that row, mapped here.

    ``align``: bytes by which this rank's base of the row and every peer's are known to
    differ (``DeviceView.alignment(row)``, 16 on mapped memory; 0: nothing known). With
    it the place is ``ptr`` plus a whole number of elements that Triton knows to be a
    multiple of ``align``, so it keeps what it knows of ``ptr`` (contiguity, alignment)
    and vectorises the loads and stores made through it: 16-byte accesses where it would
    otherwise make one per element. Without it the place is moved in bytes."""
    check_peer(peer, table)
    bases = _row(table, row)
    here = tl.load(bases + tl.load(table + _RANK_WORD))
    there = tl.load(bases + peer)
    size: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    if align >= size:
        tl.static_assert(align % size == 0, "align must be a multiple of the element size")
        return ptr + tl.multiple_of((there - here) // size, align // size)
    else:
        return (ptr.to(tl.int64) - here + there).to(ptr.dtype)


@triton.jit
def load(ptr, peer, table, row: tl.constexpr = 1, mask=None, other=None,
         align: tl.constexpr = 0):
    """``tl.load`` of ``peer``'s memory at the place ``ptr`` names in ours (weak: order it
    with ``wait_until`` or an acquire atomic first). ``align``: as ``translate``'s."""
    return tl.load(translate(ptr, peer, table, row, align), mask=mask, other=other)


@triton.jit
def store(ptr, value, peer, table, row: tl.constexpr = 1, mask=None,
          align: tl.constexpr = 0):
    """``tl.store`` of ``value`` into ``peer``'s memory at the place ``ptr`` names in ours
    (weak: a later ``signal`` publishes it). ``align``: as ``translate``'s."""
    tl.store(translate(ptr, peer, table, row, align), value, mask=mask)


@triton.jit
def get(dst, src, peer, table, row: tl.constexpr = 1, mask=None, align: tl.constexpr = 0):
    """Block copy from ``peer``: ``dst[i] = peer's src[i]``; ``src`` points into our memory
    of ``row``, ``dst`` anywhere local. ``align``: as ``translate``'s."""
    tl.store(dst, tl.load(translate(src, peer, table, row, align), mask=mask), mask=mask)


@triton.jit
def put(dst, src, peer, table, row: tl.constexpr = 1, mask=None, align: tl.constexpr = 0):
    """Block copy to ``peer``: ``peer's dst[i] = src[i]``; ``dst`` points into our memory
    of ``row``, ``src`` anywhere local. ``align``: as ``translate``'s."""
    tl.store(translate(dst, peer, table, row, align), tl.load(src, mask=mask), mask=mask)


@triton.jit
def atomic_add(ptr, value, peer, table, row: tl.constexpr = 1, mask=None,
               sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM):
    """Atomic add on ``peer``'s memory; returns the old value. ``sem``: relaxed, acquire,
    release or acq_rel; ``scope``: sys (across GPUs, the default), gpu or cta."""
    return tl.atomic_add(translate(ptr, peer, table, row), value, mask=mask, sem=sem,
                         scope=scope)


@triton.jit
def atomic_cas(ptr, compare, value, peer, table, row: tl.constexpr = 1,
               sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM):
    """Atomic compare-and-swap on ``peer``'s memory; returns the old value. ``compare``
    and ``value`` are cast to the pointer's element type."""
    there = translate(ptr, peer, table, row)
    kind = there.dtype.element_ty
    return tl.atomic_cas(there, tl.cast(compare, kind), tl.cast(value, kind), sem=sem,
                         scope=scope)


@triton.jit
def atomic_xchg(ptr, value, peer, table, row: tl.constexpr = 1, mask=None,
                sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM):
    """Atomic exchange on ``peer``'s memory; returns the old value."""
    return tl.atomic_xchg(translate(ptr, peer, table, row), value, mask=mask, sem=sem,
                          scope=scope)


@triton.jit
def pad(peer, table):
    """``peer``'s signal pad (word 0, uint64), mapped here; ``pad(rank(table), table)`` is
    our own."""
    check_peer(peer, table)
    return tl.load(_row(table, _PAD_ROW) + peer).to(tl.pointer_type(tl.uint64))


@triton.jit
def _fence_and_store_release(address, value):
    # signal.cuh's block_signal: a system-scope fence (cumulative over what the program's
    # threads wrote before the block barrier), then a release store at system scope.
    tl.inline_asm_elementwise("fence.sc.sys;\n\tst.release.sys.global.u64 [$1], $2;\n\t"
                              "mov.u32 $0, 0;", "=r,l,l", [address, value], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _fence_system():
    tl.inline_asm_elementwise("fence.sc.sys;\n\tmov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _store_relaxed(address, value):
    tl.inline_asm_elementwise("st.relaxed.sys.global.u64 [$1], $2;\n\tmov.u32 $0, 0;",
                              "=r,l,l", [address, value], dtype=tl.int32, is_pure=False,
                              pack=1)


@triton.jit
def _load_acquire(address):
    # signal.cuh's load_acquire.
    return tl.inline_asm_elementwise("ld.acquire.sys.global.u64 $0, [$1];", "=l,l", [address],
                                     dtype=tl.uint64, is_pure=False, pack=1)


@triton.jit
def _now_ns():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.uint64,
                                     is_pure=False, pack=1)


@triton.jit
def signal(pad, word, value):
    """Release: store ``value`` into word ``word`` of ``pad`` (a uint64 pointer: a peer's
    pad from ``pad(peer, table)``, or any uint64 array in shared memory) so that whoever
    sees it also sees every store this program made before (its threads meet first).
    Call it from the whole program (not under a per-element mask). Counters: signal a
    larger value each time, and never reset a word a peer may still signal."""
    tl.debug_barrier()
    _fence_and_store_release(pad + word, tl.cast(value, tl.uint64))


@triton.jit
def release_fence():
    """The release of ``signal``, once for several signals: the program's threads meet
    (``tl.debug_barrier``) and fence at system scope (``fence.sc.sys``). Each
    ``signal_relaxed`` after it then publishes every store the program made before it
    (PTX's release pattern: a fence, then a strong store). Where a program signals k
    peers, ``signal`` pays k fences, and each fence but the first also waits for the
    previous signal to reach its peer: one NVLink round trip per peer."""
    tl.debug_barrier()
    _fence_system()


@triton.jit
def signal_relaxed(pad, word, value):
    """Store ``value`` into word ``word`` of ``pad`` (a strong relaxed store at system
    scope). After ``release_fence`` it is a signal; alone it publishes nothing. Call it
    from the whole program, as ``signal``."""
    _store_relaxed(pad + word, tl.cast(value, tl.uint64))


@triton.jit
def _compare(seen, cmp: tl.constexpr, target):
    tl.static_assert((cmp >= 0) & (cmp <= 5), "cmp must be one of ipcshare.triton.CMP_*")
    if cmp == 0:
        met = seen == target
    elif cmp == 1:
        met = seen != target
    elif cmp == 2:
        met = seen > target
    elif cmp == 3:
        met = seen >= target
    elif cmp == 4:
        met = seen < target
    else:
        met = seen <= target
    return met


@triton.jit
def wait_until(pad, word, cmp: tl.constexpr, value, timeout_ns=0):
    """Acquire: poll word ``word`` of ``pad`` until ``word cmp value`` holds (``cmp`` one of
    CMP_EQ, CMP_NE, CMP_GT, CMP_GE, CMP_LT, CMP_LE; counters wait with CMP_GE). What the
    signalling program stored before its ``signal`` is visible after it. Gives up after
    ``timeout_ns`` (0: never); returns whether the condition was met."""
    address = pad + word
    target = tl.cast(value, tl.uint64)
    limit = tl.cast(timeout_ns, tl.uint64)
    met = _compare(_load_acquire(address), cmp, target)
    start = _now_ns()
    gave_up = start != start
    while (met == 0) & (gave_up == 0):
        met = _compare(_load_acquire(address), cmp, target)
        gave_up = (limit > 0) & ((_now_ns() - start) > limit)
    return met


@triton.jit
def barrier_all(table):
    """Every rank of the table meets here: a release and an acquire for all of them. Call
    it from one program per launch (a grid of one, or under ``tl.program_id(0) == 0``).
    Its epoch lives in this rank's pad (``TRITON_EPOCH_SLOT``) and the kernel increments
    it, so a CUDA graph replays it with no reset from the host. A peer that does not come
    within the table's timeout is recorded in the pad's error word
    (``DeviceView.raise_kernel_error`` names it) and the barrier returns."""
    me = tl.load(table + _RANK_WORD)
    world = tl.load(table + _WORLD_WORD)
    own = pad(me, table)
    epoch = tl.load(own + _EPOCH_WORD, volatile=True) + 1
    release_fence()   # one release for every peer's signal (not one round trip each)
    for peer in range(0, world):
        if peer != me:
            signal_relaxed(pad(peer, table), _BARRIER_BASE + me, epoch)
    timeout = tl.load(table + _TIMEOUT_WORD)
    for peer in range(0, world):
        if peer != me:
            if wait_until(own, _BARRIER_BASE + peer, CMP_GE, epoch, timeout) == 0:
                code = ((peer + 1).to(tl.uint64) << 48) | (epoch & _EPOCH_MASK)
                tl.atomic_cas(own + _ERROR_WORD, epoch - epoch, code, sem="relaxed",
                              scope="gpu")
    # Every thread has read the old epoch and passed its waits before it is replaced.
    tl.debug_barrier()
    tl.store(own + _EPOCH_WORD, epoch)
    tl.debug_barrier()


@triton.jit
def barrier_all_kernel(table):
    """``barrier_all`` as a launch of its own: ``barrier_all_kernel[(1,)](view.table)``."""
    barrier_all(table)
