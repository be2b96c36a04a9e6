import cProfile, pstats, time, io, sys
import ipcshare
from mpi4py import MPI
comm = MPI.COMM_WORLD
with ipcshare.Group(backend="cuda-vmm") as g:
    for i in range(4):
        comm.Barrier()
        prof = cProfile.Profile() if (i == 0 and comm.rank == 0) else None
        t = time.perf_counter()
        if prof: prof.enable()
        w = g.window(1 << 20)
        if prof: prof.disable()
        dt = (time.perf_counter() - t) * 1e3
        steps = w.setup_ms
        w.close()
        alls = comm.gather((round(dt, 2), {k: round(v, 2) for k, v in steps.items()}), root=0)
        if comm.rank == 0:
            print("window", i, alls, flush=True)
        if prof:
            s = io.StringIO(); pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(35); print(s.getvalue()[:6000])
