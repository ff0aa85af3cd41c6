"""The iperf2 adapter: ``tool.py`` (the Tool, its lifecycle through DrivenRun),
``parse_output.py`` (the tool's output read line by line, and saved output).

The entry point ``netprobe.tools.iperf2:Iperf2Tool`` keeps working: the class is re-exported here.
"""

from netprobe.tools.iperf2.tool import Iperf2Tool

__all__ = ["Iperf2Tool"]
