"""Every ``--json`` run prints exactly one document, failures included: a test that cannot
connect, a test interrupted before any figure came back. The machine formats (jsonl, csv)
likewise print their one record. Real native runs (in-process and as processes)."""
from __future__ import annotations

import csv
import io
import json
import signal
import subprocess
import time

import pytest

from netprobe.convert import from_json
from tests.servers import NETPROBE, free_port
from tests.test_cli import (
    assert_one_error_line,
    builtin_registry,
    child_env,
    needs_native,
    run_main,
)


@needs_native
@pytest.mark.parametrize("fmt", ["--json", "--format=jsonl", "--format=csv"])
def test_cannot_connect_still_prints_one_record(capsys: pytest.CaptureFixture[str],
                                               fmt: str) -> None:
    port = str(free_port())  # nothing listens there
    code, out, err = run_main(capsys, "run", "127.0.0.1", "-p", port, "-t", "1", fmt,
                              registry=builtin_registry())
    assert code == 5
    assert_one_error_line(err)
    if fmt == "--format=csv":
        [row] = list(csv.DictReader(io.StringIO(out)))
        assert row["status"] == "failed" and row["tool"] == "native"
        return
    result = from_json(out if fmt == "--json" else out.strip())
    assert len(out.strip().splitlines()) >= 1 and json.loads(out)  # one document only
    assert result.status == "failed" and result.tool.name == "native"
    assert result.spec.port == int(port)
    assert any("cannot connect" in e for e in result.errors), result.errors


@needs_native
def test_interrupted_self_test_prints_one_document() -> None:
    proc = subprocess.Popen([*NETPROBE, "run", "-t", "30", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        time.sleep(4)  # well into the test (the start takes ~1 s)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 130, err
    result = from_json(out)
    assert result.status == "interrupted"


def test_ctrl_c_before_any_figure_is_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "run", "--tool", "ctrlc", "--json")
    assert code == 130
    assert_one_error_line(err)
    result = from_json(out)
    assert result.status == "interrupted" and result.tool.name == "ctrlc"
