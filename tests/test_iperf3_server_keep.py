"""What `netprobe server --iperf3` keeps of the tests stock clients ran against it: one JSON
file per test in --save-dir (the oldest removed past --save-keep), a record per test in a
fleet archive (--archive), beside the JSON lines of --iperf3-results. Real server process,
real stock clients, a real SQLite archive read back by netprobe's own readers."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netprobe.archives import open_archive
from netprobe.results.saved import load_texts
from netprobe.results.served import GROUP, SaveDir
from netprobe.schema import Endpoint, Result, TestSpec, ToolInfo
from tests.servers import free_port, netprobe_server, wait_listening
from tests.test_cli import assert_one_error_line
from tests.test_iperf3_server import run_client, stock

NETPROBE = [sys.executable, "-m", "netprobe"]


def _received(doc: str) -> int:
    return int(json.loads(doc)["end"]["sum_received"]["bytes"])


@pytest.mark.peers
def test_each_test_saved_in_a_dir_and_an_archive(tmp_path: Path) -> None:
    """Three stock client tests: --save-keep 2 leaves the newest two files, each read back
    with the client's own received bytes; the archive holds all three, the client's
    address as the source, and its run is closed as done when the server stops."""
    binary = stock("3.12")
    port = free_port()
    saved, db = tmp_path / "saved", tmp_path / "served.db"
    url = f"sqlite:///{db}"
    received = []
    with netprobe_server("--iperf3", "--iperf3-port", str(port), "--save-dir", str(saved),
                         "--save-keep", "2", "--archive", url) as server:
        wait_listening(port)
        for _ in range(3):
            out = run_client(binary, port, "-t", "1", "-J")
            assert out.returncode == 0, out.stdout[-2000:] + server.log()
            received.append(_received(out.stdout))
    files = sorted(saved.glob("iperf3-*.json"))
    assert len(files) == 2, [f.name for f in files]
    results = load_texts([(f.name, f.read_text()) for f in files]).results
    kept = [r.summary("client_to_server").receiver.bytes for r in results]  # type: ignore
    assert kept == received[1:], (kept, received)  # names sort by time: the last two tests
    with open_archive(url, create=False) as archive:
        [run] = archive.runs()
        records = archive.records(run.run_id)
    assert run.status == "done" and run.finished is not None, run
    assert [r.round for r in records] == [1, 2, 3]
    assert {(r.group, r.source, r.outcome) for r in records} == {(GROUP, "127.0.0.1", "ok")}
    archived = [r.result.summary("client_to_server").receiver.bytes  # type: ignore
                for r in records]
    assert archived == received
    report = subprocess.run([*NETPROBE, "report", "--archive", url], capture_output=True,
                            text=True, timeout=60)
    assert report.returncode == 0, report.stderr


@pytest.mark.parametrize("flag", ["--save-dir", "--archive", "--iperf3-results"])
def test_keeping_needs_iperf3(flag: str, tmp_path: Path) -> None:
    """Without --iperf3 there is nothing to keep: said in one line, exit 2, not ignored."""
    proc = subprocess.run([*NETPROBE, "server", "-p", "0", flag, str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr)
    assert "--iperf3" in proc.stderr


@pytest.mark.parametrize("flag", ["--save-dir", "--archive"])
def test_an_unusable_place_is_one_line_before_serving(flag: str, tmp_path: Path) -> None:
    """A save dir that is a file, an archive in a directory that cannot exist: one line,
    non-zero, before anything listens."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    where = str(blocker) if flag == "--save-dir" else f"sqlite:///{blocker}/sub/a.db"
    proc = subprocess.run([*NETPROBE, "server", "-p", "0", "--iperf3", "--iperf3-port",
                           str(free_port()), flag, where],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert_one_error_line(proc.stderr)
    assert "listening" not in proc.stdout


def _result() -> Result:
    return Result(tool=ToolInfo(name="native"), spec=TestSpec(duration_s=1.0),
                  start_time=None, local=Endpoint(role="server"),
                  remote=Endpoint(role="client", address="192.0.2.9"))


def test_save_dir_removes_only_its_own_oldest_files(tmp_path: Path) -> None:
    """Past keep, only files named as this keeper names them go, oldest first; a file of
    the owner's that merely looks alike stays."""
    theirs = [tmp_path / "notes.txt", tmp_path / "iperf3-mine.json",
              tmp_path / "iperf3-20200101T000000Z-zzzzzzzz.json"]
    for path in theirs:
        path.write_text("the owner's")
    keeper = SaveDir(str(tmp_path), keep=3)
    for _ in range(5):
        keeper(_result())
    assert len(keeper.saved()) == 3
    assert all(path.read_text() == "the owner's" for path in theirs)
    assert not list(tmp_path.glob(".*.part"))


def test_saved_names_sort_as_the_tests_ended(tmp_path: Path) -> None:
    """Each name carries the time it was saved, so the oldest are the first in name order
    (a name of the wrong shape would never be trimmed, or be trimmed out of order)."""
    keeper = SaveDir(str(tmp_path), keep=10)
    made = []
    for _ in range(3):
        keeper(_result())
        [new] = set(keeper.saved()) - set(made)
        made.append(new)
        time.sleep(0.002)
    assert keeper.saved() == made
    assert "00000000T" not in made[0].name
