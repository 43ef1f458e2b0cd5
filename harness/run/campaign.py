"""The campaign: cells -> server groups -> cell runs -> persisted results -> run stages.

Cells sharing a server run back to back on one fresh server process (the current code); a
change of server-level parameters restarts it, and so does a failed cell. Each finished cell
is written to ``OUT/cells/<id>/`` at once, so ``--resume`` can skip it after an interruption.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from harness.baseline import hf as hf_baseline
from harness.load.client import Record
from harness.load.sids import SidChecker, load_catalog_sids
from harness.load.workload import PromptRenderer, PromptSet, build_prompts, load_tokenizer
from harness.metrics.flops import ceiling_for, mfu_info
from harness.metrics.host import BUSY_NOTE
from harness.run.cell import CellContext, CellResult, run_cell, safe_name
from harness.run.environment import content_hash, measured_stamp, take_host_probe
from harness.run.interleave import Interleaved
from harness.run.outdir import set_aside_old_report
from harness.run.progress import Progress
from harness.run.stages import StageContext, run_stages
from harness.servers.launch import LaunchedServer, Server, ServerError
from harness.servers.replicas import RoutedServer, make_server
from harness.spec.catalogs import catalog_paths
from harness.spec.cells import Cell, group_by_server, select
from harness.spec.matrix import MatrixSpec
from harness.spec.model import ModelError, ResolvedModel, resolve_model


@dataclass
class RunOptions:
    """Command-line choices for one run."""

    out_dir: Path
    only: list[str] | None = None
    rounds: int | None = None
    resume: bool = False
    dry_run: bool = False
    matrix_path: str | None = None
    max_wall_s: float | None = None  # --max-wall-s: no cell starts that would end past it


# --------------------------------------------------------------------------- persistence


def save_result(out_dir: Path, res: CellResult) -> None:
    """Write ``cells/<id>/cell.json`` and ``records.jsonl`` (cell.json last: it marks done)."""
    d = out_dir / "cells" / safe_name(res.id)
    d.mkdir(parents=True, exist_ok=True)
    if not res.measured:  # the first save, when its rounds are done; kept by later saves
        res.measured = measured_stamp()
    with open(d / "records.jsonl", "w") as f:
        for r in res.records:
            f.write(json.dumps(asdict(r)) + "\n")
    meta = {k: v for k, v in asdict(res).items() if k != "records"}
    (d / "cell.json").write_text(json.dumps(meta, indent=1, default=str))


def load_result(out_dir: Path, cell_id: str) -> CellResult | None:
    """A previously saved cell result, or None."""
    d = out_dir / "cells" / safe_name(cell_id)
    if not (d / "cell.json").is_file():
        return None
    meta = json.loads((d / "cell.json").read_text())
    # JSON writes the round numbers as text; the records (and round_extra) key them as ints
    meta["server_rounds"] = {int(k): v for k, v in meta.get("server_rounds", {}).items()}
    records = []
    if (d / "records.jsonl").is_file():
        for line in (d / "records.jsonl").read_text().splitlines():
            records.append(Record(**json.loads(line)))
    return CellResult(**meta, records=records)


# --------------------------------------------------------------------------- planning


def plan(spec: MatrixSpec, cells: list[Cell], model: ResolvedModel | None) -> str:
    """A readable plan: server groups, their launch commands and their cells."""
    lines = []
    groups = group_by_server(cells)
    hf = spec.baseline.hf if spec.baseline else None
    if model is None and spec.model is not None:
        has_catalog = bool(
            (spec.catalog and (spec.catalog.path or spec.catalog.size)) or spec.model.catalog_size
        )
        named = tuple((n, p, None) for n, p in spec.catalogs.items())
        catalog = named[0][1] if named else "<catalog>" if has_catalog else None
        model = ResolvedModel("<model>", catalog, "", "plan", 3, catalogs=named)
    for i, group in enumerate(groups):
        engine = group[0].engine
        if engine.router is not None:
            routed = RoutedServer(engine, group[0].server_args, model, Path("server.log"))
            for j, argv in enumerate(routed.commands()):
                who = f"replica {j}" if j < engine.replicas else "router"
                lines.append(f"server {i + 1} {who}: {' '.join(argv)}")
        elif engine.launched:
            srv = LaunchedServer(engine, group[0].server_args, model, Path("server.log"))
            lines.append(f"server {i + 1}: {' '.join(srv.command())}")
        else:
            lines.append(f"server {i + 1}: external {engine.url} ({engine.protocol})")
        for c in group:
            k = c.client
            if k.mode == "closed":
                load = f"concurrency {k.concurrency}"
            elif k.mode == "burst":
                load = f"bursts of {k.concurrency} at once"
            else:
                load = f"{k.mode} {k.rate}/s for {k.duration_s or 'requests/rate'} s"
            extras = " +trace" if c.traced else ""
            if hf_baseline.applies(hf, c):
                assert hf is not None
                max_tokens = k.max_tokens or (model.levels if model else 3) + 1
                try:
                    extras += f" +hf-baseline({hf_baseline.requests_for(hf, c, max_tokens)})"
                except (ValueError, SyntaxError, TypeError, ZeroDivisionError) as exc:
                    extras += f" +hf-baseline(bad requests: {exc})"
            if spec.mfu is not None:
                ceiling, key = ceiling_for(spec.mfu, c.params)
                extras += f" mfu-ceiling={'?' if ceiling is None else f'{ceiling:g}'}"
            lines.append(
                f"  {c.id}: n={k.beam_width} {load} requests={k.requests} "
                f"warmup={k.warmup_requests} radix={k.radix} prompt~{k.median_tokens} "
                f"max_tokens={c.engine.max_tokens or k.max_tokens or 'depth+1'}" + extras
            )
    starts = sum(1 for g in groups if g[0].engine.launched)
    lines.append(f"{len(cells)} cell(s), {starts} server start(s), {spec.load.rounds} round(s)")
    if spec.load.interleave_engines:  # servers listed above start per cell, kept while flags match
        lines.append("engines interleaved: all of a cell's servers up at once, rounds alternating")
    if hf is not None and hf.enabled:
        lines.append(
            f"HF baseline after each server group: dtype {hf.dtype}, max_kv_gib "
            f"{hf.max_kv_gib if hf.max_kv_gib is not None else 'none'}, own process"
        )
    for t in spec.targets:
        rel = f" (as a ratio to the cell with {t.relative_to})" if t.relative_to else ""
        lines.append(f"target: {t.label}" + (f" on {t.cells}" if t.cells else "") + rel)
    q = spec.quality
    if q.evaluates:
        src = q.dataset or f"generated ({q.generate.samples} planted samples)"  # type: ignore[union-attr]
        beams = "32 (official)" if q.official else q.beam_width or "the cell's n"
        lines.append(f"quality eval after each cell: {src}, beams {beams}, ks {q.ks}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- running


class _Campaign:
    def __init__(
        self, spec: MatrixSpec, opts: RunOptions, progress: Progress, model: ResolvedModel | None
    ) -> None:
        self.spec, self.opts, self.progress, self.model = spec, opts, progress, model
        try:
            catalog = load_catalog_sids(model.catalog) if model and model.catalog else None
        except (ValueError, OSError) as exc:
            raise ModelError(f"cannot read catalog {model.catalog}: {exc}") from None
        self.checker = SidChecker(model.levels if model else 3, catalog)
        self.checkers: dict[str, SidChecker] = {}  # a named catalog's (harness.spec.catalogs)
        self.rounds = opts.rounds or spec.load.rounds
        self.prompt_cache: dict[tuple, PromptSet] = {}
        self.tokenizers: dict[str, Any] = {}
        self.launches = 0
        self.t0 = time.monotonic()
        self.done = 0  # cells finished in this run (resumed ones not counted)
        self.one_time_s = 0.0  # run-wide work done inside a cell (the planted quality dataset)

    def per_cell_s(self) -> float | None:
        """Wall time per finished cell so far, server starts and baselines included, one-time
        work (a generated quality dataset) not: later cells do not repeat it."""
        if not self.done:
            return None
        return (time.monotonic() - self.t0 - self.one_time_s) / self.done

    def budget_short(self) -> str | None:
        """``--max-wall-s``: why the next cell (or HF baseline) may not start, None when it
        may: less time left than the mean wall time of the cells finished so far (the first
        cell always starts)."""
        budget, per = self.opts.max_wall_s, self.per_cell_s()
        if budget is None or per is None:
            return None
        left = budget - (time.monotonic() - self.t0)
        if left >= per:
            return None
        return f"{left:.0f} s of --max-wall-s {budget:g} left, a cell takes ~{per:.0f} s here"

    def check_budget(self) -> None:
        """Refuse to start a cell past the budget (:meth:`budget_short`)."""
        short = self.budget_short()
        if short is not None:
            raise BudgetExhausted(f"time budget: {short}")

    def catalog_path(self, cell: Cell) -> str | None:
        """The file of the catalog the cell's requests name (the default's without a name)."""
        paths = catalog_paths(self.model.catalogs) if self.model else {}
        name = cell.client.catalog
        return paths[name] if name in paths else (self.model.catalog if self.model else None)

    def checker_for(self, cell: Cell) -> SidChecker:
        """The SID checker of the catalog the cell names (the default's without a name)."""
        name = cell.client.catalog
        if name is None or self.model is None or name not in catalog_paths(self.model.catalogs):
            return self.checker
        if name not in self.checkers:
            path = self.catalog_path(cell)
            try:
                sids = load_catalog_sids(str(path))
            except (ValueError, OSError) as exc:
                raise ModelError(f"cannot read catalog {name!r} ({path}): {exc}") from None
            self.checkers[name] = SidChecker(self.checker.levels, sids)
        return self.checkers[name]

    def tokenizer(self, path: str | None) -> Any:
        if not path:
            return None
        if path not in self.tokenizers:
            self.tokenizers[path] = load_tokenizer(path)
        return self.tokenizers[path]

    def prompts(self, cell: Cell) -> PromptSet:
        c = cell.client
        key = (c.median_tokens, c.spread, c.system_prompt_tokens, c.requests, c.warmup_requests)
        if key not in self.prompt_cache:
            real = self.model is not None and self.model.source == "path"
            tok = self.tokenizer(self.model.path) if real else None
            self.prompt_cache[key] = build_prompts(self.spec.workload, c, self.checker.levels, tok)
        return self.prompt_cache[key]

    def renderer(self, cell: Cell) -> PromptRenderer | None:
        if cell.engine.protocol != "generate":
            return None
        path = cell.engine.tokenizer or (self.model.path if self.model else None)
        return PromptRenderer(self.tokenizer(path))

    def new_server(self, cell: Cell) -> Server:
        self.launches += 1
        log = self.opts.out_dir / "servers" / f"{cell.engine.name}-{self.launches}.log"
        while log.exists():  # a resumed run keeps the earlier logs
            self.launches += 1
            log = log.with_name(f"{cell.engine.name}-{self.launches}.log")
        # FlashRec only writes traces below $FLASHREC_TORCH_PROFILER_DIR
        env = {"FLASHREC_TORCH_PROFILER_DIR": str(self.trace_dir().resolve())}
        return make_server(cell.engine, cell.server_args, self.model, log, env)

    def trace_dir(self) -> Path:
        return Path(self.spec.trace.output_dir or self.opts.out_dir / "traces")

    async def run_group(self, session, group: list[Cell], results: dict[str, CellResult]):
        server: Server | None = None
        try:
            for i, cell in enumerate(group):
                self.check_budget()
                self.progress.start_cell(cell.id)
                if server is None or server.exit_code() is not None:
                    if server is not None:
                        server.stop()
                    server = self.new_server(cell)
                    self.progress.set_phase("starting server")
                    try:
                        await server.start(session)
                    except ServerError as exc:
                        for rest in group[i:]:
                            if rest is not cell:
                                self.progress.start_cell(rest.id)
                            res = CellResult(
                                rest.id,
                                dict(rest.params),
                                status="failed",
                                error=f"server start failed: {exc}",
                                log_tail=exc.log_tail,
                            )
                            res.server = self.server_meta(server)
                            self.finish(res, results)
                        break
                res = await run_cell(self.context(session, server, cell), cell)
                res.server.update(self.server_meta(server))
                if self.spec.mfu is not None:
                    res.mfu = self.mfu_info(cell)
                self.finish(res, results)
                if res.status == "failed" and server.engine.launched:
                    server.stop()  # the next cell gets a fresh server
                    server = None
        finally:
            if server is not None:
                server.stop()
        # baselines run after the group's server is gone: their memory never meets its memory
        self.run_baselines(group, results)

    def max_tokens(self, cell: Cell) -> int:
        return cell.engine.max_tokens or cell.client.max_tokens or self.checker.levels + 1

    def mfu_info(self, cell: Cell) -> dict:
        assert self.spec.mfu is not None
        return mfu_info(
            self.spec.mfu,
            cell.params,
            self.model.path if self.model else None,
            cell.client.beam_width,
            self.max_tokens(cell),
            self.checker.levels,
        )

    def run_baselines(self, group: list[Cell], results: dict[str, CellResult]) -> None:
        hf = self.spec.baseline.hf if self.spec.baseline else None
        for cell in group:
            res = results.get(cell.id)
            if res is None or res.status != "ok" or not hf_baseline.applies(hf, cell):
                continue
            assert hf is not None
            if self.budget_short() is not None:
                res.baseline["hf"] = {
                    "status": "skipped",
                    "hf_skipped": f"--max-wall-s {self.opts.max_wall_s:g}: too little time left",
                }
                self.progress.message(f"HF baseline for {cell.id}: skipped (time budget)")
                save_result(self.opts.out_dir, res)
                continue
            prompts = self.prompts(cell).measured
            try:
                k = hf_baseline.requests_for(hf, cell, self.max_tokens(cell))
            except (ValueError, SyntaxError, TypeError, ZeroDivisionError) as exc:
                res.baseline["hf"] = {
                    "status": "failed",
                    "hf_error": f"baseline.hf.requests: {exc}",
                }
                save_result(self.opts.out_dir, res)
                continue
            self.progress.message(
                f"HF baseline for {cell.id}: {k} request(s), n={cell.client.beam_width}"
            )
            # synchronous on purpose: nothing else runs meanwhile, and Ctrl-C / SIGTERM reach
            # run_baseline's cleanup (which kills the baseline's process group) at once
            try:
                res.baseline["hf"] = hf_baseline.run_baseline(
                    hf,
                    cell,
                    prompts[:k],
                    res.records,
                    self.model.path if self.model else None,
                    self.catalog_path(cell),
                    self.max_tokens(cell),
                    self.opts.out_dir / "baselines" / safe_name(cell.id),
                )
            except (OSError, ValueError, KeyError) as exc:  # never let a baseline stop the run
                res.baseline["hf"] = {
                    "status": "failed",
                    "hf_error": f"{type(exc).__name__}: {exc}",
                }
            got = res.baseline["hf"]
            detail = (
                got.get("hf_skipped")
                or got.get("hf_error")
                or (f"{got.get('hf_ms_per_request', 0):.1f} ms/request")
            )
            self.progress.message(f"HF baseline for {cell.id}: {got['status']}: {detail[:300]}")
            save_result(self.opts.out_dir, res)

    def context(self, session, server: Server, cell: Cell) -> CellContext:
        return CellContext(
            session=session,
            server=server,
            spec=self.spec,
            prompts=self.prompts(cell),
            checker=self.checker_for(cell),
            renderer=self.renderer(cell),
            max_tokens=self.max_tokens(cell),
            rounds=self.rounds,
            trace_dir=self.trace_dir(),
            on_request=self.progress.request_done,
            on_phase=self.progress.set_phase,
            quality_dir=self.opts.out_dir / "quality",
        )

    def server_meta(self, server: Server) -> dict:
        meta: dict[str, Any] = {"info": server.info}
        if isinstance(server, LaunchedServer):
            meta.update(log=str(server.log_path), command=server.command())
        if isinstance(server, RoutedServer):
            meta.update(server.meta())
        if isinstance(server, (LaunchedServer, RoutedServer)) and server.startup_s is not None:
            meta["startup_s"] = round(server.startup_s, 2)
        return meta

    def finish(self, res: CellResult, results: dict[str, CellResult]) -> None:
        save_result(self.opts.out_dir, res)
        results[res.id] = res
        self.done += 1
        once = float((res.quality or {}).get("dataset_build_s") or 0.0)
        self.one_time_s += once
        if res.status == "failed":
            self.progress.message(f"cell {res.id} failed: {res.error}")
        for note in res.notes:  # said while the run goes on: the operator can quiet the host
            if note.startswith(BUSY_NOTE) and not res.resumed:
                self.progress.message(f"cell {res.id}: {note}")
        self.progress.end_cell(res.status, one_time_s=once)

    async def run(self, cells: list[Cell], results: dict[str, CellResult]) -> None:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector) as session:
            if self.spec.load.interleave_engines:  # every engine's server of a cell up at once
                await Interleaved(self).run(session, cells, results)
                return
            for group in group_by_server(cells):
                todo = [c for c in group if c.id not in results]
                if todo:
                    await self.run_group(session, todo, results)


