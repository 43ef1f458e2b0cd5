"""The matrix of ``flashrec-bench quick`` (:mod:`harness.cli.quick`): one benchmark from flags.

:func:`build_matrix` turns the flags (beam widths x concurrencies against a running server at
``--url``, or a FlashRec server launched on ``--model-path``) into the matrix they describe, as
plain data; :func:`size_for_cpu` shrinks the cell for a CPU server. The CLI writes it as
``OUT/matrix.yaml`` and runs it like any other matrix.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

# the cell on a CPU server, for each of these flags the command line leaves to its default:
# the defaults are a GPU's cell (2,465-token prompts, 64 requests x 3 rounds + 8 warm-up),
# which takes minutes per cell on CPU for a few QPS
CPU_CELL = {"prompt_tokens": 256, "requests": 32, "warmup": 4}


def _server_info(url: str) -> dict:
    import asyncio

    import aiohttp

    from harness.servers.launch import fetch_info

    async def get() -> dict:
        async with aiohttp.ClientSession() as session:
            return await fetch_info(session, url.rstrip("/"))

    return asyncio.run(get())


def server_device(args: argparse.Namespace) -> tuple[str | None, str]:
    """The device the measured server runs on and how that is known; None where unknown (a
    server that does not say, or does not answer)."""
    if args.url:
        info = _server_info(args.url)
        engine, config = info.get("engine"), info.get("config")
        device = (engine.get("device") if isinstance(engine, dict) else None) or (
            config.get("device") if isinstance(config, dict) else None
        )
        if not device:
            return None, ""
        return str(device), f"its /get_server_info says device {device}"
    device = args.device or dict(args.server_arg).get("device")
    if device:
        return str(device), f"--device {device}"
    import torch

    if torch.cuda.is_available():
        return "cuda", "CUDA is available"
    return "cpu", "no CUDA device here, so the launched server takes the CPU"


def size_for_cpu(args: argparse.Namespace, given: set[str]) -> str | None:
    """On a CPU server, each :data:`CPU_CELL` flag the command line leaves unset (not in
    ``given``, the flags it sets itself) takes its CPU value (``args`` changed in place); the
    note that says so and why, None when nothing changed."""
    device, how = server_device(args)
    if device is None or not device.startswith("cpu"):
        return None
    changed = {k: v for k, v in CPU_CELL.items() if k not in given}
    if not changed:
        return None
    for key, value in changed.items():
        setattr(args, key, value)
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in changed.items())
    return (
        f"the server runs on CPU ({how}): a CPU-sized cell, {flags}; the defaults (2465-token "
        "prompts, 64 requests per round, 8 warm-up) are a GPU's cell and take minutes per "
        "cell on CPU. Give these flags to choose other values."
    )


def build_matrix(args: argparse.Namespace, argv: list[str] | None = None) -> dict:
    """The matrix the flags describe (plain data, as YAML would give it); ``argv`` goes into
    its description."""
    if args.url:
        engine: dict[str, Any] = {
            "name": "server", "kind": "external", "url": args.url, "protocol": args.protocol
        }  # fmt: skip
        if args.server_arg or args.device:
            raise ValueError("--server-arg and --device need --model-path (a launched server)")
    else:
        engine = {"name": "flashrec", "kind": "flashrec", "protocol": args.protocol}
        if args.device:
            engine["device"] = args.device
        if args.server_arg:
            engine["args"] = dict(args.server_arg)
    m: dict[str, Any] = {
        "name": args.name,
        "description": " ".join(["flashrec-bench quick", *(argv or [])]),
        "engine": engine,
    }
    model = args.model_path or args.tokenizer
    if model:
        m["model"] = {"path": str(model)}
    catalog = args.catalog
    if catalog is None and args.model_path and (Path(args.model_path) / "catalog.json").is_file():
        catalog = str(Path(args.model_path) / "catalog.json")
    if catalog:
        m["catalog"] = {"path": str(catalog)}
    m["workload"] = {
        "kind": "synthetic",
        "requests": args.requests,
        "warmup_requests": args.warmup,
        "median_tokens": args.prompt_tokens,
        "spread": 0.05,
        "system_prompt_tokens": 0,
    }
    m["axes"] = {"beam_width": args.beam_width, "concurrency": args.concurrency}
    m["load"] = {
        "mode": "closed",
        "rounds": args.rounds,
        "radix": args.radix,
        "temperature": 0.0,
        "max_tokens": args.max_tokens,
        "request_timeout_s": args.timeout_s,
    }
    m["gates"] = [
        {"name": "no-invalid-sids", "metric": "invalid_rate", "op": "==", "value": 0},
        {"name": "no-errors", "metric": "error_rate", "op": "==", "value": 0},
    ]
    return m
