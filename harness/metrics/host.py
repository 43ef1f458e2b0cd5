"""Other work on the host during a measured round, from Linux's CPU accounting.

A server's speed depends on the host as much as on the accelerator: tokenizing, scheduling and
HTTP run on its CPUs. A round measured while another process burns CPU (a model being written,
a build, a second benchmark) is slower for a reason outside the server, and a report that
does not say so invites a false regression. Around each measured round the harness reads

- the machine's busy CPU time (``/proc/stat``: user + nice + system; interrupt time is left out,
  it is not charged to any process) and the time the hypervisor took from it (steal);
- the CPU time of the server's process group (``/proc/<pid>/stat`` of every process in it:
  own + reaped children's time, so a child that exits mid-round is still counted);
- the harness's own (``os.times``, itself and its reaped children),

and keeps ``host_other_cpu_cores`` = (busy - server - harness) / wall seconds,
``host_steal_cores`` and ``harness_cpu_cores`` (the load generator's own use: one asyncio
process, so near a whole core the client, not the server, may set the pace) as round
metrics. Only for a server the harness launched (its process
group is known; replicas behind a router: the router's and every replica's groups together)
and where ``/proc`` exists; otherwise nothing is recorded, never a zero.

The same reads give the server's own CPU cost: ``server_cpu_ms_per_request`` (its whole
group) and, for a FlashRec server (its group leader is the server process, not a guard),
``server_main_cpu_ms_per_request`` and ``server_main_cpu_cores`` (one server, not replicas):
the HTTP process's share
(requests, tokenizers, answers; the engine's host work too where it runs in that process).
One process runs its Python under one GIL, so a main process near a whole core is the limit.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

# a measured window shorter than this is too coarse for CPU ticks (10 ms each): no note
MIN_WINDOW_S = 1.0


@dataclass(frozen=True)
class HostSample:
    """CPU seconds at one instant (monotonic ``t``)."""

    t: float
    busy_s: float  # every CPU: user + nice + system
    steal_s: float
    server_s: float  # the server's process group
    harness_s: float
    main_s: float | None = None  # the group leader's own time (FlashRec's server process)


def _tick() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100.0


def machine_cpu(proc: Path = Path("/proc")) -> tuple[float, float] | None:
    """(busy, steal) CPU seconds of the whole machine; None without ``/proc/stat``."""
    try:
        head = (proc / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not head or head[0] != "cpu" or len(head) < 5:
        return None
    try:
        v = [float(x) for x in head[1:]]
    except ValueError:
        return None
    tick = _tick()
    steal = v[7] if len(v) > 7 else 0.0
    return (v[0] + v[1] + v[2]) / tick, steal / tick


def _stat(text: str) -> tuple[int, float, float] | None:
    """(process group, own utime + stime, reaped children's cutime + cstime) in ticks of one
    ``/proc/<pid>/stat`` line. The command name (field 2) may hold spaces and parentheses:
    fields are read after its last ``)``."""
    _, sep, rest = text.rpartition(")")
    if not sep:
        return None
    f = rest.split()
    # f[0] = state (field 3), f[2] = pgrp (5), f[11..14] = utime, stime, cutime, cstime (14-17)
    if len(f) < 15:
        return None
    try:
        return int(f[2]), float(f[11]) + float(f[12]), float(f[13]) + float(f[14])
    except ValueError:
        return None


def parse_stat(text: str) -> tuple[int, float] | None:
    """(process group, utime + stime + cutime + cstime in ticks) of one ``/proc/<pid>/stat``
    line."""
    parsed = _stat(text)
    return None if parsed is None else (parsed[0], parsed[1] + parsed[2])


def _groups_and_lead(pgids: frozenset[int], lead_pid: int | None, proc: Path):
    """CPU seconds of every live process in the groups ``pgids`` (own and reaped children's),
    and of process ``lead_pid`` alone (own time; None when it is gone or not asked), in one
    pass over ``/proc``; None without ``/proc``."""
    try:
        entries = list(proc.iterdir())
    except OSError:
        return None
    ticks, lead = 0.0, None
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            parsed = _stat((entry / "stat").read_text())
        except OSError:  # gone between the listing and the read
            continue
        if parsed is not None and parsed[0] in pgids:
            ticks += parsed[1] + parsed[2]
            if lead_pid is not None and entry.name == str(lead_pid):
                lead = parsed[1] / _tick()
    return ticks / _tick(), lead


def group_cpu(pgid: int, proc: Path = Path("/proc")) -> float | None:
    """CPU seconds of every live process in group ``pgid`` (own and reaped children's);
    None without ``/proc``."""
    both = _groups_and_lead(frozenset((pgid,)), None, proc)
    return None if both is None else both[0]


def own_cpu() -> float:
    """CPU seconds of this process and its reaped children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def sample(
    pgid: int | list[int] | None, proc: Path = Path("/proc"), main: bool = False
) -> HostSample | None:
    """A :class:`HostSample`, or None where the server's group is unknown or there is no
    ``/proc`` (another OS). ``pgid`` may list several groups (replicas behind a router: their
    time is summed). ``main``: also the group leader's own time (one group whose leader is
    the server itself, as FlashRec's is; a guarded command's leader is the guard)."""
    groups = [pgid] if isinstance(pgid, int) else list(pgid or [])
    if not groups:
        return None
    machine = machine_cpu(proc)
    lead_pid = groups[0] if main and len(groups) == 1 else None
    both = _groups_and_lead(frozenset(groups), lead_pid, proc)
    if machine is None or both is None:
        return None
    server, lead = both
    return HostSample(time.monotonic(), machine[0], machine[1], server, own_cpu(), lead)


def server_cpu(
    before: HostSample | None, after: HostSample | None, requests: int
) -> dict[str, float]:
    """The round's CPU cost of the server itself: ``server_cpu_ms_per_request`` (its process
    group) and, where both samples have the leader's time, ``server_main_cpu_ms_per_request``
    and ``server_main_cpu_cores``; {} without both samples or without requests."""
    if before is None or after is None or after.t <= before.t or requests <= 0:
        return {}
    out = {"server_cpu_ms_per_request": max(0.0, after.server_s - before.server_s) * 1e3 / requests}
    if before.main_s is not None and after.main_s is not None:
        main = max(0.0, after.main_s - before.main_s)
        out["server_main_cpu_ms_per_request"] = main * 1e3 / requests
        out["server_main_cpu_cores"] = main / (after.t - before.t)
    return out


def other_cpu(before: HostSample | None, after: HostSample | None) -> dict[str, float]:
    """The round's ``host_other_cpu_cores`` / ``host_steal_cores`` / ``harness_cpu_cores`` ({}
    without both samples). Clamped at 0: ticks are counted per CPU and per process at slightly
    different instants."""
    if before is None or after is None or after.t <= before.t:
        return {}
    wall = after.t - before.t
    busy = after.busy_s - before.busy_s
    ours = (after.server_s - before.server_s) + (after.harness_s - before.harness_s)
    return {
        "host_other_cpu_cores": max(0.0, busy - ours) / wall,
        "host_steal_cores": max(0.0, after.steal_s - before.steal_s) / wall,
        "harness_cpu_cores": max(0.0, after.harness_s - before.harness_s) / wall,
        "host_window_s": wall,
    }


# how a busy-host note begins (harness.judge.runs reads it on either side of two runs)
BUSY_NOTE = "busy host during the measured rounds"
# the round metrics of other_cpu (host_window_s only weighs the rounds for the note)
METRICS = ("host_other_cpu_cores", "host_steal_cores", "harness_cpu_cores")
# the round metrics of server_cpu
SERVER_METRICS = (
    "server_cpu_ms_per_request",
    "server_main_cpu_ms_per_request",
    "server_main_cpu_cores",
)


def busy_host_note(rounds: list[dict[str, float]], cores: float = 0.5) -> str | None:
    """A cell note when other processes used >= ``cores`` cores over its measured rounds
    together (``other_cpu`` of each; CPU-seconds over wall seconds, so short rounds weigh
    little), or the hypervisor took as much (``stats.busy_host_cores``); None below that,
    without samples, over less than ``MIN_WINDOW_S``, or with ``cores`` 0 (off)."""
    have = [r for r in rounds if "host_window_s" in r]
    wall = sum(r["host_window_s"] for r in have)
    if not have or wall < MIN_WINDOW_S or cores <= 0:
        return None
    other = sum(r["host_other_cpu_cores"] * r["host_window_s"] for r in have) / wall
    steal = sum(r["host_steal_cores"] * r["host_window_s"] for r in have) / wall
    worst = max(r["host_other_cpu_cores"] for r in have)
    parts = []
    if other >= cores:
        parts.append(
            f"other processes used {other:.2f} CPU cores on average (up to {worst:.2f} in a "
            "round) outside the server and the harness"
        )
    if steal >= cores:
        parts.append(f"the hypervisor took {steal:.2f} cores (steal)")
    if not parts:
        return None
    return (
        f"{BUSY_NOTE}: "
        + "; ".join(parts)
        + ": its speed numbers may be lower than on a quiet machine"
    )
