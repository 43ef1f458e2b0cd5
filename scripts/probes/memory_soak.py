"""Server memory under a soak: starts `flashrec serve` on 127.0.0.1 (ephemeral port), sends
REQUESTS chat requests at CONCURRENCY, each with a unique prompt (a counter in the user
message) or the same one (``--repeat-prompt``), and prints the RSS of the server's process
tree after every ``--every`` requests, with the growth per 1,000 requests since the first
sample (the first ``--warm`` requests are not counted: allocator and import warm-up), and
the radix cache's node count (``flashrec_prefix_cache_nodes``; null on a server without it).

    PYTHONPATH=. python scripts/probes/memory_soak.py --model-path DIR --requests 6000 \
        -- --device cpu --engine-process on
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.servers.launch import free_port  # noqa: E402


def tree_rss_mb(pid: int) -> dict[int, float]:
    """RSS in MB of ``pid`` and each of its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            with open(f"/proc/{p}/status") as f:
                out[p] = next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024
        except (OSError, StopIteration):
            continue
    return out


def post(url: str, body: dict) -> int:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()
        return r.status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--sid-vocab-file", help="default: MODEL/catalog.json when it exists")
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--every", type=int, default=1000, help="requests between RSS samples")
    ap.add_argument("--warm", type=int, default=500, help="requests before the first sample")
    ap.add_argument("--n", type=int, default=4, help="beam width of each request")
    ap.add_argument("--repeat-prompt", action="store_true", help="the same prompt every time")
    ap.add_argument("serve_args", nargs="*", help="after --: more `flashrec serve` flags")
    args = ap.parse_args()
    catalog = args.sid_vocab_file
    if catalog is None and (Path(args.model_path) / "catalog.json").exists():
        catalog = str(Path(args.model_path) / "catalog.json")
    port = free_port()
    argv = [sys.executable, "-m", "flashrec", "serve", "--model-path", args.model_path]
    argv += ["--sid-vocab-file", catalog] if catalog else []
    argv += ["--host", "127.0.0.1", "--port", str(port), *args.serve_args]
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            while True:
                try:
                    with urllib.request.urlopen(base + "/health", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    sys.stderr.write(log.read()[-4000:])
                    raise RuntimeError(f"server did not become healthy (exit {proc.poll()})")
                time.sleep(0.1)

            def one(i: int) -> int:
                text = "a soak prompt" if args.repeat_prompt else f"soak prompt number {i}"
                body = {"messages": [{"role": "user", "content": text}], "n": args.n}
                return post(base + "/v1/chat/completions", body)

            first: tuple[int, float] | None = None
            done, t0 = 0, time.monotonic()
            with ThreadPoolExecutor(args.concurrency) as pool:
                while done < args.requests:
                    step = args.warm if first is None and args.warm else args.every
                    step = min(step, args.requests - done)
                    bad = [s for s in pool.map(one, range(done, done + step)) if s != 200]
                    if bad:
                        raise RuntimeError(f"{len(bad)} non-200 answers")
                    done += step
                    per_pid = tree_rss_mb(proc.pid)
                    rss = sum(per_pid.values())
                    nodes = None
                    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
                        for line in r.read().decode().splitlines():
                            if line.startswith("flashrec_prefix_cache_nodes "):
                                nodes = int(float(line.split()[1]))
                    if first is None:
                        first = (done, rss)
                    per_k = (rss - first[1]) / max(done - first[0], 1) * 1000
                    print(
                        json.dumps(
                            {
                                "requests": done,
                                "rss_mb": round(rss, 2),
                                "mb_per_1000_since_first": round(per_k, 3),
                                "prefix_cache_nodes": nodes,
                                "rss_mb_by_pid": {k: round(v, 1) for k, v in per_pid.items()},
                                "elapsed_s": round(time.monotonic() - t0, 1),
                            }
                        ),
                        flush=True,
                    )
        finally:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            proc.wait(timeout=90)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
