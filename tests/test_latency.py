"""Latency under load: the statistics (pure functions, figures worked by hand) and the
probes on loopback against a real server (real sockets), bad probes included."""

from __future__ import annotations

import time
from collections.abc import Iterator

import attrs
import pytest

from netprobe.engine import probes
from netprobe.engine.probes import KIND_ECHO, KIND_PROBE, Probe, pack, unpack
from netprobe.engine.server import Server, ServerConfig
from netprobe.latency import figures as latency
from netprobe.latency.beside import run_with_latency
from netprobe.latency.figures import Phase, ProbeLog, ProbeSample
from netprobe.latency.probing import ProbeOptions, open_prober
from netprobe.plugin import NullReporter
from netprobe.schema import Interval, Latency, LatencyPhase, TestSpec
from netprobe.tools.native import NativeTool

# --- statistics -----------------------------------------------------------------------


def test_percentile_interpolates_between_closest_ranks() -> None:
    values = [10.0, 20.0, 30.0, 40.0, 50.0]
    assert latency.percentile(values, 0) == 10.0
    assert latency.percentile(values, 50) == 30.0
    assert latency.percentile(values, 90) == pytest.approx(46.0)  # rank 3.6
    assert latency.percentile(values, 100) == 50.0
    assert latency.percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        latency.percentile([], 50)


def test_trimmed_mean_and_rpm_drop_the_worst_five_percent() -> None:
    rtts = [100_000.0] * 19 + [10_000_000.0]  # 19 x 100 ms and one 10 s outlier
    assert latency.trimmed_mean(rtts) == 100_000.0
    assert latency.rpm(rtts) == pytest.approx(600.0)  # 60 s / 0.1 s
    assert latency.trimmed_mean([5.0, 1.0]) == 3.0  # 5 % of 2 rounds down to nothing
    assert latency.rpm([]) is None


@pytest.mark.parametrize(("increase_ms", "expected"), [
    (-3, "A+"), (0, "A+"), (4.999, "A+"), (5, "A"), (29.9, "A"), (30, "B"), (59.9, "B"),
    (60, "C"), (199.9, "C"), (200, "D"), (399.9, "D"), (400, "F"), (2000, "F"),
])
def test_grade_scale(increase_ms: float, expected: str) -> None:
    assert latency.grade(increase_ms * 1000) == expected


def test_distribution_with_jitter_and_loss() -> None:
    record = latency.distribution([3.0, 1.0, 2.0], lost=1, sent=4)
    assert (record.count, record.min_us, record.p50_us, record.max_us) == (3, 1.0, 2.0, 3.0)
    assert record.mean_us == 2.0
    assert record.jitter_us == 1.5  # |1-3| and |2-1|, in time order
    assert (record.lost, record.lost_percent) == (1, 25.0)
    empty = latency.distribution([], lost=2, sent=2)
    assert empty.count == 0 and empty.p50_us is None and empty.lost_percent == 100.0


OFFSET_NS = 5_000_000_000  # the server's clock is 5 s ahead of the client's


def _sample(seq: int, phase: int, up_ms: float, down_ms: float) -> ProbeSample:
    return ProbeSample(seq=seq, phase=phase, sent_s=seq * 0.05, rtt_us=(up_ms + down_ms) * 1000,
                       up_ns=OFFSET_NS + int(up_ms * 1e6), down_ns=-OFFSET_NS + int(down_ms * 1e6))


def _deep_queue_log() -> ProbeLog:
    """20 idle probes (0.5 ms each way), 40 loaded with a 150 ms queue on the way out,
    2 loaded probes lost on the way out and 1 echo lost on the way back."""
    idle = [_sample(i, 0, 0.5, 0.5) for i in range(20)]
    loaded = [_sample(i, 1, 150.5, 0.5) for i in range(20, 60)]
    lost = [ProbeSample(seq=i, phase=1, sent_s=i * 0.05) for i in (60, 61, 62)]
    received = frozenset(range(61))  # 61 and 62 never reached the server; 60 did
    return ProbeLog(
        samples=tuple(idle + loaded + lost),
        phases=(Phase("idle", False, 0.0, 1.0), Phase("loaded", True, 1.0, 3.2)),
        transport="udp", server_received=received,
    )


