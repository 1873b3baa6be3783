"""Device selection and the process group, for torchrun and for a plain `python` run."""

import datetime
import ipaddress
import itertools
import os
import resource
import socket
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from common.cores import rank_cpu_share, usable_cores  # noqa: F401  (their old home)
from common.errors import BadInput


@dataclass(frozen=True)
class DistributedEnv:
    """Where this process runs.

    Args:
        rank, world_size: global position of this process.
        local_rank, local_world_size: position on this host.
        device: cuda:LOCAL_RANK or cpu.
        backend: nccl (CUDA) or gloo (CPU).
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise BadInput(f"environment variable {name}={value!r} is not an integer") from None


def resolve_env(device_flag: str) -> DistributedEnv:
    """Reads torchrun's variables (defaults: one process) and picks the device.

    Raises BadInput (one line) when CUDA is asked for but missing, or when
    LOCAL_RANK has no GPU of its own.
    """
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", rank if world_size == 1 else 0)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", world_size)
    use_cuda = device_flag == "cuda" or (device_flag == "auto" and torch.cuda.is_available())
    if use_cuda:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise BadInput("--device cuda: no CUDA device is available on this host")
        if local_rank >= count:
            raise BadInput(
                f"LOCAL_RANK {local_rank} has no GPU: this host has {count} (run at most {count} processes per node)"
            )
        env = DistributedEnv(rank, world_size, local_rank, local_world_size, torch.device("cuda", local_rank), "nccl")
    else:
        env = DistributedEnv(rank, world_size, local_rank, local_world_size, torch.device("cpu"), "gloo")
    if world_size > 1:
        check_network_settings(env.backend, world_size, local_world_size)
        check_restart_settings()
    return env


def _interfaces() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


def _resolves_to_loopback(host: str) -> str | None:
    """The loopback address ``host`` resolves to (also "unresolvable"), or None."""
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return "no address (it does not resolve)"
    return address if ipaddress.ip_address(address).is_loopback else None


def check_network_settings(backend: str, world_size: int, local_world_size: int) -> None:
    """Refuses, in one line, a network setting with which this rank could never reach
    the ranks of other hosts (the first failures of a multi-host job, which otherwise
    show up as a hang or a refused connection minutes later):

    - ``GLOO_SOCKET_IFNAME`` (gloo: exact names, comma-separated) naming an interface
      this host does not have; ``NCCL_SOCKET_IFNAME`` (NCCL: name prefixes, ``=`` for
      exact names, ``^`` to exclude) matching none of its interfaces;
    - with gloo and no ``GLOO_SOCKET_IFNAME``, in a job across hosts (``MASTER_ADDR``
      not a loopback address), a hostname that resolves to a loopback address (Debian's
      127.0.1.1) or not at all: gloo gives the other hosts the address the hostname
      resolves to, falling back to loopback.
    """
    variable = "GLOO_SOCKET_IFNAME" if backend == "gloo" else "NCCL_SOCKET_IFNAME"
    value = os.environ.get(variable, "")
    host = socket.gethostname()
    interfaces = _interfaces()
    if value and not value.startswith("^"):  # an exclusion list always leaves something to try
        names = [name for name in value.lstrip("=").split(",") if name]
        exact = backend == "gloo" or value.startswith("=")
        found = [name for name in names if any(i == name if exact else i.startswith(name) for i in interfaces)]
        missing = [name for name in names if name not in found]
        if (exact and missing) or not found:
            raise BadInput(
                f"{variable}={value}: host {host} has no network interface "
                f"{'named' if exact else 'starting with'} {', '.join(missing)} "
                f"(it has {', '.join(interfaces)})"
            )
    if backend != "gloo" or value or world_size == local_world_size:
        return
    master = os.environ.get("MASTER_ADDR")
    if master is None or _resolves_to_loopback(master) is not None:
        return  # every agent of the job is on this host
    loopback = _resolves_to_loopback(host)
    if loopback is not None:
        raise BadInput(
            f"this job spans hosts (MASTER_ADDR={master}) but this host's name {host} resolves to "
            f"{loopback}, which gloo would give the other hosts to reach this rank: set "
            f"GLOO_SOCKET_IFNAME to the interface of the network between the hosts "
            f"(this host has {', '.join(interfaces)}) or map {host} to that address in /etc/hosts"
        )


def _agent_store_outlives_attempts() -> bool:
    """Whether the ranks' store is torchrun's agent store, which lives as long as the
    rank-0 agent, across restarts (torch 2.13's default; TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    makes each attempt's rank 0 serve a store of its own on a fresh port)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def check_restart_settings() -> None:
    """Refuses, in one line, restarts across several torchrun agents over the agents'
    shared store: a host that is lost and replaced cannot rejoin that way. Its fresh
    agent starts its ranks at TORCHELASTIC_RESTART_COUNT 0 while the survivors' are at
    1 or more, so their keys in the kept store disagree and the job hangs until the
    process group's timeout; and when the lost host's agent was the one serving the
    store, the survivors keep its old address. With the store per attempt there is
    nothing to carry over, and a replaced host joins like the others."""
    agents = _env_int("GROUP_WORLD_SIZE", 1)
    restarts = _env_int("TORCHELASTIC_MAX_RESTARTS", 0)
    if agents > 1 and restarts > 0 and _agent_store_outlives_attempts():
        raise BadInput(
            f"torchrun --max_restarts {restarts} with {agents} agents needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
            "in every agent's environment: over the agents' shared store a host replaced after a failure "
            "restarts at attempt 0 while the others are past it, and the job hangs"
        )


