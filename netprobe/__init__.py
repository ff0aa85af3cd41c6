"""netprobe: measure what a network path can carry, with one result schema for every tool."""

__version__ = "0.1.0"
