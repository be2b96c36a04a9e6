#!/usr/bin/env bash
# Bind one GPU per local rank, then run the command:
#   mpirun -n 8 launch/bind-gpu.sh ipcshare allgather ...
#   srun --ntasks-per-node=4 launch/bind-gpu.sh ipcshare ring ...
# The local rank comes from the launcher: Open MPI, MPICH/Hydra (MPI_LOCALRANKID),
# Slurm (SLURM_LOCALID), or PMIx. Without one the command runs unchanged.
set -euo pipefail
local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-${PMIX_LOCAL_RANK:-${PALS_LOCAL_RANKID:-}}}}}
if [[ -n "$local_rank" && -z "${IPCSHARE_KEEP_VISIBLE_DEVICES:-}" ]]; then
  # GPUs this job may use: an existing CUDA_VISIBLE_DEVICES list, or all of nvidia-smi's.
  if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    IFS=, read -r -a gpus <<<"$CUDA_VISIBLE_DEVICES"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    mapfile -t gpus < <(nvidia-smi --query-gpu=index --format=csv,noheader)
  else
    gpus=()
  fi
  if (( ${#gpus[@]} > 0 )); then
    export CUDA_VISIBLE_DEVICES=${gpus[$(( local_rank % ${#gpus[@]} ))]}
  fi
fi
exec "$@"
