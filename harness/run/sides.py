"""The A/B performance gate: a baseline git ref against this checkout, on the same machine.

::

    REF --git worktree add--> TMP/baseline                (removed afterwards)
    per server group, per session s = 0..S-1 (fresh servers for each):
      start the baseline server (cwd and PYTHONPATH = TMP/baseline) and the candidate server
      (cwd and PYTHONPATH = this checkout); both stay up for the session
      pair i of the session, for each cell: visit A, visit B   (A/B, then B/A: alternating)
        visit = warm-up, radix preparation, one measured round numbered i
    -> OUT/baseline/, OUT/candidate/   full reports of each side
    -> paired comparison (harness.judge.paired) -> the matrix's gates -> OUT/compare.json, compare.md

Both servers answer the same requests within seconds of each other, so drift and the load of
other processes on the machine hit both sides of a pair alike and cancel in its ratio. Fresh
servers per session turn each process's lasting offset into noise the statistics can see.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from harness.metrics.rounds import round_metrics
from harness.run.campaign import RunOptions, _Campaign
from harness.run.cell import CellResult, run_cell
from harness.run.progress import Progress
from harness.servers.launch import LaunchedServer, Server, ServerError, group_members
from harness.spec.cells import Cell, group_by_server
from harness.spec.matrix import EngineSpec, MatrixSpec
from harness.spec.model import ResolvedModel

DEFAULT_REF = "HEAD~1"
PIN_FILE = ".ci/baseline-ref"


# --------------------------------------------------------------------------- git


def git(root: Path, *args: str) -> str | None:
    """``git -C root ARGS`` stdout, or None when it fails."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def repo_root(start: Path) -> Path | None:
    """The top of the git checkout holding ``start`` (None outside one)."""
    top = git(start, "rev-parse", "--show-toplevel")
    return Path(top) if top else None


def pinned_ref(root: Path) -> str | None:
    """The ref pinned in ``.ci/baseline-ref``: its first line that is not blank or a comment."""
    path = root / PIN_FILE
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            return line
    return None


def resolve_commit(root: Path, ref: str) -> str | None:
    """The commit a ref names (None when it names none, e.g. ``HEAD~1`` of a first commit)."""
    return git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")


@contextmanager
def worktree(root: Path, commit: str) -> Iterator[Path]:
    """A detached worktree of ``commit`` in a temporary directory, removed on exit."""
    tmp = Path(tempfile.mkdtemp(prefix="flashrec-gate-"))
    path = tmp / "baseline"
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "worktree", "add", "--detach", "--quiet", str(path), commit],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise RuntimeError(f"git worktree add {commit} failed: {out.stderr.strip()}")
        yield path
    finally:
        git(root, "worktree", "remove", "--force", str(path))
        shutil.rmtree(tmp, ignore_errors=True)
        git(root, "worktree", "prune")


# --------------------------------------------------------------------------- sides


@dataclass(frozen=True)
class Side:
    """One arm of the A/B run: a source tree the servers import FlashRec from, extra env."""

    name: str  # baseline | candidate
    tree: Path
    env: dict[str, str] = field(default_factory=dict)

    def engine(self, e: EngineSpec) -> EngineSpec:
        """The engine launched from this side's tree (its cwd and first PYTHONPATH entry)."""
        rest = e.env.get("PYTHONPATH") or os.environ.get("PYTHONPATH")
        path = os.pathsep.join([str(self.tree), *([rest] if rest else [])])
        env = {**e.env, **self.env, "PYTHONPATH": path}
        return e.model_copy(update={"cwd": str(self.tree), "env": env})

    def cells(self, cells: list[Cell]) -> list[Cell]:
        """The cells pointed at this side's tree (never traced: traces are not gated)."""
        return [dataclasses.replace(c, engine=self.engine(c.engine), traced=False) for c in cells]

    def flashrec_origin(self, engine: EngineSpec) -> str:
        """Where a server of this side imports ``flashrec`` from (checked before measuring)."""
        e = self.engine(engine)
        out = subprocess.run(
            [sys.executable, "-c", "import flashrec; print(flashrec.__file__)"],
            capture_output=True,
            text=True,
            cwd=e.cwd,
            env={**os.environ, **e.env},
            timeout=120,
        )
        return out.stdout.strip() if out.returncode == 0 else f"<import failed: {out.stderr}>"


# --------------------------------------------------------------------------- CPU pinning


def cpu_split() -> tuple[set[int], set[int]] | None:
    """(server CPUs, client CPUs): the last allowed CPU for the servers of both sides, the
    others for the harness's client; None with fewer than 2 CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[-1]}, set(cpus[:-1])) if len(cpus) >= 2 else None


def pin_server(server: Server, cpus: set[int]) -> None:
    """Pin every thread of a launched server's process group to ``cpus`` (threads it starts
    later inherit the mask)."""
    if not isinstance(server, LaunchedServer) or server.proc is None:
        return
    for pid in group_members(server.proc.pid):
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                os.sched_setaffinity(int(task.name), cpus)
            except OSError:  # the thread just exited
                pass


# --------------------------------------------------------------------------- the A/B run


def _merge(into: CellResult, visit: CellResult, pair: int) -> None:
    """Add one visit (one measured round) to a side's cell result as round ``pair``."""
    for r in visit.records:
        if r.round >= 0:
            r.round = pair
    into.records += visit.records
    into.rounds_done += visit.rounds_done
    into.duration_s = round(into.duration_s + visit.duration_s, 3)
    into.notes += [n for n in visit.notes if n not in into.notes]
    into.server = visit.server
    if visit.quality is not None:  # evaluated in the first pair only (a deterministic decode)
        into.quality = visit.quality
    if visit.status != "ok":
        into.status, into.error, into.log_tail = visit.status, visit.error, visit.log_tail


