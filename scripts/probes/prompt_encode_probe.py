"""Prompt building (chat template + encoding, ``build_prompt_ids``) with the Rust backend's
offset-free encoder (``encode_text``) against the HF ``tokenizer.encode`` call, same process,
alternating, on synthetic chat prompts of the given token counts. Checks both give the same ids.

    python scripts/probes/prompt_encode_probe.py [--model-path DIR] [--tokens 300 1000 5000] [--reps 7]

Without ``--model-path`` it builds the tiny synthetic checkpoint (its tokenizer is the one the
benchmarks' synthetic onerec-1.7b uses). Prints one JSON line per prompt length: each way's
median ms per prompt over ``--reps`` passes of 20 prompts, and hf / fast.

``--cold``: instead, the offset-free way one prompt at a time after each of: nothing (hot),
a pass over 64 MB (the caches evicted), a 15 ms sleep (the thread idle, as between a served
request and the next at concurrency 1), both; and the thread's CPU time beside the wall time.
How much of the served ``tokenize`` phase is the prompt met with cold caches, not the encoder.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is scripts/probes/)
sys.path.insert(0, str(ROOT))

from flashrec.prompt import build_prompt_ids, load_tokenizer  # noqa: E402
from flashrec.sid.layout import infer_sid_layout  # noqa: E402
from flashrec.synth import build_checkpoint, synth_prompts  # noqa: E402


class HFOnly:
    """The tokenizer seen without its Rust backend: ``encode_text`` makes the HF call."""

    def __init__(self, tok) -> None:
        self.apply_chat_template = tok.apply_chat_template
        self.encode = tok.encode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default="")
    ap.add_argument("--tokens", type=int, nargs="+", default=[300, 1000, 5000])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--cold", action="store_true", help="each build after a cache sweep / sleep")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = a.model_path
        if not path:
            path = str(Path(tmp) / "tiny")
            build_checkpoint(path, "tiny")
        tok = load_tokenizer(path)
        layout = infer_sid_layout(tok)
        vocab = len(tok)
        if a.cold:
            for n in a.tokens:
                print(json.dumps({"prompt_tokens": n, **cold(tok, layout, vocab, n, a.reps)}))
            return
        ways = {"fast": tok, "hf": HFOnly(tok)}
        for n in a.tokens:
            chats = synth_prompts(20, median_tokens=n, spread=0.05, seed=0, tokenizer=tok)
            ids = {w: [build_prompt_ids(t, layout, vocab, messages=c) for c in chats]
                   for w, t in ways.items()}  # fmt: skip
            assert ids["fast"] == ids["hf"], "the two ways encode differently"
            times: dict[str, list[float]] = {w: [] for w in ways}
            for _ in range(a.reps):
                for w, t in ways.items():
                    t0 = time.perf_counter()
                    for c in chats:
                        build_prompt_ids(t, layout, vocab, messages=c)
                    times[w].append((time.perf_counter() - t0) / len(chats) * 1e3)
            med = {w: round(statistics.median(v), 3) for w, v in times.items()}
            tokens = statistics.median(len(x) for x in ids["fast"])
            print(json.dumps({"prompt_tokens": tokens, "median_ms": med,
                              "hf_over_fast": round(med["hf"] / med["fast"], 2)}))  # fmt: skip


def cold(tok, layout, vocab: int, n: int, reps: int) -> dict:
    """Median wall and thread-CPU ms of one prompt build after each kind of pause."""
    chats = synth_prompts(20 * reps, median_tokens=n, spread=0.05, seed=1, tokenizer=tok)
    junk = np.ones(64 * 2**20 // 8)
    before = {
        "hot": lambda: None,
        "after_64MB_pass": junk.sum,
        "after_15ms_sleep": lambda: time.sleep(0.015),
        "after_both": lambda: (junk.sum(), time.sleep(0.015)),
    }
    wall: dict[str, list[float]] = {k: [] for k in before}
    cpu: dict[str, list[float]] = {k: [] for k in before}
    for c in chats:  # the kinds interleaved, each prompt built once per kind
        for k, pre in before.items():
            pre()
            t0, c0 = time.perf_counter(), time.thread_time()
            build_prompt_ids(tok, layout, vocab, messages=c)
            wall[k].append((time.perf_counter() - t0) * 1e3)
            cpu[k].append((time.thread_time() - c0) * 1e3)
    return {
        "wall_ms": {k: round(statistics.median(v), 3) for k, v in wall.items()},
        "thread_cpu_ms": {k: round(statistics.median(v), 3) for k, v in cpu.items()},
    }


if __name__ == "__main__":
    main()
