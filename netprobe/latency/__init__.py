"""Latency under load, in one place: what the probes measure and how a run carries them.

- :mod:`~netprobe.latency.figures`: the arithmetic (samples to the result's figures), pure
  functions over schema records: the run road's tools use it too, so it imports nothing
  of this package's runners;
- :mod:`~netprobe.latency.probing`: the probe session beside a test (options, the far
  end, the live reporter, the result's latency; the probes themselves, wire, echo and the
  client's prober, are the engine's: :mod:`netprobe.engine.probes`);
- :mod:`~netprobe.latency.phases`: the one runner of a probed run (idle, the loaded
  phases, idle), which the front doors below call with their phases;
- :mod:`~netprobe.latency.beside`: ``netprobe run --latency``, the test as one phase;
- :mod:`~netprobe.latency.bufferbloat`: ``netprobe bufferbloat`` and ``netprobe rrul``,
  their phases put together into one Result.

Everything here but ``figures`` sits above the run road (:mod:`netprobe.session`): it runs
tests through it. Nothing is imported here, so ``figures`` costs nothing more.
"""
