"""``flashrec`` command line: generate | serve | synth | catalog | check-env.

Compatibility forms from the deploy notes: ``flashrec --serve ...`` (= serve) and
``flashrec --model-path ... --prompt ...`` (= generate).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from flashrec.config import EngineConfig, ServerConfig, add_config_args, config_from_args

COMMANDS = ("generate", "serve", "synth", "catalog", "check-env")


def _add_generate_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one user message (chat template applied)")
    src.add_argument("--messages-json", help="file with a JSON list of chat messages")
    src.add_argument("--input-ids", help="raw prompt ids, comma separated (used as-is)")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="cap on generated tokens (default: catalog depth + 1)",
    )
    p.add_argument(
        "--temperature", type=float, default=0.0, help="0 = deterministic top-n; > 0 = Gumbel top-n"
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the request's Gumbel noise (temperature > 0)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_config_args(p, EngineConfig)


def run_generate(args: argparse.Namespace) -> int:
    from flashrec.engine.engine import Engine

    engine = Engine(config_from_args(EngineConfig, args))
    if args.prompt is not None:
        ids = engine.build_prompt(messages=[{"role": "user", "content": args.prompt}])
    elif args.messages_json is not None:
        with open(args.messages_json) as fh:
            ids = engine.build_prompt(messages=json.load(fh))
    else:
        ids = engine.build_prompt(
            input_ids=[int(x) for x in args.input_ids.split(",") if x.strip()]
        )
    req = engine.new_request(
        ids,
        n=args.beam_width,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
    )
    res = engine.generate([req])[0]
    if args.json:
        out = {
            "choices": [
                {
                    "index": i,
                    "text": b.text,
                    "output_ids": b.token_ids,  # the name SGLang's /generate uses
                    "sequence_score": b.sequence_score,
                    "cum_logprob": b.cum_logprob,
                    "finish_reason": b.finish_reason,
                }
                for i, b in enumerate(res.beams)
            ],
            "usage": {
                "prompt_tokens": res.prompt_tokens,
                "completion_tokens": res.completion_tokens,
                "total_tokens": res.prompt_tokens + res.completion_tokens,
                "cached_tokens": res.cached_tokens,
            },
        }
        print(json.dumps(out))
    else:
        for i, b in enumerate(res.beams):
            print(f"{i:4d}  {b.sequence_score:+.6f}  {b.finish_reason:6s}  {b.text}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flashrec", description="FlashRec: GenRec beam-search serving engine"
    )
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate_args(sub.add_parser("generate", help="offline beam search for one prompt"))
    serve = sub.add_parser("serve", help="HTTP server (OpenAI chat + SGLang /generate)")
    try:
        from flashrec.server.app import add_serve_args
    except ImportError:  # pragma: no cover - server module missing
        add_config_args(serve, ServerConfig)
    else:
        add_serve_args(serve)
    from flashrec.synth import add_synth_args

    add_synth_args(sub.add_parser("synth", help="write a synthetic checkpoint (+ catalog)"))
    from flashrec.sid.catalog import add_catalog_args

    add_catalog_args(
        sub.add_parser("catalog", help="report on a catalog; convert it to comma-key JSON (--out)")
    )
    from flashrec.check_env import add_check_env_args

    add_check_env_args(
        sub.add_parser("check-env", help="report torch / CUDA / GPU / flashinfer / triton")
    )
    return parser


def _rewrite_aliases(argv: list[str]) -> list[str]:
    if "--serve" in argv:
        return ["serve"] + [a for a in argv if a != "--serve"]
    if (
        argv
        and argv[0] not in COMMANDS
        and argv[0] not in ("-h", "--help", "--log-level")
        and ("--prompt" in argv or "--messages-json" in argv or "--input-ids" in argv)
    ):
        return ["generate"] + argv
    return argv


def main(argv: list[str] | None = None) -> int:
    argv = _rewrite_aliases(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "generate":
            return run_generate(args)
        if args.command == "serve":
            from flashrec.server.app import serve_main

            return serve_main(args)
        if args.command == "synth":
            from flashrec.synth import run_synth

            return run_synth(args)
        if args.command == "catalog":
            from flashrec.sid.catalog import run_catalog

            return run_catalog(args)
        from flashrec.check_env import run_check_env

        return run_check_env(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"flashrec: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
