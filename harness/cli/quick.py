"""``flashrec-bench quick``: one benchmark from flags, no YAML to write first.

It builds the matrix the flags describe (:mod:`harness.quick`), writes it as
``OUT/matrix.yaml`` (so the run can be repeated, edited or compared like any other), then runs
it as ``flashrec-bench OUT/matrix.yaml --out OUT``: the same measuring loop, report and exit
codes. ``--print-matrix`` only prints the matrix.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from harness.cli.commands import EXIT_USAGE
from harness.cli.run import main as run_main
from harness.cli.run import run_id
from harness.quick import CPU_CELL, build_matrix, size_for_cpu
from harness.spec.matrix import SpecError, parse_spec
from harness.spec.url import url_arg


def _ints(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers, e.g. 50,100") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers >= 1, e.g. 50,100")
    return vals


def _server_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. quantization=fp8")
    return key.strip().lstrip("-").replace("-", "_"), yaml.safe_load(value)


def add_server_arg(p: argparse.ArgumentParser) -> None:
    """``--server-arg KEY=VALUE`` (repeatable): flags for a server launched on --model-path."""
    p.add_argument(
        "--server-arg",
        action="append",
        type=_server_arg,
        default=[],
        metavar="KEY=VALUE",
        help="--model-path: a server flag, e.g. quantization=fp8 (repeatable)",
    )


class _Defaults(argparse.HelpFormatter):
    """Help that shows each flag's default (the prompt length above all: a default that
    surprises makes a number ten times off), except where there is none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, [], argparse.SUPPRESS) or "%(default)" in text:
            return text
        return text + " (default: %(default)s)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flashrec-bench quick",
        description="One benchmark from flags: beam widths x concurrencies against a server. "
        "Writes the equivalent matrix to OUT/matrix.yaml, then runs it (docs/harness.md). The "
        "defaults are a GPU's cell: on a CPU server, --prompt-tokens, --requests and --warmup "
        "not given take a CPU-sized cell ("
        + " / ".join(str(v) for v in CPU_CELL.values())
        + "), and the run says so.",
        formatter_class=_Defaults,
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--url",
        type=url_arg,
        help="a running server (kind external), e.g. http://127.0.0.1:8000",
    )
    where.add_argument(
        "--model-path", help="launch a FlashRec server on this checkpoint (kind flashrec)"
    )
    p.add_argument(
        "--tokenizer",
        help="checkpoint directory whose tokenizer sizes the prompts and renders the template "
        "(default: --model-path; with --url, the built-in ChatML template)",
    )
    p.add_argument(
        "--catalog",
        help="SID catalog: every answer is checked against it (invalid SIDs are counted); with "
        "--model-path it is also the server's --sid-vocab-file (default: MODEL/catalog.json "
        "when present)",
    )
    p.add_argument("--beam-width", type=_ints, default="50", help="n, comma-separated (50,100)")
    p.add_argument("--concurrency", type=_ints, default="1", help="clients, comma-separated")
    p.add_argument(
        "--protocol",
        choices=["chat", "generate"],
        default="chat",
        help="the API the requests use: /v1/chat/completions or /generate",
    )
    p.add_argument(
        "--prompt-tokens",
        type=int,
        default=2465,
        help="median prompt length, in the tokenizer's tokens; without a tokenizer (--url "
        "alone) in bytes, ~4 per token of a real BPE tokenizer, so pass --tokenizer",
    )
    p.add_argument("--requests", type=int, default=64, help="measured requests per round")
    p.add_argument("--warmup", type=int, default=8, help="warm-up requests per cell")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds per cell (>= 3 for CIs)")
    p.add_argument(
        "--radix",
        choices=["cold", "warm"],
        default="cold",
        help="prefix-cache temperature set before every round (cold: flushed; warm: primed)",
    )
    p.add_argument("--max-tokens", type=int, default=4, help="SID levels + the end token")
    p.add_argument("--device", help="--model-path: the server's --device (default: its own)")
    add_server_arg(p)
    p.add_argument("--timeout-s", type=float, default=300.0, help="per-request timeout, seconds")
    p.add_argument("--out", type=Path, help="report directory (default reports/<run-id>/)")
    p.add_argument("--name", default="quick", help="the matrix's name")
    p.add_argument("--print-matrix", action="store_true", help="print the matrix and exit")
    return p


def given_flags(argv: list[str]) -> set[str]:
    """The options the command line sets itself (their ``dest``), not left to a default."""
    p = parser()
    for action in p._actions:
        action.default = argparse.SUPPRESS
    return set(vars(p.parse_args(argv)))


def main(argv: list[str]) -> int:
    """Build the matrix the flags describe, write it, run it."""
    args = parser().parse_args(argv)
    for flag, value, least in (
        ("--requests", args.requests, 1), ("--rounds", args.rounds, 1),
        ("--prompt-tokens", args.prompt_tokens, 1), ("--warmup", args.warmup, 0),
        ("--max-tokens", args.max_tokens, 1),
    ):  # fmt: skip
        if value < least:
            print(f"{flag} must be >= {least}", file=sys.stderr)
            return EXIT_USAGE
    cpu_note = size_for_cpu(args, given_flags(argv))
    if cpu_note:
        print(f"note: {cpu_note}", file=sys.stderr)
    try:
        matrix = build_matrix(args, argv)
        text = yaml.safe_dump(matrix, sort_keys=False)
        parse_spec(text, "<quick>")  # the flags make a valid matrix, or say which is wrong
    except (ValueError, SpecError) as exc:
        print(f"cannot build the matrix: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.print_matrix:
        print(text, end="")
        return 0
    if "model" not in matrix:
        print(
            "note: no --tokenizer: prompts are sized in bytes and rendered with the built-in "
            "ChatML template",
            file=sys.stderr,
        )
    out = args.out or Path("reports") / run_id(args.name, "quick")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "matrix.yaml"
    header = f"# written by flashrec-bench quick; rerun with: flashrec-bench {path} --out DIR\n"
    if cpu_note:
        header += f"# {cpu_note}\n"
    path.write_text(header + text)
    print(f"matrix: {path}", file=sys.stderr)
    return run_main([str(path), "--out", str(out)])
