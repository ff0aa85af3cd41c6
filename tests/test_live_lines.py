"""Live interval lines and the summary table as a terminal shows them: a fixed order
whichever end reported first, no short tail line, and 80 columns without a cut cell."""
from __future__ import annotations

import io

import attrs
import pytest
from rich.console import Console

from netprobe.cli.render import LiveReporter, print_result
from netprobe.convert import from_json
from netprobe.schema import Interval, TestSpec
from tests.test_cli import builtin_registry, needs_native, run_main
from tests.test_formats import sample_result


def _sample(role: str, stream: int | None, start: float) -> Interval:
    return Interval(direction="client_to_server", role=role, stream_id=stream, start_s=start,
                    end_s=start + 1, bytes=10**9, bits_per_second=8e9,
                    retransmits=3 if role == "sender" else None,
                    rtt_us=1234 if role == "sender" else None,
                    cwnd_bytes=4 * 2**20 if role == "sender" else None)


def _console(width: int = 80) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=width, color_system=None, force_terminal=False), buffer


def test_lines_come_in_a_fixed_order_and_fit_80_columns() -> None:
    console, buffer = _console()
    live = LiveReporter(TestSpec(streams=2), per_stream=True, console=console, notes=console)
    # As they may arrive: the far end's receiver lines first, each side's streams in any
    # order and then its sum (as each end sends them).
    for start in (0.0, 1.0):
        for role in ("receiver", "sender"):
            for stream in (2, 1, None):
                live.interval(_sample(role, stream, start))
    live.finish()
    lines = buffer.getvalue().splitlines()[1:]  # after the header
    labels = [(line[:5], "sender" if " sender " in line else "receiver") for line in lines]
    one_interval = [("[  1]", "sender"), ("[  1]", "receiver"), ("[  2]", "sender"),
                    ("[  2]", "receiver"), ("[SUM]", "sender"), ("[SUM]", "receiver")]
    assert labels == one_interval * 2
    assert all(len(line) <= 80 for line in lines)
    assert "retr 3" in lines[0]  # what fits stays; rtt and cwnd wait for a wider terminal


def test_wide_lines_keep_every_figure() -> None:
    console, buffer = _console()
    live = LiveReporter(TestSpec(), console=console, notes=console, wide=True)
    live.interval(_sample("sender", 1, 0.0))
    live.finish()
    assert "rtt 1.234 ms" in buffer.getvalue() and "cwnd 4.00 MBytes" in buffer.getvalue()


@pytest.mark.parametrize("protocol", ["tcp", "udp"])
def test_summary_table_fits_80_columns_uncut(protocol: str) -> None:
    console, buffer = _console()
    result = sample_result(protocol=protocol, streams=2)
    print_result(console, attrs.evolve(result, warnings=()), per_stream=True)
    table = [line for line in buffer.getvalue().splitlines() if line.startswith("c->s")]
    assert table and all(len(line) <= 80 for line in table)
    assert "…" not in buffer.getvalue()


@needs_native
def test_no_short_tail_interval(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "run", "-t", "1", "-i", "0.5", "--json",
                              registry=builtin_registry())
    assert code == 0, err
    spans = [i.end_s - i.start_s for i in from_json(out).intervals if i.role == "sender"]
    assert spans and min(spans) >= 0.45  # the last few ms joined the last interval
