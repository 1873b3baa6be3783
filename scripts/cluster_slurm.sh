#!/usr/bin/env bash
# Brings up a Slurm cluster across the hosts scripts/cluster_up.sh made (it calls this
# script last; `make cluster-up`): slurmctld, slurmdbd and a MariaDB of their own on
# the controller host, one slurmd in each compute host (its NodeName its hostname, its
# share of this machine's CPUs and memory). docs/slurm.md says how to use it.
#
# It coexists with the one-node cluster of scripts/slurm_up.sh: its own configuration,
# state and logs under $STATE/slurm, its own ports, daemons in the hosts' network
# namespaces. Only munged is shared: its Unix socket is a file every namespace reaches.
# Commands run on a host (scripts/on_host.sh) talk to this cluster: on_host.sh sets
# SLURM_CONF to its configuration. `cluster_up.sh --down` kills the hosts' processes and
# removes $STATE, so it removes this cluster too.
#
# Idempotent: a second run with everything up changes nothing; a daemon that died (a
# host whose processes were killed) is started again and its node resumed. Needs root.
# Settings (environment): CLUSTER_SLURM_TIMEOUT, seconds to wait for each daemon (60).
# Exit codes: 0 the cluster answers; 1 a step failed (one line naming it and the log).
set -euo pipefail

STATE=/run/dlrm_cluster
SLURM_DIR="$STATE/slurm"
CONF="$SLURM_DIR/slurm.conf"
LOG_DIR="$SLURM_DIR/log"
RUN_DIR="$SLURM_DIR/run"        # pid files
DB_DIR="$SLURM_DIR/mysql"       # the MariaDB of the accounting, on the controller host
DB_SOCKET="$DB_DIR/mysqld.sock"
DB_PORT=3306                    # on the controller host's own loopback
CLUSTER=dlrmhosts
PARTITION=main
DATABASE=slurm_acct_db
# Not the one-node cluster's 6817-6819: the two never answer for each other.
SLURMCTLD_PORT=6917
SLURMD_PORT=6918
SLURMDBD_PORT=6919
# A compute host silent this long is marked down (Slurm's default: 300 s).
SLURMD_TIMEOUT=30
ON_HOST="$(cd "$(dirname "$0")" && pwd)/on_host.sh"

SCRIPT=cluster_slurm
LOG="$LOG_DIR/cluster_slurm.log"
TIMEOUT="${CLUSTER_SLURM_TIMEOUT:-60}"
if [ ! -s "$STATE/hosts" ]; then
  echo "$SCRIPT: error: no cluster of hosts ($STATE/hosts): sudo make cluster-up" >&2
  exit 1
fi
install -d -m 0755 "$SLURM_DIR"
install -d -o slurm -g slurm -m 0755 "$LOG_DIR" "$RUN_DIR" "$SLURM_DIR/ctld" 2>/dev/null \
  || install -d -m 0755 "$LOG_DIR"  # before the packages made the user slurm
: >>"$LOG"
# say, die, logged, wait_for, install_if_changed, install_slurm_packages, start_munge, slurm_conf.
source "$(dirname "$0")/slurm_lib.sh"

install_slurm_packages
install -d -o slurm -g slurm -m 0755 "$LOG_DIR" "$RUN_DIR" "$SLURM_DIR/ctld"
start_munge

controller="$(awk 'NR == 1 {print $1}' "$STATE/hosts")"
controller_address="$(awk 'NR == 1 {print $2}' "$STATE/hosts")"
mapfile -t compute < <(awk 'NR > 1 {print $1}' "$STATE/hosts")

# Whether a process named $2 runs on host $1 (in its network namespace).
running_on() {
  local pid
  for pid in $(ip netns pids "$1" 2>/dev/null); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "$2" ] || return 0
  done
  return 1
}
# Starts daemon $2 on host $1, detached (it outlives the script), unless it runs there.
start_on() {
  local host="$1" name="$2"; shift 2
  running_on "$host" "$name" && return 0
  say "starting $name on $host"
  # Without the descriptors this script inherited beyond 0-2: a daemon keeping one
  # would hold it for good (`flock LOCK cluster_up.sh` would keep the cluster's lock).
  (close_inherited_descriptors; exec setsid -f "$ON_HOST" "$host" "$@" >>"$LOG" 2>&1 </dev/null) \
    || die "$name did not start on $host"
}
close_inherited_descriptors() {
  local fd
  for fd in $(ls /proc/$BASHPID/fd); do
    [ "$fd" -le 2 ] || eval "exec $fd>&-" 2>/dev/null || true
  done
}
# Stops daemon $2 on host $1 (to start it again with a new configuration).
stop_on() {
  local host="$1" name="$2" waited=0 pid
  running_on "$host" "$name" || return 0
  say "stopping $name on $host (its configuration changed)"
  for pid in $(ip netns pids "$host"); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "$name" ] || kill "$pid" 2>/dev/null || true
  done
  while running_on "$host" "$name"; do
    [ "$waited" -lt "$TIMEOUT" ] || die "$name did not stop on $host"
    sleep 1; waited=$((waited + 1))
  done
}
# A Slurm command on the controller host, against this cluster (on_host.sh sets SLURM_CONF).
on_controller() { "$ON_HOST" "$controller" "$@"; }

# 1. The accounting's MariaDB, on the controller host's loopback. slurmdbd logs in over
# TCP with a password (a Unix socket of its own would need a client option slurmdbd has
# not): generated once, readable by root and, in slurmdbd.conf, by the user slurm.
if [ ! -d "$DB_DIR/mysql" ]; then
  say "initialising MariaDB's data directory $DB_DIR"
  install -d -o mysql -g mysql -m 0750 "$DB_DIR"
  logged "mariadb-install-db" mariadb-install-db --no-defaults --user=mysql --datadir="$DB_DIR"
