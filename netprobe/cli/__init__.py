"""netprobe's command line: the only layer that prints or imports rich.

:mod:`netprobe.cli.main` builds the parser and dispatches, :mod:`netprobe.cli.exitcodes`
holds the exit codes, :mod:`netprobe.cli.args` the argument types and shared option groups,
:mod:`netprobe.cli.commands` one module per command; :mod:`netprobe.cli.render` draws for
people, :mod:`netprobe.cli.formats` writes results (json, jsonl, csv, human; files
atomically), :mod:`netprobe.cli.units` reads and shows numbers with unit suffixes.
"""
