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
PACKAGES=(slurm-wlm slurmdbd munge mariadb-server)
LOG="${SLURM_UP_LOG:-/var/log/slurm/slurm_up.log}"
TIMEOUT="${SLURM_UP_TIMEOUT:-60}"
# Memory kept from Slurm for the OS and the daemons: 5% of the RAM, at least 1 GiB.
MARGIN_FRACTION_PERCENT=5
MARGIN_MIN_MB=1024

if [ "$(id -u)" -ne 0 ]; then
  echo "slurm_up: must run as root (it installs packages and starts daemons): sudo make slurm-up" >&2
  exit 2
fi
mkdir -p "$(dirname "$LOG")"
: >>"$LOG"

say() { echo "slurm_up: $*"; echo "$(date -u +%FT%TZ) $*" >>"$LOG"; }
die() {
  echo "slurm_up: error: $* (details: $LOG)" >&2
  echo "$(date -u +%FT%TZ) error: $*" >>"$LOG"
  exit 1
}
# Runs a command with its output in the log; fails the step with its last line.
logged() {
  local what="$1"; shift
  if ! "$@" >>"$LOG" 2>&1; then
    die "$what failed: $(tail -n 1 "$LOG")"
  fi
}
# Waits up to $TIMEOUT seconds for a command to succeed (quietly).
wait_for() {
  local what="$1"; shift
  local deadline=$((SECONDS + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      local why
      why="$("$@" 2>&1 | tail -n 1)" || true  # what the last try says
      die "$what: not ready after ${TIMEOUT} s${why:+ ($why)}"
    fi
    sleep 1
  done
}
running() { pgrep -x "$1" >/dev/null; }
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
# Installs $2 (a temporary file) as $1 with mode $3; returns 0 when the file changed.
install_if_changed() {
  local target="$1" candidate="$2" mode="$3"
  if [ -f "$target" ] && cmp -s "$target" "$candidate"; then
    rm -f "$candidate"
    return 1
  fi
  install -m "$mode" -o "${4:-root}" -g "${5:-root}" "$candidate" "$target"
  rm -f "$candidate"
  say "wrote $target"
}

# 1. Packages.
missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  logged "apt-get update" apt-get update
  # No daemon starts from the packages' scripts: this script starts them below.
  logged "apt-get install ${missing[*]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}"
fi

# 2. Munge: the key every Slurm daemon and command signs its messages with.
if [ ! -s /etc/munge/munge.key ]; then
  say "creating the munge key"
  logged "mungekey" mungekey --create --keyfile=/etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
start munged runuser -u munge -- /usr/sbin/munged
wait_for "munged" sh -c 'munge -n | unmunge'

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
total_mb=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024))
margin_mb=$((total_mb * MARGIN_FRACTION_PERCENT / 100))
[ "$margin_mb" -ge "$MARGIN_MIN_MB" ] || margin_mb=$MARGIN_MIN_MB
memory_mb=$((total_mb - margin_mb))
install -d -o slurm -g slurm -m 0755 /var/lib/slurm/slurmctld /var/log/slurm
install -d -m 0755 /var/lib/slurm/slurmd

candidate="$(mktemp)"
cat >"$candidate" <<EOF
# Written by scripts/slurm_up.sh: one node, $cpus CPUs, ${memory_mb} MB of its ${total_mb} MB.
ClusterName=$CLUSTER
SlurmctldHost=$node(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
# No cgroups in a container: track and bind processes without them.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
# torchx reads job states through sacct: accounting through slurmdbd.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
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
