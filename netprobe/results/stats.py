"""Statistics of repeated measurements: the summary a lab report gives for N trials.

For a figure measured in N trials: mean, median, sample standard deviation, min, max, and
the confidence interval of the mean from Student's t distribution (the trials are few, so
the normal distribution would make the interval too narrow: with 5 trials the 95 % factor
is 2.776, not 1.960).

The t quantile is computed, not looked up: the two-sided t probability has a closed form
for whole degrees of freedom (Abramowitz and Stegun 26.7.3), which is inverted by
bisection. scipy is not needed, and the result is exact to floating-point precision for
any number of trials. Nothing here knows about results or tools.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Callable

from attrs import frozen

DEFAULT_CONFIDENCE = 0.95
"""Confidence level of the interval of the mean shown in reports."""

_SERIES_LIMIT = 1000
"""Above this many degrees of freedom the Cornish-Fisher expansion replaces the exact series
(which costs one term per two degrees of freedom; the expansion's error there is < 1e-9)."""


@frozen
class Summary:
    """One figure over N trials (only the trials that measured it)."""

    n: int
    """How many values the summary is made of."""
    mean: float
    """Arithmetic mean."""
    median: float
    """Middle value (mean of the two middle values for even n)."""
    stdev: float | None
    """Sample standard deviation (n - 1 in the denominator); None for a single value."""
    min: float
    """Smallest value."""
    max: float
    """Largest value."""
    ci_low: float | None
    """Lower end of the confidence interval of the mean; None for a single value."""
    ci_high: float | None
    """Upper end of the confidence interval of the mean; None for a single value."""
    confidence: float = DEFAULT_CONFIDENCE
    """Confidence level of the interval (0.95: 95 %)."""

    @property
    def ci_half_width(self) -> float | None:
        """Half the width of the confidence interval (the ``±`` figure)."""
        if self.ci_low is None or self.ci_high is None:
            return None
        return (self.ci_high - self.ci_low) / 2

    @property
    def cv(self) -> float | None:
        """Coefficient of variation: standard deviation / mean (None if undefined)."""
        if self.stdev is None or self.mean == 0:
            return None
        return self.stdev / abs(self.mean)


def summarize(values: Iterable[float | None],
              confidence: float = DEFAULT_CONFIDENCE) -> Summary | None:
    """The summary of ``values``, unknown values (None) left out; None if none is known."""
    known = [float(v) for v in values if v is not None]
    if not known:
        return None
    mean = statistics.fmean(known)
    stdev = statistics.stdev(known) if len(known) > 1 else None
    interval = mean_interval(known, confidence)
    return Summary(
        n=len(known), mean=mean, median=statistics.median(known), stdev=stdev,
        min=min(known), max=max(known), ci_low=interval[0] if interval else None,
        ci_high=interval[1] if interval else None, confidence=confidence,
    )


def mean_interval(values: list[float], confidence: float = DEFAULT_CONFIDENCE
                  ) -> tuple[float, float] | None:
    """Confidence interval of the mean: mean ± t(1 - (1 - c)/2, n - 1) · s / √n.

    None for fewer than two values (a single trial says nothing about its spread).
    """
    n = len(values)
    if n < 2:
        return None
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    mean = statistics.fmean(values)
    half = t_quantile(1 - (1 - confidence) / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean - half, mean + half


# --- Student's t -------------------------------------------------------------------------


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` (a whole number >= 1) degrees of freedom."""
    _check_df(df)
    if t < 0:
        return 1.0 - t_cdf(-t, df)
    return (1.0 + _two_sided(t, df)) / 2


def _two_sided(t: float, df: int) -> float:
    """A(t|df) = P(|T| < t), t >= 0, by Abramowitz and Stegun 26.7.3.

    With θ = atan(t/√df): for odd df, (2/π)(θ + sinθ cosθ Σ d_k cos^2k θ) with
    d_k = d_(k-1) · 2k/(2k+1); for even df, sinθ Σ c_k cos^2k θ with
    c_k = c_(k-1) · (2k-1)/(2k); k runs to (df-3)/2 and (df-2)/2 respectively.
    """
    cos2 = df / (df + t * t)  # cos²θ, without computing θ
    sin = t / math.sqrt(df + t * t)
    if df % 2 == 0:
        return sin * _series(cos2, (df - 2) // 2, lambda k: (2 * k - 1) / (2 * k))
    theta = math.atan(t / math.sqrt(df))
    if df == 1:
        return 2 * theta / math.pi
    cos = math.sqrt(cos2)
    inner = _series(cos2, (df - 3) // 2, lambda k: (2 * k) / (2 * k + 1))
    return 2 / math.pi * (theta + sin * cos * inner)


def _series(cos2: float, last: int, ratio: Callable[[int], float]) -> float:
    """Σ_(k=0..last) a_k cos2^k with a_0 = 1 and a_k = a_(k-1) · ratio(k)."""
    total = term = 1.0
    for k in range(1, last + 1):
        term *= ratio(k) * cos2
        total += term
        if term < 1e-17 * total:  # the rest cannot change the sum
            break
    return total


def t_quantile(p: float, df: int) -> float:
    """The t with P(T <= t) = p for Student's t with ``df`` degrees of freedom.

    ``t_quantile(0.975, n - 1)`` is the factor of the 95 % interval of the mean of n values.
    """
    _check_df(df)
    if not 0 < p < 1:
        raise ValueError(f"p must be between 0 and 1, got {p}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    if p == 0.5:
        return 0.0
    if df > _SERIES_LIMIT:
        return _cornish_fisher(p, df)
    return _bisect(lambda t: t_cdf(t, df), p)


def _bisect(cdf: Callable[[float], float], p: float) -> float:
    """Invert an increasing ``cdf`` on [0, ∞) at ``p`` (bounded loops: a CDF is monotone)."""
    low, high = 0.0, 1.0
    for _ in range(64):  # 2**64 is beyond any quantile with p < 1 in floating point
        if cdf(high) >= p:
            break
        low, high = high, high * 2
    for _ in range(200):
        middle = (low + high) / 2
        if middle in (low, high):  # adjacent floats: as exact as it gets
            break
        if cdf(middle) < p:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _cornish_fisher(p: float, df: int) -> float:
    """The t quantile from the normal one (Cornish-Fisher expansion; for large df)."""
    z = statistics.NormalDist().inv_cdf(p)
    v = float(df)
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
            + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4))


def _check_df(df: int) -> None:
    if not isinstance(df, int) or df < 1:
        raise ValueError(f"degrees of freedom must be a whole number >= 1, got {df!r}")
