"""Fleets: tests among many agents on a conflict-free schedule.

``config`` reads the fleet file (TOML: agents, groups, specs, schedules); ``schedule``
compiles groups into rounds in which no host takes part in two tests at once (pure
functions); ``runner`` runs the rounds through the agents and hands each result to an
archive as it ends (``netprobe.archives``).
"""
