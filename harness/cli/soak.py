"""``flashrec-bench soak``: fixed-rate load for a long time against one server, a probe whose
answer must not change, resource samples per interval and a trend gate (docs/harness/soak.md).

Exit codes: 0 passed; 1 a resource grows, the probe changed, or an error happened; 2 usage;
3 the server did not start; 130 / 143 interrupted (the report of what ran is still written).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from harness.cli.commands import EXIT_CELLS, EXIT_GATE, EXIT_INTERRUPT, EXIT_USAGE
from harness.cli.quick import add_server_arg
from harness.soak.actions import takes_argument
from harness.soak.config import SoakConfig, parse_action, parse_duration, parse_tolerance
from harness.spec.url import url_arg


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tolerance(text: str) -> tuple[str, float]:
    try:
        return parse_tolerance(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flashrec-bench soak",
        description="Load one server at a fixed rate for a long time; a probe request whose "
        "answer must not change; per interval the RSS, fds and threads of every server "
        "process, its /metrics gauges and latency percentiles; a trend per resource (growth "
        "per 1,000 requests, 95% interval). Writes REPORT.md, soak.json, samples.csv.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", type=url_arg, help="a running server (not started or stopped)")
    where.add_argument("--model-path", help="launch a FlashRec server on this checkpoint")
    p.add_argument("--catalog", action="append", metavar="[NAME=]PATH",
                   help="--model-path: --sid-vocab-file (default MODEL/catalog.json); repeat as "
                   "NAME=PATH for a server holding named catalogs, the first the default")  # fmt: skip
    p.add_argument("--device", help="--model-path: the server's --device")
    add_server_arg(p)
    p.add_argument("--pgid", type=int, help="--url: the server's process group, to sample /proc")
    p.add_argument("--duration", type=_duration, required=True, help="e.g. 45s, 10m, 1h")
    p.add_argument("--rate", type=float, default=6.0, help="requests per second (default 6)")
    p.add_argument("--interval", type=_duration, default=60.0, help="sample interval (60s)")
    p.add_argument(
        "--warmup",
        type=_duration,
        help="left out of the fits (default: the longer of one interval and 10%% of the duration)",
    )
    p.add_argument("--probe-every", type=_duration, default=30.0, help="probe period (30s)")
    p.add_argument("--probe-beam-width", type=int, default=8, help="the probe's n (8)")
    p.add_argument(
        "--probe-score-tol",
        type=float,
        default=1e-4,
        help="score difference still the same answer (default 1e-4)",
    )
    p.add_argument(
        "--probe-key",
        choices=["none", "catalog"],
        default="none",
        help="catalog: one reference answer per catalog_hash (swaps between "
        "catalogs of different content); none: any change fails",
    )
    p.add_argument("--beam-width", type=int, default=8, help="the load's n (8)")
    p.add_argument("--max-tokens", type=int, default=4, help="SID levels + the end token (4)")
    p.add_argument("--prompts", type=int, default=64, help="synthetic prompts cycled (64)")
    p.add_argument("--prompt-tokens", type=int, default=64, help="their median length (64)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=60.0, help="per request (60)")
    p.add_argument(
        "--max-inflight",
        type=int,
        default=256,
        help="arrivals past this many in flight count as errors (256)",
    )
    p.add_argument(
        "--every",
        nargs=2,
        action="append",
        default=[],
        metavar=("PERIOD", "ACTION"),
        help="run ACTION every PERIOD: "
        + ", ".join(f"{n}=ARG" if a else n for n, a in takes_argument().items())
        + "; ARG may list several, comma-separated, taken in turn",
    )
    p.add_argument(
        "--tolerance",
        type=_tolerance,
        action="append",
        default=[],
        metavar="NAME=PER_1000[:RUN]",
        help="growth tolerated per 1,000 requests and over the run (inf: report only), e.g. "
        "rss_mib=2, p99_ms=5:20",
    )
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    p.add_argument("--out", type=Path, help="report directory (default reports/soak-<time>/)")
    return p


def config(args: argparse.Namespace) -> SoakConfig:
    """The :class:`SoakConfig` of parsed flags (ValueError names a bad one)."""
    from harness.soak.config import TOLERANCES

    known = takes_argument()
    acts = tuple(parse_action(period, action, known) for period, action in args.every)
    warmup = args.warmup
    if warmup is None:
        warmup = min(max(args.interval, args.duration / 10), args.duration / 2)
    return SoakConfig(
        duration_s=args.duration,
        rate=args.rate,
        interval_s=args.interval,
        warmup_s=warmup,
        probe_every_s=args.probe_every,
        beam_width=args.beam_width,
        probe_beam_width=args.probe_beam_width,
        max_tokens=args.max_tokens,
        prompts=args.prompts,
        prompt_tokens=args.prompt_tokens,
        seed=args.seed,
        timeout_s=args.timeout_s,
        max_inflight=args.max_inflight,
        probe_score_tol=args.probe_score_tol,
        probe_key=args.probe_key,
        actions=acts,
        tolerances={**TOLERANCES, **dict(args.tolerance)},
    )


def _server(args: argparse.Namespace, out: Path):
    from flashrec.config.engine import DEFAULT_CATALOG, parse_catalog_specs
    from harness.servers.launch import LaunchedServer
    from harness.spec.matrix import EngineSpec
    from harness.spec.model import ResolvedModel
    from harness.spec.serve_args import flashrec_serve_args

    named = parse_catalog_specs(args.catalog)  # ValueError: a name given twice
    catalog = named[0][1] if named else None
    if catalog is None and (Path(args.model_path) / "catalog.json").is_file():
        catalog = str(Path(args.model_path) / "catalog.json")
    engine = EngineSpec(device=args.device, startup_timeout_s=args.startup_timeout_s)
    levels = max(1, args.max_tokens - 1)
    # several files, or one named: the server holds them by name (--sid-vocab-file NAME=PATH)
    several = tuple((n, p, None) for n, p in named)
    if len(named) == 1 and named[0][0] == DEFAULT_CATALOG:
        several = ()  # one unnamed file: a plain --sid-vocab-file
    model = ResolvedModel(args.model_path, catalog, "", "path", levels, catalogs=several)
    args_ = flashrec_serve_args(dict(args.server_arg))
    return LaunchedServer(engine, args_, model, out / "server.log")


async def _start(server) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        await server.start(session)


def _prompts(cfg: SoakConfig) -> list:
    from flashrec.synth import synth_prompts
    from harness.load.workload import Prompt

    chats = synth_prompts(cfg.prompts, median_tokens=cfg.prompt_tokens, seed=cfg.seed)
    return [Prompt(i, m) for i, m in enumerate(chats)]


def main(argv: list[str]) -> int:
    """Run a soak; write its report; 0 when it passed."""
    from harness.servers.launch import ServerError, install_signal_handlers
    from harness.soak import report
    from harness.soak.run import Soak

    args = parser().parse_args(argv)
    try:
        cfg = config(args)
    except ValueError as exc:
        print(f"flashrec-bench soak: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.pgid is not None and not args.url:
        print("flashrec-bench soak: --pgid is for --url", file=sys.stderr)
        return EXIT_USAGE
    out = args.out or Path("reports") / time.strftime("soak-%Y%m%d-%H%M%S")
    prompts = _prompts(cfg)
    install_signal_handlers()
    try:
        server = None if args.url else _server(args, out)
    except ValueError as exc:  # a catalog name given twice
        print(f"flashrec-bench soak: --catalog: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if server is not None:
        print(f"launching: {' '.join(server.command())}", file=sys.stderr)
        try:
            asyncio.run(_start(server))
        except ServerError as exc:
            print(f"the server did not start: {exc}\n{exc.log_tail}", file=sys.stderr)
            return EXIT_CELLS
    base = args.url or server.base_url
    pgid = args.pgid if server is None else server.process_group()
    soak = Soak(
        cfg,
        base,
        pgid,
        prompts,
        log=lambda s: print(s, flush=True),
        on_row=lambda rows: report.write_samples(out, rows),
    )
    code = None
    try:
        asyncio.run(soak.run())
    except KeyboardInterrupt:
        code = EXIT_INTERRUPT
    except SystemExit as exc:  # SIGTERM / SIGHUP (install_signal_handlers)
        code = int(exc.code or EXIT_INTERRUPT)
    finally:
        if code is not None:
            soak.state.interrupted, soak.state.elapsed_s = True, soak.now()
        if server is not None:
            died = server.exit_code()
            if died is not None:
                soak.state.notes.append(f"the server exited with code {died} during the soak")
                soak.state.error(soak.now(), "server", f"exited with code {died}")
            server.stop()
    meta = {"command": " ".join(["flashrec-bench soak", *argv]), "url": base, "process_group": pgid}
    line, passed = report.write(out, cfg, soak.state, soak.probe, meta)
    print(line)
    print(f"report: {out / 'REPORT.md'}", file=sys.stderr)
    if code is not None:
        return code
    return 0 if passed else EXIT_GATE
