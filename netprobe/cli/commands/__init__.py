"""One module per command, each with ``add_parser(commands, summary, epilog)`` and
``handle(args, load) -> exit code``.

:mod:`netprobe.cli.main` imports a command's module only when that command is chosen, so
each module may import what its command needs at the top; what runs the test (plugins,
schema, rich) still loads inside ``handle``.
"""
