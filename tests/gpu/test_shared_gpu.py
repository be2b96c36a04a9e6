"""Several ranks on one GPU (run with more ranks than GPUs, or CUDA_VISIBLE_DEVICES=0):
the group names the shared GPUs alike on every rank, and those that take turns (no MPS);
where GPUs take turns, barriers meet on the host, auto all-gathers with the leader kernel
(one rank per GPU moves its GPU's blocks) and communicators run stepped kernels; under
MPS the usual kernels run; every pattern and collective still verifies. Skips where
every rank has a GPU of its own. Run it under MPS too (gpu-check's shared phase does)."""

from __future__ import annotations

import pytest

import ipcshare
from ipcshare.patterns import make_pattern
from ipcshare.patterns.allgather_auto import AutoAllGather
from ipcshare.patterns.driver import run_pattern
from ipcshare.runtime.config import merge_options

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]


@pytest.mark.parametrize("backend", ["cuda-ipc", "cuda-vmm"])
@pytest.mark.parametrize("graph", [False, True])
def test_ranks_sharing_a_gpu_verify_every_pattern_with_or_without_mps(comm, backend, graph):
    with ipcshare.Group(backend=backend) as g:
        places = comm.allgather((g.world.hostname, g.backend.uuid))
        if len(set(places)) == len(places):
            pytest.skip("every rank has a GPU of its own (run more ranks than GPUs)")
        # The same map on every rank, naming exactly the ranks that share.
        expected = {}
        for rank, (host, uuid) in enumerate(places):
            if host == g.world.hostname and places.count((host, uuid)) > 1:
                expected.setdefault(uuid, []).append(rank)
        assert g.shared_gpus == expected
        assert comm.allgather(sorted(map(tuple, g.shared_gpus.values()))) == [
            sorted(map(tuple, expected.values()))] * comm.size
        # Under MPS the ranks of a GPU run side by side: nothing takes turns.
        under_mps = comm.allgather(g.backend.under_mps)
        assert g.time_sliced_gpus == {uuid: ranks for uuid, ranks in expected.items()
                                      if not all(under_mps[r] for r in ranks)}
        options = merge_options({"backend": backend, "iters": 3, "warmup": 1, "checks": 2,
                                 "min_bytes": 1, "max_bytes": 4 << 20, "step_factor": 9,
                                 "graph": graph})
        auto = AutoAllGather()
        lines: list[str] = []
        result = run_pattern(g, auto, options, emit=lines.append)
        assert result.wrong_total == 0 and all(row.wrong == 0 for row in result.rows)
        # One rank per GPU moves the bytes only where the GPU takes turns; under MPS the
        # ranks run side by side and auto keeps its usual kernels.
        if g.time_sliced_gpus:
            assert auto.last_choice == "leader"
        else:
            assert auto.last_choice not in ("leader", "copy-engine")
        if comm.rank == 0:
            assert any("GPUs shared by several ranks" in line and "MPS" in line
                       for line in lines)
        for name in ("leader", "copy-engine"):
            explicit = run_pattern(g, make_pattern("allgather", name), options,
                                   emit=lambda _line: None)
            assert explicit.wrong_total == 0
        ring = run_pattern(g, make_pattern("ring"), options, emit=lambda _line: None)
        assert ring.wrong_total == 0