def test_summary_of_a_deep_queue_worked_by_hand() -> None:
    summary = latency.summarize(_deep_queue_log())
    idle, loaded = summary.phases
    assert idle.rtt is not None and idle.rtt.p50_us == pytest.approx(1000.0)
    assert loaded.rtt is not None and loaded.rtt.p50_us == pytest.approx(151_000.0)
    assert loaded.increase_us == pytest.approx(150_000.0) == summary.increase_us
    assert loaded.grade == summary.grade == "C"
    assert summary.rpm == pytest.approx(60 / 0.151)
    assert summary.measured_by == "netprobe-udp"
    # The top-level distribution is the loaded one: 40 answered, 3 lost of 43.
    assert (summary.count, summary.lost) == (40, 3)
    assert summary.lost_percent == pytest.approx(300 / 43)
    # The clocks' 5 s offset cancels: what remains is the queue, on the way out only.
    up, down = loaded.client_to_server, loaded.server_to_client
    assert up is not None and down is not None
    assert up.p50_us == pytest.approx(150_000.0) and down.max_us == pytest.approx(0.0)
    assert idle.client_to_server is not None and idle.client_to_server.max_us == 0.0
    # Loss split by the server's received list: 2 probes out, 1 echo back.
    assert (up.lost, down.lost) == (2, 1)
    assert idle.increase_us is None and idle.grade is None and idle.rpm is None
    assert latency.bloated_direction(summary) == "client_to_server"
    assert len(summary.samples) == 63 and summary.samples[-1].rtt_us is None
    assert summary.samples[30].client_to_server_us == pytest.approx(150_000.0)
    assert summary.samples[30].server_to_client_us == 0.0


def test_summary_without_a_loaded_phase_has_no_grade() -> None:
    log = ProbeLog(samples=tuple(_sample(i, 0, 1.0, 1.0) for i in range(5)),
                   phases=(Phase("idle", False, 0.0, 0.3),), transport="tcp")
    summary = latency.summarize(log)
    assert summary.count == 5 and summary.p50_us == pytest.approx(2000.0)
    assert summary.grade is None and summary.increase_us is None and summary.rpm is None
    phase = summary.phases[0]
    # Without the server's list the loss cannot be split between the directions.
    assert phase.client_to_server is not None and phase.client_to_server.lost is None
    assert summary.measured_by == "netprobe-tcp"


def test_grade_is_of_the_mean_bloat_as_dslreports_grades() -> None:
    """DSLReports (FAQ 17930) grades the bloat: the *mean* loaded round trip over the
    baseline. 30 probes 150 ms over idle and 10 probes 400 ms over: the median says C
    (+150 ms), the mean +212.5 ms, D."""
    idle = [_sample(i, 0, 0.5, 0.5) for i in range(20)]
    loaded = [_sample(20 + i, 1, 150.5 if i % 4 else 400.5, 0.5) for i in range(40)]
    log = ProbeLog(samples=tuple(idle + loaded),
                   phases=(Phase("idle", False, 0.0, 1.0), Phase("loaded", True, 1.0, 3.0)),
                   transport="udp")
    summary = latency.summarize(log)
    phase = summary.phases[1]
    assert phase.increase_us == pytest.approx(150_000.0)  # the median's increase: C
    assert phase.bloat_us == pytest.approx(212_500.0) == summary.bloat_us
    assert phase.grade == summary.grade == "D"


