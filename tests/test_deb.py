"""The .deb (scripts/build-deb) installed with the real dpkg into a clean Debian rootfs
(scripts/debian-base, debootstrap's minbase plus only the package's own Depends): the
system user and the secret exist, the server started from the installed unit's exact
ExecStart (its EnvironmentFile expanded as systemd expands it) serves a test the host's
client asks for with the secret, and dpkg -r then dpkg -P leave nothing behind.

Needs root, dpkg-deb, chroot and unshare; skipped without them, except that with CI=true a
missing tool fails the test instead (as tests/peers.py does for built peers): CI has them.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netprobe.driven import is_listening
from tests.peers import in_ci
from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
UNIT = "lib/systemd/system/netprobe-server.service"
# The package manager's own records and logs change with every install: not the package's.
BOOKKEEPING = ("var/lib/dpkg/", "var/log/", "var/cache/debconf/")
# Written by every useradd and userdel (the previous /etc/passwd and its kin), by no package.
SHADOW_BACKUPS = ("etc/passwd-", "etc/group-", "etc/shadow-", "etc/gshadow-")


def _unavailable(reason: str) -> None:
    """Skip for a missing tool, or fail where CI=true says the tools are there."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: the .deb must be built and tested)", pytrace=False)
    pytest.skip(reason)


def _script(name: str, *args: str) -> Path:
    """Run scripts/NAME and return the path it prints; exit 77 is 'cannot here'."""
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run([str(ROOT / "scripts" / name), *args], capture_output=True,
                          text=True, env=env, timeout=1200, check=False)
    if proc.returncode == 77:
        _unavailable(f"scripts/{name}: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, f"scripts/{name} failed:\n{proc.stderr[-3000:]}"
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def deb() -> Path:
    """The .deb, built once for the module (and reused by build-deb while its sources and
    base are unchanged)."""
    if not (ROOT / "scripts" / "build-deb").is_file():
        pytest.skip("no source checkout: scripts/build-deb absent")
    if os.geteuid() != 0:
        _unavailable("needs root (chroot, dpkg into a rootfs)")
    for tool in ("dpkg-deb", "chroot", "unshare", "zstd"):
        if shutil.which(tool) is None:
            _unavailable(f"no {tool}")
    return _script("build-deb")


def _field(deb: Path, name: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), name], capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def base(deb: Path) -> Path:
    """A clean rootfs tarball with exactly the package's Depends added to minbase, so dpkg -i
    needs no network and a dependency the package forgot to declare is missing there."""
    names = [re.split(r"[\s(]", d.strip(), maxsplit=1)[0]
             for d in _field(deb, "Depends").split(",")]
    return _script("debian-base", ",".join(sorted(names)))


@pytest.fixture
def rootfs(base: Path, deb: Path, tmp_path: Path) -> Iterator[Path]:
    """A fresh extract of the clean rootfs, with the .deb copied into its /tmp."""
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["tar", "--zstd", "-C", str(root), "-xf", str(base)], check=True)
    root.chmod(0o755)  # as / is on a host (a tarball from an older debian-base says 0700)
    shutil.copy(deb, root / "tmp" / "netprobe-meter.deb")
    yield root
    subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)


def _chroot_argv(root: Path, *argv: str) -> list[str]:
    """``argv`` in ``root`` with /dev and /proc, in a mount namespace of its own (the
    mounts go with it). No --fork: the process keeps its PID from unshare to the
    command, so the test can stop it by that PID."""
    mounts = 'mount --rbind /dev "$0/dev" && mount -t proc proc "$0/proc" && exec chroot "$0" "$@"'
    return ["unshare", "--mount", "sh", "-c", mounts, str(root), *argv]