@pytest.mark.parametrize("backend", ["cuda-ipc", "cuda-vmm"])
def test_a_communicator_on_shared_gpus_runs_stepped_calls_eager_and_in_graphs(comm, backend):
    """Where the shared GPU takes turns (no MPS), auto runs the stepped kernels (no kernel
    spins on a peer that waits for its turn on the GPU); under MPS the usual kernels.
    Every collective is right eager and over 200 graph replays with new data, the flag
    sets alternating through calls of every kind."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from tests.reduction_reference import mismatches, reference, seeded_values

    from .torch_communicator import torch_communicator

    per_rank = 10_007  # float32 elements: the arrays hold the ranks times these
    with torch_communicator(backend, 1 << 20,
                            per_rank_bytes=4 * per_rank) as (group, cm, stream):
        if not group.shared_gpus:
            pytest.skip("every rank has a GPU of its own (run more ranks than GPUs)")
        device = f"cuda:{group.backend.device}"
        count = per_rank * cm.size
        tensor = torch.zeros(count, dtype=torch.float32, device=device)
        reduced = torch.zeros_like(tensor)
        block = torch.zeros(count // cm.size, dtype=torch.float32, device=device)
        gathered = torch.zeros(count, dtype=torch.float32, device=device)

        def calls():  # on torch's current stream, so ordered with the tensors' copies
            cm.all_reduce(tensor, output=reduced, stream=stream)
            cm.reduce_scatter(block, tensor, stream=stream)
            cm.all_gather(gathered, block, stream=stream)

        def check(seed):
            inputs = [seeded_values("float32", count, seed, r) for r in range(cm.size)]
            want = reference("float32", "sum", inputs)
            return inputs, want

        inputs, want = check(0)
        tensor.copy_(torch.from_numpy(inputs[cm.rank]))
        calls()
        cm.synchronize(stream)
        assert mismatches("float32", "sum", reduced.cpu().numpy(), want) == 0
        assert mismatches("float32", "sum", gathered.cpu().numpy(), want) == 0
        chosen = {signature.op: signature.algo for signature, _ in cm._signatures.values()}
        assert set(chosen) == {"all_reduce", "reduce_scatter", "all_gather"}
        if group.time_sliced_gpus:
            assert set(chosen.values()) == {"stepped"}
        else:
            assert "stepped" not in chosen.values()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            calls()
        for replay in range(200):
            inputs, want = check(replay + 1)
            tensor.copy_(torch.from_numpy(inputs[cm.rank]))
            graph.replay()
            stream.synchronize()
            assert mismatches("float32", "sum", reduced.cpu().numpy(), want) == 0, replay
            assert np.array_equal(gathered.cpu().numpy().view(np.int32),
                                  reduced.cpu().numpy().view(np.int32)), replay
        cm.synchronize(stream)


@pytest.mark.parametrize("backend", ["cuda-ipc", "cuda-vmm"])
def test_the_leader_of_a_time_sliced_gpu_runs_its_guests_stepped_calls(comm, backend):
    """On a GPU that takes turns, the lowest rank there runs the stepped calls of the
    others (collectives/time_sliced.py): it reads and writes their arrays from empty()
    and their registered arrays in place, while their own tensors are copied in and out
    by the guests themselves. Every placement gives the right bits, eager and bound, with
    every op; a call whose ranks disagree still fails on every rank."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from ipcshare.runtime.errors import CollectiveError
    from tests.reduction_reference import mismatches, reference, seeded_values

    from .torch_communicator import torch_communicator

    per_rank = 4099  # float32 elements: the arrays hold the ranks times these
    with torch_communicator(backend, 1 << 20,
                            per_rank_bytes=4 * per_rank) as (group, cm, stream):
        if not group.time_sliced_gpus:
            pytest.skip("no GPU takes turns here (each rank has its own, or MPS serves it)")
        role = cm._path._time_sliced
        ranks = next((r for r in group.time_sliced_gpus.values() if cm.rank in r), None)
        if ranks is None:
            assert role is None  # a GPU of its own: its calls run as usual
        else:
            assert role.leader == min(ranks) and role.guest == (cm.rank != min(ranks))
        device = f"cuda:{group.backend.device}"
        count = per_rank * cm.size
        inputs = [seeded_values("float32", count, 7, r) for r in range(cm.size)]
        want = reference("float32", "sum", inputs)
        mine = torch.from_numpy(inputs[cm.rank]).to(device)
        heap = torch.from_dlpack(cm.empty((count,), "float32"))
        heap_out = torch.from_dlpack(cm.empty((count,), "float32"))
        user = torch.empty(count, dtype=torch.float32, device=device)
        user_out = torch.empty_like(user)
        kept, kept_out = torch.empty_like(user), torch.empty_like(user)
        cm.register(kept)
        cm.register(kept_out)
        placements = {"heap": (heap, heap_out, 0), "user": (user, user_out, 1),
                      "heap in, user out": (heap, user_out, 0),
                      "registered": (kept, kept_out, 0)}
        for name, (source, output, copies) in placements.items():
            source.copy_(mine)
            output.zero_()
            before = cm.copies_in
            cm.all_reduce(source, output=output, algo="stepped", stream=stream)
            cm.synchronize(stream)
            assert mismatches("float32", "sum", output.cpu().numpy(), want) == 0, name
            assert cm.copies_in - before == copies, name
            # In place, the input is staged first (by the leader where it reaches it).
            cm.all_reduce(source, algo="stepped", stream=stream)
            cm.synchronize(stream)
            assert mismatches("float32", "sum", source.cpu().numpy(), want) == 0, name
        # reduce-scatter and all-gather, bound once, into arrays of every kind.
        block = torch.from_dlpack(cm.empty((count // cm.size,), "float32"))
        gathered = torch.zeros(count, dtype=torch.float32, device=device)
        heap.copy_(mine)
        scatter = cm.bind("reduce_scatter", block, heap, algo="stepped", stream=stream)
        gather = cm.bind("all_gather", gathered, block, algo="stepped", stream=stream)
        for _ in range(3):
            gathered.zero_()
            scatter()
            gather()
            cm.synchronize(stream)
            assert np.array_equal(gathered.cpu().numpy().view(np.int32),
                                  np.asarray(want, np.float32).view(np.int32))
        # A call whose shape differs on one rank raises everywhere, proxied or not.
        odd = heap[:count - 1 - (cm.rank == cm.size - 1)]
        with pytest.raises(CollectiveError, match="disagree"):
            cm.all_reduce(odd, algo="stepped", stream=stream)
            cm.synchronize(stream)
        cm.unregister(kept_out)
        cm.unregister(kept)


@pytest.mark.parametrize("backend", ["cuda-ipc", "cuda-vmm"])
def test_a_guests_own_tensors_are_handed_to_its_leader_and_then_cost_it_no_copy(comm, backend):
    """A guest's plain torch tensors (the caching allocator's memory) are mapped by its
    leader after a few calls (collectives/guest_imports.py); from then on the guest
    copies nothing: eager, bound and in a graph captured afterwards, in and out of
    place, with every op. Memory freed and allocated again at the same address is
    handed over anew, never taken for the old allocation. Run it with torch's
    expandable segments too (cuMem memory, passed by pidfd_getfd): gpu-check does."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from tests.reduction_reference import mismatches, reference, seeded_values

    from .torch_communicator import torch_communicator

    per_rank = 4099  # float32 elements: the arrays hold the ranks times these
    with torch_communicator(backend, 1 << 20,
                            per_rank_bytes=4 * per_rank) as (group, cm, stream):
        if not group.time_sliced_gpus:
            pytest.skip("no GPU takes turns here (each rank has its own, or MPS serves it)")
        path = cm._path
        role = path._time_sliced
        device = f"cuda:{group.backend.device}"
        count = per_rank * cm.size

        def data(seed):
            inputs = [seeded_values("float32", count, seed, r) for r in range(cm.size)]
            return torch.from_numpy(inputs[cm.rank]).to(device), reference("float32", "sum",
                                                                           inputs)

        def guest_copies(call) -> list[int]:
            """Every rank's own copies in ``call`` (each a hand-over of the GPU)."""
            before = path.guest_copies
            call()
            cm.synchronize(stream)
            return comm.allgather(path.guest_copies - before)

        def all_reduce_into(source, output, seed):
            mine, want = data(seed)
            source.copy_(mine)
            output.zero_()
            copies = guest_copies(lambda: cm.all_reduce(source, output=output, algo="stepped",
                                                        stream=stream))
            assert mismatches("float32", "sum", output.cpu().numpy(), want) == 0, seed
            return copies

        user = torch.empty(count, dtype=torch.float32, device=device)
        user_out = torch.empty_like(user)
        first = all_reduce_into(user, user_out, 0)
        is_guest = comm.allgather(role is not None and role.guest)
        guests = [r for r in range(cm.size) if is_guest[r]]
        assert all(first[r] == 2 for r in guests)  # in and out, until the leader replies
        for attempt in range(1, 40):
            copies = all_reduce_into(user, user_out, attempt)
            if not any(copies):
                break
        assert not any(copies), f"guests still copy after {attempt} calls: {copies}"
        assert attempt <= 4, attempt  # posted, mapped at the leader's next call, replied
        if role is not None and not role.guest and guests:
            assert role.imports.mapped >= 1
        # In place, reduce-scatter and all-gather into tensors, bound: no copies.
        mine, want = data(50)
        user.copy_(mine)
        assert not any(guest_copies(lambda: cm.all_reduce(user, algo="stepped",
                                                          stream=stream)))
        assert mismatches("float32", "sum", user.cpu().numpy(), want) == 0
        block = torch.empty(count // cm.size, dtype=torch.float32, device=device)
        gathered = torch.zeros(count, dtype=torch.float32, device=device)
        user.copy_(mine)
        for _ in range(4):  # the new tensors may lie in another segment: handed over too
            guest_copies(lambda: (cm.reduce_scatter(block, user, algo="stepped", stream=stream),
                                  cm.all_gather(gathered, block, algo="stepped",
                                                stream=stream)))
        scatter = cm.bind("reduce_scatter", block, user, algo="stepped", stream=stream)
        gather = cm.bind("all_gather", gathered, block, algo="stepped", stream=stream)
        gathered.zero_()
        assert not any(guest_copies(lambda: (scatter(), gather())))
        assert np.array_equal(gathered.cpu().numpy().view(np.int32),
                              np.asarray(want, np.float32).view(np.int32))
        # A graph captured now replays with new data and copies nothing.
        graph = torch.cuda.CUDAGraph()
        before = path.guest_copies
        with torch.cuda.graph(graph, stream=stream):
            cm.all_reduce(user, output=user_out, algo="stepped", stream=stream)
        assert path.guest_copies == before
        for replay in range(20):
            mine, want = data(100 + replay)
            user.copy_(mine)
            graph.replay()
            stream.synchronize()
            assert mismatches("float32", "sum", user_out.cpu().numpy(), want) == 0, replay
        del graph
        # Freed and allocated again at the same address (cuMemFree then cuMemAlloc of the
        # same size: the driver gives the address back): a new allocation, handed over
        # anew, never the old mapping; through the call cache too, whose key (pointer,
        # length) is the same for both.
        from cuda.bindings import driver as cu

        from ipcshare.backends.device_buffer import DeviceArray

        nbytes = 8 << 20

        def raw_tensor():
            err, ptr = cu.cuMemAlloc(nbytes)
            assert err == cu.CUresult.CUDA_SUCCESS, err
            array = DeviceArray(int(ptr), nbytes, group.backend.device, owner=None,
                                shape=(nbytes // 4,), dtype="float32")
            return int(ptr), torch.from_dlpack(array)

        old, big = raw_tensor()
        for attempt in range(6):
            all_reduce_into(big[:count], user_out, 200 + attempt)
        copies = guest_copies(lambda: cm.all_reduce(big[:count], output=user_out,
                                                    algo="stepped", stream=stream))
        assert not any(copies), copies  # mapped by the leader by now
        stream.synchronize()
        big = None  # the view goes before the memory
        assert cu.cuMemFree(old)[0] == cu.CUresult.CUDA_SUCCESS
        new, big = raw_tensor()
        reused = comm.allgather(new == old)
        for attempt in range(6):
            all_reduce_into(big[:count], user_out, 300 + attempt)  # right every time
            all_reduce_into(user_out, big[count:2 * count], 400 + attempt)
        assert not any(guest_copies(lambda: cm.all_reduce(big[:count], output=user_out,
                                                          algo="stepped", stream=stream)))
        if role is not None and role.guest:
            assert reused[comm.rank], "the driver gave the freed memory a new address: " \
                "the test of a reused address did not happen"
        stream.synchronize()
        big = None
        cu.cuMemFree(new)
        cm.synchronize(stream)


@pytest.mark.parametrize("backend", ["cuda-ipc", "cuda-vmm"])
def test_remembered_calls_keep_none_of_the_callers_tensors_alive(comm, backend):
    """The call cache remembers each call by what identifies its tensors, never the
    tensors: those the caller drops are freed. A guest's remembered calls used to hold
    theirs (to bind again once its leader mapped them), up to 64 calls' worth: a sweep of
    1 GiB calls ran a guest out of memory with 25 GiB of dropped tensors still alive."""
    torch = pytest.importorskip("torch")
    import gc
    import weakref

    from .torch_communicator import torch_communicator

    with torch_communicator(backend, 1 << 20) as (group, cm, stream):
        if not group.time_sliced_gpus:
            pytest.skip("no GPU takes turns here (each rank has its own, or MPS serves it)")
        device = f"cuda:{group.backend.device}"
        dropped = []
        for value in range(1, 5):
            tensor = torch.full((4099,), float(value), device=device)
            out = torch.empty_like(tensor)
            cm.all_reduce(tensor, output=out, stream=stream)  # auto: stepped here
            cm.synchronize(stream)
            assert bool((out == value * cm.size).all()), value
            dropped += [weakref.ref(tensor), weakref.ref(out)]
            del tensor, out
        gc.collect()
        alive = comm.allgather(sum(ref() is not None for ref in dropped))
        assert alive == [0] * cm.size, f"dropped tensors still alive, by rank: {alive}"


@pytest.mark.parametrize("backend", ["cuda-ipc", "cuda-vmm"])
@pytest.mark.parametrize("op", ["allreduce", "reducescatter"])
def test_the_clis_graphs_capture_a_guests_calls_after_its_leader_mapped_them(comm, op,
                                                                             backend):
    """The CLI's graph mode runs its library calls eagerly before capturing them, so on a
    time-sliced GPU the graphs it times name the guests' arrays by the leader's mapping
    instead of capturing a guest's copies (before: about 300 µs per 2-rank call instead of
    about 35). Every check still verifies."""
    with ipcshare.Group(backend=backend) as g:
        if not g.time_sliced_gpus:
            pytest.skip("no GPU takes turns here (each rank has its own, or MPS serves it)")
        iters = 20
        options = merge_options({"backend": backend, "iters": iters, "warmup": 1,
                                 "checks": 2, "min_bytes": 65536, "max_bytes": 65536,
                                 "graph": True})
        pattern = make_pattern(op, "auto")
        try:
            result = run_pattern(g, pattern, options, emit=lambda _line: None)
            assert result.wrong_total == 0
            copies = comm.allgather(pattern._communicator._path.guest_copies)
        finally:
            pattern.close()
        # Two copies a call in the first two warm-up rounds at most, per mode; the 2 x
        # (checks + iters) captured calls make none.
        assert max(copies) <= 2 * 2 * len(pattern.modes), copies


@pytest.mark.parametrize("algo", ["stepped", "copy-engine"])
@pytest.mark.parametrize("silent", ["guest", "leader"])
def test_a_silent_rank_of_a_time_sliced_gpu_is_named_and_nothing_hangs(comm, silent, algo):
    """A guest that never hands its call over is named by its leader's timeout, a leader
    that never runs by its guests' (stepped); a rank that never meets the stream barriers
    of a copy-engine call, by the others'. Every rank gives up within the timeout and the
    group closes (the waits left unmet are met from the host on close)."""
    torch = pytest.importorskip("torch")
    from ipcshare.runtime.errors import SignalTimeout

    with ipcshare.Group(backend="cuda-vmm", timeout=2.0) as group:
        shared = sorted(next((ranks for ranks in group.time_sliced_gpus.values()), []))
        if len(shared) < 2:
            pytest.skip("no GPU takes turns here (each rank has its own, or MPS serves it)")
        leader, guest = shared[0], shared[1]
        quiet = guest if silent == "guest" else leader
        device = group.backend.device
        torch.cuda.set_device(device)
        with group.communicator(max_bytes=1 << 16) as cm:
            array = torch.from_dlpack(cm.empty((1024,), "float32")).fill_(1)
            cm.all_reduce(array, algo=algo)  # agreed and bound by every rank
            cm.synchronize()
            comm.Barrier()
            outcome = "ok"
            if group.rank != quiet:
                cm.all_reduce(array, algo=algo)
                try:
                    cm.synchronize()
                except SignalTimeout as exc:
                    outcome = str(exc)
            comm.Barrier()
            if group.rank == quiet:
                assert outcome == "ok"
            elif algo == "copy-engine":
                assert f"stream barrier waiting for rank {quiet}" in outcome, outcome
            elif silent == "guest" and group.rank == leader:
                assert (f"rank {leader} waiting for rank {guest}, which shares its GPU, to "
                        "hand over its collective call") in outcome, outcome
            elif silent == "leader" and group.rank in shared:
                assert (f"waiting for rank {leader}, which runs its collective calls on the "
                        "GPU they share") in outcome, outcome
            else:
                assert outcome != "ok"  # waited for a rank that never came, and said so


@pytest.mark.parametrize("silent", ["guest", "leader"])
def test_the_leader_all_gathers_graph_names_a_silent_rank_of_its_gpu(comm, silent):
    """In a CUDA graph on a GPU that takes turns, the leader all-gather's guests only hand
    their calls over and their leader meets the barriers for them. A guest that never
    launches its graph is named by its leader's timeout, a leader that never launches
    its own by its guests' (and the ranks of other GPUs give up waiting too); every rank
    closes its window."""
    from ipcshare.patterns.allgather_leader import LeaderAllGather, gpu_leaders
    from ipcshare.runtime.errors import SignalTimeout

    with ipcshare.Group(backend="cuda-vmm", timeout=2.0) as group:
        shared = sorted(next((ranks for ranks in group.time_sliced_gpus.values()), []))
        if len(shared) < 2:
            pytest.skip("no GPU takes turns here (each rank has its own, or MPS serves it)")
        leader, guest = shared[0], shared[1]
        quiet = guest if silent == "guest" else leader
        pattern = LeaderAllGather()
        window = group.window(1 << 20)
        view = window.on_stream(window.engine.stream, graph_safe=True)
        plan = pattern.plan(64 << 10, group.size, 1)
        assert gpu_leaders(window)[guest] == leader
        graph = window.engine.capture(pattern.bind(view, plan, "out-of-place"))
        comm.Barrier()
        outcome = "ok"
        if group.rank != quiet:
            graph.launch()
            try:
                window.synchronize()
            except SignalTimeout as exc:
                outcome = str(exc)
        comm.Barrier()
        window.close()  # meets the waits left unmet, so the stream drains
        graph.close()
    if group.rank == quiet:
        assert outcome == "ok"
    elif silent == "guest" and group.rank == leader:
        assert (f"rank {leader} waiting for rank {guest}, which shares its GPU, to reach "
                "the all-gather") in outcome, outcome
    elif silent == "leader" and group.rank in shared:
        assert (f"waiting for rank {leader}, which runs its all-gather on the GPU they "
                "share, to finish it") in outcome, outcome
    else:
        assert outcome != "ok"  # waited in a graph barrier for a rank that never came
