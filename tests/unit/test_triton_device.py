"""ipcshare.triton's device functions where Triton is installed, without a GPU: every
function and the examples' kernels compile to an sm_90 CUBIN (Triton's own ptxas), the
PTX carries signal.cuh's release and acquire at system scope, debug mode adds the peer
check; and Triton's interpreter runs translate, load, store, get, put and the atomics on
two CPU tensors standing for two ranks' memory (torch needed). Skipped, with the reason,
where Triton (or torch) is missing: CI needs neither."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ipcshare.kernels

from ..example_runs import EXAMPLES, load_example

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="needs Triton (pip install triton); no GPU needed")

_SM90 = ("cuda", 90, 32)
# put_signal's release store and load_acquire's load, as signal.cuh spells them.
_SIGNAL_CUH_ORDERING = tuple(re.findall(
    r'asm volatile\("((?:st\.release|ld\.acquire)\.sys\.global\.u64) ',
    (Path(ipcshare.kernels.__file__).parent / "include/ipcshare/signal.cuh").read_text()))
_EXAMPLE_KERNELS = {
    "triton_allgather": ("all_gather_kernel", {
        "out": "*i32", "zones": "*i32", "inp": "*i32", "flags": "*i64", "table": "*i64",
        "count": "i32", "zone_elements": "i32"},
        {"BLOCK": 2048, "ALIGN": 16, "ZONES": True}),
    "triton_allreduce_rmsnorm": ("all_reduce_rmsnorm_kernel", {
        "y": "*bf16", "h": "*bf16", "x": "*bf16", "zones": "*bf16", "residual": "*bf16",
        "weight": "*bf16", "flags": "*i64", "table": "*i64", "rows": "i32", "hidden": "i32",
        "zone_elements": "i32", "eps": "fp32"},
        {"BLOCK": 4096, "WORLD": 4, "ALIGN": 16}),
    "triton_ring": ("ring_kernel", {
        "received": "*i32", "source": "*i32", "flags": "*i64", "table": "*i64",
        "count": "i32"}, {"BLOCK": 4096, "ALIGN": 16}),
}


def _compile(fn, signature, constexprs=None, attrs=None, **options):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = dict(signature, **{name: "constexpr" for name in constexprs or {}})
    # attrs: what Triton's launcher specialises on at run time (16-divisible arguments).
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs or {}, attrs=attrs)
    return triton.compile(source, target=GPUTarget(*_SM90), options=options or None)


if importlib.util.find_spec("triton") is not None:
    import triton
    import triton.language as tl

    import ipcshare.triton as ipt

    @triton.jit
    def peer_row_copy(out, x, table, hidden, BLOCK: tl.constexpr, ALIGN: tl.constexpr):
        cols = tl.arange(0, BLOCK)
        mask = cols < hidden
        row = ipt.load(x + cols, 1, table, mask=mask, other=0.0, align=ALIGN)
        ipt.store(out + cols, row, 1, table, mask=mask, align=ALIGN)

    @triton.jit
    def every_function(x, out, words, table, n, BLOCK: tl.constexpr):
        me = ipt.rank(table)
        peer = (me + 1) % ipt.world_size(table)
        offsets = tl.arange(0, BLOCK)
        mask = offsets < n
        ipt.put(out + offsets, x + offsets, peer, table, mask=mask)
        ipt.get(out + offsets, x + offsets, peer, table, 2, mask)
        ipt.store(out + offsets, ipt.load(x + offsets, peer, table, mask=mask, other=0.0),
                  peer, table, mask=mask)
        old = ipt.atomic_add(words, 1, peer, table, 2, sem="relaxed", scope="sys")
        ipt.atomic_cas(words + 1, 0, 5, peer, table, 2, sem="acquire", scope="gpu")
        ipt.atomic_xchg(words + 2, old, peer, table, 2, sem="release", scope="sys")
        ipt.signal(ipt.pad(peer, table), 449, 7)
        ipt.release_fence()
        ipt.signal_relaxed(ipt.pad(peer, table), 450, 8)
        met = ipt.wait_until(ipt.pad(me, table), 449, ipt.CMP_GE, 7, 1000)
        ipt.barrier_all(table)
        tl.store(words + 3, met.to(tl.int64))

    @triton.jit
    def atomics_by_default(words, table):
        # Ordering and scope left to the defaults (the call the GPU test makes).
        peer = (ipt.rank(table) + 1) % ipt.world_size(table)
        old = ipt.atomic_add(words, 1, peer, table, 2)
        ipt.atomic_cas(words + 1, 0, old + 1, peer, table, 2)
        ipt.atomic_xchg(words + 2, old, peer, table, 2)


_EVERY = {"x": "*fp32", "out": "*fp32", "words": "*i64", "table": "*i64", "n": "i32"}


def test_every_device_function_compiles_for_sm90_with_signal_cuh_s_ordering():
    assert len(_SIGNAL_CUH_ORDERING) == 2, _SIGNAL_CUH_ORDERING
    compiled = _compile(every_function, _EVERY, {"BLOCK": 1024})
    ptx = compiled.asm["ptx"]
    assert compiled.asm["cubin"]
    for instruction in (*_SIGNAL_CUH_ORDERING, "fence.sc.sys", "bar.sync",
                        "st.relaxed.sys.global.u64",   # signal_relaxed, after release_fence
                        # the atomics with the semantics and scopes the kernel asked for
                        "atom.global.sys.relaxed.add", "atom.global.acquire.gpu.cas",
                        "atom.global.sys.release.exch"):
        assert instruction in ptx, instruction
    # The peer check costs nothing outside debug mode.
    assert "__assertfail" not in ptx


def test_the_atomics_default_to_acq_rel_at_system_scope():
    ptx = _compile(atomics_by_default, {"words": "*i64", "table": "*i64"}).asm["ptx"]
    # (Triton spells compare-and-swap with the ordering first.)
    for instruction in ("atom.global.sys.acq_rel.add", "atom.global.acq_rel.sys.cas",
                        "atom.global.sys.acq_rel.exch"):
        assert instruction in ptx, instruction


def test_debug_mode_checks_the_peer_rank_with_device_assert():
    compiled = _compile(every_function, _EVERY, {"BLOCK": 1024}, debug=True)
    assert "__assertfail" in compiled.asm["ptx"]
    assert b"peer rank out of range" in compiled.asm["cubin"] or \
        "peer rank out of range" in compiled.asm["ptx"]


@pytest.mark.parametrize(("align", "width"), [(0, "b16"), (2, "b16"), (8, "v2.b32"),
                                              (16, "v4.b32")])
def test_align_lets_triton_vectorise_the_peers_accesses(align, width):
    # 4,096 bf16 from a peer and back, 128 threads: 32 elements a thread. Without align
    # the translated place is an integer turned pointer and every element is a load of
    # its own; with the view's alignment (16 on mapped memory) a thread makes 16-byte ones.
    divisible = {(i,): [["tt.divisibility", 16]] for i in range(4)}
    ptx = _compile(peer_row_copy, {"out": "*bf16", "x": "*bf16", "table": "*i64",
                                   "hidden": "i32"}, {"BLOCK": 4096, "ALIGN": align},
                   attrs=divisible).asm["ptx"]
    per_thread = 32 * 2 // {"b16": 2, "v2.b32": 8, "v4.b32": 16}[width]
    assert len(re.findall(rf"ld\.global\.{width}\b", ptx)) == per_thread
    assert len(re.findall(rf"st\.global\.{width}\b", ptx)) == per_thread


def test_the_barrier_kernel_compiles_for_sm90():
    import ipcshare.triton as ipt

    assert _compile(ipt.barrier_all_kernel, {"table": "*i64"}).asm["cubin"]


@pytest.mark.parametrize("example", sorted(_EXAMPLE_KERNELS))
def test_the_examples_kernels_compile_for_sm90(example, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    module = load_example(example)
    name, signature, constexprs = _EXAMPLE_KERNELS[example]
    ptx = _compile(getattr(module, name), signature, constexprs).asm["ptx"]
    assert _releases_and_acquires(ptx)


@pytest.mark.parametrize("example", sorted(_EXAMPLE_KERNELS))
def test_the_examples_kernels_compile_with_any_integer_argument_equal_to_one(example,
                                                                            monkeypatch):
    """Triton's launcher passes an integer argument equal to 1 as a constant (no tensor
    methods then): one row, one element or one zone must still compile. The fused
    all-reduce's first 4-rank run met it with one row (``rows.to``)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    module = load_example(example)
    name, signature, constexprs = _EXAMPLE_KERNELS[example]
    for argument in [name for name, kind in signature.items() if kind == "i32"]:
        rest = {key: kind for key, kind in signature.items() if key != argument}
        _compile(getattr(module, name), rest, dict(constexprs, **{argument: 1}))


