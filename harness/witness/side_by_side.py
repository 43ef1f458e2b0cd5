"""``flashrec-bench witness`` (:mod:`harness.cli.witness`): flashrec-bench and an independent
load generator (GuideLLM) run the same cell against the same server, round by round, and the report sets their QPS and
latency p50 / p99 side by side with the ratio witness / flashrec-bench.

The cell is the one ``flashrec-bench quick`` builds from the same flags (closed loop of
``--concurrency`` clients, ``--requests`` synthetic prompts, ``n`` = ``--beam-width``,
``max_tokens``, temperature 0, radix cache flushed before every round). GuideLLM gets the very
prompts flashrec-bench measures (its JSONL dataset, ``messages`` column), ``n`` and
temperature as extra body fields, non-streaming HTTP/1.1 requests, ``concurrent`` profile with
``--concurrency`` streams and a ``max_requests`` constraint of ``--requests``. Rounds
alternate which tool goes first, so drift of a shared machine falls on both. The server's own
``/metrics`` counters around each round (requests, generated tokens, latency sum) are the
referee: they show both tools sent the same work and how much of a latency gap lies outside
the server.

``--url`` measures a running server; ``--model-path`` launches a FlashRec server (``--server-arg
KEY=VALUE`` flags, ``--beam-width`` as its ``--beam-width``) and stops it after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml

from harness.metrics.server import scrape
from harness.witness.guidellm import guidellm_scenario, guidellm_version, run_guidellm

METRICS = ("qps", "latency_p50_ms", "latency_p99_ms")
# server counters whose deltas around a round are the referee
SERVED = 'flashrec_requests_total{endpoint="chat",outcome="success"}'
TOKENS = "flashrec_completion_tokens_total"
LAT_SUM = 'flashrec_request_latency_seconds_sum{endpoint="chat"}'
LAT_COUNT = 'flashrec_request_latency_seconds_count{endpoint="chat"}'


# ------------------------------------------------------------------------ flashrec-bench side


def read_bench(out: Path) -> dict[str, Any]:
    """The one cell of a flashrec-bench run (one round): its QPS and latencies."""
    report = json.loads((out / "report.json").read_text())
    cell = report["cells"][0]
    if cell["status"] != "ok":
        raise RuntimeError(f"flashrec-bench cell {cell['status']}: {cell.get('error', '')}")
    m = cell["metrics"]
    got = {k: m[k]["median"] for k in (*METRICS, "latency_mean_ms") if k in m}
    got["errors"] = m["error_rate"]["median"]
    got["invalid_rate"] = (m.get("invalid_rate") or {}).get("median")  # None: no catalog
    got["beams_mean"] = m["beams_mean"]["median"]
    return got


def served_delta(before: dict | None, after: dict | None) -> dict[str, float]:
    """What the server saw between two ``/metrics`` scrapes (empty without them)."""
    if not before or not after or SERVED not in after:
        return {}
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in (SERVED, TOKENS, LAT_SUM, LAT_COUNT)}
    out = {"requests": d[SERVED], "completion_tokens": d[TOKENS]}
    if d[LAT_COUNT]:
        out["latency_mean_ms"] = 1000.0 * d[LAT_SUM] / d[LAT_COUNT]
    return out


def host_cpu() -> tuple[float, float] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat; None where there is none."""
    try:
        fields = [float(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def cpu_busy(before: tuple | None, after: tuple | None) -> float | None:
    """The machine's busy share of CPU time between two :func:`host_cpu` samples."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


# ----------------------------------------------------------------------------- comparison


def compare(bench: list[dict], witness: list[dict], tolerance: float) -> dict[str, Any]:
    """Median over rounds of each tool's metric, the ratio witness / flashrec-bench and whether
    it lies within ``tolerance`` of 1."""
    rows = {}
    for name in METRICS:
        a = float(np.median([r[name] for r in bench]))
        b = float(np.median([r[name] for r in witness]))
        ratio = b / a if a else float("nan")
        rows[name] = {
            "flashrec_bench": a,
            "witness": b,
            "ratio": ratio,
            "agree": bool(abs(ratio - 1.0) <= tolerance),
            "witness_recomputed": float(np.median([r["recomputed"][name] for r in witness])),
        }
    return {
        "tolerance": tolerance,
        "metrics": rows,
        "agree": all(r["agree"] for r in rows.values()),
    }


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def _num(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def write_markdown(report: dict, path: Path) -> None:
    c, cell = report["comparison"], report["cell"]
    lines = [
        f"# Witness: flashrec-bench vs GuideLLM {report['witness_version']}",
        "",
        f"Cell: n={cell['beam_width']}, concurrency {cell['concurrency']}, {cell['requests']} "
        f"requests per round, ~{cell['prompt_tokens']}-token prompts, max_tokens "
        f"{cell['max_tokens']}, temperature 0, radix flushed per round; {cell['rounds']} rounds "
        f"per tool, alternating. Server: {report['server']['url']}.",
        "",
        "| metric | flashrec-bench | GuideLLM | ratio | agree (±"
        f"{c['tolerance']:.0%}) | GuideLLM stamps, flashrec-bench definition |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in c["metrics"].items():
        lines.append(
            f"| {name} | {r['flashrec_bench']:.2f} | {r['witness']:.2f} | {r['ratio']:.3f} | "
            f"{'yes' if r['agree'] else 'NO'} | {r['witness_recomputed']:.2f} |"
        )
    lines += ["", "Per round (medians above; server = the server's /metrics deltas):", ""]
    lines += [
        "| round | tool | QPS | p50 ms | p99 ms | mean ms | server requests | server tokens "
        "| server mean ms | host CPU busy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rounds"]:
        s = r.get("server", {})
        cells = [r["round"], r["tool"], _num(r["qps"], 2), _num(r["latency_p50_ms"]),
                 _num(r["latency_p99_ms"]), _num(r["latency_mean_ms"]),
                 _num(s.get("requests"), 0), _num(s.get("completion_tokens"), 0),
                 _num(s.get("latency_mean_ms")), _pct(r.get("host_cpu_busy"))]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    conc = [r["concurrency_mean"] for r in report["rounds"] if "concurrency_mean" in r]
    if conc:
        lines += ["", f"GuideLLM's mean requests in flight: {_num(float(np.median(conc)), 2)} "
                  f"of {cell['concurrency']} streams (median over rounds)."]  # fmt: skip
    lines += ["", f"Verdict: {'agree' if c['agree'] else 'DISAGREE'} within ±{c['tolerance']:.0%}."]
    path.write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------------------ the run


class Run:
    """One witness run: the matrix, the prompts, the rounds of both tools, the report.

    ``matrix_of`` turns ``flashrec-bench quick`` flags into their matrix and ``bench`` runs a
    matrix as ``flashrec-bench MATRIX ARGS`` (its exit code): the CLI passes both in.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        url: str,
        out: Path,
        guidellm: list[str],
        matrix_of: Callable[[list[str]], dict],
        bench: Callable[[list[str]], int],
    ):
        self.args, self.url, self.out, self.guidellm = args, url, out, guidellm
        self.matrix_of, self.bench = matrix_of, bench
        self.rounds: list[dict] = []

    def bench_matrix(self, warmup: int, name: str) -> Path:
        """The ``quick`` matrix of the cell against ``url`` (one round per run)."""
        a = self.args
        argv = ["--url", self.url, "--beam-width", str(a.beam_width),
                "--concurrency", str(a.concurrency), "--requests", str(a.requests),
                "--warmup", str(warmup), "--rounds", "1", "--radix", "cold",
                "--prompt-tokens", str(a.prompt_tokens), "--max-tokens", str(a.max_tokens),
                "--timeout-s", str(a.timeout_s), "--tokenizer", a.tokenizer,
                "--name", "witness"]  # fmt: skip
        if a.catalog:
            argv += ["--catalog", a.catalog]
        matrix = self.matrix_of(argv)
        path = self.out / "flashrec-bench" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(matrix, sort_keys=False))
        return path

    def dataset(self, matrix: Path) -> Path:
        """The measured prompts of the cell, exactly as flashrec-bench builds them, as a JSONL
        dataset with a ``messages`` column."""
        from harness.load.workload import build_prompts, load_tokenizer
        from harness.spec.load import load_cells
        from harness.spec.model import resolve_model

        spec, cells = load_cells(str(matrix))
        model = resolve_model(spec, log=lambda *_: None)
        tok = load_tokenizer(model.path) if model.source == "path" else None
        prompts = build_prompts(spec.workload, cells[0].client, model.levels, tok).measured
        path = self.out / "witness" / "prompts.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"messages": p.messages}) + "\n" for p in prompts))
        return path

    def bench_round(self, matrix: Path, rnd: int | str) -> dict:
        out = self.out / "flashrec-bench" / f"round-{rnd}"
        code = self.bench([str(matrix), "--out", str(out)])
        if code not in (0, 1):  # 1: a gate (invalid SIDs, errors): the numbers still stand
            raise RuntimeError(f"flashrec-bench round {rnd} exited {code}; see {out}")
        return read_bench(out)

    def witness_round(self, data: Path, rnd: int) -> dict:
        a = self.args
        folder = self.out / "witness" / f"round-{rnd}"
        folder.mkdir(parents=True, exist_ok=True)
        result = folder / "guidellm.json"
        scenario = folder / "scenario.json"
        scenario.write_text(json.dumps(guidellm_scenario(
            self.url, data, a.tokenizer, a.beam_width, a.concurrency, a.requests,
            a.max_tokens, a.timeout_s, result,
        ), indent=1))  # fmt: skip
        asyncio.run(_flush(self.url))  # the radix temperature flashrec-bench sets: cold
        return run_guidellm(self.guidellm, scenario, result)

    def round(self, tool: str, fn, arg: Path, rnd: int) -> dict:
        """One tool's round, with the server's counters read before and after it."""
        before, cpu = asyncio.run(_scrape(self.url)), host_cpu()
        got = fn(arg, rnd)
        got["server"] = served_delta(before, asyncio.run(_scrape(self.url)))
        got["host_cpu_busy"] = cpu_busy(cpu, host_cpu())
        got.update(tool=tool, round=rnd)
        self.rounds.append(got)
        print(f"witness: round {rnd} {tool}: {got['qps']:.2f} QPS, p50 "
              f"{got['latency_p50_ms']:.1f} ms, p99 {got['latency_p99_ms']:.1f} ms",
              file=sys.stderr)  # fmt: skip
        return got

    def run(self) -> dict:
        # warm-up once, by a flashrec-bench run whose numbers are dropped; the measured rounds
        # then run no warm-up of their own, so the server counters around each round hold the
        # measured requests alone
        self.bench_round(self.bench_matrix(self.args.warmup, "warmup.yaml"), "warmup")
        matrix = self.bench_matrix(0, "matrix.yaml")
        data = self.dataset(matrix)
        for rnd in range(self.args.rounds):
            steps = [("flashrec-bench", self.bench_round, matrix, rnd),
                     ("guidellm", self.witness_round, data, rnd)]  # fmt: skip
            for tool, fn, arg, r in steps if rnd % 2 == 0 else steps[::-1]:
                self.round(tool, fn, arg, r)
        return self.report()

    def report(self) -> dict:
        a = self.args
        bench = [r for r in self.rounds if r["tool"] == "flashrec-bench"]
        wit = [r for r in self.rounds if r["tool"] == "guidellm"]
        report = {
            "cell": {
                "beam_width": a.beam_width,
                "concurrency": a.concurrency,
                "requests": a.requests,
                "prompt_tokens": a.prompt_tokens,
                "max_tokens": a.max_tokens,
                "rounds": a.rounds,
                "warmup": a.warmup,
            },  # fmt: skip
            "server": {
                "url": self.url,
                "pinned": bool(a.pin_cpus),
                "launched": bool(a.model_path),
                "server_args": dict(a.server_arg),
            },  # fmt: skip
            "witness_version": guidellm_version(),
            "command": " ".join(["flashrec-bench witness", *sys.argv[2:]]),
            "rounds": self.rounds,
            "comparison": compare(bench, wit, a.tolerance),
        }
        (self.out / "report.json").write_text(json.dumps(report, indent=1, default=str))
        write_markdown(report, self.out / "REPORT.md")
        return report


