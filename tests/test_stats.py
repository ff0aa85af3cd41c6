"""netprobe.results.stats against hand-computed values and published Student's t tables."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netprobe.results.stats import mean_interval, summarize, t_cdf, t_quantile

from .budget import scaled

# Two-sided 95 % critical values t(0.975, df), as printed in statistics textbooks (3 decimals).
T_975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
    9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120,
    17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064,
    25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000,
    120: 1.980, 1000: 1.962,
}


@pytest.mark.parametrize(("df", "expected"), sorted(T_975.items()))
def test_t_quantile_matches_the_printed_table(df: int, expected: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)


@pytest.mark.parametrize(("p", "df", "expected"), [
    (0.975, 4, 2.776445105),   # more digits than the table prints
    (0.975, 9, 2.262157163),
    (0.975, 29, 2.045229642),
    (0.95, 10, 1.812461123),   # one-sided 95 %
    (0.995, 5, 4.032142984),   # two-sided 99 %
    (0.9995, 3, 12.92397863),  # two-sided 99.9 %
])
def test_t_quantile_other_levels(p: float, df: int, expected: float) -> None:
    assert t_quantile(p, df) == pytest.approx(expected, rel=1e-8)


def test_t_quantile_closed_forms() -> None:
    # df = 1 is the Cauchy distribution: t = tan(π (p - 1/2)).
    assert t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-12)
    # df = 2: P(T <= t) = 1/2 + t / (2 √(2 + t²)), so t = √(2 a² / (1 - a²)), a = 2p - 1.
    a = 0.95
    assert t_quantile(0.975, 2) == pytest.approx(math.sqrt(2 * a * a / (1 - a * a)), rel=1e-12)


def test_t_quantile_large_df_approaches_the_normal() -> None:
    assert t_quantile(0.975, 5000) == pytest.approx(1.960439, abs=1e-6)
    assert t_quantile(0.975, 10**6) == pytest.approx(1.959966, abs=1e-6)
    # The expansion used beyond 1000 df agrees with the exact series where they meet.
    assert t_quantile(0.975, 1001) == pytest.approx(t_quantile(0.975, 1000), abs=1e-5)


def test_t_quantile_symmetry_and_middle() -> None:
    assert t_quantile(0.5, 7) == 0.0
    assert t_quantile(0.025, 7) == pytest.approx(-t_quantile(0.975, 7), rel=1e-12)


def test_t_cdf_known_points() -> None:
    assert t_cdf(0.0, 3) == 0.5
    assert t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/π
    assert t_cdf(-2.0, 2) == pytest.approx(0.5 - 2 / (2 * math.sqrt(6)))


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_bad_degrees_of_freedom(bad: float) -> None:
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile(0.975, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5])
def test_bad_probability(bad: float) -> None:
    with pytest.raises(ValueError, match="p must be"):
        t_quantile(bad, 5)


@settings(max_examples=scaled(60), deadline=None)
@given(df=st.integers(1, 400), p=st.floats(0.501, 0.9995))
def test_t_quantile_inverts_the_cdf(df: int, p: float) -> None:
    assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-12)


# --- summaries ---------------------------------------------------------------------------


def test_summary_by_hand() -> None:
    # 9..13: mean 11, sd √(10/4) = 1.58114, s/√5 = 0.70711, t(0.975, 4) = 2.77645:
    # half width 1.96324, interval 9.03676 .. 12.96324.
    summary = summarize([9, 13, 10, 12, 11])
    assert summary is not None
    assert (summary.n, summary.mean, summary.median, summary.min, summary.max) == (
        5, 11.0, 11.0, 9.0, 13.0)
    assert summary.stdev == pytest.approx(1.581139, abs=1e-6)
    assert summary.ci_low == pytest.approx(9.036757, abs=1e-6)
    assert summary.ci_high == pytest.approx(12.963243, abs=1e-6)
    assert summary.ci_half_width == pytest.approx(1.963243, abs=1e-6)
    assert summary.cv == pytest.approx(1.581139 / 11, abs=1e-6)


def test_mean_interval_by_hand() -> None:
    # 2 4 4 4 5 5 7 9: mean 5, s = √(32/7) = 2.138090, s/√8 = 0.755929, t(0.975, 7) =
    # 2.364624: half width 0.755929 x 2.364624 = 1.787488.
    low, high = mean_interval([2, 4, 4, 4, 5, 5, 7, 9]) or (0.0, 0.0)
    assert (low, high) == (pytest.approx(3.212512, abs=1e-6), pytest.approx(6.787488, abs=1e-6))


def test_other_confidence_level() -> None:
    # Two values 1 and 3: mean 2, s = √2, s/√2 = 1, t(0.995, 1) = 63.65674: 99 % half width.
    summary = summarize([1, 3], confidence=0.99)
    assert summary is not None and summary.ci_half_width == pytest.approx(63.65674, rel=1e-6)


def test_unknown_values_are_left_out_and_single_values_have_no_spread() -> None:
    summary = summarize([None, 4.0, None])
    assert summary is not None and summary.n == 1 and summary.mean == 4.0
    assert summary.stdev is None and summary.ci_low is None and summary.ci_half_width is None
    assert summarize([None, None]) is None
    assert summarize([]) is None


def test_even_count_median_and_identical_values() -> None:
    summary = summarize([1, 2, 3, 10])
    assert summary is not None and summary.median == 2.5
    same = summarize([7, 7, 7])
    assert same is not None and same.stdev == 0 and same.ci_low == same.ci_high == 7


def test_bad_confidence() -> None:
    with pytest.raises(ValueError, match="confidence"):
        mean_interval([1.0, 2.0], confidence=1.5)