# How many times this process has started the default group: each start gets store
# keys of its own (see init_process_group).
_group_starts = itertools.count()
# How many readiness rounds this process has taken part in (`agree_on_readiness`).
_readiness_rounds = itertools.count()
# How long a rank waits for every rank's readiness, and then for every rank to have
# read it: a rank whose host cannot take part (a missing GLOO_SOCKET_IFNAME
# interface) stops the whole job within a minute instead of the peers' collective
# timeout (30 minutes). A peer that is merely slow to start does not stop the job:
# after the wait the ranks go on as before.
READINESS_TIMEOUT_S = 25.0


class PeerNotReady(BadInput):
    """Another rank of the job reported, through the rendezvous store, that it cannot
    start (its one line is the message)."""


def _launched_job() -> tuple[int, int] | None:
    """(rank, world size) of a multi-process job that meets through MASTER_ADDR's store
    (torchrun, torchx, Slurm); None for a single process or unreadable variables."""
    try:
        world_size, rank = _env_int("WORLD_SIZE", 1), _env_int("RANK", 0)
    except BadInput:
        return None
    if world_size <= 1 or "MASTER_ADDR" not in os.environ:
        return None
    return rank, world_size


# The job's rendezvous store, made once per process: the readiness round and the
# process group use the same one (a rank 0 that serves it must not serve it twice).
_job_store_cache: dict[tuple[str, str, int, int], dist.Store] = {}


def _job_store(rank: int, world_size: int, timeout_s: float | None = None) -> dist.Store:
    """The store, reached (or, on rank 0 without torchrun's agent store, served) within
    ``timeout_s`` (default: torch's, 30 minutes)."""
    key = (os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", ""), rank, world_size)
    if key not in _job_store_cache:
        timeout = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
        store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size, **timeout))
        _job_store_cache[key] = store
    return _job_store_cache[key]


def _store_answers(timeout_s: float) -> bool:
    """Whether something listens at MASTER_ADDR:MASTER_PORT within ``timeout_s``, asked
    with plain sockets: torch's store client logs each failed try as C++ lines on
    stderr, which would come before a failing rank's one line."""
    address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if not address or not port.isdigit():
        return False
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((address, int(port)), timeout=1):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)


def _attempt_prefix(prefix: str) -> str:
    """``prefix``, under the restart attempt's name where the store outlives attempts."""
    if _agent_store_outlives_attempts():
        return f"attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{prefix}"
    return prefix


def agree_on_readiness(error: str | None, timeout_s: float = READINESS_TIMEOUT_S) -> str | None:
    """Before the job's first collective: publishes this rank's readiness (None, or its
    one-line ``error``) in the rendezvous store and returns the error every rank acts
    on: this rank's own, else the lowest failing rank's, else None. Waits at most
    ``timeout_s`` for every rank's word, then, when the job stops, as long again for
    every rank to have read it (the store may live in a failing rank's process or its
    agent). A rank not heard from in time is taken as slow, not failed. Outside a
    multi-process job, returns ``error``."""
    job = _launched_job()
    if job is None:
        return error
    rank, world_size = job
    prefix = _attempt_prefix(f"ready_{next(_readiness_rounds)}")
    keys = [f"{prefix}/{r}" for r in range(world_size)]
    serves_store = rank == 0 and not _agent_store_outlives_attempts()  # env:// rendezvous: rank 0 serves
    if error is not None and not serves_store and not _store_answers(timeout_s):
        return error  # nobody to tell (the store's host is down, or MASTER_ADDR wrong)
    try:
        # A failing rank tries for a bounded time only: with no store to reach (its
        # MASTER_ADDR is down, or wrong) it still stops, with its own line.
        store = _job_store(rank, world_size, timeout_s if error is not None else None)
        store.set(keys[rank], "" if error is None else f"x{error}")
        try:
            store.wait(keys, datetime.timedelta(seconds=timeout_s))
        except dist.DistStoreError:
            pass  # a slow peer: judge by the words that came
        words = [store.get(key).decode() if store.check([key]) else "" for key in keys]
        failed = next((word[1:] for word in words if word), None)
        if error is None and failed is None:
            return None
        # Stopping: let every rank read the words before this one goes (and with it,
        # perhaps, the store).
        store.add(f"{prefix}/read", 1)
        deadline = time.monotonic() + timeout_s
        while store.add(f"{prefix}/read", 0) < world_size and time.monotonic() < deadline:
            time.sleep(0.1)
    except (RuntimeError, ValueError):  # no store (torch's DistError is a RuntimeError): each rank for itself
        return error
    return error if error is not None else failed


