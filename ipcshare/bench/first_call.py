"""How long a user's first collective takes on one GPU: the kernels shipped in the package
against compiling them, then warm.

Runs, each in a fresh process tree:

1. CLI: ``mpiexec -n RANKS python -m ipcshare allreduce -b 1K -e 1K -n 5 -w 1`` (wall time)
   - ``shipped``: an empty kernel cache (a new temporary IPCSHARE_KERNEL_CACHE), the
     package's CUBINs;
   - ``warm``: the same again (driver, MPS, files warm);
   - ``compile`` (with ``--compile``): an empty cache and IPCSHARE_KERNEL_SHIPPED=0,
     every kernel compiled by NVRTC (a minute or more);
2. Python, under the same mpiexec: ``ipcshare.Group()``, ``g.communicator()``, the first
   ``all_reduce`` of a 1 KiB float32 tensor (torch, else cupy), each timed on every rank
   (the slowest rank's is reported), for ``shipped`` and ``warm``.

It prints a table and writes JSON (``--json``, default first_call.json) with the
commit, date, host, GPU, NVRTC and where each kernel came from. Needs only the installed
package (and torch or cupy for part 2): no network, no NVRTC unless ``--compile``.
It lives in the package, so that a node given only the wheel runs it; under MPS for the
ranks sharing the GPU (docs/GPU.md, "First-call benchmark")::

    python -m ipcshare.bench.first_call --ranks 2 --json out/first_call.json

(``tools/first_call_bench.py`` runs the same from a checkout.)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main", "CLI_TARGET_S", "PYTHON_TARGET_S"]

# The targets the benchmark is judged by (README, docs/GPU.md).
CLI_TARGET_S = 5.0
PYTHON_TARGET_S = 3.0

_PYTHON_PART = r"""
import json, sys, time
t0 = time.perf_counter()
import ipcshare
t_import = time.perf_counter() - t0


def device_array(backend):
    # The user's own tensor: torch, else cupy; host memory (numpy) on the host backend.
    if not backend.device_memory:
        import numpy
        return numpy.ones(256, numpy.float32), lambda: None
    try:
        import torch
        torch.cuda.set_device(backend.device)
        return (torch.ones(256, dtype=torch.float32, device=f"cuda:{backend.device}"),
                torch.cuda.synchronize)
    except ImportError:
        import cupy
        cupy.cuda.Device(backend.device).use()
        return cupy.ones(256, dtype=cupy.float32), cupy.cuda.Device().synchronize


t = time.perf_counter()
with ipcshare.Group() as g:
    t_group = time.perf_counter() - t
    t = time.perf_counter()
    with g.communicator(max_bytes=1 << 20) as comm:
        t_comm = time.perf_counter() - t
        x, sync = device_array(g.backend)
        sync()
        t = time.perf_counter()
        comm.all_reduce(x, op="sum")
        comm.synchronize()
        sync()
        t_first = time.perf_counter() - t
        ok = float(x[0]) == float(g.size)
    times = {"import_s": t_import, "group_s": t_group, "communicator_s": t_comm,
             "first_all_reduce_s": t_first, "correct": ok, "backend": g.backend.name}
    gathered = g.world.comm.gather(times, root=0)
    if g.rank == 0:
        print("FIRST_CALL_JSON " + json.dumps(gathered))
