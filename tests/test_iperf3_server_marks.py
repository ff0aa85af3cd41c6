"""A stock client's -S (TOS) and -C (congestion control) reach the server's own data
sockets, as with a stock server: what the server sends carries the client's TOS and runs
its algorithm, and the results name the algorithm (congestion_used), which the client prints
as the sender's. The witness is the kernel's own view of the server's sockets (ss)."""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time

import pytest

from netprobe.engine.iperf3 import wire
from tests.test_iperf3_server import Running, run_client, stock

pytestmark = pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")


def _server_sockets(port: int, seen: list[str], stop: threading.Event) -> None:
    """What ss says of the sockets on the server's port, sampled until ``stop`` (bounded)."""
    for _ in range(100):
        if stop.is_set():
            return
        out = subprocess.run(["ss", "-tin", "--tos", f"sport = :{port}"], capture_output=True,
                             text=True, timeout=10).stdout
        seen.append(out)
        time.sleep(0.1)


@pytest.mark.peers
def test_tos_and_congestion_reach_the_server_data_sockets() -> None:
    """3.12 -R -S 0x20 -C reno: the server's sending socket carries tos 0x20 and runs reno;
    the client's -J says reno for the sender (from the server's congestion_used)."""
    seen: list[str] = []
    stop = threading.Event()
    with Running() as srv:
        watcher = threading.Thread(target=_server_sockets, args=(srv.port, seen, stop))
        watcher.start()
        try:
            out = run_client(stock("3.12"), srv.port, "-t", "2", "-R", "-S", "0x20", "-C",
                             "reno", "-J", srv=srv)
        finally:
            stop.set()
            watcher.join(15)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr
    end = json.loads(out.stdout)["end"]
    assert end.get("sender_tcp_congestion") == "reno", end.keys()
    # The data socket is the one that sent bytes; the control connection keeps tos 0.
    sockets = [block for sample in seen for block in sample.split("ESTAB")[1:]]
    sending = [b for b in sockets if "bytes_sent:" in b and "data_segs_out:" in b
               and int(b.split("data_segs_out:")[1].split()[0]) > 1000]
    assert sending, seen[-3:]
    assert all("tos:0x20" in b and " reno " in f" {b} " for b in sending), sending[:1]


def test_params_tos_range_and_congestion_names() -> None:
    """TOS beyond a byte is iperf3's IEBADTOS; a congestion name is passed to the kernel only
    if it looks like one (a long or odd string from the wire is dropped, not set)."""
    bad = wire.parse_params({"tcp": True, "TOS": 300})
    assert wire.check_params(bad) == (wire.IEBADTOS, "TOS 300 out of range")
    assert wire.check_params(wire.parse_params({"TOS": 32})) is None
    names = {"reno": "reno", "bbr": "bbr", "x" * 40: None, "cu bic": None, "../x": None,
             "": None, 7: None}
    for given, kept in names.items():
        assert wire.parse_params({"congestion": given}).congestion == kept, given
