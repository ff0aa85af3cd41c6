"""The verdict beside the DSLReports grade: probe loss caps it where a voice call falls a
class of the ITU-T G.107 E-model, the worst phase's tail counts, and increases are shown
at one precision."""

from __future__ import annotations

import pytest

from netprobe.cli.latencyview import signed_ms, verdict
from netprobe.latency import figures as latency
from netprobe.latency.figures import LOSS_GRADE_CAPS, Phase, ProbeLog, ProbeSample, loss_cap


def _r_factor(loss_percent: float) -> float:
    """The E-model's R for G.711 with concealment (Ie 0, Bpl 25.1), random loss, no delay."""
    return 93.2 - 95 * loss_percent / (loss_percent + 25.1)


@pytest.mark.parametrize(("limit", "cap", "r_class"),
                         list(zip((1.0, 4.0, 8.0, 13.5, 21.0)[::-1],
                                  ("F", "D", "C", "B", "A"), (50, 60, 70, 80, 90))))
def test_loss_caps_sit_where_a_call_drops_a_class(limit: float, cap: str, r_class: int) -> None:
    assert (limit, cap) in LOSS_GRADE_CAPS
    # just below the limit the call is still in the better class, at it not (to 1.1 R)
    assert _r_factor(limit) <= r_class + 1.1
    assert _r_factor(limit * 0.9) > r_class - 0.5
    assert loss_cap(limit) == cap
    assert loss_cap(0.99) is None and loss_cap(None) is None


def _log(loaded_ms: list[float], lost_every: int) -> ProbeLog:
    """1 ms idle; a loaded phase at ``loaded_ms`` with every ``lost_every``-th probe lost."""
    samples = [ProbeSample(i, 0, i * 0.05, rtt_us=1000.0) for i in range(20)]
    for i, ms in enumerate(loaded_ms):
        lost = lost_every and i % lost_every == 0
        samples.append(ProbeSample(20 + i, 1, 1 + i * 0.05,
                                   rtt_us=None if lost else 1000.0 + ms * 1000))
    return ProbeLog(samples=tuple(samples), phases=(Phase("idle", False, 0.0, 1.0),
                                                     Phase("upload", True, 1.0, 11.0)),
                    transport="udp")


def test_probe_loss_and_the_tail_downgrade_the_verdict_not_the_dslreports_grade() -> None:
    loaded = [5.0] * 204
    log = _log(loaded, 0)
    lost = {20 + i for i in range(0, 204, 204 // 46)[:46]}
    log = ProbeLog(samples=tuple(ProbeSample(s.seq, s.phase, s.sent_s) if s.seq in lost else s
                                 for s in log.samples), phases=log.phases, transport="udp")
    summary = latency.summarize(log)
    upload = summary.phases[1]
    assert upload.rtt is not None and upload.rtt.lost == 46
    assert upload.rtt.lost_percent == pytest.approx(22.5, abs=0.1)
    assert summary.grade == "A"  # DSLReports': the mean bloat, 5 ms
    assert summary.verdict == upload.verdict == "F"
    assert summary.metric == "round_trip"
    # a queue mostly short with a 200 ms tail: the mean says A, the p99 says D
    tail = latency.summarize(_log([5.0] * 190 + [210.0] * 10, 0))
    assert tail.grade == "A" and tail.verdict == "D"
    assert tail.tail_increase_us == pytest.approx(210_000.0)
    words = verdict(tail).plain
    assert "verdict D (upload D: bloat +15.2 ms, p99 +210 ms)" in words, words
    assert "DSLReports grade A" in words


def test_old_results_have_their_verdict_worked_out_from_their_phases() -> None:
    import attrs

    summary = latency.summarize(_log([5.0] * 190 + [210.0] * 10, 0))
    old = attrs.evolve(summary, verdict=None, tail_increase_us=None,
                       phases=tuple(attrs.evolve(p, verdict=None, tail_increase_us=None)
                                    for p in summary.phases))
    assert "verdict D (upload D:" in verdict(old).plain


@pytest.mark.parametrize(("us", "text"), [
    (9016.0, "+9.0 ms"), (187_700.0, "+188 ms"), (18_340.0, "+18.3 ms"), (99_960.0, "+100 ms"),
    (-1234.0, "-1.2 ms"), (0.0, "+0.0 ms"), (None, "-")])
def test_increases_at_one_precision(us: float, text: str) -> None:
    assert signed_ms(us) == text


def test_one_way_loss_is_a_share_of_the_probes_that_set_out_that_way() -> None:
    """58 probes sent, 14 lost on the way out, 2 echoes lost on the way back (as measured
    in the upload phase of a run with 22 % dropped to the server: 14 of 58 is 24.1 %,
    where the share of the 44 answered said 31.8 %)."""
    samples = [ProbeSample(i, 0, i * 0.05, rtt_us=1000.0, up_ns=500_000, down_ns=500_000)
               for i in range(20)]
    received = set(range(20))
    for i in range(58):
        seq = 20 + i
        out_lost, back_lost = i < 14, 14 <= i < 16
        if not out_lost:
            received.add(seq)
        answered = not (out_lost or back_lost)
        samples.append(ProbeSample(seq, 1, 1 + i * 0.05,
                                   rtt_us=2000.0 if answered else None,
                                   up_ns=1_000_000 if answered else None,
                                   down_ns=1_000_000 if answered else None))
    log = ProbeLog(samples=tuple(samples), phases=(Phase("idle", False, 0.0, 1.0),
                                                   Phase("upload", True, 1.0, 4.0)),
                   transport="udp", server_received=frozenset(received))
    upload = latency.summarize(log).phases[1]
    assert upload.client_to_server is not None and upload.server_to_client is not None
    assert upload.client_to_server.lost == 14
    assert upload.client_to_server.lost_percent == pytest.approx(100 * 14 / 58)
    assert upload.server_to_client.lost == 2
    assert upload.server_to_client.lost_percent == pytest.approx(100 * 2 / 44)
    assert upload.rtt is not None and upload.rtt.lost_percent == pytest.approx(100 * 16 / 58)
