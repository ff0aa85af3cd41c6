"""Texts from a hostile far end or a saved file are data (issue 33 item 9): escaped for the
terminal (no raw ESC, CSI, OSC, C1 or bidi overrides), never rich markup, never matplotlib
mathtext, formula-safe in CSV. Real CLI processes: ``report`` on a saved file, ``tools
HOST`` and ``fleet status`` against a small real TCP server speaking the agent protocol."""
from __future__ import annotations

import csv
import io
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest

from netprobe.cli.textsafe import for_csv, for_terminal
from netprobe.convert import to_json
from netprobe.engine import protocol
from netprobe.schema import ToolInfo
from tests.servers import NETPROBE
from tests.test_cli import assert_one_error_line, child_env
from tests.test_formats import sample_result

HOSTILE = "=HYPERLINK(\"http://x.invalid\")[/][bold]x\x1b]0;pwn\x07\x1b[2J\x9b31m\u202e$\\foo{$"
"""Markup that crashes rich, an OSC title, a CSI clear, a C1 CSI, a bidi override and
mathtext that crashes matplotlib, behind a spreadsheet formula."""
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*NETPROBE, *args], capture_output=True, text=True, timeout=60,
                          env=child_env(COLUMNS="200"), cwd=cwd)


def _assert_inert(text: str) -> None:
    for raw in RAW:
        assert raw not in text, repr(text)
    assert "Traceback" not in text


def _saved(tmp_path: Path) -> Path:
    base = sample_result()
    hostile = attrs.evolve(base, tool=ToolInfo(HOSTILE, version=HOSTILE),
                           warnings=(HOSTILE,), errors=(HOSTILE,),
                           remote=attrs.evolve(base.remote, host=HOSTILE, address=HOSTILE))
    path = tmp_path / "hostile.json"
    path.write_text(to_json(hostile))
    return path


# --- the helpers -------------------------------------------------------------------------


def test_for_terminal_makes_every_control_visible() -> None:
    shown = for_terminal("a\x1b[2Jb\x9bc\u202ed\x00e\x7ff\u2066g")
    _assert_inert(shown)
    assert "\x00" not in shown and "\x7f" not in shown and "\u2066" not in shown
    assert shown == "a\\x1b[2Jb\\x9bc\\u202ed\\x00e\\x7ff\\u2066g"
    assert for_terminal("tab\tand\nline") == "tab\tand\nline"
    assert for_terminal("x\ny", one_line=True) == "x\\ny"


def test_for_csv_defuses_formulas_only() -> None:
    for text in ("=1+1", "+1", "-1+cmd", "@SUM(A1)", "\tx", "\rx"):
        assert for_csv(text) == "'" + text
    assert for_csv("native") == "native" and for_csv(-3.5) == -3.5 and for_csv(None) is None


# --- saved results through report --------------------------------------------------------


def test_report_shows_a_hostile_saved_result_as_data(tmp_path: Path) -> None:
    saved = _saved(tmp_path)
    done = _cli("report", str(saved))
    assert done.returncode == 0, done.stderr
    _assert_inert(done.stdout + done.stderr)
    assert "[/][bold]x" in done.stdout  # markup shown as it was written
    assert "\\x1b[2J" in done.stdout


def test_report_html_with_mathtext_and_markup_in_names(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="pip install 'netprobe-meter[charts]'")
    saved, page = _saved(tmp_path), tmp_path / "page.html"
    done = _cli("report", str(saved), "--html", str(page), "-q")
    assert done.returncode == 0, done.stderr
    _assert_inert(done.stdout + done.stderr)
    text = page.read_text()
    _assert_inert(text)
    assert "<bold>" not in text and "$\\foo{$" in text  # escaped HTML, mathtext as text


def test_report_csv_cells_are_formula_safe(tmp_path: Path) -> None:
    done = _cli("report", str(_saved(tmp_path)), "--format", "csv")
    assert done.returncode == 0, done.stderr
    rows = list(csv.reader(io.StringIO(done.stdout)))
    cells = [cell for row in rows[1:] for cell in row]
    assert cells and not any(cell[:1] in ("=", "+", "-", "@", "\t", "\r") for cell in cells
                             if not _number(cell))
    assert any(cell.startswith("'=HYPERLINK") for cell in cells)


