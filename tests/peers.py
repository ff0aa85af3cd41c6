"""Where the tests find the peer tools and their saved outputs.

Two versions of each driven tool are tested live where both are here: the one on PATH (on
Debian: iperf3 3.12, iperf 2.1.8, nuttcp 6.1.2) and the one ``shared/peers/build.sh``
built from upstream source (iperf3 3.21, nuttcp 8.2.2, ntttcp 1.4.3), found in
``$NETPROBE_PEERS_BIN`` (scripts/test sets it) or in build.sh's default folder.
``peer_params(tool)`` gives one pytest parameter per version, each skipped with the reason
when its binary is absent; a test selects its binary by setting the tool's environment
variable (``PeerBinary.env``), which also reaches the processes a test starts.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from netprobe.driven.process import find_binary
from netprobe.plugin import Tool
from netprobe.testing import RecordingReporter


def _shared_dir() -> Path | None:
    """shared/ beside the repository or beside any folder above it (a CI clone has it
    beside the repository; a worktree in /work/wt/NAME has it two levels up)."""
    for parent in Path(__file__).resolve().parents[1:]:
        if (parent / "shared").is_dir():
            return parent / "shared"
    return None


SHARED = _shared_dir()
PEER_FIXTURES = (SHARED or Path("/nonexistent/shared")) / "fixtures" / "peers"
needs_fixtures = pytest.mark.skipif(
    not PEER_FIXTURES.is_dir(), reason=f"peer fixtures not found at {PEER_FIXTURES}"
)
"""Marks a test that reads the saved peer outputs (skipped without shared/)."""


def fixture_files(pattern: str) -> list[Path]:
    """The saved peer outputs matching ``pattern``, sorted (none without shared/)."""
    return sorted(PEER_FIXTURES.glob(pattern)) if PEER_FIXTURES.is_dir() else []


def read_fixture(name: str) -> str:
    """The text of the saved peer output ``name``; the test is skipped without it."""
    path = PEER_FIXTURES / name
    if not path.exists():
        pytest.skip(f"fixture {name} not found")
    return path.read_text()


def run_recorded(tool: Tool, spec: Any) -> tuple[Any, RecordingReporter]:
    """Run ``spec`` on ``tool`` with a reporter that keeps every interval and note."""
    recorder = RecordingReporter()
    return tool.run(spec, recorder), recorder


BUILT_BIN = Path(
    os.environ.get("NETPROBE_PEERS_BIN")
    or Path.home() / ".cache" / "netprobe-peers" / "bin"
)

# Every stock iperf3 the wire-protocol tests meet: Debian's on PATH (3.12) and those
# build.sh builds beside 3.21 for the protocol's changes from 3.9 on.
STOCK_IPERF3 = {"3.9": BUILT_BIN / "iperf3-3.9",
                "3.12": Path(shutil.which("iperf3") or "/nonexistent"),
                "3.16": BUILT_BIN / "iperf3-3.16", "3.17.1": BUILT_BIN / "iperf3-3.17.1",
                "3.21": BUILT_BIN / "iperf3"}


def stock_iperf3(version: str) -> str:
    """The stock iperf3 binary of ``version`` (the test skips, saying why, without it)."""
    path = STOCK_IPERF3[version]
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.skip(f"iperf3 {version} not found at {path} (peers/build.sh builds it)")
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True,
                         timeout=10).stdout
    if f"iperf {version}" not in out:
        pytest.skip(f"{path} is not iperf3 {version}: {out.splitlines()[:1]}")
    return str(path)


# netprobe tool -> (binary on PATH, binary built by build.sh, environment variable)
_TOOLS = {
    "iperf3": ("iperf3", "iperf3", "NETPROBE_IPERF3"),
    "iperf2": ("iperf", None, "NETPROBE_IPERF2"),
    "nuttcp": ("nuttcp", "nuttcp8", "NETPROBE_NUTTCP"),
    "ntttcp": ("ntttcp", "ntttcp", "NETPROBE_NTTTCP"),
}


class PeerBinary(NamedTuple):
    """One installed version of a peer tool."""

    tool: str
    path: str
    version: str
    env_var: str

    def at_least(self, *version: int) -> bool:
        """Whether this binary's version is ``version`` (e.g. 3, 17) or newer."""
        numbers = tuple(int(n) for n in re.findall(r"\d+", self.version)[: len(version)])
        return numbers >= version

    @property
    def env(self) -> dict[str, str]:
        """The environment entry that makes netprobe (and its children) use this binary."""
        return {self.env_var: self.path}