class ResumeError(RuntimeError):
    """``--resume`` into a directory written by a different matrix."""


class BudgetExhausted(Exception):
    """``--max-wall-s`` leaves too little time for the next cell."""


class RunInterrupted(Exception):
    """Ctrl-C or SIGTERM (a time limit's ``timeout``) stopped the run before every selected cell
    ran. Carries what the report of the finished cells needs; their servers are already down
    (the exception left every cell's ``finally`` on its way out)."""

    def __init__(
        self,
        results: list[CellResult],
        selected: int,
        model: ResolvedModel | None,
        cause: str,
        exit_code: int,
    ) -> None:
        super().__init__(f"interrupted ({cause}) after {len(results)} of {selected} cells")
        self.results, self.selected, self.model, self.cause = results, selected, model, cause
        self.exit_code = exit_code  # 130 for Ctrl-C, 128 + signal for SIGTERM / SIGHUP


def check_resume(opts: RunOptions, spec: MatrixSpec) -> None:
    """Record the matrix hash in ``OUT/run.json``; refuse to resume a different matrix."""
    path = opts.out_dir / "run.json"
    digest = content_hash(spec.model_dump(mode="json"))
    if opts.resume and path.is_file():
        before = json.loads(path.read_text()).get("matrix_hash")
        if before != digest:
            raise ResumeError(
                f"{opts.out_dir} holds a run of another matrix (hash {before}, "
                f"now {digest}); use a new --out"
            )
    path.write_text(json.dumps({"matrix_hash": digest, "matrix_path": opts.matrix_path}))


