"""``flashrec-bench eval DATASET``: recommendation quality of a beam server on a RecIF-style
dataset (pass@k, position1_pass@k, recall@k by SID and by PID; invalid and duplicate rates;
per task, with 95% intervals over samples).

Exit codes: 0 ok; 2 bad input (dataset, mapping, options, a URL that is no http(s) URL); 3 the
server failed (every request, its start, or the first few requests could not connect).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from harness.quality.dataset import default_sid2pid, load_dataset
from harness.quality.evaluate import (
    OFFICIAL_BEAMS,
    OFFICIAL_KS,
    OFFICIAL_TOKENS,
    EvalOptions,
    ask_url,
    render,
    score,
)
from harness.quality.pids import load_pid_map
from harness.spec.url import url_arg

EXIT_OK, EXIT_USAGE, EXIT_SERVER = 0, 2, 3


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flashrec-bench eval",
        description="Recommendation quality of a beam server on a RecIF-Bench parquet "
        "(file or data tree) or a JSONL dataset. Reference: docs/harness.md.",
    )
    p.add_argument("dataset", help="RecIF parquet file or folder, or a JSONL file")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--url", type=url_arg, help="a running server (FlashRec, SGLang, the HF reference)"
    )
    where.add_argument("--model-path", help="launch FlashRec on this checkpoint (127.0.0.1)")
    p.add_argument("--protocol", choices=["chat", "generate"], default="chat",
                   help="chat completions, or SGLang /generate (chat template + <|sid_begin|>)")  # fmt: skip
    p.add_argument("--official", action="store_true",
                   help=f"the benchmark's protocol: {OFFICIAL_BEAMS} beams, {OFFICIAL_TOKENS} "
                   "tokens, k in {1, 32}; prints the published numbers beside ours on an "
                   "official test set")  # fmt: skip
    p.add_argument("--beams", type=int, help=f"beam width (default {OFFICIAL_BEAMS})")
    p.add_argument("--max-tokens", type=int, help="tokens to generate (default: SID depth + 1)")
    p.add_argument("--ks", help="cut-offs, comma separated (default 1,32)")
    p.add_argument("--catalog", help="valid SIDs for the invalid rate (default: the sid2pid "
                   "mapping, else the launched model's catalog)")  # fmt: skip
    p.add_argument("--catalogs", action="append", metavar="NAME=PATH",
                   help="a named catalog (repeatable; the first is the default): a launched "
                   "server gets each as --sid-vocab-file NAME=PATH, every request names its "
                   "task's catalog, and each task's invalid rate is checked against it")  # fmt: skip
    p.add_argument("--task-catalog", action="append", metavar="TASK=NAME",
                   help="ask TASK's samples over the named catalog NAME of --catalogs "
                   "(repeatable; other tasks: the first --catalogs)")  # fmt: skip
    p.add_argument("--sid2pid", help="SID -> item id mapping for the PID metrics (default: "
                   "sid2pid.json beside the dataset; without one, SID metrics only)")  # fmt: skip
    p.add_argument("--packed-base", type=int, metavar="B",
                   help="base the packed-integer SID keys of --sid2pid / --catalog were written "
                   "in (default 8192, RecIF's; a launched server reads them alike)")  # fmt: skip
    p.add_argument("--tokenizer", help="chat template for --protocol generate (default: "
                   "--model-path, else the built-in ChatML)")  # fmt: skip
    p.add_argument("--served-model-name", default="default", help="the chat 'model' field")
    p.add_argument("--levels", type=int, default=3, help="SID depth (default 3)")
    p.add_argument("--limit", type=int, help="evaluate only the first N samples")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    p.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    p.add_argument("--device", help="launched server's device (cpu, cuda)")
    p.add_argument("--server-arg", action="append", metavar="KEY=VALUE",
                   help="a flashrec serve flag for the launched server (repeatable)")  # fmt: skip
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    return p


def _options(args: argparse.Namespace) -> EvalOptions:
    ks = tuple(sorted({int(k) for k in args.ks.split(",") if k.strip()})) if args.ks else None
    if args.official:
        clash = [
            f"{name} {got}"
            for name, got, want in (
                ("--beams", args.beams, OFFICIAL_BEAMS),
                ("--max-tokens", args.max_tokens, OFFICIAL_TOKENS),
                ("--ks", ks, OFFICIAL_KS),
            )
            if got is not None and got != want
        ]
        if clash:
            raise ValueError(f"--official fixes the protocol; drop {', '.join(clash)}")
        beams, tokens, ks = OFFICIAL_BEAMS, OFFICIAL_TOKENS, OFFICIAL_KS
    else:
        beams, tokens = args.beams or OFFICIAL_BEAMS, args.max_tokens or args.levels + 1
        ks = ks or OFFICIAL_KS
    if beams < 1 or tokens < 1 or not ks or min(ks) < 1:
        raise ValueError("--beams, --max-tokens and every k must be >= 1")
    if args.concurrency < 1:
        raise ValueError("--concurrency must be >= 1")
    return EvalOptions(
        beams, tokens, ks, args.protocol, args.concurrency, args.timeout,
        args.served_model_name, args.levels,
    )  # fmt: skip


def _server_args(args: argparse.Namespace) -> dict:
    """The launched server's flags: ``--server-arg`` pairs, and ``--packed-base`` so that it
    reads the catalog's packed keys as the eval does."""
    from harness.quality.serve import parse_args

    out = parse_args(args.server_arg)
    if args.packed_base is not None:
        out.setdefault("packed_base", str(args.packed_base))
    return out


