#!/usr/bin/env bash
# Run ipcshare on several hosts listed in a hostfile, ranks placed node by node (block
# placement: consecutive ranks share a node, as the hierarchical all-gather needs).
#   launch/mpirun-hostfile.sh hosts 8 allgather -b 1M -e 1G          # fill hosts in order
#   RANKS_PER_NODE=4 launch/mpirun-hostfile.sh hosts 8 allgather     # 4 ranks on each host
# The hostfile is the MPI's own format: one host per line ("node1 slots=4" for Open MPI,
# "node1:4" for MPICH). The repository (and its .venv) must be at the same path on every
# host. Open MPI gets every IPCSHARE_* variable forwarded with -x; MPICH forwards all.
# MPIEXEC picks the launcher; otherwise the project's .venv, else the system's mpiexec.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
hostfile=${1:?usage: launch/mpirun-hostfile.sh HOSTFILE NRANKS COMMAND [ARGS...]}
n=${2:?usage: launch/mpirun-hostfile.sh HOSTFILE NRANKS COMMAND [ARGS...]}
shift 2
[[ -r "$hostfile" ]] || { echo "launch/mpirun-hostfile.sh: cannot read hostfile $hostfile" >&2; exit 2; }
if [[ -n "${MPIEXEC:-}" ]]; then
  mpiexec=$MPIEXEC; ipcshare="python3 -m ipcshare"
elif [[ -x "$here/.venv/bin/mpiexec" ]]; then
  mpiexec="$here/.venv/bin/mpiexec"; ipcshare="$here/.venv/bin/ipcshare"
else
  mpiexec=$(command -v mpiexec || command -v mpirun); ipcshare="python3 -m ipcshare"
fi
flags=()
if "$mpiexec" --version 2>&1 | grep -q "Open MPI"; then
  flags+=(--hostfile "$hostfile")
  if [[ -n "${RANKS_PER_NODE:-}" ]]; then
    flags+=(--map-by "ppr:${RANKS_PER_NODE}:node")
  else
    flags+=(--map-by slot)
  fi
  while IFS='=' read -r name _; do
    flags+=(-x "$name")
  done < <(env | grep '^IPCSHARE_' || true)
else  # MPICH / Hydra and derivatives
  flags+=(-f "$hostfile")
  [[ -n "${RANKS_PER_NODE:-}" ]] && flags+=(-ppn "$RANKS_PER_NODE")
fi
# shellcheck disable=SC2086
exec "$mpiexec" "${flags[@]}" ${MPIEXEC_FLAGS:-} -n "$n" "$here/launch/bind-gpu.sh" $ipcshare "$@"
