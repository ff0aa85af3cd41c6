"""Hardening, round five: every seconds value a test or a command waits on is bounded (a
week) on the command line and in the spec a server validates, so that a huge one is
refused before anything runs instead of ending in a traceback in the middle of a test."""

from __future__ import annotations

import importlib.util
import json
import random
import re
import subprocess
from pathlib import Path

import pytest

from netprobe.cli.main import main
from netprobe.limits import LONGEST_S
from netprobe.schema import Result, TestSpec
from tests.peers import PEER_FIXTURES

from .budget import scaled
from .servers import NETPROBE
from .test_hardening_round2 import ask, engine_server, request

NO_TOOL = ["--tool", "no-such-tool-x"]  # a valid command line stops at the tool lookup (3)

SECONDS_OPTIONS = [
    ["run", "-t"], ["run", "-O"], ["run", "-i"], ["run", "--latency-idle"],
    ["run", "--latency-tail"], ["run", "--repeat", "2", "--pause"],
    ["bufferbloat", "-t"], ["bufferbloat", "--idle"], ["bufferbloat", "-i"],
]


@pytest.mark.parametrize("words", SECONDS_OPTIONS, ids=lambda w: " ".join(w))
@pytest.mark.parametrize("value", ["1e19", "604801", "99999999999999999999"])
def test_a_seconds_value_past_a_week_is_a_usage_error(
    words: list[str], value: str, capsys: pytest.CaptureFixture
) -> None:
    code = main([*words, value, *NO_TOOL])
    err = capsys.readouterr().err
    assert code == 2, err
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert words[-1] in last and "a week" in last, last


@pytest.mark.parametrize("words", SECONDS_OPTIONS, ids=lambda w: " ".join(w))
def test_a_week_itself_is_accepted(words: list[str], capsys: pytest.CaptureFixture) -> None:
    assert main([*words, f"{LONGEST_S:g}", *NO_TOOL]) == 3, capsys.readouterr().err


