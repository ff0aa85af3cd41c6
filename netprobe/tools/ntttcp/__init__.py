"""The ntttcp adapter: ``tool.py`` (the Tool), ``session.py`` (one run through
DrivenSession), ``command.py`` (the plan of a run and its command lines), ``intervals.py``
(live intervals), ``parse_output.py`` (NTTTCP for Linux's console and result files),
``parse_windows.py`` (Windows NTttcp's console) and ``parse_saved.py`` (saved outputs).

The entry point ``netprobe.tools.ntttcp.tool:NtttcpTool`` keeps working; the class is
re-exported here too.
"""

from netprobe.tools.ntttcp.tool import NtttcpTool

__all__ = ["NtttcpTool"]
