"""The shared glue of driven tools (netprobe.driven.tool and .session) on real
subprocesses: the binary found once, versions read, saved sources, port blocks, and one
run from plan to Result (server then client; server never ready; failures; ok)."""

from __future__ import annotations

import socket
import sys
from typing import ClassVar

import pytest

from netprobe.driven import (
    DrivenSession,
    DrivenTool,
    client_deadline,
    free_port,
    free_port_block,
    listening,
    local_server_wanted,
    port_is_free,
    read_version,
    readable_sources,
)
from netprobe.errors import ParseError, TestFailed, ToolUnavailable
from netprobe.plugin import Availability, NullReporter, Reporter
from netprobe.schema import Endpoint, Interval, Result, TestSpec

PY = sys.executable
VERSION = r"Python (\d+\.\d+\.\d+)"


class PythonTool(DrivenTool):
    """The interpreter as a 'driven binary': counts how often it is identified."""

    name: ClassVar[str] = "pytool"
    program: ClassVar[str] = "python3"
    env_var: ClassVar[str] = "NETPROBE_TEST_PYTOOL"
    install_hint: ClassVar[str] = "install python3"
    identified = 0

    def identify(self, path: str) -> Availability:
        type(self).identified += 1
        return read_version(path, ["--version"], VERSION, "Python")[0]

    def run(self, spec: TestSpec, reporter: Reporter) -> Result:
        raise NotImplementedError


class BrokenTool(PythonTool):
    """identify() raises: probe() must still answer."""

    def identify(self, path: str) -> Availability:
        raise RuntimeError("the version probe blew up")


def test_probe_finds_the_binary_once_and_binary_gives_its_path() -> None:
    tool = PythonTool({"path": PY})
    PythonTool.identified = 0
    first, second = tool.probe(), tool.probe()
    assert first is second and PythonTool.identified == 1
    assert first.available and first.version == ".".join(map(str, sys.version_info[:3]))
    assert tool.binary() == first.path


def test_a_missing_binary_is_a_reason_and_binary_raises_it() -> None:
    tool = PythonTool({"path": "/nonexistent/python3"})
    available = tool.probe()
    assert not available.available and "not an executable" in available.reasons[0]
    with pytest.raises(ToolUnavailable, match="not an executable"):
        tool.binary()


def test_probe_never_raises() -> None:
    available = BrokenTool({"path": PY}).probe()
    assert not available.available
    assert available.reasons == ("pytool probe failed: RuntimeError: the version probe blew up",)


def test_read_version_says_what_was_printed_instead() -> None:
    missing, text = read_version(PY, ["-c", "print('hello')"], VERSION, "Python")
    assert not missing.available and text.strip() == "hello"
    assert "printed no Python version (exit code 0): hello" in missing.reasons[0]
    refused, _ = read_version(PY, ["--version"], VERSION, "Python", exit_codes=(3,))
    assert not refused.available and "(exit code 0)" in refused.reasons[0]


def test_readable_sources_skips_blanks_and_names_the_first_when_all_are() -> None:
    sources = [("server.txt", " \n"), ("client.txt", "data\n")]
    assert readable_sources(sources, "foo") == [("client.txt", "data\n")]
    with pytest.raises(ParseError, match="no foo output: servers print nothing") as caught:
        readable_sources(sources[:1], "foo", "servers print nothing")
    assert caught.value.source == "server.txt"


def test_free_port_block_is_free_with_the_ports_below() -> None:
    avoid = free_port()
    start = free_port_block(4, below=1, avoid=(avoid,))
    ports = range(start - 1, start + 4)
    assert avoid not in ports
    assert all(port_is_free(port) for port in ports)


def test_deadline_and_local_server_decisions() -> None:
    timed = TestSpec(tool="x", duration_s=10.0, omit_s=2.0)
    assert client_deadline(timed) == pytest.approx(10 + 2 + 15 + 2)
    assert client_deadline(TestSpec(tool="x", bytes_total=1000, duration_s=None)) is None
    assert local_server_wanted(TestSpec(tool="x", host="127.0.0.1"), {})
    assert not local_server_wanted(TestSpec(tool="x"), {"start_server": False})


# --- one run -----------------------------------------------------------------------------

_SERVER = """
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print("listening", flush=True); conn, _ = s.accept(); print("served", flush=True)
"""
_CLIENT = """
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
for i in range(3):
    print(i, flush=True)
"""


class EchoSession(DrivenSession):
    """A server that takes one connection and a client that prints three samples."""

    def __init__(self, port: int, server: list[str] | None, complaint: str = "") -> None:
        super().__init__(TestSpec(tool="echo", host="127.0.0.1"), NullReporter(),
                         tool="echo", version="1.0")
        self.port, self.server_argv, self.complaint = port, server, complaint

    def start_server(self) -> bool:
        if self.server_argv is None:
            return True
        ready = listening([(self.port, False)], socket.AF_INET)
        return self.serve("server", self.server_argv, ready, 5.0)

    def run_client(self) -> None:
        def on_line(line: str) -> None:
            n = int(line)
            self.driven.emit(Interval("client_to_server", "receiver", None, float(n),
                                      n + 1.0, 125, 1000.0))

        client = self.driven.start("client", [PY, "-c", _CLIENT, str(self.port)], on_line)
        self.driven.wait_exit(client, 10.0)

    def failures(self) -> list[str]:
        return [self.complaint] if self.complaint else []

    def result(self, status: str, errors: list[str]) -> Result:
        return self.build_result(status, errors, remote=Endpoint(role="server"),
                                 intervals=self.intervals())


def test_server_then_client_gives_an_ok_result_with_everything_raw() -> None:
    port = free_port()
    result = EchoSession(port, [PY, "-c", _SERVER, str(port)]).run()
    assert result.status == "ok" and result.tool.version == "1.0"
    assert [i.start_s for i in result.intervals] == [0.0, 1.0, 2.0]
    assert [r.name for r in result.raw] == ["server", "client"]
    assert "served" in result.raw[0].text
    assert result.local.system  # this machine, named


def test_a_server_that_never_listens_is_a_failure_with_its_words() -> None:
    port = free_port()
    quitter = [PY, "-c", "print('cannot bind here'); raise SystemExit(3)"]
    with pytest.raises(TestFailed, match="echo server did not get ready: cannot bind here"
                       ) as caught:
        EchoSession(port, quitter).run()
    partial = caught.value.partial
    assert partial is not None and partial.status == "failed"
    assert [r.name for r in partial.raw] == ["server"]  # the client never ran


def test_failures_raise_with_the_measured_result() -> None:
    port = free_port()
    session = EchoSession(port, [PY, "-c", _SERVER, str(port)], complaint="it said no")
    with pytest.raises(TestFailed, match="echo failed: it said no") as caught:
        session.run()
    partial = caught.value.partial
    assert partial is not None and partial.errors == ("it said no",)
    assert len(partial.intervals) == 3  # nothing measured is lost
