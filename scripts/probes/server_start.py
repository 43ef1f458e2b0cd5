"""How long a `flashrec serve` takes from launch to its first 200 on /health, and where the time
goes: each log line's time after launch. Starts the server on 127.0.0.1 with an ephemeral port
REPEAT times (each stopped before the next) and prints one JSON line per start, then the median.

    PYTHONPATH=. python scripts/probes/server_start.py --model-path DIR --repeat 4 \
        -- --device cpu --engine-process on
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.servers.launch import free_port  # noqa: E402


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def one_start(model: str, catalog: str | None, extra: list[str], timeout_s: float) -> dict:
    port = free_port()
    argv = [sys.executable, "-m", "flashrec", "serve", "--model-path", model]
    argv += ["--sid-vocab-file", catalog] if catalog else []
    argv += ["--host", "127.0.0.1", "--port", str(port), *extra]
    with tempfile.TemporaryFile("w+") as log:
        t0 = time.time()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            while not healthy(f"http://127.0.0.1:{port}/health"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server did not become healthy (exit {proc.poll()})")
                time.sleep(0.05)
            health_s = time.time() - t0
        finally:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            proc.wait(timeout=60)
        log.seek(0)
        phases = []
        for line in log:
            try:  # "2026-12-02 14:23:15,446 INFO name: message" (the server's log format)
                ts = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            except ValueError:
                continue
            at = ts.replace(tzinfo=dt.timezone.utc).timestamp() - t0
            phases.append([round(at, 2), line[24:].strip()[:120]])
    return {"health_s": round(health_s, 2), "log": phases}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--sid-vocab-file", help="default: MODEL/catalog.json when it exists")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=600)
    ap.add_argument("serve_args", nargs="*", help="after --: more `flashrec serve` flags")
    args = ap.parse_args()
    catalog = args.sid_vocab_file
    if catalog is None and (Path(args.model_path) / "catalog.json").exists():
        catalog = str(Path(args.model_path) / "catalog.json")
    times = []
    for _ in range(args.repeat):
        got = one_start(args.model_path, catalog, args.serve_args, args.timeout_s)
        times.append(got["health_s"])
        print(json.dumps(got), flush=True)
    print(json.dumps({"health_s_median": statistics.median(times), "health_s": times}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