"""


def _run(command: list[str], env: dict[str, str], timeout: float) -> tuple[float, int, str]:
    started = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout
        return time.perf_counter() - started, 124, (out or "") + "\n(timed out)"
    return time.perf_counter() - started, done.returncode, done.stdout + done.stderr


def _commit() -> str:
    """The commit the shipped kernels were built from (the manifest's), else the checkout's
    this module lies in, else "unknown"."""
    from ipcshare.kernels.shipped import manifest_facts

    built = manifest_facts().get("commit")
    if built:
        return str(built)
    here = Path(__file__).resolve().parent
    try:
        return subprocess.run(["git", "-C", str(here), "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=10).stdout.strip() \
            or "unknown"
    except OSError:
        return "unknown"


def _gpu() -> str:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                               "--format=csv,noheader", "-i", "0"], capture_output=True,
                              text=True, timeout=30)
        return done.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _kernel_origins(env: dict[str, str]) -> str:
    """`ipcshare kernels` on this node, as the runs see the package."""
    _, _, out = _run([sys.executable, "-m", "ipcshare", "kernels"], env, 120)
    return out


def _nvrtc_facts() -> dict:
    """Which NVRTC built the shipped CUBINs and which (if any) is installed here: recorded
    beside the figures, though the shipped CUBINs serve whatever NVRTC is installed."""
    from ipcshare.kernels.shipped import installed_nvrtc, manifest_facts

    return {"shipped_built_by": manifest_facts().get("nvrtc"), "installed": installed_nvrtc()}


def _python_part(mpiexec: list[str], env: dict[str, str], timeout: float) -> dict:
    wall, rc, out = _run([*mpiexec, sys.executable, "-c", _PYTHON_PART], env, timeout)
    row: dict = {"wall_s": wall, "rc": rc}
    for line in out.splitlines():
        if line.startswith("FIRST_CALL_JSON "):
            ranks = json.loads(line.split(" ", 1)[1])
            for key in ("import_s", "group_s", "communicator_s", "first_all_reduce_s"):
                row[key] = max(rank[key] for rank in ranks)
            row["correct"] = all(rank["correct"] for rank in ranks)
            row["backend"] = ranks[0]["backend"]
            row["to_first_result_s"] = (row["group_s"] + row["communicator_s"]
                                        + row["first_all_reduce_s"])
    if "to_first_result_s" not in row:
        row["output"] = out[-2000:]
    return row


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0 when every run exited 0 (whether the targets were met
    is in the table and the JSON)."""
    parser = argparse.ArgumentParser(prog="first_call",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="ranks on the one GPU (2)")
    parser.add_argument("--mpiexec", default=None,
                        help="the launcher (default: mpiexec beside this Python, else on PATH)")
    parser.add_argument("--compile", action="store_true",
                        help="also time a first call that compiles every kernel (slow)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a run may take")
    parser.add_argument("--json", default="first_call.json", help="where the JSON goes")
    args = parser.parse_args(argv)

    mpiexec_path = args.mpiexec or (
        str(Path(sys.executable).parent / "mpiexec")
        if (Path(sys.executable).parent / "mpiexec").exists() else shutil.which("mpiexec"))
    if mpiexec_path is None:
        sys.exit("first_call: no mpiexec found; pass --mpiexec")
    mpiexec = [mpiexec_path, "-n", str(args.ranks)]
    cli = [*mpiexec, sys.executable, "-m", "ipcshare", "allreduce", "-b", "1K", "-e", "1K",
           "-n", "5", "-w", "1"]
    base = {key: value for key, value in os.environ.items()
            if key not in ("IPCSHARE_KERNEL_CACHE", "IPCSHARE_KERNEL_SHIPPED")}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="first-call-") as scratch:
        origins = _kernel_origins({**base, "IPCSHARE_KERNEL_CACHE": f"{scratch}/status"})
        plans = [("shipped", {"IPCSHARE_KERNEL_CACHE": f"{scratch}/cli-shipped"}),
                 ("warm", {"IPCSHARE_KERNEL_CACHE": f"{scratch}/cli-shipped"})]
        if args.compile:
            plans.append(("compile", {"IPCSHARE_KERNEL_CACHE": f"{scratch}/cli-compile",
                                      "IPCSHARE_KERNEL_SHIPPED": "0"}))
        for name, extra in plans:
            wall, rc, out = _run(cli, {**base, **extra}, args.timeout)
            rows.append({"part": "cli", "run": name, "wall_s": wall, "rc": rc,
                         **({} if rc == 0 else {"output": out[-2000:]})})
        for name, extra in (("shipped", {"IPCSHARE_KERNEL_CACHE": f"{scratch}/py-shipped"}),
                            ("warm", {"IPCSHARE_KERNEL_CACHE": f"{scratch}/py-shipped"})):
            rows.append({"part": "python", "run": name,
                         **_python_part(mpiexec, {**base, **extra}, args.timeout)})

    import ipcshare

    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": _commit(), "host": platform.node(), "python": platform.python_version(),
              "ipcshare": ipcshare.__version__, "package": str(Path(ipcshare.__file__).parent),
              "gpu": _gpu(), "ranks": args.ranks,
              "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
              "cli_command": " ".join(cli), "kernels": origins,
              "nvrtc": _nvrtc_facts(), "rows": rows,
              "targets": {"cli_shipped_s": CLI_TARGET_S, "python_shipped_s": PYTHON_TARGET_S}}
    cli_shipped = next(row for row in rows if row["part"] == "cli" and row["run"] == "shipped")
    py_shipped = next(row for row in rows if row["part"] == "python" and row["run"] == "shipped")
    result["met"] = {
        "cli": cli_shipped["rc"] == 0 and cli_shipped["wall_s"] <= CLI_TARGET_S,
        "python": py_shipped.get("to_first_result_s", float("inf")) <= PYTHON_TARGET_S
        and bool(py_shipped.get("correct"))}
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")

    print(f"first call on {result['gpu']}, {args.ranks} ranks"
          f"{' under MPS' if result['mps'] else ''}, backend "
          f"{py_shipped.get('backend', '?')}, ipcshare at {result['commit']}")
    print(f"{'part':<7} {'run':<8} {'wall s':>7} {'group s':>8} {'comm s':>7} "
          f"{'1st call s':>10} {'rc':>3}")
    for row in rows:
        cells = [f"{row[key]:>{width}.2f}" if key in row else " " * (width - 1) + "-"
                 for key, width in (("wall_s", 7), ("group_s", 8), ("communicator_s", 7),
                                    ("first_all_reduce_s", 10))]
        print(f"{row['part']:<7} {row['run']:<8} {' '.join(cells)} {row['rc']:>3}")
    cli_met = "met" if result["met"]["cli"] else "NOT met"
    print(f"targets: CLI shipped <= {CLI_TARGET_S} s: {cli_met}"
          f"; Python Group + communicator + first all_reduce <= {PYTHON_TARGET_S} s: "
          f"{'met' if result['met']['python'] else 'NOT met'}")
    print(f"JSON: {args.json}")
    for row in rows:
        if "output" in row:
            print(f"--- {row['part']} {row['run']} (rc {row['rc']}):\n{row['output']}")
    return 0 if all(row["rc"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
