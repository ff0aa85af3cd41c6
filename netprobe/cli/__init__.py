"""netprobe's command line: the only layer that prints or imports rich.

:mod:`netprobe.cli.main` parses arguments and maps errors to exit codes,
:mod:`netprobe.cli.render` draws for people, :mod:`netprobe.cli.formats` writes results
(json, jsonl, csv, human; files atomically), :mod:`netprobe.cli.units` reads and shows
numbers with unit suffixes.
"""
