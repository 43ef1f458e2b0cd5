"""A cell's quality, the per-cell stage of ``harness.run.stages``: after its measured rounds,
the cell's server answers the matrix's ``quality:`` dataset (given, or generated once per run
with a planted answer) at the cell's beam width, and the result lands in the cell
(``CellResult.quality``), beside its QPS."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from harness.quality.dataset import default_sid2pid, load_dataset
from harness.quality.evaluate import OFFICIAL_BEAMS, OFFICIAL_TOKENS, EvalOptions, ask, score
from harness.quality.pids import load_pid_map
from harness.spec.cells import Cell
from harness.spec.load import evaluated
from harness.spec.quality import QualitySpec


async def _generated(
    spec: QualitySpec, folder: Path, model: Any, device: str | None
) -> tuple[Path, bool]:
    """The planted dataset of this run, and whether this call made it: made once (kept across
    --resume), in a thread."""
    from harness.quality.generate import generate_dataset

    g = spec.generate
    assert g is not None
    want = g.model_dump(mode="json")
    stamp = folder / "settings.json"  # cells run one at a time: no lock needed
    if stamp.is_file() and json.loads(stamp.read_text()) == want:
        return folder, False
    if model is None or not getattr(model, "path", None):
        raise ValueError("quality.generate needs the run's model (a launched FlashRec)")
    catalog = getattr(model, "catalog", None)
    if not catalog:
        raise ValueError("quality.generate needs a catalog (catalog: or a synthetic model)")
    await asyncio.to_thread(
        generate_dataset, folder, model.path, catalog, g.samples, g.fraction,
        g.extra_answers, g.seed, g.task, g.beams, g.median_tokens, g.reference_url,
        g.device or device,
    )  # fmt: skip
    stamp.write_text(json.dumps(want))
    return folder, True


def options(spec: QualitySpec, cell: Cell, protocol: str, max_tokens: int, levels: int, model: str):
    """The eval request settings of a cell: its beam width and tokens unless the section (or
    ``official``) fixes them; its named catalog, if it names one."""
    beams = spec.beam_width or (OFFICIAL_BEAMS if spec.official else cell.client.beam_width)
    tokens = spec.max_tokens or (OFFICIAL_TOKENS if spec.official else max_tokens)
    return EvalOptions(
        beams, tokens, tuple(spec.ks), protocol, spec.concurrency, spec.request_timeout_s,
        model, levels, cell.client.catalog,
    )  # fmt: skip


async def evaluate_cell(ctx: Any, cell: Cell) -> dict:
    """The quality result of one cell on ``ctx.server`` (``status`` "error" when it could not
    be measured: a gate on its metrics then fails, it never passes on nothing)."""
    spec: QualitySpec = ctx.spec.quality
    t0 = time.monotonic()
    built = None  # seconds of one-time work (the planted dataset), kept out of ETAs
    try:
        folder = Path(ctx.quality_dir or "quality")
        if spec.generate is not None:
            model = getattr(ctx.server, "model", None)
            dataset, made = await _generated(spec, folder / "dataset", model, cell.engine.device)
            built = time.monotonic() - t0 if made else None
        else:
            dataset = Path(str(spec.dataset))
        files = await asyncio.to_thread(load_dataset, dataset, ctx.checker.levels)
        samples = [s for f in files for s in f.samples][: spec.samples or None]
        mapping = spec.sid2pid or default_sid2pid(dataset)
        pid_map = load_pid_map(mapping) if mapping else None
        catalog = ctx.checker.catalog
        if catalog is None and mapping:
            from harness.load.sids import load_catalog_sids

            catalog = load_catalog_sids(mapping)
        opts = options(
            spec, cell, ctx.server.protocol, ctx.max_tokens, ctx.checker.levels,
            ctx.server.engine.model_name or "default",
        )  # fmt: skip
        answers = await ask(ctx.session, ctx.server.base_url, samples, opts, ctx.renderer)
        out = score(answers, opts, catalog, pid_map, files, keep_values=True)
        out.update(status="ok", dataset=str(dataset), sid2pid=str(mapping) if mapping else None)
        plant = dataset / "plant.json" if dataset.is_dir() else None
        if plant is not None and plant.is_file():
            out["plant"] = json.loads(plant.read_text())
    except (ValueError, OSError, RuntimeError) as exc:
        out = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:500]}
    out["duration_s"] = round(time.monotonic() - t0, 2)
    if built is not None:
        out["dataset_build_s"] = round(built, 3)
    return out


async def run_stage(section: QualitySpec, ctx: Any) -> dict | None:
    """The per-cell stage entry (``harness.run.stages``): the ``quality:`` section + the cell's
    ``CellContext`` (its ``cell`` set); None where the section leaves the cell out."""
    cell = ctx.cell
    if not evaluated(section, cell):
        return None
    if ctx.on_phase:
        ctx.on_phase("quality eval")
    return await evaluate_cell(ctx, cell)


def cell_metrics(quality: dict | None) -> dict[str, dict]:
    """A cell's quality as cell metrics (``recall@32`` ...), mean over samples with its 95%
    interval; ``values`` are per sample, in dataset order (``unit: samples``), so that two runs
    of one dataset compare sample by sample (:mod:`harness.judge.samples`)."""
    if not quality or quality.get("status") != "ok":
        return {}
    overall = quality["overall"]
    values = overall.get("values", {})
    out = {}
    for name, m in overall["metrics"].items():
        out[name] = {
            "median": m["value"],
            "ci95_low": m["ci_low"],
            "ci95_high": m["ci_high"],
            "cv": float("nan"),
            "noise_band": 0.0,  # a deterministic decode: the samples, not rounds, are the noise
            "n": m["n"],
            "values": values.get(name, []),
            "unit": "samples",
            "ci": m["ci"],
        }
    for name in ("invalid_rate", "duplicate_rate"):
        r = overall[name]
        # not measured (harness.metrics.checked says why): no catalog to check SIDs against,
        # or one beam per answer, where no duplicate can occur
        beams = (quality.get("protocol") or {}).get("beam_width")
        if (name == "invalid_rate" and not quality.get("catalog_checked")) or (
            name == "duplicate_rate" and beams == 1
        ):
            continue
        out[f"quality_{name}"] = {
            "median": r["value"], "ci95_low": r["ci_low"], "ci95_high": r["ci_high"],
            "cv": float("nan"), "noise_band": 0.0, "n": r["n"], "values": [], "unit": "beams",
        }  # fmt: skip
    return out


def report_entry(quality: dict | None) -> dict | None:
    """The cell's quality for report.json: everything but the per-sample values."""
    if quality is None:
        return None
    out = dict(quality)
    if "overall" in out:
        out["overall"] = {k: v for k, v in out["overall"].items() if k != "values"}
    return out
