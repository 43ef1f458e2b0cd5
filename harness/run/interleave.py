"""Several engines on the same cells with their rounds interleaved (``load.interleave_engines``).

::

    per point (a cell's parameters without the engine), every engine's server up at once
    (started side by side):
      round 0: A, B, C      round 1: C, B, A      round 2: A, B, C ...
        visit = warm-up, radix preparation, one measured round numbered r
      traced round (each engine whose cell is traced), quality eval (first visit)

Each engine answers the same prompts within seconds of the others, so drift and load from
other processes on the machine hit every engine alike and cancel in their per-round ratio
(:mod:`harness.report.engines`). A server is kept for the next point when its engine's flags
do not change; one that fails to start or dies fails that engine's cell, with its log tail,
and the other engines go on.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from harness.baseline import hf as hf_baseline
from harness.metrics import replicas
from harness.run.cell import CellResult, run_cell
from harness.servers.launch import Server, ServerError
from harness.spec.cells import Cell


def point_key(cell: Cell) -> str:
    """What a cell is without its engine (its id after the engine name; an engine's own
    ``link`` knobs are not in it): cells of equal keys are measured side by side."""
    return cell.id.split(",", 1)[1] if "," in cell.id else ""


def points(cells: list[Cell]) -> list[dict[str, Cell]]:
    """The cells grouped by :func:`point_key` (engine name -> cell), in first-seen order."""
    out: dict[str, dict[str, Cell]] = {}
    for c in cells:
        out.setdefault(point_key(c), {})[c.engine.name] = c
    return list(out.values())


def merge(into: CellResult, visit: CellResult, rnd: int) -> None:
    """Add one visit (warm-up, then one measured round or the traced round) to an engine's cell
    result as round ``rnd`` (the traced round: the number after the last measured one)."""
    for r in visit.records:
        if r.round >= 0:
            r.round = rnd
    into.records += visit.records
    into.rounds_done += visit.rounds_done
    for v in visit.server_rounds.values():
        into.server_rounds[rnd] = v
    into.host_rounds += visit.host_rounds
    into.duration_s = round(into.duration_s + visit.duration_s, 3)
    into.notes += [n for n in visit.notes if n not in into.notes]
    rows = into.server.get("replicas")  # per-replica counts add up over the visits
    into.server.update(visit.server)
    if rows and visit.server.get("replicas"):
        into.server["replicas"] = replicas.accumulate(rows, [], visit.server["replicas"])
    if visit.trace is not None:
        into.trace = visit.trace
    if visit.quality is not None:
        into.quality = visit.quality
    if visit.status != "ok":
        into.status, into.error, into.log_tail = visit.status, visit.error, visit.log_tail


class Interleaved:
    """Runs the selected cells point by point with every engine's server up at once."""

    def __init__(self, campaign: Any) -> None:
        self.c = campaign  # harness.run.campaign._Campaign
        self.servers: dict[str, Server] = {}
        self.keys: dict[str, str] = {}

    def stop(self, name: str) -> None:
        srv = self.servers.pop(name, None)
        self.keys.pop(name, None)
        if srv is not None:
            srv.stop()

    def stop_all(self) -> None:
        for name in list(self.servers):
            self.stop(name)

    async def server(self, session, cell: Cell, res: CellResult) -> Server | None:
        """The running server for ``cell`` (kept from the last point when its flags match);
        None when it cannot start (``res`` then holds the failure and the log tail)."""
        name = cell.engine.name
        srv = self.servers.get(name)
        if srv is not None and self.keys.get(name) == cell.server_key and srv.exit_code() is None:
            return srv
        self.stop(name)
        srv = self.c.new_server(cell)
        self.c.progress.set_phase(f"starting {name}")
        try:
            await srv.start(session)
        except ServerError as exc:
            res.status, res.error = "failed", f"server start failed: {exc}"
            res.log_tail = exc.log_tail
            res.server = self.c.server_meta(srv)
            return None
        self.servers[name], self.keys[name] = srv, cell.server_key
        return srv

    async def visit(self, session, srv: Server, cell: Cell, res: CellResult, rnd: int,
                    rounds: int, traced: bool) -> None:  # fmt: skip
        """One visit of an engine's cell: ``rounds`` measured rounds (0 or 1) numbered ``rnd``,
        with the traced round when ``traced``."""
        ctx = dataclasses.replace(
            self.c.context(session, srv, cell),
            rounds=rounds,
            run_quality=res.quality is None and rounds > 0,
        )
        visit = await run_cell(ctx, dataclasses.replace(cell, traced=traced))
        visit.server.update(self.c.server_meta(srv))
        merge(res, visit, rnd)
        if visit.status != "ok" and srv.engine.launched:
            self.stop(cell.engine.name)  # the next point gets a fresh server

    async def point(self, session, cells: dict[str, Cell], results: dict[str, CellResult]):
        """Every engine's cell of one point, rounds alternating between the engines."""
        todo = {n: c for n, c in cells.items() if c.id not in results}
        if not todo:
            return
        self.c.check_budget()
        self.c.progress.start_cell(" | ".join(c.id for c in todo.values()))
        res = {n: CellResult(c.id, dict(c.params)) for n, c in todo.items()}
        for n, c in todo.items():
            res[n].burst = c.client.concurrency if c.client.mode == "burst" else 0
            res[n].closed = c.client.concurrency if c.client.mode == "closed" else 0
        # every engine starts at once (a peer's start can take minutes: loading, graphs, its
        # own warm-up); ports are picked one after the other before any of them starts
        names = list(todo)
        started = await asyncio.gather(
            *(self.server(session, todo[n], res[n]) for n in names), return_exceptions=True
        )
        for out in started:  # raised once every start has ended, so none is left running
            if isinstance(out, BaseException):
                raise out
        up = {n: srv for n, srv in zip(names, started) if srv is not None}
        for rnd in range(self.c.rounds):
            self.c.progress.set_phase(f"round {rnd + 1}/{self.c.rounds}")
            for n in names if rnd % 2 == 0 else names[::-1]:
                if n in up and res[n].status == "ok":
                    await self.visit(session, up[n], todo[n], res[n], rnd, 1, False)
        for n in names:
            if todo[n].traced and n in up and res[n].status == "ok":
                await self.visit(session, up[n], todo[n], res[n], self.c.rounds, 0, True)
        hf = self.c.spec.baseline.hf if self.c.spec.baseline else None
        if any(hf_baseline.applies(hf, c) for c in todo.values()):
            self.stop_all()  # baselines never share the machine with a server
        for n, c in todo.items():
            if self.c.spec.mfu is not None:
                res[n].mfu = self.c.mfu_info(c)
            self.c.finish(res[n], results)
        self.c.run_baselines(list(todo.values()), results)

    async def run(self, session, cells: list[Cell], results: dict[str, CellResult]) -> None:
        try:
            for group in points(cells):
                await self.point(session, group, results)
        finally:
            self.stop_all()
