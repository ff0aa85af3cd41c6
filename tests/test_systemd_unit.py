"""The systemd unit in deploy/systemd/: it parses (systemd-analyze verify), its sandbox scores
as systemd's own security audit expects of a network daemon, and it asks for no privilege."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent.parent / "deploy" / "systemd" / "netprobe-server.service"

# deploy/ is in the source tree, not in the wheel: a wheel's test run has no unit to check.
pytestmark = pytest.mark.skipif(not UNIT.is_file(), reason=f"no source checkout: {UNIT} absent")

needs_analyze = pytest.mark.skipif(not shutil.which("systemd-analyze"),
                                   reason="systemd-analyze is not installed")


def _local_copy(tmp_path: Path) -> Path:
    # verify also checks that ExecStart's program exists: point it at this netprobe.
    text = UNIT.read_text().replace("/usr/bin/netprobe", f"{sys.executable} -m netprobe")
    copy = tmp_path / UNIT.name
    copy.write_text(text)
    return copy


@needs_analyze
def test_unit_verifies(tmp_path: Path) -> None:
    done = subprocess.run(["systemd-analyze", "verify", str(_local_copy(tmp_path))],
                          capture_output=True, text=True, timeout=60)
    problems = [line for line in done.stderr.splitlines() if UNIT.name in line]
    assert done.returncode == 0 and not problems, done.stderr


@needs_analyze
def test_unit_sandbox_exposure_is_low(tmp_path: Path) -> None:
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes",
                           str(_local_copy(tmp_path))],
                          capture_output=True, text=True, timeout=60)
    found = re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout)
    assert found, done.stdout + done.stderr
    assert float(found.group(1)) <= 2.0, done.stdout


def test_unit_asks_for_no_privilege() -> None:
    text = UNIT.read_text()
    settings = dict(line.split("=", 1) for line in text.splitlines()
                    if "=" in line and not line.startswith("#"))
    assert settings["DynamicUser"] == "yes"
    assert settings["CapabilityBoundingSet"] == "" and settings["AmbientCapabilities"] == ""
    assert settings["ProtectSystem"] == "strict" and settings["NoNewPrivileges"] == "yes"
    assert settings["ExecStart"].startswith("/usr/bin/netprobe server")
