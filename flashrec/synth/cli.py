"""``flashrec synth``: build a synthetic checkpoint from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flashrec.synth.checkpoint import build_checkpoint, resolve_preset
from flashrec.synth.presets import PRESETS
from flashrec.synth.weights import DTYPES


def _override(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE, got {text!r}")
    try:
        return key.replace("-", "_"), json.loads(value)
    except json.JSONDecodeError:
        return key.replace("-", "_"), value


def add_synth_args(parser: argparse.ArgumentParser) -> None:
    """Add the ``flashrec synth`` flags to ``parser``."""
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), default="tiny", help="model shape (default: tiny)"
    )
    parser.add_argument("--out", required=True, help="output checkpoint directory")
    parser.add_argument("--seed", type=int, default=0, help="weights and catalog seed")
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default=None,
        help="weight dtype (default: float32 for tiny presets, bf16 for "
        "onerec-1.7b); fp8 = per-channel FP8 Linear weights + bf16 rest",
    )
    parser.add_argument(
        "--catalog-size",
        type=int,
        default=None,
        help="also write catalog.json with this many random unique SIDs",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        type=_override,
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a preset field, e.g. --set num_key_value_heads=1 (repeatable)",
    )


def run_synth(args: argparse.Namespace) -> int:
    """Build the checkpoint described by ``args``, print its directory, return the exit code."""
    overrides = dict(getattr(args, "overrides", None) or [])
    try:
        resolve_preset(args.preset, **overrides)
    except (TypeError, ValueError) as exc:
        print(f"flashrec synth: {exc}", file=sys.stderr)
        return 2
    out = build_checkpoint(
        args.out,
        args.preset,
        seed=args.seed,
        dtype=args.dtype,
        catalog_size=args.catalog_size,
        **overrides,
    )
    print(out)
    return 0
