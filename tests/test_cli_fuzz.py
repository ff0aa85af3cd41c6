"""Hundreds of generated command lines: every one ends in a one-line error or a clean
refusal and a non-zero exit, never a traceback.

Each list ends with ``--tool`` naming no installed tool, so an argument list that happens
to be valid stops at the tool lookup (exit 3) instead of starting a real test."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netprobe.cli.main import main

from .budget import scaled

OPTIONS = ["-t", "-n", "-P", "-b", "-l", "-w", "-M", "--dscp", "-C", "-i", "-O", "-p", "-B",
           "--format", "-o", "-c"]
FLAGS = ["-u", "-R", "--bidir", "-N", "-4", "-6", "-Z", "--skip-rx-copy", "--json", "-q"]
VALUES = st.one_of(
    st.sampled_from(["-1", "0", "1", "fast", "1e999", "nan", "inf", "10x", "65536", "99999",
                     "-5.5", "1.5G", "64k", "", " ", "EF", "AF99", "human", "xml", "::1",
                     "no.such.host.invalid", "1M", "2g", "%", "0x3f", "1e-9"]),
    st.text(max_size=8),
    st.integers(-10**6, 10**12).map(str),
)
WORD = st.one_of(
    st.tuples(st.sampled_from(OPTIONS), VALUES).map(list),
    st.sampled_from(FLAGS).map(lambda flag: [flag]),
    st.sampled_from(["--bogus", "-X", "--time=", "--bitrate=fast"]).map(lambda w: [w]),
)


@settings(max_examples=scaled(300), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(WORD, max_size=6))
def test_generated_command_lines_fail_cleanly(capsys: pytest.CaptureFixture, words: list) -> None:
    argv = ["run", *[part for word in words for part in word], "--tool", "no-such-tool-x"]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code in (2, 3), (argv, code, err)
    assert "Traceback" not in err + out
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and "error" in lines[-1], (argv, err)
    # argparse prints its usage line before the error; netprobe's own errors are one line.
    assert len(lines) <= 2, (argv, err)
