"""What the native engine can run: one table, used by the CLI (through the native tool) and
by the server on every request, so both refuse the same specs with the same words."""

from __future__ import annotations

from netprobe.core.records import UDP_HEADER_BYTES
from netprobe.plugin import Capabilities
from netprobe.schema import TestSpec

NATIVE_CAPABILITIES = Capabilities.all_but(max_streams=128, min_interval_s=0.1)
"""The native engine's capabilities (``--tool native``)."""


def native_refusals(spec: TestSpec) -> list[str]:
    """Why the native engine cannot run ``spec``: the capabilities, and a UDP byte count
    too small for one datagram. Empty if it can."""
    found = NATIVE_CAPABILITIES.refusals(spec, "native")
    if spec.protocol == "udp" and spec.bytes_total is not None \
            and spec.bytes_total < UDP_HEADER_BYTES:
        found.append(f"native cannot honour --bytes {spec.bytes_total}: a UDP test sends at "
                     f"least one datagram of {UDP_HEADER_BYTES} bytes (its header)")
    return found
