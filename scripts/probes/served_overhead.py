"""Where the served path spends its time beyond the engine (CPU, concurrency 1).

Starts the production ``Server`` (same runner, handlers and ``EngineLoop``) in this process on
127.0.0.1 with an ephemeral port, sends the same chat prompts one at a time to
``/v1/chat/completions`` (harness-style: aiohttp client, body read, no parse in the timing),
and prints per request:

- ``e2e``     client send -> last response byte;
- ``engine``  ``EngineLoop.submit`` -> the request's future resolved (the engine thread's
              queue + ``Scheduler.step`` work); ``steps`` is the ``Scheduler.step`` time alone;
- ``overhead`` = e2e - engine (HTTP, validation, tokenisation, hand-offs, response + JSON).

Then a phase breakdown of the server-side non-engine work on one captured engine result, and
(``--profile``) a cProfile of the event-loop thread over the timed requests. The server is
always torn down.

    PYTHONPATH=. python scripts/probes/served_overhead.py                 # builds the tiny model
    PYTHONPATH=. python scripts/probes/served_overhead.py --model-path DIR --n 256 50 --profile
    PYTHONPATH=. python scripts/probes/served_overhead.py --raw-client   # the client's share

``--first-touch`` times the answer body where the handler builds it: its first build (what
``body_cpu`` holds), the same build again at once, and the first build after a build of an
older answer (the code path warm, this answer's data not): first against again is what the
moment costs, and the warmed build says whether the cold part is the code or the data. It
also reads which CPU the event loop and the engine thread ran on. ``--pin-loop`` /
``--pin-engine`` bind either thread to one CPU, for the same figures with no migration.
``--answer-alternate`` compares, on one server, bodies built by the engine thread when it is
idle (``FLASHREC_ANSWER_ON_ENGINE=idle``) with the handler's own, every other request.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import re
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp

from flashrec.config import ServerConfig
from flashrec.engine.loop import EngineLoop
from flashrec.engine.request import BeamResult, GenResult
from flashrec.server import protocol, responses
from flashrec.server.app import Server
from flashrec.synth import synth_prompts

REPEATS = 30


class Instrumented:
    """Wraps the loop's ``submit`` and the scheduler's ``step`` to time the engine's part."""

    def __init__(self, loop: EngineLoop) -> None:
        self.engine_s: dict[str, float] = {}
        self.steps_s: dict[str, float] = {}
        self.last: GenResult | None = None
        # the hand-off's parts (time.monotonic, the clock of GenResult.done_at): the result
        # ready on the host -> its future resolved -> the engine thread out of work
        self.done_at: dict[str, float] = {}
        self.resolved_at: dict[str, float] = {}
        self.idle_at: list[float] = []
        self.engine_cpus: list[int] = []  # the engine thread's CPU at each resolve
        self._active: set[str] = set()
        self._lock = threading.Lock()
        submit, step, has_work = loop.submit, loop.scheduler.step, loop.scheduler.has_work

        def timed_submit(req: Any) -> Any:
            t0 = time.perf_counter()
            with self._lock:
                self._active.add(req.rid)
                self.steps_s[req.rid] = 0.0
            fut = submit(req)

            def done(f: Any) -> None:  # on the engine thread
                self.engine_cpus.append(thread_cpu())
                self.engine_s[req.rid] = time.perf_counter() - t0
                self.resolved_at[req.rid] = time.monotonic()
                with self._lock:
                    self._active.discard(req.rid)
                if not f.cancelled() and f.exception() is None:
                    self.last = f.result()
                    if self.last.done_at is not None:
                        self.done_at[req.rid] = self.last.done_at

            fut.add_done_callback(done)
            return fut

        def timed_step() -> Any:
            t0 = time.perf_counter()
            try:
                return step()
            finally:
                dt = time.perf_counter() - t0
                with self._lock:
                    for rid in self._active:
                        self.steps_s[rid] += dt

        def timed_has_work() -> bool:
            busy = has_work()
            if not busy:
                self.idle_at.append(time.monotonic())
            return busy

        loop.submit = timed_submit  # type: ignore[method-assign]
        loop.scheduler.has_work = timed_has_work  # type: ignore[method-assign]
        loop.scheduler.step = timed_step  # type: ignore[method-assign]


