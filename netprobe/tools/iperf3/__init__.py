"""The iperf3 adapter: ``tool.py`` (the Tool, its lifecycle through DrivenRun),
``parse_output.py`` (the tool's output read line by line, and saved output).

The entry point ``netprobe.tools.iperf3:Iperf3Tool`` keeps working: the class is re-exported here.
"""

from netprobe.tools.iperf3.tool import Iperf3Tool

__all__ = ["Iperf3Tool"]
