"""The nuttcp adapter: ``tool.py`` (the Tool, its lifecycle through DrivenRun),
``parse_output.py`` (the tool's output read line by line, and saved output).

The entry point ``netprobe.tools.nuttcp:NuttcpTool`` keeps working: the class is re-exported here.
"""

from netprobe.tools.nuttcp.tool import NuttcpTool

__all__ = ["NuttcpTool"]
