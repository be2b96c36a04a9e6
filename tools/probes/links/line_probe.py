"""Does a flagged line stored over NVLink ever reach its reader torn? A tuning tool for the
GPU nodes, run before building a protocol with one flag for more than 4 bytes of payload
(lines of 16 or 128 bytes would carry 12 or 120 bytes where ll.cuh's carry 8 of
16). Two GPUs of one process with peer access:

    python3 tools/probes/links/line_probe.py [--widths 16,128] [--reloads 0,1] [--bytes 256K]
                                [--rounds 20000] [--budget-ms 300] [--grid 132] [--both]

GPU 0 stores rounds 1 .. ROUNDS into every line of a buffer on GPU 1 (16-byte lines: one
thread's vector store of 12 bytes of data and a flag; 128-byte lines: eight threads of a
warp storing 16 bytes each, the flag last, as NCCL's LL128), while GPU 1 polls the buffer
for BUDGET ms and checks every line it sees flagged, word by word: a word of an older
round than its flag is torn (what a one-flag protocol must never see), a newer one is
ahead (the next round arriving first: harmless, a protocol never rewrites a line its
reader has not consumed). --reload loads a line again once its flag is seen, before the
check, as NCCL's LL128 reader does. --both runs the other direction at the same time.
After the last round every line must hold it exactly.

Prints a row per width, reload and direction; exit status 1 if any line was seen torn or
misplaced or the buffer is wrong at the end, 2 if the GPUs have no peer access, 3 if a
reader saw no flagged line at all (that row answers nothing). Evidence for or against a
protocol, not a benchmark."""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from ipcshare.p2p.gpus import GpuHandles, GpuSet  # noqa: E402
from ipcshare.p2p.peer_access import disable_peer_access, enable_peer_access  # noqa: E402
from ipcshare.runtime.config import parse_size  # noqa: E402
from ipcshare.runtime.cuda_driver import check, driver  # noqa: E402

KERNELS = Path(__file__).resolve().with_name("line_probe_kernels.cu")
THREADS = 256
WIDTHS = (16, 128)
MAX_ROUNDS = 0xFFFF   # a 16-byte line's data words carry the round in 16 bits
COUNTS = ("seen", "torn", "ahead", "misplaced")
ENTRIES = tuple(f"{side}{width}" for width in WIDTHS for side in ("read", "write"))


class LineArgs(ctypes.Structure):
    """``LineArgs`` of tools/probes/links/line_probe_kernels.cu."""

    _fields_ = [("lines", ctypes.c_void_p), ("nlines", ctypes.c_ulonglong),
                ("rounds", ctypes.c_uint), ("counts", ctypes.c_void_p),
                ("budget_ns", ctypes.c_ulonglong), ("reload", ctypes.c_int)]


def final_lines(width: int, nlines: int, rounds: int) -> np.ndarray:
    """The buffer's bytes once round ``rounds`` has been stored into every line (the
    kernels' word32 / word64)."""
    if width == 16:
        places = np.arange(nlines, dtype=np.uint64)[:, None] * 4 + np.arange(3, dtype=np.uint64)
        words = ((np.uint64(rounds) << np.uint64(16)) | (places & np.uint64(0xFFFF))).astype(
            np.uint32)
        out = np.empty((nlines, 4), np.uint32)
        out[:, :3], out[:, 3] = words, rounds
    else:
        places = np.arange(nlines, dtype=np.uint64)[:, None] * 16 + np.arange(
            16, dtype=np.uint64)
        out = (np.uint64(rounds) << np.uint64(32)) | (places & np.uint64(0xFFFFFFFF))
        out[:, 15] = rounds
    return out.view(np.uint8).reshape(-1)


