"""scripts/slurm_lib.sh's slurm_conf, the one slurm.conf writer: the configuration step
of each bring-up script (scripts/slurm_up.sh, scripts/cluster_slurm.sh), run with fixed
facts of a machine and with the commands that need root stubbed, writes the file the
scripts wrote before they shared it, byte for byte."""

import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(REPO, "scripts")

# A machine of 16 CPUs and 128,000 MB (121,600 of them for Slurm) named node7; the
# hosts' cluster: controller h0 at 10.200.0.1, compute hosts h1 to h3.
_STUBS = f"""
LOG=/dev/null; SCRIPT=test; TIMEOUT=1
hostname() {{ echo node7; }}
nproc() {{ echo 16; }}
source {SCRIPTS}/slurm_lib.sh
total_memory_mb() {{ echo 128000; }}
usable_memory_mb() {{ echo 121600; }}
mktemp() {{ echo "$OUT_FILE"; }}
install() {{ :; }}
install_if_changed() {{ return 1; }}
"""

COMMON = """\
SlurmUser=slurm
AuthType=auth/munge
"""
NO_CGROUPS = """\
# No cgroups in a container: track and bind processes without them.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
"""
ACCOUNTING = """\
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
# torchx reads job states through sacct: accounting through slurmdbd.
AccountingStorageType=accounting_storage/slurmdbd
"""
ONE_NODE = f"""\
# Written by scripts/slurm_up.sh: one node, 16 CPUs, 121600 MB of its 128000 MB.
ClusterName=dlrm
SlurmctldHost=node7(127.0.0.1)
{COMMON}StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
{NO_CGROUPS}{ACCOUNTING}AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=node7 NodeAddr=127.0.0.1 CPUs=16 RealMemory=121600 State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
HOSTS = f"""\
# Written by scripts/cluster_slurm.sh: 3 compute hosts of 16 CPUs and 40533 MB each,
# their share of this machine's 16 CPUs and 128000 MB (one kernel for all).
ClusterName=dlrmhosts
SlurmctldHost=h0(10.200.0.1)
SlurmctldPort=6917
SlurmdPort=6918
{COMMON}StateSaveLocation=/run/dlrm_cluster/slurm/ctld
SlurmdSpoolDir=/run/dlrm_cluster/slurm/spool/%n
SlurmctldPidFile=/run/dlrm_cluster/slurm/run/slurmctld.pid
SlurmdPidFile=/run/dlrm_cluster/slurm/run/slurmd-%n.pid
SlurmctldLogFile=/run/dlrm_cluster/slurm/log/slurmctld.log
SlurmdLogFile=/run/dlrm_cluster/slurm/log/slurmd-%n.log
SlurmdTimeout=30
# Resolve a node's name at every connection, not once per daemon: a host that comes
# back at another address (its /etc/hosts line changed) is reached there by slurmctld,
# srun and the other slurmds without a restart. The whole value, nothing beside it:
# Slurm 22.05 compares the option the wrong way round and misses it in a list.
CommunicationParameters=NoAddrCache
{NO_CGROUPS}\
# torchx submits a job of several nodes as a heterogeneous job, which only the backfill
# scheduler starts: every 2 s rather than its default 30 s.
SchedulerParameters=bf_interval=2
{ACCOUNTING}AccountingStorageHost=h0
AccountingStoragePort=6919
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=h1 CPUs=16 RealMemory=40533 State=UNKNOWN
NodeName=h2 CPUs=16 RealMemory=40533 State=UNKNOWN
NodeName=h3 CPUs=16 RealMemory=40533 State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _between(path: str, first: str, last: str) -> str:
    """The lines of the script at ``path`` from the one starting with ``first`` to the
    one starting with ``last``, both included."""
    with open(path) as f:
        lines = f.read().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith(last))
    return "".join(lines[start : end + 1])


def written_conf(script: str, tmp_path) -> str:
    """The slurm.conf the configuration step of ``script`` writes on the fixed machine."""
    path = os.path.join(SCRIPTS, script)
    if script == "slurm_up.sh":
        body = "CLUSTER=dlrm; PARTITION=main\n" + _between(path, "# 4. Configuration", "install_if_changed /etc/")
    else:
        body = (
            _between(path, "STATE=", "SLURMD_TIMEOUT=")
            + 'ON_HOST=on_host; on_host() { shift; "$@"; }\n'
            + "controller=h0; controller_address=10.200.0.1; compute=(h1 h2 h3)\n"
            + _between(path, "# 2. The configuration", 'install_if_changed "$CONF"')
        )
    out = tmp_path / f"{script}.conf"
    done = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{_STUBS}\n{body}\ntrue"],
        capture_output=True,
        text=True,
        env={**os.environ, "OUT_FILE": str(out)},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return out.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("script, expected", [("slurm_up.sh", ONE_NODE), ("cluster_slurm.sh", HOSTS)])
def test_each_bring_up_script_writes_its_slurm_conf_through_slurm_conf(script, expected, tmp_path):
    assert written_conf(script, tmp_path) == expected


@pytest.mark.slow
def test_slurm_conf_leaves_out_the_settings_a_cluster_does_not_set(tmp_path):
    """Positive control of the optional keys: without ports, timeout, address cache and
    backfill interval, none of their lines (nor their comments) is written."""
    settings = (
        "declare -A c=([header]='# h' [cluster]=c [controller]='n(1.2.3.4)' [state]=s [spool]=p "
        "[ctld_pid]=a [slurmd_pid]=b [ctld_log]=l [slurmd_log]=m [accounting_host]=x "
        "[nodes]=$'NodeName=n CPUs=1\\n' [partition]=q)"
    )
    done = subprocess.run(
        ["bash", "-c", f"{_STUBS}\n{settings}\nslurm_conf c"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == ["# h", "ClusterName=c", "SlurmctldHost=n(1.2.3.4)"]
    assert not [
        line
        for line in lines
        if line.split("=")[0]
        in (
            "SlurmctldPort",
            "SlurmdPort",
            "SlurmdTimeout",
            "CommunicationParameters",
            "SchedulerParameters",
            "AccountingStoragePort",
        )
    ]
    assert lines[-2:] == ["NodeName=n CPUs=1", "PartitionName=q Nodes=ALL Default=YES MaxTime=INFINITE State=UP"]
