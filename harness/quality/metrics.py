"""RecIF-Bench metrics of one sample, and their means over samples with confidence intervals.

Definitions follow the OpenOneRec benchmark (its recommendation evaluator, ``select_k:
first_k``): the predictions are the beams in the order the server returned them (duplicates
and invalid beams keep their slot), ``top = predictions[:k]``, and

* ``pass@k``: some prediction in ``top`` is one of the ground-truth ids;
* ``position1_pass@k``: some prediction in ``top`` is the *first* ground-truth id;
* ``recall@k``: ``|set(top) & truth| / |truth|``.

The same three by PID (``pid_`` prefix) map every predicted SID to one item id
(:mod:`harness.quality.pids`); an unmapped SID is no item. Means over samples carry a 95%
interval: Wilson score for the pass rates (0/1 per sample), a seeded percentile bootstrap of
the mean for recall (a fraction per sample).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np

KINDS = ("pass", "position1_pass", "recall")
BINARY = ("pass", "position1_pass")
Z95 = 1.959963984540054


def sample_metrics(
    predicted: Sequence[Hashable | None],
    truth: Sequence[Hashable],
    ks: Sequence[int],
    prefix: str = "",
) -> dict[str, float]:
    """pass / position1_pass / recall at each k of one sample (``None`` predictions never hit;
    an empty ``truth`` scores 0 everywhere, as the benchmark scores a sample it cannot judge)."""
    want = set(truth)
    first = truth[0] if truth else None
    out: dict[str, float] = {}
    for k in ks:
        top = [p for p in predicted[:k] if p is not None]
        hits = want.intersection(top)
        out[f"{prefix}pass@{k}"] = 1.0 if hits else 0.0
        out[f"{prefix}position1_pass@{k}"] = 1.0 if first is not None and first in top else 0.0
        out[f"{prefix}recall@{k}"] = len(hits) / len(want) if want else 0.0
    return out


def metric_names(ks: Sequence[int], pid: bool) -> list[str]:
    """The metric names of :func:`sample_metrics` (SID, then PID when ``pid``)."""
    prefixes = ["", "pid_"] if pid else [""]
    return [f"{p}{kind}@{k}" for p in prefixes for kind in KINDS for k in ks]


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion (exact-enough at 0 and 1, unlike the normal one)."""
    if n <= 0:
        return math.nan, math.nan
    p = successes / n
    den = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_mean(
    values: np.ndarray, n_boot: int = 2000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values``."""
    if values.size == 0:
        return math.nan, math.nan
    if values.size == 1 or np.all(values == values[0]):
        return float(values[0]), float(values[0])
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(n_boot, values.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(means, [tail, 100.0 - tail])
    return float(lo), float(hi)


def summarize_metric(name: str, values: Sequence[float], seed: int = 0) -> dict:
    """``{value, ci_low, ci_high, ci, n}``: the mean over samples and its 95% interval."""
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        raise ValueError(f"{name}: no samples to average")
    kind = name.split("@")[0].removeprefix("pid_")
    if kind in BINARY:
        lo, hi = wilson(float(a.sum()), int(a.size))
        how = "wilson"
    else:
        lo, hi = bootstrap_mean(a, seed=seed)
        how = "bootstrap"
    return {"value": float(a.mean()), "ci_low": lo, "ci_high": hi, "ci": how, "n": int(a.size)}


def rate(count: int, total: int) -> dict:
    """A rate over beams with its Wilson interval."""
    lo, hi = wilson(count, total)
    return {
        "value": count / total if total else math.nan,
        "ci_low": lo,
        "ci_high": hi,
        "ci": "wilson",
        "count": count,
        "n": total,
    }
