#!/usr/bin/env bash
# Brings up a cluster of several "hosts" on this one machine: each host is a Linux
# network namespace with a hostname of its own (a UTS namespace), its own loopback and
# one address on a private bridge made for the purpose, and every host's name is in
# /etc/hosts. `make cluster-up` runs it, `make cluster-down` runs it with --down;
# docs/multihost.md says what it simulates and what not, and how to run jobs on it.
#
#   scripts/cluster_up.sh [--hosts N]   brings up N hosts (default 3: the controller
#                                       dlrm-ctl, compute hosts dlrm-node1..N-1)
#   scripts/cluster_up.sh --down        removes everything it made, whatever N was
#   scripts/on_host.sh HOST CMD...      runs a command on a host (its network and name)
#
# Last, scripts/cluster_slurm.sh starts a Slurm cluster across the hosts (slurmctld
# and slurmdbd on the controller, a slurmd in each compute host); --down removes it
# with the hosts. Its failure is this script's (exit 1, its one line).
#
# Nothing leaves the machine: the bridge has no address in the machine's own network
# namespace and no port but the hosts' veths, the hosts have no route but the bridge's
# subnet (no default route, no NAT, forwarding untouched), and the subnet is checked
# at start not to overlap any address or route the machine already has.
#
# Idempotent: every step checks first; a second run with everything up changes
# nothing. Asking for fewer hosts than are up removes the extra ones. Needs root.
#
# Settings (environment):
#   CLUSTER_SUBNET   the bridge's /24 (default 10.213.27.0/24); host i gets .(10+i).
# What it made is listed in $STATE/hosts ("NAME ADDRESS BRIDGE_PORT" per line, the
# controller first; BRIDGE_PORT is the host's veth on the bridge, whose counters say
# what the host sent and received):
# scripts/on_host.sh and the tests read it.
# Exit codes: 0 up (or down); 1 a step failed, Slurm's included (one line naming it); 2 bad usage or not root.
set -euo pipefail

STATE=/run/dlrm_cluster
BRIDGE=dlrmbr0
CONTROLLER=dlrm-ctl
COMPUTE_PREFIX=dlrm-node
SUBNET="${CLUSTER_SUBNET:-10.213.27.0/24}"
HOSTS_BEGIN="# BEGIN dlrm cluster (scripts/cluster_up.sh; removed by make cluster-down)"
HOSTS_END="# END dlrm cluster"
FIRST_HOST_OCTET=10

die() { echo "cluster_up: error: $*" >&2; exit 1; }
usage() { echo "cluster_up: $*; usage: cluster_up.sh [--hosts N (2..100)] | --down" >&2; exit 2; }

hosts=3
down=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) [ $# -ge 2 ] || usage "--hosts needs a number"; hosts="$2"; shift 2 ;;
    --hosts=*) hosts="${1#--hosts=}"; shift ;;
    --down) down=1; shift ;;
    *) usage "unknown argument '$1'" ;;
  esac
done
[[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 2 ] && [ "$hosts" -le 100 ] \
  || usage "--hosts $hosts: expected a number of hosts from 2 to 100"
if [ "$(id -u)" -ne 0 ]; then
  echo "cluster_up: must run as root (it makes namespaces, a bridge and edits /etc/hosts): sudo make cluster-up" >&2
  exit 2
fi
# The tools, from Debian's packages: ip, unshare/nsenter, ping (the reachability check).
missing=()
for package in iproute2 util-linux iputils-ping; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ] && [ "$down" = 0 ]; then
  echo "cluster_up: installing ${missing[*]}"
  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"; } \
    >/dev/null 2>&1 || die "apt-get install ${missing[*]} failed"
fi

host_name() { if [ "$1" -eq 0 ]; then echo "$CONTROLLER"; else echo "$COMPUTE_PREFIX$1"; fi; }
veth_name() { echo "v-$(host_name "$1")"; }  # the bridge's end; the host's end is eth0

# --- IPv4 arithmetic for the overlap check -------------------------------------------
ip_to_int() {
  local a b c d
  IFS=. read -r a b c d <<<"$1"
  echo $(((a << 24) | (b << 16) | (c << 8) | d))
}
# Whether the networks $1 and $2 (CIDR; a bare address is a /32) share an address.
overlaps() {
  local net1="${1%/*}" len1="${1#*/}" net2="${2%/*}" len2="${2#*/}"
  [ "$len1" != "$1" ] || len1=32
  [ "$len2" != "$2" ] || len2=32
  local len=$((len1 < len2 ? len1 : len2))
  local mask=$(((0xffffffff << (32 - len)) & 0xffffffff))
  [ $(($(ip_to_int "$net1") & mask)) -eq $(($(ip_to_int "$net2") & mask)) ]
}

# --- /etc/hosts: one marked block, rewritten in place (it may be a bind mount) --------
hosts_without_block() {
  awk -v begin="$HOSTS_BEGIN" -v end="$HOSTS_END" '$0 == begin {skip = 1} !skip {print} $0 == end {skip = 0}' /etc/hosts
}
write_hosts() {
  local candidate
  candidate="$(mktemp)"
  cat >"$candidate"
  cmp -s "$candidate" /etc/hosts || cat "$candidate" >/etc/hosts
  rm -f "$candidate"
}

