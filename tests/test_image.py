"""The OCI image (deploy/kubernetes/Dockerfile), built for real by scripts/build-image with
podman from a debootstrap Debian base (nothing pulled), and run: what is inside (the compiled
core, the PostgreSQL driver, the driven tools), what the build context leaves out, and
`netprobe server` in a container reached from this host with a mounted secret, natively
through a published port and with each driven tool's far end started inside the container.

The build is cached by a hash of what goes in: a cold one takes a few minutes, a cached one
about a second. Skipped with the reason where podman, runc, root or debootstrap is missing,
or where scripts/ is not beside the tests (the wheels' suite runs from a copy of tests/);
with ``CI=true`` a missing tool fails instead, as a missing built peer does (tests/peers.py).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.peers import in_ci

ROOT = Path(__file__).resolve().parents[1]
BUILD_IMAGE = ROOT / "scripts" / "build-image"
CACHE = Path(os.environ.get("NETPROBE_DEPLOY_CACHE", "/var/cache/netprobe-deploy"))
# The agent's port inside the container (the image's EXPOSE).
AGENT_PORT = 5301


def _missing(reason: str) -> None:
    """Skip for a missing tool, or fail when CI should have had it."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: the image must be built and run in CI)")
    pytest.skip(reason)


def podman(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run podman with the configuration scripts/build-image writes for this host."""
    env = {**os.environ, "CONTAINERS_CONF": str(CACHE / "containers.conf")}
    return subprocess.run(["podman", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=check)


@pytest.fixture(scope="module")
def image() -> str:
    """The image's reference, built (or found in the cache) by scripts/build-image."""
    if not BUILD_IMAGE.is_file():
        pytest.skip(f"{BUILD_IMAGE} is not here (the suite runs from a copy of tests/)")
    if shutil.which("podman") is None:
        _missing("podman is not installed")
    try:
        done = subprocess.run([str(BUILD_IMAGE)], capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        pytest.fail("scripts/build-image took over 30 minutes")
    if done.returncode == 77:
        _missing(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "cannot build")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def in_image(image: str, script: str) -> str:
    """Run ``script`` with sh in a throwaway container of ``image``; its stdout."""
    done = podman("run", "--rm", "--network=none", "--entrypoint", "sh", image, "-c", script,
                  check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_image_has_the_compiled_core_and_the_postgres_driver(image: str) -> None:
    out = in_image(image, "python -c 'import netprobe.core as c; print(c.DATA_PATH)';"
                          "python -c 'import psycopg.pq as p; print(p.__impl__, p.version())';"
                          "id -u; command -v gcc cc || true; netprobe --version")
    data_path, driver, uid, *rest = out.split("\n")
    assert data_path == "c"  # not the pure-Python fallback of a compiler-less build
    impl, libpq = driver.split()
    assert impl == "python" and int(libpq) >= 150000  # psycopg over Debian's libpq5 (15)
    assert uid != "0"
    rest_text = "\n".join(rest)
    assert "data path: c" in rest_text and "gcc" not in rest_text  # no compiler left


def test_image_runs_as_the_kubernetes_manifests_run_it(image: str) -> None:
    """deploy/kubernetes runs it as nobody, read-only, with every capability dropped."""
    done = podman("run", "--rm", "--network=none", "--user", "65534", "--read-only",
                  "--cap-drop=ALL", image, "--version", check=False)
    assert done.returncode == 0, done.stderr
    assert "data path: c" in done.stdout


def test_image_carries_the_driven_tools(image: str) -> None:
    out = in_image(image, "iperf3 --version; iperf -v 2>&1; nuttcp -V")
    assert "iperf 3." in out
    assert "iperf version 2." in out
    assert "nuttcp-" in out


def test_build_context_leaves_out_local_files(image: str, tmp_path: Path) -> None:
    """The repository's .dockerignore, applied by podman itself to a context holding what
    a working copy has: a venv, git's files, build outputs, an archive, caches."""
    context = tmp_path / "context"
    kept = ["pyproject.toml", "netprobe/core/wrapper.py", "csrc/core.c"]
    left_out = [".venv/bin/python", ".git/HEAD", "build/lib/x.py", "mesh.db",
                "netprobe/__pycache__/x.cpython-311.pyc", "netprobe/_core.abi3.so",
                "csrc/core.o", ".pytest_cache/v", ".mypy_cache/x", "dist/x.whl",
                "netprobe_meter.egg-info/PKG-INFO", "netprobe/_core.c"]
    for name in kept + left_out:
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        (context / name).write_text("x")
    shutil.copy(ROOT / ".dockerignore", context / ".dockerignore")
    (tmp_path / "Containerfile").write_text(f"FROM {image}\nCOPY . /ctx\n")
    tag = f"localhost/netprobe-context-check:{uuid.uuid4().hex[:8]}"
    podman("build", "--pull=never", "-q", "-f", str(tmp_path / "Containerfile"), "-t", tag,
           str(context), timeout=300)
    try:
        listing = in_image(tag, "cd /ctx && find . -type f | sort").split()
    finally:
        podman("rmi", "-f", tag, check=False)
    files = {name.removeprefix("./") for name in listing}
    assert set(kept) <= files
    assert not files & set(left_out)


def _free_port_both() -> int:
    """A port free for TCP and UDP on 127.0.0.1 (the native engine uses both)."""
    for _ in range(50):
        with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            tcp.bind(("127.0.0.1", 0))
            port = int(tcp.getsockname()[1])
            try:
                udp.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no port free for both TCP and UDP in 50 tries")


class Server:
    """A `netprobe server` container: its ID, the host port published to it, its address."""

    def __init__(self, cid: str, port: int, address: str, secret: Path) -> None:
        self.cid, self.port, self.address, self.secret = cid, port, address, secret

    def log(self) -> str:
        """The server's event log (its stdout) so far."""
        return podman("logs", self.cid, check=False).stdout


@pytest.fixture(scope="module")
def server(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The image's default command with a secret file mounted read-only, published on
    127.0.0.1 (TCP and UDP); stopped and removed by its ID afterwards."""
    secret = tmp_path_factory.mktemp("image") / "secret"
    secret.write_bytes(os.urandom(32).hex().encode())
    os.chown(secret, 10001, 10001)  # the image's user; the file stays unreadable to others
    secret.chmod(0o600)
    port = _free_port_both()
    started = podman("run", "-d", "-p", f"127.0.0.1:{port}:{AGENT_PORT}/tcp",
                     "-p", f"127.0.0.1:{port}:{AGENT_PORT}/udp",
                     "-v", f"{secret}:/etc/netprobe/secret:ro", image,
                     "server", "--secret-file", "/etc/netprobe/secret", check=False)
    assert started.returncode == 0, started.stderr
    cid = started.stdout.strip()
    try:
        address = podman("inspect", "--format", "{{.NetworkSettings.IPAddress}}",
                         cid).stdout.strip()
        srv = Server(cid, port, address, secret)
        deadline = time.monotonic() + 30
        while "listening" not in srv.log():
            assert time.monotonic() < deadline, f"the server never listened: {srv.log()}"
            time.sleep(0.2)
        yield srv
    finally:
        podman("stop", "-t", "5", cid, check=False)
        podman("rm", "-f", cid, check=False)


def netprobe_run(*args: str) -> subprocess.CompletedProcess[str]:
    """This host's netprobe (the one under test), as a user runs it."""
    return subprocess.run([sys.executable, "-m", "netprobe", "run", *args, "-J"],
                          capture_output=True, text=True, timeout=90)


def _received(result: dict[str, Any]) -> int:
    return sum(s["receiver"]["bytes"] or 0 for s in result["summaries"])


@pytest.mark.parametrize("protocol", ["tcp", "udp"])
def test_server_in_the_image_is_reached_from_the_host(server: Server, protocol: str) -> None:
    rate = ["-u", "-b", "20M"] if protocol == "udp" else []
    done = netprobe_run("127.0.0.1", "-p", str(server.port), "-t", "1", *rate,
                        "--secret-file", str(server.secret))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "ok" and result["tool"]["data_path"] == "c"
    assert result["spec"]["protocol"] == protocol
    assert _received(result) > 0
    # The server's own log says it served it (so the host's netprobe did not talk to itself).
    assert f"native test {protocol} normal" in server.log()


def test_server_in_the_image_wants_the_mounted_secret(server: Server, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("not the secret")
    wrong.chmod(0o600)
    done = netprobe_run("127.0.0.1", "-p", str(server.port), "-t", "1",
                        "--secret-file", str(wrong))
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "secret" in done.stderr


@pytest.mark.parametrize("tool, binary", [("iperf3", "iperf3"), ("iperf2", "iperf"),
                                          ("nuttcp", "nuttcp")])
def test_agent_in_the_image_starts_each_driven_far_end(server: Server, tool: str,
                                                       binary: str) -> None:
    """The agent starts the tool's server inside the container; the client here reaches it
    at the container's address (a loopback address would mean "this machine", where no
    agent is asked)."""
    if shutil.which(binary) is None:
        _missing(f"{binary} is not installed here (the near end)")
    done = netprobe_run(server.address, "--tool", tool, "-t", "1",
                        "--secret-file", str(server.secret))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "ok" and result["remote"]["address"] == server.address
    assert _received(result) > 0
    assert f"started {tool} server" in server.log()
