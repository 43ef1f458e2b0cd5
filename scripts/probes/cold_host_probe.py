"""The host work of one request, hot against after an idle pause (CPU only).

A server at concurrency 1 runs each request's host work (the prompt's encode, the answer's
JSON body) right after its thread has slept through the previous request's engine time. This
times the same two calls back to back in a loop (what a micro-benchmark and the report's host
probe measure) and after ``--sleep-ms`` of sleep before each call, interleaved in one process:
the ratio is what idle costs the first work after it (clock, caches, vCPU scheduling), apart
from the code. Thread CPU time beside wall time says it is not a wait for the GIL.

    python scripts/probes/cold_host_probe.py                    # builds the tiny tokenizer
    python scripts/probes/cold_host_probe.py --model-path DIR --tokens 1000 --beams 256
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from body_bench import as_columns, sid_answer, sid_text  # scripts/probes/, beside this file

from flashrec.engine.request import GenResult
from flashrec.prompt import encode_text
from flashrec.server.responses import chat_completion_json
from flashrec.synth import build_checkpoint, synth_prompts

CODES = 256  # codes per SID level of the answers' beams


def body_result(n: int, rng: random.Random) -> GenResult:
    """A 3-level answer of ``n`` beams (``body_bench.sid_answer``), as the engine hands it over
    (columns)."""
    text = sid_text(CODES)
    return as_columns(sid_answer(n, rng, text, CODES), text)


def timed(calls: list[Callable[[], Any]], sleep_s: float) -> tuple[float, float]:
    """Median wall and thread-CPU ms of ``calls``, each after ``sleep_s`` of sleep."""
    wall, cpu = [], []
    for call in calls:
        if sleep_s:
            time.sleep(sleep_s)
        t0, c0 = time.perf_counter(), time.thread_time()
        call()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model-path", default="", help="checkpoint dir (default: build tiny)")
    ap.add_argument("--tokens", type=int, default=1000, help="prompt length")
    ap.add_argument("--beams", type=int, default=256, help="beams in the answer body")
    ap.add_argument("--calls", type=int, default=60, help="calls per block")
    ap.add_argument("--blocks", type=int, default=4, help="hot / idle blocks, alternating")
    ap.add_argument("--sleep-ms", type=float, default=20.0, help="idle before each cold call")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="cold-host-") as tmp:
        model = args.model_path or build_checkpoint(Path(tmp) / "tiny", "tiny", catalog_size=2000)
        tok = AutoTokenizer.from_pretrained(str(model))
        rng = random.Random(0)
        n = args.calls * args.blocks
        prompts = synth_prompts(n, median_tokens=args.tokens, spread=0.0, seed=1)
        texts = [
            tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True, enable_thinking=False)
            for m in prompts
        ]  # fmt: skip
        results = [body_result(args.beams, rng) for _ in range(n)]
        print(f"prompts ~{len(encode_text(tok, texts[0]))} tokens, bodies of {args.beams} beams")
        print("block  encode wall / cpu ms   body wall / cpu ms")
        for b in range(args.blocks):
            sleep_s = args.sleep_ms / 1e3 if b % 2 else 0.0
            part = slice(b * args.calls, (b + 1) * args.calls)
            enc = timed([lambda t=t: encode_text(tok, t) for t in texts[part]], sleep_s)
            body = timed(
                [lambda r=r: chat_completion_json(r, "m", 0) for r in results[part]], sleep_s
            )
            label = f"idle {args.sleep_ms:g} ms" if sleep_s else "hot"
            print(f"{label:<12} {enc[0]:6.3f} / {enc[1]:6.3f}     {body[0]:6.3f} / {body[1]:6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
