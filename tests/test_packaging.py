"""Packaging: the sdist builds and installs in a fresh venv (with the compiled core, and
without a compiler on the pure-Python data path), and an installed netprobe whose compiled
core is missing still runs and says which data path it uses.

The sdist tests need the source checkout and PyPI (pip's isolated builds fetch setuptools
and cffi, as any user's install does); they are marked slow.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import netprobe

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 600  # one isolated build: a fresh build environment, then the compile

needs_checkout = pytest.mark.skipif(not (ROOT / "setup.py").is_file(),
                                    reason="needs the source checkout (setup.py, csrc/)")


def run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = TIMEOUT) -> str:
    """Run a command to completion; its stdout, or a failure showing its output."""
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{argv}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would steer imports or the core build."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "NETPROBE_PURE", "NETPROBE_REQUIRE_CORE")}
    env.update(extra)
    return env


# --- the pure-Python fallback, on the netprobe under test (checkout or installed wheel) ---


@pytest.fixture(scope="module")
def without_core(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the imported netprobe package without its compiled module."""
    site = tmp_path_factory.mktemp("site")
    shutil.copytree(Path(netprobe.__file__).parent, site / "netprobe",
                    ignore=shutil.ignore_patterns("_core*.so", "_core*.c", "__pycache__"))
    return site


def netprobe_without_core(site: Path, *args: str) -> str:
    """``python -m netprobe ARGS`` on that copy, the dependencies from this environment.

    ``-S`` skips .pth files: an editable install's finder would find the checkout's
    compiled module for the copy.
    """
    paths = sysconfig.get_paths()
    path = os.pathsep.join([str(site), paths["purelib"], paths["platlib"]])
    return run(sys.executable, "-S", "-m", "netprobe", *args, cwd=site,
               env=clean_env(PYTHONPATH=path), timeout=120)


def test_version_names_the_pure_data_path_when_the_core_is_missing(without_core: Path) -> None:
    assert "data path: python" in netprobe_without_core(without_core, "--version")


def test_tools_says_native_runs_on_pure_python(without_core: Path) -> None:
    rows = {row["name"]: row for row in json.loads(netprobe_without_core(without_core,
                                                                         "tools", "--json"))}
    assert rows["native"]["status"] == "available"
    assert any("pure Python" in detail for detail in rows["native"]["details"])


def test_a_loopback_run_works_without_the_core(without_core: Path) -> None:
    result = json.loads(netprobe_without_core(without_core, "run", "-t", "1", "--json"))
    assert result["status"] == "ok"
    assert result["tool"]["data_path"] == "python"
    assert result["summaries"][0]["receiver"]["bits_per_second"] > 0


# --- the sdist, built and installed the way a user's pip does it ---------------------------


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new venv (with ``build``) and the sdist of this checkout built by it."""
    tmp = tmp_path_factory.mktemp("sdist")
    run(sys.executable, "-m", "venv", tmp / "venv", cwd=tmp)
    run(tmp / "venv/bin/python", "-m", "pip", "install", "-q", "build", cwd=tmp)
    run(tmp / "venv/bin/python", "-m", "build", "--sdist", "--outdir", tmp / "dist", ROOT,
        cwd=tmp, env=clean_env())
    yield tmp


def sdist_of(tmp: Path) -> Path:
    (sdist,) = (tmp / "dist").glob("netprobe_meter-*.tar.gz")
    return sdist


def wheel_from_sdist(tmp: Path, out: str, **env: str) -> Path:
    """``pip wheel`` the sdist into ``tmp/out``, as ``pip install`` would build it."""
    run(tmp / "venv/bin/python", "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp / out,
        sdist_of(tmp), cwd=tmp, env=clean_env(**env))
    (wheel,) = (tmp / out).glob("netprobe_meter-*.whl")
    return wheel


def install_and_ask_version(tmp: Path, wheel: Path) -> str:
    run(tmp / "venv/bin/python", "-m", "pip", "install", "-q", "--force-reinstall", wheel,
        cwd=tmp, env=clean_env())
    return run(tmp / "venv/bin/netprobe", "--version", cwd=tmp, env=clean_env())


@pytest.mark.slow
@needs_checkout
def test_sdist_holds_what_the_core_build_needs(fresh_venv: Path) -> None:
    with tarfile.open(sdist_of(fresh_venv)) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    for needed in ("setup.py", "pyproject.toml", "csrc/build_core.py", "csrc/netprobe_core.h",
                   "csrc/np_common.h", "csrc/np_udp.c", "csrc/test_core.c", "csrc/Makefile",
                   "netprobe/result.schema.json", "netprobe/py.typed", "tests/conftest.py"):
        assert needed in names, needed
    assert not [n for n in names if n.endswith((".so", ".o", ".pyc"))]


@pytest.mark.slow
@needs_checkout
@pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler here")
def test_sdist_installs_with_the_compiled_core_as_abi3(fresh_venv: Path) -> None:
    wheel = wheel_from_sdist(fresh_venv, "wheel-c", NETPROBE_REQUIRE_CORE="1")
    assert "-cp39-abi3-" in wheel.name  # one wheel for CPython 3.9 and later
    assert "netprobe/_core.abi3.so" in zipfile.ZipFile(wheel).namelist()
    assert "data path: c" in install_and_ask_version(fresh_venv, wheel)


@pytest.mark.slow
@needs_checkout
def test_sdist_installs_without_a_compiler_on_the_pure_data_path(fresh_venv: Path) -> None:
    wheel = wheel_from_sdist(fresh_venv, "wheel-nocc", CC="false")
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if "_core" in n and
                n.endswith(".so")]
    assert "data path: python" in install_and_ask_version(fresh_venv, wheel)
