"""Fleet files past their bounds (issue 33 item 11): a FIFO or /dev/zero named as the fleet
file, TOML nested 100,000 deep, durations of 1e12 seconds, and a 10,000-agent mesh, which
must plan in bounded memory (rounds generated as they are needed) while sizes past any use
are refused with the arithmetic."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from netprobe.fleet import config, schedule

from .servers import NETPROBE


def _agents(n: int) -> str:
    return "".join(f'[agents.a{i}]\naddress = "10.{i >> 16}.{(i >> 8) & 255}.{i & 255}"\n'
                   for i in range(n))


def _plan(path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NETPROBE, "fleet", "plan", str(path), *extra],
                          capture_output=True, text=True, timeout=20)


def _one_line_error(run: subprocess.CompletedProcess, *words: str) -> None:
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr and run.stderr.count("\n") == 1, run.stderr
    for word in words:
        assert word in run.stderr, run.stderr


def test_a_fifo_or_a_device_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fleet.toml"
    os.mkfifo(fifo)  # nobody ever writes: reading it would wait forever
    _one_line_error(_plan(fifo), "not a regular file")
    _one_line_error(_plan(Path("/dev/zero")), "/dev/zero", "not a regular file")
    _one_line_error(_plan(tmp_path), "not a regular file")


@pytest.mark.parametrize("argv", [
    ["exporter", "--port", "0", "--config"],
    ["server", "-B", "127.0.0.1", "-p", "0", "--secret-file"],
    ["run", "127.0.0.1", "-p", "9", "-t", "0.3", "--secret-file"],
], ids=["exporter-config", "server-secret", "run-secret"])
def test_every_file_a_command_reads_refuses_a_fifo_at_once(tmp_path: Path,
                                                           argv: list[str]) -> None:
    # The fleet file refused a FIFO; the exporter's configuration and the secret files
    # waited on one forever (open() blocks until a writer comes), the daemon never started.
    if argv[0] == "exporter":  # the wheels' emulated suites run without the extra
        pytest.importorskip("prometheus_client", reason="pip install 'netprobe-meter[exporter]'")
    fifo = tmp_path / "named.pipe"
    os.mkfifo(fifo)
    run = subprocess.run([*NETPROBE, *argv, str(fifo)], capture_output=True, text=True,
                         timeout=20)
    _one_line_error(run, "not a regular file (a FIFO)")


def test_an_exporter_configuration_nested_too_deep_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client", reason="pip install 'netprobe-meter[exporter]'")
    path = tmp_path / "exporter.toml"
    path.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    run = subprocess.run([*NETPROBE, "exporter", "--port", "0", "--config", str(path)],
                         capture_output=True, text=True, timeout=20)
    _one_line_error(run, "nested")


@pytest.mark.parametrize("nested", [
    "a = " + "[" * 100_000 + "]" * 100_000,
    "a = " + "{b = " * 100_000 + "1" + "}" * 100_000,
    "[" + "a." * 100_000 + "a]\n",
])
def test_deep_toml_is_refused(tmp_path: Path, nested: str) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(nested + "\n")
    _one_line_error(_plan(path), "nested")


@pytest.mark.parametrize(("key", "value"), [
    ("round_timeout", '"1e12"'), ("round_timeout", "1e300"), ("every", '"1e12"'),
    ("slip", '"100000d"'), ("every", '"9999999999h"'),
])
def test_durations_are_bounded(tmp_path: Path, key: str, value: str) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(_agents(2) + f'[groups.g]\ntype = "mesh"\n{key} = {value}\n')
    _one_line_error(_plan(path), f"groups.g.{key}", "at most")


def test_ordinary_durations_still_pass() -> None:
    text = _agents(2) + '[groups.g]\ntype = "mesh"\nround_timeout = "2h"\nevery = "7d"\n'
    (group,) = config.parse(config.tomllib.loads(text)).groups
    assert group.round_timeout_s == 7200 and group.every_s == 7 * 86400


def test_absurd_sizes_are_refused_with_the_arithmetic(tmp_path: Path) -> None:
    # The bound is a run's length (rounds x each round's limit) past a year, the longest
    # period a schedule may have (issue 39), no longer a count of 10^8 tests.
    path = tmp_path / "fleet.toml"
    path.write_text(_agents(12_000) + '[groups.all]\ntype = "mesh"\n'
                    'spec = { duration = "30m" }\n')
    _one_line_error(_plan(path), "groups.all", "mesh of 12,000 agents: 23,998 rounds x "
                    "1,830 s = 508 days a run", "at most 366 days")


def _peak_kib(command: list[str]) -> tuple[int, subprocess.CompletedProcess]:
    """Run ``command`` in a child (at most 2 GiB of address space, so that a plan that
    materialises everything fails rather than takes the machine) and return its peak
    resident set (KiB) by getrusage."""
    probe = ("import resource, subprocess, sys\n"
             "limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
             "run = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120,"
             " preexec_fn=limit)\n"
             "sys.stderr.write(run.stderr)\nsys.stdout.write(run.stdout)\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "sys.exit(run.returncode)\n")
    run = subprocess.run([sys.executable, "-c", probe, *command], capture_output=True,
                         text=True, timeout=150, env={**os.environ, "COLUMNS": "200"})
    return int(run.stdout.strip().splitlines()[-1]), run


def test_a_10000_agent_mesh_plans_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(_agents(10_000) + '[groups.mesh]\ntype = "mesh"\nagents = "*"\n'
                    'spec = { duration = "10s" }\n')
    assert path.stat().st_size > 350_000
    peak, run = _peak_kib([*NETPROBE, "fleet", "plan", str(path)])
    assert run.returncode == 0, run.stderr
    assert "19,998 rounds" in run.stdout and "99,990,000 tests" in run.stdout, run.stdout
    assert peak < 400_000, f"peak RSS {peak} KiB"  # was 2.9 GB and a MemoryError
    print(f"fleet plan, 10,000-agent mesh: peak RSS {peak} KiB")


def test_lazy_plan_matches_the_pairs() -> None:
    """The lazily generated rounds are the group's pairs, each once, no host twice."""
    for n in (2, 3, 7, 10):
        text = _agents(n) + '[groups.m]\ntype = "mesh"\n'
        fleet = config.parse(config.tomllib.loads(text))
        rounds = schedule.plan(fleet)
        pairs = [p for r in rounds for p in r.pairs]
        assert len(pairs) == rounds.tests == n * (n - 1) == len(fleet.groups[0].pairs)
        assert sorted(pairs) == sorted(fleet.groups[0].pairs)
        assert len(set(pairs)) == len(pairs)
        assert schedule.conflicts([r.pairs for r in rounds]) == []
        assert len(rounds) == len(list(rounds)) == rounds[0].of