def _tool_class(tool: str) -> type[Tool]:
    from netprobe.tools.iperf2 import Iperf2Tool
    from netprobe.tools.iperf3 import Iperf3Tool
    from netprobe.tools.ntttcp import NtttcpTool
    from netprobe.tools.nuttcp import NuttcpTool

    classes = {"iperf3": Iperf3Tool, "iperf2": Iperf2Tool, "nuttcp": NuttcpTool,
               "ntttcp": NtttcpTool}
    return classes[tool]  # type: ignore[return-value]


def _candidates(tool: str) -> dict[str, str | None]:
    """The default binary (as netprobe finds it: the tool's environment variable, then
    PATH) and the one build.sh built; the default is left out when it is the built one
    (scripts/test points $NETPROBE_NTTTCP at it): counted once, as "built"."""
    on_path, built, env_var = _TOOLS[tool]
    system = find_binary(on_path, None, env_var)
    built_path = str(BUILT_BIN / built) if built and (BUILT_BIN / built).is_file() else None
    if built is None:  # build.sh builds no such tool: nothing to find or miss
        return {"system": system}
    if system and Path(system).resolve().parent == BUILT_BIN.resolve():
        return {"built": built_path or system}
    return {"system": system, "built": built_path}


def built_by_build_sh(tool: str) -> bool:
    """Whether build.sh built ``tool`` here (its binary is in :data:`BUILT_BIN`)."""
    built = _TOOLS[tool][1]
    return built is not None and (BUILT_BIN / built).is_file()


def in_ci() -> bool:
    """Whether the suite runs in CI (``CI=true``, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def absent_peer(reason: str, tool: str) -> Any:
    """The mark of a parameter whose binary is absent: a skip with ``reason``, but in CI a
    failure when build.sh built the tool here, since then the binary is there and only the
    lookup missed it (CI once skipped every live ntttcp test so, without a word)."""
    return pytest.mark.peer_absent(reason=reason, fail=in_ci() and built_by_build_sh(tool))


def check_absent_peer(item: pytest.Item) -> None:
    """For conftest's ``pytest_runtest_setup``: skip (or, see :func:`absent_peer`, fail)
    a test parametrised with an absent peer binary."""
    for mark in item.iter_markers("peer_absent"):
        reason = mark.kwargs["reason"]
        if mark.kwargs["fail"]:
            pytest.fail(f"{reason}, but build.sh built it in {BUILT_BIN} (CI=true: a peer "
                        "built here must be found)", pytrace=False)
        pytest.skip(reason)


@functools.cache
def peer_binaries(tool: str) -> tuple[tuple[str, PeerBinary | str], ...]:
    """(flavour, PeerBinary or the reason it is absent) for the PATH and the built binary."""
    env_var = _TOOLS[tool][2]
    found: list[tuple[str, PeerBinary | str]] = []
    for flavour, path in _candidates(tool).items():
        if path is None:
            where = (f"on PATH or in ${env_var}" if flavour == "system"
                     else f"in {BUILT_BIN} (shared/peers/build.sh)")
            found.append((flavour, f"no {tool} binary {where}"))
            continue
        availability = _tool_class(tool)({"path": path}).probe()
        if not availability.available:
            found.append((flavour, f"{path}: {'; '.join(availability.reasons)}"))
            continue
        found.append((flavour, PeerBinary(tool, path, availability.version or "?", env_var)))
    return tuple(found)


def peer_params(tool: str) -> list[Any]:
    """pytest parameters, one per version of ``tool``: id TOOL-VERSION, or a skip."""
    params = []
    for flavour, found in peer_binaries(tool):
        if isinstance(found, PeerBinary):
            params.append(pytest.param(found, id=f"{tool}-{found.version}"))
        else:
            params.append(pytest.param(None, id=f"{tool}-{flavour}",
                                       marks=absent_peer(found, tool)))
    return params


def default_peer(tool: str) -> PeerBinary | None:
    """The binary a test that runs one version only uses: the PATH one, else the built."""
    for _, found in peer_binaries(tool):
        if isinstance(found, PeerBinary):
            return found
    return None


def tool_version_params(tools: tuple[str, ...]) -> list[Any]:
    """pytest parameters (tool, PeerBinary or None) for every version of every tool named:
    "native" once with None, each driven tool once per version found (or a skip)."""
    params = []
    for tool in tools:
        if tool not in _TOOLS:
            params.append(pytest.param(tool, None, id=tool))
            continue
        for one in peer_params(tool):
            params.append(pytest.param(tool, *one.values, id=one.id, marks=one.marks))
    return params


# -- iperf3 built WITH OpenSSL (build.sh builds every iperf3 --without-openssl) ------------

OPENSSL_PEERS = Path.home() / ".cache" / "netprobe-peers" / "openssl"
BUILD_TIMEOUT_S = 120  # configure + make of iperf3 3.21 take about 30 s on 2 CPUs


def _openssl_headers() -> bool:
    """Whether the C compiler finds OpenSSL's headers (libssl-dev on Debian)."""
    probe = subprocess.run(["cc", "-E", "-x", "c", "-"], input="#include <openssl/rsa.h>\n",
                           capture_output=True, text=True, timeout=30)
    return probe.returncode == 0


