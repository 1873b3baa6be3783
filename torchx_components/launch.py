"""Builds the torchx AppDef of a training run from the components' parameters.

The torchrun command line and its rendezvous come from torchx's own ``dist.ddp``
(so every scheduler gets the rank-0 host macro it expects); this module adds what
``dist.ddp`` lacks: machine presets, validated ``-j``, data and checkpoint mounts.

Example::

    app = trainer_app("dlrm_main", ["--batch_size", "2048"],
                      LaunchOptions(j="2x8", h="a100x8", data_dir="/fsx/criteo"))
"""

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torchx.specs as specs
from torchx.components.dist import ddp

from common.config_flags import option
from data.config import DataConfig
from data.sources import DATA_PATH_FIELDS, CriteoDays
from torchx_components.machines import ComponentParameterError, machine_resource

# Image built by the repository's Dockerfile; local_cwd and Slurm ignore the image.
DEFAULT_IMAGE = "dlrm-torchrec:latest"

# Flags of dlrm_main.py that name the data (one per data source, data/sources/):
# `data_dir` adds the Criteo directory's unless the training flags give one of them.
DATA_PATH_FLAGS = tuple(option(DataConfig, name) for name in DATA_PATH_FIELDS)
DATA_DIR_FLAG = option(DataConfig, CriteoDays.path_field)


# The variables naming the interface each backend's connections between nodes use
# (training/distributed.py checks them on every rank before connecting).
SOCKET_IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
# What torchrun gives every rank from the rendezvous, whatever the job's environment
# says: the first node's address (on Slurm the first host of the allocation, from
# SLURM_JOB_NODELIST) and a port of its own; the rendezvous' port is ``rdzv_port``.
RENDEZVOUS_VARIABLES = ("MASTER_ADDR", "MASTER_PORT")
# Linux's name of the loopback interface, which reaches no other node.
LOOPBACK_INTERFACE = "lo"


@dataclass
class LaunchOptions:
    """Where and how a run is launched (the components' parameters).

    Args:
        j: ``NODESxPROCS``: nodes, and processes (ranks) per node.
        h: machine preset of each node (see ``torchx_components.machines``).
        cpu, gpu, memMB: override the preset's CPUs, GPUs, memory (MB) per node.
        image: container image (Kubernetes, AWS Batch, Docker).
        name: job name, ``{experiment}/{run}`` or ``{run}``.
        env: environment variables for every process.
        data_dir: data directory, bind-mounted read-only at the same path.
        checkpoint_dir: checkpoint directory, bind-mounted read-write at the same path.
        mounts: more mounts in torchx's form ``type=bind|volume|device,src=...,dst=...[,readonly]``.
        max_retries: times the scheduler restarts the whole job after a failure.
        rdzv_port: port of the c10d rendezvous on the first node (multi-node runs).
        socket_ifname: interface between the nodes, for gloo and NCCL (``SOCKET_IFNAME_VARIABLES``).

    Example::

        LaunchOptions(j="1x2").validate()
    """

    j: str = "1x2"
    h: str = "cpu"
    # Overrides arrive as strings from the torchx CLI (see machine_resource).
    cpu: Optional[Union[int, str]] = None
    gpu: Optional[Union[int, str]] = None
    memMB: Optional[Union[int, str]] = None
    image: str = DEFAULT_IMAGE
    name: str = "dlrm"
    env: Dict[str, str] = field(default_factory=dict)
    data_dir: Optional[str] = None
    checkpoint_dir: Optional[str] = None
    mounts: List[str] = field(default_factory=list)
    max_retries: int = 0
    rdzv_port: int = 29500
    socket_ifname: Optional[str] = None

    def nodes_and_procs(self) -> Tuple[int, int]:
        """Parses ``j``; raises ValueError (one line) unless it is NxM with N, M >= 1."""
        match = re.fullmatch(r"(\d+)x(\d+)", self.j)
        if match is None:
            raise ComponentParameterError(
                f"-j {self.j}: expected NODESxPROCS, e.g. 1x2 or 2x8 (elastic ranges are not "
                "supported: the sharding plan is made for one world size)"
            )
        nodes, procs = int(match.group(1)), int(match.group(2))
        if nodes < 1 or procs < 1:
            raise ComponentParameterError(f"-j {self.j}: nodes and processes per node must be at least 1")
        return nodes, procs

    def resource(self) -> specs.Resource:
        return machine_resource(self.h, self.cpu, self.gpu, self.memMB)

    def validate(self) -> None:
        """Raises ValueError (one line naming the parameter) on a bad combination."""
        nodes, procs = self.nodes_and_procs()
        resource = self.resource()
        if resource.gpu > 0 and procs > resource.gpu:
            raise ComponentParameterError(
                f"-j {self.j}: {procs} processes per node but machine {self.h} has "
                f"{resource.gpu} GPUs (one process per GPU)"
            )
        if self.max_retries < 0:
            raise ComponentParameterError(f"--max_retries {self.max_retries}: must be >= 0")
        if not 0 < self.rdzv_port < 65536:
            raise ComponentParameterError(f"--rdzv_port {self.rdzv_port}: not a TCP port")
        if self.socket_ifname is not None and not re.fullmatch(r"[\w.:-]+", self.socket_ifname):
            raise ComponentParameterError(
                f"--socket_ifname {self.socket_ifname!r}: expected one network interface name, e.g. eth0"
            )
        for name in RENDEZVOUS_VARIABLES:
            if name in self.env:
                raise ComponentParameterError(
                    f"--env {name}={self.env[name]}: torchrun sets {name} of every rank from the rendezvous on "
                    "the first node (on Slurm the first host of SLURM_JOB_NODELIST), so this value would be "
                    "ignored; remove it (--rdzv_port sets the rendezvous' port)"
                )
        interface_settings = {
            f"--env {name}={self.env[name]}": self.env[name] for name in SOCKET_IFNAME_VARIABLES if name in self.env
        }
        if self.socket_ifname is not None:
            interface_settings[f"--socket_ifname {self.socket_ifname}"] = self.socket_ifname
        for setting, interfaces in interface_settings.items():
            if nodes > 1 and only_loopback(interfaces):
                raise ComponentParameterError(
                    f"{setting}: the loopback interface does not reach the other nodes of a {self.j} job; "
                    "name the interface of the network between the nodes, e.g. eth0"
                )

    def rank_env(self) -> Dict[str, str]:
        """``env``, with the interface variables ``socket_ifname`` sets where ``env`` does not."""
        interface = {name: self.socket_ifname for name in SOCKET_IFNAME_VARIABLES} if self.socket_ifname else {}
        return {**interface, **self.env}

    def mount_tokens(self) -> List[str]:
        return bind_mounts(
            read_only=[self.data_dir] if self.data_dir else [],
            read_write=[self.checkpoint_dir] if self.checkpoint_dir else [],
            extra=self.mounts,
        )


