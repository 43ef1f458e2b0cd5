"""A fake beam server for harness tests: both protocols, deterministic beams, no model.

    python tests/harness/fake_server.py --port P [--crash-after N] [--hang-after N]
        [--fail-start] [--latency-ms X] [--slow-trace] [--gpu-trace] [--slow-first N] [--startup-s S]
        [--sid-vocab-file F] [--invalid-every K] [--dup-every K] [--spawn-child]
        [--ignore-sigterm] [--capacity C] [--crash-once-file F] [--tokenize-ms X]

Unknown flags (server args such as ``--beam-width``) are accepted and reported by
``/get_server_info``. Endpoints: /health, /v1/chat/completions, /generate, /flush_cache,
/start_profile, /stop_profile (writes a gzip chrome trace, slowly with --slow-trace),
/metrics, /get_server_info.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from aiohttp import web


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model-path")
    p.add_argument("--sid-vocab-file")
    p.add_argument("--latency-ms", type=float, default=2.0)
    p.add_argument("--per-beam-us", type=float, default=0.0)
    p.add_argument("--cpu-ms", type=float, default=0.0, help="CPU time burnt per request")
    p.add_argument(
        "--tokenize-ms",
        type=float,
        default=0.0,
        help="report this tokenize phase in a Server-Timing header (FlashRec's phases; no wait)",
    )
    p.add_argument("--crash-after", type=int, default=0)
    p.add_argument("--crash-once-file", help="crash only if this file is absent (then create it)")
    p.add_argument("--hang-after", type=int, default=-1)
    p.add_argument("--hang", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--fail-start", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--slow-trace", action=argparse.BooleanOptionalAction, default=False)
    # a torch.profiler-like trace: one kernel per profiled request and the Unix time its ts
    # count from (baseTimeNanoseconds), as a GPU server's files carry
    p.add_argument("--gpu-trace", action="store_true")
    p.add_argument("--trace-write-s", type=float, default=1.5)
    p.add_argument("--slow-first", type=int, default=0)
    p.add_argument("--slow-first-ms", type=float, default=300.0)
    p.add_argument("--startup-s", type=float, default=0.0)
    p.add_argument("--invalid-every", type=int, default=0)
    p.add_argument("--dup-every", type=int, default=0)
    p.add_argument("--spawn-child", action="store_true")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--capacity", type=int, default=0)
    return p.parse_known_args(argv)


class Fake:
    def __init__(self, args: argparse.Namespace, extra: list[str]) -> None:
        self.args, self.extra = args, extra
        self.started = time.monotonic()
        self.requests = 0
        self.flushes = 0
        self.seen: set[str] = set()
        self.profile: dict | None = None
        self.profiled: list[tuple[float, float, str]] = []
        self.writing = False
        self.catalog: list[tuple[int, ...]] = []
        if args.sid_vocab_file:
            data = json.loads(Path(args.sid_vocab_file).read_text())
            rows = data if isinstance(data, list) else [k.split(",") for k in data]
            self.catalog = sorted(tuple(int(c) for c in r) for r in rows)
        self.sem = asyncio.Semaphore(args.capacity) if args.capacity else None

    def timing(self) -> dict[str, str] | None:
        """FlashRec's Server-Timing header with ``--tokenize-ms`` as its tokenize phase."""
        if not self.args.tokenize_ms:
            return None
        engine = self.args.latency_ms
        return {
            "Server-Timing": f"tokenize;dur={self.args.tokenize_ms}, queue;dur=0, engine;dur={engine}"
        }

    def beams(self, key: str, n: int) -> list[str]:
        h = int(hashlib.sha256(key.encode()).hexdigest(), 16)
        out = []
        for i in range(n):
            if self.catalog:
                codes = self.catalog[(h + i * 7919) % len(self.catalog)]
            else:
                codes = ((h >> 3) % 64, (h >> 9) % 64 + i // 64, i % 64)
            text = "".join(f"<s_{chr(97 + lv)}_{c}>" for lv, c in enumerate(codes))
            if self.args.invalid_every and i % self.args.invalid_every == 1:
                text = "<s_a_1><s_c_2>"  # wrong levels
            if self.args.dup_every and i % self.args.dup_every == 1 and out:
                text = out[0].removesuffix("<|sid_end|>")
            out.append(text + "<|sid_end|>")
        return out

    async def work(self, key: str, n: int, prefix: str) -> tuple[list[str], int, int]:
        self.requests += 1
        count = self.requests
        a = self.args
        if a.crash_after and count > a.crash_after:
            once = Path(a.crash_once_file) if a.crash_once_file else None
            if once is None or not once.exists():
                if once is not None:
                    once.write_text("crashed")
                print(f"fake_server: crashing after {a.crash_after} requests", flush=True)
                os._exit(3)
        if a.hang or (a.hang_after >= 0 and count > a.hang_after):
            await asyncio.sleep(3600)
        delay = a.latency_ms / 1000 + n * a.per_beam_us / 1e6
        if count <= a.slow_first:
            delay += a.slow_first_ms / 1000
        if self.writing:
            delay += 0.05  # a trace being written slows everything down
        t0 = time.monotonic()
        if a.cpu_ms > 0:  # real work the host accounting can see (not a sleep)
            spent = time.process_time()
            while time.process_time() - spent < a.cpu_ms / 1000:
                pass
        if self.sem:
            async with self.sem:
                await asyncio.sleep(delay)
        else:
            await asyncio.sleep(delay)
        if self.profile is not None:
            self.profiled.append((t0, time.monotonic(), f"beam_search_n{n}"))
        prompt_tokens = max(1, len(key) // 4)
        cached = 0
        if key in self.seen:
            cached = prompt_tokens
        elif prefix in self.seen:
            cached = max(0, len(prefix) // 4)
        self.seen.update({key, prefix})
        return self.beams(key, n), prompt_tokens, cached


async def health(request: web.Request) -> web.Response:
    fake: Fake = request.app["fake"]
    a = fake.args
    if a.hang or (a.hang_after >= 0 and fake.requests > a.hang_after):
        await asyncio.sleep(3600)
    if time.monotonic() - fake.started < a.startup_s:
        return web.json_response({"status": "starting"}, status=503)
    return web.json_response({"status": "ok"})


async def chat(request: web.Request) -> web.Response:
    fake: Fake = request.app["fake"]
    body = await request.json()
    msgs = body["messages"]
    key = json.dumps(msgs, sort_keys=True)
    prefix = json.dumps(msgs[0], sort_keys=True) if len(msgs) > 1 else ""
    n = int(body.get("n", 1))
    texts, pt, cached = await fake.work(key, n, prefix)
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": t},
            "finish_reason": "stop",
            "sglext": {"sequence_score": -0.1 * (i + 1)},
        }
        for i, t in enumerate(texts)
    ]
    return web.json_response(
        headers=fake.timing(),
        data={
            "id": f"chatcmpl-{fake.requests}",
            "object": "chat.completion",
            "model": body.get("model", "fake"),
            "choices": choices,
            "usage": {
                "prompt_tokens": pt,
                "completion_tokens": 4 * n,
                "total_tokens": pt + 4 * n,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        },
    )


async def generate(request: web.Request) -> web.Response:
    fake: Fake = request.app["fake"]
    body = await request.json()
    text = body.get("text") or json.dumps(body.get("input_ids"))
    sp = body.get("sampling_params", {})
    # FlashRec's semantics: beam_width searched, the best n (default 1) returned; n alone: width
    width = int(sp.get("beam_width") or sp.get("n") or 1)
    n = int(sp.get("n") or 1) if sp.get("beam_width") is not None else width
    if n > width:
        return web.json_response({"error": "n cannot exceed beam_width"}, status=400)
    prefix = text.split("<|im_end|>")[0] if "<|im_end|>" in text else ""
    if not text.endswith("<|sid_begin|>"):
        return web.json_response({"error": "prompt must end with <|sid_begin|>"}, status=400)
    texts, pt, cached = await fake.work(text, n, prefix)
    results = [
        {
            "output_ids": [1, 2, 3, 4],
            "text": t,
            "meta_info": {
                "finish_reason": {"type": "stop", "matched": 4},
                "sequence_score": -0.1 * i,
            },
        }
        for i, t in enumerate(texts)
    ]
    request_meta = {"prompt_tokens": pt, "completion_tokens": 4 * n, "cached_tokens": cached}
    results[0]["meta_info"].update(request_meta)
    return web.json_response(
        headers=fake.timing(),
        data={
            "text": texts[0],
            "output_ids": results[0]["output_ids"],
            "meta_info": {**results[0]["meta_info"], "beam_results": results},
        },
    )


async def flush(request: web.Request) -> web.Response:
    fake: Fake = request.app["fake"]
    fake.seen.clear()
    fake.flushes += 1
    return web.json_response({"status": "ok"})


async def start_profile(request: web.Request) -> web.Response:
    fake: Fake = request.app["fake"]
    body = await request.json()
    fake.profile = body
    fake.profiled = []
    return web.json_response({"status": "ok"})


def trace_bytes(spans: list[tuple[float, float, str]], steps: int, gpu: bool = False) -> bytes:
    t0 = spans[0][0] if spans else 0.0
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": name,
            "pid": 1,
            "tid": 1,
            "ts": (a - t0) * 1e6,
            "dur": (b - a) * 1e6,
        }
        for a, b, name in spans
    ]
    events += [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": f"ProfilerStep#{i}",
            "pid": 1,
            "tid": 1,
            "ts": i * 10.0,
            "dur": 5.0,
        }
        for i in range(steps)
    ]
    events += [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "pad",
            "pid": 1,
            "tid": 2,
            "ts": i,
            "dur": 0.5,
            "args": {"n": "x" * 50},
        }
        for i in range(4000)
    ]
    doc: dict = {"traceEvents": events}
    if gpu:  # spans are time.monotonic(); the base is t0 on the Unix clock
        events += [{**e, "cat": "kernel", "tid": 7} for e in events[: len(spans)]]
        doc["baseTimeNanoseconds"] = int((t0 + time.time() - time.monotonic()) * 1e9)
    return gzip.compress(json.dumps(doc).encode(), compresslevel=1)


