#!/usr/bin/env bash
# Brings up a one-node Slurm cluster with job accounting on this Debian machine, for
# `torchx run -s slurm ...` and `python -m sweeps run` with `scheduler: slurm`.
# `make slurm-up` runs it; docs/slurm.md says what it does and how to use the cluster.
#
# Idempotent: every step checks first, so a second run with everything up changes
# nothing and exits 0. Needs root (it installs packages and starts daemons). The
# daemons are started directly (no systemd here) and keep running after it exits.
#
#   1. installs slurm-wlm, slurmdbd, munge and mariadb-server if missing;
#   2. creates the munge key if missing and starts munged;
#   3. starts MariaDB, creates the accounting database and its user `slurm`, who logs
#      in through the Unix socket as the OS user slurm (no password anywhere);
#   4. writes /etc/slurm/slurm.conf and slurmdbd.conf for this node: `nproc` CPUs and
#      the memory of /proc/meminfo less a margin (a changed file restarts the daemons);
#   5. starts slurmdbd, registers the cluster (sacctmgr), starts slurmctld and slurmd;
#   6. waits until sinfo shows the node idle and sacct answers.
#
# Settings (environment):
#   SLURM_UP_LOG        this script's detailed log (default /var/log/slurm/slurm_up.log).
#   SLURM_UP_TIMEOUT    seconds to wait for each daemon (default 60).
# Exit codes: 0 the cluster answers; 1 a step failed (one line naming it and the log);
# 2 not root.
set -euo pipefail

CLUSTER=dlrm
PARTITION=main
DATABASE=slurm_acct_db
LOG="${SLURM_UP_LOG:-/var/log/slurm/slurm_up.log}"
TIMEOUT="${SLURM_UP_TIMEOUT:-60}"

if [ "$(id -u)" -ne 0 ]; then
  echo "slurm_up: must run as root (it installs packages and starts daemons): sudo make slurm-up" >&2
  exit 2
fi
mkdir -p "$(dirname "$LOG")"
: >>"$LOG"

SCRIPT=slurm_up
# say, die, logged, wait_for, install_if_changed, install_slurm_packages, start_munge, slurm_conf.
source "$(dirname "$0")/slurm_lib.sh"
# Only this machine's own network namespace counts: the cluster of scripts/cluster_up.sh
# runs daemons of the same names in its hosts' namespaces.
running() { pgrep -x "$1" --ns $$ --nslist net >/dev/null; }
# Starts a daemon detached from this shell's session (it outlives the script) unless running.
start() {
  local name="$1"; shift
  if running "$name"; then
    return 0
  fi
  say "starting $name"
  setsid -f "$@" >>"$LOG" 2>&1 </dev/null || die "$name did not start"
}
# Stops a Slurm daemon through its pid file (to start it again with a new configuration).
stop() {
  local name="$1" waited=0 pid
  pid="$(cat "/run/$name.pid" 2>/dev/null || true)"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  say "stopping $name (its configuration changed)"
  kill "$pid"
  while kill -0 "$pid" 2>/dev/null; do
    [ "$waited" -lt "$TIMEOUT" ] || die "$name did not stop"
    sleep 1; waited=$((waited + 1))
  done
}
# 1. Packages.
install_slurm_packages

# 2. Munge: the key every Slurm daemon and command signs its messages with.
start_munge

# 3. MariaDB and the accounting database.
install -d -o mysql -g mysql -m 0755 /run/mysqld
if [ ! -d /var/lib/mysql/mysql ]; then
  say "initialising MariaDB's data directory"
  logged "mariadb-install-db" mariadb-install-db --user=mysql --datadir=/var/lib/mysql
fi
start mariadbd /usr/sbin/mariadbd --user=mysql
wait_for "MariaDB" mariadb-admin ping
logged "creating the accounting database" mariadb -e "
  CREATE DATABASE IF NOT EXISTS $DATABASE;
  CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED VIA unix_socket;
  GRANT ALL ON $DATABASE.* TO 'slurm'@'localhost';"

# 4. Configuration for this node.
node="$(hostname -s)"
cpus="$(nproc)"
total_mb="$(total_memory_mb)"
memory_mb="$(usable_memory_mb)"
install -d -o slurm -g slurm -m 0755 /var/lib/slurm/slurmctld /var/log/slurm
install -d -m 0755 /var/lib/slurm/slurmd

# The settings slurm_conf writes (scripts/slurm_lib.sh), this cluster's.
# shellcheck disable=SC2034  # read by slurm_conf through its name
declare -A conf=(
  [header]="# Written by scripts/slurm_up.sh: one node, $cpus CPUs, ${memory_mb} MB of its ${total_mb} MB."
  [cluster]=$CLUSTER [controller]="$node(127.0.0.1)"
  [state]=/var/lib/slurm/slurmctld [spool]=/var/lib/slurm/slurmd
  [ctld_pid]=/run/slurmctld.pid [slurmd_pid]=/run/slurmd.pid
  [ctld_log]=/var/log/slurm/slurmctld.log [slurmd_log]=/var/log/slurm/slurmd.log
  [accounting_host]=localhost
  [nodes]="NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN"$'\n'
  [partition]=$PARTITION
)
candidate="$(mktemp)"
slurm_conf conf >"$candidate"
slurm_changed=0
install_if_changed /etc/slurm/slurm.conf "$candidate" 0644 && slurm_changed=1

candidate="$(mktemp)"
cat >"$candidate" <<EOF
# Written by scripts/slurm_up.sh. The database user logs in through MariaDB's Unix
# socket as the OS user slurm: no password.
AuthType=auth/munge
DbdHost=localhost
SlurmUser=slurm
PidFile=/run/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StorageLoc=$DATABASE
EOF
dbd_changed=0
install_if_changed /etc/slurm/slurmdbd.conf "$candidate" 0600 slurm slurm && dbd_changed=1

if [ "$dbd_changed" = 1 ]; then stop slurmdbd; fi
if [ "$slurm_changed" = 1 ]; then stop slurmctld; stop slurmd; fi

# 5. Daemons: the accounting daemon, the cluster's registration, the controller, the node.
start slurmdbd /usr/sbin/slurmdbd
wait_for "slurmdbd" sacctmgr -n list cluster
if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
  say "registering cluster $CLUSTER"
  logged "sacctmgr add cluster" sacctmgr -i add cluster "$CLUSTER"
fi
start slurmctld /usr/sbin/slurmctld
wait_for "slurmctld" scontrol ping
start slurmd /usr/sbin/slurmd

# 6. The node idle, the accounting answering.
node_state() { sinfo -h -N -n "$node" -o %t 2>/dev/null | head -n 1; }
deadline=$((SECONDS + TIMEOUT))
until [[ "$(node_state)" =~ ^(idle|mix|alloc|comp)$ ]]; do
  state="$(node_state)"
  if [[ "$state" =~ ^(down|drain|drng) ]]; then  # e.g. down after an earlier slurmd stopped
    scontrol update nodename="$node" state=resume >>"$LOG" 2>&1 || true
  fi
  [ "$SECONDS" -lt "$deadline" ] || die "node $node is '${state:-unknown to sinfo}' after ${TIMEOUT} s, not idle"
  sleep 1
done
wait_for "sacct" sacct -n -X
say "cluster $CLUSTER up: node $node ($cpus CPUs, ${memory_mb} MB) $(node_state) in partition $PARTITION"
