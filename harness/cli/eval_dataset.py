"""``flashrec-bench eval-dataset OUT``: a RecIF-shaped dataset with planted, knowable answers
(:mod:`harness.quality.generate`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.quality.generate import generate_dataset
from harness.spec.url import url_arg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="flashrec-bench eval-dataset",
        description="Write a RecIF-shaped dataset with planted, knowable answers (see "
        "docs/harness.md): parquet + sid2pid.json + plant.json.",
    )
    p.add_argument("out", type=Path, help="output folder")
    p.add_argument("--model-path", required=True, help="checkpoint (e.g. a flashrec synth dir)")
    p.add_argument("--catalog", help="catalog file (default: MODEL/catalog.json)")
    p.add_argument("--samples", type=int, default=100)
    p.add_argument("--fraction", type=float, default=0.5, help="share of samples planted")
    p.add_argument("--extra-answers", type=int, default=0, help="unreachable answers added")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--task", default="video")
    p.add_argument("--beams", type=int, default=32, help="reference beams (the 'outside' set)")
    p.add_argument("--median-tokens", type=int, default=64, help="prompt length")
    p.add_argument(
        "--reference-url", type=url_arg, help="a running reference server (default: launch one)"
    )
    p.add_argument("--device", help="launched reference's device (cpu, cuda)")
    args = p.parse_args(argv)
    catalog = args.catalog or str(Path(args.model_path) / "catalog.json")
    try:
        plant = generate_dataset(
            args.out, args.model_path, catalog, args.samples, args.fraction,
            args.extra_answers, args.seed, args.task, args.beams, args.median_tokens,
            args.reference_url, args.device,
        )  # fmt: skip
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"eval-dataset: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(plant, indent=1))
    return 0
