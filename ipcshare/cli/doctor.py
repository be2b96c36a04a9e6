"""``ipcshare doctor [--json F] [--yaml F] [--quick]``: the CLI side of the doctor, and
its exit policy (0 every node passes, 1 a required check failed or an error)."""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["run_doctor_command", "add_doctor_flags", "check_same_plan"]


def add_doctor_flags(parser: argparse.ArgumentParser) -> None:
    """The doctor's flags, on its subparser."""
    parser.add_argument("--json", metavar="FILE", help="write the verdict as JSON (rank 0)")
    parser.add_argument("--yaml", metavar="FILE", help="write the verdict as YAML (rank 0)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes and bounds: finishes in seconds")


def run_doctor_command(args: argparse.Namespace) -> int:
    """Run the doctor on every rank; returns the exit status.

    A rank lost during the run (died, hung) is reported by the others, which then leave
    at once with status 1: MPI_Finalize could wait forever for the lost rank.

    Raises:
        IpcShareError: collective errors (bad IPCSHARE_DOCTOR_TIMEOUT, unwritable
            output), the same on every rank; main() prints them.
    """
    from ..doctor.liveness import PeerLost
    from ..doctor.plan import DoctorPlan
    from ..doctor.runner import run_doctor
    from ..liveness.consensus import collective_step
    from ..topology.world import World
    from .exit_codes import EXIT_ERROR, EXIT_OK

    world = World.from_comm()
    try:
        with collective_step(world, "reading the doctor's settings"):
            plan = DoctorPlan.make(quick=bool(args.quick))
        # Before any window: ranks on different plans would otherwise fail the first
        # check with a window size mismatch that no rule explains.
        plans = world.comm.allgather(plan)
        with collective_step(world, "comparing the doctor's settings"):
            check_same_plan(plans)
    finally:
        world.close()
    try:
        outcome = run_doctor(plan, json_path=args.json, yaml_path=args.yaml,
                             emit=lambda line: print(line, flush=True), error_status=EXIT_ERROR)
    except PeerLost as exc:
        sys.stdout.flush()
        sys.stderr.write(f"ipcshare: error: doctor: {exc}\n")
        sys.stderr.flush()
        os._exit(EXIT_ERROR)
    return EXIT_OK if outcome.passed else EXIT_ERROR


def check_same_plan(plans: list) -> None:
    """Raise unless every rank's ``DoctorPlan`` (by rank) is the same, naming what each
    rank asked for: ``rank 0 asks for --quick, rank 1 for no --quick``.

    Raises:
        ConfigError: the ranks would run checks of different sizes (and wait for each
            other in different calls).
    """
    from ..runtime import settings
    from ..runtime.errors import ConfigError
    from ..topology.world import describe_disagreement

    if all(plan == plans[0] for plan in plans):
        return
    timeouts_differ = any(plan.timeout_s != plans[0].timeout_s for plan in plans)

    def asked(plan) -> str:
        words = ["--quick" if plan.quick else "no --quick"]
        if timeouts_differ:
            words.append(f"{settings.DOCTOR_TIMEOUT}={plan.timeout_s:g}")
        return " ".join(words)

    raise ConfigError("ranks disagree on the doctor's run: " + describe_disagreement(
        [asked(plan) for plan in plans], verb=("asks for", "ask for"), then="for"))
