"""The agent: ``netprobe server`` as the far end of every tool.

A client asks the agent on the far host to start the matching server side of a driven tool
(``far_end``), to list what it can run (``tools``), or, when allowed, to run a whole test
against a third host (``third_party``). The agent sits above the tools and the engine: the
engine's server hands it the requests it does not know itself.
"""