def test_run_result_csv_file_is_formula_safe(tmp_path: Path) -> None:
    from netprobe.cli.formats import format_csv
    from netprobe.convert import from_json

    result = from_json(_saved(tmp_path).read_text())
    rows = list(csv.reader(io.StringIO(format_csv([result]))))
    assert rows[1][1].startswith("'=HYPERLINK") and rows[1][2].startswith("'=")


def _number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


# --- a hostile agent ---------------------------------------------------------------------


@contextmanager
def fake_agent(replies: dict[str, dict[str, Any]], connections: int = 4) -> Iterator[int]:
    """A real TCP server on loopback that speaks the agent protocol (hello, welcome, one
    request, one reply) and answers with ``replies[request type]``; serves at most
    ``connections`` connections, each within a bounded time."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    port = listener.getsockname()[1]

    def serve() -> None:
        for _ in range(connections):
            try:
                conn, _addr = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                try:
                    conn.recv(protocol.HELLO_BYTES, socket.MSG_WAITALL)
                    channel = protocol.Channel(conn)
                    channel.send({"type": "welcome", "version": protocol.VERSION,
                                  "auth": None, "challenge": None})
                    request = channel.recv(10)
                    channel.send(replies[request["type"]])
                except (OSError, KeyError, protocol.ProtocolError):
                    continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        listener.close()
        thread.join(15)


def test_tools_host_shows_a_hostile_tool_list_as_data() -> None:
    row = {"name": HOSTILE, "available": False, "version": HOSTILE, "reasons": [HOSTILE],
           "details": [HOSTILE]}
    with fake_agent({"tools": {"type": "tools", "tools": [row]}}, 1) as port:
        done = _cli("tools", "127.0.0.1", "--agent-port", str(port))
    assert done.returncode == 0, done.stderr
    _assert_inert(done.stdout + done.stderr)
    assert "[/]" in done.stdout


def test_tools_host_shows_a_hostile_refusal_as_data() -> None:
    with fake_agent({"tools": {"type": "error", "message": HOSTILE}}, 1) as port:
        done = _cli("tools", "127.0.0.1", "--agent-port", str(port))
    assert done.returncode != 0
    assert_one_error_line(done.stderr)
    _assert_inert(done.stdout + done.stderr)


def test_fleet_status_shows_a_hostile_status_as_data(tmp_path: Path) -> None:
    doing = {"kind": HOSTILE, "tool": HOSTILE, "peer": HOSTILE, "target": HOSTILE,
             "started": HOSTILE}
    status = {"type": "status", "state": "busy", "running": [doing], "slots": 1,
              "served": 3}
    with fake_agent({"status": status}, 2) as port:
        fleet = tmp_path / "fleet.toml"
        fleet.write_text(f'[agents.a]\naddress = "127.0.0.1"\nport = {port}\n'
                         f'[agents.b]\naddress = "127.0.0.1"\nport = {port}\n'
                         '[groups.g]\ntype = "list"\npairs = [["a", "b"]]\n')
        done = _cli("fleet", "status", str(fleet))
    assert done.returncode == 0, done.stderr
    _assert_inert(done.stdout + done.stderr)
    assert "[/]" in done.stdout


def test_fleet_run_progress_line_shows_a_far_end_error_as_data(
        capsys: Any) -> None:
    """``fleet run`` prints each pair's line as it ends; the error is the far end's."""
    from netprobe.archives import PairRecord
    from netprobe.cli.fleetview import FleetBar as _Bar

    bar = _Bar()
    try:
        bar.pair_done(PairRecord("run-1", "g[/]", 1, "a", "b", "2026-12-01T10:00:01.000+00:00",
                             "failed", HOSTILE))
        bar.note(HOSTILE)
    finally:
        bar.stop()
    err = capsys.readouterr().err
    _assert_inert(err)
    assert "g[/] 1: a -> b" in err and "failed: =HYPERLINK" in err


def test_the_consoles_escape_whatever_they_draw(capsys: Any) -> None:
    """The net under every view: a plain string printed on the CLI's consoles is neither
    markup nor a terminal escape (guards the hook into rich's rendering, too)."""
    from netprobe.cli.render import stderr_console, stdout_console

    stdout_console().print("a[/][bold]b\x1b[2J\u202ec")
    stderr_console().print("d\x9b31m:smile:")
    out, err = capsys.readouterr()
    _assert_inert(out + err)
    assert out == "a[/][bold]b\\x1b[2J\\u202ec\n" and err == "d\\x9b31m:smile:\n"
