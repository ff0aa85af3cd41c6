"""netprobe's version, on the ground floor: every layer may import it (the engine stamps it
into results and greetings, the plugin registry matches it against installed metadata), and
it imports nothing, so no module has to reach up to the package face for it."""

__version__ = "0.1.0"
