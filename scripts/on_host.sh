#!/usr/bin/env bash
# Runs a command on one host of the cluster scripts/cluster_up.sh made: in the host's
# network namespace (its address, its loopback) under its hostname (its UTS
# namespace); files, users and the working directory are the machine's. On a host,
# SLURM_CONF names the cluster's Slurm configuration when it has one.
#
#   scripts/on_host.sh dlrm-node1 torchrun --nnodes 2 ... dlrm_main.py ...
#
# Exit codes: the command's; 2 when HOST is not a host of the cluster (or not root).
set -euo pipefail
STATE=/run/dlrm_cluster
if [ $# -lt 2 ]; then
  echo "on_host: usage: on_host.sh HOST COMMAND [ARGS...]" >&2
  exit 2
fi
host="$1"; shift
if ! awk -v host="$host" '$1 == host {found = 1} END {exit !found}' "$STATE/hosts" 2>/dev/null; then
  echo "on_host: '$host' is not a host of the cluster (hosts: $(awk '{printf "%s%s", sep, $1; sep=", "}' "$STATE/hosts" 2>/dev/null || echo "none: sudo make cluster-up"))" >&2
  exit 2
fi
# Slurm commands on a host talk to the cluster's Slurm (scripts/cluster_slurm.sh), not
# to the one-node cluster of this machine's own network, which no host reaches.
if [ -e "$STATE/slurm/slurm.conf" ]; then export SLURM_CONF="$STATE/slurm/slurm.conf"; fi
# A compute host runs on its own share of this machine's CPUs (nproc / compute hosts, at
# least one; its slurmd declares as many, scripts/cluster_slurm.sh): host i of the
# compute hosts gets CPUs i*share .. i*share+share-1 (modulo nproc). A rank sizes its
# threads from its CPU affinity (training/distributed.py), so a job's ranks compute with
# the threads their host's cores give, as on separate machines; unpinned, one rank per
# host would take every core of this machine where two ranks on one host take half each,
# and its sums split by thread differently (measured on an Intel Xeon: losses apart in the
# 8th digit where the same job on one host of two ranks is the reference).
# The controller is not pinned.
read -r index count < <(awk -v host="$host" '$1 == host {position = NR - 2} END {print (position == "" ? -1 : position), NR - 1}' "$STATE/hosts")
pin=()
if [ "$index" -ge 0 ]; then
  cores=$(nproc)
  share=$((cores / count)); [ "$share" -ge 1 ] || share=1
  cpus=""
  for ((k = 0; k < share; k++)); do cpus+="${cpus:+,}$(((index * share + k) % cores))"; done
  pin=(taskset -c "$cpus")
fi
exec nsenter --net="/run/netns/$host" --uts="$STATE/uts/$host" -- "${pin[@]}" "$@"
