"""iperf3's wire protocol, spoken by netprobe's server for stock iperf3 clients (issue 37):
:mod:`.wire` is the framing, state bytes, error codes and the params/results objects;
:mod:`.session` one client's test; :mod:`.service` the listener beside netprobe's own."""
