"""Build script: setuptools needs this file only for cffi_modules (the compiled core).

The core is optional at install time: where no C compiler exists, the package still
installs and netprobe runs on its pure-Python data path (see netprobe/core.py).
"""
from setuptools import setup

setup(cffi_modules=["csrc/build_core.py:ffibuilder"])
