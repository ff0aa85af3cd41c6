"""The ntttcp adapter: ``tool.py`` (the Tool, its lifecycle through DrivenRun),
``command.py`` (the plan of a run and its command lines), ``parse_output.py`` (the tool's
output read line by line, and saved output).

The entry point ``netprobe.tools.ntttcp:NtttcpTool`` keeps working: the class is re-exported here.
"""

from netprobe.tools.ntttcp.tool import NtttcpTool

__all__ = ["NtttcpTool"]
