"""``flashrec synth``: build a synthetic checkpoint from the command line."""

from __future__ import annotations

import argparse
import json
import math
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
        help="also write catalog.json with this many random unique SIDs (default: none, no "
        "catalog.json: a server on the checkpoint then decodes unconstrained, smoke only, "
        "unless given a --sid-vocab-file)",
    )
    parser.add_argument(
        "--sid-entropy",
        type=float,
        default=None,
        metavar="NATS",
        help="give the model a trained-like confidence: scale model.norm.weight so the mean "
        "per-step next-SID entropy (level scope) on a few synthetic prompts is NATS; a trained "
        "GenRec model has a few nats over 8,192 codes, e.g. 3.0 (default: off, random init)",
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
        p = resolve_preset(args.preset, **overrides)
        sid_entropy = getattr(args, "sid_entropy", None)
        if sid_entropy is not None and not 0 < sid_entropy < math.log(p.codebook_size):
            raise ValueError(
                f"--sid-entropy must be in (0, ln {p.codebook_size} = "
                f"{math.log(p.codebook_size):.3f}) nats"
            )
    except (TypeError, ValueError) as exc:
        print(f"flashrec synth: {exc}", file=sys.stderr)
        return 2
    out = build_checkpoint(
        args.out,
        args.preset,
        seed=args.seed,
        dtype=args.dtype,
        catalog_size=args.catalog_size,
        sid_entropy=sid_entropy,
        **overrides,
    )
    print(out)
    return 0
