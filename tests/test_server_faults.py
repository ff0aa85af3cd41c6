"""A server that meets a fault of its own (a late import at the open-files limit, a log sink
that raises, no thread to be had at the tasks limit) loses one connection, never the port.

The native server and the iperf3 listener each accept on one thread: were that thread to
die, the port would stay open and answer no one, and systemd (which restarts a process that
exits) would see nothing wrong. CI once found the accept loop dead after the open-files
test: the log's clock imported datetime at the limit and the import could not open its file.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netprobe.engine import protocol
from netprobe.engine.client import run_test
from netprobe.engine.server import LOADED_BEFORE_SERVING, Server, ServerConfig
from netprobe.plugin import NullReporter
from netprobe.schema import TestSpec

from .peers import stock_iperf3
from .servers import free_port, netprobe_server

# What `netprobe server --iperf3` has loaded when it first listens (from then on a client
# can bring it to the open-files limit), written by the process itself.
_LOADED_AT_LISTEN = textwrap.dedent("""
    import json, os, signal, socket, sys, threading, time
    from netprobe.cli.main import main
    from netprobe.driven import is_listening

    listen = socket.socket.listen

    def listen_and_tell(sock, *args):
        if not os.path.exists(sys.argv[3]):
            with open(sys.argv[3], "w") as out:
                json.dump(sorted(sys.modules), out)
        return listen(sock, *args)

    def stop_once_listening():
        while not is_listening(int(sys.argv[2])):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    socket.socket.listen = listen_and_tell
    threading.Thread(target=stop_once_listening, daemon=True).start()
    main(["server", "-B", "127.0.0.1", "-p", sys.argv[1], "--iperf3",
          "--iperf3-port", sys.argv[2]])
""")


def _late_imports(module: str) -> set[str]:
    """The top-level names of the modules ``module``'s functions import when called."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return set()  # a namespace package: no code of its own
    tree = ast.parse(Path(spec.origin).read_text())
    names: set[str] = set()
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
    return names