class ABRun:
    """Runs the cells of both sides pair by pair; results per side in cell order."""

    def __init__(
        self,
        spec: MatrixSpec,
        cells: list[Cell],
        sides: list[Side],
        pairs: int,
        out_dir: Path,
        model: ResolvedModel | None,
        log: Callable[[str], None] = print,
        server_cpus: set[int] | None = None,
        sessions: int = 1,
        deadline: float | None = None,
    ) -> None:
        self.spec, self.sides, self.pairs, self.log = spec, sides, pairs, log
        # --max-wall-s: no server start or pair begins that would end past ``deadline``
        # (time.monotonic), judged by the last ones' durations; ``cut`` says where it stopped
        self.deadline = deadline
        self.cut = ""
        self._last_s = {"start": 0.0, "pair": 0.0}
        self.server_cpus = server_cpus
        self.session_of = {p: p * sessions // pairs for p in range(pairs)}  # consecutive, even
        self.cells = {s.name: s.cells(cells) for s in sides}
        self.campaigns = {
            s.name: _Campaign(spec, RunOptions(out_dir / s.name, rounds=1), Progress(1), model)
            for s in sides
        }
        self.results = {
            s.name: {c.id: CellResult(c.id, dict(c.params)) for c in cells} for s in sides
        }

    async def _start(self, session, side: str, group: list[Cell]) -> Server | None:
        """Start the server of one group of cells; a failed start fails those cells only."""
        server = self.campaigns[side].new_server(group[0])
        try:
            await server.start(session)
        except ServerError as exc:
            self.log(f"{side} server failed to start: {exc}{exc.log_end()}")
            for cell in group:
                res = self.results[side][cell.id]
                res.status, res.error = "failed", f"{side} server start failed: {exc}"
                res.log_tail = exc.log_tail
            return None
        if self.server_cpus:
            pin_server(server, self.server_cpus)
        return server

    async def _visit(self, session, side: str, server: Server, cell: Cell, pair: int) -> dict:
        campaign = self.campaigns[side]
        ctx = dataclasses.replace(
            campaign.context(session, server, cell),
            on_request=None,
            on_phase=None,
            run_quality=self.results[side][cell.id].quality is None,
        )
        visit = await run_cell(ctx, cell)
        res = self.results[side][cell.id]
        _merge(res, visit, pair)
        if visit.status != "ok":
            self.log(f"{side} {cell.id} failed in pair {pair + 1}: {visit.error}")
            return {}
        return round_metrics([r for r in visit.records if r.phase == "measure"])

    def _out_of_time(self, *steps: str) -> bool:
        """Whether ``steps`` (a server start, a pair), timed like the last ones, would end past
        the deadline."""
        if self.deadline is None:
            return False
        need = sum(self._last_s[s] for s in steps)
        left = self.deadline - time.monotonic()
        if need <= left:
            return False
        self.cut = (
            f"--max-wall-s: {max(0.0, left):.1f} s left, the next {' + '.join(steps)} takes "
            f"~{need:.1f} s"
        )
        self.log(f"gate: stopping: {self.cut}")
        return True

    async def _group(self, session, index: int, pairs: list[int]) -> None:
        """One session of one server group: fresh servers for both sides, then ``pairs``."""
        names = [s.name for s in self.sides]
        groups = {n: group_by_server(self.cells[n])[index] for n in names}
        t0 = time.monotonic()
        started = await asyncio.gather(*(self._start(session, n, groups[n]) for n in names))
        self._last_s["start"] = time.monotonic() - t0
        servers = dict(zip(names, started))
        try:
            for pair in pairs:
                if self._out_of_time("pair"):
                    break
                t0 = time.monotonic()
                order = names if pair % 2 == 0 else names[::-1]
                line = []
                for j, cell in enumerate(groups[names[0]]):
                    qps = {}
                    for n in order:
                        side_cell = groups[n][j]
                        if servers[n] is None or self.results[n][cell.id].status != "ok":
                            continue
                        m = await self._visit(session, n, servers[n], side_cell, pair)
                        qps[n] = m.get("qps", float("nan"))
                    line.append(f"{cell.id}: " + " / ".join(f"{n} {q:.1f}" for n, q in qps.items()))
                self.log(f"pair {pair + 1}/{self.pairs} qps  " + "; ".join(line))
                self._last_s["pair"] = time.monotonic() - t0
        finally:
            for server in servers.values():
                if server is not None:
                    server.stop()

    async def run(self) -> dict[str, list[CellResult]]:
        """Run every server group; returns each side's cell results."""
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        first = self.sides[0].name
        async with aiohttp.ClientSession(connector=connector) as session:
            for i in range(len(group_by_server(self.cells[first]))):
                last = max(self.session_of.values())
                for s in range(last + 1):
                    if self.cut or self._out_of_time("start", "pair"):
                        break
                    if last:
                        self.log(f"session {s + 1}/{last + 1}: fresh servers")
                    pairs = [p for p, of in self.session_of.items() if of == s]
                    await self._group(session, i, pairs)
        return {n: list(r.values()) for n, r in self.results.items()}