def only_loopback(interfaces: str) -> bool:
    """Whether a ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` value names the loopback
    interface alone (comma-separated names; NCCL's ``=`` exact-match prefix; a ``^``
    exclusion list leaves other interfaces)."""
    if interfaces.startswith("^"):
        return False
    names = [name for name in interfaces.lstrip("=").split(",") if name]
    return bool(names) and all(name == LOOPBACK_INTERFACE for name in names)


def bind_mounts(read_only: Sequence[str], read_write: Sequence[str], extra: Sequence[str]) -> List[str]:
    """Bind mounts of host directories at the same path in the container, then ``extra``,
    as torchx's comma-split mount tokens (what ``--mounts a,b,c`` parses into).

    Example::

        bind_mounts(["/data"], [], [])  # ["type=bind", "src=/data", "dst=/data", "readonly"]
    """
    tokens: List[str] = []
    for path in read_only:
        tokens += ["type=bind", f"src={path}", f"dst={path}", "readonly"]
    for path in read_write:
        tokens += ["type=bind", f"src={path}", f"dst={path}"]
    return tokens + list(extra)


def gives_data_path(script_args: Sequence[str]) -> bool:
    """Whether the training flags already name a data directory."""
    return any(arg.split("=", 1)[0] in DATA_PATH_FLAGS for arg in script_args)


def trainer_app(module: str, script_args: Sequence[str], options: LaunchOptions) -> specs.AppDef:
    """One role of NODES torchrun agents, each starting PROCS ranks of the entry-point
    module (``dlrm_main``, ``dcnv2_main``).

    The ranks run it as ``-m MODULE``: the install (`make install`, the image) puts the
    entry points on the path, so a job starts from any working directory, not only
    the repository root.

    ``data_dir`` adds ``--in_memory_binary_criteo_path DATA_DIR`` unless the flags give
    a data path. ``checkpoint_dir`` is mounted and adds ``--checkpoint_dir DIR --resume``
    unless the flags name a checkpoint directory, so a job restarted by ``max_retries``
    continues from its newest complete checkpoint.
    """
    options.validate()
    args = list(script_args)
    if options.data_dir and not gives_data_path(args):
        args = [DATA_DIR_FLAG, options.data_dir, *args]
    if options.checkpoint_dir and not any(a.split("=", 1)[0] == "--checkpoint_dir" for a in args):
        args = ["--checkpoint_dir", options.checkpoint_dir, "--resume", *args]
    resource = options.resource()
    app = ddp(
        *args,
        m=module,
        image=options.image,
        name=options.name,
        cpu=resource.cpu,
        gpu=resource.gpu,
        memMB=resource.memMB,
        j=options.j,
        env=options.rank_env(),
        max_retries=options.max_retries,
        rdzv_port=options.rdzv_port,
        mounts=options.mount_tokens() or None,
    )
    # ddp only knows cpu/gpu/memMB: keep the preset's node selector and devices too.
    app.roles[0].resource = resource
    return app