fi
start_on "$controller" mariadbd /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DB_DIR" \
  --socket="$DB_SOCKET" --pid-file="$DB_DIR/mariadbd.pid" --bind-address=127.0.0.1 --port="$DB_PORT" \
  --log-error="$DB_DIR/error.log"
wait_for "MariaDB on $controller" mariadb-admin --no-defaults --socket="$DB_SOCKET" ping
if [ ! -s "$SLURM_DIR/db_password" ]; then
  (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$SLURM_DIR/db_password")
fi
db_password="$(cat "$SLURM_DIR/db_password")"
logged "creating the accounting database" mariadb --no-defaults --socket="$DB_SOCKET" -u root <<EOF
CREATE DATABASE IF NOT EXISTS $DATABASE;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$db_password';
GRANT ALL ON $DATABASE.* TO 'slurm'@'127.0.0.1';
EOF

# 2. The configuration: each compute host's share of this machine's CPUs and memory.
# The CPUs are those on_host.sh pins a compute host to (every host gets as many).
cpus=$("$ON_HOST" "${compute[0]}" nproc)
memory_mb=$(($(usable_memory_mb) / ${#compute[@]}))
# No NodeAddr: each node is reached by its name, which /etc/hosts resolves (see
# CommunicationParameters below), so a host back at another address is found there.
nodes=""
for host in "${compute[@]}"; do
  nodes+="NodeName=$host CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN"$'\n'
done
# The settings slurm_conf writes (scripts/slurm_lib.sh), this cluster's: its own ports,
# state and logs beside the one-node cluster's, each node's name resolved at every
# connection, the backfill scheduler every 2 s.
# shellcheck disable=SC2034  # read by slurm_conf through its name
declare -A conf=(
  [header]="# Written by scripts/cluster_slurm.sh: ${#compute[@]} compute hosts of $cpus CPUs and ${memory_mb} MB each,
# their share of this machine's $(nproc) CPUs and $(total_memory_mb) MB (one kernel for all)."
  [cluster]=$CLUSTER [controller]="$controller($controller_address)"
  [ctld_port]=$SLURMCTLD_PORT [slurmd_port]=$SLURMD_PORT
  [state]="$SLURM_DIR/ctld" [spool]="$SLURM_DIR/spool/%n"
  [ctld_pid]="$RUN_DIR/slurmctld.pid" [slurmd_pid]="$RUN_DIR/slurmd-%n.pid"
  [ctld_log]="$LOG_DIR/slurmctld.log" [slurmd_log]="$LOG_DIR/slurmd-%n.log"
  [slurmd_timeout]=$SLURMD_TIMEOUT [no_addr_cache]=1 [backfill_interval]=2
  [accounting_host]=$controller [accounting_port]=$SLURMDBD_PORT
  [nodes]=$nodes [partition]=$PARTITION
)
candidate="$(mktemp)"
slurm_conf conf >"$candidate"
slurm_changed=0
install_if_changed "$CONF" "$candidate" 0644 && slurm_changed=1

candidate="$(mktemp)"
cat >"$candidate" <<EOF
# Written by scripts/cluster_slurm.sh. slurmdbd logs in to the controller host's own
# MariaDB over its loopback.
AuthType=auth/munge
DbdHost=$controller
DbdAddr=$controller_address
DbdPort=$SLURMDBD_PORT
SlurmUser=slurm
PidFile=$RUN_DIR/slurmdbd.pid
LogFile=$LOG_DIR/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$db_password
StorageLoc=$DATABASE
EOF
dbd_changed=0
install_if_changed "$SLURM_DIR/slurmdbd.conf" "$candidate" 0600 slurm slurm && dbd_changed=1

if [ "$dbd_changed" = 1 ]; then stop_on "$controller" slurmdbd; fi
if [ "$slurm_changed" = 1 ]; then
  stop_on "$controller" slurmctld
  for host in "${compute[@]}"; do stop_on "$host" slurmd; done
fi

# 3. Daemons: the accounting, the cluster's registration, the controller, the nodes.
start_on "$controller" slurmdbd /usr/sbin/slurmdbd
wait_for "slurmdbd on $controller" on_controller sacctmgr -n list cluster
if ! on_controller sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
  say "registering cluster $CLUSTER"
  logged "sacctmgr add cluster" on_controller sacctmgr -i add cluster "$CLUSTER"
fi
start_on "$controller" slurmctld /usr/sbin/slurmctld
wait_for "slurmctld on $controller" on_controller scontrol ping
for host in "${compute[@]}"; do
  install -d -m 0755 "$SLURM_DIR/spool/$host"
  start_on "$host" slurmd /usr/sbin/slurmd
done

# 4. Every node idle (or busy), the accounting answering.
node_state() { on_controller sinfo -h -N -n "$1" -o %t 2>/dev/null | head -n 1; }
for host in "${compute[@]}"; do
  deadline=$((SECONDS + TIMEOUT))
  until [[ "$(node_state "$host")" =~ ^(idle|mix|alloc|comp)$ ]]; do
    state="$(node_state "$host")"
    if [[ "$state" =~ ^(down|drain|drng) ]]; then  # e.g. down after its slurmd was killed
      on_controller scontrol update nodename="$host" state=resume >>"$LOG" 2>&1 || true
    fi
    [ "$SECONDS" -lt "$deadline" ] || die "node $host is '${state:-unknown to sinfo}' after ${TIMEOUT} s, not idle"
    sleep 1
  done
done
wait_for "sacct on $controller" on_controller sacct -n -X
say "cluster $CLUSTER up: slurmctld on $controller, nodes ${compute[*]} ($cpus CPUs, ${memory_mb} MB each) in partition $PARTITION"
