"""netprobe's plugin conformance kit, run on this plugin exactly as its guide suggests."""

from netprobe.testing import conformance_tests

from netprobe_qperf import QperfTool

test_qperf_conforms = conformance_tests(QperfTool)