def test_a_huge_interval_no_longer_ends_a_real_run_in_a_traceback() -> None:
    # Before: the test ran, a thread died in `Condition.wait(1e19)` (OverflowError: timestamp
    # out of range for platform time_t) with its traceback on stderr, and the exit was 0.
    done = subprocess.run([*NETPROBE, "run", "-t", "0.3", "-i", "1e19"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()  # argparse's usage line, then its one-line error
    assert len(lines) <= 2 and "--interval" in lines[-1], done.stderr


@pytest.mark.parametrize(
    ("spec", "word"),
    [
        ({"interval_s": 1e19, "duration_s": 0.3}, "interval_s"),
        ({"interval_s": 604801.0, "duration_s": 0.3}, "interval_s"),
        ({"duration_s": 1e12}, "duration_s"),
        ({"omit_s": 1e12, "duration_s": 0.3}, "omit_s"),
    ],
)
def test_a_server_refuses_a_request_past_a_week_whatever_its_max_duration(
    spec: dict, word: str
) -> None:
    # A server whose --max-duration is effectively unlimited still holds every value to
    # the spec's own bound: the request's answer names the field.
    with engine_server(max_duration_s=1e300) as server:
        reply = ask(server.port, request(spec))
    assert reply["type"] == "error", reply
    assert word in reply["message"] and "a week" in reply["message"], reply


# --- an address to listen on that is no address: the option named, exit 2 ----------------


needs_prometheus = pytest.mark.skipif(
    importlib.util.find_spec("prometheus_client") is None,
    reason="the exporter needs prometheus_client (the 'exporter' extra)")


@pytest.mark.parametrize(("argv", "option"), [
    (["server", "-p", "5999", "-B", "nan"], "--bind"),
    (["server", "-p", "5999", "-B", "no.such.host.invalid"], "--bind"),
    pytest.param(["exporter", "--port", "0", "--listen", "nan"], "--listen",
                 marks=needs_prometheus),
    pytest.param(["exporter", "--port", "0", "--listen", "192.0.2.1"], "--listen",
                 marks=needs_prometheus),
])
def test_an_address_to_listen_on_that_is_none_is_a_usage_error(argv: list[str],
                                                               option: str) -> None:
    # Before: exit 1 and "[Errno -2] Name or service not known" (the exporter did not name
    # the option or the address; the server said "[Errno -2] cannot listen on nan ...").
    done = subprocess.run([*NETPROBE, *argv], capture_output=True, text=True, timeout=30)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and option in lines[0] and "Errno" not in lines[0], done.stderr
    assert argv[-1] in lines[0]


@needs_prometheus
def test_the_exporter_listens_on_an_ipv6_address() -> None:
    # Before: "--listen ::1" failed ("[Errno -9] Address family for hostname not supported"):
    # the HTTP server was made for IPv4 whatever the address.
    import socket
    import time
    import urllib.request

    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    with socket.socket(socket.AF_INET6) as probe:
        try:
            probe.bind(("::1", 0))
        except OSError:
            pytest.skip("no ::1 here")
        port = probe.getsockname()[1]
    proc = subprocess.Popen([*NETPROBE, "exporter", "--listen", "::1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, body = time.monotonic() + 20, None
        while body is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://[::1]:{port}/metrics", timeout=5) as page:
                    body = page.read()
            except OSError:
                time.sleep(0.2)
        assert body is not None, proc.stderr.read() if proc.poll() is not None else "no answer"
    finally:
        proc.terminate()
        proc.wait(10)


# --- files a user names are read with a bound: /dev/zero never ends -----------------------


def _limited_memory() -> None:
    # Before the fix each of these read /dev/zero whole: with this limit the reader dies
    # of MemoryError within a second or two instead of taking the machine's memory.
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize(("argv", "word"), [
    (["run", "-t", "0.3", "--secret-file", "/dev/zero"], "secret file /dev/zero"),
    (["server", "-p", "5999", "--secret-file", "/dev/zero"], "secret file /dev/zero"),
    (["report", "/dev/zero"], "/dev/zero"),
    (["fleet", "run", "/dev/zero"], "/dev/zero"),
    (["fleet", "plan", "/dev/zero"], "/dev/zero"),
])
def test_a_file_that_never_ends_is_refused_with_bounded_memory(argv: list[str],
                                                                word: str) -> None:
    done = subprocess.run([*NETPROBE, *argv], capture_output=True, text=True, timeout=60,
                          preexec_fn=_limited_memory)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-500:]
    assert len(lines) == 1 and word in lines[0] and "internal" not in lines[0], done.stderr


def test_a_log_file_that_cannot_be_written_is_the_output_exit_code() -> None:
    # Before: the test ran, then exit 1 and a bare "[Errno 28] No space left on device".
    done = subprocess.run([*NETPROBE, "run", "-t", "0.3", "--logfile", "/dev/full"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 6, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "--logfile" in last or "the log /dev/full" in last, last
    assert "Errno" not in last


# --- a reader of an archive never makes one -------------------------------------------------


@pytest.mark.parametrize("command", [["report", "--archive"], ["fleet", "matrix", "--archive"]])
def test_a_reader_naming_an_archive_that_is_not_there_makes_none(
    command: list[str], tmp_path: Path
) -> None:
    # Before: a mistyped path made a new, empty 28 KiB SQLite file there ("no results").
    missing = tmp_path / "mistyped.db"
    done = subprocess.run([*NETPROBE, *command, str(missing)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "there is none" in done.stderr and str(missing) in done.stderr, done.stderr
    assert not missing.exists()


def test_a_reader_still_reads_an_archive_that_is_there(tmp_path: Path) -> None:
    from netprobe.archives import open_archive

    path = tmp_path / "fleet.db"
    with open_archive(str(path)):
        pass  # a writer makes it (empty)
    done = subprocess.run([*NETPROBE, "fleet", "matrix", "--archive", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# --- a tool's output with figures that are not numbers ---------------------------------------

FIXTURES = PEER_FIXTURES  # shared/ found beside any folder above the checkout
needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason="no shared/fixtures/peers")
IPERF3_JSON = "iperf3-3.12-tcp-J-client.txt"


def _with(text: str, key: str, value: str, last: bool = True) -> str:
    """``text`` with the (last) ``"key": number`` of an iperf3 JSON document set to ``value``."""
    found = list(re.finditer(rf'"{key}":\s*-?[0-9.eE+]+', text))
    at = found[-1 if last else 0]
    return f'{text[:at.start()]}"{key}": {value}{text[at.end():]}'


@needs_fixtures
@pytest.mark.parametrize("value", ["1e999", "NaN", "-Infinity"])
def test_a_saved_figure_that_is_not_a_number_is_left_out_with_a_warning(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # Before: exit 1, "internal error: ValueError: Out of range float values are not JSON
    # compliant" (the figure reached the JSON writer), and nothing else came out.
    saved = tmp_path / "iperf3.json"
    saved.write_text(_with((FIXTURES / IPERF3_JSON).read_text(), "host_total", value))
    code = main(["parse", "--tool", "iperf3", str(saved), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out, parse_constant=_no_constant)  # JSON itself has no NaN
    assert result["summaries"][0]["receiver"]["bits_per_second"] > 1e9  # the rest is there
    assert any("not numbers" in w and "cpu" in w for w in result["warnings"]), result["warnings"]


def _no_constant(name: str) -> None:
    raise AssertionError(f"{name} in a JSON output")


@needs_fixtures
def test_a_needed_figure_that_is_not_a_number_is_a_parse_error(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    saved = tmp_path / "iperf3.json"
    saved.write_text(_with((FIXTURES / IPERF3_JSON).read_text(), "bits_per_second", "1e999"))
    code = main(["parse", "--tool", "iperf3", str(saved), "--json"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and str(saved) in lines[0] and "bits_per_second" in lines[0], err
    assert "internal" not in err


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?")
_NOT_NUMBERS = ["1e999", "-1", "NaN", "Infinity", "9" * 400, "1e-320", "-0.0", "0x10", ""]


@needs_fixtures
def test_mutated_tool_outputs_never_end_in_an_internal_error(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # Numbers in the real outputs of every peer replaced by ones no tool prints. Before:
    # OverflowError, ValueError and TypeError from the parsers of all four tools (18
    # distinct places in 7,675 such parses), each an internal error.
    rng = random.Random(20261202)
    tools = {"iperf2": "iperf2", "iperf3": "iperf3", "nuttcp": "nuttcp", "ntttcp": "ntttcp"}
    fixtures = sorted(p for p in FIXTURES.iterdir() if p.suffix in (".txt", ".xml", ".json"))
    internal = []
    for _ in range(scaled(400)):
        source = rng.choice(fixtures)
        tool = next((t for prefix, t in tools.items() if source.name.startswith(prefix)), None)
        if tool is None:
            continue
        text = source.read_text(errors="replace")
        spans = [m.span() for m in _NUMBER.finditer(text)]
        for start, end in sorted(rng.sample(spans, min(len(spans), rng.randint(1, 4))),
                                 reverse=True):
            text = text[:start] + rng.choice(_NOT_NUMBERS) + text[end:]
        mutated = tmp_path / source.name
        mutated.write_text(text)
        code = main(["parse", "--tool", tool, str(mutated), "--json"])
        out, err = capsys.readouterr()
        if code == 1 or "internal error" in err:
            internal.append((source.name, err.strip()[-200:]))
        elif code == 0:
            json.loads(out.splitlines()[0] if out.startswith("{\"") else out)
    assert not internal, internal[:5]


def test_a_run_whose_tool_gives_a_figure_that_is_not_a_number_still_outputs_its_result(
    capsys: pytest.CaptureFixture
) -> None:
    # The one run pipeline makes every tool's figures finite: a plugin (or a peer's
    # output) with a NaN jitter no longer loses the whole result in the JSON writer.
    import attrs

    from netprobe.registry import Registry

    from .test_cli import ReplayTool

    class NotANumberTool(ReplayTool):
        name = "nan-tool"

        def result(self, spec: TestSpec) -> Result:
            recorded = super().result(spec)
            flow = recorded.summaries[0]
            receiver = attrs.evolve(flow.receiver, jitter_ms=float("nan"))
            return attrs.evolve(recorded, summaries=(attrs.evolve(flow, receiver=receiver),
                                                     *recorded.summaries[1:]))

    registry = Registry(tools={NotANumberTool.name: NotANumberTool})
    code = main(["run", "127.0.0.1", "--tool", "nan-tool", "-u", "--json"],
                registry_loader=lambda: registry)
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out, parse_constant=_no_constant)
    assert result["summaries"][0]["receiver"]["jitter_ms"] is None
    assert any("summaries[0].receiver.jitter_ms" in w for w in result["warnings"])


@needs_fixtures
@pytest.mark.parametrize(("key", "value"), [
    ("retransmits", "1e999"), ("retransmits", "NaN"), ("retransmits", "9" * 400),
    ("timesecs", "1e300"),
])
def test_an_iperf3_count_or_time_that_is_not_one_is_unknown(
    key: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # iperf3's JSON is read the same way live (a far end's server output comes inside it)
    # and saved. Before: int(inf) OverflowError, float() of a 400-digit integer
    # OverflowError, a start time past any clock OverflowError: each an internal error.
    saved = tmp_path / "iperf3.json"
    saved.write_text(_with((FIXTURES / IPERF3_JSON).read_text(), key, value, last=False))
    code = main(["parse", "--tool", "iperf3", str(saved), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out, parse_constant=_no_constant)
    assert result["summaries"][0]["receiver"]["bits_per_second"] > 1e9
