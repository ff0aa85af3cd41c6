"""deploy/openwrt: the procd init script's command line with the shipped UCI config starts a
real server on loopback that applies the config's limits; a bad UCI file is one line
naming the file and line (exit 2), never a traceback; and the feed Makefile's file lists
and dependencies match what the wheel installs and what the server imports.

No OpenWrt userland here (procd, uci, /lib/functions.sh): the init script runs under dash
with procd's calls recorded and OpenWrt's config_* functions answering from the test, so
what is tested of it is its shell and what it hands procd; what the config MEANS is read
by netprobe itself (``netprobe server --uci``), and that part runs for real.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from netprobe.cli.exitcodes import UsageError
from netprobe.errors import ParseError
from tests.budget import FRACTION
from tests.servers import free_port, wait_listening

ROOT = Path(__file__).resolve().parent.parent
OPENWRT = ROOT / "deploy" / "openwrt"
INIT = OPENWRT / "files" / "netprobe.init"
SHIPPED = OPENWRT / "files" / "netprobe.config"
CONFIG_ON_ROUTER = "/etc/config/netprobe"

needs_package_files = pytest.mark.skipif(not INIT.is_file(),
                                         reason="needs the source checkout (deploy/openwrt)")


# --- the init script, under a POSIX shell -------------------------------------------------

# procd's and OpenWrt's functions as the test's recorders: each procd call is one line of
# NUL-separated words in $NP_CALLS; config_get_bool answers $NP_ENABLED for every section.
_HARNESS = r"""
record() { printf '%s\0' "$@" >> "$NP_CALLS"; printf '\n' >> "$NP_CALLS"; }
procd_open_instance() { record procd_open_instance "$@"; }
procd_set_param() { record procd_set_param "$@"; }
procd_close_instance() { record procd_close_instance "$@"; }
procd_add_reload_trigger() { record procd_add_reload_trigger "$@"; }
config_load() { record config_load "$@"; }
config_foreach() { "$1" main; }
config_get_bool() { eval "$1=\$NP_ENABLED"; }
. "$NP_INIT"
start_service
service_triggers
"""


def _run_init(tmp_path: Path, enabled: str) -> list[list[str]]:
    """The init script's start_service and service_triggers under dash: procd's calls."""
    dash = shutil.which("dash") or pytest.skip("dash is not installed")
    calls = tmp_path / "calls"
    calls.write_bytes(b"")
    done = subprocess.run([dash, "-c", _HARNESS], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "NP_CALLS": str(calls),
                               "NP_INIT": str(INIT), "NP_ENABLED": enabled})
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return [line.split("\0")[:-1] for line in calls.read_text().split("\n") if line]


def _init_command(tmp_path: Path) -> list[str]:
    """The command line the init script gives procd for the instance."""
    calls = _run_init(tmp_path, "1")
    (command,) = [c[2:] for c in calls if c[:2] == ["procd_set_param", "command"]]
    return command


@needs_package_files
def test_init_script_hands_procd_the_uci_command_line(tmp_path: Path) -> None:
    calls = _run_init(tmp_path, "1")
    assert calls[0] == ["config_load", "netprobe"]
    assert _init_command(tmp_path) == ["/usr/bin/netprobe", "server", "--uci",
                                       CONFIG_ON_ROUTER]
    params = {c[1]: c[2:] for c in calls if c[0] == "procd_set_param"}
    assert params["respawn"] == []
    assert params["file"] == [CONFIG_ON_ROUTER]  # a changed config restarts the server
    assert params["stdout"] == ["1"] and params["stderr"] == ["1"]  # to logd
    names = [c[0] for c in calls]
    assert names.index("procd_open_instance") < names.index("procd_close_instance")
    assert ["procd_add_reload_trigger", "netprobe"] in calls
    text = INIT.read_text()
    assert text.startswith("#!/bin/sh /etc/rc.common\n")
    assert re.search(r"^USE_PROCD=1$", text, re.M) and re.search(r"^START=\d+$", text, re.M)


@needs_package_files
def test_init_script_starts_nothing_when_disabled(tmp_path: Path) -> None:
    calls = _run_init(tmp_path, "0")
    assert not [c for c in calls if c[0].startswith("procd_") and "instance" in c[0]]


# --- the command line with the shipped config, on loopback --------------------------------


def _netprobe() -> str:
    found = shutil.which("netprobe", path=str(Path(sys.executable).parent))
    assert found is not None
    return found


def _argv(tmp_path: Path, config: Path) -> list[str]:
    """The init script's command line, the router's paths replaced by this host's: the
    console script's and the config file's, nothing else."""
    argv = _init_command(tmp_path)
    assert argv[0] == "/usr/bin/netprobe"
    return [_netprobe(), *(str(config) if a == CONFIG_ON_ROUTER else a for a in argv[1:])]


def _variant(tmp_path: Path, port: int, secret: Path | None = None,
             drop: tuple[str, ...] = (), add: tuple[str, ...] = ()) -> Path:
    """The shipped config as an owner would change it: enabled, the secret where the test
    made it, the port the test chose; lines containing ``drop`` removed, ``add`` appended."""
    text = SHIPPED.read_text()
    for old, new in (("option enabled '0'", "option enabled '1'"),
                     ("option port '5301'", f"option port '{port}'"),
                     ("'/etc/netprobe/secret'", f"'{secret}'")):
        assert old in text, old  # the shipped file still says what this test changes
        text = text.replace(old, new)
    lines = [x for x in text.splitlines() if not any(d in x for d in drop)]
    path = tmp_path / "netprobe.uci"
    path.write_text("\n".join([*lines, *add]) + "\n")
    return path


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "secret"
    secret.write_text("a router's secret, made as the config file says\n")
    secret.chmod(0o600)
    return secret


def _client(port: int, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "netprobe", "run", "127.0.0.1", "-p",
                           str(port), "--json", *extra], capture_output=True, text=True,
                          timeout=60)


class _Server:
    """The server started from ``argv`` (its output in a file), stopped by its PID."""

    def __init__(self, argv: list[str], port: int, log: Path,
                 env: dict[str, str] | None = None) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_listening(port)
        except AssertionError:
            self.stop()
            raise AssertionError(log.read_text()) from None

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        return self.log.read_text()


@needs_package_files
def test_shipped_config_is_off(tmp_path: Path) -> None:
    done = subprocess.run(_argv(tmp_path, SHIPPED), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    line = next(n for n, x in enumerate(SHIPPED.read_text().splitlines(), 1)
                if "option enabled" in x)
    assert done.stderr == (f"netprobe: error: {SHIPPED}:{line}: option enabled '0': this "
                           "server is disabled (set enabled '1' to start it)\n")


@needs_package_files
def test_shipped_config_enabled_without_the_secret_does_not_start(tmp_path: Path) -> None:
    # enabling it before making the secret: the server refuses to run without one
    config = _variant(tmp_path, free_port(), tmp_path / "not-made-yet")
    done = subprocess.run(_argv(tmp_path, config), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert re.fullmatch(rf"netprobe: error: {re.escape(str(config))}:\d+: option "
                        r"secret_file '.*not-made-yet': cannot read the secret file .*\n",
                        done.stderr)


@needs_package_files
def test_shipped_config_serves_within_its_limits(tmp_path: Path) -> None:
    port, secret = free_port(), _secret(tmp_path)
    server = _Server(_argv(tmp_path, _variant(tmp_path, port, secret)), port,
                     tmp_path / "server.log")
    try:
        ok = _client(port, "-t", "0.5", "--secret-file", str(secret))
        too_long = _client(port, "-t", "61", "--secret-file", str(secret))
        too_wide = _client(port, "-t", "0.5", "-P", "9", "--secret-file", str(secret))
        no_secret = _client(port, "-t", "0.5")
    finally:
        log = server.stop()
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert result["status"] == "ok" and result["summaries"][0]["receiver"]["bytes"] > 0
    # what the start line says this server enforces is the config's
    assert "tests at once 1, streams 8 in all" in log and "duration 60 s" in log
    assert "memory 16.0 MiB" in log and "shared secret: required" in log
    assert "clients: 127.0.0.0/8, ::1/128, 10.0.0.0/8, 172.16.0.0/12" in log
    assert too_long.returncode != 0 and "limit of 60 s" in too_long.stderr
    assert too_wide.returncode != 0 and "limit of 8" in too_wide.stderr
    assert no_secret.returncode != 0 and "secret" in no_secret.stderr
    assert log.count("test ended ok") == 1


@needs_package_files
def test_allow_list_of_the_config_refuses_others(tmp_path: Path) -> None:
    # only the LAN's network allowed (the loopback lines gone): loopback is refused even
    # with the secret, before anything else
    port, secret = free_port(), _secret(tmp_path)
    config = _variant(tmp_path, port, secret, drop=("list allow",),
                      add=("\tlist allow '192.168.1.0/24'",))
    server = _Server(_argv(tmp_path, config), port, tmp_path / "server.log")
    try:
        refused = _client(port, "-t", "0.5", "--secret-file", str(secret))
    finally:
        log = server.stop()
    assert refused.returncode != 0
    assert "clients: 192.168.1.0/24;" in log
    assert "test ended" not in log and "(--allow)" in log


def _server_args(*words: str) -> argparse.Namespace:
    from netprobe.cli.main import build_parser

    return build_parser(only="server").parse_args(["server", *words])


def _apply(args: argparse.Namespace) -> None:
    from netprobe.cli.commands.server import _check_options
    from netprobe.cli.uciargs import apply_uci

    apply_uci(args, args.uci_actions, _check_options)


@needs_package_files
def test_the_command_line_wins_over_the_file(tmp_path: Path) -> None:
    config = _variant(tmp_path, 6000, _secret(tmp_path))
    args = _server_args("--uci", str(config), "--max-duration", "5", "--allow", "10.1.0.0/16")
    _apply(args)
    assert args.max_duration_s == 5  # given here
    assert args.allow == ["10.1.0.0/16"]  # a list given here replaces the file's
    assert args.port == 6000 and args.max_streams == 8  # not given here: the file's
    assert args.max_memory_bytes == 16 * 1024 * 1024


# --- bad UCI: one line, file and line, exit 2 -----------------------------------------------

_BAD = [
    ("config server\n\toption max_duration 'soon'\n", 2, "option max_duration 'soon'"),
    ("config server\n\toption max_memmory '1M'\n", 2, "did you mean max_memory?"),
    ("config server\n\toption port '70000'\n", 2, "port number"),
    ("config server\n\tlist allow '10.0.0.0/8'\n\tlist allow 'lan'\n", 3, "bad --allow"),
    ("config server\n\toption bind '192.0.2.1'\n", 2, "not an address of this host"),
    ("config server\n\toption log_format 'xml'\n", 2, "must be one of"),
    ("config server\n\tlist port '1'\n", 2, "not a list"),
    ("config server\n\toption iperf3 'maybe'\n", 2, "must be '1' or '0'"),
    ("config server\n\toption enabled 'perhaps'\n", 2, "must be '1' or '0'"),
    ("config server\n\toption max_tests '2\n", 2, "unterminated"),
    ("config server\n\toption max_tests\n", 2, "expected option KEY"),
    ("option port '1'\n", 1, "before any config section"),
    ("config sever\n", 1, "netprobe reads only config server"),
    ("config server\nconfig server\n", 2, "a second config server"),
    ("config server\n\toption bind ''\n", 2, "is empty"),
    ("config server\n\tport '1'\n", 2, "expected config, option or list"),
    ("config server\n\toption max-tests '1'\n", 2, "is not a name"),
    ("config server\n\toption secret_file '/nonexistent/secret'\n", 2, "cannot read"),
    ("config server\n\toption port '1' '2'\n", 2, "expected option KEY"),
    ("config server\n\toption uci '/etc/config/other'\n", 2, "unknown option 'uci'"),
]


@pytest.mark.parametrize(("text", "line", "says"), _BAD,
                         ids=[f"{n}-{says.split()[0]}" for n, (_, _, says) in enumerate(_BAD)])
def test_bad_uci_is_one_line_naming_file_and_line(tmp_path: Path, text: str, line: int,
                                                  says: str) -> None:
    config = tmp_path / "netprobe"
    config.write_text(text)
    done = subprocess.run([_netprobe(), "server", "--uci", str(config), "-B", "127.0.0.1",
                           "-p", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith(f"netprobe: error: {config}:{line}: "), done.stderr
    assert says in done.stderr and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize(("data", "says"), [
    (b"# " + b"x" * 70_000 + b"\n", "larger than 65536 bytes"),
    (b"config server\n\toption bind '\xff'\n", ":2: not UTF-8 text"),
    (b"config server\n\toption bind \x01\n", "control character"),
    (b"", "no config server section"),
])
def test_files_that_are_not_uci_are_refused(tmp_path: Path, data: bytes, says: str) -> None:
    config = tmp_path / "netprobe"
    config.write_bytes(data)
    done = subprocess.run([_netprobe(), "server", "--uci", str(config), "-B", "127.0.0.1",
                           "-p", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"netprobe: error: {config}") and says in done.stderr


# No "bind" among them: its check resolves the name, and a fuzz must not ask a resolver.
_WORDS = ["config", "server", "option", "list", "package", "enabled", "port", "allow",
          "max_tests", "max_duration", "max_memory", "iperf3", "secret_file",
          "'1'", "'0'", "'60'", "'16M'", "'10.0.0.0/8'", '"x\\"y"', "'", '"', "#", "''",
          "main", "a'b'", "-1", "1e9", "\t", "é", "\x01", "max_streams", "log_format"]


def test_random_uci_text_never_tracebacks(tmp_path: Path) -> None:
    # Bounded fuzz of the parser and the options glue (everything --uci runs before the
    # server listens): every outcome is a value or one of the two one-line errors.
    from netprobe.uci import parse

    rng = random.Random(38)
    config = tmp_path / "netprobe"
    outcomes = {"ok": 0, "ParseError": 0, "UsageError": 0}
    for _ in range(max(40, int(400 * FRACTION))):  # a fifth under emulation
        lines = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 4)))
                 for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.7:
            lines.insert(0, "config server")
        text = "\n".join(lines)
        try:
            parse(text, "fuzz")
            config.write_text(text)
            _apply(_server_args("--uci", str(config)))
            outcomes["ok"] += 1
        except (ParseError, UsageError) as exc:
            assert "\n" not in str(exc)
            outcomes[type(exc).__name__] += 1
    assert outcomes["ParseError"] > 0 and outcomes["ok"] > 0  # both paths were reached


# --- the server's run-time needs, as the Makefile states them -------------------------------

# PyPI requirement (the wheel's Requires-Dist) -> the packages feed's package for it.
PYPI_TO_OPENWRT = {"cffi": "python3-cffi", "attrs": "python3-attrs"}
# Requirements the package leaves out, and why (the Makefile's comment says the same):
NOT_FOR_THE_SERVER = {
    "stevedore": "the tool registry: client commands only (measured below)",
    "rich": "tables and progress: client commands only (measured below)",
    "tomli": "only for Pythons before 3.11; OpenWrt's python3 is newer",
}
# Standard-library modules python3-light leaves out -> the package that has them (the
# feed's lang/python/python3/files/python3-package-*.mk).
STDLIB_SPLIT = {"asyncio": "python3-asyncio", "ctypes": "python3-ctypes",
                "dbm": "python3-dbm", "decimal": "python3-decimal", "email": "python3-email",
                "logging": "python3-logging", "lzma": "python3-lzma",
                "multiprocessing": "python3-multiprocessing", "curses": "python3-ncurses",
                "ssl": "python3-openssl", "pydoc": "python3-pydoc",
                "readline": "python3-readline", "sqlite3": "python3-sqlite3",
                "unittest": "python3-unittest", "urllib": "python3-urllib",
                "uuid": "python3-uuid", "xml": "python3-xml", "venv": "python3-venv"}
# Imported only where present, by the standard library itself (shutil: lzma).
OPTIONAL_STDLIB = {"lzma"}


def _makefile() -> str:
    return (OPENWRT / "Makefile").read_text()


def _depends() -> set[str]:
    (text,) = re.findall(r"^\s*DEPENDS:=((?:.*\\\n)*.*)$", _makefile(), re.M)
    return {word.lstrip("+") for word in text.split() if word != "\\"}


@needs_package_files
def test_server_runs_without_the_requirements_the_package_leaves_out(tmp_path: Path) -> None:
    # The server as the package installs it: stevedore and rich cannot be imported. It
    # serves a test (with the iperf3 service started too, as option iperf3 '1' would);
    # which split-off standard-library modules it imported is measured.
    port, secret = free_port(), _secret(tmp_path)
    config = _variant(tmp_path, port, secret)
    script = ("import sys\n"
              f"for name in {sorted(NOT_FOR_THE_SERVER)!r}: sys.modules[name] = None\n"
              "from netprobe.cli.main import main\n"
              f"code = main(['server', '--uci', {str(config)!r}, '-1', '--iperf3', "
              f"'--iperf3-port', '{free_port()}'])\n"
              "print('IMPORTED', sorted({m.split('.')[0] for m, v in sys.modules.items() "
              "if v is not None}))\n"
              "sys.exit(code)\n")
    server = _Server([sys.executable, "-c", script], port, tmp_path / "server.log")
    try:
        ok = _client(port, "-t", "0.5", "--secret-file", str(secret))
        server.proc.wait(30)
    finally:
        log = server.stop()
    assert ok.returncode == 0, ok.stderr
    assert server.proc.returncode == 0, log
    (imported,) = [json.loads(x.split(" ", 1)[1].replace("'", '"'))
                   for x in log.splitlines() if x.startswith("IMPORTED ")]
    needed = {STDLIB_SPLIT[m] for m in imported if m in STDLIB_SPLIT and
              m not in OPTIONAL_STDLIB}
    stated = _depends() & set(STDLIB_SPLIT.values())
    assert needed == stated, f"imported {sorted(needed)}, the Makefile says {sorted(stated)}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel of this checkout, built as a user's pip builds it (isolated)."""
    if not (ROOT / "setup.py").is_file() or not INIT.is_file():
        pytest.skip("needs the source checkout")
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                           str(out), str(ROOT)], capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = out.glob("netprobe_meter-*.whl")
    return zipfile.ZipFile(built)


