"""A server-only install (OpenWrt's package: no rich, no stevedore) stops, helps and
refuses client commands cleanly: one line, never an internal error or a traceback."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from tests.servers import free_port

# The console script's entry with the client-only packages made unimportable.
_ENTRY = ("import sys\n"
          "for name in ('rich', 'stevedore'): sys.modules[name] = None\n"
          "sys.argv = ['netprobe', *sys.argv[1:]]\n"
          "from netprobe.cli.main import main\n"
          "sys.exit(main())\n")


def _netprobe(*words: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _ENTRY, *words], capture_output=True,
                          text=True, timeout=60)


def test_a_server_stopped_by_its_service_manager_ends_cleanly() -> None:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", _ENTRY, "server", "-B", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # the listening line: it serves
        assert "listening" in line, line
        time.sleep(0.2)
        server.send_signal(signal.SIGTERM)  # what procd and systemd send to stop it
        _, err = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, err
    assert err.strip() == "netprobe server: stopped"


def test_help_is_plain_text_without_rich() -> None:
    done = _netprobe("server", "--help")
    assert done.returncode == 0, done.stderr
    assert "--port" in done.stdout and "Traceback" not in done.stderr


def test_a_client_command_names_what_is_missing() -> None:
    done = _netprobe("run", "127.0.0.1", "-p", str(free_port()), "-t", "1")
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert "needs the Python module 'rich'" in line or "needs the Python module 'stevedore'" \
        in line, line
    assert "internal error" not in line