def _releases_and_acquires(ptx: str) -> bool:
    """Whether ``ptx`` waits with signal.cuh's acquire load and signals with a release:
    signal.cuh's release store, or a system-scope fence and then relaxed stores at system
    scope (release_fence and signal_relaxed: PTX's release pattern)."""
    release_store, acquire_load = _SIGNAL_CUH_ORDERING
    if acquire_load not in ptx:
        return False
    fence = ptx.find("fence.sc.sys")
    relaxed = ptx.find("st.relaxed.sys.global.u64", fence + 1)
    return release_store in ptx or (fence >= 0 and relaxed > fence)


def test_barrier_all_fences_once_for_every_peer():
    import ipcshare.triton as ipt

    ptx = _compile(ipt.barrier_all_kernel, {"table": "*i64"}).asm["ptx"]
    assert _releases_and_acquires(ptx)
    # One fence before the loop over peers; no release store (its fence would wait for
    # the previous peer's signal to land: a round trip per peer).
    assert ptx.count("fence.sc.sys") == 1 and _SIGNAL_CUH_ORDERING[0] not in ptx


def test_the_interpreter_runs_the_data_functions_between_two_tensors():
    """Two CPU tensors stand for two ranks' windows (and two for a registration); rank 0's
    kernel reaches rank 1's through the table, as a GPU kernel reaches a peer's mapping.
    In a process of its own: Triton's interpreter is chosen when kernels are defined."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("the interpreter's arrays are torch tensors: needs torch")
    script = Path(__file__).with_name("triton_interpreted.py")
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    block = found["block"]
    assert found["peer_window"][:block] == list(range(block))                  # put
    assert found["dst"] == list(range(100, 100 + block))                        # get
    assert found["peer_window"][2 * block:3 * block] == list(range(1, block + 1))  # load, store
    assert found["peer_counters"] == [3, 7, 5, 0]   # add 3, cas 0->7 (then 0->9 fails), xchg 5
    assert found["own_counters"] == [0, 0, 0, 0]    # the old value xchg returned, and no other
    assert found["own_window_untouched"]
