"""Where a finished request's hand-off to the event loop goes (Server-Timing's ``handoff``).

Runs the production ``EngineLoop`` over a real ``Engine`` in this process (CPU, or a GPU with
``--device cuda``), sends the same prompts one at a time from an asyncio coroutine, as a
handler does at concurrency 1, and splits each request's hand-off into:

- ``done -> resolved``: from the engine's ``done_at`` (its results on the host) until the
  engine thread resolves the request's future (the rest of the step, result objects, the
  counters' snapshot), in parts: ``-> results built`` (the beams' columns and result
  objects), ``-> step returned``, ``-> snapshot taken`` and ``-> resolved``;
- ``resolved -> hooks``: until the engine thread runs the step hooks (what follows the
  resolve in the engine thread);
- ``resolved -> resumed``: until the awaiting coroutine runs again (the event loop's wake-up
  and its wait for the interpreter lock);

and, for scale, the same coroutine woken by a bare thread that sleeps and sets a future.

    python scripts/probes/handoff_probe.py                     # builds the tiny model, CPU
    python scripts/probes/handoff_probe.py --model-path DIR --device cuda --beams 256
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures as cf
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path


def med(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


async def bare_wakes(count: int) -> float:
    """Median ms from a thread's ``set_result`` to the awaiting coroutine running again."""
    out = []
    for _ in range(count):
        fut: cf.Future[int] = cf.Future()
        t: dict[str, float] = {}

        def work(fut: cf.Future[int] = fut, t: dict[str, float] = t) -> None:
            time.sleep(0.005)
            t["set"] = time.monotonic()
            fut.set_result(1)

        th = threading.Thread(target=work)
        th.start()
        await asyncio.wrap_future(fut)
        out.append(time.monotonic() - t["set"])
        th.join()
    return med(out)


def time_parts(loop) -> dict[str, float]:
    """Marks (``time.monotonic``) of the engine thread's last results built, step returned and
    snapshot taken, kept up to date by wrappers around those three calls."""
    marks: dict[str, float] = {}
    sched = loop.scheduler
    finish, step, snapshot = sched.results.finish, sched.step, loop._take_snapshot

    def timed_finish(pending):
        out = finish(pending)
        marks["built"] = time.monotonic()
        return out

    def timed_step():
        out = step()
        marks["stepped"] = time.monotonic()
        return out

    def timed_snapshot():
        snapshot()
        marks["snapshot"] = time.monotonic()

    sched.results.finish = timed_finish
    sched.step = timed_step
    loop._take_snapshot = timed_snapshot
    return marks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model-path", default="", help="checkpoint dir (default: build tiny)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=1000, help="prompt length")
    ap.add_argument("--beams", type=int, default=256, help="beam width n")
    ap.add_argument("--requests", type=int, default=40, help="timed requests (after 5 warm)")
    ap.add_argument("--switch-interval-ms", type=float, default=0.2, help="as the server sets")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from flashrec.config import ServerConfig
    from flashrec.engine.engine import Engine
    from flashrec.engine.loop import EngineLoop
    from flashrec.engine.request import GenRequest
    from flashrec.prompt import encode_text
    from flashrec.synth import build_checkpoint, synth_prompts

    sys.setswitchinterval(args.switch_interval_ms / 1e3)
    with tempfile.TemporaryDirectory(prefix="handoff-") as tmp:
        model = args.model_path or str(
            build_checkpoint(Path(tmp) / "tiny", "tiny", catalog_size=2000)
        )
        config = ServerConfig(
            model_path=model,
            sid_vocab_file=str(Path(model) / "catalog.json"),
            device=args.device,
            warmup=False,
            beam_width=args.beams,
            batch_slots=max(512, args.beams),
            cuda_graph_max_bs=max(512, args.beams),  # the served p=1,000 cell's graphs
            max_seq_len=args.tokens + 512,
        )
        tok = AutoTokenizer.from_pretrained(model)
        n = args.requests + 5
        texts = [
            tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True, enable_thinking=False)
            for m in synth_prompts(n, median_tokens=args.tokens, spread=0.0, seed=1)
        ]  # fmt: skip
        ids = [encode_text(tok, t) for t in texts]
        loop = EngineLoop(Engine(config))
        marks = time_parts(loop)
        hooks: list[float] = []
        loop.add_step_hook(lambda _steps: hooks.append(time.monotonic()))
        loop.start()

        parts: list[list[float]] = []  # per request: done, built, stepped, snapshot, resolved

        async def run() -> tuple[list[tuple[float, float, float]], float]:
            rows = []
            for i, p in enumerate(ids):
                fut = loop.submit(GenRequest(f"h{i}", p, args.beams, 4, 0.0, None))
                mark: dict[str, float] = {}
                fut.add_done_callback(lambda _f, m=mark: m.setdefault("t", time.monotonic()))
                res = await asyncio.wrap_future(fut)
                back = time.monotonic()
                after = [h for h in hooks if h >= mark["t"]]
                if i >= 5 and res.done_at is not None and after:
                    rows.append((mark["t"] - res.done_at, after[0] - mark["t"], back - mark["t"]))
                    stamps = [marks[k] for k in ("built", "stepped", "snapshot")]
                    parts.append([res.done_at, *stamps, mark["t"]])
                await asyncio.sleep(0.002)
            return rows, await bare_wakes(50)

        try:
            rows, bare = asyncio.run(run())
        finally:
            loop.stop()
    print(f"{len(rows)} requests, n={args.beams}, ~{len(ids[0])} prompt tokens, {args.device}")
    print(f"done -> resolved      {med([r[0] for r in rows]):.3f} ms (median)")
    names = ("-> results built", "-> step returned", "-> snapshot taken", "-> resolved")
    for k, name in enumerate(names):
        print(f"  {name:<20}{med([p[k + 1] - p[k] for p in parts]):.3f} ms")
    print(f"resolved -> hooks     {med([r[1] for r in rows]):.3f} ms")
    print(f"resolved -> resumed   {med([r[2] for r in rows]):.3f} ms")
    print(f"bare thread wake-up   {bare:.3f} ms (a sleeping thread's set_result -> resumed)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
