"""Statistics over rounds: medians, bootstrap intervals, CV, noise bands, significance tests.

Pure functions of numbers (no records, no I/O). The tests need no scipy: Welch's t uses the
regularized incomplete beta function, Mann-Whitney is exact for small tie-free samples and
normal-approximated (tie- and continuity-corrected) otherwise.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np

NAN = float("nan")


def finite(x: Any) -> bool:
    """``x`` is a finite int or float (not None, NaN, an infinity or another type)."""
    return isinstance(x, (int, float)) and math.isfinite(x)


def wider_band(*bands: Any) -> float:
    """The widest of the finite noise bands given (0.0 when none is): the relative change a
    comparison of two cells must exceed."""
    return max((b for b in bands if finite(b)), default=0.0)


def _arr(values) -> np.ndarray:
    a = np.asarray([v for v in values if v is not None], dtype=float)
    return a[np.isfinite(a)]


def cv(values) -> float:
    """Coefficient of variation: sample std (ddof=1) / |mean|; NaN for < 2 values or mean 0."""
    a = _arr(values)
    if a.size < 2 or a.mean() == 0:
        return NAN
    return float(a.std(ddof=1) / abs(a.mean()))


def bootstrap_ci(
    values, confidence: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the median."""
    a = _arr(values)
    if a.size == 0:
        return NAN, NAN
    if a.size == 1:
        return float(a[0]), float(a[0])
    rng = np.random.default_rng(seed)
    meds = np.median(a[rng.integers(0, a.size, size=(n_boot, a.size))], axis=1)
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(meds, [tail, 100.0 - tail])
    return float(lo), float(hi)


def noise_band(values, k: float = 2.0) -> float:
    """The relative noise band of a metric: ``k`` x its CV over rounds (NaN for < 2 rounds).

    With ``k = 2`` about 95% of single rounds of an unchanged system fall within
    ``median * (1 +- band)`` when round-to-round noise is roughly normal.
    """
    c = cv(values)
    return k * c if math.isfinite(c) else NAN


def summarize(
    values, confidence: float = 0.95, n_boot: int = 2000, seed: int = 0, band_k: float = 2.0
) -> dict:
    """``{median, ci95_low, ci95_high, cv, noise_band, n, values}`` of one metric's rounds."""
    a = _arr(values)
    lo, hi = bootstrap_ci(a, confidence, n_boot, seed)
    return {
        "median": float(np.median(a)) if a.size else NAN,
        "ci95_low": lo,
        "ci95_high": hi,
        "cv": cv(a),
        "noise_band": noise_band(a, band_k),
        "n": int(a.size),
        "values": [float(v) for v in values if v is not None],
    }


# --------------------------------------------------------------------------- t distribution


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for num in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """Two-sided p-value of Student's t with ``df`` degrees of freedom."""
    if not math.isfinite(t):
        return 0.0 if math.isinf(t) else NAN
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def welch(a, b) -> tuple[float, float]:
    """Welch's unequal-variance t-test: (t, two-sided p). NaN p with < 2 values a side."""
    x, y = _arr(a), _arr(b)
    if x.size < 2 or y.size < 2:
        return NAN, NAN
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    diff = y.mean() - x.mean()
    if vx + vy == 0:
        return (0.0, 1.0) if diff == 0 else (math.copysign(math.inf, diff), 0.0)
    t = diff / math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx**2 / (x.size - 1) + vy**2 / (y.size - 1))
    return float(t), t_two_sided_p(float(t), float(df))


# --------------------------------------------------------------------------- Mann-Whitney


@cache
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """Number of arrangements giving each U = 0..m*n for sample sizes m, n (no ties)."""
    if m == 0 or n == 0:
        return (1,)
    with_m = _u_counts(m - 1, n)  # largest value in the first sample: adds n to U
    without = _u_counts(m, n - 1)
    out = [0] * (m * n + 1)
    for u, c in enumerate(with_m):
        out[u + n] += c
    for u, c in enumerate(without):
        out[u] += c
    return tuple(out)


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def mann_whitney(a, b) -> tuple[float, float]:
    """Mann-Whitney U test of ``b`` vs ``a``: (U of b, two-sided p)."""
    x, y = _arr(a), _arr(b)
    m, n = x.size, y.size
    if m == 0 or n == 0:
        return NAN, NAN
    allv = np.concatenate([x, y])
    order = allv.argsort(kind="mergesort")
    ranks = np.empty(m + n)
    sorted_v = allv[order]
    i = 0
    ties = 0.0
    while i < m + n:
        j = i
        while j + 1 < m + n and sorted_v[j + 1] == sorted_v[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    u = float(ranks[m:].sum() - n * (n + 1) / 2.0)
    if ties == 0 and m * n <= 400:
        counts = _u_counts(m, n)
        total = float(sum(counts))
        k = int(round(u))
        low = sum(counts[: k + 1]) / total
        high = sum(counts[k:]) / total
        return u, min(1.0, 2.0 * min(low, high))
    mu = m * n / 2.0
    var = m * n / 12.0 * ((m + n + 1) - ties / ((m + n) * (m + n - 1)))
    if var <= 0:
        return u, 1.0
    z = (abs(u - mu) - 0.5) / math.sqrt(var)
    return u, min(1.0, 2.0 * _normal_sf(max(z, 0.0)))


def holm(p_values) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: with m tests, the i-th smallest
    p (i = 0..m-1) becomes max over j <= i of min(1, (m - j) * p_(j)). Rejecting where the
    adjusted p < alpha keeps the chance of any false rejection among the m at most alpha,
    whatever the dependence between the tests (correlated metrics such as QPS and mean latency
    included); it never rejects less than Bonferroni."""
    p = [float(x) for x in p_values]
    m = len(p)
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda k: p[k])):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


TESTS = {"welch": welch, "mannwhitney": mann_whitney}


def significance(a, b, test: str = "welch") -> float:
    """Two-sided p-value that rounds ``a`` and ``b`` come from distributions with equal
    location, by the named test (``welch`` or ``mannwhitney``)."""
    return TESTS[test](a, b)[1]


def ratio_ci(
    base, other, paired: bool = False, confidence: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """``median(other) / median(base)`` of two engines' round values and its percentile
    bootstrap interval. ``paired`` (rounds interleaved, round i of both taken seconds apart):
    the rounds are resampled together, so drift both saw cancels; else each side on its own.
    NaN where a side has no positive median."""
    a, b = np.asarray(base, dtype=float), np.asarray(other, dtype=float)
    if paired and a.size == b.size:
        keep = np.isfinite(a) & np.isfinite(b)
        a, b = a[keep], b[keep]
    else:
        paired, a, b = False, _arr(a), _arr(b)
    if a.size == 0 or b.size == 0 or np.median(a) <= 0:
        return NAN, NAN, NAN
    point = float(np.median(b) / np.median(a))
    if a.size == 1 and b.size == 1:
        return point, point, point
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, a.size, size=(n_boot, a.size))
    ib = ia if paired else rng.integers(0, b.size, size=(n_boot, b.size))
    den = np.median(a[ia], axis=1)
    ratios = np.median(b[ib], axis=1)[den > 0] / den[den > 0]
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(ratios, [tail, 100.0 - tail])
    return point, float(lo), float(hi)