def _phased_log(bloats_ms: dict[str, float]) -> ProbeLog:
    """An idle phase (1 ms round trips), then each loaded phase with its bloat, 10 probes."""
    samples = [_sample(i, 0, 0.5, 0.5) for i in range(10)]
    phases = [Phase("idle", False, 0.0, 0.5)]
    for k, (name, ms) in enumerate(bloats_ms.items(), start=1):
        phases.append(Phase(name, True, 0.5 * k, 0.5 * (k + 1)))
        samples += [_sample(10 * k + i, k, 0.5 + ms, 0.5) for i in range(10)]
    return ProbeLog(samples=tuple(samples), phases=tuple(phases), transport="udp")


def test_bufferbloat_grade_averages_download_and_upload_as_dslreports() -> None:
    """(bloat down + bloat up) / 2: 10 and 70 ms make 40 ms, B (the worst phase alone, 70
    ms, would say C); the ``both`` phase, which DSLReports does not run, is graded alone."""
    from netprobe.latency.bufferbloat import combine

    log = _phased_log({"download": 10.0, "upload": 70.0, "both": 250.0})
    result = combine(TestSpec(), [], log)
    lat = result.latency
    assert lat is not None
    assert lat.bloat_us == pytest.approx(40_000.0) and lat.grade == "B"
    assert [p.grade for p in lat.phases] == [None, "A", "C", "D"]
    assert lat.increase_us == pytest.approx(250_000.0)  # the largest median increase
    from netprobe.cli.latencyview import verdict

    words = verdict(lat).plain
    assert "+250 ms over idle at the median in both (p50 251.0 ms)" in words, words
    assert "DSLReports grade B (bloat +40.0 ms (mean of download and upload))" in words, words
    # what a person reads first: the worst phase, each phase's figures beside it
    assert lat.verdict == "D" and "verdict D (download A: bloat +10.0 ms" in words, words


def _loaded_with(up_us: float, down_us: float) -> Latency:
    phase = LatencyPhase(name="loaded", loaded=True, start_s=0.0, end_s=1.0,
                         client_to_server=Latency(count=1, p50_us=up_us),
                         server_to_client=Latency(count=1, p50_us=down_us))
    idle = attrs.evolve(phase, name="idle", loaded=False,
                        client_to_server=Latency(count=1, p50_us=900_000.0))
    return Latency(count=1, phases=(idle, phase))


@pytest.mark.parametrize(("up_ms", "down_ms", "expected"), [
    (150, 2, "client_to_server"), (2, 150, "server_to_client"), (31, 40, "both"),
    (29.9, 29.9, None), (30, 0, "client_to_server"),
])
def test_bloated_direction_names_the_queue_past_grade_a(up_ms: float, down_ms: float,
                                                         expected: str) -> None:
    # An idle phase's figures never count, however large.
    assert latency.bloated_direction(_loaded_with(up_ms * 1000, down_ms * 1000)) == expected


def test_interval_latency_uses_the_echoes_that_arrived_in_it() -> None:
    samples = [_sample(i, 0, 1.0, 1.0) for i in range(40)]  # answered at seq*0.05 + 2 ms
    rtts = latency.answered_between(samples, 1.0, 2.0)
    assert len(rtts) == 20
    base = Interval(direction="client_to_server", role="sender", stream_id=None,
                    start_s=1.0, end_s=2.0, bytes=1, bits_per_second=8.0)
    filled = latency.with_interval_latency(base, [3.0, 1.0, 2.0])
    assert (filled.latency_p50_us, filled.latency_max_us) == (2.0, 3.0)
    assert latency.with_interval_latency(base, []) is base


# --- the wire format ------------------------------------------------------------------

KEY = bytes(range(16))


def test_probe_round_trips_and_is_bound_to_its_cookie() -> None:
    probe = Probe(KIND_PROBE, 7, 123, 0, 0)
    data = pack(KEY, probe)
    assert len(data) == probes.PROBE_BYTES == 52
    assert unpack(KEY, data, KIND_PROBE) == (probe, "")
    assert unpack(bytes(16), data, KIND_PROBE) == (None, "foreign")  # another session's key
    assert unpack(KEY, data, KIND_ECHO) == (None, "foreign")  # a probe is not an echo
    assert unpack(KEY, data[:-1], KIND_PROBE) == (None, "truncated")
    assert unpack(KEY, data + b"x", KIND_PROBE) == (None, "oversized")
    flipped = bytes([data[0], data[1], data[2], data[3], data[4], data[5]]) + data[6:12] + \
        bytes([data[12] ^ 1]) + data[13:]
    assert unpack(KEY, flipped, KIND_PROBE) == (None, "foreign")  # a changed sequence number


