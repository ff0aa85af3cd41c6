"""The live tests find the peers build.sh built (issue 34 item 8).

CI ran scripts/test, which builds ntttcp and points $NETPROBE_NTTTCP at it, and then 13 of
its 15 skips read "no ntttcp binary on PATH": the tests looked for ntttcp on PATH only, not
where netprobe itself looks. A peer built here that a test cannot find now fails in CI.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.peers import BUILT_BIN

REPO = Path(__file__).resolve().parents[1]
NTTTCP = BUILT_BIN / "ntttcp"
needs_built_ntttcp = pytest.mark.skipif(not NTTTCP.is_file(),
                                        reason=f"build.sh built no ntttcp in {BUILT_BIN}")


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a new interpreter (peers.py reads its environment once, at import), with
    a PATH that holds no ntttcp (only the interpreter's folder and the system's)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    full = {**os.environ, "PATH": path, "NETPROBE_PEERS_BIN": str(BUILT_BIN), **env}
    for name in ("NETPROBE_NTTTCP", "CI"):
        if name not in env:
            full.pop(name, None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, env=full, timeout=120)


@needs_built_ntttcp
def test_ntttcp_named_by_its_variable_is_found_not_skipped() -> None:
    found = _python("from tests.peers import peer_binaries\n"
                    "for flavour, one in peer_binaries('ntttcp'): print(flavour, repr(one))",
                    NETPROBE_NTTTCP=str(NTTTCP))
    assert found.returncode == 0, found.stderr
    assert "no ntttcp binary" not in found.stdout, found.stdout
    assert "PeerBinary(tool='ntttcp'" in found.stdout


TEST_FILE = '''
import pytest
from tests.peers import absent_peer

@pytest.mark.parametrize("peer", [pytest.param(None, marks=absent_peer("no ntttcp binary"
                                                                      " here", "ntttcp"))])
def test_one(peer):
    pass
'''


def _absent_run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    test = tmp_path / "test_absent.py"
    test.write_text(TEST_FILE)
    return _python("import sys, pytest\n"
                   f"sys.exit(pytest.main(['-q', '-rs', '-p', 'tests.conftest', "
                   f"'-p', 'no:cacheprovider', {str(test)!r}]))", **env)


@needs_built_ntttcp
def test_an_absent_built_peer_fails_in_ci_and_skips_elsewhere(tmp_path: Path) -> None:
    in_ci = _absent_run(tmp_path, CI="true")
    assert in_ci.returncode == 1, in_ci.stdout + in_ci.stderr
    assert "1 error" in in_ci.stdout and "build.sh built it" in in_ci.stdout
    outside = _absent_run(tmp_path)
    assert outside.returncode == 0, outside.stdout + outside.stderr
    assert "1 skipped" in outside.stdout and "no ntttcp binary here" in outside.stdout
