"""Soak test: many window create/close cycles and many small ring iterations, with
descriptor, mapping and memory counts sampled along the way.

Run under mpiexec (``make soak`` runs it with 2 ranks on the host backend)::

    mpiexec -n 2 python tools/checks/soak.py [--backend host|cuda-ipc|cuda-vmm] [--windows 10000]
        [--ring-iters 100000] [--json F]

Each phase samples, on every rank, the open descriptors, the ``memfd:ipcshare`` mappings,
all mappings and the resident set size (and on a GPU backend the device memory in use)
after a warm-up and then every tenth of the run. A phase passes when descriptors and
ipcshare mappings end exactly where they started, resident memory grew by less than
``--rss-slack`` MiB and device memory in use by less than ``--gpu-slack`` MiB; the exit
status is 1 otherwise.
Ring results are checked (every rank holds every seeded block) at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import ipcshare
from ipcshare.patterns import make_pattern


def counts(group) -> dict[str, int]:
    """This process's descriptors, ipcshare mappings, all mappings, RSS (KiB) and, on a
    GPU backend, the device memory in use (KiB, whole device: every rank samples after a
    barrier, so all of them are at the same point)."""
    with open("/proc/self/maps") as maps:
        lines = maps.readlines()
    with open("/proc/self/status") as status:
        rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    sample = {"fds": len(os.listdir("/proc/self/fd")),
              "ipcshare_maps": sum("memfd:ipcshare" in line for line in lines),
              "maps": len(lines), "rss_kib": rss}
    if group.backend_name != "host":
        from ipcshare.runtime import cuda_driver

        free, total = cuda_driver.mem_get_info()
        sample["gpu_used_kib"] = (total - free) // 1024
    return sample


def soak_windows(group, cycles: int, nbytes: int) -> list[dict]:
    group.window(nbytes).close()  # warm-up: sockets, first-use imports, allocator
    group.barrier()
    samples = [{"cycle": 0, **counts(group)}]
    step = max(1, cycles // 10)
    stamp = np.zeros(8, dtype=np.uint8)
    for cycle in range(1, cycles + 1):
        with group.window(nbytes) as window:
            stamp[:] = cycle % 251
            window.engine.upload(window.local.slice(0, 8), stamp)
        if cycle % step == 0:
            group.barrier()
            samples.append({"cycle": cycle, **counts(group)})
    return samples


def soak_ring(group, iterations: int, size: int) -> tuple[list[dict], int]:
    ring = make_pattern("ring", "auto")
    plan = ring.plan(size, group.size, 4)
    window = group.window(ring.window_bytes(plan, group.size))
    try:
        ring.prepare(window, plan, "ring", 0)
        window.barrier()
        run = ring.bind(window, plan, "ring")
        run()  # warm-up
        window.synchronize()
        samples = [{"iteration": 0, **counts(group)}]
        step = max(1, iterations // 10)
        for iteration in range(1, iterations + 1):
            run()
            if iteration % step == 0:
                window.synchronize()
                samples.append({"iteration": iteration, **counts(group)})
        # Every pass re-sends the same seeded blocks: the data must still be exact.
        window.barrier()
        wrong = ring.check(window, plan, "ring", 0)
    finally:
        window.close()
    return samples, wrong


def flat(samples: list[dict], rss_slack_kib: int, gpu_slack_kib: int) -> bool:
    first, last = samples[0], samples[-1]
    gpu_growth = last.get("gpu_used_kib", 0) - first.get("gpu_used_kib", 0)
    return (first["fds"] == last["fds"] and first["ipcshare_maps"] == last["ipcshare_maps"]
            and last["rss_kib"] - first["rss_kib"] < rss_slack_kib
            and gpu_growth < gpu_slack_kib)


def _gpu_note(first: dict, last: dict) -> str:
    if "gpu_used_kib" not in first:
        return ""
    return f", gpu used {first['gpu_used_kib'] // 1024}->{last['gpu_used_kib'] // 1024} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="host", help="host | cuda-ipc | cuda-vmm")
    parser.add_argument("--windows", type=int, default=10_000)
    parser.add_argument("--window-bytes", type=int, default=64 * 1024)
    parser.add_argument("--ring-iters", type=int, default=100_000)
    parser.add_argument("--ring-bytes", type=int, default=1024)
    parser.add_argument("--exchange", default="auto")
    parser.add_argument("--rss-slack", type=float, default=16.0, help="MiB")
    parser.add_argument("--gpu-slack", type=float, default=2.0, help="MiB")
    parser.add_argument("--json", help="write every rank's samples here (rank 0)")
    args = parser.parse_args()
    slack, gpu_slack = int(args.rss_slack * 1024), int(args.gpu_slack * 1024)
    with ipcshare.Group(backend=args.backend, exchange=args.exchange) as group:
        comm = group.world.comm
        started = time.perf_counter()
        windows = soak_windows(group, args.windows, args.window_bytes)
        window_s = time.perf_counter() - started
        started = time.perf_counter()
        ring, wrong = soak_ring(group, args.ring_iters, args.ring_bytes)
        ring_s = time.perf_counter() - started
        report = {"rank": group.rank, "windows": windows, "window_seconds": window_s,
                  "ring": ring, "ring_seconds": ring_s, "ring_wrong": wrong,
                  "windows_flat": flat(windows, slack, gpu_slack),
                  "ring_flat": flat(ring, slack, gpu_slack),
                  "exchange": group.exchange_name, "backend": group.backend_name}
        reports = comm.gather(report, root=0)
    if reports is None:
        return 0
    ok = True
    for r in reports:
        w0, w1, g0, g1 = r["windows"][0], r["windows"][-1], r["ring"][0], r["ring"][-1]
        print(f"rank {r['rank']}: {len(r['windows']) and w1['cycle']} windows in "
              f"{r['window_seconds']:.1f} s ({r['backend']}, {r['exchange']}): fds "
              f"{w0['fds']}->{w1['fds']}, ipcshare maps {w0['ipcshare_maps']}->"
              f"{w1['ipcshare_maps']}, maps {w0['maps']}->{w1['maps']}, rss "
              f"{w0['rss_kib']}->{w1['rss_kib']} KiB{_gpu_note(w0, w1)}: "
              f"{'flat' if r['windows_flat'] else 'LEAK'}")
        print(f"rank {r['rank']}: {g1['iteration']} ring iterations in "
              f"{r['ring_seconds']:.1f} s: fds {g0['fds']}->{g1['fds']}, ipcshare maps "
              f"{g0['ipcshare_maps']}->{g1['ipcshare_maps']}, rss {g0['rss_kib']}->"
              f"{g1['rss_kib']} KiB{_gpu_note(g0, g1)}, wrong {r['ring_wrong']}: "
              f"{'flat' if r['ring_flat'] else 'LEAK'}")
        ok &= r["windows_flat"] and r["ring_flat"] and r["ring_wrong"] == 0
    if args.json:
        with open(args.json, "w") as out:
            json.dump(reports, out, indent=1)
    print("soak:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
