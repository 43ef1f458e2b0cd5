"""``flashrec-bench witness``: flashrec-bench and GuideLLM on the same cell and server, side by
side (:mod:`harness.witness.side_by_side`)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from harness.cli.commands import EXIT_USAGE
from harness.cli.quick import add_server_arg
from harness.cli.quick import parser as quick_parser
from harness.cli.run import main as run_main
from harness.cli.run import run_id
from harness.quick import build_matrix
from harness.servers.launch import ServerError, install_signal_handlers
from harness.spec.url import url_arg
from harness.witness.guidellm import guidellm_argv
from harness.witness.side_by_side import Run, launch

EXIT_DISAGREE, EXIT_FAILED = 1, 3


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flashrec-bench witness",
        description="flashrec-bench and GuideLLM on the same cell and server, side by side; "
        "QPS and latency p50/p99 of both and their ratio in OUT/report.json and OUT/REPORT.md "
        "(docs/harness.md, Witness).",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", type=url_arg, help="a running server, e.g. http://127.0.0.1:8000")
    where.add_argument("--model-path", help="launch a FlashRec server on this checkpoint")
    p.add_argument(
        "--tokenizer",
        help="tokenizer directory: sizes the prompts and GuideLLM counts tokens with it "
        "(default: --model-path; required with --url)",
    )
    p.add_argument(
        "--catalog",
        help="SID catalog (flashrec-bench checks every beam against it; with --model-path also "
        "the server's --sid-vocab-file; default: MODEL/catalog.json when present)",
    )
    p.add_argument("--beam-width", type=int, default=4, help="n of every request")
    p.add_argument("--concurrency", type=int, default=4, help="closed-loop clients / streams")
    p.add_argument("--requests", type=int, default=200, help="measured requests per round")
    p.add_argument("--warmup", type=int, default=8, help="flashrec-bench warm-up requests")
    p.add_argument("--rounds", type=int, default=3, help="rounds per tool (alternating order)")
    p.add_argument("--prompt-tokens", type=int, default=64, help="median prompt length (tokens)")
    p.add_argument("--max-tokens", type=int, default=4, help="SID levels + the end token")
    p.add_argument("--device", help="--model-path: the server's --device")
    add_server_arg(p)
    p.add_argument(
        "--pin-cpus",
        action="store_true",
        help="--model-path: pin the server to the last CPU and both tools to the others, so a "
        "load generator's own CPU use does not slow the server it measures",
    )
    p.add_argument("--startup-timeout-s", type=float, default=1800.0, help="launched server")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per-request timeout")
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="largest |ratio - 1| of each metric for the tools to agree (exit 1 beyond it)",
    )
    p.add_argument(
        "--guidellm",
        help="the GuideLLM command (default: 'guidellm' on PATH, else python -m guidellm)",
    )
    p.add_argument("--out", type=Path, help="report directory (default reports/<run-id>/)")
    return p


def _quick_matrix(argv: list[str]) -> dict:
    """The matrix ``flashrec-bench quick ARGV`` would run."""
    return build_matrix(quick_parser().parse_args(argv), argv)


def main(argv: list[str]) -> int:
    """Check the flags, launch the server where asked, run both tools, report."""
    args = parser().parse_args(argv)
    for flag in ("beam_width", "concurrency", "requests", "rounds", "prompt_tokens", "max_tokens"):
        if getattr(args, flag) < 1:
            print(f"--{flag.replace('_', '-')} must be >= 1", file=sys.stderr)
            return EXIT_USAGE
    if args.url and (args.server_arg or args.device or args.pin_cpus):
        print("--server-arg, --device and --pin-cpus need --model-path", file=sys.stderr)
        return EXIT_USAGE
    if args.model_path:
        args.tokenizer = args.tokenizer or args.model_path
        default = Path(args.model_path) / "catalog.json"
        args.catalog = args.catalog or (str(default) if default.is_file() else None)
    if not args.tokenizer:
        print("--url needs --tokenizer DIR (GuideLLM counts tokens with it)", file=sys.stderr)
        return EXIT_USAGE
    guidellm = guidellm_argv(args.guidellm)
    if guidellm is None:
        print(
            "GuideLLM is not installed (pip install guidellm, or --guidellm CMD)", file=sys.stderr
        )
        return EXIT_USAGE
    out = args.out or Path("reports") / run_id("witness", "witness")
    out.mkdir(parents=True, exist_ok=True)
    install_signal_handlers()
    server = None
    t0 = time.monotonic()
    split = None
    if args.pin_cpus:
        from harness.run.sides import cpu_split

        split = cpu_split()
        if split:  # our process and the GuideLLM processes it starts: the client CPUs
            os.sched_setaffinity(0, split[1])
    try:
        if args.model_path:
            server = launch(args, out, split)
        url = (server.base_url if server else args.url).rstrip("/")
        report = Run(args, url, out, guidellm, _quick_matrix, run_main).run()
    except (RuntimeError, ServerError, OSError, KeyError, ValueError) as exc:
        print(f"witness failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if server is not None:
            server.stop()
    c = report["comparison"]
    print(
        f"witness: {'agree' if c['agree'] else 'DISAGREE'} within ±{c['tolerance']:.0%} "
        + ", ".join(f"{k} x{v['ratio']:.3f}" for k, v in c["metrics"].items())
        + f"; {out}/REPORT.md ({time.monotonic() - t0:.0f} s)",
        file=sys.stderr,
    )
    return 0 if c["agree"] else EXIT_DISAGREE
