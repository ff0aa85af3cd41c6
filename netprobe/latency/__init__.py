"""Latency under load, in one place: what the probes measure and how a run carries them.

- :mod:`~netprobe.latency.figures`: the arithmetic (samples to the result's figures), pure
  functions over schema records: the run road's tools use it too, so it imports nothing
  of this package's runners;
- :mod:`~netprobe.latency.prober`: the client's probes (the wire and the far end's echo
  are the engine's: :mod:`netprobe.engine.probes`, :mod:`netprobe.engine.echo`);
- :mod:`~netprobe.latency.probing`: the probe session beside a test (options, the far
  end, the live reporter, the result's latency);
- :mod:`~netprobe.latency.bufferbloat`: ``netprobe bufferbloat`` and ``netprobe rrul``'s
  plans of phases.

Everything here but ``figures`` sits above the run road (:mod:`netprobe.session`): it runs
tests through it. Nothing is imported here, so ``figures`` costs nothing more.
"""
