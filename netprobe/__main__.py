"""``python -m netprobe``: the same command line as the ``netprobe`` script."""
import sys

from netprobe.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
