"""Evaluation samples from a RecIF-Bench parquet (file or data tree) or JSONL.

RecIF parquet: a ``messages`` column (a chat, JSON text or a list) and ``metadata`` (JSON text
or a struct) whose ``answer`` holds the ground-truth SIDs as text and, optionally,
``answer_pid`` the ground-truth item ids. The task is the file's folder in the official layout
``{data dir}/{task}/{task}_test.parquet``, else the file's stem. JSONL: one
``{"messages": [...], "answer": "<s_a_..>..", "answer_pid": [..], "task": ".."}`` a line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.load.workload import _row

# RecIF-Bench's recommendation tasks and the published numbers (OpenOneRec's report)
OFFICIAL_TASKS = ("video", "ad", "product", "label_cond", "interactive")
PUBLISHED = {
    ("video", "recall@32"): {"OneRec-1.7B": 0.0272, "OneRec-8B": 0.0355},
}
# rows of each official test set (the benchmark's task configuration, OpenOneRec
# benchmarks/benchmark/tasks/v1_0/recommendation/config.py): a file of another size is a cut
# or another version of the set, and its number does not compare with the published ones
OFFICIAL_SIZES = {"video": 38781, "ad": 30131, "product": 28536, "label_cond": 34891,
                  "interactive": 1000}  # fmt: skip


@dataclass(frozen=True)
class Sample:
    """One evaluation request: its chat, ground-truth SIDs (ordered) and item ids if given."""

    task: str
    index: int
    messages: list[dict]
    truth: tuple[tuple[int, ...], ...]
    truth_pids: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class DatasetFile:
    """One file's samples and whether it is an official RecIF-Bench test set (and why)."""

    path: Path
    task: str
    samples: list[Sample]
    official: bool
    official_why: str


def _layout_task(path: Path) -> str | None:
    """The task of a file laid out as the benchmark's loader reads it,
    ``{data dir}/{task}/{task}_test.*`` with any data dir (``benchmark_data`` in the published
    dataset, ``data_v1.0`` in its evaluation script); None for another layout."""
    if path.parent.name and path.stem == f"{path.parent.name}_test":
        return path.parent.name
    return None


def _task_of(path: Path) -> str:
    return _layout_task(path) or path.stem.removesuffix("_test")


def official_check(path: Path, rows: int) -> tuple[bool, str]:
    """Whether ``path`` is an official test set: laid out as ``{data dir}/{task}/{task}
    _test.parquet`` with a benchmark task, not a generated set (``eval-dataset`` writes
    ``plant.json`` in its data dir), and that task's row count (:data:`OFFICIAL_SIZES`)."""
    p = path.resolve()
    task = _layout_task(p) if p.suffix == ".parquet" else None
    if task is None:
        return False, "path is not {data dir}/{task}/{task}_test.parquet"
    if task not in OFFICIAL_TASKS:
        return False, f"task {task!r} is not one of {', '.join(OFFICIAL_TASKS)}"
    if (p.parent.parent / "plant.json").exists():
        return False, "a generated dataset (plant.json in its data dir), not the benchmark's"
    want = OFFICIAL_SIZES[task]
    if rows != want:
        return (
            False,
            f"{rows} rows, the official {task} test set has {want}: a cut or another version",
        )
    return True, f"official layout, task {task}, {rows} rows"


def _meta(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: metadata is not JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: metadata must be an object with 'answer'")
    return value


def _pids(value: Any) -> tuple[Any, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = json.loads(value)
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (int, float)):
        value = [value]
    out = tuple(v for v in value if v is not None and v != 0)
    return out or None


def _sample(task: str, i: int, messages: Any, meta: dict, levels: int, where: str) -> Sample:
    row = _row(messages, meta.get("answer"), levels)
    if row is None:
        raise ValueError(f"{where}: no chat messages")
    msgs, truth = row
    if not truth:
        raise ValueError(
            f"{where}: no ground-truth SID in the answer ({str(meta.get('answer'))!r:.80})"
        )
    pids = _pids(meta.get("answer_pid", meta.get("answer_iid")))
    return Sample(task, i, msgs, tuple(truth), pids)


def _read_parquet(path: Path, levels: int) -> DatasetFile:
    import pandas as pd

    try:
        df = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many kinds; name the file
        raise ValueError(f"{path}: cannot read parquet: {exc}") from None
    if "messages" not in df.columns:
        raise ValueError(
            f"{path}: a RecIF parquet needs a 'messages' column (has {list(df.columns)})"
        )
    if "metadata" not in df.columns:
        raise ValueError(f"{path}: a RecIF parquet needs a 'metadata' column with 'answer'")
    task = _task_of(path)
    samples = []
    for i, rec in enumerate(df.to_dict("records")):
        where = f"{path}: row {i}"
        meta = _meta(rec.get("metadata"), where)
        samples.append(
            _sample(str(rec.get("task") or task), i, rec["messages"], meta, levels, where)
        )
    official, why = official_check(path, len(samples))
    return DatasetFile(path, task, samples, official, why)


def _read_jsonl(path: Path, levels: int) -> DatasetFile:
    samples = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected {{'messages': [...], 'answer': ...}}")
        meta = {**_meta(obj.get("metadata"), where), **obj}
        meta.setdefault("answer", obj.get("ground_truth"))
        task = str(obj.get("task") or path.stem)
        samples.append(_sample(task, len(samples), obj.get("messages"), meta, levels, where))
    return DatasetFile(path, path.stem, samples, False, "JSONL is never the official set")


def load_dataset(path: str | Path, levels: int = 3) -> list[DatasetFile]:
    """Every sample of a parquet file, a folder of them (recursively) or a JSONL file; errors
    name the file and row. An empty dataset is an error (nothing to evaluate is no result)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such dataset file or folder")
    if p.is_dir():
        files = sorted(p.rglob("*.parquet"))
        if not files:
            raise ValueError(f"{p}: no .parquet files under it")
        out = [_read_parquet(f, levels) for f in files]
    elif p.suffix in (".jsonl", ".json"):
        out = [_read_jsonl(p, levels)]
    else:
        out = [_read_parquet(p, levels)]
    if not any(f.samples for f in out):
        raise ValueError(f"{p}: holds no samples")
    return out


def default_sid2pid(path: str | Path) -> Path | None:
    """``sid2pid.json`` beside the dataset (its folder, or one or two folders up)."""
    p = Path(path).resolve()
    start = p if p.is_dir() else p.parent
    for d in (start, start.parent, start.parent.parent):
        if (d / "sid2pid.json").is_file():
            return d / "sid2pid.json"
    return None
