"""The nuttcp adapter, in the file names every driven tool's package uses: ``tool.py``
(the Tool and one run's session, on :mod:`netprobe.driven`), ``command.py`` (the plan and
the command lines), ``parse_output.py`` (nuttcp's output read line by line, live or saved)
and ``parse_saved.py`` (a saved output as a Result).

The entry point ``netprobe.tools.nuttcp.tool:NuttcpTool`` is the class itself; it is also
re-exported here (``netprobe.tools.nuttcp:NuttcpTool``).
"""

from netprobe.tools.nuttcp.tool import NuttcpTool

__all__ = ["NuttcpTool"]
