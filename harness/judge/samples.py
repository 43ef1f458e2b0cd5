"""Two runs' quality metrics compared sample by sample (the same dataset, in the same order).

A quality metric of a cell (``recall@32`` ...; ``unit: samples``, see
:func:`harness.quality.stage.cell_metrics`) holds one value per sample. Two runs of one dataset
pair their samples: ``d_i = new_i - base_i``; the change is ``mean(d) / |mean(base)|`` and its
two-sided p-value that of the paired t-test of ``mean(d) == 0``. A decode is deterministic, so
there is no noise band: a change the samples support (``p < alpha``) stands, and a loss of
recall is *regressed* like a loss of QPS. Runs of different sample counts compare unpaired
(Welch over the samples).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from harness.metrics.stats import significance, t_two_sided_p
from harness.names import direction
from harness.report.model import Metric, as_metric


def is_sample_metric(entry: Metric | None) -> bool:
    """Whether a cell metric holds per-sample values (a quality eval's), not per-round ones."""
    return entry is not None and entry.unit == "samples"


def _paired_p(d: np.ndarray) -> float:
    sd = d.std(ddof=1) if d.size > 1 else 0.0
    if sd == 0:
        return 1.0 if d.mean() == 0 else 0.0
    return t_two_sided_p(float(d.mean() / (sd / math.sqrt(d.size))), d.size - 1.0)


def compare_samples(name: str, base: Metric | dict, new: Metric | dict, alpha: float) -> dict:
    """Verdict for one quality metric of one cell: improved / regressed / within_noise / n/a."""
    base, new = as_metric(base), as_metric(new)
    a = np.asarray(base.values or [], dtype=float)
    b = np.asarray(new.values or [], dtype=float)
    out: dict[str, Any] = {"base": base.median, "new": new.median, "unit": "samples"}
    if a.size < 2 or b.size < 2:
        return {**out, "verdict": "n/a", "reason": "fewer than 2 samples on a side"}
    mean_a, mean_b = float(a.mean()), float(b.mean())
    if mean_a != 0:
        delta = (mean_b - mean_a) / abs(mean_a)
    else:
        delta = 0.0 if mean_b == 0 else math.copysign(math.inf, mean_b)
    paired = a.size == b.size
    p = _paired_p(b - a) if paired else significance(list(a), list(b), "welch")
    out.update(delta_pct=100 * delta, band_pct=0.0, p_value=p, samples=int(b.size))
    out["test"] = "paired_t over samples" if paired else "welch over samples"
    if not (math.isfinite(p) and p < alpha) or delta == 0:
        return {**out, "verdict": "within_noise", "reason": "not significant"}
    d = direction(name)
    if d == 0:
        return {**out, "verdict": "changed"}
    return {**out, "verdict": "improved" if delta * d > 0 else "regressed"}
