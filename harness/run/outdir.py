"""The run's output directory: which files make a report there, and setting an earlier run's
report aside before a fresh run."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

# every file harness.report.build.write_report can put at the top of a report directory
# (records.parquet only with pyarrow); a fresh run moves an earlier run's set aside
REPORT_FILES = (
    "report.json", "records.csv", "records.parquet", "summary.csv", "REPORT.md", "report.html",
)  # fmt: skip


def set_aside_old_report(out_dir: Path) -> Path | None:
    """A fresh run (no ``--resume``) into a directory that holds an earlier run's report: move
    that report's files into ``OUT/superseded-<UTC time>/``, so a run that stops before writing
    its own never leaves the earlier one looking like its result. Nothing is deleted; the
    earlier run's cell folders stay where they are (a fresh run rewrites the ones it measures,
    and only this run's cells enter its report). Returns the folder, or None."""
    old = [out_dir / f for f in REPORT_FILES if (out_dir / f).is_file()]
    if not old:
        return None
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    dest = out_dir / f"superseded-{stamp}"
    n = 1
    while dest.exists():
        n += 1
        dest = out_dir / f"superseded-{stamp}-{n}"
    dest.mkdir(parents=True)
    for f in old:
        f.rename(dest / f.name)
    return dest
