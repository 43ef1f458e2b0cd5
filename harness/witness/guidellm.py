"""GuideLLM as the witness load generator: how to run it, the scenario file of a cell,
one ``guidellm run`` and the numbers of the JSON report it writes (GuideLLM 0.8)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np


def guidellm_argv(explicit: str | None) -> list[str] | None:
    """How to run GuideLLM here, or None when it is not installed."""
    if explicit:
        return explicit.split()
    found = shutil.which("guidellm")
    if found:
        return [found]
    import importlib.util

    return [sys.executable, "-m", "guidellm"] if importlib.util.find_spec("guidellm") else None


def guidellm_scenario(
    url: str, data: Path, tokenizer: str, n: int, concurrency: int, requests: int,
    max_tokens: int, timeout_s: float, out_json: Path,
) -> dict:  # fmt: skip
    """A GuideLLM 0.8 scenario (``guidellm run --scenario FILE``) for the cell: chat
    completions, not streamed (one timing per request, as flashrec-bench measures it), HTTP/1.1
    like flashrec-bench's client, ``n`` and temperature 0 in every body, ``max_tokens`` sent as
    ``max_completion_tokens``, ``concurrency`` streams, exactly ``requests`` requests over the
    dataset in file order, no warm-up or cool-down exclusions."""
    return {
        "metadata": {"name": "flashrec-witness"},
        "spec": {
            "backend": {
                "kind": "openai_http",
                "target": url,
                "model": "default",
                "request_format": "/v1/chat/completions",
                "stream": False,
                "http2": False,
                "max_tokens": max_tokens,
                "timeout": timeout_s,
                "extras": {"body": {"n": n, "temperature": 0.0}},
            },
            "profile": {"kind": "concurrent", "streams": [concurrency]},
            "constraints": [{"kind": "max_requests", "count": requests}],
            "data": [{"kind": "json_file", "path": str(data)}],
            "tokenizer": {"kind": "huggingface_auto", "model": tokenizer},
            "outputs": [{"kind": "json", "path": str(out_json)}],
        },
    }


def read_guidellm(path: Path) -> dict[str, Any]:
    """Its own headline numbers from GuideLLM's JSON report (``requests_per_second`` and
    ``request_latency`` of the successful requests: completions per second over its
    measurement window; percentiles in s), plus the same numbers recomputed from its
    per-request start / end stamps by flashrec-bench's definitions (QPS = answers / (last end -
    first start); numpy percentiles) to separate a definition from a measurement."""
    bench = json.loads(path.read_text())["benchmarks"][0]
    m = bench["metrics"]
    lat = m["request_latency"]["successful"]
    ok = bench["requests"]["successful"]
    starts = [r["request_start_time"] for r in ok]
    ends = [r["request_end_time"] for r in ok]
    ms = np.array([(e - s) * 1000.0 for s, e in zip(starts, ends)])
    bodies = [json.loads(r["request_args"])["body"] for r in ok[:1]]
    return {
        "qps": m["requests_per_second"]["successful"]["mean"],
        "latency_p50_ms": lat["percentiles"]["p50"] * 1000.0,
        "latency_p99_ms": lat["percentiles"]["p99"] * 1000.0,
        "latency_mean_ms": lat["mean"] * 1000.0,
        "ok": len(ok),
        "errors": len(bench["requests"]["errored"]) + len(bench["requests"]["incomplete"]),
        "recomputed": {
            "qps": len(ok) / (max(ends) - min(starts)) if len(ok) > 1 else float("nan"),
            "latency_p50_ms": float(np.percentile(ms, 50)) if ms.size else float("nan"),
            "latency_p99_ms": float(np.percentile(ms, 99)) if ms.size else float("nan"),
        },
        "body": bodies[0] if bodies else {},
        "concurrency_mean": m["request_concurrency"]["successful"]["mean"],
        "output_tokens_mean": float(np.mean([r["output_tokens"] or 0 for r in ok])) if ok else 0,
    }


def run_guidellm(guidellm: list[str], scenario: Path, result: Path) -> dict[str, Any]:
    """``guidellm run`` on ``scenario`` offline (its log in ``guidellm.log`` beside it), then the
    numbers of the report it wrote to ``result``; RuntimeError when it failed."""
    folder = scenario.parent
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    argv = [*guidellm, "run", "--scenario", str(scenario), "--disable-console-interactive"]
    with open(folder / "guidellm.log", "wb") as log:
        code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0 or not result.is_file():
        raise RuntimeError(f"guidellm exited {code}; see {folder / 'guidellm.log'}")
    return read_guidellm(result)


def guidellm_version() -> str:
    """The installed GuideLLM's version, ``?`` when the package is not found."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("guidellm")
    except PackageNotFoundError:
        return "?"