def _metadata(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}")]
    return wheel.read(path).decode()


@pytest.mark.slow
def test_makefile_names_the_wheel(wheel: zipfile.ZipFile) -> None:
    metadata = _metadata(wheel, "METADATA")
    variables = dict(re.findall(r"^(\w+):=(.*)$", _makefile(), re.M))
    assert f"\nName: {variables['PYPI_NAME']}\n" in metadata
    assert f"\nVersion: {variables['PKG_VERSION']}\n" in metadata
    # the sdist's file name (PEP 625): the normalised name
    assert variables["PYPI_SOURCE_NAME"] == variables["PYPI_NAME"].replace("-", "_")


@pytest.mark.slow
def test_makefile_file_lists_match_the_wheel(wheel: zipfile.ZipFile) -> None:
    record = [line.split(",", 1)[0] for line in _metadata(wheel, "RECORD").splitlines()]
    text = _makefile()
    (filespec,) = re.findall(r"define Py3Package/netprobe/filespec\n(.*?)\nendef", text, re.S)
    for line in filespec.splitlines():
        action, path = line.split("|")[:2]
        assert action in "+-=", line
        inside = path.replace("$(PYTHON3_PKG_DIR)", "").strip("/")
        assert inside == "" or any(f == inside or f.startswith(inside + "/") for f in record), \
            f"{line}: nothing of the wheel is at {inside}"
    (install,) = re.findall(r"define Py3Package/netprobe/install\n(.*?)\nendef", text, re.S)
    # the console script the install section copies is one the wheel makes
    scripts = _metadata(wheel, "entry_points.txt").split("[console_scripts]")[1]
    for script in re.findall(r"\$\(PKG_INSTALL_DIR\)/usr/bin/(\S+)", install):
        assert re.search(rf"^{re.escape(script)} = ", scripts, re.M), script
    # the package's own files exist, and are where the init script looks for them
    files = re.findall(r"\./files/(\S+) \$\(1\)(\S+)", install)
    assert {name for name, _ in files} == {p.name for p in (OPENWRT / "files").iterdir()}
    installed = dict(files)
    assert installed["netprobe.init"] == "/etc/init.d/netprobe"
    assert installed["netprobe.config"] == CONFIG_ON_ROUTER
    assert re.search(rf"^CONFIG={re.escape(CONFIG_ON_ROUTER)}$", INIT.read_text(), re.M)
    assert CONFIG_ON_ROUTER in text.split("conffiles", 1)[1].split("endef", 1)[0]


