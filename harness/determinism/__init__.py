"""Determinism: the same temperature-0 requests through fresh, independent server processes,
compared bit for bit.

    workload (>= 120 distinct prompts, varied n)
      -> P fresh processes, one after another; each gets every request
         sequential: one at a time, in order   (must be bit-identical)
         concurrent: C in flight               (batch composition varies: drift is reported)
      -> per request: token ids and the exact float bits of every score vs process 0
      -> on drift: replay up to the last drifting request with FLASHREC_DEBUG_STEP_HASH=1 and
         read the STEP_HASH lines of each server log: the first step whose ``inputs`` differ is
         host-side state, the first whose ``outputs`` differ with equal inputs is numerics.

The replay keeps the drifting requests in their original context (everything sent before
them, same mode and concurrency): state-dependent drift, such as a stale host cache, needs it.

    bitwise.py    workload items, answers, bitwise comparison across processes
    stephash.py   STEP_HASH log parsing and the first divergent step
    processes.py  launching fresh servers and sending them the workload
    check.py      the run over modes, the step-hash replay, the report.json cut
    stage.py      the matrix's ``determinism:`` stage (``harness.run.stages``)

``flashrec-bench determinism`` is ``harness.cli.determinism``.
"""

from __future__ import annotations

from harness.determinism.bitwise import (
    DEFAULT_NS,
    Answer,
    Item,
    bits,
    compare_processes,
    drift,
    identical,
    make_workload,
    parse_answer,
)
from harness.determinism.check import compact, localise, run_determinism
from harness.determinism.processes import Plan, run_processes
from harness.determinism.stephash import (
    AFTER_STEPS,
    DEBUG_ENV,
    HOST_STATE,
    NUMERICS,
    StepHash,
    first_divergence,
    parse_step_hashes,
)

__all__ = [
    "AFTER_STEPS",
    "DEBUG_ENV",
    "DEFAULT_NS",
    "HOST_STATE",
    "NUMERICS",
    "Answer",
    "Item",
    "Plan",
    "StepHash",
    "bits",
    "compact",
    "compare_processes",
    "drift",
    "first_divergence",
    "identical",
    "localise",
    "make_workload",
    "parse_answer",
    "parse_step_hashes",
    "run_determinism",
    "run_processes",
]