# --- one host -------------------------------------------------------------------------
remove_host() {
  local name="$1" veth="v-$1" pids
  if [ -e "/run/netns/$name" ]; then
    # Every process of the host first: a namespace with processes outlives `ip netns del`.
    pids="$(ip netns pids "$name" 2>/dev/null || true)"
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
    ip netns del "$name" || die "could not delete network namespace $name"
  fi
  ! ip link show "$veth" >/dev/null 2>&1 || ip link del "$veth"
  if [ -e "$STATE/uts/$name" ]; then
    umount "$STATE/uts/$name" 2>/dev/null || true
    rm -f "$STATE/uts/$name"
  fi
}

add_host() {
  local index="$1" name veth address
  name="$(host_name "$index")"
  veth="$(veth_name "$index")"
  address="$2"
  [ -e "/run/netns/$name" ] || ip netns add "$name" || die "could not add network namespace $name"
  if ! ip link show "$veth" >/dev/null 2>&1; then
    ip link add "$veth" type veth peer name eth0 netns "$name" || die "could not add the veth pair of $name"
  fi
  ip link set "$veth" master "$BRIDGE" up
  ip -n "$name" link set lo up
  ip -n "$name" link set eth0 up
  if ! ip -n "$name" -4 -o addr show dev eth0 | grep -q " $address/"; then
    ip -n "$name" addr flush dev eth0
    ip -n "$name" addr add "$address/$SUBNET_LEN" dev eth0
  fi
  # The hostname lives in a UTS namespace kept alive by a bind mount on this file.
  if [ "$(nsenter --uts="$STATE/uts/$name" hostname 2>/dev/null || true)" != "$name" ]; then
    touch "$STATE/uts/$name"
    unshare --uts="$STATE/uts/$name" hostname "$name" || die "could not make the UTS namespace of $name"
  fi
}

# Host names this machine has now (from the namespaces the script made).
existing_hosts() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^($CONTROLLER|$COMPUTE_PREFIX[0-9]+)\$" || true
}

if [ "$down" = 1 ]; then
  for name in $(existing_hosts); do remove_host "$name"; done
  for file in "$STATE"/uts/*; do [ -e "$file" ] && remove_host "$(basename "$file")"; done
  ! ip link show "$BRIDGE" >/dev/null 2>&1 || ip link del "$BRIDGE"
  hosts_without_block | write_hosts
  if [ -e "$STATE/made_run_netns" ] && [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
    while mountpoint -q /run/netns; do umount /run/netns; done
    rmdir /run/netns
  fi
  rm -rf "$STATE"
  echo "cluster_up: cluster down"
  exit 0
fi

# --- the subnet: a /24 of private addresses that this machine does not use -----------
[[ "$SUBNET" =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)\.0/24$ ]] \
  || usage "CLUSTER_SUBNET=$SUBNET: expected a /24 such as 10.213.27.0/24"
SUBNET_PREFIX="${SUBNET%.0/24}"
SUBNET_LEN=24
for network in $(ip -4 -o addr show | awk '{print $4}') \
               $(ip -4 route show table all | awk '$1 ~ /^(local|broadcast|unicast|unreachable|blackhole|prohibit|throw|multicast|anycast|nat)$/ {print $2; next} $1 != "default" {print $1}'); do
  if overlaps "$SUBNET" "$network"; then
    die "CLUSTER_SUBNET=$SUBNET overlaps $network, which this machine already has (ip addr / ip route): pick another with CLUSTER_SUBNET"
  fi
done

# `ip netns add` makes /run/netns a mount point of its own; down undoes it when up made it.
if [ ! -d "$STATE" ] && [ ! -d /run/netns ]; then
  mkdir -p "$STATE"
  touch "$STATE/made_run_netns"
fi
mkdir -p "$STATE/uts"
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link add "$BRIDGE" type bridge || die "could not add bridge $BRIDGE"
fi
# No address on the bridge: the machine itself is not on the cluster's network, so
# nothing on it is reachable from a host and no host's packet can be routed out.
ip addr flush dev "$BRIDGE"
ip link set "$BRIDGE" up

# Fewer hosts than before: the extra compute hosts go.
for name in $(existing_hosts); do
  index="${name#"$COMPUTE_PREFIX"}"
  if [ "$name" != "$CONTROLLER" ] && [ "$index" -ge "$hosts" ]; then remove_host "$name"; fi
done

listing="$(mktemp)"
for ((i = 0; i < hosts; i++)); do
  address="$SUBNET_PREFIX.$((FIRST_HOST_OCTET + i))"
  add_host "$i" "$address"
  echo "$(host_name "$i") $address $(veth_name "$i")" >>"$listing"
done

{
  hosts_without_block
  echo "$HOSTS_BEGIN"
  awk '{print $2 " " $1}' "$listing"
  echo "$HOSTS_END"
} | write_hosts
mv "$listing" "$STATE/hosts"
chmod 0644 "$STATE/hosts"

# Every host reaches every other by name, once (bounded: one packet, 2 s each).
controller_address="$SUBNET_PREFIX.$FIRST_HOST_OCTET"
for ((i = 1; i < hosts; i++)); do
  name="$(host_name "$i")"
  ip netns exec "$name" ping -c 1 -W 2 "$CONTROLLER" >/dev/null 2>&1 \
    || die "$name cannot reach $CONTROLLER ($controller_address) over $BRIDGE"
done
echo "cluster_up: cluster up: $hosts hosts on $BRIDGE ($SUBNET): $(awk '{printf "%s%s", sep, $1; sep=", "}' "$STATE/hosts")"
# Slurm across the hosts: slurmctld on the controller, a slurmd per compute host.
bash "$(dirname "$0")/cluster_slurm.sh"