async def _scrape(url: str) -> dict | None:
    async with aiohttp.ClientSession() as s:
        return await scrape(s, url)


async def _flush(url: str) -> None:
    from harness.load.loop import flush_cache

    async with aiohttp.ClientSession() as s:
        await flush_cache(s, url)


def launch(args: argparse.Namespace, out: Path, split: tuple[set, set] | None):
    """A FlashRec server on ``--model-path`` (its log in OUT/server.log), started and healthy."""
    from harness.servers.launch import LaunchedServer
    from harness.spec.matrix import EngineSpec
    from harness.spec.model import ResolvedModel
    from harness.spec.serve_args import flashrec_serve_args

    engine = EngineSpec(
        name="flashrec", kind="flashrec", device=args.device,
        startup_timeout_s=args.startup_timeout_s,
    )  # fmt: skip
    model = ResolvedModel(args.model_path, args.catalog, "", "path", 0)
    server_args = flashrec_serve_args({"beam_width": args.beam_width, **dict(args.server_arg)})
    server = LaunchedServer(engine, server_args, model, out / "server.log")

    async def start() -> None:
        async with aiohttp.ClientSession() as s:
            await server.start(s)

    asyncio.run(start())
    if split:
        from harness.run.sides import pin_server

        pin_server(server, split[0])
    return server
