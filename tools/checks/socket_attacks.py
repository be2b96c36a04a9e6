"""Repeat the attacks on the descriptor sockets and the stopped-rank fault with real jobs,
and count what held (``make test`` runs one short instance of each: tests/faults).

    python tools/checks/socket_attacks.py relay    [--jobs 20] [--ranks 2 3]
    python tools/checks/socket_attacks.py stranger [--jobs 20]
    python tools/checks/socket_attacks.py stop     [--runs 50] [--timeout 3]
    python tools/checks/socket_attacks.py all      [--json FILE]

``relay``: a process of the job's user in a PID namespace of its own renames every rank's
socket away, binds its own under the name and relays each handshake to the real rank
(tests/faults/socket_relay.py), against the CLI (``ipcshare ring``, the relay watching the
folder from before the job starts) and against a Python job (tests/faults/relay_job.py,
the relay swapping every socket after the first window); the ranks each run in their own
PID namespace (``unshare -p -f --mount-proc``). Counts the descriptors the relay got.
``stranger``: a stranger in another PID namespace holds a silent connection through an
exchange, or replays a header captured from an earlier one (tests/faults/stranger_job.py):
counts the jobs that stay green. ``stop``: ``mpiexec.gforker -n 3 ipcshare ring -b 1K -e 32M
-n 100`` with signal and exchange timeouts of ``--timeout`` s, rank 1 SIGSTOPped 0-2.4 s
after the group made its socket directory (group setup, window, ceiling, table): counts
hangs, tracebacks, ranks without exactly one line, and the seconds from the stop to the
last rank's exit and to the launcher's return (gforker takes 1 s more for each rank that
left without MPI_Finalize). Needs root or user namespaces (unshare) and MPICH's launchers
next to the interpreter. Exit status 1 when any attack got through.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAULTS = HERE.parents[1] / "tests" / "faults"
# MPICH's launchers: beside this Python (the mpich wheel), or where IPCSHARE_MPICH_BIN
# says (a GPU node's own MPI is another one: tools/gpu_check.py's faults phase).
BIN = Path(os.environ.get("IPCSHARE_MPICH_BIN") or Path(sys.executable).parent)
HYDRA = str(BIN / "mpiexec")
GFORKER = str(BIN / "mpiexec.gforker")
UNSHARE = ["unshare", "-p", "-f", "--mount-proc"]


def _folder() -> str:
    """A private folder short enough for socket paths, one per job."""
    return tempfile.mkdtemp(prefix="atk-", dir="/tmp")


def relay_cli(ranks: int) -> dict:
    folder = _folder()
    try:
        relay = subprocess.Popen([*UNSHARE, "--kill-child=SIGTERM", sys.executable,
                                  str(FAULTS / "socket_relay.py"),
                                  folder, "20"], stdout=subprocess.PIPE, text=True)
        time.sleep(0.3)  # watching before the job starts
        env = dict(os.environ, IPCSHARE_SOCKET_DIR=folder, IPCSHARE_EXCHANGE_TIMEOUT="5")
        job = subprocess.run([HYDRA, "-n", str(ranks), *UNSHARE, sys.executable, "-m",
                              "ipcshare", "ring", "-b", "1K", "-e", "1M", "--backend", "host",
                              "--exchange", "socket"], capture_output=True, text=True,
                             timeout=120, env=env)
        relay.terminate()  # unshare passes it on (--kill-child)
        said, _ = relay.communicate(timeout=30)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return _relay_outcome(said, job)


def relay_python(ranks: int) -> dict:
    folder = _folder()
    try:
        env = dict(os.environ, IPCSHARE_SOCKET_DIR=folder, IPCSHARE_EXCHANGE_TIMEOUT="5")
        job = subprocess.run([HYDRA, "-n", str(ranks), *UNSHARE, sys.executable,
                              str(FAULTS / "relay_job.py"), "3"], capture_output=True,
                             text=True, timeout=120, env=env)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return _relay_outcome(job.stdout, job)


def _relay_outcome(said: str, job: subprocess.CompletedProcess) -> dict:
    found = re.search(r"swapped (\d+) stolen (\d+)", said or "")
    swapped, stolen = (int(found[1]), int(found[2])) if found else (None, None)
    text = job.stdout + job.stderr
    return {"rc": job.returncode, "swapped": swapped, "stolen": stolen,
            "owned_seen": "OWNED" in text,
            "refused_replaced": "is not the one that rank announced" in text
            or "was replaced" in text,
            "stderr_tail": job.stderr.splitlines()[-4:]}


def stranger(what: str) -> dict:
    folder = _folder()
    try:
        env = dict(os.environ, IPCSHARE_SOCKET_DIR=folder, IPCSHARE_EXCHANGE_TIMEOUT="5",
                   IPCSHARE_STRANGER_UNSHARE="1")
        job = subprocess.run([HYDRA, "-n", "2", *UNSHARE, sys.executable,
                              str(FAULTS / "stranger_job.py"), what, "20"],
                             capture_output=True, text=True, timeout=120, env=env)
        left = os.listdir(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    green = (job.returncode == 0 and "RANK 0 ok" in job.stdout and "RANK 1 ok refused=1"
             in job.stdout and (what != "replay" or "answered 0" in job.stdout))
    return {"rc": job.returncode, "green": green, "left": left}


def _rank_pids(marker: str) -> dict[int, int]:
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"peer_guard" in cmdline or f"ATTACK_MARK={marker}".encode() not in environ:
            continue
        for variable in environ:
            if variable.startswith(b"PMI_RANK="):
                found[int(variable[9:])] = int(entry)
    return found


def stop(timeout: float) -> dict:
    marker = f"{os.getpid()}-{time.monotonic_ns()}"
    folder = _folder()
    env = dict(os.environ, IPCSHARE_SOCKET_DIR=folder, IPCSHARE_SIGNAL_TIMEOUT=str(timeout),
               IPCSHARE_EXCHANGE_TIMEOUT=str(timeout), ATTACK_MARK=marker)
    job = subprocess.Popen([GFORKER, "-n", "3", sys.executable, "-m", "ipcshare", "ring", "-b",
                            "1K", "-e", "32M", "-n", "100", "--backend", "host", "--exchange",
                            "socket"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=env)
    # From the moment the group makes its socket directory (MPI is up, the command's
    # first agreements are done): a stop inside MPI_Init hangs in MPICH's own wait, and
    # one before the group waits IPCSHARE_ARRIVAL_TIMEOUT (docs/RELIABILITY.md).
    started = time.monotonic()
    while not os.listdir(folder) and job.poll() is None and time.monotonic() - started < 60:
        time.sleep(0.01)
    time.sleep(random.uniform(0.0, 2.4))
    ranks = _rank_pids(marker)
    victim = ranks.get(1)
    stopped = None
    if victim is not None:
        os.kill(victim, signal.SIGSTOP)
        stopped = time.monotonic()
    last_exit: list[float] = []
    watcher = threading.Thread(target=_note_last_exit, args=(list(ranks.values()), last_exit),
                               daemon=True)
    watcher.start()
    hung = False
    try:
        out, err = job.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        hung = True
        for pid in _rank_pids(marker).values():
            os.kill(pid, signal.SIGKILL)
        job.kill()
        out, err = job.communicate()
    took = None if stopped is None else time.monotonic() - stopped
    watcher.join(timeout=5)
    ranks_took = (round(last_exit[0] - stopped, 2) if stopped is not None and last_exit
                  else None)
    shutil.rmtree(folder, ignore_errors=True)
    lines = [line for line in err.splitlines() if line.startswith("ipcshare: error:")]
    return {"rc": job.returncode, "stopped": stopped is not None, "hung": hung,
            "seconds_after_stop": None if took is None else round(took, 2),
            "ranks_gone_after_stop": ranks_took,
            "traceback": "Traceback" in err, "lines": len(lines),
            "names_it": all("rank 1@" in line and "stopped responding" in line
                            for line in lines),
            "says_died": any(" died" in line for line in lines),
            "finished_first": "# Avg bus bandwidth" in out and stopped is not None,
            "stderr_tail": err.splitlines()[-6:]}


def _note_last_exit(pids: list[int], when: list[float]) -> None:
    """Append the moment the last of ``pids`` exited (gone or a zombie) to ``when``: the
    launcher may take longer to return (gforker sleeps 1 s for each rank that left
    without MPI_Finalize)."""
    ends = time.monotonic() + 130
    while time.monotonic() < ends:
        alive = False
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as stat:
                    alive |= stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
            except OSError:
                pass
        if not alive:
            when.append(time.monotonic())
            return
        time.sleep(0.01)


def _spread(values: list[float]) -> str:
    """``min-max s (median m)`` of ``values``, or ``-``."""
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[0]}-{ordered[-1]} s (median {ordered[len(ordered) // 2]})"


def _summary(name: str, results: list[dict]) -> dict:
    return {"attack": name, "runs": len(results), "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("relay", "stranger", "stop", "all"))
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--json", help="write every run's outcome here")
    args = parser.parse_args(argv)
    report, failed = [], False
    if args.what in ("relay", "all"):
        for ranks in args.ranks:
            for mode, run in (("cli", relay_cli), ("python", relay_python)):
                results = [run(ranks) for _ in range(args.jobs)]
                stolen = sum(r["stolen"] or 0 for r in results)
                failed |= stolen > 0 or any(r["owned_seen"] for r in results)
                swapped = sum(1 for r in results if r["swapped"])
                print(f"relay {mode} {ranks} ranks: {len(results)} jobs, relay swapped sockets "
                      f"in {swapped}, descriptors stolen {stolen}, jobs refusing the replaced "
                      f"socket {sum(r['refused_replaced'] for r in results)}, rc "
                      f"{sorted({r['rc'] for r in results})}", flush=True)
                report.append(_summary(f"relay {mode} {ranks}", results))
    if args.what in ("stranger", "all"):
        for what in ("hold", "replay"):
            results = [stranger(what) for _ in range(args.jobs)]
            green = sum(r["green"] for r in results)
            failed |= green < len(results)
            print(f"stranger {what}: {green} of {len(results)} jobs green", flush=True)
            report.append(_summary(f"stranger {what}", results))
    if args.what in ("stop", "all"):
        results = [stop(args.timeout) for _ in range(args.runs)]
        stopped = [r for r in results if r["stopped"] and not r["finished_first"]]
        bound = 2 * (2 * args.timeout)
        late = [r for r in stopped if r["seconds_after_stop"] > bound]
        bad = [r for r in stopped if r["hung"] or r["traceback"] or r["lines"] != 3
               or not r["names_it"] or r["says_died"]]
        failed |= bool(bad or late)
        took = [r["seconds_after_stop"] for r in stopped]
        gone = [r["ranks_gone_after_stop"] for r in stopped
                if r["ranks_gone_after_stop"] is not None]
        print(f"stop: {len(results)} runs, {len(stopped)} stopped mid-run; hung "
              f"{sum(r['hung'] for r in stopped)}, traceback {sum(r['traceback'] for r in stopped)}"
              f", not one line per rank {sum(r['lines'] != 3 for r in stopped)}, not naming the "
              f"stopped rank {sum(not r['names_it'] for r in stopped)}, saying died "
              f"{sum(r['says_died'] for r in stopped)}; the launcher returned {_spread(took)} "
              f"after the stop, over {bound:g} s: {len(late)}, within {1.5 * bound / 2:g} s: "
              f"{sum(t <= 1.5 * bound / 2 for t in took)}; every rank had exited "
              f"{_spread(gone)} after it", flush=True)
        report.append(_summary("stop", results))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
