"""The HF transformers baseline of a cell: ``generate(num_beams=n)`` with the same catalog
constraint (:class:`harness.servers.hf_reference.HFReference`), timed on the cell's first K measured
prompts, one request at a time, in a separate process started after the cell's server stopped
(its GPU memory never meets the server's).

Parent side: :func:`plan_baseline` (which cells, how many requests) and :func:`run_baseline`
(memory guard, subprocess, result). Child side: ``python -m harness.baseline.hf IN.json
OUT.json`` (:func:`main`). A failure (OOM, exception, crash, timeout) is recorded with its
error text and never stops the matrix.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.load.client import Record
from harness.metrics.flops import GIB, kv_bytes, kv_guard, load_config
from harness.servers.launch import _LIVE, kill_group
from harness.spec.cells import Cell, evaluate, matches
from harness.spec.matrix import HFBaselineSpec

ELEM_BYTES = {"bf16": 2, "bfloat16": 2, "float16": 2, "fp16": 2, "float32": 4}


def applies(spec: HFBaselineSpec | None, cell: Cell) -> bool:
    """Whether the cell gets an HF baseline."""
    if spec is None or not spec.enabled:
        return False
    if spec.cells is None:
        return True
    filters = [spec.cells] if isinstance(spec.cells, str) else spec.cells
    return any(matches(cell.id, cell.params, f) for f in filters)


def requests_for(spec: HFBaselineSpec, cell: Cell, max_tokens: int) -> int:
    """K: ``requests`` as a number, or evaluated over the cell's parameters."""
    if isinstance(spec.requests, int):
        return spec.requests
    c = cell.client
    names = {
        "beam_width": c.beam_width,
        "concurrency": c.concurrency,
        "prompt_tokens": c.median_tokens,
        "max_tokens": max_tokens,
        "requests": c.requests,
        **cell.params,
    }
    return max(1, int(evaluate(spec.requests, names)))


def _reported_prompt_tokens(records: list[Record], indices: set[int]) -> int | None:
    """The longest server-reported prompt among the baseline's prompts (None if unreported)."""
    lens = [
        r.prompt_tokens
        for r in records
        if r.phase == "measure" and r.prompt in indices and r.prompt_tokens is not None
    ]
    return max(lens) if lens else None


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_baseline(
    spec: HFBaselineSpec,
    cell: Cell,
    prompts: list,
    records: list[Record],
    model_path: str | None,
    catalog: str | None,
    max_tokens: int,
    work_dir: Path,
) -> dict[str, Any]:
    """Time HF beam search on ``prompts`` (the cell's first K measured ones) in a subprocess.

    Returns ``{status: ok|skipped|failed, ...}``: ``hf_ms_per_request``, ``hf_qps``,
    ``hf_ms_values``, ``hf_requests`` when ok; ``hf_skipped`` (the memory guard's reason) or
    ``hf_error`` otherwise.
    """
    n = cell.client.beam_width
    elem = ELEM_BYTES[spec.dtype]
    out: dict[str, Any] = {
        "status": "failed",
        "engine": "transformers generate(num_beams=n)",
        "beam_width": n,
        "hf_requests": len(prompts),
        "dtype": spec.dtype,
        "device": spec.device or cell.engine.device,
        "max_kv_gib": spec.max_kv_gib,
    }
    cfg = load_config(model_path)
    if cfg is None:
        return {**out, "hf_error": "no model checkpoint (config.json) to load in transformers"}
    reported = _reported_prompt_tokens(records, {p.index for p in prompts})
    if reported is not None:
        gib, reason = kv_guard(cfg, n, reported, elem, spec.max_kv_gib)
        out.update(kv_gib_estimate=float(f"{gib:.4g}"), prompt_tokens_max=reported)
        if reason:
            return {**out, "status": "skipped", "hf_skipped": reason}
    work_dir.mkdir(parents=True, exist_ok=True)
    req, res, log = work_dir / "input.json", work_dir / "result.json", work_dir / "hf.log"
    res.unlink(missing_ok=True)
    job = {
        "model_path": model_path,
        "catalog": catalog,
        "messages": [p.messages for p in prompts],
        "n": n,
        "max_tokens": max_tokens,
        "dtype": spec.dtype,
        "device": spec.device or cell.engine.device,
        "warmup": spec.warmup,
        "max_kv_gib": spec.max_kv_gib,
    }
    req.write_text(json.dumps(job))
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "harness.baseline.hf", str(req), str(res)]
    started = time.monotonic()
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            argv,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        _LIVE.add(proc.pid)
        try:
            code = proc.wait(timeout=spec.timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            kill_group(proc.pid, signal.SIGKILL)
            proc.wait()
            _LIVE.discard(proc.pid)
    out.update(duration_s=round(time.monotonic() - started, 2), log=str(log))
    if code is None:
        return {**out, "hf_error": f"timed out after {spec.timeout_s:g} s\n{_tail(log)}"}
    if not res.is_file():
        return {**out, "hf_error": f"exited with code {code} without a result\n{_tail(log)}"}
    result = json.loads(res.read_text())
    out.update(result)
    return out


# --------------------------------------------------------------------------- child process

_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "float16": "float16", "fp16": "float16"}


def _measure(job: dict) -> dict[str, Any]:
    import torch

    from harness.servers.hf_reference import HFReference

    device = job.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, _DTYPES.get(job["dtype"], "float32"))
    started = time.perf_counter()
    # HF generate as HF users run it: the speed being measured, whatever the dtype
    ref = HFReference(
        job["model_path"], job.get("catalog"), device=device, dtype=dtype, search="generate"
    )
    load_s = time.perf_counter() - started
    ids = [ref.build_prompt(messages=m) for m in job["messages"]]
    n, elem = job["n"], ELEM_BYTES[job["dtype"]]
    cfg = load_config(job["model_path"])
    longest = max(len(p) for p in ids)
    gib, reason = kv_guard(cfg, n, longest, elem, job.get("max_kv_gib"))
    info: dict[str, Any] = {
        "device": device,
        "prompt_tokens": [len(p) for p in ids],
        "prompt_tokens_max": longest,
        "kv_gib_estimate": float(f"{kv_bytes(cfg, n, longest, elem) / GIB:.4g}"),
        "load_s": round(load_s, 2),
        "torch": torch.__version__,
    }
    if reason:
        return {**info, "status": "skipped", "hf_skipped": reason}
    cuda = device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for _ in range(job.get("warmup", 1)):
        ref.generate(ids[0], n, job["max_tokens"])
    sync()
    times = []
    beams = []
    for p in ids:
        t = time.perf_counter()
        got = ref.generate(p, n, job["max_tokens"])
        sync()
        times.append(time.perf_counter() - t)
        beams.append(len(got))
    ms = [1000.0 * t for t in times]
    mean = sum(ms) / len(ms)
    if cuda:
        info["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 2)
    return {
        **info,
        "status": "ok",
        "hf_ms_values": ms,
        "hf_ms_per_request": mean,
        "hf_qps": 1000.0 / mean,
        "hf_beams": beams,
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.baseline.hf IN.json OUT.json``: always writes OUT unless killed."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m harness.baseline.hf IN.json OUT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(args[0]).read_text())
    try:
        result = _measure(job)
    except BaseException as exc:  # noqa: BLE001 - OOM and friends are results, not crashes
        import traceback

        traceback.print_exc()
        text = f"{type(exc).__name__}: {exc}"
        result = {"status": "failed", "hf_error": text[:2000]}
    Path(args[1]).write_text(json.dumps(result))
    return 0 if result["status"] != "failed" else 1


if __name__ == "__main__":
    sys.exit(main())
