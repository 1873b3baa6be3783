"""torchx components that train DLRM and DCNv2: ``torchx run dlrm ...``, ``torchx run dcnv2 ...``.

Every function in this module is a component (torchx lists a module's functions):
helpers live in ``torchx_components.launch``. The two components take the same
parameters; their shared docstring is ``TRAINING_PARAMETERS``.

Example::

    torchx run -s local_cwd dlrm -j 1x2 -- --in_memory_binary_criteo_path DIR --batch_size 512
"""

from typing import Dict, List, Optional

import torchx.specs as specs

from torchx_components.launch import DEFAULT_IMAGE, LaunchOptions, trainer_app
from torchx_components.machines import machine_resource

_DEFAULT_NODE = machine_resource("cpu")
TRAINING_PARAMETERS = f"""
Args:
    script_args: training flags, passed to the entry point unchanged (after --)
    j: NODESxPROCS: nodes, and processes (ranks) per node; on GPU machines at most one per GPU
    h: machine preset of each node: cpu, cpu_large, a100x1, a100x8, h100x8, aws_p4d, aws_p4de, aws_p5 or a torchx named resource. The request must fit one node: on Slurm a job asking more CPUs than a node has stays pending forever (reason PartitionConfig; torchx run --wait never returns) and one asking more memory is refused, so size it with sinfo -O partition,cpus,memory (CPUs and MB per node), e.g. --cpu 2 on 2-CPU nodes (the cpu preset asks {_DEFAULT_NODE.cpu} CPUs, {_DEFAULT_NODE.memMB} MB)
    cpu: CPUs per node, replacing the preset's; at most a node's CPUs (see h)
    gpu: GPUs per node, replacing the preset's
    memMB: memory per node in MB, replacing the preset's (0.96 x its RAM); at most a node's memory (see h)
    image: container image holding this repository (Kubernetes, AWS Batch, Docker; ignored by local_cwd and Slurm)
    name: job name, {{experiment}}/{{run}} or {{run}}
    env: environment variables for every rank, e.g. NCCL_DEBUG=INFO,LOGLEVEL=INFO; not MASTER_ADDR or MASTER_PORT, which torchrun sets from the rendezvous on the first node (on Slurm the first host of SLURM_JOB_NODELIST)
    data_dir: data directory on a filesystem every node sees; mounted read-only at the same path and passed as --in_memory_binary_criteo_path unless the flags give a data path
    checkpoint_dir: checkpoint directory on a filesystem every node sees; mounted read-write at the same path and passed as --checkpoint_dir DIR --resume unless the flags name one (add --checkpoint_every_n_steps N to the flags)
    mounts: more mounts: type=bind|volume|device,src=SRC,dst=DST[,readonly]
    max_retries: times the scheduler restarts the job after a failure; with checkpoint_dir a restart resumes from the newest complete checkpoint
    rdzv_port: port of the c10d rendezvous on the first node (multi-node runs)
    socket_ifname: network interface the ranks of different nodes talk over (multi-node runs), e.g. eth0: sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME unless env sets them; every rank refuses to start when its node lacks it; lo (loopback) is refused on several nodes. Unset, gloo uses the address the node's hostname resolves to, and a rank refuses to start when that is a loopback address
"""


def dlrm(
    *script_args: str,
    j: str = "1x2",
    h: str = "cpu",
    cpu: Optional[int] = None,
    gpu: Optional[int] = None,
    memMB: Optional[int] = None,
    image: str = DEFAULT_IMAGE,
    name: str = "dlrm",
    env: Optional[Dict[str, str]] = None,
    data_dir: Optional[str] = None,
    checkpoint_dir: Optional[str] = None,
    mounts: Optional[List[str]] = None,
    max_retries: int = 0,
    rdzv_port: int = 29500,
    socket_ifname: Optional[str] = None,
) -> specs.AppDef:
    return trainer_app(
        "dlrm_main",
        script_args,
        LaunchOptions(
            j=j,
            h=h,
            cpu=cpu,
            gpu=gpu,
            memMB=memMB,
            image=image,
            name=name,
            env=env or {},
            data_dir=data_dir,
            checkpoint_dir=checkpoint_dir,
            mounts=mounts or [],
            max_retries=max_retries,
            rdzv_port=rdzv_port,
            socket_ifname=socket_ifname,
        ),
    )


def dcnv2(
    *script_args: str,
    j: str = "1x2",
    h: str = "cpu",
    cpu: Optional[int] = None,
    gpu: Optional[int] = None,
    memMB: Optional[int] = None,
    image: str = DEFAULT_IMAGE,
    name: str = "dcnv2",
    env: Optional[Dict[str, str]] = None,
    data_dir: Optional[str] = None,
    checkpoint_dir: Optional[str] = None,
    mounts: Optional[List[str]] = None,
    max_retries: int = 0,
    rdzv_port: int = 29500,
    socket_ifname: Optional[str] = None,
) -> specs.AppDef:
    return trainer_app(
        "dcnv2_main",
        script_args,
        LaunchOptions(
            j=j,
            h=h,
            cpu=cpu,
            gpu=gpu,
            memMB=memMB,
            image=image,
            name=name,
            env=env or {},
            data_dir=data_dir,
            checkpoint_dir=checkpoint_dir,
            mounts=mounts or [],
            max_retries=max_retries,
            rdzv_port=rdzv_port,
            socket_ifname=socket_ifname,
        ),
    )


# torchx reads a component's help from its docstring (summary + Google-style Args).
dlrm.__doc__ = "Trains DLRM (dlrm_main.py) with torchrun on NODES x PROCS ranks.\n" + TRAINING_PARAMETERS
dcnv2.__doc__ = (
    "Trains DCNv2 (dcnv2_main.py: DLRM with the low-rank cross net and DCNv2's defaults) "
    "with torchrun on NODES x PROCS ranks.\n" + TRAINING_PARAMETERS
)
