"""``-o FILE`` in every command that writes one, and stdout failures: what is at the path
decides how it is written (netprobe.cli.outfile), the extension decides the format, the
path is checked before the test, and a result that cannot be written is exit 6.

Devices are made with mknod in the test's own directory (a copy of /dev/full and
/dev/null), never the system's: a regression here would otherwise replace /dev/null.
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from netprobe.cli.outfile import OutputError, check_target, choose_formats, write_text
from netprobe.convert import from_json
from netprobe.results.saved import read_results
from tests.test_cli import ReplayTool, assert_one_error_line, child_env, run_main


def _device(tmp_path: Path, name: str, minor: int) -> Path:
    """A character device in tmp_path: minor 3 is like /dev/null, 7 like /dev/full."""
    path = tmp_path / name
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    return path


def _is_char_device(path: Path) -> bool:
    return stat.S_ISCHR(os.lstat(path).st_mode)


def test_device_is_written_in_place_never_replaced(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    null = _device(tmp_path, "null", 3)
    code, out, err = run_main(capsys, "run", "--tool", "replay", "--json", "-o", str(null))
    assert code == 0, err
    assert _is_char_device(null)
    assert from_json(out).status == "ok"


def test_full_device_is_exit_6_and_stays_a_device(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    full = _device(tmp_path, "full", 7)
    code, out, err = run_main(capsys, "run", "--tool", "replay", "--json", "-o", str(full))
    assert code == 6
    assert_one_error_line(err)
    assert "No space left" in err
    assert _is_char_device(full)
    assert from_json(out).status == "ok"  # stdout still has what was measured


def test_symlink_is_followed_and_its_target_replaced(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "r.json"
    target.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    code, _, err = run_main(capsys, "run", "--tool", "replay", "-q", "-o", str(link))
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert from_json(target.read_text()).status == "ok"
    assert os.listdir(tmp_path / "real") == ["r.json"]  # no temporary file left


def test_fifo_is_written_in_place(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    code, _, err = run_main(capsys, "run", "--tool", "replay", "-q", "-o", str(fifo))
    reader.join(10)
    assert code == 0, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert from_json(got[0].decode()).status == "ok"


@pytest.mark.parametrize("command", [
    ["run", "--tool", "replay"],
    ["run", "--tool", "replay", "--repeat", "2"],
    ["compare", "--tools", "replay", "--trials", "1"],
])
def test_directory_or_missing_directory_is_exit_6_before_the_test(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str]) -> None:
    for bad in (tmp_path, tmp_path / "missing" / "r.json"):
        ReplayTool.specs.clear()
        code, out, err = run_main(capsys, *command, "--json", "-o", str(bad))
        assert code == 6, err
        assert_one_error_line(err)
        assert str(bad) in err
        assert ReplayTool.specs == []  # the test never ran
        assert out == ""
    assert os.listdir(tmp_path) == []


def test_parse_and_report_html_check_the_path_first(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    saved = tmp_path / "in.txt"
    saved.write_text("host\n")
    code, _, err = run_main(capsys, "parse", "--tool", "replay", str(saved), "-o",
                            str(tmp_path))
    assert code == 6 and "is a directory" in err
    result = tmp_path / "r.json"
    assert run_main(capsys, "run", "--tool", "replay", "-q", "-o", str(result))[0] == 0
    pytest.importorskip("matplotlib")
    code, _, err = run_main(capsys, "report", str(result), "-q", "--html", str(tmp_path))
    assert code == 6 and "is a directory" in err


@pytest.mark.parametrize("name", ["r.json", "r.jsonl", "r", "r.result"])
def test_what_run_writes_report_reads_back(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           name: str) -> None:
    path = tmp_path / name
    code, out, _ = run_main(capsys, "run", "--tool", "replay", "-o", str(path))
    assert code == 0 and "status: ok" in out  # stdout keeps the human table
    results, problem = read_results(path.read_text(), name)
    assert problem is None and [r.status for r in results] == ["ok"]
    code, out, err = run_main(capsys, "report", str(path))
    assert code == 0, err


def test_extension_decides_and_format_overrides_with_a_warning(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    csv_path = tmp_path / "r.csv"
    assert run_main(capsys, "run", "--tool", "replay", "-q", "-o", str(csv_path))[0] == 0
    assert csv_path.read_text().startswith("start_time,tool,")
    text = tmp_path / "r.txt"
    assert run_main(capsys, "run", "--tool", "replay", "-q", "-o", str(text))[0] == 0
    assert "status: ok" in text.read_text()
    code, _, err = run_main(capsys, "run", "--tool", "replay", "-q", "--format", "jsonl",
                            "-o", str(tmp_path / "x.csv"))
    assert code == 0 and "warning:" in err and "jsonl" in err
    assert from_json((tmp_path / "x.csv").read_text()).status == "ok"
    assert choose_formats("json", None).file is None
    assert choose_formats(None, "A.JSONL").file == "jsonl"


def test_repeat_and_compare_files_follow_the_same_rule(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    for command in (["run", "--tool", "replay", "--repeat", "2"],
                    ["compare", "--tools", "replay", "--trials", "2"]):
        path = tmp_path / f"{command[0]}.out"  # no known extension: JSON
        code, _, err = run_main(capsys, *command, "-q", "-o", str(path))
        assert code == 0, err
        results, problem = read_results(path.read_text(), path.name)
        assert problem is None and len(results) == 2


def test_socket_is_refused(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        with pytest.raises(OutputError, match="socket"):
            check_target(str(path))
        with pytest.raises(OutputError, match="socket"):
            write_text(str(path), "x")


def test_json_to_a_full_stdout_is_exit_6() -> None:
    # /dev/full as stdout is harmless to open: it is only written, never replaced.
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-c",
             "import sys; from netprobe.cli.main import main; "
             "from tests.test_cli import plugin_registry; "
             "sys.exit(main(['run', '--tool', 'replay', '--json'], "
             "registry_loader=plugin_registry))"],
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=60, env=child_env(),
            cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 6, done.stderr
    assert_one_error_line(done.stderr)
    assert "stdout" in done.stderr