def group_device(env: DistributedEnv) -> torch.device | None:
    """The ``device_id`` for `init_process_group`: the rank's GPU on CUDA (NCCL binds its
    communicator to it at once instead of guessing the device on first use), none on CPU."""
    return env.device if env.device.type == "cuda" else None


def init_process_group(env: DistributedEnv) -> dist.ProcessGroup:
    """Starts the default process group (an in-memory store for a single process).

    On CPU each rank gets an equal share of the host's cores for its intra-op threads,
    so ranks do not oversubscribe the machine.
    """
    if env.device.type == "cuda":
        torch.cuda.set_device(env.device)
    else:
        torch.set_num_threads(rank_cpu_share(env.local_world_size))
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ:
            if env.world_size > 1:
                failed = agree_on_readiness(None)
                if failed is not None:
                    raise PeerNotReady(failed)
            store = _job_store(env.rank, env.world_size)
            # torchrun's agent store outlives restarts (`_agent_store_outlives_attempts`),
            # so a restarted attempt would read the last attempt's gloo addresses and
            # hang or be refused: there, give every attempt keys of its own (its agents
            # agree on the count: `check_restart_settings`). A store per attempt is new.
            # Within an attempt, a job that ends (a refusal after planning destroys
            # the group) and the next job in the same worker (bench/gpu_check.py, the
            # matrix) meet the same way: c10d names the new group as it named the old
            # one, so a rank could read the dead group's address or NCCL id before its
            # peer rewrites it. Every rank starts the group once per job, so the
            # count agrees across ranks.
            prefix = _attempt_prefix(f"start_{next(_group_starts)}")
            dist.init_process_group(
                env.backend,
                store=dist.PrefixStore(prefix, store),
                rank=env.rank,
                world_size=env.world_size,
                device_id=group_device(env),
            )
        elif env.world_size == 1:
            # Plain `python dlrm_main.py`: no rendezvous needed, no port to pick.
            dist.init_process_group(
                env.backend, store=dist.HashStore(), rank=0, world_size=1, device_id=group_device(env)
            )
        else:
            raise BadInput(f"WORLD_SIZE is {env.world_size} but MASTER_ADDR is not set: launch with torchrun")
    assert dist.group.WORLD is not None
    return dist.group.WORLD


# The peak RSS before `restart_peak_resident` last started it again: the process's peak
# stays the larger of this and the kernel's.
_peak_before_restart = 0


def local_peak_memory_bytes(device: torch.device) -> int:
    """This process's peak: max allocated on its GPU, else its peak RSS (since exec,
    across `restart_peak_resident`)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return max(_peak_before_restart, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # Linux: KiB


def restart_peak_resident() -> bool:
    """Starts this process's peak RSS (``VmHWM``) again from its RSS now, as
    ``torch.cuda.reset_peak_memory_stats`` does for a GPU, so `peak_resident_bytes` is
    the peak from here on; `local_peak_memory_bytes` keeps the whole run's. False
    where the kernel refuses (no ``/proc/self/clear_refs``): the peak is then since exec."""
    global _peak_before_restart
    _peak_before_restart = local_peak_memory_bytes(torch.device("cpu"))
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak RSS to the current RSS (Linux 4.0+)
    except OSError:
        return False
    return True


def peak_resident_bytes() -> int:
    """This process's peak RSS (``VmHWM``): since exec, or since `restart_peak_resident`."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def resident_bytes(device: torch.device) -> int:
    """This process's memory now: allocated on its GPU, else its resident set."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def gather_per_rank(env: DistributedEnv, value: int) -> list[int]:
    """Every rank's ``value``, in rank order, on every rank. Collective."""
    local = torch.tensor([float(value)], dtype=torch.float64, device=env.device)
    if env.world_size == 1:
        return [int(local.item())]
    gathered = [torch.zeros_like(local) for _ in range(env.world_size)]
    dist.all_gather(gathered, local)
    return [int(t.item()) for t in gathered]


def gather_peak_memory(env: DistributedEnv) -> list[int]:
    """Every rank's peak memory in bytes, on every rank. Collective."""
    return gather_per_rank(env, local_peak_memory_bytes(env.device))
