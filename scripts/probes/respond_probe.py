"""Time the JSON bodies of answers that retire together, side by side in one process: built
one after another on an event loop (``--respond-workers 0``) against a ``RespondPool`` of
``--workers`` processes (``--respond-workers N``).

    python scripts/probes/respond_probe.py [--answers 8] [--beams 512] [--workers 2 4] [--repeats 20]

Each answer has ``--beams`` beams of 5 SID tokens with lazily made text, as the engine
returns them. Prints one JSON line per pool size: the mean ms until every body of a burst is
built, on the loop and through the pool, and their ratio. Host CPU work only: no model, no GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time

from flashrec.engine.request import BeamResult, GenResult, SidText
from flashrec.server import responses
from flashrec.server.respond_pool import RespondPool


class _Tok:
    def convert_ids_to_tokens(self, ids):
        return [f"<s_{'abc'[i % 3]}_{i}>" for i in ids]


class _Layout:
    sid_range = (1000, 1000 + 3 * 8192 + 2)


def _answers(text: SidText, answers: int, beams: int, seed: int) -> list[GenResult]:
    rng = random.Random(seed)
    lo, hi = _Layout.sid_range
    out = []
    for a in range(answers):
        bs = [
            BeamResult(
                [lo, *(rng.randrange(lo + 1, hi - 1) for _ in range(3)), hi - 1],
                -rng.random() * 10,
                -rng.random() * 3,
                "stop",
                text,
            )
            for _ in range(beams)
        ]
        out.append(GenResult(f"chatcmpl-{a}", bs, 2465, 0))
    return out


async def _burst_loop(results: list[GenResult]) -> None:
    for r in results:
        responses.chat_completion_json(r, "m", 1)


async def _burst_pool(pool: RespondPool, results: list[GenResult]) -> None:
    await asyncio.gather(*(pool.chat_json(r, "m", 1) for r in results))


def _timed(make, run, repeats: int) -> float:
    total = 0.0
    for i in range(repeats):
        results = make(i)  # fresh results: lazy text not yet made
        t0 = time.perf_counter()
        asyncio.run(run(results))
        total += time.perf_counter() - t0
    return total * 1000.0 / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--answers", type=int, default=8)
    ap.add_argument("--beams", type=int, default=512)
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    text = SidText(_Tok(), _Layout())
    make = lambda i: _answers(text, args.answers, args.beams, i)  # noqa: E731
    for workers in args.workers:
        pool = RespondPool(workers, text.table, None)
        try:
            pool.start()
            _timed(make, lambda rs, p=pool: _burst_pool(p, rs), 2)  # warm-up
            loop_ms = _timed(make, _burst_loop, args.repeats)
            pool_ms = _timed(make, lambda rs, p=pool: _burst_pool(p, rs), args.repeats)
        finally:
            pool.close()
        print(
            json.dumps(
                {
                    "answers": args.answers,
                    "beams": args.beams,
                    "workers": workers,
                    "cpus": os.cpu_count(),
                    "event_loop_ms": round(loop_ms, 3),
                    "pool_ms": round(pool_ms, 3),
                    "speedup": round(loop_ms / pool_ms, 2),
                }
            )
        )


if __name__ == "__main__":
    main()