@pytest.mark.slow
def test_every_dependency_is_a_requirement_of_the_wheel(wheel: zipfile.ZipFile) -> None:
    requires = {re.split(r"[\s;<>=!~\[]", line.split(": ", 1)[1], maxsplit=1)[0].lower()
                for line in _metadata(wheel, "METADATA").splitlines()
                if line.startswith("Requires-Dist: ") and "extra ==" not in line}
    assert requires == set(PYPI_TO_OPENWRT) | set(NOT_FOR_THE_SERVER)
    for package in _depends() - {"python3-light"}:
        assert package in PYPI_TO_OPENWRT.values() or package in STDLIB_SPLIT.values(), \
            f"{package}: no requirement of the wheel and no part of the standard library"
    assert set(PYPI_TO_OPENWRT.values()) <= _depends()
    for name in NOT_FOR_THE_SERVER:
        assert name in _makefile()  # the Makefile says why it is left out


# --- the musl userland ---------------------------------------------------------------------

MUSL_CACHE = Path(os.environ.get("NETPROBE_MUSL_CACHE", "/var/cache/netprobe-musl"))


def _musl_python() -> Path | None:
    """The musl CPython scripts/musl-check builds for this machine's architecture."""
    found = sorted(MUSL_CACHE.glob(f"python-{os.uname().machine}-*/bin/python3.11"))
    return found[-1] if found else None