def test_received_bitmap_round_trips_and_refuses_junk() -> None:
    bitmap = probes.Bitmap(100)
    for seq in (0, 9, 99):
        assert bitmap.add(seq)
    assert not bitmap.add(9)
    assert probes.decode_received(bitmap.encode(), 100) == frozenset({0, 9, 99})
    assert probes.decode_received("not base64!", 100) is None
    assert probes.decode_received(17, 100) is None


# --- on loopback, against a real server ----------------------------------------------


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server(ServerConfig(bind_address="127.0.0.1", port=0))
    srv.start()
    yield srv
    srv.close()


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_probes_on_loopback(server: Server, transport: str) -> None:
    prober = open_prober("127.0.0.1", server.port, None, ProbeOptions(transport=transport), 10)
    time.sleep(0.5)
    prober.mark("loaded", True)
    time.sleep(0.5)
    log = prober.stop()
    assert log.transport == transport and log.bad == ()
    summary = latency.summarize(log)
    idle = summary.phases[0].rtt
    assert idle is not None and idle.count >= 8 and idle.lost == 0
    assert idle.p50_us is not None and 0 < idle.p50_us < 5000  # loopback: well under 5 ms
    assert summary.count >= 8 and summary.lost == 0 and summary.grade == "A+"
    assert log.server_received == frozenset(s.seq for s in log.samples)


def test_bad_probes_are_ignored_and_counted(server: Server) -> None:
    prober = open_prober("127.0.0.1", server.port, None, ProbeOptions(transport="udp"), 10)
    time.sleep(0.3)
    transport = prober.transport
    assert transport is not None
    sock = transport.sock  # the session's own 4-tuple: these reach the server's echo
    valid_replay = pack(prober._key, Probe(KIND_PROBE, 0, 1))  # seq 0 was sent already
    foreign = pack(bytes(16), Probe(KIND_PROBE, 500, 1))
    beyond = pack(prober._key, Probe(KIND_PROBE, probes.MAX_PROBES + 5, 1))
    for junk in (valid_replay, foreign, foreign[:30], b"", foreign + b"!!", beyond):
        sock.send(junk)
    time.sleep(0.3)
    log = prober.stop()
    bad = dict(log.bad)
    assert bad == {"server replayed": 1, "server foreign": 1, "server truncated": 2,
                   "server oversized": 1, "server out_of_range": 1}
    summary = latency.summarize(log)
    # Never in the figures: every answered probe is one the client sent, each once.
    assert summary.lost == 0 and summary.count == len(log.samples)
    assert sorted(s.seq for s in log.samples) == list(range(len(log.samples)))


def test_client_ignores_forged_and_replayed_echoes(server: Server) -> None:
    prober = open_prober("127.0.0.1", server.port, None, ProbeOptions(transport="udp"), 10)
    time.sleep(0.3)
    prober._match(pack(bytes(16), Probe(KIND_ECHO, 1, 1)), time.time_ns())
    prober._match(b"short", time.time_ns())
    prober._match(pack(prober._key, Probe(KIND_ECHO, 0, 999, 1, 2)), time.time_ns())
    log = prober.stop()
    assert dict(log.bad) == {"foreign": 1, "truncated": 1, "replayed": 1}
    assert all(s.rtt_us is None or s.rtt_us < 1e6 for s in log.samples)


