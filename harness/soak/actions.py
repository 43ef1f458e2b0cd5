"""Actions a soak runs on the server while it loads it (``--every PERIOD NAME[=ARG]``).

One small function per action, registered by name in :data:`ACTIONS` with whether it takes an
argument: it posts to the server and returns ``(ok, detail, timings)``, ``timings`` the
answer's own phase times (its ``*_ms`` numbers: load, copy, hash, swap, release...) for the
report to place a slow request in them. A new action (another kind of swap) is one function
and one line here.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

import aiohttp

from harness.load.client import post_json

Outcome = tuple[bool, str, dict[str, float]]
Run = Callable[[aiohttp.ClientSession, str, "str | None"], Awaitable[Outcome]]
_NAMED = re.compile(r"^(\w+)=(.+)$")


def _outcome(status: int, body: object) -> Outcome:
    ok = status == 200 and not (isinstance(body, dict) and body.get("success") is False)
    timings = {}
    if isinstance(body, dict):
        timings = {
            k: float(v)
            for k, v in body.items()
            if k.endswith("_ms") and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
    return ok, f"HTTP {status}: {str(body)[:300]}", timings


async def flush_cache(session: aiohttp.ClientSession, base: str, arg: str | None):
    """``POST /flush_cache``: empty the radix prefix cache."""
    return _outcome(*await post_json(session, f"{base}/flush_cache"))


async def update_catalog(session: aiohttp.ClientSession, base: str, arg: str | None):
    """``POST /update_catalog {"path": ARG}`` (``NAME=PATH``: ``{"name", "path"}``, a named
    catalog of a server that holds several)."""
    m = _NAMED.match(arg or "")
    body = {"name": m.group(1), "path": m.group(2)} if m else {"path": arg}
    return _outcome(*await post_json(session, f"{base}/update_catalog", body, timeout_s=300))


async def rollback_catalog(session: aiohttp.ClientSession, base: str, arg: str | None):
    """``POST /rollback_catalog {"name": ARG}``: back to a named catalog's previous version."""
    body = {"name": arg}
    return _outcome(*await post_json(session, f"{base}/rollback_catalog", body, timeout_s=300))


async def update_weights(session: aiohttp.ClientSession, base: str, arg: str | None):
    """``POST /update_weights_from_disk {"model_path": ARG}``: new weights without a restart."""
    body = {"model_path": arg}
    url = f"{base}/update_weights_from_disk"
    return _outcome(*await post_json(session, url, body, timeout_s=600))


# the last phases of an action's answer, in the order they ran up to the answer (each a
# ``*_ms`` of it; ``swap_wait_ms`` holds the wait for the running requests and the swap): the
# report counts them back from the answer to say in which one a slow request started
PHASES: dict[str, tuple[str, ...]] = {
    "update_weights": ("copy_ms", "swap_wait_ms", "release_ms"),
    "update_catalog": ("load_ms", "build_ms", "swap_wait_ms", "release_ms"),
    "rollback_catalog": ("swap_wait_ms",),
}

# name -> (function, takes an argument)
ACTIONS: dict[str, tuple[Run, bool]] = {
    "flush_cache": (flush_cache, False),
    "update_catalog": (update_catalog, True),
    "rollback_catalog": (rollback_catalog, True),
    "update_weights": (update_weights, True),
}


def takes_argument() -> dict[str, bool]:
    """Each action's name -> whether it takes ``=ARG``."""
    return {name: needs for name, (_, needs) in ACTIONS.items()}
