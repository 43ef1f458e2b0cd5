"""A stand-in beam server with named catalogs, for the harness's catalog tests.

It holds catalogs as FlashRec does (``--sid-vocab-file NAME=PATH``, repeatable, the first the
default), picks one per request (chat body ``catalog``, ``/generate``
``sampling_params.catalog``), answers each beam with a SID of that catalog, refuses an unknown
name with FlashRec's 400 body, and appends every request body to ``--record`` (JSONL).
"""

from __future__ import annotations

import argparse
import json

from aiohttp import web

from flashrec.synth.tokenizer import format_sid


def load(specs: list[str]) -> dict[str, list[tuple[int, ...]]]:
    from flashrec.sid.catalog import load_catalog

    out = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        out[name] = sorted(tuple(int(c) for c in row) for row in load_catalog(path).codes.tolist())
    return out


def make_app(catalogs: dict[str, list[tuple[int, ...]]], record: str) -> web.Application:
    default = next(iter(catalogs))

    def answer(body: dict, name: str | None, n: int) -> tuple[list[str], web.Response | None]:
        with open(record, "a") as f:
            f.write(json.dumps(body) + "\n")
        name = name or default
        if name not in catalogs:
            msg = f"unknown catalog {name!r}; this server holds: {', '.join(catalogs)}"
            err = {"message": msg, "type": "invalid_request_error", "param": "catalog"}
            return [], web.json_response({"error": err}, status=400)
        sids = catalogs[name]
        h = len(json.dumps(body))
        return [format_sid(sids[(h + i * 7) % len(sids)]) for i in range(n)], None

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        texts, err = answer(body, body.get("catalog"), int(body.get("n") or 1))
        if err is not None:
            return err
        choices = [{"index": i, "message": {"content": t}} for i, t in enumerate(texts)]
        return web.json_response({"choices": choices, "usage": {"prompt_tokens": 8}})

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        sp = body.get("sampling_params") or {}
        texts, err = answer(body, sp.get("catalog"), int(sp.get("n") or 1))
        if err is not None:
            return err
        beams = [{"text": t} for t in texts]
        return web.json_response({"text": texts[0], "meta_info": {"beam_results": beams}})

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({})

    async def info(request: web.Request) -> web.Response:
        cats = [{"name": n, "default": n == default, "sids": len(s)} for n, s in catalogs.items()]
        return web.json_response({"catalogs": cats})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", ok)
    app.router.add_post("/flush_cache", ok)
    app.router.add_get("/get_server_info", info)
    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--sid-vocab-file", action="append", required=True)
    p.add_argument("--record", required=True)
    args = p.parse_args()
    web.run_app(make_app(load(args.sid_vocab_file), args.record), host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()


def serving(specs: list[str], record: str):
    """A context manager: this server in a process of its own on a free port; yields its URL,
    killed on exit."""
    import contextlib
    import os
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    from harness.servers.launch import free_port

    @contextlib.contextmanager
    def run():
        port = free_port()
        argv = [sys.executable, __file__, "--port", str(port), "--record", record]
        for spec in specs:
            argv += ["--sid-vocab-file", spec]
        repo = str(Path(__file__).resolve().parents[2])  # flashrec, however it is installed
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]),
        }
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True, env=env)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120  # a loaded 2-core machine starts Python slowly
        try:
            while True:
                try:
                    urllib.request.urlopen(url + "/health", timeout=10)
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("the catalog server did not start") from None
                    time.sleep(0.1)
            yield url
        finally:
            proc.kill()
            proc.wait()

    return run()