@pytest.fixture(scope="module")
def loaded_at_listen(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The modules `netprobe server --iperf3` has loaded when it first listens."""
    out = tmp_path_factory.mktemp("listen") / "modules.json"
    subprocess.run([sys.executable, "-c", _LOADED_AT_LISTEN, str(free_port()),
                    str(free_port()), str(out)], timeout=60, capture_output=True, check=False)
    return set(json.loads(out.read_text()))


def test_the_server_loads_what_its_serving_code_imports_late_before_it_listens(
    loaded_at_listen: set[str],
) -> None:
    loaded = loaded_at_listen
    serving = sorted(m for m in loaded
                     if m.startswith(("netprobe.engine", "netprobe.agent"))
                     and m != "netprobe.engine.iperf3.client")
    assert "netprobe.engine.server" in serving and "netprobe.engine.iperf3.service" in serving
    missing = {m: sorted(n for n in _late_imports(m) if n not in loaded
                         and not n.startswith("netprobe.")) for m in serving}
    missing = {m: names for m, names in missing.items() if names}
    # The serving code's own late imports of netprobe modules are loaded by then too, or
    # named here; the standard library's must be, or an import at the open-files limit
    # fails in the middle of serving.
    assert not missing, (missing, LOADED_BEFORE_SERVING)


def test_a_routers_server_loads_no_terminal_or_plugin_machinery(
    loaded_at_listen: set[str],
) -> None:
    # What a router pays in memory: the server draws nothing (rich), finds no plugins
    # (stevedore, importlib.metadata's entry points), converts no saved results (cattrs)
    # and, without iperf3 authentication configured, loads no cryptography (an extra).
    heavy = sorted(m for m in loaded_at_listen
                   if m.split(".")[0] in ("rich", "stevedore", "cattrs", "pygments",
                                          "cryptography"))
    assert not heavy, heavy


def test_a_log_sink_that_raises_costs_a_line_not_the_port() -> None:
    def log(message: str, /, event: str = "note", **fields: object) -> None:
        if event == "closed":  # a connect-and-close: the accept loop logs it
            raise RuntimeError("the log shipper is down")

    server = Server(ServerConfig(bind_address="127.0.0.1", port=0), log=log)
    port = server.start()
    try:
        for _ in range(3):
            socket.create_connection(("127.0.0.1", port)).close()
        time.sleep(0.3)
        spec = TestSpec(duration_s=0.3, interval_s=None, port=port)
        assert run_test(spec, NullReporter(), "127.0.0.1").status == "ok"
    finally:
        server.close()


# --- the tasks limit ------------------------------------------------------------------


def _pids_cgroup_root() -> Path | None:
    """This process's cgroup in a hierarchy with the pids controller (v1 or v2)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if line.startswith("0::"):
            for mount in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
                control = Path(mount + path) / "cgroup.subtree_control"
                if control.is_file() and "pids" in control.read_text().split():
                    return control.parent
        elif "pids" in controllers.split(","):
            node = Path("/sys/fs/cgroup/pids" + path)
            if (node / "cgroup.procs").is_file():
                return node
    return None


@pytest.fixture
def pids_cgroup() -> Iterator[Path]:
    """A child cgroup whose pids.max a test sets (removed afterwards, its processes moved
    back to the parent)."""
    root = _pids_cgroup_root()
    if root is None or not os.access(root, os.W_OK):
        pytest.skip("no writable cgroup with the pids controller")
    node = root / f"np-faults-pids-{os.getpid()}"
    node.mkdir()
    try:
        yield node
    finally:
        for pid in (node / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # it has exited
                (root / "cgroup.procs").write_text(pid)
        node.rmdir()


def _tasks(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_at_the_tasks_limit_connections_are_closed_and_the_port_serves_again(
    pids_cgroup: Path,
) -> None:
    iperf3 = stock_iperf3("3.12")
    iperf3_port = free_port()
    with netprobe_server("--iperf3", "--iperf3-port", str(iperf3_port)) as server:
        time.sleep(0.3)
        (pids_cgroup / "cgroup.procs").write_text(str(server.pid))
        (pids_cgroup / "pids.max").write_text(str(_tasks(server.pid)))  # not one more
        native = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        native.sendall(protocol.pack_hello(protocol.KIND_CONTROL))
        assert native.recv(64) == b""  # closed unserved: no thread to serve it
        native.close()
        socket.create_connection(("127.0.0.1", iperf3_port), timeout=5).close()
        time.sleep(0.5)
        (pids_cgroup / "pids.max").write_text("max")
        spec = TestSpec(duration_s=0.3, interval_s=None, port=server.port)
        assert run_test(spec, NullReporter(), "127.0.0.1").status == "ok"
        stock = subprocess.run([iperf3, "-c", "127.0.0.1", "-p", str(iperf3_port), "-t", "1",
                                "--json"], capture_output=True, text=True, timeout=30)
        assert stock.returncode == 0, stock.stdout[-500:] + stock.stderr[-500:]
        assert json.loads(stock.stdout)["end"]["sum_received"]["bytes"] > 0
        log = server.log()
    assert "no thread to serve it (the tasks limit)" in log
    assert "Traceback" not in log, log[-2000:]



# --- descriptors past select's 1024 ----------------------------------------------------

HIGH_FDS = 1100


# netprobe started with its descriptors 3 to 1,102 held open (on /dev/null), so that every
# socket it makes is numbered past 1024, as on a busy server. Held after an exec of its own
# and kept across the next: opened in a preexec, they would land above the parent's
# close-on-exec descriptors, whose places come free again at the exec.
HIGH = [sys.executable, "-c", "import os, sys\n"
        f"for _ in range({HIGH_FDS}):\n"
        "    os.set_inheritable(os.open(os.devnull, os.O_RDONLY), True)\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'netprobe', *sys.argv[1:]])"]


def _run_high(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*HIGH, *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def high_server() -> Iterator[tuple[int, int]]:
    """A `netprobe server --iperf3 --allow-third-party` whose sockets are numbered past
    1024: its port and its iperf3 port."""
    import resource

    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < HIGH_FDS + 200:
        pytest.skip(f"the open-files limit is under {HIGH_FDS + 200}")
    iperf3_port = free_port()
    with netprobe_server("--iperf3", "--iperf3-port", str(iperf3_port), "--allow-third-party",
                         command=HIGH) as server:
        assert server.fds() > HIGH_FDS
        yield server.port, iperf3_port


def test_latency_probes_work_with_descriptors_past_1024(high_server: tuple[int, int]) -> None:
    # select() refuses a descriptor of 1024 or more: the probe sender and the echo died.
    run = _run_high("run", "127.0.0.1", "-p", str(high_server[0]), "-t", "1", "--latency",
                    "--json")
    assert run.returncode == 0, run.stderr[-800:]
    doc = json.loads(run.stdout)
    assert doc["status"] == "ok" and doc["latency"]["count"] > 0, doc.get("latency")


def test_a_third_party_test_is_not_stopped_for_a_descriptor_past_1024(
    high_server: tuple[int, int],
) -> None:
    # The agent's requester watch took select's refusal for a requester gone, and stopped
    # every third-party test at once.
    run = _run_high("run", "--from", "127.0.0.1", "--agent-port", str(high_server[0]),
                    "--to", "127.0.0.1", "-p", str(high_server[0]), "-t", "1", "--json")
    assert run.returncode == 0, run.stderr[-800:]
    doc = json.loads(run.stdout)
    assert doc["status"] == "ok" and doc["summaries"][0]["receiver"]["bytes"] > 0


def test_the_iperf3_client_works_with_descriptors_past_1024(
    high_server: tuple[int, int],
) -> None:
    run = _run_high("run", "127.0.0.1", "--iperf3", "-p", str(high_server[1]), "-t", "1",
                    "--json")
    assert run.returncode == 0, run.stderr[-800:]
    assert json.loads(run.stdout)["summaries"][0]["receiver"]["bytes"] > 0
