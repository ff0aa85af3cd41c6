"""netprobe's version, in a module of its own: a module that names it imports this one, not
the package, so that the package's lazy API (netprobe/__init__.py) makes no import cycle."""

__version__ = "0.1.0"
