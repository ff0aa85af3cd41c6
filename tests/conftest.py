"""Shared fixtures: the two data paths, and where the peer-tool fixtures live."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from netprobe import core
from netprobe.core import pure
from netprobe.core.contract import DataPath
from tests import pgserver
from tests.budget import tcp_info_is_full
from tests.peers import PEER_FIXTURES, PeerBinary, check_absent_peer, default_peer

CORE_NAMES = (
    "Counters",
    "tcp_send",
    "tcp_recv",
    "udp_send",
    "udp_recv",
    "tcp_info",
    "rusage",
    "host_cpu",
    "monotonic",
)

# A shell that starts the suite in the background leaves SIGINT ignored, and an ignored
# signal stays ignored in every child: the Ctrl-C tests would test nothing. Python's own
# handler here means the children start with the default again.
signal.signal(signal.SIGINT, signal.default_int_handler)


def _terminated(signum: int, frame: object) -> None:
    # SIGTERM (a timeout, a stopped job) would end the suite where it stands and leave a
    # lab's namespaces and processes behind; as an interrupt, every open ``with Lab()``
    # unwinds and removes what it made, and pytest stops as it does on Ctrl-C.
    raise KeyboardInterrupt(f"signal {signum}")


signal.signal(signal.SIGTERM, _terminated)



def pytest_configure(config: pytest.Config) -> None:
    """ntttcp is not packaged: point $NETPROBE_NTTTCP at the built one (shared/peers) when
    none is set, so every test that runs ntttcp (the conformance kit, the agent's) finds it."""
    config.addinivalue_line("markers", "peer_absent: the peer binary of this parameter "
                            "is absent (tests.peers.absent_peer)")
    built = default_peer("ntttcp")
    if built is not None and not os.environ.get("NETPROBE_NTTTCP"):
        os.environ.update(built.env)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A parameter whose peer binary is absent skips, or fails in CI (tests.peers)."""
    check_absent_peer(item)


@pytest.fixture
def peer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> PeerBinary:
    """The peer binary a test is parametrised with (``indirect=True`` over
    tests.peers.peer_params), made the one netprobe and the processes it starts run."""
    binary: PeerBinary = request.param
    for name, value in binary.env.items():
        monkeypatch.setenv(name, value)
    return binary


@pytest.fixture(params=["c", "python"])
def data_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test on the compiled core and again on the pure-Python one.

    The pure path is swapped in by pointing netprobe.core's public names at a
    DataPath over netprobe.core.pure, which is exactly what the module does itself when
    the compiled core is missing or NETPROBE_PURE=1.
    """
    if request.param == "c" and core.DATA_PATH != "c":
        pytest.skip("the compiled core is not built here")
    if request.param == "python":
        python = DataPath(pure)
        for name in (*CORE_NAMES, "DATA_PATH"):
            monkeypatch.setattr(core, name, getattr(python, name))
    return str(request.param)


@pytest.fixture
def peer_fixtures() -> Path:
    """The folder of real peer-tool outputs (shared/fixtures/peers beside the repo)."""
    if not PEER_FIXTURES.is_dir():
        pytest.skip(f"peer fixtures not found at {PEER_FIXTURES}")
    return PEER_FIXTURES


@pytest.fixture(scope="session")
def full_tcp_info() -> None:
    """Skips a test that needs the kernel's TCP_INFO figures where they come back cut to
    4 bytes: qemu-user (scripts/arm-check) copies every TCP socket option out as an int."""
    if not tcp_info_is_full():
        pytest.skip("TCP_INFO is truncated to 4 bytes here (qemu-user emulation)")


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A real PostgreSQL server's URL for the module's tests (tests/pgserver.py), skipped
    with the reason where PostgreSQL is not installed."""
    reason = pgserver.why_not()
    if reason:
        pytest.skip(reason)
    with pgserver.postgres_server() as url:
        yield url
