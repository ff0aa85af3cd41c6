"""Running against peers the user set up: ``--no-agent -p PORT`` means the user's server is
already there (on loopback too), and ``compare -u`` gives every tool the same datagram
size. A real ``iperf3 -s`` on loopback, and the test plugins."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest

from netprobe.convert import from_json
from netprobe.driven import is_listening
from tests.servers import free_port
from tests.test_cli import ReplayTool, builtin_registry, run_main

IPERF3 = shutil.which("iperf3")


@pytest.mark.skipif(IPERF3 is None, reason="iperf3 is not installed")
def test_no_agent_with_port_uses_the_users_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert IPERF3 is not None
    port = free_port()
    server = subprocess.Popen([IPERF3, "-s", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 20
        while not (is_listening(port, socket.AF_INET6) or is_listening(port, socket.AF_INET)):
            assert time.monotonic() < end, "iperf3 -s did not listen"
            time.sleep(0.05)
        code, out, err = run_main(capsys, "run", "--tool", "iperf3", "--no-agent", "-p",
                                  str(port), "-t", "1", "--json", registry=builtin_registry())
    finally:
        server.terminate()
        server.wait(10)
    assert code == 0, err  # was: its own server on the same port, "Address already in use"
    result = from_json(out)
    assert result.spec.host == "127.0.0.1" and result.remote.port == port


def test_compare_udp_gives_every_tool_one_datagram_size(
        capsys: pytest.CaptureFixture[str]) -> None:
    ReplayTool.specs.clear()
    code, _, err = run_main(capsys, "compare", "--tools", "replay", "--trials", "1", "-u",
                            "-q")
    assert code == 0, err
    assert ReplayTool.specs[-1].length_bytes == 1448
    assert "1448-byte datagrams" in err
    run_main(capsys, "compare", "--tools", "replay", "--trials", "1", "-u", "-l", "1000", "-q")
    assert ReplayTool.specs[-1].length_bytes == 1000
