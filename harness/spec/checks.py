"""What a matrix judges its cells by: ``gates:`` (thresholds and regressions that fail the run)
and ``targets:`` (goals reported as met or missed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from harness.spec.base import SpecModel


class GateSpec(SpecModel):
    """A threshold on a cell metric, a report path, or a regression against a baseline."""

    name: str | None = None
    metric: str | None = None
    path: str | None = None
    op: Literal["<", "<=", "==", "!=", ">=", ">"] | None = None
    value: float | None = None
    max_regression_pct: float | None = Field(None, ge=0)
    # "keep only if it beats the baseline": the metric must improve by at least this much
    min_improvement_pct: float | None = Field(None, ge=0)
    beyond_noise: bool = True
    cells: str | None = None
    required: bool = False

    @model_validator(mode="after")
    def _check(self) -> GateSpec:
        if bool(self.metric) == bool(self.path):
            raise ValueError("give exactly one of 'metric' (a cell metric) or 'path' (report path)")
        absolute = self.op is not None and self.value is not None
        kinds = [
            absolute,
            self.max_regression_pct is not None,
            self.min_improvement_pct is not None,
        ]
        if sum(kinds) != 1:
            raise ValueError(
                "give exactly one of 'op' + 'value', 'max_regression_pct' or 'min_improvement_pct'"
            )
        if self.relative_kind and not self.metric:
            raise ValueError("'max_regression_pct' / 'min_improvement_pct' apply to a 'metric'")
        return self

    @property
    def relative_kind(self) -> str | None:
        """``regress`` / ``improve`` for a gate against a baseline; None for a threshold."""
        if self.max_regression_pct is not None:
            return "regress"
        return "improve" if self.min_improvement_pct is not None else None

    @property
    def label(self) -> str:
        """The gate's display name."""
        if self.name:
            return self.name
        target = self.metric or self.path
        if self.max_regression_pct is not None:
            return f"{target} regression <= {self.max_regression_pct}%"
        if self.min_improvement_pct is not None:
            return f"{target} improvement >= {self.min_improvement_pct}%"
        return f"{target} {self.op} {self.value:g}"


def relative_overrides(text: str) -> dict[str, str]:
    """``relative_to``'s terms: ``{key: value}`` (exact values, no globs); ValueError else."""
    out: dict[str, str] = {}
    for term in (t.strip() for t in text.split(",")):
        key, eq, value = term.partition("=")
        if not eq or not key.strip() or any(c in term for c in "*?["):
            raise ValueError(f"relative_to term {term!r}: expected key=value (exact, no globs)")
        out[key.strip()] = value.strip()
    return out


class TargetSpec(SpecModel):
    """A goal on a cell metric: reported as met or missed by how much; fails nothing unless
    ``fail_run``."""

    name: str | None = None
    metric: str
    op: Literal["<", "<=", ">=", ">"]
    value: float
    cells: str | None = None
    # "key=value,...": judge each cell's metric as a ratio to the same run's cell with these
    # parameters changed (e.g. temperature=0.0: sampling against greedy), not as an absolute
    relative_to: str | None = None
    fail_run: bool = False

    @field_validator("relative_to")
    @classmethod
    def _overrides(cls, v: str | None) -> str | None:
        if v is not None:
            relative_overrides(v)  # raises on a term that is not key=value
        return v

    @property
    def label(self) -> str:
        """The target's display name."""
        return self.name or f"{self.metric} {self.op} {self.value:g}"


def check_parity_engines(parity: Any, names: list[str]) -> None:
    """A parity candidate's ``engine`` and ``against`` name a matrix engine or another
    candidate: checked at load, not when the stage starts after every cell has run."""
    extra = (parity.model_extra or {}) if parity is not None else {}
    cands = extra.get("candidates")
    if not isinstance(cands, list):
        return
    cand_names = [c.get("name") for c in cands if isinstance(c, dict)]
    for i, c in enumerate(cands):
        if not isinstance(c, dict):
            continue
        if c.get("engine") is not None and c["engine"] not in names:
            raise ValueError(
                f"parity.candidates[{i}].engine: {c['engine']!r} is not an engine of this "
                f"matrix (known: {', '.join(names)})"
            )
        if c.get("against") is not None and (
            c["against"] not in cand_names or c["against"] == c.get("name")
        ):
            raise ValueError(
                f"parity.candidates[{i}].against: {c['against']!r} names no other candidate "
                f"(candidates: {cand_names})"
            )


# what an A/A control may set apart from the engine it repeats
_CONTROL_OWN = {"name", "port", "control", "startup_timeout_s", "stop_timeout_s"}


def check_controls(engines: Sequence[Any]) -> None:
    """An engine with ``control: true`` repeats the first engine: refused as the first engine
    itself, or with any setting (kind, args, link, env, ...) of its own."""
    if not engines or not any(e.control for e in engines):
        return
    base = engines[0]
    if base.control:
        raise ValueError(
            f"engine '{base.name}' is the first engine, the one a control repeats: "
            "'control: true' belongs on a later engine"
        )
    want = base.model_dump(exclude=_CONTROL_OWN)
    for e in engines[1:]:
        if not e.control:
            continue
        got = e.model_dump(exclude=_CONTROL_OWN)
        differ = sorted(k for k in want if want[k] != got[k])
        if differ:
            raise ValueError(
                f"control engine '{e.name}' must repeat '{base.name}' but sets "
                f"{', '.join(differ)} of its own (a control differs only in name and port)"
            )
