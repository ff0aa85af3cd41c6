"""The suite's own judge of host timing (tests/hoststeal.py, the hooks in tests/conftest.py):
a failure of a ``host_timing`` or ``rate`` test is unjudged only while the host took the
CPUs, and no other outcome is touched. Run as a pytest of its own on a counters file the
inner tests write, so the steal is known."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from netprobe import core
from netprobe.errors import CoreError
from tests import hoststeal

ROOT = Path(__file__).resolve().parent.parent

# The inner tests: each body moves a steal counter of its own (standing in for the
# host's, per CPU, over a body that sleeps 0.2 s), then passes or fails.
INNER = '''
import os, time
import pytest
from tests import hoststeal

STOLEN_S = [7.0]
hoststeal.steal_s = lambda: STOLEN_S[0]


def _body(stolen_share, fails):
    STOLEN_S[0] += stolen_share * 0.2 * (os.cpu_count() or 1)
    time.sleep(0.2)
    assert not fails, "the link read 80.1 Mbit/s"


@pytest.mark.host_timing
def test_marked_fails_starved():
    _body(0.5, True)


@pytest.mark.host_timing
def test_marked_fails_served():
    _body(0.0, True)


def test_unmarked_fails_starved():
    _body(0.5, True)


@pytest.mark.host_timing
def test_marked_passes_starved():
    _body(0.5, False)


@pytest.mark.rate
def test_rate_fails_starved():
    _body(0.5, True)
'''


def _inner_run(tmp_path: Path) -> subprocess.CompletedProcess:
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-rA", "-q", "-o", "markers=rate: a rate", "--rootdir", str(tmp_path),
         str(tmp_path / "test_inner.py")],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


def test_only_a_timing_failure_under_steal_is_unjudged(tmp_path: Path) -> None:
    inner = _inner_run(tmp_path)
    out = inner.stdout
    lines = out.splitlines()
    assert "PASSED test_inner.py::test_marked_passes_starved" in lines, out
    failed = sorted(line.split()[1] for line in lines if line.startswith("FAILED "))
    assert failed == ["test_inner.py::test_marked_fails_served",
                      "test_inner.py::test_unmarked_fails_starved"], out
    assert inner.returncode == 1, out  # the two failures that stand fail the run
    # Each skip says what the host took and what the test saw, and the run's summary names
    # the tests (the 50 % asked for, give or take the body's own time).
    unjudged = [line for line in lines if line.startswith("SKIPPED")]
    assert len(unjudged) == 2, out
    assert all(re.search(r"unjudged: the host took (4[5-9]|5[0-5])% of this machine", line)
               and line.endswith("AssertionError: the link read 80.1 Mbit/s")
               for line in unjudged), out
    summary = next(line for line in lines if line.startswith("host steal over the run"))
    assert "2 host_timing test(s) unjudged for it: " in summary, out
    assert "test_marked_fails_starved" in summary and "test_rate_fails_starved" in summary


def test_the_steal_counter_is_netprobes_own_reading() -> None:
    # tests/hoststeal.py reads what netprobe.core.host_cpu reads (the first line of
    # /proc/stat), in seconds.
    before = core.host_cpu().steal / os.sysconf("SC_CLK_TCK")
    got = hoststeal.steal_s()
    after = core.host_cpu().steal / os.sysconf("SC_CLK_TCK")
    assert got is not None and before <= got <= after


def test_a_missing_counter_leaves_every_failure_standing(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreadable() -> None:
        raise CoreError("open(/proc/stat)", errno.EACCES)
    monkeypatch.setattr(core, "host_cpu", unreadable)
    meter = hoststeal.StealMeter()
    meter.start()
    assert meter.share() is None
    assert hoststeal.unjudged_reason(None, "assert 0.98 == 1.0") is None
    assert hoststeal.unjudged_reason(hoststeal.STEAL_LIMIT / 2, "x") is None
    assert hoststeal.unjudged_reason(hoststeal.STEAL_LIMIT, "x") is not None


def test_the_real_counter_moves_forward() -> None:
    first = hoststeal.steal_s()
    if first is None:
        pytest.skip("this kernel does not count steal in /proc/stat")
    second = hoststeal.steal_s()
    assert second is not None and second >= first >= 0
