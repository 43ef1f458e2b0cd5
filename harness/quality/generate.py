"""A RecIF-shaped dataset whose right answers are known (``flashrec-bench eval-dataset``).

Prompts come from ``flashrec.synth.synth_prompts``; an independent reference (the HF reference
server, float32, launched here or given by URL) decodes each with ``beams`` beams. Then the
ground truth is planted: for a fraction ``f`` of the samples (chosen at random) the first
answer is the reference's top-1 SID, for the others a catalog SID outside the reference's
top-``beams``; ``extra_answers`` more answers, all outside the top-``beams``, follow. A server
that decodes like the reference then scores, at any k <= beams::

    pass@k(k>=1) = position1_pass@k = f,    recall@k = f / (1 + extra_answers)

(``plant.json`` records these). Written: ``<out>/<task>/<task>_test.parquet`` (``messages``, a
``metadata`` JSON with ``answer`` and ``answer_pid``), ``<out>/sid2pid.json`` (keys packed
base 8192 as RecIF's, comma-separated codes for a codebook wider than that; 1-3 items per SID, the mapped item is the most popular after down-sampling) and
``<out>/plant.json``, which is also what keeps eval from ever taking it for the official set.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from harness.load.sids import parse_sid
from harness.quality.dataset import Sample
from harness.quality.evaluate import EvalOptions, ask, progress_printer
from harness.quality.pids import RECIF_PACKED_BASE, pack

SID_BEGIN, SID_END = "<|sid_begin|>", "<|sid_end|>"


def sid_text(sid: tuple[int, ...]) -> str:
    """``(1, 2, 3)`` -> ``<|sid_begin|><s_a_1><s_b_2><s_c_3><|sid_end|>``."""
    body = "".join(f"<s_{chr(ord('a') + i)}_{c}>" for i, c in enumerate(sid))
    return SID_BEGIN + body + SID_END


def _sid2pid(codes: list[tuple[int, ...]], rng: np.random.Generator) -> tuple[dict, dict]:
    """The sid2pid.json object and SID -> its standing item (max count_after_downsample)."""
    mapping, stand = {}, {}
    next_pid = 1000
    for sid in codes:
        items = []
        for _ in range(int(rng.integers(1, 4))):
            items.append(
                {
                    "pid": next_pid,
                    "count": int(rng.integers(1, 1000)),
                    "count_after_downsample": int(rng.integers(1, 1000)),
                }
            )
            next_pid += 1
        items.sort(key=lambda v: -v["count"])  # the benchmark's files list by original count
        best = max(items, key=lambda v: v["count_after_downsample"])  # first of the ties
        fits = max(sid) < RECIF_PACKED_BASE  # a wider codebook has no RecIF packed key
        mapping[str(pack(sid)) if fits else ",".join(map(str, sid))] = items
        stand[sid] = best["pid"]
    return mapping, stand


async def _decode(url: str, samples: list[Sample], beams: int, levels: int) -> list[list]:
    opts = EvalOptions(beams, levels + 1, (), "chat", 4, 600.0, "default", levels)
    async with aiohttp.ClientSession() as session:
        answers = await ask(session, url, samples, opts, None, progress_printer(len(samples)))
    bad = [a for a in answers if a.error]
    if bad:
        raise RuntimeError(f"reference failed {len(bad)} request(s); first: {bad[0].error}")
    return [[parse_sid(t, levels) for t in a.texts] for a in answers]


def generate_dataset(
    out_dir: str | Path,
    model_path: str,
    catalog: str,
    samples: int = 100,
    fraction: float = 0.5,
    extra_answers: int = 0,
    seed: int = 0,
    task: str = "video",
    beams: int = 32,
    median_tokens: int = 64,
    reference_url: str | None = None,
    device: str | None = None,
) -> dict:
    """Write the dataset (see the module docstring); returns the plant (also plant.json)."""
    from flashrec.sid.catalog import load_catalog
    from flashrec.synth import synth_prompts

    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction {fraction}: must lie in [0, 1]")
    if samples < 1 or beams < 1 or extra_answers < 0:
        raise ValueError("samples and beams must be >= 1, extra_answers >= 0")
    codes = [tuple(int(c) for c in row) for row in load_catalog(catalog).codes.tolist()]
    levels = len(codes[0])
    if len(codes) < beams + extra_answers + 1:
        raise ValueError(f"catalog of {len(codes)} SIDs is too small for {beams} beams")
    chats = synth_prompts(samples, median_tokens=median_tokens, seed=seed, system_prompt_tokens=32)
    probe = [Sample(task, i, m, ()) for i, m in enumerate(chats)]
    if reference_url:
        decoded = asyncio.run(_decode(reference_url.rstrip("/"), probe, beams, levels))
    else:
        from harness.quality.serve import launched

        log = Path(out_dir) / "reference-server.log"
        with launched("reference", model_path, catalog, log, device, {"dtype": "float32"}) as srv:
            decoded = asyncio.run(_decode(srv.base_url, probe, beams, levels))
    rng = np.random.default_rng(seed)
    planted = set(rng.permutation(samples)[: round(fraction * samples)].tolist())
    mapping, stand = _sid2pid(codes, rng)
    rows: list[dict[str, Any]] = []
    for i, (chat, beams_i) in enumerate(zip(chats, decoded)):
        top = {s for s in beams_i if s is not None}
        if not beams_i or beams_i[0] is None:
            raise RuntimeError(f"reference gave no valid top-1 SID for sample {i}")
        answer = [beams_i[0]] if i in planted else []
        while len(answer) < 1 + extra_answers:
            sid = codes[int(rng.integers(len(codes)))]
            if sid not in top and sid not in answer:
                answer.append(sid)
        meta = {
            "answer": "".join(sid_text(s) for s in answer),
            "answer_pid": [stand[s] for s in answer],
            "planted": i in planted,
        }
        rows.append({"messages": chat, "metadata": json.dumps(meta)})
    import pandas as pd

    folder = Path(out_dir) / task
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(folder / f"{task}_test.parquet", index=False)
    (Path(out_dir) / "sid2pid.json").write_text(json.dumps(mapping))
    f = len(planted) / samples
    plant = {
        "samples": samples,
        "fraction": f,
        "extra_answers": extra_answers,
        "beams": beams,
        "seed": seed,
        "task": task,
        "reference": reference_url or "HF reference server, float32 (launched)",
        "expected": {"pass": f, "position1_pass": f, "recall": f / (1 + extra_answers)},
        "holds_for": f"k in [1, {beams}], on a server that decodes like the reference",
    }
    (Path(out_dir) / "plant.json").write_text(json.dumps(plant, indent=1))
    return plant
