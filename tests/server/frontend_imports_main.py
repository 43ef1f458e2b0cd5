"""``python tests/server/frontend_imports_main.py CKPT``: ``flashrec serve --engine-process
on`` (``app.run_server``, as the CLI runs it) in this interpreter, watched from a thread: once
``/health`` is ok it sends a few requests, prints as JSON the modules of ours this front-end
process imported to answer them (none, when ready means ready) and their latencies, then
stops the server with SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time

import requests

from flashrec.config import ServerConfig
from flashrec.server.app import run_server

CHAT = {"messages": [{"role": "user", "content": "hello"}], "n": 2, "max_tokens": 4}
GEN = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "n": 2}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def watch(url: str, out: dict) -> None:
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                if requests.get(url + "/health", timeout=10).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.05)
        before = set(sys.modules)
        took = []
        for path, body in (("/v1/chat/completions", CHAT), ("/generate", GEN)) * 2:
            t0 = time.perf_counter()
            requests.post(url + path, json=body, timeout=120).raise_for_status()
            took.append(round(time.perf_counter() - t0, 3))
        new = sorted(m for m in set(sys.modules) - before if m.startswith("flashrec"))
        out.update(new_modules=new, latency_s=took)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    port = free_port()
    config = ServerConfig(
        model_path=sys.argv[1], sid_vocab_file=os.path.join(sys.argv[1], "catalog.json"),
        host="127.0.0.1", port=port, device="cpu", warmup=False, gc_freeze=False,
        batch_slots=64, beam_width=4, engine_process="on",
    )  # fmt: skip
    out: dict = {}
    threading.Thread(target=watch, args=(f"http://127.0.0.1:{port}", out), daemon=True).start()
    code = run_server(config)
    print(json.dumps(out), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
