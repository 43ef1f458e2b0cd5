"""Time the decode step's BF16 GEMMs at beam-row counts, in a few forms side by side.

At a few hundred beam rows the decode step's GEMMs read the weights once per step, and
cuBLAS's tile choice decides how close they come to the weight-read floor. This probe
measures, in one process, per OneRec-1.7B projection shape and row count M:

- ``linear``: ``F.linear(x, W)`` with ``W [N, K]`` (what the engine runs);
- ``mm_t``: ``x @ Wt`` with ``Wt [K, N]`` contiguous (the other operand layout);
- ``lt``: ``F.linear`` with ``torch.backends.cuda.preferred_blas_library("cublaslt")``;

each as the median of ``--iters`` launches timed with CUDA events (CUDA-graph captured
launches when ``--graph``, as the decode graph replays them), with the achieved bandwidth of
the weight read and the ratio to ``linear``. On CPU it runs tiny shapes once, to check the
script itself.

    python scripts/probes/decode_gemm_probe.py [--rows 256 512 1024] [--graph] [--iters 200]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

# OneRec-1.7B / Qwen3-1.7B projections: (name, N = out features, K = in features)
SHAPES = (
    ("qkv", 4096, 2048),
    ("o_proj", 2048, 2048),
    ("gate_up", 12288, 2048),
    ("down", 2048, 6144),
)


def _time(fn, iters: int, graph: bool) -> float:
    """Median microseconds of ``fn`` over ``iters`` launches (CUDA events)."""
    fn()  # warm-up: cuBLAS picks and caches its algorithm
    torch.cuda.synchronize()
    if graph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    else:
        run = fn
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    return statistics.median(times)


def _forms(x: torch.Tensor, w: torch.Tensor) -> dict:
    wt = w.t().contiguous()

    def lt() -> torch.Tensor:
        prev = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library("cublaslt")
        try:
            return F.linear(x, w)
        finally:
            torch.backends.cuda.preferred_blas_library(prev)

    forms = {"linear": lambda: F.linear(x, w), "mm_t": lambda: x @ wt}
    if x.is_cuda:  # the BLAS-library choice exists on CUDA builds only
        forms["lt"] = lt
    return forms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="*", default=[256, 512, 800, 1024, 2048])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    shapes = SHAPES if cuda else tuple((n, o // 64, k // 64) for n, o, k in SHAPES)
    rows = args.rows if cuda else [4]
    if cuda:
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, graph={args.graph}")
    for name, n, k in shapes:
        w = torch.randn(n, k, device=dev, dtype=dtype) * 0.02
        for m in rows:
            x = torch.randn(m, k, device=dev, dtype=dtype)
            forms = _forms(x, w)
            ref = forms["linear"]().float()
            line = [f"{name:8s} M={m:5d} N={n:6d} K={k:5d}"]
            base = None
            for form, fn in forms.items():
                out = fn().float()
                err = (out - ref).abs().max().item()
                if not cuda:
                    line.append(f"{form} ok (max diff {err:.1e})")
                    continue
                us = _time(fn, args.iters, args.graph)
                base = base or us
                tbps = w.numel() * w.element_size() / (us * 1e-6) / 1e12
                line.append(f"{form} {us:7.1f} us {tbps:4.2f} TB/s {base / us:4.2f}x")
            print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
