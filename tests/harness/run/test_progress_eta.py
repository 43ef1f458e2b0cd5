"""The run's time per cell (progress ETA, --max-wall-s) leaves out run-wide work that one cell
happened to do for all (a generated quality dataset)."""

from __future__ import annotations

import io
import time

from harness.run.campaign import _Campaign
from harness.run.progress import Progress


def test_eta_leaves_out_one_time_work():
    p = Progress(total=4, stream=io.StringIO())
    p.start_cell("a")
    p.cell_started -= 100.0  # the cell took 100 s, 90 of them building the dataset
    p.end_cell("ok", one_time_s=90.0)
    assert 9.5 <= p.cell_times[0] <= 25.0  # ~10 s, far from the ~100 s it took
    assert 28.0 <= p.eta() <= 75.0  # three cells left at ~10 s, not ~300 s


def test_budget_per_cell_leaves_out_one_time_work():
    camp = object.__new__(_Campaign)  # the budget arithmetic alone: no spec, no servers
    camp.t0, camp.done, camp.one_time_s = time.monotonic() - 300.0, 1, 240.0
    assert 59.0 <= camp.per_cell_s() <= 75.0  # ~60 s, not ~300 s
    camp.one_time_s = 0.0
    assert camp.per_cell_s() >= 299.0