def test_server_refuses_bad_latency_requests(server: Server) -> None:
    from netprobe.farend import AgentConnection

    for request, words in (({"rate_hz": 0, "duration_s": 5}, "rate"),
                           ({"rate_hz": 1000, "duration_s": 5}, "rate"),
                           ({"rate_hz": 20, "duration_s": "x"}, "duration"),
                           ({"rate_hz": 20, "duration_s": 1e9}, "limit")):
        agent = AgentConnection.open("127.0.0.1", server.port, None)
        assert agent is not None
        agent.channel.send({"type": "latency", **request})
        reply = agent.channel.recv(timeout=5)
        agent.close()
        assert reply["type"] == "error" and words in reply["message"]


def test_native_run_with_latency_fills_phases_and_intervals() -> None:
    spec = TestSpec(duration_s=1.0, interval_s=0.5)
    seen: list[Interval] = []

    class Keep(NullReporter):
        def interval(self, sample: Interval) -> None:
            seen.append(sample)

    result = run_with_latency(lambda r: NativeTool().run(spec, r), spec, Keep(),
                              ProbeOptions(idle_s=0.5, tail_s=0.3))
    lat = result.latency
    assert lat is not None and lat.measured_by == "netprobe-udp"
    assert [p.name for p in lat.phases] == ["idle", "loaded", "idle_tail"]
    assert [p.loaded for p in lat.phases] == [False, True, False]
    assert lat.grade is not None and lat.rpm is not None and lat.increase_us is not None
    assert lat.count >= 15  # 1 s loaded at 20 probes/s
    # Every sum interval of half a second holds ~10 echoes (a last short tail may hold none).
    sums = [i for i in result.intervals if i.stream_id is None and i.end_s - i.start_s >= 0.4]
    missing = [(i.role, i.start_s, i.end_s) for i in sums if i.latency_p50_us is None]
    assert sums and not missing
    assert all(i.latency_max_us >= i.latency_p50_us for i in sums)  # type: ignore[operator]
    live = [i for i in seen if i.stream_id is None and i.end_s - i.start_s >= 0.4]
    assert live and all(i.latency_p50_us is not None for i in live)
    # The path's figure is on every stream's interval of the span, as on the sum.
    streams = [i for i in result.intervals if i.stream_id == 1 and i.end_s - i.start_s >= 0.4]
    assert streams and all(i.latency_p50_us is not None for i in streams)
    assert len(lat.samples) == sum(p.rtt.count + (p.rtt.lost or 0) for p in lat.phases if p.rtt)
    assert lat.test_start_s is not None and lat.test_start_s >= 0.5


# --- the human view -------------------------------------------------------------------


def test_human_view_fits_80_columns_and_names_the_culprit() -> None:
    import io

    from rich.console import Console

    from netprobe.cli.latencyview import latency_chart, print_latency
    from netprobe.schema import Endpoint, Result, ToolInfo

    summary = latency.summarize(_deep_queue_log())
    result = Result(tool=ToolInfo(name="native"), spec=TestSpec(), start_time=None,
                    local=Endpoint(role="client"), remote=Endpoint(role="server"),
                    latency=summary)
    buffer = io.StringIO()
    print_latency(Console(file=buffer, width=80, color_system=None), result)
    text = buffer.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text  # no column squeezed into an ellipsis
    assert "+150 " in text and " C " in text  # the loaded row: increase and grade
    words = " ".join(text.split())
    assert "the queue builds from client to server (upload)" in words
    # Where the probes were lost, from the server's list: 2 on the way out, 1 echo back.
    assert "3 probes lost (loaded: 2 client to server, 1 server to client)" in words
    chart = latency_chart(summary.samples, summary.phases, width=40, rows=4)
    assert chart is not None
    lines = chart.plain.splitlines()
    assert len(lines) == 6  # four rows, the lost marks, the phase ruler
    assert lines[-1].strip().startswith("|idle") and "|loaded" in lines[-1]
    assert lines[-2].rstrip().endswith("x")  # the three lost probes, at the end
    assert "█" in lines[0]  # the 151 ms probes reach the top row; the idle ones do not
    assert lines[0].split("|", 1)[1].startswith(" ")
