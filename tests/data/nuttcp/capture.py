"""Capture the nuttcp 8 outputs in this folder: real runs between two network namespaces
(100 Mbit/s tbf each way, 1 % random loss into each end, so that there are retransmits).

Run as root from the repository: ``PYTHONPATH=. python tests/data/nuttcp/capture.py NUTTCP``. Each
case writes CASE-client.txt (stdout and stderr merged, as printed) and CASE-server.txt,
and one line of runs.jsonl with both commands and exit codes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.netlab import A_ADDR, B_ADDR, Lab, wait_listening

HERE = Path(__file__).parent
CASES = {
    "N2-v-fparse-i1": "-v -fparse -T3 -i1 -N2",
    "N4-v-fparse-i1": "-v -fparse -T3 -i1 -N4",
    "N2-v-i1": "-v -T3 -i1 -N2",
    "N4-v": "-v -T3 -N4",
    "N2-fparse-i1": "-fparse -T3 -i1 -N2",
    "N4-brief": "-T3 -N4",
    "N2-r-v-fparse-i1": "-v -fparse -T3 -i1 -N2 -r",
    "N2-r-v-i1": "-v -T3 -i1 -N2 -r",
    "v-fparse-i1": "-v -fparse -T3 -i1",
    "r-v-fparse-i1": "-v -fparse -T3 -i1 -r",
    "v-i1": "-v -T3 -i1",
    "r-v-i1": "-v -T3 -i1 -r",
}


def main(binary: str) -> None:
    runs = []
    with Lab("nuttcpcap") as lab:
        a, b = lab.host("a"), lab.host("b")
        dev_a, dev_b = lab.link(a, f"{A_ADDR}/24", b, f"{B_ADDR}/24")
        for ns, dev in ((a, dev_a), (b, dev_b)):
            lab.shape(ns, dev, 100)
            lab.drop_percent(ns, 1)
        for name, options in CASES.items():
            server_cmd = [binary, "-1", "--nofork", "-P5000"]
            client_cmd = [binary, "-P5000", "-p5001", *options.split(), B_ADDR]
            with open(HERE / f"{name}-server.txt", "w") as out:
                server = lab.start(b, server_cmd, stdout=out, stderr=subprocess.STDOUT)
                wait_listening(lab, b, 5000)
                started = time.monotonic()
                client = lab.run(a, ["sh", "-c", " ".join(client_cmd) + " 2>&1"], timeout=60)
                elapsed = round(time.monotonic() - started, 2)
                server_rc = lab.stop(server)
            (HERE / f"{name}-client.txt").write_text(client.stdout)
            runs.append({"name": name, "client": " ".join(client_cmd), "client_rc":
                         client.returncode, "server": " ".join(server_cmd), "server_rc":
                         server_rc, "elapsed_s": elapsed})
    with open(HERE / "runs.jsonl", "w") as index:
        for run in runs:
            index.write(json.dumps(run) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "nuttcp")
