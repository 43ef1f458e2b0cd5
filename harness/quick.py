"""``flashrec-bench quick``: one benchmark from flags, no YAML to write first.

It builds the matrix the flags describe (beam widths x concurrencies against a running server
at ``--url``, or a FlashRec server it launches on ``--model-path``), writes it as
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

from harness.spec.url import url_arg

EXIT_USAGE = 2
# the cell on a CPU server, for each of these flags the command line leaves to its default:
# the defaults are a GPU's cell (2,465-token prompts, 64 requests x 3 rounds + 8 warm-up),
# which takes minutes per cell on CPU for a few QPS
CPU_CELL = {"prompt_tokens": 256, "requests": 32, "warmup": 4}


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


def _server_info(url: str) -> dict:
    import asyncio

    import aiohttp

    from harness.servers.launch import fetch_info

    async def get() -> dict:
        async with aiohttp.ClientSession() as session:
            return await fetch_info(session, url.rstrip("/"))

    return asyncio.run(get())


def server_device(args: argparse.Namespace) -> tuple[str | None, str]:
    """The device the measured server runs on and how that is known; None where unknown (a
    server that does not say, or does not answer)."""
    if args.url:
        info = _server_info(args.url)
        engine, config = info.get("engine"), info.get("config")
        device = (engine.get("device") if isinstance(engine, dict) else None) or (
            config.get("device") if isinstance(config, dict) else None
        )
        if not device:
            return None, ""
        return str(device), f"its /get_server_info says device {device}"
    device = args.device or dict(args.server_arg).get("device")
    if device:
        return str(device), f"--device {device}"
    import torch

    if torch.cuda.is_available():
        return "cuda", "CUDA is available"
    return "cpu", "no CUDA device here, so the launched server takes the CPU"


def size_for_cpu(args: argparse.Namespace, argv: list[str]) -> str | None:
    """On a CPU server, each :data:`CPU_CELL` flag the command line leaves unset takes its CPU
    value (``args`` changed in place); the note that says so and why, None when nothing
    changed."""
    device, how = server_device(args)
    if device is None or not device.startswith("cpu"):
        return None
    given = given_flags(argv)
    changed = {k: v for k, v in CPU_CELL.items() if k not in given}
    if not changed:
        return None
    for key, value in changed.items():
        setattr(args, key, value)
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in changed.items())
    return (
        f"the server runs on CPU ({how}): a CPU-sized cell, {flags}; the defaults (2465-token "
        "prompts, 64 requests per round, 8 warm-up) are a GPU's cell and take minutes per "
        "cell on CPU. Give these flags to choose other values."
    )


def build_matrix(args: argparse.Namespace, argv: list[str] | None = None) -> dict:
    """The matrix the flags describe (plain data, as YAML would give it); ``argv`` goes into
    its description."""
    if args.url:
        engine: dict[str, Any] = {
            "name": "server", "kind": "external", "url": args.url, "protocol": args.protocol
        }  # fmt: skip
        if args.server_arg or args.device:
            raise ValueError("--server-arg and --device need --model-path (a launched server)")
    else:
        engine = {"name": "flashrec", "kind": "flashrec", "protocol": args.protocol}
        if args.device:
            engine["device"] = args.device
        if args.server_arg:
            engine["args"] = dict(args.server_arg)
    m: dict[str, Any] = {
        "name": args.name,
        "description": " ".join(["flashrec-bench quick", *(argv or [])]),
        "engine": engine,
    }
    model = args.model_path or args.tokenizer
    if model:
        m["model"] = {"path": str(model)}
    catalog = args.catalog
    if catalog is None and args.model_path and (Path(args.model_path) / "catalog.json").is_file():
        catalog = str(Path(args.model_path) / "catalog.json")
    if catalog:
        m["catalog"] = {"path": str(catalog)}
    m["workload"] = {
        "kind": "synthetic",
        "requests": args.requests,
        "warmup_requests": args.warmup,
        "median_tokens": args.prompt_tokens,
        "spread": 0.05,
        "system_prompt_tokens": 0,
    }
    m["axes"] = {"beam_width": args.beam_width, "concurrency": args.concurrency}
    m["load"] = {
        "mode": "closed",
        "rounds": args.rounds,
        "radix": args.radix,
        "temperature": 0.0,
        "max_tokens": args.max_tokens,
        "request_timeout_s": args.timeout_s,
    }
    m["gates"] = [
        {"name": "no-invalid-sids", "metric": "invalid_rate", "op": "==", "value": 0},
        {"name": "no-errors", "metric": "error_rate", "op": "==", "value": 0},
    ]
    return m


def main(argv: list[str]) -> int:
    from harness.cli.run import main as run_main
    from harness.cli.run import run_id
    from harness.spec.matrix import SpecError, parse_spec

    args = parser().parse_args(argv)
    for flag, value, least in (
        ("--requests", args.requests, 1), ("--rounds", args.rounds, 1),
        ("--prompt-tokens", args.prompt_tokens, 1), ("--warmup", args.warmup, 0),
        ("--max-tokens", args.max_tokens, 1),
    ):  # fmt: skip
        if value < least:
            print(f"{flag} must be >= {least}", file=sys.stderr)
            return EXIT_USAGE
    cpu_note = size_for_cpu(args, argv)
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
