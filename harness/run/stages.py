"""The run's stages, one registry: a stage is named after its matrix section and found by
``"module:function"``; every entry takes ``(section, ctx)`` and returns its result (a dict).

    stage        when                                         entry
    quality      per cell, after its rounds, on its server    harness.quality.stage:run_stage
    parity       after every cell, on servers of its own      harness.parity.stage:run_stage
    determinism  after every cell, on servers of its own      harness.determinism.stage:run_stage

A per-cell entry is a coroutine given the cell's ``CellContext`` (:mod:`harness.run.cell`, its
``cell`` set), and answers None where its section leaves the cell out; a run entry is given a
:class:`StageContext`. Modules are imported only when their stage runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness.spec.matrix import MatrixSpec
from harness.spec.model import ResolvedModel


@dataclass(frozen=True)
class Stage:
    """Where a stage runs (``cell``: inside each cell; ``run``: after the cells) and its entry
    as ``"module:function"``."""

    when: Literal["cell", "run"]
    entry: str


# stage name (= its matrix section) -> Stage; run stages report in this order
STAGES: dict[str, Stage] = {
    "quality": Stage("cell", "harness.quality.stage:run_stage"),
    "parity": Stage("run", "harness.parity.stage:run_stage"),
    "determinism": Stage("run", "harness.determinism.stage:run_stage"),
}


@dataclass
class StageContext:
    """What a run stage (parity, determinism) gets from the run."""

    spec: MatrixSpec
    model: ResolvedModel | None
    out_dir: Path
    resume: bool = False  # --resume: a stage may read back what an interrupted run saved


def entry(target: str) -> Callable[..., Any]:
    """The function a ``"module:function"`` entry names (ModuleNotFoundError / AttributeError
    when there is none)."""
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def names(when: Literal["cell", "run"]) -> list[str]:
    """The stages that run ``when``, in registry order."""
    return [name for name, stage in STAGES.items() if stage.when == when]


def run_stages(ctx: StageContext) -> dict[str, dict]:
    """Run the configured run stages (``parity:``, ``determinism:``), each by its entry."""
    out: dict[str, dict] = {}
    for name in names("run"):
        section = getattr(ctx.spec, name)
        if section is None or not section.enabled:
            out[name] = {"status": "not_configured"}
            continue
        target = STAGES[name].entry
        try:
            fn = entry(target)
        except (ModuleNotFoundError, AttributeError) as exc:
            out[name] = {"status": "unavailable", "reason": f"{target}: {exc}"}
            continue
        out[name] = fn(section, ctx)
    return out
