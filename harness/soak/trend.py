"""The trend of one resource over a soak: least squares of its value on cumulative requests.

``value = a + b * requests``; ``b`` scaled to growth per 1,000 requests, its 95% interval
``b +- t(0.975, n - 2) * se(b)`` with ``se(b) = sqrt(SSR / (n - 2) / Sxx)`` from the
residuals. The verdict is ``grows`` only when the whole interval lies above the resource's
tolerance per 1,000 requests (a leak shows as a slope whose lower bound clears it) and the
lower bound, over the requests fitted, adds up to more than its allowance for the run (a
short run's warm-up tail is no leak); ``flat`` otherwise, and ``n/a`` with fewer than 3
samples or no spread in requests.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

PER = 1000.0  # the slope's unit: growth per this many requests


@dataclass(frozen=True)
class Trend:
    """One resource's fitted growth per 1,000 requests, its 95% interval and the verdict."""

    resource: str
    samples: int
    first: float
    last: float
    slope: float  # per 1,000 requests
    low: float
    high: float
    tolerance: float  # per 1,000 requests
    allowance: float  # over the requests fitted
    verdict: str  # grows | flat | n/a

    @property
    def grows(self) -> bool:
        return self.verdict == "grows"

    def row(self) -> dict:
        return {
            k: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
            for k, v in asdict(self).items()
        }


def fit(
    resource: str,
    requests: list[float],
    values: list[float],
    tolerance: float,
    allowance: float = 0.0,
    level: float = 0.95,
) -> Trend:
    """The trend of ``values`` (one per sample) on ``requests`` (cumulative, same length);
    samples with a missing (None / NaN) value are left out."""
    pairs = [
        (float(x), float(v))
        for x, v in zip(requests, values, strict=True)
        if v is not None and math.isfinite(float(v))
    ]
    first = pairs[0][1] if pairs else math.nan
    last = pairs[-1][1] if pairs else math.nan
    x = np.array([p[0] for p in pairs])
    y = np.array([p[1] for p in pairs])
    n = len(pairs)
    if n < 3 or float(np.ptp(x)) == 0.0:
        nan = math.nan
        return Trend(resource, n, first, last, nan, nan, nan, tolerance, allowance, "n/a")
    xm = x - x.mean()
    sxx = float(xm @ xm)
    b = float(xm @ (y - y.mean())) / sxx
    resid = y - y.mean() - b * xm
    se = math.sqrt(float(resid @ resid) / (n - 2) / sxx)
    half = float(stats.t.ppf(0.5 + level / 2, n - 2)) * se
    slope, low, high = b * PER, (b - half) * PER, (b + half) * PER
    grows = low > tolerance and low * float(np.ptp(x)) / PER > allowance
    verdict = "grows" if grows else "flat"
    return Trend(resource, n, first, last, slope, low, high, tolerance, allowance, verdict)
