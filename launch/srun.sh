#!/usr/bin/env bash
# Run ipcshare on the nodes of a Slurm allocation (inside salloc or sbatch), one rank per
# GPU, ranks placed node by node (consecutive ranks share a node: block distribution).
#   salloc -N 2 --ntasks-per-node=4 --gpus-per-node=4
#   launch/srun.sh allgather -b 1M -e 1G -f 4 --baseline mpi
#   SRUN_FLAGS="-N 2 --ntasks-per-node=2" launch/srun.sh ring
# IPCSHARE_SRUN_MPI picks srun's PMI plugin (pmix by default; pmi2 for older MPICH).
# IPCSHARE_PYTHON is the interpreter on the compute nodes (default: the .venv's, else python3).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
(( $# )) || { echo "usage: launch/srun.sh COMMAND [ARGS...]   (e.g. allgather -b 1M)" >&2; exit 2; }
python=${IPCSHARE_PYTHON:-}
if [[ -z "$python" ]]; then
  if [[ -x "$here/.venv/bin/python" ]]; then python="$here/.venv/bin/python"; else python=python3; fi
fi
srun=${SRUN:-srun}
# shellcheck disable=SC2086
exec "$srun" --mpi="${IPCSHARE_SRUN_MPI:-pmix}" --distribution=block:block ${SRUN_FLAGS:-} \
  "$here/launch/bind-gpu.sh" "$python" -m ipcshare "$@"