def thread_cpu() -> int:
    """The CPU the calling thread last ran on (/proc; -1 where it cannot be read)."""
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return -1


class FirstTouch:
    """Wraps the chat body's encoder (``responses.chat_completion_json``, as the handler calls
    it) to time, per answer on the event loop: the first build, the same build again, and
    (from the second answer on) a build of the previous answer first, then this one's."""

    def __init__(self, warm_code: bool = False) -> None:
        self.first: list[float] = []
        self.first_cpu: list[float] = []
        self.again: list[float] = []
        self.warmed: list[float] = []
        self.loop_cpus: list[int] = []
        self.engine_cpus: list[int] = []
        self.warm_code = warm_code
        self._prev: GenResult | None = None
        self._encode = responses.chat_completion_json

    def install(self) -> None:
        responses.chat_completion_json = self._wrapped  # type: ignore[assignment]

    def restore(self) -> None:
        responses.chat_completion_json = self._encode  # type: ignore[assignment]

    def _wrapped(self, result: GenResult, model: str, created: int | None = None) -> str:
        encode = self._encode
        if self.warm_code:
            if self._prev is None:  # nothing older to build first: served as is, not counted
                self._prev = result
                return encode(result, model, created)
            encode(self._prev, model, created)  # the code path warm, this answer's data not
        self.loop_cpus.append(thread_cpu())
        c0, t0 = time.thread_time(), time.perf_counter()
        out = encode(result, model, created)
        t1, c1 = time.perf_counter(), time.thread_time()
        encode(result, model, created)
        t2 = time.perf_counter()
        (self.warmed if self.warm_code else self.first).append(t1 - t0)
        self.first_cpu.append(c1 - c0)
        self.again.append(t2 - t1)
        self._prev = result
        return out

    def report(self, skip: int) -> None:
        def cut(xs: list[Any]) -> list[Any]:
            return xs[skip:] if len(xs) > skip else xs

        print("  the body where the handler builds it (chat_completion_json, ms):")
        for name, xs in (("first build", self.first), ("after an older one", self.warmed),
                         ("its CPU time", self.first_cpu), ("again at once", self.again)):  # fmt: skip
            if xs:
                print(f"    {name:<18} {ms(cut(xs))}")
        loops, engines = cut(self.loop_cpus), cut(self.engine_cpus)
        if loops and min(loops) >= 0:
            moved = sum(a != b for a, b in zip(loops, loops[1:]))
            print(f"    event loop's CPU   {len(set(loops))} distinct, moved {moved} of "
                  f"{max(1, len(loops) - 1)} times")  # fmt: skip
        if engines and loops and min(engines) >= 0:
            same = sum(a == b for a, b in zip(loops, engines))
            print(f"    engine thread's    {len(set(engines))} distinct CPUs at the hand-off, "
                  f"the loop's own {same} of {min(len(loops), len(engines))} times")  # fmt: skip


def first_touch(url: str, bodies: list[dict], warmup: int, inst: Instrumented) -> None:
    """The same requests again (raw socket) with the body's builds timed in the handler: once
    as served, once with an older answer built first."""
    for warm in (False, True):
        touch = FirstTouch(warm)
        inst.engine_cpus.clear()
        touch.install()
        try:
            drive_raw(url, bodies, warmup)
        finally:
            touch.restore()
        touch.engine_cpus = list(inst.engine_cpus)
        print(f"  first touch, {'an older answer built first' if warm else 'as served'}:")
        touch.report(warmup)


