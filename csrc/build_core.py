"""cffi build script for netprobe's C core (API mode): ``netprobe._core``.

setuptools runs it through ``cffi_modules=["csrc/build_core.py:ffibuilder"]`` from the
repository root; run it directly (``python csrc/build_core.py``) to build the extension in
place, into netprobe/. The cdef is csrc/netprobe_core.h itself, so the declarations the C
files compile against and the ones Python sees cannot drift apart.
"""
from __future__ import annotations

import os
import pathlib
import sys
import sysconfig

import cffi

CSRC = pathlib.Path(__file__).resolve().parent
ROOT = CSRC.parent


def make_builder(absolute: bool = False, optional: bool = False) -> cffi.FFI:
    """The FFI builder; absolute paths for ffi.compile(), which runs in its tmpdir.

    ``optional``: a compile failure is a warning and the package installs without the
    core (setuptools' optional extension), so netprobe runs on its pure-Python data path.
    """
    base = CSRC if absolute else CSRC.relative_to(ROOT)
    builder = cffi.FFI()
    builder.cdef((CSRC / "netprobe_core.h").read_text())
    builder.set_source(
        "netprobe._core",
        '#include <stdint.h>\n#include "netprobe_core.h"',
        sources=[str(base / p.name) for p in sorted(CSRC.glob("np_*.c"))],
        include_dirs=[str(base)],
        extra_compile_args=["-O2", "-Wall", "-Wextra", "-std=gnu99"],
        # Python's own flags carry -g: the debug info would be two thirds of the module,
        # on routers that count flash in megabytes.
        extra_link_args=["-Wl,--strip-debug"],
        optional=optional,
    )
    return builder


# What setup.py builds: optional unless NETPROBE_REQUIRE_CORE=1 (wheel builds set it).
ffibuilder = make_builder(optional=os.environ.get("NETPROBE_REQUIRE_CORE") != "1")


def _suffix() -> str:
    # cffi compiles against the limited API unless Python is a debug build, so the module
    # is abi3: the same name setuptools gives it, and one file whichever way it was built.
    if sysconfig.get_config_var("Py_DEBUG"):
        return str(sysconfig.get_config_var("EXT_SUFFIX"))
    return ".abi3.so"


def build_in_place() -> pathlib.Path:
    """Compile under build/cffi and install the extension next to netprobe/__init__.py."""
    builder = make_builder(absolute=True)
    built = builder.compile(tmpdir=str(ROOT / "build" / "cffi"), verbose=False)
    target = ROOT / "netprobe" / ("_core" + _suffix())
    staged = target.with_suffix(".tmp")
    staged.write_bytes(pathlib.Path(built).read_bytes())
    staged.chmod(0o755)
    os.replace(staged, target)  # never rewrite in place a .so that a process has mapped
    for stale in (ROOT / "netprobe").glob("_core.cpython-*.so"):
        if stale != target:
            stale.unlink()  # an older in-place build would shadow the fresh one
    return target


if __name__ == "__main__":
    sys.stdout.write(f"built {build_in_place()}\n")