def run_matrix(
    spec: MatrixSpec, cells: list[Cell], opts: RunOptions, progress: Progress
) -> tuple[list[CellResult], dict, ResolvedModel | None]:
    """Run the selected cells (resuming finished ones); returns results, stages and model."""
    take_host_probe()  # before a model is built or any server runs beside it
    chosen = select(spec, cells, opts.only)
    model = resolve_model(spec, log=progress.message)
    campaign = _Campaign(spec, opts, progress, model)
    for cell in chosen:  # every named catalog the cells use read now: a bad file fails at once
        campaign.checker_for(cell)
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    check_resume(opts, spec)
    if not opts.resume:
        moved = set_aside_old_report(opts.out_dir)
        if moved is not None:
            progress.message(f"an earlier run's report in {opts.out_dir} moved to {moved}")
    results: dict[str, CellResult] = {}
    if opts.resume:
        for c in chosen:
            prev = load_result(opts.out_dir, c.id)
            if prev is not None and prev.status == "ok":
                prev.resumed = True
                if not prev.closed and c.client.mode == "closed":  # saved before the field
                    prev.closed = c.client.concurrency
                results[c.id] = prev
                progress.end_cell("ok (resumed)", skipped=True)
    try:
        asyncio.run(campaign.run(chosen, results))
    except (KeyboardInterrupt, SystemExit, BudgetExhausted) as exc:  # SIGTERM: SystemExit
        if isinstance(exc, KeyboardInterrupt):
            cause, code = "Ctrl-C", 130
        elif isinstance(exc, BudgetExhausted):
            cause, code = str(exc), 130
        else:
            code = exc.code if isinstance(exc.code, int) else 143
            cause = {143: "SIGTERM", 129: "SIGHUP"}.get(code, f"exit {code}")
        done = [results[c.id] for c in chosen if c.id in results]
        raise RunInterrupted(done, len(chosen), model, cause, code) from None
    finally:
        progress.close()
    ordered = [results[c.id] for c in chosen if c.id in results]
    stages = run_stages(StageContext(spec, model, opts.out_dir, opts.resume))
    return ordered, stages, model
