"""The network settings a multi-host job needs, checked before any connection is made
(training.distributed.check_network_settings), and the host a lost rank ran on named
in the failure line (training.failures). In-process; the multi-host cluster runs are
in tests/system/test_multihost.py; the readiness ranks exchange (two nodes on localhost) in
tests/system/test_torchrun_launch.py."""

import socket

import pytest

from common.errors import BadInput
from training import distributed
from training.distributed import check_network_settings, check_restart_settings, resolve_env
from training.failures import report_rank_failure

HOST = socket.gethostname()
INTERFACES = ", ".join(name for _, name in socket.if_nameindex())


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch):
    for name in (
        "GLOO_SOCKET_IFNAME",
        "NCCL_SOCKET_IFNAME",
        "MASTER_ADDR",
        "GROUP_WORLD_SIZE",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_USE_AGENT_STORE",
    ):
        monkeypatch.delenv(name, raising=False)


def test_gloo_interface_this_host_lacks_is_refused_naming_host_and_its_interfaces(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo,ib0")
    with pytest.raises(BadInput) as refused:
        check_network_settings("gloo", world_size=2, local_world_size=1)
    assert str(refused.value) == (
        f"GLOO_SOCKET_IFNAME=lo,ib0: host {HOST} has no network interface named ib0 (it has {INTERFACES})"
    )


def test_resolve_env_refuses_it_for_a_multi_rank_job_only(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ib0")
    assert resolve_env("cpu").world_size == 1  # one process: no connection to make
    for name, value in (("WORLD_SIZE", "2"), ("RANK", "1"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    with pytest.raises(BadInput, match=r"^GLOO_SOCKET_IFNAME=ib0: host "):
        resolve_env("cpu")


def test_interfaces_this_host_has_pass(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    check_network_settings("gloo", world_size=2, local_world_size=1)
    # NCCL's forms: a prefix, an exact name (=), an exclusion list (^) that leaves something.
    for value in ("l", "=lo", "ib,lo", "^docker,ib"):
        monkeypatch.setenv("NCCL_SOCKET_IFNAME", value)
        check_network_settings("nccl", world_size=2, local_world_size=1)


@pytest.mark.parametrize(
    "value, what", [("ib", "starting with ib"), ("=l", "named l"), ("ib,hsn", "starting with ib, hsn")]
)
def test_nccl_setting_that_matches_no_interface_is_refused(monkeypatch, value, what):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", value)
    with pytest.raises(BadInput) as refused:
        check_network_settings("nccl", world_size=2, local_world_size=1)
    assert (
        str(refused.value) == f"NCCL_SOCKET_IFNAME={value}: host {HOST} has no network interface {what} "
        f"(it has {INTERFACES})"
    )


def test_a_job_on_one_host_never_needs_a_routable_hostname(monkeypatch):
    """torchrun with a loopback rendezvous endpoint (every agent here), or no MASTER_ADDR:
    whatever this host's name resolves to, the ranks meet on loopback."""
    for master in ("127.0.0.1", "localhost", None):
        if master is None:
            monkeypatch.delenv("MASTER_ADDR", raising=False)
        else:
            monkeypatch.setenv("MASTER_ADDR", master)
        check_network_settings("gloo", world_size=2, local_world_size=1)


@pytest.mark.parametrize(
    "gloo_says",
    [
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:40217. This is typically caused by a remote worker crashing.",
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:40217: "
        "Connection reset by peer. This is typically caused by a remote worker hanging",
    ],
)
def test_lost_rank_is_named_by_the_host_of_the_broken_connection(capsys, gloo_says):
    """gloo's message gives the peer's address; the line names its host (/etc/hosts)."""
    lost = RuntimeError(gloo_says)
    assert report_rank_failure("dlrm_main.py", 0, 2, "step 3 (epoch 0, training)", lost) == 1
    name = socket.gethostbyaddr("127.0.0.1")[0]
    assert capsys.readouterr().err == (
        f"dlrm_main.py: error: rank 0 of 2 failed at step 3 (epoch 0, training): lost contact with the rank(s) "
        f"on host {name} (127.0.0.1), which probably stopped first (RuntimeError: {lost})\n"
    )


def _torchrun_sets(monkeypatch, agents: str, restarts: str, agent_store: str) -> None:
    for name, value in (
        ("GROUP_WORLD_SIZE", agents),
        ("TORCHELASTIC_MAX_RESTARTS", restarts),
        ("TORCHELASTIC_USE_AGENT_STORE", agent_store),
    ):
        monkeypatch.setenv(name, value)


def test_restarts_across_agents_over_their_shared_store_are_refused(monkeypatch):
    """A replaced host's agent would restart at attempt 0 beside survivors at 1: refused
    before anything connects (tests/system/test_node_loss.py runs the setting that works)."""
    _torchrun_sets(monkeypatch, agents="2", restarts="3", agent_store="True")
    for name, value in (("WORLD_SIZE", "2"), ("RANK", "1"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    with pytest.raises(BadInput) as refused:
        resolve_env("cpu")
    assert str(refused.value) == (
        "torchrun --max_restarts 3 with 2 agents needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in every agent's "
        "environment: over the agents' shared store a host replaced after a failure restarts at attempt 0 while "
        "the others are past it, and the job hangs"
    )


@pytest.mark.parametrize(
    "agents, restarts, agent_store",
    [
        ("2", "3", "False"),  # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: a store per attempt
        ("2", "0", "True"),  # no restarts
        ("1", "3", "True"),  # one agent: all of its ranks restart together, at the same count
    ],
)
def test_restarts_that_every_agent_counts_alike_pass(monkeypatch, agents, restarts, agent_store):
    _torchrun_sets(monkeypatch, agents, restarts, agent_store)
    check_restart_settings()


def test_a_failing_rank_with_no_store_to_reach_stops_with_its_own_line(monkeypatch):
    """Readiness (training/distributed.py): a rank that cannot start tells the others
    through the rendezvous store; when no store answers (MASTER_ADDR's server is down),
    it gives up within its bound and keeps its own line, instead of torch's 30-minute
    connection timeout."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert distributed.agree_on_readiness("GLOO_SOCKET_IFNAME=ib0: ...", timeout_s=2) == "GLOO_SOCKET_IFNAME=ib0: ..."


def test_readiness_outside_a_job_is_the_rank_own(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert distributed.agree_on_readiness("bad") == "bad"
    assert distributed.agree_on_readiness(None) is None
