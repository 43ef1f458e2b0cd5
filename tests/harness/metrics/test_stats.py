"""harness.metrics.stats against known distributions (and scipy where installed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.metrics import stats


def test_bootstrap_ci_covers_the_true_median():
    rng = np.random.default_rng(0)
    trials, hits = 300, 0
    for t in range(trials):
        sample = rng.normal(100.0, 10.0, size=25)
        lo, hi = stats.bootstrap_ci(sample, 0.95, n_boot=1000, seed=t)
        hits += lo <= 100.0 <= hi
    coverage = hits / trials
    assert 0.88 <= coverage <= 0.995, coverage


def test_bootstrap_ci_of_identical_values_is_a_point():
    assert stats.bootstrap_ci([3.0, 3.0, 3.0]) == (3.0, 3.0)
    assert stats.bootstrap_ci([5.0]) == (5.0, 5.0)
    assert all(math.isnan(x) for x in stats.bootstrap_ci([]))


def test_cv_of_a_known_distribution():
    rng = np.random.default_rng(1)
    assert stats.cv(rng.normal(200.0, 10.0, size=20000)) == pytest.approx(0.05, rel=0.03)
    assert math.isnan(stats.cv([1.0]))
    assert stats.noise_band(rng.normal(100.0, 2.0, size=20000), k=2.0) == pytest.approx(
        0.04, rel=0.05
    )


def test_summarize_fields():
    s = stats.summarize([10.0, 11.0, 12.0, None])
    assert s["median"] == 11.0 and s["n"] == 3
    assert s["ci95_low"] <= 11.0 <= s["ci95_high"]
    assert s["cv"] == pytest.approx(1.0 / 11.0)
    assert s["values"] == [10.0, 11.0, 12.0]


def test_welch_detects_shift_and_holds_its_level():
    rng = np.random.default_rng(2)
    _, p = stats.welch(rng.normal(100, 2, 5), rng.normal(80, 2, 5))
    assert p < 1e-3
    false = sum(stats.welch(rng.normal(0, 1, 6), rng.normal(0, 1, 6))[1] < 0.05 for _ in range(600))
    assert 0.02 <= false / 600 <= 0.09


def test_mann_whitney_exact_small_samples():
    u, p = stats.mann_whitney([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert u == 25 and p == pytest.approx(2 / 252)
    u, p = stats.mann_whitney([1, 2, 3], [4, 5, 6])
    assert p == pytest.approx(0.1)  # three rounds a side can never reach p < 0.05
    _, p = stats.mann_whitney([1, 2, 3], [1, 2, 3])
    assert p == pytest.approx(1.0)


def test_degenerate_inputs():
    assert stats.welch([1, 1, 1], [1, 1, 1]) == (0.0, 1.0)
    assert stats.welch([1, 1, 1], [2, 2, 2])[1] == 0.0
    assert math.isnan(stats.welch([1], [2, 3])[1])


def test_against_scipy():
    ss = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    for m, n in [(3, 3), (5, 8), (20, 25), (40, 40)]:
        a, b = rng.normal(0, 1, m), rng.normal(0.5, 1.5, n)
        assert stats.welch(a, b)[1] == pytest.approx(
            ss.ttest_ind(b, a, equal_var=False).pvalue, rel=1e-9
        )
        assert stats.mann_whitney(a, b)[1] == pytest.approx(
            ss.mannwhitneyu(b, a, alternative="two-sided").pvalue, rel=1e-6
        )
    a, b = np.round(rng.normal(0, 1, 30), 1), np.round(rng.normal(0.3, 1, 30), 1)  # ties
    assert stats.mann_whitney(a, b)[1] == pytest.approx(
        ss.mannwhitneyu(b, a, alternative="two-sided", method="asymptotic").pvalue, rel=1e-9
    )
    assert stats.betainc(2.5, 3.5, 0.3) == pytest.approx(ss.beta.cdf(0.3, 2.5, 3.5), rel=1e-12)


def test_holm_adjusted_p_values():
    """Holm's step-down adjustment, worked by hand: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3,
    2, 1 gives 0.02, 0.03, 0.06, 0.04 -> made monotone 0.02, 0.03, 0.06, 0.06; returned in the
    input order, capped at 1."""
    from harness.metrics.stats import holm

    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == [1.0, 1.0]
    assert holm([]) == []
    assert holm([0.2]) == [0.2]


def test_wider_band_takes_the_widest_finite_band_or_zero():
    from harness.metrics.stats import finite, wider_band

    assert wider_band(0.02, 0.05) == 0.05
    assert wider_band(0.02, float("nan"), None) == 0.02
    assert wider_band() == 0.0 and wider_band(None, float("inf")) == 0.0
    assert finite(3) and finite(0.5)
    assert not finite(float("nan")) and not finite(None) and not finite("1")