def alternate(
    url: str, bodies: list[dict], warmup: int, before: Any, names: tuple[str, str]
) -> None:
    """The same requests again (raw socket), ``before(i)`` setting request ``i``'s side (odd:
    ``names[0]``, even: ``names[1]``): one server, interleaved, so the two sides are compared
    without a second start. Prints each Server-Timing phase's median per side."""
    phases: dict[str, list[float]] = {}
    rows = drive_raw(url, bodies, warmup, phases, before)
    start = warmup % 2  # phases hold requests warmup.. in order: the first of them is even
    e2e = [dt for _, dt, _ in rows]
    for name, xs in {"e2e": e2e, **phases}.items():
        odd = [x for j, x in enumerate(xs) if (j + start) % 2]
        even = [x for j, x in enumerate(xs) if not (j + start) % 2]
        if odd and even:
            print(f"    {name:<18} {names[0]} {statistics.median(odd) * 1e3:7.3f}  "
                  f"{names[1]} {statistics.median(even) * 1e3:7.3f}")  # fmt: skip


def pin_alternate(
    url: str,
    bodies: list[dict],
    warmup: int,
    srv: ServerThread,
    loop: EngineLoop,
    cpus: tuple[int, int],
) -> None:
    """``alternate``: the event loop and the engine thread bound to ``cpus`` (loop, engine)
    for every other request, free (the process's CPUs) for the rest."""
    free = os.sched_getaffinity(0)
    ids = (srv._thread.native_id or 0, loop._thread.native_id or 0)

    def before(i: int) -> None:
        for tid, cpu in zip(ids, cpus):
            os.sched_setaffinity(tid, {cpu} if i % 2 else free)

    print(f"  alternating, loop on CPU {cpus[0]} and engine on CPU {cpus[1]} / free (ms):")
    alternate(url, bodies, warmup, before, ("bound", "free"))
    for tid in ids:
        os.sched_setaffinity(tid, free)


def answer_alternate(url: str, bodies: list[dict], warmup: int) -> None:
    """``alternate``: the answer body built by the engine thread when idle
    (``FLASHREC_ANSWER_ON_ENGINE=idle``) for every other request, by the handler for the rest."""
    from flashrec.server import backend

    def before(i: int) -> None:
        backend.ANSWER_ON_ENGINE = "idle" if i % 2 else "off"

    was = backend.ANSWER_ON_ENGINE
    print("  alternating, body on the engine thread / in the handler (ms):")
    try:
        alternate(url, bodies, warmup, before, ("engine", "handler"))
    finally:
        backend.ANSWER_ON_ENGINE = was


def pin(native_id: int, cpu: int) -> None:
    """Bind one thread (its native id; 0: the caller) to ``cpu``."""
    os.sched_setaffinity(native_id, {cpu})


class ServerThread:
    """The production ``Server`` on a background thread, optionally under cProfile."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.profile: cProfile.Profile | None = None
        self.profiling = threading.Event()
        self._thread = threading.Thread(target=self._main, name="overhead-server", daemon=True)

    def _main(self) -> None:
        asyncio.run(self.server.run(install_signals=False))

    def start(self, timeout: float = 300.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.bound.is_set() and self.server.state.backend.healthy:
                return
            if not self._thread.is_alive():
                raise RuntimeError("the server exited during start-up")
            time.sleep(0.01)
        raise TimeoutError("the server did not become healthy")

    def set_profiling(self, on: bool) -> None:
        """Enable / disable cProfile on the event-loop thread (runs there)."""
        aloop = self.server._aloop
        assert aloop is not None
        done = threading.Event()

        def toggle() -> None:
            if on:
                self.profile = cProfile.Profile()
                self.profile.enable()
            elif self.profile is not None:
                self.profile.disable()
            done.set()

        aloop.call_soon_threadsafe(toggle)
        done.wait(10)

    def stop(self) -> None:
        self.server.request_stop()
        self._thread.join(timeout=60)


def chat_body(messages: list[dict], n: int, max_tokens: int) -> dict:
    """The harness's chat body (``harness/load/client.py:chat_body``)."""
    return {
        "model": "tiny",
        "messages": messages,
        "n": n,
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }


