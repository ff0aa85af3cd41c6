"""UDP byte-count mode sends exactly the count asked for (a short last datagram makes up
the rest), and a count below one datagram's header is refused before anything runs.

Real native tests on loopback, in-process."""
from __future__ import annotations

import pytest

from netprobe.convert import from_json
from tests.test_cli import assert_one_error_line, builtin_registry, needs_native, run_main

# Rates the CPU must hold: the emulated ARM suites take turns here (scripts/arm-suite).
pytestmark = pytest.mark.rate

HEADER = 16  # netprobe's datagram header: sequence number and send time


@needs_native
@pytest.mark.parametrize("count, extra", [
    ("1k", []),                   # below one default datagram (1448 bytes): was 0 bytes
    ("1M", ["-b", "200M"]),       # 1,048,576 is 724 datagrams and 224 bytes: was 1,048,352
    (str(3 * 1448 + 5), []),      # a tail shorter than the header folds into the last one
    (str(2 * 100 + 7), ["-l", "100", "-R"]),  # the server's sender too
])
def test_udp_byte_count_is_exact(capsys: pytest.CaptureFixture[str], count: str,
                                 extra: list[str]) -> None:
    code, out, err = run_main(capsys, "run", "-u", "-n", count, *extra, "--json",
                              registry=builtin_registry())
    assert code == 0, err
    result = from_json(out)
    expected = int(count[:-1]) * {"k": 1024, "M": 1024 ** 2}[count[-1]] if count[-1] in "kM" \
        else int(count)
    [flow] = result.summaries
    assert flow.sender is not None and flow.receiver is not None
    assert flow.sender.bytes == expected
    assert flow.receiver.bytes == expected  # loopback at these rates loses nothing


@needs_native
def test_udp_byte_count_below_one_datagram_is_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "run", "-u", "-n", str(HEADER - 1), "--json",
                              registry=builtin_registry())
    assert code == 2
    assert_one_error_line(err)
    assert "--bytes" in err and str(HEADER) in err
