"""Hardening, round five: every seconds value a test or a command waits on is bounded (a
week) on the command line and in the spec a server validates, so that a huge one is
refused before anything runs instead of ending in a traceback in the middle of a test."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from netprobe.cli.main import main
from netprobe.limits import LONGEST_S

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


@pytest.mark.parametrize(("argv", "option"), [
    (["server", "-p", "5999", "-B", "nan"], "--bind"),
    (["server", "-p", "5999", "-B", "no.such.host.invalid"], "--bind"),
    (["exporter", "--port", "0", "--listen", "nan"], "--listen"),
    (["exporter", "--port", "0", "--listen", "192.0.2.1"], "--listen"),
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
