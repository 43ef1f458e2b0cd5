"""``STEP_HASH`` log lines (written by servers run with ``FLASHREC_DEBUG_STEP_HASH=1``) and
the first step where two runs of one request diverge: differing ``inputs`` are host-side
state, differing ``outputs`` with equal inputs are numerics."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

DEBUG_ENV = "FLASHREC_DEBUG_STEP_HASH"
HOST_STATE, NUMERICS = "inputs differ: host-side state", "numerics"
AFTER_STEPS = "steps agree: results differ after the last step"
_STEP = re.compile(
    r"STEP_HASH rid=(\S+) step=(\d+) phase=(\w+) inputs=(\S+) outputs=(\S+)"
    r"(?: kv=(\S+))?(?: cached=(\d+))?"
)


@dataclass(frozen=True)
class StepHash:
    """One ``STEP_HASH`` log line of one request."""

    step: int
    phase: str
    inputs: str
    outputs: str
    kv: str = ""
    cached: int = 0


def parse_step_hashes(text: str) -> dict[str, list[StepHash]]:
    """rid -> its step records, in log order."""
    out: dict[str, list[StepHash]] = {}
    for m in _STEP.finditer(text):
        rid, step, phase, inputs, outputs, kv, cached = m.groups()
        out.setdefault(rid, []).append(
            StepHash(int(step), phase, inputs, outputs, kv or "", int(cached or 0))
        )
    return out


def first_divergence(a: list[StepHash], b: list[StepHash]) -> dict[str, Any]:
    """The first step where two runs of one request differ, and why."""
    if not a or not b:
        return {"verdict": "no step hashes (was FLASHREC_DEBUG_STEP_HASH honoured?)"}
    for x, y in zip(a, b):
        where = {"step": x.step, "phase": x.phase}
        if (x.step, x.phase) != (y.step, y.phase):
            return {
                "verdict": HOST_STATE,
                **where,
                "detail": f"step order differs: {y.step} {y.phase}",
            }
        if x.inputs != y.inputs:
            return {
                "verdict": HOST_STATE,
                **where,
                "inputs": [x.inputs, y.inputs],
                "kv_equal": x.kv == y.kv,
                "cached": [x.cached, y.cached],
            }
        if x.outputs != y.outputs:
            return {
                "verdict": NUMERICS,
                **where,
                "outputs": [x.outputs, y.outputs],
                "kv_equal": x.kv == y.kv,
                "cached": [x.cached, y.cached],
            }
    if len(a) != len(b):
        return {
            "verdict": HOST_STATE,
            "step": min(len(a), len(b)),
            "detail": f"{len(a)} vs {len(b)} steps",
        }
    return {"verdict": AFTER_STEPS}


# verdict -> what a request with it did, in words (a count of requests goes before it)
VERDICT_WORDS = {
    NUMERICS: "first diverged in numerics (equal step inputs, different outputs)",
    HOST_STATE: "first diverged in host-side state (a step's inputs differ)",
    AFTER_STEPS: "agreed at every step and differed only after the last one",
}


def _requests(n: int) -> str:
    return f"{n} request" + ("" if n == 1 else "s")


def verdict_words(verdicts: dict[str, int]) -> str:
    """A localisation's verdict counts in words ("62 requests first diverged in numerics
    (...)"), for the console and the report, which show no Python dicts."""
    if not verdicts:
        return "no request drifted in the step-hash replay, so none was localised"
    parts = []
    for verdict, n in verdicts.items():
        words = VERDICT_WORDS.get(verdict)
        if words is None and verdict.startswith("no step hashes"):
            words = f"could not be localised: {verdict}"
        parts.append(f"{_requests(n)} {words or f'with verdict {verdict!r}'}")
    return "; ".join(parts)


def where_words(where: dict[str, int]) -> str:
    """A localisation's ``first_divergence_at`` counts in words: "numerics at step 3
    (decode): 5 requests"."""
    return "; ".join(f"{key}: {_requests(n)}" for key, n in where.items()) or "-"


def divergence_words(e: dict[str, Any]) -> str:
    """One explained request of a localisation (``first_divergence`` entry) in words."""
    procs = e.get("processes") or []
    who = f"request {e.get('index', '?')}"
    if len(procs) == 2:
        who += f" (process {procs[0]} vs {procs[1]})"
    text = f"{who}: {e.get('verdict', '?')}"
    if "step" in e:
        text += f" at step {e['step']}" + (f" ({e['phase']})" if e.get("phase") else "")
    if e.get("detail"):
        text += f", {e['detail']}"
    return text
