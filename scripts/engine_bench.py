"""Offline closed-loop engine benchmark (no HTTP): keeps ``--concurrency`` requests in flight
through the scheduler, ``--rounds`` rounds after a warm-up round, and prints QPS and latency
percentiles as JSON. Optionally times HF transformers ``generate`` beam search on the same
prompts in the same process (``--hf-requests``) for a side-by-side ratio.

    PYTHONPATH=. python scripts/engine_bench.py --model-path DIR --sid-vocab-file CAT \
        --n 50 --concurrency 32 --requests 128 --prompt-median 2465
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine
from flashrec.server.gcwatch import freeze_startup_objects
from flashrec.synth import synth_prompts


def closed_loop(
    eng: Engine,
    prompts: list[list[int]],
    n: int,
    concurrency: int,
    max_tokens: int | None,
    temperature: float = 0.0,
):
    sched = eng.scheduler
    pending = list(range(len(prompts)))
    start: dict[str, float] = {}
    lat = []
    t0 = time.perf_counter()
    inflight = 0
    while pending or inflight:
        while pending and inflight < concurrency:
            i = pending.pop(0)
            req = eng.new_request(
                prompts[i],
                n=n,
                max_tokens=max_tokens,
                temperature=temperature,
                rid=f"b{i}-{time.perf_counter_ns()}",
            )
            start[req.rid] = time.perf_counter()
            sched.add(req)
            inflight += 1
        for req, res in sched.step():
            if isinstance(res, Exception):
                raise res
            lat.append(time.perf_counter() - start[req.rid])
            inflight -= 1
    if eng.runner.device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    lat.sort()
    pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000  # noqa: E731
    return {
        "qps": len(prompts) / wall,
        "wall_s": wall,
        "lat_ms_mean": statistics.mean(lat) * 1000,
        "lat_ms_p50": pct(0.5),
        "lat_ms_p90": pct(0.9),
        "lat_ms_p99": pct(0.99),
    }


def traced_round(eng: Engine, prompts, args, trace_dir: str) -> dict:
    """One closed-loop round under torch.profiler; numbers from it are never reported."""
    import os

    from harness.trace.summary import summarize_trace

    os.makedirs(trace_dir, exist_ok=True)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    eng.scheduler.flush_cache()
    with torch.profiler.profile(activities=acts) as prof:
        closed_loop(eng, prompts, args.n, args.concurrency, args.max_tokens, args.temperature[0])
    path = os.path.join(trace_dir, f"{args.label or 'bench'}.trace.json.gz")
    prof.export_chrome_trace(path)
    summary = summarize_trace(path)
    summary["file"] = path
    return summary


def hf_baseline(model_path: str, cat: str | None, prompts: list[list[int]], n: int, dtype):
    from harness.servers.hf_reference import HFReference

    ref = HFReference(model_path, cat, device="cuda", dtype=dtype, search="generate")
    ref.generate(prompts[0], n)
    torch.cuda.synchronize()
    times = []
    for p in prompts:
        t = time.perf_counter()
        ref.generate(p, n)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return {
        "hf_ms_per_request": statistics.mean(times) * 1000,
        "hf_qps": 1.0 / statistics.mean(times),
        "hf_requests": len(prompts),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--sid-vocab-file")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-median", type=int, default=2465)
    ap.add_argument("--prompt-spread", type=float, default=0.0)
    ap.add_argument("--system-prompt-tokens", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument(
        "--temperature",
        type=float,
        nargs="+",
        default=[0.0],
        help="one or more; several run interleaved round by round (a same-run ratio to the first)",
    )
    ap.add_argument("--quantization", default="fp8")
    ap.add_argument("--kv-cache-dtype", default="fp8_e4m3")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch-slots", type=int, default=None)
    ap.add_argument("--cuda-graph-max-bs", type=int, default=1600)
    ap.add_argument("--max-prefill-tokens", type=int, default=16384)
    ap.add_argument(
        "--kv-pool-tokens", type=int, default=600_000, help="leave memory for the HF baseline"
    )
    ap.add_argument("--disable-cuda-graph", action="store_true")
    ap.add_argument("--no-prefix-cache", action="store_true")
    ap.add_argument("--hf-requests", type=int, default=0)
    ap.add_argument("--label", default="")
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--trace-dir", default=None, help="also run one traced round (excluded from the numbers)"
    )
    ap.add_argument("--attention-backend", default=None, help="torch / triton / flashinfer")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="any other EngineConfig field (repeatable), e.g. enable_fused_rms_fp8=false",
    )
    args = ap.parse_args()
    extra = {}
    fields = EngineConfig.__dataclass_fields__
    for item in args.set:
        key, _, raw = item.partition("=")
        if key not in fields:
            ap.error(f"--set {item}: EngineConfig has no field {key!r}")
        kind = str(fields[key].type)
        if "bool" in kind:
            extra[key] = raw.lower() in ("1", "true", "yes", "on")
        elif "int" in kind:
            extra[key] = int(raw)
        elif "float" in kind:
            extra[key] = float(raw)
        else:
            extra[key] = raw
    if args.attention_backend:
        extra["attention_backend"] = args.attention_backend
    cfg = EngineConfig(
        model_path=args.model_path,
        sid_vocab_file=args.sid_vocab_file,
        device=args.device,
        dtype=args.dtype,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        beam_width=args.n,
        cuda_graph_max_bs=args.cuda_graph_max_bs,
        batch_slots=args.batch_slots or max(args.cuda_graph_max_bs, args.n * args.concurrency),
        max_prefill_tokens=args.max_prefill_tokens,
        disable_cuda_graph=args.disable_cuda_graph,
        enable_prefix_cache=not args.no_prefix_cache,
        max_seq_len=16384,
        kv_pool_tokens=args.kv_pool_tokens,
        **extra,
    )
    t = time.perf_counter()
    eng = Engine(cfg)
    load_s = time.perf_counter() - t
    msgs = synth_prompts(
        args.requests,
        median_tokens=args.prompt_median,
        spread=args.prompt_spread,
        seed=1,
        system_prompt_tokens=args.system_prompt_tokens,
        tokenizer=eng.tokenizer,
    )
    prompts = [eng.build_prompt(messages=m) for m in msgs]
    temps = args.temperature
    for t in temps:
        warm = closed_loop(
            eng, prompts[: args.concurrency], args.n, args.concurrency, args.max_tokens, t
        )
    freeze_startup_objects()  # as the server does after warm-up (--gc-freeze)
    by_t: dict[float, list] = {t: [] for t in temps}
    for _ in range(args.rounds):
        for t in temps:  # interleaved: drift over the run weighs on every temperature alike
            eng.scheduler.flush_cache()
            by_t[t].append(closed_loop(eng, prompts, args.n, args.concurrency, args.max_tokens, t))
    rounds = by_t[temps[0]]
    trace = None
    if args.trace_dir:
        trace = traced_round(eng, prompts[: args.concurrency], args, args.trace_dir)
    out = {
        "label": args.label,
        "trace": trace,
        "config": vars(args),
        "load_s": load_s,
        "prompt_tokens_mean": statistics.mean(len(p) for p in prompts),
        "warmup": warm,
        "rounds": rounds,
        "qps_median": statistics.median(r["qps"] for r in rounds),
        "lat_ms_p50_median": statistics.median(r["lat_ms_p50"] for r in rounds),
        "by_temperature": {
            str(t): {
                "qps_median": statistics.median(r["qps"] for r in rs),
                "lat_ms_p50_median": statistics.median(r["lat_ms_p50"] for r in rs),
                "qps_ratio_to_first": statistics.median(r["qps"] for r in rs)
                / statistics.median(r["qps"] for r in rounds),
                "rounds": rs,
            }
            for t, rs in by_t.items()
        },
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
    }
    print(json.dumps(out), flush=True)  # engine numbers first: the HF baseline may fail
    if args.hf_requests:
        import gc

        del eng
        gc.collect()
        torch.cuda.empty_cache()
        out.update(
            hf_baseline(
                args.model_path,
                args.sid_vocab_file,
                prompts[: args.hf_requests],
                args.n,
                torch.bfloat16,
            )
        )
        out["speedup_vs_hf"] = out["qps_median"] / out["hf_qps"]
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
