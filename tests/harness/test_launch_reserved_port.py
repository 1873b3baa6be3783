"""The rendezvous ports of the tests' launches are reserved: under pytest-xdist a
port checked free and closed could go to the other worker's launch, and the two jobs
met in one store (harness/launch.py says how)."""

import contextlib
import datetime
import errno
import socket

from torch.distributed import TCPStore

from harness.launch import free_port, release_test_ports, reserved_port


def _taken(port: int) -> bool:
    """Whether another socket fails to bind ``port`` (as another worker's would)."""
    with socket.socket() as other:
        try:
            other.bind(("127.0.0.1", port))
        except OSError as e:
            assert e.errno == errno.EADDRINUSE, e
            return True
        return False


def _ports_the_kernel_picks(count: int) -> set[int]:
    """The ports of ``count`` sockets bound to port 0 at once."""
    with contextlib.ExitStack() as sockets:
        picked = set()
        for _ in range(count):
            s = sockets.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            picked.add(s.getsockname()[1])
        return picked


def test_a_reserved_port_is_no_one_elses_and_the_store_still_listens_on_it():
    with reserved_port() as port:
        assert _taken(port)
        assert port not in _ports_the_kernel_picks(500)
        server = TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=10))
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
        client.set("rank0", "here")
        assert server.get("rank0") == b"here"
        del client, server
    assert not _taken(port)


def test_free_port_stays_reserved_until_the_test_ends():
    port = free_port()
    assert _taken(port)
    release_test_ports()  # what tests/conftest.py does after each test
    assert not _taken(port)