def _in_root(root: Path, *argv: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(_chroot_argv(root, *argv), capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, \
        f"{' '.join(argv)} in the rootfs failed:\n{proc.stdout}{proc.stderr}"
    return proc


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every path of the rootfs but the package manager's bookkeeping: its type, mode and
    owner, and for /etc its content."""
    found: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = str(path.relative_to(root))
            if rel.startswith(BOOKKEEPING) or rel in SHADOW_BACKUPS:
                continue
            st = path.lstat()
            digest = ""
            if rel.startswith("etc/") and stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid,
                          st.st_gid, digest)
    return found


def _environment_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile= reads them (comments, quotes)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, _, value = line.partition("=")
        words = shlex.split(value)
        values[key.strip()] = " ".join(words)
    return values


def _unit_command(root: Path) -> tuple[list[str], dict[str, str]]:
    """The installed unit's ExecStart as systemd runs it, and its [Service] settings:
    ``$VAR`` becomes the variable's words, ``${VAR}`` one word (systemd.service(5))."""
    settings: dict[str, str] = {}
    for line in (root / UNIT).read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings.setdefault(key, value)
    env_path = settings["EnvironmentFile"].lstrip("-")
    env_file = root / env_path.lstrip("/")
    env = _environment_file(env_file.read_text()) if env_file.exists() else {}
    argv: list[str] = []
    for word in shlex.split(settings["ExecStart"]):
        whole = re.fullmatch(r"\$\{(\w+)\}", word)
        split = re.fullmatch(r"\$(\w+)", word)
        if whole:
            argv.append(env.get(whole[1], ""))
        elif split:
            argv.extend(env.get(split[1], "").split())
        else:
            argv.append(word)
    return argv, settings


def _wait_serving(server: subprocess.Popen, port: int) -> None:
    """Until the server listens on ``port`` (at most 30 s); its output if it exits first."""
    end = time.monotonic() + 30
    while not is_listening(port, socket.AF_INET):
        if server.poll() is not None:
            pytest.fail(f"the server exited ({server.returncode}):\n{server.communicate()[0]}")
        assert time.monotonic() < end, f"the server does not listen on port {port}"
        time.sleep(0.05)


def _client(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "netprobe", "run", *args], capture_output=True,
                          text=True, timeout=60, check=False)


def test_the_package_says_what_it_holds(deb: Path) -> None:
    """dpkg-deb's view, a supplement to the install test below: the name, the Debian
    Python the environment was built for, the one conffile, and the unit and command."""
    assert _field(deb, "Package") == "netprobe-meter"
    assert re.fullmatch(r"python3\.\d+, passwd", _field(deb, "Depends"))
    info = subprocess.run(["dpkg-deb", "--info", str(deb), "conffiles"], capture_output=True,
                          text=True, check=True).stdout.split()
    assert info == ["/etc/default/netprobe"]
    contents = subprocess.run(["dpkg-deb", "--contents", str(deb)], capture_output=True,
                              text=True, check=True).stdout
    for path in ("./opt/netprobe/bin/netprobe", f"./{UNIT}", "./usr/bin/netprobe"):
        assert f" {path}" in contents
    # a secret in the package would be the same on every host
    assert "etc/netprobe" not in contents


def test_install_serve_remove_purge(rootfs: Path) -> None:
    before = _snapshot(rootfs)
    _in_root(rootfs, "dpkg", "-i", "/tmp/netprobe-meter.deb")

    # the system user, and the secret only it (and root) may read
    passwd = (rootfs / "etc/passwd").read_text()
    user = re.search(r"^netprobe:x:(\d+):(\d+):[^:]*:([^:]*):([^:\n]*)$", passwd, re.M)
    assert user, passwd
    assert int(user[1]) < 1000 and user[4] == "/usr/sbin/nologin"
    secret = rootfs / "etc/netprobe/secret"
    st = secret.stat()
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_uid == 0 and st.st_gid == int(user[2])
    assert re.fullmatch(r"[0-9a-f]{64}\n", secret.read_text())

    # the compiled core, on the clean host (no compiler there): not the pure-Python path
    version = _in_root(rootfs, "netprobe", "--version").stdout
    assert re.fullmatch(r"netprobe \S+ \(data path: c, Python 3\.\d+\.\d+\)\n", version), version

    # The server from the unit, on a free port set where an operator sets it, and the
    # iperf3 listener (off as shipped) asked for there too.
    port, iperf3_port = free_port(), free_port()
    default = rootfs / "etc/default/netprobe"
    shipped = [x for x in default.read_text().splitlines() if x.startswith("NETPROBE_")]
    assert shipped == ['NETPROBE_SERVER_ARGS="--secret-file /etc/netprobe/secret"']
    default.write_text(default.read_text().replace(
        'NETPROBE_SERVER_ARGS="',
        f'NETPROBE_SERVER_ARGS="-p {port} --iperf3 --iperf3-port {iperf3_port} '))
    argv, settings = _unit_command(rootfs)
    assert argv == ["/opt/netprobe/bin/netprobe", "server", "-p", str(port), "--iperf3",
                    "--iperf3-port", str(iperf3_port), "--secret-file", "/etc/netprobe/secret"]
    assert (settings["User"], settings["Group"]) == ("netprobe", "netprobe")
    as_user = ["setpriv", f"--reuid={settings['User']}", f"--regid={settings['Group']}",
               "--init-groups", "--"]
    iperf3 = shutil.which("iperf3")
    server = subprocess.Popen(_chroot_argv(rootfs, *as_user, *argv), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        _wait_serving(server, port)
        _wait_serving(server, iperf3_port)
        refused = _client("127.0.0.1", "-p", str(port), "-t", "1", "-J")
        served = _client("127.0.0.1", "-p", str(port), "-t", "1", "-J",
                         "--secret-file", str(secret))
        stock = (subprocess.run([iperf3, "-c", "127.0.0.1", "-p", str(iperf3_port), "-t",
                                 "1", "-J"], capture_output=True, text=True, timeout=60)
                 if iperf3 else None)
    finally:
        server.send_signal(signal.SIGTERM)
        log, _ = server.communicate(timeout=20)
    assert served.returncode == 0, served.stderr + log
    result = json.loads(served.stdout)
    assert result["status"] == "ok"
    assert result["summaries"][0]["receiver"]["bytes"] > 0
    assert refused.returncode != 0 and "secret" in refused.stderr.lower(), refused.stderr
    if stock is not None:  # a stock iperf3 client, served by the packaged server
        assert stock.returncode == 0, stock.stdout[-800:] + log
        assert json.loads(stock.stdout)["end"]["sum_received"]["bytes"] > 0
    assert server.returncode == 0, log
    # the secret the package made is in force: the server said so, and refused the other
    assert "shared secret: required" in log
    assert re.search(r" refused 127\.0\.0\.1:\d+: no shared secret", log), log

    # remove keeps the configuration (the edited conffile, the secret), and only that
    _in_root(rootfs, "dpkg", "-r", "netprobe-meter")
    after_remove = _snapshot(rootfs)
    left = {p for p in after_remove if p not in before}
    assert left == {"etc/default/netprobe", "etc/netprobe", "etc/netprobe/secret"}
    # and the user, which purge removes (files it owned could outlive the package)
    accounts = ("etc/passwd", "etc/group", "etc/shadow", "etc/gshadow")
    assert all("\nnetprobe:" in (rootfs / a).read_text() for a in accounts)
    assert ({p: v for p, v in after_remove.items() if p in before and p not in accounts}
            == {p: v for p, v in before.items() if p not in accounts})

    _in_root(rootfs, "dpkg", "-P", "netprobe-meter")
    assert _snapshot(rootfs) == before
    assert "netprobe" not in (rootfs / "etc/passwd").read_text()
    assert "netprobe" not in (rootfs / "etc/group").read_text()


def test_upgrade_keeps_the_secret_and_the_operators_edits(rootfs: Path) -> None:
    _in_root(rootfs, "dpkg", "-i", "/tmp/netprobe-meter.deb")
    secret = (rootfs / "etc/netprobe/secret").read_bytes()
    default = rootfs / "etc/default/netprobe"
    edited = default.read_text().replace('ARGS="', 'ARGS="--allow 10.0.0.0/8 ')
    default.write_text(edited)
    _in_root(rootfs, "dpkg", "-i", "/tmp/netprobe-meter.deb")
    assert (rootfs / "etc/netprobe/secret").read_bytes() == secret
    assert default.read_text() == edited
    group = re.search(r"^netprobe:x:(\d+):", (rootfs / "etc/group").read_text(), re.M)
    assert group and (rootfs / "etc/netprobe/secret").stat().st_gid == int(group[1])
    assert (rootfs / "etc/passwd").read_text().count("\nnetprobe:") == 1


def test_the_packaged_unit_is_the_shipped_one_run_as_the_user(deb: Path, tmp_path: Path) -> None:
    """deploy/systemd's unit is the single source: the package changes only the command's
    path and the user, so its sandbox (and the filter tests/test_unit_filter.py runs the
    server under) is the same; and it verifies and scores as that unit does."""
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path / "pkg")], check=True)
    packaged = (tmp_path / "pkg" / UNIT).read_text().splitlines()
    shipped = (ROOT / "deploy/systemd/netprobe-server.service").read_text().splitlines()
    body = shipped[shipped.index("") + 1:]  # the shipped unit's how-to-install header goes
    expected = [line.replace("=/usr/bin/netprobe ", "=/opt/netprobe/bin/netprobe ")
                if line.startswith("ExecStart=") else line for line in body]
    at = expected.index("DynamicUser=yes")
    expected[at:at + 1] = ["User=netprobe", "Group=netprobe"]
    assert packaged[packaged.index("") + 1:] == expected
    if shutil.which("systemd-analyze") is None:
        return
    # verify checks that ExecStart's program exists: point it at this netprobe
    local = tmp_path / "netprobe-server.service"
    local.write_text((tmp_path / "pkg" / UNIT).read_text().replace(
        "/opt/netprobe/bin/netprobe", f"{sys.executable} -m netprobe"))
    done = subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0 and local.name not in done.stderr, done.stderr
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(local)],
                          capture_output=True, text=True, timeout=60, check=False)
    found = re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout)
    assert found and float(found[1]) <= 2.0, done.stdout + done.stderr
