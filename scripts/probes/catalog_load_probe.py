"""Catalog load time, the written-layout key reader against json.loads, same process,
alternating: a comma-key JSON catalog of unique random SIDs as ``write_catalog_json`` writes
it (or ``--path`` a file of one's own), loaded ``--reps`` times each way.

    python scripts/probes/catalog_load_probe.py [--sids 1500000] [--reps 3] [--path FILE]

Prints one JSON line: each way's load times (s), their medians and json / fast.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is scripts/probes/)
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import flashrec.sid.catalog as cat  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sids", type=int, default=1_500_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--path", default=None, help="a catalog file instead of a random one")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(a.path) if a.path else Path(tmp) / "catalog.json"
        if not a.path:
            rng = np.random.default_rng(0)
            codes = np.unique(rng.integers(0, 8192, size=(a.sids + a.sids // 100, 3)), axis=0)
            codes = codes[rng.permutation(len(codes))[: a.sids]]
            cat.write_catalog_json(codes, path)
        fast_reader = cat._written_keys  # noqa: SLF001
        times: dict[str, list[float]] = {"fast": [], "json": []}
        for _ in range(a.reps):
            for way in times:
                cat._written_keys = fast_reader if way == "fast" else (lambda text: None)  # noqa: SLF001
                t0 = time.perf_counter()
                n = len(cat.load_catalog(path).codes)
                times[way].append(round(time.perf_counter() - t0, 3))
        cat._written_keys = fast_reader  # noqa: SLF001
    med = {w: statistics.median(v) for w, v in times.items()}
    print(json.dumps({"sids": n, "times_s": times, "median_s": med,
                      "json_over_fast": round(med["json"] / med["fast"], 2)}))  # fmt: skip


if __name__ == "__main__":
    main()