async def drive(url: str, bodies: list[dict], warmup: int) -> list[tuple[str, float, int]]:
    """Send ``bodies`` one at a time; ``(id, e2e seconds, response bytes)`` after warm-up."""
    out = []
    async with aiohttp.ClientSession() as session:
        for i, body in enumerate(bodies):
            t0 = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                raw = await resp.read()
            dt = time.perf_counter() - t0
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {raw[:300]!r}")
            rid = json.loads(raw)["id"]
            if i >= warmup:
                out.append((rid, dt, len(raw)))
    return out


def drive_raw(
    url: str,
    bodies: list[dict],
    warmup: int,
    phases: dict[str, list[float]] | None = None,
    before: Any = None,
) -> list[tuple[str, float, int]]:
    """``drive`` with the least client there is: one blocking keep-alive socket, each request's
    bytes built before its clock starts, the answer read by its Content-Length. Beside
    ``drive`` it shows the aiohttp client's own share of the e2e time. ``phases`` collects the
    answers' ``Server-Timing`` durations (seconds) by name, plus ``outside``: the e2e time
    past the server's phases. ``before(i)``, where given, runs before request ``i`` is sent
    (off the clock)."""
    host, port = url.split("//", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    f = sock.makefile("rb")
    out = []
    try:
        for i, body in enumerate(bodies):
            if before is not None:
                before(i)
            data = json.dumps(body).encode()
            req = (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
            ).encode() + data
            t0 = time.perf_counter()
            sock.sendall(req)
            status = f.readline()
            length, timing = None, {}
            while (line := f.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
                elif name.strip().lower() == "server-timing":
                    timing = parse_server_timing(value)
            if length is None:
                raise RuntimeError(f"no Content-Length in the answer ({status!r})")
            raw = f.read(length)
            dt = time.perf_counter() - t0
            if b" 200 " not in status:
                raise RuntimeError(f"{status!r}: {raw[:300]!r}")
            if i >= warmup:
                out.append((json.loads(raw)["id"], dt, len(raw)))
                if phases is not None and timing:
                    for name, sec in timing.items():
                        phases.setdefault(name, []).append(sec)
                    inside = sum(timing.get(k, 0.0) for k in SERVER_PHASES)
                    phases.setdefault("outside", []).append(dt - inside)
    finally:
        f.close()
        sock.close()
    return out


# the Server-Timing phases that add up to the server's share of a request (handoff is a part
# of respond: flashrec.server.generation.server_timing)
SERVER_PHASES = ("tokenize", "queue", "engine", "ipc", "respond")


def parse_server_timing(value: str) -> dict[str, float]:
    """``name;dur=MS, ...`` -> ``{name: seconds}``."""
    out = {}
    for part in value.split(","):
        name, _, rest = part.strip().partition(";")
        m = re.search(r"dur=([0-9.eE+-]+)", rest)
        if name and m:
            out[name] = float(m.group(1)) / 1000.0
    return out


def print_handoff(inst: Instrumented, rids: list[str]) -> None:
    """The engine thread's side of the hand-off: result on the host -> future resolved (the
    step's remaining work) -> the engine thread out of work (bookkeeping after the resolve,
    while the event loop may want the interpreter)."""
    ready, after = [], []
    for rid in rids:
        if rid not in inst.done_at or rid not in inst.resolved_at:
            continue
        resolved = inst.resolved_at[rid]
        ready.append(resolved - inst.done_at[rid])
        idle = next((t for t in inst.idle_at if t >= resolved), None)
        if idle is not None:
            after.append(idle - resolved)
    if ready:
        print(f"    {'ready->resolved':<18} {ms(ready)}")
    if after:
        print(f"    {'resolved->idle':<18} {ms(after)}")


def ms(xs: list[float]) -> str:
    xs = sorted(xs)
    p50 = xs[len(xs) // 2] * 1e3
    return f"mean {statistics.mean(xs) * 1e3:7.2f}  p50 {p50:7.2f}  min {xs[0] * 1e3:7.2f}"


def fresh(result: GenResult) -> GenResult:
    """``result`` with un-cached beam texts (so the breakdown pays for building them)."""
    beams = [
        BeamResult(b.token_ids, b.cum_logprob, b.sequence_score, b.finish_reason, b.text_source)
        for b in result.beams
    ]
    return GenResult(result.rid, beams, result.prompt_tokens, result.cached_tokens, result.error)


def breakdown(engine: Any, limits: protocol.Limits, body: dict, result: GenResult) -> None:
    """Time each server-side phase alone (median of repeats) on one captured engine result."""
    raw = json.dumps(body).encode()
    ids = engine.build_prompt(messages=body["messages"])
    payload = responses.chat_completion(result, "m")
    fast = getattr(responses, "chat_completion_json", None)  # the handlers' encoder, if any
    copies = iter([fresh(result) for _ in range(3 * REPEATS)])  # texts not built yet

    def as_before() -> bytes:  # web.json_response(chat_completion(...))
        return json.dumps(responses.chat_completion(next(copies), "m")).encode()

    phases: dict[str, Any] = {
        "json.loads(request)": lambda: json.loads(raw),
        "protocol.parse_chat": lambda: protocol.parse_chat(json.loads(raw), limits),
        "engine.build_prompt (template + tokenise)": lambda: engine.build_prompt(
            messages=body["messages"]
        ),
        "check_prompt": lambda: protocol.check_prompt(ids, limits, "messages"),
        "beam texts (first read)": lambda: [b.text for b in next(copies).beams],
        "chat_completion dict (texts cached)": lambda: responses.chat_completion(result, "m"),
        "json.dumps of that dict": lambda: json.dumps(payload),
        "body, dict + json.dumps (incl. texts)": as_before,
    }
    if fast is not None:
        phases["body, chat_completion_json (incl. texts)"] = lambda: fast(
            next(copies), "m"
        ).encode()
    print(f"\nserver-side phases, n={len(result.beams)} (median of {REPEATS} runs, ms):")
    for name, fn in phases.items():
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        print(f"  {name:45s} {statistics.median(times) * 1e3:8.3f}")


def build_tiny(root: Path) -> Path:
    from flashrec.synth import build_checkpoint

    return Path(build_checkpoint(root / "tiny", "tiny", seed=0, catalog_size=2000))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model-path", default="", help="checkpoint dir (default: build tiny)")
    ap.add_argument("--sid-vocab-file", default="", help="default: MODEL/catalog.json")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, nargs="+", default=[256, 50])
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile the event-loop thread")
    ap.add_argument(
        "--raw-client", action="store_true",
        help="also send the requests through a raw keep-alive socket (the client's share)",
    )  # fmt: skip
    ap.add_argument("--profile-lines", type=int, default=30)
    ap.add_argument(
        "--first-touch", action="store_true",
        help="time the body's first build in the handler against a second and a warmed one",
    )  # fmt: skip
    ap.add_argument("--pin-loop", type=int, default=None, help="bind the event loop to this CPU")
    ap.add_argument("--pin-engine", type=int, default=None, help="bind the engine thread")
    ap.add_argument(
        "--pin-alternate", action="store_true",
        help="bind the two threads (--pin-loop / --pin-engine, default the last two CPUs) for "
        "every other request of one more pass, free for the rest",
    )  # fmt: skip
    ap.add_argument(
        "--answer-alternate", action="store_true",
        help="one more pass, the body built by the engine thread when idle "
        "(FLASHREC_ANSWER_ON_ENGINE=idle) for every other request, by the handler for the rest",
    )  # fmt: skip
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="served-overhead-") as tmp:
        model = Path(args.model_path) if args.model_path else build_tiny(Path(tmp))
        catalog = args.sid_vocab_file or str(model / "catalog.json")
        config = ServerConfig(
            model_path=str(model),
            sid_vocab_file=catalog,
            host="127.0.0.1",
            port=0,
            device=args.device,
            warmup=True,
            batch_slots=max(256, *args.n),
            cuda_graph_max_bs=max(256, *args.n),  # graphs for these widths only: a shorter start
            beam_width=args.n[0],
            kv_pool_tokens=1 << 16,
            max_seq_len=8192,
            shutdown_timeout_s=10.0,
        )
        from flashrec.engine.engine import Engine

        engine = Engine(config)
        loop = EngineLoop(engine)
        inst = Instrumented(loop)
        srv = ServerThread(Server(loop, config))
        srv.start()
        try:
            if args.pin_engine is not None and not args.pin_alternate:
                pin(loop._thread.native_id or 0, args.pin_engine)
            if args.pin_loop is not None and not args.pin_alternate:
                srv.server._aloop.call_soon_threadsafe(pin, 0, args.pin_loop)
            run(srv, engine, inst, args, loop)
        finally:
            srv.stop()
    return 0


def run(
    srv: ServerThread,
    engine: Any,
    inst: Instrumented,
    args: argparse.Namespace,
    loop: EngineLoop,
) -> None:
    url = srv.server.url
    prompts = synth_prompts(
        args.requests + args.warmup, median_tokens=args.prompt_tokens, spread=0.0, seed=1
    )
    lens = [len(engine.build_prompt(messages=m)) for m in prompts]
    print(f"server {url}, device {args.device}, prompts ~{statistics.median(lens)} tokens")
    for n in args.n:
        bodies = [chat_body(m, n, args.max_tokens) for m in prompts]
        if args.profile:
            asyncio.run(drive(url, bodies[: args.warmup], args.warmup))
            srv.set_profiling(True)
            rows = asyncio.run(drive(url, bodies[args.warmup :], 0))
            srv.set_profiling(False)
        else:
            rows = asyncio.run(drive(url, bodies, args.warmup))
        if args.raw_client:  # the same requests again through a raw socket
            phases: dict[str, list[float]] = {}
            raw_rows = drive_raw(url, bodies, args.warmup, phases)
            raw_e2e = [dt for _, dt, _ in raw_rows]
            raw_eng = [inst.engine_s[rid] for rid, _, _ in raw_rows]
        e2e = [dt for _, dt, _ in rows]
        eng = [inst.engine_s[rid] for rid, _, _ in rows]
        steps = [inst.steps_s[rid] for rid, _, _ in rows]
        over = [a - b for a, b in zip(e2e, eng)]
        beams = len(inst.last.beams) if inst.last else 0
        print(f"\nn={n} ({beams} beams returned), {len(rows)} requests, concurrency 1")
        print(f"  e2e HTTP             {ms(e2e)}")
        print(f"  engine submit->done  {ms(eng)}")
        print(f"  engine steps         {ms(steps)}")
        print(f"  overhead e2e-engine  {ms(over)}")
        print(f"  response bytes       {statistics.median([b for _, _, b in rows]):.0f}")
        if args.raw_client:
            raw_over = [a - b for a, b in zip(raw_e2e, raw_eng)]
            print(f"  e2e raw socket       {ms(raw_e2e)}")
            print(f"  overhead raw-engine  {ms(raw_over)}")
            gap = statistics.median(over) - statistics.median(raw_over)
            print(f"  aiohttp client's share (median overheads' difference) {gap * 1e3:.2f} ms")
            print("  raw socket, Server-Timing phases (outside = e2e past the server's phases):")
            for name, xs in phases.items():
                print(f"    {name:<18} {ms(xs)}")
            print_handoff(inst, [rid for rid, _, _ in raw_rows])
        if args.first_touch:
            first_touch(url, bodies, args.warmup, inst)
        if args.pin_alternate:
            last = sorted(os.sched_getaffinity(0))[-2:]
            cpus = (
                args.pin_loop if args.pin_loop is not None else last[0],
                args.pin_engine if args.pin_engine is not None else last[-1],
            )
            pin_alternate(url, bodies, args.warmup, srv, loop, cpus)
        if args.answer_alternate:
            answer_alternate(url, bodies, args.warmup)
        if inst.last is not None:
            breakdown(engine, srv.server.state.limits, bodies[0], inst.last)
        if args.profile and srv.profile is not None:
            s = io.StringIO()
            stats = pstats.Stats(srv.profile, stream=s)
            stats.sort_stats("tottime").print_stats(args.profile_lines)
            print(f"\ncProfile of the event-loop thread, n={n} (by tottime):")
            print(s.getvalue())
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
