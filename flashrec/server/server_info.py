"""What ``GET /get_server_info`` answers. Its configuration is every flag with its effective
value, the auto / unset ones as they resolved at start-up (read off the engine where the
engine decided: device, dtype, attention backend, KV pool, graphs), and what was asked for
those that differ."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import platform
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

import flashrec
from flashrec.config import ServerConfig

if TYPE_CHECKING:
    from flashrec.server.handlers import ServerState


def _dtype_name(v: Any) -> str | None:
    """``torch.bfloat16`` -> ``bfloat16``, ``torch.float8_e4m3fn`` -> ``fp8_e4m3`` (the
    flags' spelling)."""
    if v is None:
        return None
    name = str(v).removeprefix("torch.")
    return "fp8_e4m3" if name.startswith("float8_e4m3") else name


def _eff(key: str) -> Callable[[Mapping[str, Any]], Any]:
    return lambda eng: (eng.get("effective") or {}).get(key)


def _on_off(v: Any) -> str | None:
    return None if v is None else ("on" if v else "off")


# flag -> how its effective value is read off ``Engine.server_info()``; None from the reader
# keeps the configuration's own resolution (an engine that does not say)
_FROM_ENGINE: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "device": lambda eng: str(eng["device"]).split(":")[0] if eng.get("device") else None,
    "dtype": lambda eng: _dtype_name(eng.get("dtype")),
    "quantization": lambda eng: None if "fp8" not in eng else ("fp8" if eng["fp8"] else "none"),
    "kv_cache_dtype": lambda eng: _dtype_name(eng.get("kv_cache_dtype")),
    "attention_backend": lambda eng: eng.get("attention_backend"),
    "decode_prompt_attention": lambda eng: eng.get("decode_prompt_attention"),
    "batch_slots": lambda eng: eng.get("batch_slots"),
    "kv_pool_tokens": lambda eng: eng.get("kv_pool_tokens"),
    "enable_step_graph": _eff("step_graph"),
    "overlap_results": _eff("overlap_results"),
    "prefill_graph_max_tokens": _eff("prefill_graph_max_tokens"),
    "piecewise_prefill_max_tokens": _eff("piecewise_prefill_max_tokens"),
    "sid": lambda eng: (eng.get("sid_layout") or {}).get("arg"),
}
# flag -> the configuration's own resolution (``resolved_*``), where the engine says nothing
_FROM_CONFIG: dict[str, Callable[[ServerConfig], Any]] = {
    "device": lambda c: c.resolved_device,
    "dtype": lambda c: c.resolved_dtype,
    "attention_backend": lambda c: c.resolved_attention_backend,
    "batch_slots": lambda c: c.resolved_batch_slots,
    "enable_step_graph": lambda c: c.resolved_enable_step_graph,
    "overlap_results": lambda c: c.resolved_overlap_results,
    "prefill_graph_max_tokens": lambda c: c.resolved_prefill_graph_max_tokens,
    "piecewise_prefill_max_tokens": lambda c: c.resolved_piecewise_prefill_max_tokens,
    "enable_prefix_cache": lambda c: c.resolved_enable_prefix_cache,
    "decode_max_splits": lambda c: c.resolved_decode_max_splits,
    "engine_process": lambda c: _on_off(c.resolved_engine_process),
    "event_loop": lambda c: c.resolved_event_loop,
    "packed_base": lambda c: c.packed_base or _recif_packed_base(),
}


def _recif_packed_base() -> int:
    """The base packed catalog keys are read in without ``--packed-base`` (RecIF's)."""
    from flashrec.sid.rows import RECIF_PACKED_BASE

    return RECIF_PACKED_BASE


def bound_port(request: web.Request) -> int | None:
    """The port the server listens on, read off the connection a request came in on."""
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    return sock[1] if isinstance(sock, tuple) and len(sock) >= 2 else None


def effective_config(
    config: ServerConfig,
    engine_info: Mapping[str, Any],
    served_model_name: str,
    port: int | None,
    event_loop: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(effective, requested)``: every ``ServerConfig`` field with the value the server runs
    with, and, for the fields where that differs from what was asked (an auto or unset flag,
    ``--port 0``), what was asked. ``engine_info`` is ``Engine.server_info()`` ({}: an engine
    that has none); ``port`` the bound port, ``event_loop`` the loop the server runs on."""
    asked = dataclasses.asdict(config)
    out = dict(asked)
    for name in (*_FROM_ENGINE, *_FROM_CONFIG):
        if name not in out:
            continue
        read = _FROM_ENGINE.get(name)
        value = read(engine_info) if read is not None else None
        if value is None and name in _FROM_CONFIG:
            value = _FROM_CONFIG[name](config)
        if value is not None:
            out[name] = value
    if "engine_process_pid" in engine_info:  # the engine's own answer, not the flag's rule
        out["engine_process"] = "on"
    elif engine_info:
        out["engine_process"] = "off"
    out["served_model_name"] = served_model_name
    out["event_loop"] = event_loop
    if port:
        out["port"] = port
    requested = {k: v for k, v in asked.items() if out[k] != v}
    return out, requested


async def server_info_body(st: ServerState, request: web.Request) -> dict[str, Any]:
    """The ``/get_server_info`` answer of the server whose state is ``st``, for the aiohttp
    ``request``."""
    engine = st.engine
    layout = engine.layout
    # an engine process answers the active catalog over the pipe: off the event loop
    engine_info = await asyncio.to_thread(engine.server_info)
    event_loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    config, requested = effective_config(
        st.config, engine_info, st.model_name, bound_port(request), event_loop
    )
    return {
        "served_model_name": st.model_name,
        "config": config,
        "config_requested": requested,
        "sid_layout": {
            "code_start": layout.code_start,
            "codebook_size": layout.codebook_size,
            "num_levels": layout.num_levels,
            "sid_begin": layout.sid_begin,
            "sid_end": layout.sid_end,
            "sid": layout.to_arg(),
        },
        "limits": dataclasses.asdict(st.limits),
        "engine": engine_info,
        # graph health as of now: captured sizes per kind, replays, eager forwards by reason
        "graphs": await graph_health(engine),
        "versions": {
            "flashrec": flashrec.__version__,
            "python": platform.python_version(),
            "torch": _torch_version(),
            "aiohttp": aiohttp.__version__,
        },
        "ready": st.backend.healthy,
        # the HTTP front-end process that answered (--api-server-count)
        "frontend": {
            "index": st.frontend_index,
            "count": st.config.api_server_count,
            "pid": os.getpid(),
        },
        # the loop this server actually runs on (an embedded server runs on its caller's)
        "event_loop": event_loop,
    }


async def graph_health(engine: Any) -> dict[str, Any] | None:
    """``/get_server_info``'s ``graphs``: the engine's graph counters (``GraphStats``) as of
    now, read from the ``/metrics`` snapshot (an engine process's too, over the pipe); None
    for an engine that keeps none."""
    from flashrec.engine.graph_stats import describe

    stats, _, _ = await asyncio.to_thread(engine.metrics_snapshot)
    snap = stats.get("graph")
    return describe(snap) if snap else None


def _torch_version() -> str:
    import torch

    return torch.__version__