class LineProbe(GpuHandles):
    """The kernels, a buffer of lines and the counts on each of GPUs 0 and 1 (one owner:
    ``close`` releases all of it, idempotently)."""

    def __init__(self, gpus: GpuSet, nbytes: int) -> None:
        super().__init__(gpus)
        self.nbytes = nbytes
        try:
            self.kernels, self.buffers, self.counts, self.writers = [], [], [], []
            for gpu in range(2):
                self.kernels.append(self.load_kernels(gpu, KERNELS))
                # Every entry now: under lazy loading (CUDA's default) a kernel is loaded
                # at its first cuModuleGetFunction, which may wait for the kernels running
                # on that GPU; with --both a GPU's first writer could then wait out its own
                # reader's budget (likely why the first run of each width saw nothing on
                # x4, 2026-11-28).
                for entry in ENTRIES:
                    self.kernels[gpu].function(entry)
                # The writer's stream: with --both a GPU writes while it reads.
                self.writers.append(self.new_stream(gpu))
                self.buffers.append(gpus.allocate(gpu, nbytes))
                self.counts.append(gpus.allocate(gpu, 8 * len(COUNTS)))
        except BaseException:
            self.close()
            raise

    def _launch(self, gpu: int, entry: str, grid: int, args: LineArgs, stream) -> None:
        self.gpus.activate(gpu)
        params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        check("cuLaunchKernel", driver.cuLaunchKernel(
            self.kernels[gpu].function(entry), grid, 1, 1, THREADS, 1, 1, 0, stream,
            ctypes.addressof(params), 0))

    def _settle(self) -> None:
        for gpu in range(2):
            self.gpus.activate(gpu)
            check("cuStreamSynchronize", driver.cuStreamSynchronize(self.gpus.streams[gpu]))
            check("cuStreamSynchronize", driver.cuStreamSynchronize(self.writers[gpu]))

    def run(self, width: int, reload: bool, rounds: int, budget_ns: int, grid: int,
            readers: tuple[int, ...]) -> list[dict]:
        """One run: for each reader GPU in ``readers``, its peer writes its buffer while it
        reads it. A row per reader: the counts and whether the buffer is right at the end."""
        nlines = self.nbytes // width
        for gpu in range(2):
            self.gpus.fill(gpu, self.buffers[gpu], 0, self.nbytes)
            self.gpus.fill(gpu, self.counts[gpu], 0, 8 * len(COUNTS))
        keep = []   # the argument blocks live until the launches have read them
        for reader in readers:   # readers first, so they poll before the first store
            args = LineArgs(self.buffers[reader], nlines, rounds, self.counts[reader],
                            budget_ns, int(reload))
            keep.append(args)
            self._launch(reader, f"read{width}", grid, args, self.gpus.streams[reader])
        for reader in readers:
            args = LineArgs(self.buffers[reader], nlines, rounds, None, 0, 0)
            keep.append(args)
            self._launch(1 - reader, f"write{width}", grid, args, self.writers[1 - reader])
        self._settle()
        want = final_lines(width, nlines, rounds)
        rows = []
        for reader in readers:
            counts = self.gpus.download(reader, self.counts[reader], 8 * len(COUNTS)).view(
                np.uint64)
            got = self.gpus.download(reader, self.buffers[reader], self.nbytes)
            rows.append({"width": width, "reload": reload, "writer": 1 - reader,
                         "reader": reader, **{k: int(v) for k, v in zip(COUNTS, counts,
                                                                        strict=True)},
                         "final_ok": bool(np.array_equal(got, want))})
        return rows


def _list(text: str, kind=int) -> list:
    return [kind(item) for item in text.split(",") if item]


def verdict(row: dict) -> str:
    """FAILED (a torn or misplaced word, or a wrong buffer at the end), whole, or
    INCONCLUSIVE: the reader saw no flagged line, so the row says nothing of tearing."""
    if row["torn"] or row["misplaced"] or not row["final_ok"]:
        return "FAILED"
    return "whole" if row["seen"] else "INCONCLUSIVE (nothing seen)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="16,128", help="line bytes: 16, 128")
    parser.add_argument("--reloads", default="0,1", help="0: check the line as first loaded; "
                        "1: load it again once its flag is seen")
    parser.add_argument("--bytes", default="256K", help="the buffer of lines")
    parser.add_argument("--rounds", type=int, default=20000)
    parser.add_argument("--budget-ms", type=float, default=300.0)
    parser.add_argument("--grid", type=int, default=132)
    parser.add_argument("--both", action="store_true", help="both directions at once")
    args = parser.parse_args(argv)
    widths, reloads = _list(args.widths), _list(args.reloads)
    nbytes = parse_size(args.bytes, what="--bytes")
    if any(w not in WIDTHS for w in widths):
        parser.error(f"--widths: each of {', '.join(map(str, WIDTHS))}")
    if any(r not in (0, 1) for r in reloads):
        parser.error("--reloads: 0 or 1")
    if nbytes < 512 or nbytes % 512:
        parser.error("--bytes: a multiple of 512 (four 128-byte lines a warp)")
    if not 1 <= args.rounds <= MAX_ROUNDS:
        parser.error(f"--rounds: 1 to {MAX_ROUNDS}")
    if args.budget_ms <= 0 or args.grid < 1:
        parser.error("--budget-ms and --grid: above 0")
    failed = unanswered = False
    with GpuSet(2) as gpus:
        pairs = enable_peer_access(gpus)
        try:
            if not all(pair.enabled for pair in pairs):
                print("line_probe: GPUs 0 and 1 have no peer access: "
                      + "; ".join(p.reason for p in pairs if not p.enabled), file=sys.stderr)
                return 2
            probe = LineProbe(gpus, nbytes)
            try:
                print(f"# {nbytes} bytes of lines, {args.rounds} rounds, reader polls "
                      f"{args.budget_ms:g} ms, grid {args.grid} x {THREADS}")
                print(f"{'width':>5} {'reload':>6} {'writer->reader':>14} {'seen':>12} "
                      f"{'torn':>6} {'ahead':>10} {'misplaced':>9} {'final':>6}  verdict")
                for width in widths:
                    for reload in reloads:
                        rows = probe.run(width, bool(reload), args.rounds,
                                         int(args.budget_ms * 1e6), args.grid,
                                         (1, 0) if args.both else (1,))
                        for row in rows:
                            said = verdict(row)
                            failed |= said == "FAILED"
                            unanswered |= said.startswith("INCONCLUSIVE")
                            print(f"{width:>5} {reload:>6} "
                                  f"{row['writer']:>9}->{row['reader']:<4} {row['seen']:>12} "
                                  f"{row['torn']:>6} {row['ahead']:>10} "
                                  f"{row['misplaced']:>9} {'ok' if row['final_ok'] else 'WRONG':>6}"
                                  f"  {said}", flush=True)
            finally:
                probe.close()
        finally:
            disable_peer_access(gpus, pairs)
    return 1 if failed else 3 if unanswered else 0


if __name__ == "__main__":
    sys.exit(main())