async def write_slowly(path: Path, data: bytes, seconds: float, fake: Fake) -> None:
    fake.writing = True
    chunks = 10
    step = len(data) // chunks + 1
    with open(path, "wb") as f:
        for i in range(chunks):
            f.write(data[i * step : (i + 1) * step])
            f.flush()
            await asyncio.sleep(seconds / chunks)
    fake.writing = False


async def stop_profile(request: web.Request) -> web.Response:
    fake: Fake = request.app["fake"]
    if fake.profile is None:
        return web.json_response({"error": "not profiling"}, status=400)
    prof, fake.profile = fake.profile, None
    out = Path(prof.get("output_dir") or ".")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{prof.get('profile_prefix', 'fake')}-{int(time.time())}.trace.json.gz"
    data = trace_bytes(fake.profiled, int(prof.get("num_steps", 5)), fake.args.gpu_trace)
    if fake.args.slow_trace:
        asyncio.get_running_loop().create_task(
            write_slowly(path, data, fake.args.trace_write_s, fake)
        )
    else:
        path.write_bytes(data)
    return web.json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    fake: Fake = request.app["fake"]
    return web.Response(
        text=(f"fake_requests_total {fake.requests}\nfake_flushes_total {fake.flushes}\n")
    )


async def server_info(request: web.Request) -> web.Response:
    fake: Fake = request.app["fake"]
    return web.json_response(
        {
            "version": "fake-0",
            "sid_layout": {"num_levels": 3},
            "extra_args": fake.extra,
            "pid": os.getpid(),
        }
    )


def main() -> None:
    args, extra = parse_args(sys.argv[1:])
    if args.fail_start:
        print("fake_server: impossible flag --fail-start", file=sys.stderr)
        sys.exit(2)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.spawn_child:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    app = web.Application()
    app["fake"] = Fake(args, extra)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/generate", generate)
    app.router.add_post("/flush_cache", flush)
    app.router.add_post("/start_profile", start_profile)
    app.router.add_post("/stop_profile", stop_profile)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/get_server_info", server_info)
    print(f"fake_server listening on {args.host}:{args.port} extra={extra}", flush=True)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
