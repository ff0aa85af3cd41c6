"""netprobe's distribution is ``netprobe-meter``: the plain name ``netprobe`` on the package
index is an unrelated project (network diagnostics over Telegram and Firestore, 2020), so
nothing we ship may tell pip, Ansible or a reader to install that name."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from netprobe.registry import DISTRIBUTION

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the backport, as netprobe itself reads TOML there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent

# docs/, deploy/ and plugins/ are in the source tree, not in the wheel: a wheel's test run
# (the ARM suites) has only tests/ and pyproject.toml.
pytestmark = pytest.mark.skipif(not (ROOT / "deploy").is_dir(),
                                reason=f"no source checkout: {ROOT / 'deploy'} absent")

# "netprobe" as a requirement: followed by nothing, an extra, a version or a quote, and not by
# "-meter" (ours), "-qperf" (the plugin's own name) or a path.
_STRANGER = re.compile(r"""(?<![\w/.-])netprobe(?=\s*(?:$|\[|==|>=|<=|~=|"|'|,|\s))""")
_INSTALL = re.compile(r"pip3? install\b[^\n`]*")


def _shipped_texts() -> list[Path]:
    names = ["README.md", "pyproject.toml", "plugins/netprobe-qperf/pyproject.toml"]
    found = [ROOT / n for n in names]
    for folder in ("docs", "deploy", "scripts", ".github", "plugins"):
        found += [p for p in (ROOT / folder).rglob("*") if p.is_file()
                  and p.suffix in {".md", ".yml", ".yaml", ".toml", ".txt", "", ".sh"}
                  and ".egg-info" not in str(p)]
    return found


def test_the_distribution_is_named_netprobe_meter() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION == "netprobe-meter"
    plugin = tomllib.loads((ROOT / "plugins/netprobe-qperf/pyproject.toml").read_text())
    assert any(d.startswith(DISTRIBUTION) for d in plugin["project"]["dependencies"])


def test_no_pip_install_line_names_the_strangers_package() -> None:
    offenders = []
    for path in _shipped_texts():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for line in _INSTALL.findall(text):
            if _STRANGER.search(line.split("install", 1)[1].split("#", 1)[0]):
                offenders.append(f"{path.relative_to(ROOT)}: {line.strip()}")
    assert offenders == []


def test_the_ansible_role_installs_our_distribution_by_default() -> None:
    defaults = (ROOT / "deploy/ansible/roles/netprobe_agent/defaults/main.yml").read_text()
    (line,) = [x for x in defaults.splitlines() if x.startswith("netprobe_package:")]
    assert line.split(":", 1)[1].strip().strip("\"'") == DISTRIBUTION