def _build_with_openssl(tarball: Path, dest: Path) -> str | None:
    """Build ``tarball``'s iperf3 with OpenSSL into ``dest``; None, or why it failed."""
    import tempfile

    # Static when OpenSSL's static libraries are here, as build.sh builds its peers.
    static = subprocess.run(["cc", "-print-file-name=libcrypto.a"], capture_output=True,
                            text=True, timeout=30).stdout.strip()
    flags = ["--enable-static-bin"] if os.path.isabs(static) else []
    with tempfile.TemporaryDirectory(prefix="iperf3-openssl-") as work:
        try:
            subprocess.run(["tar", "-xzf", str(tarball), "-C", work, "--strip-components=1"],
                           check=True, capture_output=True, timeout=60)
            # Its own process group, so a build over time is stopped whole (make's
            # children too), by the group's id.
            # (configure finds OpenSSL itself; the binary's --version is checked after.)
            build = subprocess.Popen(["sh", "-c", './configure --quiet --disable-shared "$@"'
                                      " && make -s -j2", "sh", *flags],
                                     cwd=work, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
            try:
                _, errors = build.communicate(timeout=BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(build.pid, 9)
                build.communicate(timeout=30)
                return f"building {tarball.name} with OpenSSL took over {BUILD_TIMEOUT_S} s"
        except (OSError, subprocess.SubprocessError) as exc:
            return f"cannot unpack {tarball.name}: {exc}"
        if build.returncode != 0:
            return f"building {tarball.name} with OpenSSL failed: {errors[-300:]!r}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_suffix(".partial")
        shutil.copy2(Path(work) / "src" / "iperf3", partial)
        os.replace(partial, dest)  # whole or absent, never half-copied
    return None


@functools.cache
def _iperf3_with_openssl(version: str) -> tuple[str | None, str]:
    """(path, "") of iperf3 ``version`` built with OpenSSL, or (None, why not)."""
    import fcntl
    import hashlib
    import time

    if SHARED is None:
        return None, "no shared/ beside the repository to build iperf3 with OpenSSL from"
    tarball = SHARED / "peers" / f"iperf-{version}.tar.gz"
    if not tarball.is_file():
        return None, f"no {tarball} to build iperf3 {version} with OpenSSL from"
    if shutil.which("cc") is None or shutil.which("make") is None:
        return None, "no C compiler or make to build iperf3 with OpenSSL"
    if not _openssl_headers():
        return None, "no OpenSSL headers (libssl-dev) to build iperf3 with OpenSSL"
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()[:16]
    dest = OPENSSL_PEERS / f"iperf3-{version}-{digest}" / "iperf3"
    OPENSSL_PEERS.mkdir(parents=True, exist_ok=True)
    with open(OPENSSL_PEERS / ".lock", "w") as lock:
        # One build at a time across test processes; the others wait, bounded, for it.
        deadline = time.monotonic() + BUILD_TIMEOUT_S + 30
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return None, f"another process held {OPENSSL_PEERS}/.lock too long"
                time.sleep(0.5)
        if not dest.is_file():
            failed = _build_with_openssl(tarball, dest)
            if failed:
                return None, failed
    out = subprocess.run([str(dest), "--version"], capture_output=True, text=True,
                         timeout=10).stdout
    if f"iperf {version}" not in out or "authentication" not in out:
        return None, f"{dest} is not iperf3 {version} with authentication: {out[:200]!r}"
    return str(dest), ""


def iperf3_with_openssl(version: str = "3.21") -> str:
    """Stock iperf3 ``version`` built with OpenSSL (once, cached under
    :data:`OPENSSL_PEERS` by the tarball's SHA-256) from shared/peers' source, for the
    live tests of RSA authentication with OAEP padding; the test skips, saying why,
    without the tarball, a compiler or OpenSSL's headers."""
    path, why = _iperf3_with_openssl(version)
    if path is None:
        pytest.skip(why)
    return path
