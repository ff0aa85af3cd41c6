"""Conformance kit for tool plugins: run it from a plugin's own test suite.

One line in a pytest module runs every check, one test per check::

    from netprobe.testing import conformance_tests
    from netprobe_qperf import QperfTool

    test_qperf_conformance = conformance_tests(QperfTool)

The checks and what each asks of a tool are described in :mod:`netprobe.testing.checks`.
Every public name is re-exported here.
"""

from netprobe.testing.checks import (
    CHECKS,
    KNOWN_CAPABILITIES,
    CheckOutcome,
    CheckSkipped,
    Conformance,
    ConformanceError,
    ProcessInfo,
    ProcessWatch,
    RecordingReporter,
    Settings,
    all_processes,
    check_tool,
    conformance_tests,
    descendants,
    honoured_problems,
    run_check,
    shipped_schema,
    still_running,
    subreaper,
    validate_result,
)

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
    "validate_result",
]
