"""The environment a run happened in: code version, machine, library versions, hashes."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parents[2])  # the checkout the harness runs from
PACKAGES = ("torch", "flashinfer-python", "triton", "transformers", "flashrec", "aiohttp", "numpy")


def _run(
    argv: list[str], cwd: str | None = None, env: dict | None = None, timeout: float = 15
) -> str | None:
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_info(cwd: str | None = None) -> dict[str, Any]:
    """Commit, dirty flag and branch of the checkout at ``cwd`` (None when not a git repo);
    for a dirty checkout also ``tree``, the id of the files as they are (``working_tree``)."""
    commit = _run(["git", "rev-parse", "HEAD"], cwd)
    if commit is None:
        return {"commit": None, "dirty": None, "branch": None, "tree": None}
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd)
    return {
        "commit": commit,
        "dirty": bool(status),
        "branch": _run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd),
        "tree": working_tree(cwd) if status else None,
    }


SOURCE_COMMIT_ENV = "FLASHREC_SOURCE_COMMIT"


def declared_commit() -> str | None:
    """The commit whose files this checkout holds, as declared by whoever laid them there
    (``FLASHREC_SOURCE_COMMIT``): a machine that receives a working tree over an older
    ``.git`` (a lent GPU machine) cannot name the commit itself, only the files' tree id. Recorded
    as declared, never checked against the files (its objects are not in that ``.git``)."""
    import os

    value = os.environ.get(SOURCE_COMMIT_ENV, "").strip()
    return value or None


def run_git() -> dict[str, Any]:
    """:func:`git_info` of the harness's checkout, plus ``declared`` (:func:`declared_commit`)."""
    return {**git_info(ROOT), "declared": declared_commit()}


@functools.lru_cache(maxsize=4)
def working_tree(cwd: str | None = None) -> str | None:
    """The git tree id of the checkout's files as they are now (tracked and untracked, not
    ignored), written through a temporary index: the checkout's own index is untouched. It
    equals ``git rev-parse <commit>^{tree}`` of any commit holding exactly these files,
    whatever this checkout's history, so a machine that lays a working tree over an older
    ``.git`` (its reports read "<old commit> (dirty)") still names the code it ran. Computed
    once per process."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, GIT_INDEX_FILE=os.path.join(tmp, "index"))
        if _run(["git", "add", "-A", "."], cwd, env, timeout=120) is None:
            return None
        return _run(["git", "write-tree"], cwd, env, timeout=60)


def gpu_info() -> dict[str, Any]:
    """GPU names, driver and CUDA versions from ``nvidia-smi`` (empty list when none)."""
    if not shutil.which("nvidia-smi"):
        return {"gpus": [], "driver": None}
    out = _run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    )
    gpus, driver = [], None
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            gpus.append({"name": parts[0], "memory": parts[2]})
            driver = parts[1]
    return {"gpus": gpus, "driver": driver}


def versions() -> dict[str, str | None]:
    """Installed versions of the packages that matter for performance (no imports)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def content_hash(obj: Any) -> str:
    """sha256 (first 16 hex digits) of an object's canonical JSON."""
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def environment(matrix: dict, matrix_path: str | None, model_hash: str | None) -> dict[str, Any]:
    """The report's ``environment`` section."""
    return {
        "git": run_git(),
        **gpu_info(),
        "versions": versions(),
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu_count": _cpu_count(),
        "host_probe": host_probe(),
        "python_executable": sys.executable,
        "matrix_path": matrix_path,
        "matrix_hash": content_hash(matrix),
        "model_hash": model_hash,
    }


@functools.lru_cache(maxsize=1)
def machine() -> dict[str, Any]:
    """This process's host, first GPU, driver, commit and torch (the fields a cell's
    ``measured`` stamp keeps)."""
    git, gpu, probe = run_git(), gpu_info(), host_probe()
    return {
        "host": platform.node(),
        "gpu": gpu["gpus"][0]["name"] if gpu["gpus"] else None,
        "driver": gpu["driver"],
        "git": git["commit"],
        "dirty": git["dirty"],
        "tree": git["tree"],
        "declared": git["declared"],
        "torch": versions().get("torch"),
        "cpu": probe["cpu_model"],
        "host_probe_ms": probe["json_256_beams_ms"],
    }


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


# a 256-beam chat-completion body, the shape of the answers the host phases build
_PROBE_BODY = {
    "id": "chatcmpl-probe",
    "object": "chat.completion",
    "choices": [
        {
            "index": i,
            "message": {
                "role": "assistant",
                "content": f"<|sid_begin|><s_a_{i}><s_b_{i % 97}><s_c_{i % 251}><|sid_end|>",
            },
            "finish_reason": "stop",
            "logprobs": None,
            "score": -1.0 - i / 3.0,
        }
        for i in range(256)
    ],
}


@functools.lru_cache(maxsize=1)
def host_probe() -> dict[str, Any]:
    """How fast this host runs single-threaded Python, measured once per process: the fastest
    of 15 samples of 10 JSON encodings of a 256-beam answer body (~40 ms in all). Runs take
    it at their start, before any server or baseline process runs beside it
    (:func:`take_host_probe`); the fastest sample is the one other work disturbed least.

    The served cells' host phases (tokenize, ipc, respond) move with the machine: two lent
    machines of the same kind can differ there by tens of percent with the same code. A
    report carries this figure (and each cell's ``measured`` stamp too), so that host phases
    of two runs can be compared knowing how their hosts compare."""
    import time

    samples = []
    for _ in range(15):
        t0 = time.perf_counter()
        for _ in range(10):
            json.dumps(_PROBE_BODY)
        samples.append((time.perf_counter() - t0) / 10 * 1e3)
    return {"cpu_model": _cpu_model(), "json_256_beams_ms": round(min(samples), 4)}


def take_host_probe() -> None:
    """Measure :func:`host_probe` now, while the host is quiet (a run's start): later calls
    (the cells' stamps, the report) reuse this figure."""
    host_probe()


def measured_stamp() -> dict[str, Any]:
    """Where and when a cell was measured: saved with the cell, so that a report that resumes
    it (``--resume``) can say which run, machine and commit its numbers come from."""
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return {"at": now, **machine()}


def _cpu_count() -> int | None:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count()
