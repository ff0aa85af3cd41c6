"""``python -m netprobe.testing --run-child MODULE:CLASS OPTIONS SPEC``: the timeout
check's child process (see :func:`netprobe.testing.checks._child_main`)."""
import sys

from netprobe.testing.child import _child_main

if len(sys.argv) == 5 and sys.argv[1] == "--run-child":
    sys.exit(_child_main(sys.argv[2:]))
sys.stderr.write("usage: python -m netprobe.testing --run-child MODULE:CLASS OPTIONS SPEC\n")
sys.exit(2)