def _pure_site(tmp_path: Path) -> Path:
    """This checkout's netprobe without its compiled core (built for glibc here), and
    attrs (pure Python), the one requirement the server imports on the pure path."""
    import attr
    import attrs

    site = tmp_path / "site"
    shutil.copytree(ROOT / "netprobe", site / "netprobe",
                    ignore=shutil.ignore_patterns("_core*", "__pycache__"))
    for module in (attr, attrs):
        shutil.copytree(Path(module.__file__).parent, site / module.__name__,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return site


@needs_package_files
def test_shipped_config_in_the_musl_userland(tmp_path: Path) -> None:
    # What a MIPS router runs: the init script's command line, the shipped config (enabled,
    # a secret, a free port), on a musl CPython, on the pure-Python data path.
    python = _musl_python()
    if python is None:
        pytest.skip(f"no musl CPython for {os.uname().machine} in {MUSL_CACHE} yet "
                    "(scripts/musl-check builds it)")
    port, secret = free_port(), _secret(tmp_path)
    argv = _argv(tmp_path, _variant(tmp_path, port, secret))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(_pure_site(tmp_path)),
           "PYTHONDONTWRITEBYTECODE": "1"}
    # -S: only the site given here (a host interpreter's .pth finders would come first)
    server = _Server([str(python), "-S", "-m", "netprobe", *argv[1:]], port,
                     tmp_path / "server.log", env)
    try:
        ok = _client(port, "-t", "0.5", "--secret-file", str(secret))
        too_long = _client(port, "-t", "61", "--secret-file", str(secret))
    finally:
        log = server.stop()
    assert ok.returncode == 0, ok.stderr + log
    assert too_long.returncode != 0 and "limit of 60 s" in too_long.stderr
    assert "duration 60 s" in log and "memory 16.0 MiB" in log
    version = subprocess.run([str(python), "-S", "-m", "netprobe", "--version"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert "data path: python" in version.stdout, version.stdout + version.stderr


def test_docs_table_names_every_uci_option() -> None:
    # the table in docs/openwrt.md is written by hand: every option the server takes from
    # a UCI file must be in it, and nothing that it does not take
    from netprobe.cli.uciargs import _options_by_key

    docs = ROOT / "docs" / "openwrt.md"
    if not docs.is_file():
        pytest.skip("needs the source checkout (docs/)")
    rows = re.findall(r"^\| `(\w+)` \| (?:option|flag|list) \|", docs.read_text(), re.M)
    keys = set(_options_by_key(_server_args().uci_actions))
    missing, stale = (keys | {"enabled"}) - set(rows), set(rows) - keys - {"enabled"}
    assert not missing, f"add rows to the options table of docs/openwrt.md: {sorted(missing)}"
    assert not stale, f"docs/openwrt.md names options the server lacks: {sorted(stale)}"
