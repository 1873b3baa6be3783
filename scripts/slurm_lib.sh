# Shell functions shared by the two Slurm bring-up scripts: scripts/slurm_up.sh (the
# one-node cluster in this machine's own network) and scripts/cluster_slurm.sh (the
# cluster across the hosts of scripts/cluster_up.sh), the slurm.conf writer of both
# (slurm_conf) among them. Sourced, not run.
#
# The sourcing script sets, before calling any of them:
#   SCRIPT    its name, the prefix of every line it prints (slurm_up, cluster_slurm)
#   LOG       its detailed log file (exists)
#   TIMEOUT   seconds to wait for each daemon
# Debian's packages of Slurm, its accounting daemon, munge and MariaDB.
SLURM_PACKAGES=(slurm-wlm slurmdbd munge mariadb-server)

say() { echo "$SCRIPT: $*"; echo "$(date -u +%FT%TZ) $*" >>"$LOG"; }
die() {
  echo "$SCRIPT: error: $* (details: $LOG)" >&2
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
# Installs $2 (a temporary file) as $1 with mode $3 (owner $4, group $5: root by
# default); returns 0 when the file changed.
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

# Installs the packages that are missing; their package scripts start no daemon (the
# scripts start them).
install_slurm_packages() {
  local missing=() package
  for package in "${SLURM_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  say "installing ${missing[*]}"
  logged "apt-get update" apt-get update
  logged "apt-get install ${missing[*]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}"
}

# Munge: the key every Slurm daemon and command signs its messages with, and munged,
# in this machine's own namespaces. Its Unix socket (/run/munge) is a file, so the
# processes of every network namespace reach the same munged.
start_munge() {
  if [ ! -s /etc/munge/munge.key ]; then
    say "creating the munge key"
    logged "mungekey" mungekey --create --keyfile=/etc/munge/munge.key
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
  if ! pgrep -x munged >/dev/null; then
    say "starting munged"
    setsid -f runuser -u munge -- /usr/sbin/munged >>"$LOG" 2>&1 </dev/null || die "munged did not start"
  fi
  wait_for "munged" sh -c 'munge -n | unmunge'
}

# The one slurm.conf writer: prints the configuration both clusters share, with the
# settings of the one whose associative array (declare -A) is named $1. Its keys:
#   header          the comment lines on top, each starting "# ", no newline at the end
#   cluster         ClusterName
#   controller      SlurmctldHost: name(address)
#   ctld_port, slurmd_port       SlurmctldPort, SlurmdPort (empty or absent: Slurm's own)
#   state, spool    StateSaveLocation, SlurmdSpoolDir
#   ctld_pid, slurmd_pid, ctld_log, slurmd_log    the daemons' pid and log files
#   slurmd_timeout  SlurmdTimeout (absent: Slurm's 300 s)
#   no_addr_cache   1: CommunicationParameters=NoAddrCache (a node's name resolved anew)
#   backfill_interval   SchedulerParameters=bf_interval= (absent: Slurm's 30 s)
#   accounting_host, accounting_port    where slurmdbd answers (port absent: Slurm's)
#   nodes           the NodeName lines, each ending in a newline
#   partition       the one partition, every node in it
# Example:
#   declare -A conf=([header]="# one node" [cluster]=dlrm ...); slurm_conf conf >"$candidate"
slurm_conf() {
  local -n c="$1"
  printf '%s\n' "${c[header]}" "ClusterName=${c[cluster]}" "SlurmctldHost=${c[controller]}"
  [ -z "${c[ctld_port]:-}" ] || echo "SlurmctldPort=${c[ctld_port]}"
  [ -z "${c[slurmd_port]:-}" ] || echo "SlurmdPort=${c[slurmd_port]}"
  cat <<EOF
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=${c[state]}
SlurmdSpoolDir=${c[spool]}
SlurmctldPidFile=${c[ctld_pid]}
SlurmdPidFile=${c[slurmd_pid]}
SlurmctldLogFile=${c[ctld_log]}
SlurmdLogFile=${c[slurmd_log]}
EOF
  [ -z "${c[slurmd_timeout]:-}" ] || echo "SlurmdTimeout=${c[slurmd_timeout]}"
  if [ "${c[no_addr_cache]:-}" = 1 ]; then
    cat <<'EOF'
# Resolve a node's name at every connection, not once per daemon: a host that comes
# back at another address (its /etc/hosts line changed) is reached there by slurmctld,
# srun and the other slurmds without a restart. The whole value, nothing beside it:
# Slurm 22.05 compares the option the wrong way round and misses it in a list.
CommunicationParameters=NoAddrCache
EOF
  fi
  cat <<'EOF'
# No cgroups in a container: track and bind processes without them.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
EOF
  if [ -n "${c[backfill_interval]:-}" ]; then
    cat <<EOF
# torchx submits a job of several nodes as a heterogeneous job, which only the backfill
# scheduler starts: every ${c[backfill_interval]} s rather than its default 30 s.
SchedulerParameters=bf_interval=${c[backfill_interval]}
EOF
  fi
  cat <<EOF
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
# torchx reads job states through sacct: accounting through slurmdbd.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=${c[accounting_host]}
EOF
  [ -z "${c[accounting_port]:-}" ] || echo "AccountingStoragePort=${c[accounting_port]}"
  cat <<EOF
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
${c[nodes]}PartitionName=${c[partition]} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

# This machine's RAM in MB, and what of it Slurm may hand out: the RAM less a margin
# for the OS and the daemons, 5% of it and at least 1 GiB.
total_memory_mb() { echo $(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024)); }
usable_memory_mb() {
  local total margin
  total="$(total_memory_mb)"
  margin=$((total * 5 / 100))
  [ "$margin" -ge 1024 ] || margin=1024
  echo $((total - margin))
}
