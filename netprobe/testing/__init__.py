"""Conformance kit for tool plugins: run it from a plugin's own test suite.

One line in a pytest module runs every check, one test per check::

    from netprobe.testing import conformance_tests
    from netprobe_qperf import QperfTool

    test_qperf_conformance = conformance_tests(QperfTool)

One module per concern: :mod:`~netprobe.testing.checks` (the checks, and what each asks of
a tool), :mod:`~netprobe.testing.validation` (a Result's schema and units),
:mod:`~netprobe.testing.processes` (process tracking by PID), :mod:`~netprobe.testing.honoured`
(an option honoured in a Result), :mod:`~netprobe.testing.child` (the timeout check's
child). The one capability table is :data:`netprobe.plugin.SWITCHES`. Every public name is
re-exported here.
"""

from netprobe.testing.checks import (
    CHECKS,
    KNOWN_CAPABILITIES,
    CheckOutcome,
    CheckSkipped,
    Conformance,
    ConformanceError,
    RecordingReporter,
    Settings,
    check_tool,
    conformance_tests,
    run_check,
)
from netprobe.testing.honoured import honoured_problems
from netprobe.testing.processes import (
    ProcessInfo,
    ProcessWatch,
    all_processes,
    descendants,
    still_running,
    subreaper,
)
from netprobe.testing.validation import shipped_schema, validate_document, validate_result

__all__ = [
    "CHECKS",
    "KNOWN_CAPABILITIES",
    "CheckOutcome",
    "CheckSkipped",
    "Conformance",
    "ConformanceError",
    "ProcessInfo",
    "ProcessWatch",
    "RecordingReporter",
    "Settings",
    "all_processes",
    "check_tool",
    "conformance_tests",
    "descendants",
    "honoured_problems",
    "run_check",
    "shipped_schema",
    "still_running",
    "subreaper",
    "validate_document",
    "validate_result",
]
