"""Hardening, round six: what a user reads when a name or an address cannot be used says
the name and the reason, never the resolver's bare code, and the one rule for a failed
bind holds for every command that listens."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from netprobe.engine.server import Server, ServerConfig
from netprobe.errors import SpecError, TestFailed, listen_error
from netprobe.limits import InputTooLarge, read_at_most
from netprobe.schema import TestSpec
from netprobe.tools.ntttcp.command import resolve

from .peers import default_peer
from .servers import NETPROBE

NOWHERE = "no.such.host.invalid"  # RFC 6761: .invalid never resolves


def test_a_host_that_does_not_resolve_is_named_with_the_reason_only() -> None:
    # Before: "cannot resolve host 'no.such.host.invalid': [Errno -2] Name or service not
    # known": the "[Errno -2]" is getaddrinfo's EAI code, which tells a user nothing.
    done = subprocess.run([*NETPROBE, "run", NOWHERE, "-t", "1"],
                          capture_output=True, text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and NOWHERE in lines[0], done.stderr
    assert "Errno" not in lines[0] and "cannot resolve" in lines[0], done.stderr


@pytest.mark.parametrize("tool", ["iperf3", "iperf2", "nuttcp", "ntttcp"])
def test_a_driven_tool_to_a_host_that_does_not_resolve_says_only_that(tool: str) -> None:
    # Before: "no netprobe agent at no.such.host.invalid: using the iperf3 server there",
    # then the tool's own failure: the agent lookup took a name that does not resolve for
    # a host with no agent. Said the native engine's way, before any tool starts.
    binary = default_peer(tool)
    if binary is None:
        pytest.skip(f"no {tool} binary here")
    done = subprocess.run([*NETPROBE, "run", NOWHERE, "--tool", tool, "-t", "1"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **binary.env})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "cannot resolve host" in lines[0] and NOWHERE in lines[0], \
        done.stderr
    assert "server there" not in done.stderr and "Errno" not in done.stderr


def test_ntttcps_address_lookup_says_the_reason_without_the_code() -> None:
    # ntttcp takes numeric addresses only, so its adapter resolves the name itself.
    spec = TestSpec(host=NOWHERE, tool="ntttcp", duration_s=1.0)
    with pytest.raises(TestFailed) as info:
        resolve(spec, socket.AF_INET, local=False)
    assert NOWHERE in str(info.value) and "Errno" not in str(info.value)


def _refusal(option: str | None, address: str, exc: OSError) -> Exception:
    return listen_error(option, address, 5999, exc)


def test_a_name_the_user_gave_that_does_not_resolve_is_a_spec_error() -> None:
    try:
        socket.getaddrinfo(NOWHERE, 0)
    except socket.gaierror as exc:
        found = _refusal("-B/--bind", NOWHERE, exc)
        unnamed = _refusal(None, NOWHERE, exc)
    else:  # pragma: no cover - a resolver that answers for .invalid
        pytest.skip("this host's resolver answers for .invalid")
    assert isinstance(found, SpecError) and "-B/--bind" in str(found)
    assert NOWHERE in str(found) and "Errno" not in str(found)
    # An address netprobe chose itself (the default "::") is not the user's value: an
    # OSError naming where it failed, never a usage error about an option never given.
    assert not isinstance(unnamed, SpecError) and isinstance(unnamed, OSError)
    assert "cannot listen on" in str(unnamed)


def test_a_busy_port_is_no_usage_error_and_names_the_address_and_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        server = Server(ServerConfig(port=port, bind_address="127.0.0.1"))
        with pytest.raises(OSError) as info:
            server.start()
        server.close()
    assert not isinstance(info.value, SpecError)
    assert f"127.0.0.1 port {port}" in str(info.value), info.value


def test_a_server_bound_to_an_address_not_of_this_host_names_the_option() -> None:
    server = Server(ServerConfig(port=0, bind_address="192.0.2.1"))  # TEST-NET-1
    with pytest.raises(SpecError) as info:
        server.start()
    server.close()
    assert "-B/--bind 192.0.2.1" in str(info.value) and "not an address of this host" in str(
        info.value)


@pytest.mark.parametrize(("data", "unit"), [("x" * 9, "characters"), (b"x" * 9, "bytes")])
def test_a_read_past_its_limit_counts_in_the_units_it_read(data: str | bytes,
                                                           unit: str) -> None:
    import io

    handle = io.StringIO(data) if isinstance(data, str) else io.BytesIO(data)
    with pytest.raises(InputTooLarge) as info:
        read_at_most(handle, 8)
    assert str(info.value) == f"more than 8 {unit}"
