"""Offline H200 parity and determinism on one checkpoint (no HTTP):

parity       FlashRec (bf16, or fp8 W8A8 + fp8 KV) vs the HF reference (bf16) on the same
             prompts, per n; metrics from harness.parity.compare_beams.
determinism  ``--worker`` mode runs REQUESTS distinct requests sequentially in a fresh
             process and prints a digest of every token id and every score's float bits;
             the parent starts PROCESSES workers and compares the digests.

  PYTHONPATH=. python scripts/h200_parity.py --model-path DIR --sid-vocab-file CAT --out F.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import subprocess
import sys
import time

import torch

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine
from flashrec.synth import synth_prompts
from harness.parity import Beam, compare_beams

PRECISIONS = {
    "bf16": {"quantization": "none", "kv_cache_dtype": "auto"},
    "fp8": {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"},
}


def _engine(args, precision: str, **kw) -> Engine:
    return Engine(
        EngineConfig(
            model_path=args.model_path,
            sid_vocab_file=args.sid_vocab_file,
            device="cuda",
            dtype="bfloat16",
            beam_width=50,
            cuda_graph_max_bs=1024,
            batch_slots=1024,
            kv_pool_tokens=200_000,
            **PRECISIONS[precision],
            **kw,
        )
    )


def parity(args) -> dict:
    from harness.servers.hf_reference import HFReference

    msgs = synth_prompts(args.prompts, median_tokens=args.prompt_median, spread=0.3, seed=7)
    ns = [int(x) for x in args.ns.split(",")]
    engines = {p: _engine(args, p) for p in ("bf16", "fp8")}
    ids = [engines["bf16"].build_prompt(messages=m) for m in msgs]
    got = {
        p: {n: e.generate([e.new_request(i, n=n) for i in ids]) for n in ns}
        for p, e in engines.items()
    }
    del engines
    torch.cuda.empty_cache()
    ref = HFReference(args.model_path, args.sid_vocab_file, device="cuda", dtype=torch.bfloat16)
    out: dict = {}
    for n in ns:
        want = [ref.generate(i, n) for i in ids]
        for p in PRECISIONS:
            rows = []
            for w, g in zip(want, got[p][n]):
                rb = [Beam(tuple(b.token_ids), b.sequence_score) for b in w]
                cb = [Beam(tuple(b.token_ids), b.sequence_score) for b in g.beams]
                rows.append(compare_beams(rb, cb))
            out.setdefault(p, {})[n] = {
                "prompts": len(rows),
                "exact_rate": sum(r["exact"] for r in rows) / len(rows),
                "top1_agreement": sum(r["top1"] for r in rows) / len(rows),
                "overlap_mean": sum(r["overlap"] for r in rows) / len(rows),
                "spearman_mean": _mean([r["spearman"] for r in rows]),
                "max_score_diff": max((r["max_score_diff"] or 0.0) for r in rows),
            }
            print(p, n, out[p][n], file=sys.stderr, flush=True)
    return out


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def worker(args) -> None:
    eng = _engine(args, args.precision)
    msgs = synth_prompts(args.requests, median_tokens=args.prompt_median, spread=0.5, seed=11)
    ns = [1, 20, 50, 128]
    h = hashlib.sha256()
    per = []
    for i, m in enumerate(msgs):
        res = eng.generate(
            [eng.new_request(eng.build_prompt(messages=m), n=ns[i % len(ns)], rid=f"d{i}")]
        )[0]
        r = hashlib.sha256()
        for b in res.beams:
            r.update(struct.pack(f"<{len(b.token_ids)}q", *b.token_ids))
            r.update(struct.pack("<dd", b.sequence_score, b.cum_logprob))
        per.append(r.hexdigest()[:16])
        h.update(r.digest())
    print(json.dumps({"digest": h.hexdigest(), "per_request": per}))


def determinism(args) -> dict:
    digests = []
    for p in range(args.processes):
        t = time.time()
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            "--model-path",
            args.model_path,
            "--sid-vocab-file",
            args.sid_vocab_file,
            "--requests",
            str(args.requests),
            "--precision",
            args.precision,
            "--prompt-median",
            str(args.prompt_median),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        digests.append(json.loads(out.strip().splitlines()[-1]))
        print(f"process {p}: {time.time() - t:.1f} s", file=sys.stderr, flush=True)
    base = digests[0]["per_request"]
    drift = sorted(
        {i for d in digests[1:] for i, (a, b) in enumerate(zip(base, d["per_request"])) if a != b}
    )
    return {
        "requests": args.requests,
        "processes": args.processes,
        "mode": "sequential",
        "precision": args.precision,
        "drifting_requests": len(drift),
        "drifting_ids": drift[:20],
        "digests": [d["digest"] for d in digests],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--sid-vocab-file", required=True)
    ap.add_argument("--out")
    ap.add_argument("--ns", default="1,20,50,128,512")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-median", type=int, default=600)
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--precision", default="fp8")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--skip-parity", action="store_true")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    res["determinism"] = determinism(args)
    print(json.dumps(res), flush=True)
    if not args.skip_parity:
        res["parity"] = parity(args)
    text = json.dumps(res, indent=1)
    if args.out:
        open(args.out, "w").write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
