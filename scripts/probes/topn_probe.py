"""The beam step's top-n two ways: one stable descending sort of every candidate (the
default) against ``torch.topk`` over ``order_keys`` (``FLASHREC_TOP_N=topk``), at the target
cells' shapes: requests x (beams x trie fan-out) candidates, the n best kept. Each figure is
the median of ``--iters`` CUDA-graph replays of ``--calls`` launches, per launch, with the
check that both select the same rows in the same order. On CPU it runs one small shape once,
to check the script itself.

    python scripts/probes/topn_probe.py [--fanout 200] [--shapes 1x256 32x50 8x512]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

from flashrec.beam.search import top_n  # noqa: E402


def parse_shape(spec: str) -> tuple[int, int]:
    """``"BxN"`` (requests x beams) -> (B, N); ValueError if malformed."""
    try:
        b, n = (int(v) for v in spec.split("x"))
        if b < 1 or n < 1:
            raise ValueError
        return b, n
    except ValueError:
        raise ValueError(f"shape {spec!r} is not BxN with B, N >= 1, e.g. 1x256") from None


def _time(fn, iters: int, calls: int) -> float:
    """Microseconds per launch of ``fn``: CUDA-graph replays (median), or CPU calls."""
    fn()
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    from flashrec.kernels.gemm_choice import graph_of

    torch.cuda.synchronize()
    graph = graph_of(fn, calls)
    graph.replay()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000.0 / calls)
    return statistics.median(ts)


def _select(total, idx, n: int, f: int, method: str):
    return lambda: top_n(total, idx, idx, n, f, method=method)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["1x256", "32x50", "8x512", "8x256"])
    ap.add_argument("--fanout", type=int, nargs="+", default=[64, 200, 1024])
    ap.add_argument("--dead", type=float, default=0.3, help="share of -inf candidates")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args()
    try:
        shapes = [parse_shape(s) for s in args.shapes]
    except ValueError as exc:
        ap.error(str(exc))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":
        shapes, args.fanout = [(2, 8)], [16]
        print("no GPU: one small shape once (checks the script, not speed)")
    g = torch.Generator(device=dev).manual_seed(0)
    for b, n in shapes:
        for f in args.fanout:
            m = n * f
            total = (torch.randn(b, m, device=dev, generator=g) * 8).round() / 8  # with ties
            total[torch.rand(b, m, device=dev, generator=g) < args.dead] = float("-inf")
            idx = torch.arange(b * m, device=dev).view(b, m)
            out = {k: top_n(total, idx, idx, n, f, method=k) for k in ("sort", "topk")}
            same = all(
                torch.equal(getattr(out["sort"], a), getattr(out["topk"], a))
                for a in ("parents", "codes", "cum")
            )
            us = {k: _time(_select(total, idx, n, f, k), args.iters, args.calls)
                  for k in ("sort", "topk")}  # fmt: skip
            print(f"{b} x {n} beams x fan-out {f} ({b * m:,} candidates): sort {us['sort']:8.1f} us"
                  f"  topk {us['topk']:8.1f} us  ({us['sort'] / us['topk']:.2f}x)  same={same}",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
