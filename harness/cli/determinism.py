"""``flashrec-bench determinism``: flags, ``KEY=VALUE`` parsing and exit codes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness.determinism.bitwise import DEFAULT_NS
from harness.determinism.check import run_determinism


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _pairs(items: list[str] | None, what: str, flags: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{what} expects KEY=VALUE, got {item!r}")
        if flags:
            out[key.lstrip("-").replace("-", "_")] = _value(value)
        else:
            out[key] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``flashrec-bench determinism``."""
    p = argparse.ArgumentParser(
        prog="flashrec-bench determinism",
        description="Bit-for-bit reproducibility across fresh server "
        "processes, with step-hash localisation of any drift.",
    )
    p.add_argument("--model-path", required=True)
    p.add_argument("--sid-vocab-file")
    p.add_argument(
        "--requests", type=int, default=120, help="distinct requests (>= 120 for an acceptance run)"
    )
    p.add_argument("--processes", type=int, default=3, help="fresh server processes (>= 2)")
    p.add_argument("--mode", choices=["sequential", "concurrent", "both"], default="both")
    p.add_argument("--concurrency", type=int, default=8, help="in flight in concurrent mode")
    p.add_argument("--out", type=Path, help="report dir (default reports/determinism-<time>)")
    p.add_argument(
        "--server-arg",
        action="append",
        metavar="KEY=VALUE",
        help="FlashRec server flag, e.g. batch_slots=512 (repeatable)",
    )
    p.add_argument(
        "--server-env",
        action="append",
        metavar="KEY=VALUE",
        help="server environment variable (repeatable)",
    )
    p.add_argument("--protocol", choices=["chat", "generate"], default="chat")
    p.add_argument(
        "--ns", default=",".join(map(str, DEFAULT_NS)), help="beam widths, cycled over the requests"
    )
    p.add_argument("--median-tokens", type=int, default=96)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"])
    p.add_argument("--no-localise", action="store_true", help="skip the step-hash replay")
    p.add_argument(
        "--strict-concurrent",
        action="store_true",
        help="concurrent-mode drift, across processes or against the sequential answers, fails "
        "the run too (results must not depend on what else is batched with a request; needs "
        "--mode both); by default it is reported only",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """``flashrec-bench determinism``. Exit codes: 0 pass, 1 sequential drift (or concurrent
    drift with --strict-concurrent), 2 usage, 3 a server failed to start or requests failed."""
    from harness.servers.launch import ServerError, install_signal_handlers

    args = build_parser().parse_args(argv)
    if args.processes < 2 or args.requests < 1:
        print("determinism: need --processes >= 2 and --requests >= 1", file=sys.stderr)
        return 2
    if args.strict_concurrent and args.mode != "both":
        print("determinism: --strict-concurrent needs --mode both", file=sys.stderr)
        return 2
    if not Path(args.model_path).is_dir():
        print(f"determinism: --model-path {args.model_path} is not a directory", file=sys.stderr)
        return 2
    install_signal_handlers()
    try:
        result = run_determinism(
            args.model_path,
            args.sid_vocab_file,
            args.requests,
            args.processes,
            args.mode,
            args.concurrency,
            args.out,
            _pairs(args.server_arg, "--server-arg", True),
            _pairs(args.server_env, "--server-env", False),
            args.protocol,
            tuple(int(x) for x in args.ns.split(",") if x.strip()),
            args.median_tokens,
            args.seed,
            args.device,
            not args.no_localise,
            log=lambda msg: print(msg, file=sys.stderr),
            strict_concurrent=args.strict_concurrent,
        )
    except ServerError as exc:
        print(f"determinism: {exc}\n{exc.log_tail}", file=sys.stderr)
        return 3
    print(
        json.dumps(
            {k: result[k] for k in ("status", "acceptance", "duration_s")}
            | {
                m: {k: result[m][k] for k in ("drifting_requests", "max_score_diff", "errors")}
                for m in ("sequential", "concurrent")
                if m in result
            }
        )
    )
    return {"pass": 0, "fail": 1}.get(result["status"], 3)
