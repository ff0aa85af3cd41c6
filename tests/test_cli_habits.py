"""iperf3's habits: ``-c HOST`` and ``-s`` as first words, ``-J``, ``-V``, ``-f``,
``--logfile``, ``-t 0``, ``-k``, and argparse naming the nearest flag for a typo.
In-process with the test plugins (tests.test_cli)."""
from __future__ import annotations

from pathlib import Path

import pytest

from netprobe.cli.args import FOREVER_S
from netprobe.cli.main import iperf3_words
from netprobe.convert import from_json
from tests.test_cli import ReplayTool, assert_one_error_line, run_main


def _last_spec():  # type: ignore[no-untyped-def]
    return ReplayTool.specs[-1]


def test_dash_c_runs_and_dash_s_serves(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "-c", "192.0.2.9", "--tool", "replay", "-J")
    assert code == 0, err
    assert from_json(out).spec.host == "192.0.2.9"
    assert iperf3_words(["-s", "-p", "5201"]) == ["server", "-p", "5201"]
    assert iperf3_words(["-p", "5201", "-c", "h"]) == ["run", "-p", "5201", "-c", "h"]
    assert iperf3_words(["run", "-c", "h"]) == ["run", "-c", "h"]
    code, _, err = run_main(capsys, "-s", "--max-tests", "0")  # reaches server's options
    assert code == 2 and "--max-tests" in err


def test_typo_names_the_nearest_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "run", "--tool", "replay", "--tiem", "5")
    assert code == 2
    assert "--tiem: did you mean --time?" in err


def test_t_0_runs_until_interrupted_and_k_counts_blocks(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert run_main(capsys, "run", "--tool", "replay", "-t", "0", "-q")[0] == 0
    assert _last_spec().duration_s == FOREVER_S
    # -k blocks of -l bytes: 500,000 of 1000 is the 500 MB the replay moves (a tool that goes
    # on far past its count is stopped as failed: session.ByteCountWatch).
    assert run_main(capsys, "run", "--tool", "replay", "-k", "500000", "-l", "1000",
                    "-q")[0] == 0
    assert _last_spec().bytes_total == 500_000_000 and _last_spec().duration_s is None
    code, _, err = run_main(capsys, "run", "--tool", "replay", "-k", "10", "-q")
    assert code == 2 and "-k needs -l" in err
    assert_one_error_line(err)


def test_f_fixes_the_units(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "run", "--tool", "replay", "-f", "m")
    assert code == 0
    rows = [line for line in out.splitlines() if " sender " in line or " receiver " in line]
    assert rows and all("Mbit/s" in r and "MBytes" in r and "Gbit/s" not in r for r in rows)
    code, out, _ = run_main(capsys, "run", "--tool", "replay", "-f", "K")
    assert "KByte/s" in out
    assert run_main(capsys, "run", "--tool", "replay", "-f", "x")[0] == 2


def test_verbose_shows_every_stream(capsys: pytest.CaptureFixture[str]) -> None:
    _, plain, _ = run_main(capsys, "run", "--tool", "replay", "-P", "2")
    _, verbose, _ = run_main(capsys, "run", "--tool", "replay", "-P", "2", "-V")
    assert "[  1]" not in plain and "[  1]" in verbose and "#2" in verbose


def test_logfile_takes_stdout(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    for _ in range(2):
        code, out, _ = run_main(capsys, "run", "--tool", "replay", "--logfile", str(log))
        assert code == 0 and out == ""
    assert log.read_text().count("status: ok") == 2  # appended, as iperf3 does


@pytest.mark.parametrize(("argv", "said"), [
    (["server", "--daemon"], "docs/service.md"),
    (["server", "-D"], "docs/service.md"),
    (["run", "--tool", "replay", "-S", "184"], "--dscp"),
    (["run", "--tool", "replay", "--tos", "184"], "--dscp"),
    (["run", "--tool", "replay", "--fq-rate", "1M"], "-b RATE"),
    (["run", "--tool", "replay", "--rcv-timeout", "5"], "--idle-timeout"),
    (["run", "--tool", "replay", "--cport", "5000"], "server's port"),
    (["run", "--tool", "replay", "-A", "1"], "taskset"),
])
def test_iperf3_and_nuttcp_options_are_answered_from_a_table(
        capsys: pytest.CaptureFixture[str], argv: list[str], said: str) -> None:
    # String similarity answered `server --daemon` with --max-memory.
    code, _, err = run_main(capsys, *argv)
    assert code == 2
    assert said in err and "--max-memory" not in err
    # The command's own usage, not the top level's (which lists no option of the command).
    assert f"usage: netprobe {argv[0]} " in err


def test_a_far_typo_names_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "server", "--dameon-mode")
    assert code == 2 and "did you mean" not in err
    assert "usage: netprobe server " in err
