"""What a soak does, parsed from the command line: durations, actions, tolerances.

Every trend's tolerance is a pair: growth per 1,000 requests and growth over the whole fitted
run, in the resource's unit; ``inf`` makes a resource report-only (fitted, never failed).
The defaults (:data:`TOLERANCES`) and why each is what it is are in docs/harness/soak.md.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")

# resource kind -> (growth tolerated per 1,000 requests, growth tolerated over the fitted run):
# the verdict is "grows" only when the slope's whole 95% interval lies above the first and its
# lower bound, over the requests fitted, adds up to more than the second (a run too short to
# grow by that much cannot call a leak); math.inf: fitted and reported, never failed
TOLERANCES: dict[str, tuple[float, float]] = {
    "rss_mib": (1.0, 8.0),  # per process: 1 MiB per 1,000 requests is ~1 KiB per request
    "fds_other": (0.5, 2.0),  # per process, open client connections aside: a leak of 1
    "fds": (math.inf, 0.0),  # per request is 1,000; all fds and those connections: reported,
    "conns": (math.inf, 0.0),  # as the client's pool size is its own (harness/soak/procs.py)
    "threads": (0.5, 2.0),  # per process
    "processes": (0.1, 0.5),  # the server's process group: one new process is growth
    "slots_used": (0.5, 2.0),  # beam-row slots held when sampled
    "kv_tokens_used": (16.0, 64.0),  # KV pool tokens held by running requests
    "running_requests": (0.5, 2.0),
    "queue_length": (0.5, 2.0),  # the queue grows when the server falls behind the rate
    "http_inflight": (0.5, 2.0),
    "catalogs_live": (0.1, 0.5),  # catalogs kept alive after their last request
    "kv_tokens_cached": (math.inf, 0.0),  # the radix cache fills up to its bounds by design
    "prefix_cache_nodes": (math.inf, 0.0),
    "p50_ms": (math.inf, 0.0),  # latency: reported (a shared machine's noise); gate it with
    "p90_ms": (math.inf, 0.0),  # --tolerance p99_ms=5:20
    "p99_ms": (math.inf, 0.0),
}


def parse_duration(text: str) -> float:
    """``"90"`` / ``"90s"`` / ``"10m"`` / ``"1.5h"`` / ``"1d"`` -> seconds (> 0)."""
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"{text!r}: expected a duration such as 45s, 10m or 1h")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds <= 0:
        raise ValueError(f"{text!r}: a duration must be > 0")
    return seconds


def parse_tolerance(text: str) -> tuple[str, tuple[float, float]]:
    """``"rss_mib=2"`` -> ``("rss_mib", (2.0, default run allowance))``; ``"rss_mib=2:16"``
    sets both; ``inf`` turns a resource's gate off."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or key not in TOLERANCES:
        raise ValueError(
            f"{text!r}: expected NAME=PER_1000[:RUN], NAME one of {', '.join(TOLERANCES)}"
        )
    per, _, run = value.partition(":")
    try:
        tol = (float(per), float(run) if run else TOLERANCES[key][1])
    except ValueError:
        raise ValueError(f"{text!r}: {value!r} is not a number (or two, PER_1000:RUN)") from None
    if not (tol[0] >= 0 and tol[1] >= 0):
        raise ValueError(f"{text!r}: a tolerance must be >= 0 (or inf)")
    return key, tol


@dataclass(frozen=True)
class ActionSpec:
    """``--every PERIOD NAME[=ARG]``: run action NAME every ``period_s`` seconds (first at
    ``period_s``). ``args`` holds ARG split on ``,``: each firing takes the next one, round
    robin (``update_catalog=a.json,b.json`` alternates two catalogs)."""

    period_s: float
    name: str
    args: tuple[str, ...] = ()

    def arg(self, firing: int) -> str | None:
        """The argument of the ``firing``-th run (0-based), None for an action without one."""
        return self.args[firing % len(self.args)] if self.args else None

    @property
    def label(self) -> str:
        return self.name + (f"={','.join(self.args)}" if self.args else "")


def parse_action(period: str, action: str, known: dict[str, bool]) -> ActionSpec:
    """``("10m", "update_catalog=PATH")`` -> an :class:`ActionSpec`; ``known`` maps each
    action's name to whether it takes an argument."""
    name, sep, arg = action.partition("=")
    name = name.strip()
    if name not in known:
        raise ValueError(f"unknown action {name!r}; known: {', '.join(sorted(known))}")
    args = tuple(a for a in arg.split(",") if a) if sep else ()
    if known[name] and not args:
        raise ValueError(f"action {name!r} needs an argument: {name}=VALUE")
    if not known[name] and args:
        raise ValueError(f"action {name!r} takes no argument")
    return ActionSpec(parse_duration(period), name, args)


@dataclass(frozen=True)
class SoakConfig:
    """One soak: the load, the probe, the sampling, the actions and the gates."""

    duration_s: float
    rate: float  # requests per second, constant arrivals (open loop)
    interval_s: float = 60.0  # one sample (and one progress line) per interval
    warmup_s: float = 0.0  # samples before this are recorded but left out of every fit
    probe_every_s: float = 30.0
    beam_width: int = 8
    probe_beam_width: int = 8
    max_tokens: int = 4
    prompts: int = 64  # the load cycles over this many synthetic prompts
    prompt_tokens: int = 64
    seed: int = 0
    timeout_s: float = 60.0
    max_inflight: int = 256  # arrivals past this many in flight are errors (client backlog)
    probe_score_tol: float = 1e-4
    probe_key: str = "none"  # "catalog": one reference answer per catalog_hash
    actions: tuple[ActionSpec, ...] = ()
    tolerances: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(TOLERANCES))

    def __post_init__(self) -> None:
        for name in ("duration_s", "rate", "interval_s", "probe_every_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        for name in ("beam_width", "probe_beam_width", "max_tokens", "prompts", "prompt_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.warmup_s < 0 or self.warmup_s >= self.duration_s:
            raise ValueError("warmup must be >= 0 and shorter than the duration")
        if self.probe_key not in ("none", "catalog"):
            raise ValueError("probe_key must be 'none' or 'catalog'")
