"""The link cut mid-test (veth down in a namespace lab): both ends give up with a clear
error within their timeouts, keep what they measured, and the server serves again."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from .netlab import B_ADDR, Lab, shaped_pair, wait_listening

pytestmark = [pytest.mark.root, pytest.mark.slow]
why_not = Lab.available()
if why_not:
    pytestmark.append(pytest.mark.skip(reason=why_not))

NETPROBE = [sys.executable, "-m", "netprobe"]
DURATION = 4
# The client gives up at the planned end plus the report wait (conduct.REPORT_WAIT_S).
GIVE_UP_S = DURATION + 15 + 5


def test_link_cut_mid_test() -> None:
    with shaped_pair(100) as (lab, a, b):
        server = lab.start(b, [*NETPROBE, "server", "-B", B_ADDR], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        wait_listening(lab, b, 5301)
        client = lab.start(a, [*NETPROBE, "run", B_ADDR, "-t", str(DURATION), "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        dev = lab.run(a, ["ip", "-o", "link", "show", "type", "veth"]).stdout.split(":")[1].strip()
        lab.ip(a, "link", "set", dev.split("@")[0], "down")
        cut = time.monotonic()
        out, err = client.communicate(timeout=GIVE_UP_S + 10)
        assert time.monotonic() - cut < GIVE_UP_S
        assert client.returncode == 5, err
        assert "Traceback" not in err and err.strip()
        partial = json.loads(out)
        assert partial["status"] == "failed"
        assert any(i["bytes"] > 0 for i in partial["intervals"])
        # The server side ends the session on its own timeout and keeps serving.
        deadline = time.monotonic() + GIVE_UP_S
        while time.monotonic() < deadline and server.poll() is None:
            if _session_over(lab, b):
                break
            time.sleep(0.5)
        assert server.poll() is None, "the server must survive the cut"
        assert _session_over(lab, b), "the server's session must end by itself"
        lab.ip(a, "link", "set", dev.split("@")[0], "up")
        again = lab.run(a, [*NETPROBE, "run", B_ADDR, "-t", "1", "--json"], timeout=60)
        assert again.returncode == 0, again.stderr


def _session_over(lab: Lab, ns: str) -> bool:
    """True once the server holds no established connection any more."""
    return lab.run(ns, ["ss", "-tnH", "state", "established"]).stdout.strip() == ""
