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
from tests.hoststeal import StealMeter, unjudged_reason
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
    config.addinivalue_line("markers", "host_timing: needs the host to run this machine's "
                            "CPUs when woken; a failure while the host took them (steal) is "
                            "unjudged (tests.hoststeal)")
    built = default_peer("ntttcp")
    if built is not None and not os.environ.get("NETPROBE_NTTTCP"):
        os.environ.update(built.env)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A parameter whose peer binary is absent skips, or fails in CI (tests.peers)."""
    check_absent_peer(item)


_UNJUDGED: list[str] = []
_STEAL_KEY = pytest.StashKey["float | None"]()
_SUITE_STEAL = StealMeter()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Start the whole run's steal meter (tests.hoststeal)."""
    _SUITE_STEAL.start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Measure what the host took from our CPUs while the test body ran."""
    meter = StealMeter()
    meter.start()
    yield
    item.stash[_STEAL_KEY] = meter.share()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A ``host_timing`` test that failed while the host took at least STEAL_LIMIT of the
    CPUs' time is reported skipped, unjudged, with the steal and the failure's first line:
    its figures were the host's, not ours. Every other outcome stands."""
    outcome = yield
    report = outcome.get_result()
    if call.when != "call":
        return
    share = item.stash.get(_STEAL_KEY, None)
    if share is not None:
        report.user_properties.append(("host_steal_share", round(share, 4)))
    if not report.failed or not _host_timing(item):
        return
    failure = call.excinfo.exconly().splitlines()[0][:300] if call.excinfo else "failed"
    reason = unjudged_reason(share, failure)
    if reason is None:
        return
    _UNJUDGED.append(f"{item.nodeid}: {share:.0%}")
    report.outcome = "skipped"
    report.longrepr = (str(item.path), item.location[1] or 0, reason)


def _host_timing(item: pytest.Item) -> bool:
    # A `rate` test asserts a rate or a CPU share the machine must hold: host timing too.
    return any(item.get_closest_marker(name) for name in ("host_timing", "rate"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how much CPU time the host took over the run, and which tests it left unjudged."""
    share = _SUITE_STEAL.share()
    if share is None:
        return
    terminalreporter.write_line(
        f"host steal over the run: {share:.1%} of this machine's CPU time; "
        f"{len(_UNJUDGED)} host_timing test(s) unjudged for it"
        + (": " + ", ".join(_UNJUDGED) if _UNJUDGED else ""))


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
