"""The report's "How it was measured" lines, each derived from what the run did: which servers
it started (or found running), how it warmed them up, the prefix-cache temperature it set
before each round, which rounds it traced and how many rounds the noise band rests on.

A report makes no claim the run did not check: an external server's code and state are not
this checkout's, a run that traced nothing has no traced rounds to explain, and a warm radix
with nothing to prime it with ran cold.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from harness.report.model import Cell
from harness.run.cell import CellResult
from harness.spec.matrix import EngineSpec, MatrixSpec

FLUSH_FAILED = "flush_cache failed"  # the note harness.load.loop.prepare_radix leaves


def _span(values: list[int]) -> str:
    """``8`` or ``4 to 8``."""
    lo, hi = min(values), max(values)
    return f"{lo}" if lo == hi else f"{lo} to {hi}"


def _cells(n: int) -> str:
    return f"{n} cell" + ("" if n == 1 else "s")


def _engine_text(engine: EngineSpec | None) -> str:
    """How one engine's servers came to be, in the words of what the run did."""
    if engine is None:
        return "a server of an engine the matrix no longer names"
    if engine.kind == "external":
        return (
            f"the external server at {engine.url}, which this run did not start: its code, "
            "flags and state (caches, earlier load) are its own, and the git line above is the "
            "harness's checkout, not necessarily the server's"
        )
    where = f"in {engine.cwd}" if engine.cwd else "on the checkout in the git line above"
    if engine.kind == "command":
        return f"servers started fresh by this run with engine '{engine.name}'s own command"
    return f"FlashRec servers started fresh by this run {where}"


def _launch_logs(server: dict) -> set[str]:
    """The logs of the processes a cell's server started: one, or each replica and the router."""
    logs = {server.get("log"), (server.get("router") or {}).get("log")}
    logs |= {r.get("log") for r in server.get("replica_servers") or []}
    return logs - {None}


def servers_line(spec: MatrixSpec, cells: Sequence[Cell]) -> str:
    """Which servers the cells ran on: launched by this run (how many launches), external, or
    measured by an earlier run and resumed."""
    engines = {e.name: e for e in spec.engine_list}
    here = [c for c in cells if not c.resumed]
    resumed = len(cells) - len(here)
    by_engine: dict[str, list[dict]] = {}
    for c in here:
        by_engine.setdefault(str(c.params.get("engine")), []).append(c)
    kinds = {engines[n].kind if n in engines else "?" for n in by_engine}
    logs = [_launch_logs(c.server or {}) for c in here]
    launches = len(set().union(*logs))
    what = (
        "launch(es) of servers, replicas and routers"
        if any((c.server or {}).get("router") for c in here)
        else "server launch(es)"
    )
    count = f" ({launches} {what} for {_cells(len(here))})" if launches else ""
    if not here:
        text = "no cell was measured by this run"
    elif kinds == {"flashrec"} and not any(engines[n].cwd for n in by_engine):
        text = (
            "every server was started fresh by this run on the checkout in the git line "
            f"above{count}"
        )
    elif kinds == {"command"}:
        text = f"every server was started fresh by this run with its engine's own command{count}"
    elif kinds == {"external"}:
        urls = sorted({str(engines[n].url) for n in by_engine})
        text = (
            f"no server was started by this run: every cell ran on the external server at "
            f"{', '.join(urls)}, whose code, flags and state (caches, earlier load) are its own; "
            "the git line above is the harness's checkout, not necessarily the server's"
        )
    else:
        parts = [f"{name}: {_engine_text(engines.get(name))}" for name in by_engine]
        text = "servers by engine: " + "; ".join(parts) + count
    if resumed:
        text += (
            f"; {resumed} of {len(cells)} cells were measured by an earlier run and resumed into "
            "this report (--resume): the environment above is the run that wrote the report, "
            "each resumed cell's own (when, machine, commit) is in its notes"
        )
    return text


def _ran(cells: Sequence[Cell]) -> list[Cell]:
    """The cells that measured at least one round (a failed server start measured none)."""
    return [c for c in cells if c.rounds]


def warmup_line(cells: Sequence[Cell]) -> str:
    """The fixed load, and the warm-up requests the cells sent before their measured rounds."""
    counts = [int((c.warmup or {}).get("requests") or 0) for c in _ran(cells)]
    line = "fixed load per cell: the same measured requests every round"
    if not counts:
        return line
    if not any(counts):
        return line + "; no warm-up requests were sent before the measured rounds"
    cold = sum(1 for n in counts if n == 0)
    line += f"; {_span([n for n in counts if n])} warm-up requests per cell before its measured "
    line += "rounds, never counted"
    return line + (f" ({cold} of {len(counts)} cells sent none)" if cold else "")