def _named(args: argparse.Namespace, files: list, opts: EvalOptions):
    """``--catalogs`` / ``--task-catalog``: NAME -> PATH, the options naming each task's
    catalog, and the SIDs of each catalog a task is asked with (ValueError on bad input)."""
    import dataclasses

    from harness.load.sids import load_catalog_sids
    from harness.quality.catalogs import parse_catalogs, parse_task_catalogs

    catalogs = parse_catalogs(args.catalogs)
    tasks = {s.task for f in files for s in f.samples}
    by_task = parse_task_catalogs(args.task_catalog, catalogs, tasks)
    if not catalogs:
        return {}, opts, {}
    if args.catalog:
        raise ValueError("give --catalog (one catalog) or --catalogs (named ones), not both")
    default = next(iter(catalogs))
    opts = dataclasses.replace(opts, catalog=default, task_catalogs=tuple(sorted(by_task.items())))
    used = {default, *by_task.values()}
    sids = {n: load_catalog_sids(p, args.packed_base) for n, p in catalogs.items() if n in used}
    return catalogs, opts, sids


def main(argv: list[str] | None = None) -> int:
    from harness.load.sids import load_catalog_sids
    from harness.load.workload import PromptRenderer, load_tokenizer

    args = parser().parse_args(argv)
    try:
        opts = _options(args)
        files = load_dataset(args.dataset, args.levels)
        samples = [s for f in files for s in f.samples][: args.limit or None]
        if not samples:
            raise ValueError("--limit leaves no sample")
        mapping = args.sid2pid or default_sid2pid(args.dataset)
        if args.packed_base is not None and args.packed_base < 2:
            raise ValueError(f"--packed-base must be at least 2, got {args.packed_base}")
        pid_map = load_pid_map(mapping, args.packed_base) if mapping else None
        catalogs, opts, named = _named(args, files, opts)
        catalog_path = args.catalog or next(iter(catalogs.values()), None)
        catalog_path = catalog_path or (str(mapping) if mapping else None)
        if catalog_path is None and args.model_path:
            model_catalog = Path(args.model_path) / "catalog.json"
            catalog_path = str(model_catalog) if model_catalog.is_file() else None
        catalog = load_catalog_sids(catalog_path, args.packed_base) if catalog_path else None
        tok = args.tokenizer or args.model_path
        renderer = PromptRenderer(load_tokenizer(tok)) if args.protocol == "generate" else None
    except (ValueError, OSError) as exc:
        print(f"eval: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(
        f"eval: {len(samples)} samples from {len(files)} file(s); PID mapping: {mapping or 'none'}",
        file=sys.stderr,
    )
    try:
        if args.url:
            answers = asyncio.run(ask_url(args.url.rstrip("/"), samples, opts, renderer))
        else:
            import tempfile

            from harness.quality.serve import launched

            logs = args.out.parent if args.out else Path(tempfile.mkdtemp(prefix="flashrec-eval-"))
            log = logs / "eval-server.log"
            print(f"eval: server log {log}", file=sys.stderr)
            with launched(
                "flashrec", args.model_path, catalog_path, log, args.device,
                _server_args(args), catalogs=catalogs,
            ) as srv:  # fmt: skip
                answers = asyncio.run(ask_url(srv.base_url, samples, opts, renderer))
    except (RuntimeError, OSError) as exc:
        print(f"eval: {exc}", file=sys.stderr)
        tail = getattr(exc, "log_tail", "")
        if tail:
            print(tail, file=sys.stderr)
        return EXIT_SERVER
    result = score(answers, opts, catalog, pid_map, files, named=named)
    result["server"] = args.url or f"launched FlashRec on {args.model_path}"
    result["dataset"] = str(args.dataset)
    print(render(result, args.official))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return EXIT_OK
