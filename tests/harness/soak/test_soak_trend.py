"""The soak's trend fit on synthetic series: a growing series is called grows with its slope,
a flat noisy one flat; too few samples give no verdict; a short run's small growth is inside
the run allowance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.soak.trend import fit


def test_a_growing_series_grows_with_the_right_slope():
    rng = np.random.default_rng(0)
    x = np.arange(0, 20_000, 500.0)  # 40 samples over 20,000 requests
    y = 300.0 + 0.004 * x + rng.normal(0, 0.5, len(x))  # 4 MiB per 1,000 requests + noise
    t = fit("rss_mib[engine]", list(x), list(y), tolerance=1.0, allowance=8.0)
    assert t.verdict == "grows" and t.grows
    assert t.low < 4.0 < t.high and abs(t.slope - 4.0) < 0.1
    assert t.samples == 40 and t.first == pytest.approx(y[0]) and t.last == pytest.approx(y[-1])


def test_a_flat_noisy_series_is_flat():
    rng = np.random.default_rng(1)
    x = np.arange(0, 20_000, 500.0)
    y = 300.0 + rng.normal(0, 5.0, len(x))
    t = fit("rss_mib[engine]", list(x), list(y), tolerance=1.0, allowance=8.0)
    assert t.verdict == "flat" and t.low < 0 < t.high


def test_the_interval_covers_the_true_slope_about_95_percent_of_the_time():
    rng = np.random.default_rng(2)
    x = list(np.arange(0, 5_000, 250.0))
    covered = 0
    for _ in range(400):
        y = 10.0 + 0.002 * np.array(x) + rng.normal(0, 1.0, len(x))
        t = fit("r", x, list(y), tolerance=0.0)
        covered += t.low <= 2.0 <= t.high
    assert 0.90 <= covered / 400 <= 0.99


def test_growth_below_the_tolerance_or_the_run_allowance_is_flat():
    x = [0.0, 100.0, 200.0, 300.0, 400.0]
    y = [1.0, 1.2, 1.4, 1.6, 1.8]  # exactly 2 per 1,000 requests
    assert fit("r", x, y, tolerance=1.0).verdict == "grows"
    assert fit("r", x, y, tolerance=3.0).verdict == "flat"  # below the tolerance
    # 2 per 1,000 over 400 requests is 0.8: within an allowance of 1 for the run
    assert fit("r", x, y, tolerance=1.0, allowance=1.0).verdict == "flat"
    assert fit("r", x, y, tolerance=math.inf).verdict == "flat"  # report only


def test_too_few_samples_or_missing_values_give_no_verdict():
    assert fit("r", [1.0, 2.0], [1.0, 2.0], 0.0).verdict == "n/a"
    assert fit("r", [5.0, 5.0, 5.0], [1.0, 2.0, 3.0], 0.0).verdict == "n/a"
    # missing values are left out of the fit
    t = fit("r", [0.0, 1000.0, 2000.0, 3000.0], [None, 1.0, math.nan, 1.0], 0.0)
    assert t.verdict == "n/a" and t.samples == 2
    t = fit("r", [0.0, 1000.0, 2000.0, 3000.0], [1.0, None, 1.0, 1.0], 0.0)
    assert t.verdict == "flat" and t.samples == 3 and t.slope == 0.0
    with pytest.raises(ValueError):
        fit("r", [0.0, 1.0], [1.0], 0.0)  # lengths differ
