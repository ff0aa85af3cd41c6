"""netprobe-qperf: a netprobe tool plugin that drives qperf (``netprobe run --tool qperf``).

Registered through netprobe's ``netprobe.tools`` entry-point group (see pyproject.toml);
it uses only netprobe's public plugin API: ``netprobe.plugin``, ``netprobe.schema``,
``netprobe.errors`` and ``netprobe.driven``.
"""

from netprobe_qperf.tool import QperfTool

__version__ = "0.1.0"

__all__ = ["QperfTool", "__version__"]
