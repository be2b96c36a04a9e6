#!/usr/bin/env bash
# Run ipcshare under the MPI found first: the project's .venv (mpich wheel), else the
# system's mpiexec. Extra launcher options go in MPIEXEC_FLAGS.
#   launch/mpirun.sh 4 ring -b 1K -e 16M            # 4 ranks on this machine
#   MPIEXEC_FLAGS="--hostfile hosts" launch/mpirun.sh 16 allgather ...   # Open MPI, many hosts
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
n=${1:?usage: launch/mpirun.sh NRANKS COMMAND [ARGS...]}; shift
if [[ -x "$here/.venv/bin/mpiexec" ]]; then
  mpiexec="$here/.venv/bin/mpiexec"; ipcshare="$here/.venv/bin/ipcshare"
else
  mpiexec=$(command -v mpiexec || command -v mpirun); ipcshare="python3 -m ipcshare"
fi
if "$mpiexec" --version 2>&1 | grep -q "Open MPI"; then
  # Open MPI refuses more ranks than cores, and root, unless told; GPU nodes need both.
  export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
fi
# shellcheck disable=SC2086
exec "$mpiexec" ${MPIEXEC_FLAGS:-} -n "$n" "$here/launch/bind-gpu.sh" $ipcshare "$@"
