#!/usr/bin/env bash
# Bind one GPU per local rank, and the rank's CPUs and memory to that GPU's NUMA node, then
# run the command:
#   mpirun -n 8 launch/bind-gpu.sh ipcshare allgather ...
#   srun --ntasks-per-node=4 launch/bind-gpu.sh ipcshare ring ...
# The local rank comes from the launcher: Open MPI, MPICH/Hydra (MPI_LOCALRANKID),
# Slurm (SLURM_LOCALID), or PMIx. Without one the command runs unchanged.
#
# NUMA: the GPU's node and local CPUs come from sysfs (/sys/bus/pci/devices/<pci>/numa_node,
# local_cpulist; the PCI address from nvidia-smi). With numactl the command runs under
# `numactl --cpunodebind=N --membind=N`; without it, under `taskset -c <local CPUs>` (CPUs only);
# with neither, or when the platform does not say where the GPU sits, it runs unbound and local
# rank 0 says why on stderr. IPCSHARE_BIND_NUMA=0 turns the NUMA part off (e.g. when the
# launcher already binds: mpirun --bind-to numa, srun --cpu-bind=ldoms).
# IPCSHARE_SYSFS_ROOT (default /sys) points the script at another sysfs tree (tests).
set -euo pipefail
local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-${PMIX_LOCAL_RANK:-${PALS_LOCAL_RANKID:-}}}}}
sysfs=${IPCSHARE_SYSFS_ROOT:-/sys}

note() {
  # One rank per node speaks: every rank of a node meets the same tools and the same sysfs.
  if [[ "${local_rank:-0}" == 0 ]]; then echo "bind-gpu.sh: $*" >&2; fi
}

gpu=""
if [[ -n "$local_rank" ]]; then
  # GPUs this job may use: an existing CUDA_VISIBLE_DEVICES list, or all of nvidia-smi's.
  if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    IFS=, read -r -a gpus <<<"$CUDA_VISIBLE_DEVICES"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    mapfile -t gpus < <(nvidia-smi --query-gpu=index --format=csv,noheader)
  else
    gpus=()
  fi
  if (( ${#gpus[@]} > 0 )); then
    # ipcshare binds local rank r to visible device r % count: the same GPU either way.
    gpu=${gpus[$(( local_rank % ${#gpus[@]} ))]}
    if [[ -z "${IPCSHARE_KEEP_VISIBLE_DEVICES:-}" ]]; then
      export CUDA_VISIBLE_DEVICES=$gpu
    fi
  fi
fi

if [[ -z "$gpu" || "${IPCSHARE_BIND_NUMA:-1}" == 0 ]]; then
  exec "$@"
fi
if ! command -v nvidia-smi >/dev/null 2>&1; then
  note "no nvidia-smi to find GPU $gpu's PCI address: CPUs and memory left unbound"
  exec "$@"
fi
bus=""
read -r bus < <(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i "$gpu" 2>/dev/null) \
  || true
if [[ ! "$bus" =~ ^([0-9A-Fa-f]+):([0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$ ]]; then
  note "nvidia-smi gave no PCI address for GPU $gpu: CPUs and memory left unbound"
  exec "$@"
fi
# nvidia-smi writes 00000000:1B:00.0, sysfs names the device 0000:1b:00.0.
printf -v device '%s/bus/pci/devices/%04x:%s' "$sysfs" "$(( 16#${BASH_REMATCH[1]} ))" \
  "${BASH_REMATCH[2],,}"
node=-1
cpus=""
[[ -r "$device/numa_node" ]] && read -r node <"$device/numa_node"
[[ -r "$device/local_cpulist" ]] && read -r cpus <"$device/local_cpulist"
# Each binding is tried on `true` first: a cpuset that forbids the node makes it fail, and then
# the rank must still run.
if (( node >= 0 )) && command -v numactl >/dev/null 2>&1 \
    && numactl --cpunodebind="$node" --membind="$node" true >/dev/null 2>&1; then
  exec numactl --cpunodebind="$node" --membind="$node" "$@"
fi
if [[ -n "$cpus" ]] && command -v taskset >/dev/null 2>&1 \
    && taskset -c "$cpus" true >/dev/null 2>&1; then
  if (( node >= 0 )); then
    note "numactl unusable or not installed: CPUs bound to $cpus, memory not bound to node $node"
  fi
  exec taskset -c "$cpus" "$@"
fi
if (( node < 0 )) && [[ -z "$cpus" ]]; then
  note "the platform does not say where GPU $gpu ($bus) sits (no NUMA node): CPUs left unbound"
else
  note "neither numactl nor taskset can bind GPU $gpu's rank to NUMA node $node (CPUs" \
       "${cpus:-?}): install numactl, or bind in the launcher (mpirun --bind-to numa)"
fi
exec "$@"
