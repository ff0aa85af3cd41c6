"""``report --archive`` and ``fleet matrix`` over a fleet's archive (issue 35 item 14).

A fleet's archive holds every pair's tests, TCP and UDP alike. Grouped by tool (the
default for a comparison's files), one mean averaged a 10 Gbit/s link's TCP with another
link's 1 Mbit/s UDP. With ``--archive`` the default groups are pairs (source -> target
agent), protocol and direction. And the matrix lists its hosts by one rule, sorted by
name, whether it is asked for with the fleet FILE or with ``--archive``.

The archived results are real loopback results (``netprobe run``) filed under agent
names, as a fleet's runner files them.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from netprobe import convert
from netprobe.archives import PairRecord, Run, open_archive
from netprobe.schema import Result

from .servers import NETPROBE


def _run(*args: str) -> Result:
    done = subprocess.run([*NETPROBE, "run", "-t", "0.3", "--json", *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return convert.from_json(done.stdout)


@pytest.fixture(scope="module")
def results() -> dict[str, Result]:
    """One real TCP and one real UDP loopback result."""
    return {"tcp": _run(), "udp": _run("-u", "-b", "2M")}


_PAIRS = [("zulu", "alpha", "tcp"), ("zulu", "alpha", "udp"), ("mike", "zulu", "tcp"),
          ("mike", "zulu", "tcp"), ("alpha", "mike", "udp")]
"""(source, target, protocol) of the archived tests, in archive order: first seen is
zulu, alpha, mike; sorted is alpha, mike, zulu."""


def _archive(path: Path, results: dict[str, Result]) -> None:
    with open_archive(str(path)) as archive:
        archive.start_run(Run("run-1", "f.toml", "2026-12-01T10:00:00.000+00:00", 1,
                              len(_PAIRS)))
        for n, (source, target, protocol) in enumerate(_PAIRS):
            archive.add(PairRecord("run-1", "g", 1, source, target,
                               f"2026-12-01T10:00:0{n}.000+00:00", "ok",
                               result=results[protocol]))
        archive.finish_run("run-1", "2026-12-01T10:00:09.000+00:00", "done")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NETPROBE, *args], capture_output=True, text=True, timeout=60)


def test_report_of_an_archive_groups_by_pair_protocol_and_direction(
        tmp_path: Path, results: dict[str, Result]) -> None:
    path = tmp_path / "f.db"
    _archive(path, results)
    done = _cli("report", "--archive", str(path), "--json")
    assert done.returncode == 0, done.stderr
    counts = {g["group"]: g["results"] for g in json.loads(done.stdout)}
    assert counts == {"zulu -> alpha protocol=tcp direction=normal": 1,
                      "zulu -> alpha protocol=udp direction=normal": 1,
                      "mike -> zulu protocol=tcp direction=normal": 2,
                      "alpha -> mike protocol=udp direction=normal": 1}
    # no group mixes a TCP test with a UDP one, so no warning says so
    assert "mixes" not in done.stderr
    # an explicit --group-by still wins
    by_tool = _cli("report", "--archive", str(path), "--json", "--group-by", "tool")
    assert by_tool.returncode == 0, by_tool.stderr
    assert {g["group"]: g["results"] for g in json.loads(by_tool.stdout)} == {
        results["tcp"].tool.name: 5}
    assert "mixes" in by_tool.stderr and "protocol" in by_tool.stderr


def test_the_matrix_orders_hosts_alike_from_a_file_and_from_an_archive(
        tmp_path: Path, results: dict[str, Result]) -> None:
    path = tmp_path / "f.db"
    _archive(path, results)
    fleet_file = tmp_path / "f.toml"
    # the fleet file names the agents in an order neither sorted nor first-seen
    fleet_file.write_text(
        f'[fleet]\narchive = "{path}"\n'
        + "".join(f'[agents.{name}]\naddress = "127.0.0.1"\n'
                  for name in ("mike", "zulu", "alpha"))
        + '[groups.g]\ntype = "mesh"\n')
    orders = []
    for where in ([str(fleet_file)], ["--archive", str(path)]):
        done = _cli("fleet", "matrix", "--json", *where)
        assert done.returncode == 0, done.stderr
        (matrix,) = json.loads(done.stdout)
        orders.append(matrix["hosts"])
        human = _cli("fleet", "matrix", *where)
        assert human.returncode == 0, human.stderr
        rows = [line.split()[1] for line in human.stdout.splitlines()
                if line.split()[1:2] and line.split()[1] in ("alpha", "mike", "zulu")]
        orders.append(rows)
    assert orders == [["alpha", "mike", "zulu"]] * 4