def _radix_state(spec: MatrixSpec, cell: Cell, res: CellResult | None) -> str:
    """What the run did to one cell's prefix cache before its measured rounds."""
    mode = str(cell.params.get("radix", spec.load.radix))
    if mode != "warm":
        return "flushed (radix: cold)"
    primed = {r.round for r in (res.records if res else []) if r.phase == "prime"}
    if res is not None and not primed:
        return (
            "only flushed (radix: warm, but with no warm-up prompts to prime it with: it ran cold)"
        )
    return "flushed, then primed with the cell's warm-up prompts (radix: warm)"


def radix_line(spec: MatrixSpec, results: list[CellResult], cells: Sequence[Cell]) -> str | None:
    """The prefix-cache temperature set before every round: one state for every cell, or the
    cells of each state; the cells where the flush failed are named."""
    by_id = {r.id: r for r in results}
    ran = _ran(cells)
    if not ran:
        return None
    states = Counter(_radix_state(spec, c, by_id.get(c.id)) for c in ran)
    failed = [c.id for c in ran if any(str(n).startswith(FLUSH_FAILED) for n in c.notes)]
    if len(states) == 1:
        line = f"before every round of every cell the prefix cache was {next(iter(states))}"
    else:
        line = "before every round the prefix cache was " + "; ".join(
            f"{state} in {_cells(n)}" for state, n in states.items()
        )
    if failed:
        line += (
            f"; flush_cache failed in {_cells(len(failed))} ({', '.join(failed)}): their "
            "prefix-cache temperature was not controlled (see their notes)"
        )
    return line


def trace_line(cells: Sequence[Cell]) -> str:
    """Which cells got a traced round, and whether the run waited for complete trace files."""
    traced = [c for c in cells if c.trace]
    if not traced:
        return "no round was traced: this run started no profiler"
    line = (
        f"{len(traced)} of {_cells(len(cells))} got an extra traced round after their measured "
        "rounds: its numbers never enter the statistics"
    )
    waited = [c for c in traced if (c.trace or {}).get("status") == "complete"]
    if waited:
        line += (
            f"; the run went on only after the trace files of {_cells(len(waited))} were "
            "complete and stable"
        )
    other = [
        f"{c.id}: {(c.trace or {}).get('status')}"
        for c in traced
        if c.id not in {w.id for w in waited}
    ]
    if other:
        line += f"; not complete ({'; '.join(other)}): see the cells' notes"
    overlap = sum(
        (c.excluded_requests or {}).get("reasons", {}).get("trace_overlap", 0) for c in traced
    )
    if overlap:
        line += f"; {overlap} measured request(s) overlapped trace writing and were excluded"
    return line


def noise_line(spec: MatrixSpec, cells: Sequence[Cell]) -> str:
    """The rounds each cell's noise band rests on, and the cells with too few for one."""
    ok = [c for c in cells if c.ok]
    if not ok:
        return "no cell finished its measured rounds: no noise band, no conclusion"
    k, least = spec.stats.band_k, spec.stats.min_rounds
    enough = [c.rounds for c in ok if c.rounds >= least]
    few = [c for c in ok if c.rounds < least]
    if not enough:
        return (
            f"only {_span([c.rounds for c in ok])} measured round(s) per cell (< {least}): "
            "no noise band, so nothing in this report supports a conclusion about a change"
        )
    line = (
        f"noise band per cell = {k:g} x CV over its own {_span(enough)} measured rounds; "
        "changes inside it are noise"
    )
    if few:
        ids = ", ".join(c.id for c in few)
        line += (
            f"; {_cells(len(few))} with fewer than {least} rounds ({ids}) have no noise band "
            "and support no conclusion"
        )
    if spec.load.cooldown_s:
        line += f"; {spec.load.cooldown_s:g} s pause after every measured round"
    return line


def method_lines(spec: MatrixSpec, results: list[CellResult], cells: Sequence[Cell]) -> list[str]:
    """The report's "How it was measured" lines for these cells (report.json's
    ``measurement.rules``)."""
    lines = [servers_line(spec, cells), warmup_line(cells)]
    radix = radix_line(spec, results, cells)
    lines += [radix] if radix else []
    return lines + [trace_line(cells), noise_line(spec, cells)]
