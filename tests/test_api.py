"""The Python API (docs/api.md): ``import netprobe; netprobe.run(...)`` as a script uses it."""
from __future__ import annotations

import json
import textwrap

import pytest

import netprobe
from netprobe.errors import SpecError, ToolNotFound
from netprobe.schema import Result

from .test_cli import run_code

SCRIPT = textwrap.dedent("""
    import json
    import sys

    import netprobe
    from netprobe.errors import NetprobeError

    try:
        result = netprobe.run(duration_s=1.0, interval_s=0.5, streams=2)
    except NetprobeError as exc:
        sys.exit(f"test failed: {exc}")
    flow = result.summaries[0]
    print(json.dumps({"status": result.status, "tool": result.tool.name,
                      "received": flow.receiver.bytes, "intervals": len(result.intervals)}))
""")


def test_a_script_runs_a_test_and_reads_the_result() -> None:
    done = run_code(SCRIPT)
    seen = json.loads(done.stdout)
    assert seen["status"] == "ok" and seen["tool"] == "native"
    assert seen["received"] > 0
    assert seen["intervals"] >= 2


def test_run_returns_a_result_with_live_intervals() -> None:
    class Collect:
        def __init__(self) -> None:
            self.samples: list[object] = []

        def interval(self, sample: object) -> None:
            self.samples.append(sample)

        def note(self, message: str) -> None:
            pass

    seen = Collect()
    result = netprobe.run(tool="native", duration_s=1.0, interval_s=0.5, reporter=seen)
    assert isinstance(result, Result) and result.status == "ok"
    assert result.spec.duration_s == 1.0
    assert len(seen.samples) >= 2


def test_run_refuses_what_the_cli_refuses() -> None:
    with pytest.raises(ToolNotFound, match="no tool named 'nosuch'"):
        netprobe.run(tool="nosuch", duration_s=1.0)
    with pytest.raises(SpecError, match="not a test spec field: colour"):
        netprobe.run(duration_s=1.0, colour="blue")
    with pytest.raises(SpecError, match="cannot honour"):
        netprobe.run(tool="iperf2", duration_s=1.0, skip_rx_copy=True)


def test_importing_netprobe_stays_cheap() -> None:
    code = ("import sys, netprobe\n"
            "print([m for m in sys.modules if m in ('netprobe.plugin', 'netprobe.session')])\n"
            "print(callable(netprobe.run))")
    done = run_code(code)
    assert done.stdout.splitlines()[-2:] == ["[]", "True"]


def test_saved_results_read_back_and_summarised_as_documented() -> None:
    # docs/api.md, "Saving and reading results": a JSON document and a JSON line in one
    # file, read back, grouped by tool and summarised.
    from netprobe.convert import from_json, to_json
    from netprobe.results.analysis import group_results, group_stats
    from netprobe.results.saved import read_results
    from tests.test_formats import sample_result

    result = sample_result()
    text = to_json(result) + "\n" + json.dumps(json.loads(to_json(result))) + "\n"
    found, warning = read_results(text, "saved.json")
    assert found == [from_json(to_json(result))] * 2 and warning is None
    groups = group_results(found, ["tool"])
    assert [g.label for g in groups] == [result.tool.name]
    stats = group_stats(groups)
    assert (stats[0].total, stats[0].ok) == (2, 2) and stats[0].figures
