"""Continuous batching of beam rows (``Scheduler``) over small managers:

scheduler.py   Scheduler: the step loop and the API the engine and its loop call
admission.py   the waiting queue, its order (LPM with aging, or FCFS), admission
cache.py       prompt KV slots, beam rows and the radix cache: reserve, publish, release
prefill.py     one forward over the admitted prompts; their first beams
decode.py      one forward over every running request's rows; the static step path
expand.py      the eager beam expansion (candidates, top-n, KV reorder by parent)
results.py     device ranking, one device-to-host copy per step, results
debug.py       STEP_HASH lines (FLASHREC_DEBUG_STEP_HASH)
state.py       ReqState, SchedulerStats, shared helpers
"""

from __future__ import annotations

from flashrec.engine.scheduler.decode import row_chunks
from flashrec.engine.scheduler.results import PendingResults
from flashrec.engine.scheduler.scheduler import Scheduler
from flashrec.engine.scheduler.state import ReqState, SchedulerStats

__all__ = ["PendingResults", "ReqState", "Scheduler", "SchedulerStats", "row_chunks"]
