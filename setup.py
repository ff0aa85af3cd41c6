"""Build script: setuptools needs this file only for the compiled core.

``cffi_modules`` adds ``netprobe._core`` (csrc/build_core.py). cffi compiles it against
Python's limited API, so the wheel is tagged ``cp39-abi3``: one wheel per platform serves
CPython 3.9 and every later version. The core is optional: where it cannot be compiled
(no C compiler), the package still installs and netprobe runs on its pure-Python data path
(netprobe/core/pure.py); ``NETPROBE_REQUIRE_CORE=1`` makes that a build error instead.
"""
import sysconfig

from setuptools import setup

# Debug and free-threaded CPython builds have no stable ABI: cffi then builds a plain
# version-specific extension, and the wheel must say so.
ABI3 = not (sysconfig.get_config_var("Py_DEBUG") or sysconfig.get_config_var("Py_GIL_DISABLED"))

setup(
    cffi_modules=["csrc/build_core.py:ffibuilder"],
    options={"bdist_wheel": {"py_limited_api": "cp39"}} if ABI3 else {},
)
