"""Per-shape GEMM choice for the decode step's narrow batches (``FLASHREC_DECODE_GEMM=tuned``).

At a few hundred rows a GEMM has few output tiles for the GPU's SMs, and the library's kernel
choice is uneven: on an H100 a 256-row BF16 ``o_proj`` (2048 x 2048) ran at 78 TFLOP/s
through cuBLAS and ~2x faster through the Triton GEMM of ``kernels/tl/matmul.py`` with a
64 x 128 x 128 tile, while the same Triton tile lost on ``down`` (``decode_gemm_probe.py``).
So nothing is assumed: :func:`tune` times the library's GEMM and the Triton GEMM at a few
tiles for each weight shape at one row count, each as a CUDA graph of back-to-back calls (the
way the decode graphs replay them), and keeps a Triton tile only where it is faster by
``MARGIN``. :func:`choice` is read when a linear layer runs (or is captured). Each GEMM
still computes every row on its own, so the choice changes rounding, never which rows meet.
"""

from __future__ import annotations

import functools
import logging
import threading

import torch

log = logging.getLogger(__name__)

Tile = tuple[int, int, int, int, int]  # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages

# the Triton tiles tried: small-M tiles that give a few hundred rows enough programs
TILES: tuple[Tile, ...] = (
    (64, 128, 128, 4, 3),
    (64, 128, 64, 4, 4),
    (128, 64, 64, 4, 4),
    (64, 64, 64, 4, 4),
)
MAX_ROWS = 1024  # wider batches keep the library's GEMM (it led every shape from 1,600 rows)
MARGIN = 0.05  # a Triton tile must be this much faster than the library to be kept
CALLS = 20  # GEMM calls per timed graph
REPLAYS = 5  # timed replays per candidate; the fastest counts

_table: dict[tuple[int, int, int, torch.dtype], Tile | None] = {}
_lock = threading.Lock()


def choice(m: int, n: int, k: int, dtype: torch.dtype) -> Tile | None:
    """The Triton tile chosen for ``[m, k] @ [n, k].T`` in ``dtype``, or None (the library)."""
    return _table.get((m, n, k, dtype))


def clear() -> None:
    """Forget every choice (the library's GEMM everywhere)."""
    with _lock:
        _table.clear()


def chosen() -> dict[tuple[int, int, int, torch.dtype], Tile | None]:
    """A copy of the choices made so far: (m, n, k, dtype) -> tile, or None for the library."""
    with _lock:
        return dict(_table)


def triton_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    tile: Tile,
    x_scale: torch.Tensor | None = None,
    w_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ w.T (+ bias)`` through the Triton GEMM of ``kernels/tl/matmul.py`` at ``tile``
    (also the batch-invariant GEMM of ``invariant.py``, at its fixed tiles); with ``x_scale``
    / ``w_scale`` (FP8 W8A8) both row scales applied to the fp32 accumulator; fp32 operands
    multiply in full precision. ``out``: a contiguous [M, N] tensor the result is written to."""
    import triton

    from flashrec.kernels.tl.matmul import matmul_nt_kernel

    m, k = x.shape
    n = w.shape[0]
    if x.stride(1) != 1:
        x = x.contiguous()
    if w.stride(1) != 1:
        w = w.contiguous()
    dtype = out_dtype or (x.dtype if x_scale is None else torch.bfloat16)
    if out is None or not out.is_contiguous() or out.dtype != dtype:
        res = torch.empty((m, n), dtype=dtype, device=x.device)
    else:
        res = out
    if m == 0:
        return res if out is None else out
    bm, bn, bk, warps, stages = tile
    scaled = x_scale is not None
    sa = x_scale.reshape(-1).contiguous() if scaled else res
    sw = w_scale.reshape(-1).contiguous() if scaled else res
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    matmul_nt_kernel[grid](
        x, w, res, res if bias is None else bias, sa, sw,
        m, n, k, x.stride(0), w.stride(0), res.stride(0),
        HAS_BIAS=bias is not None, SCALED=scaled, IEEE=w.dtype == torch.float32,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    if out is not None and res is not out:
        out.copy_(res)
        return out
    return res


def graph_of(fn, calls: int = 1) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` back-to-back calls of ``fn``, captured after a warm-up call on a
    side stream (algorithm choice, compilation and allocations outside the capture)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def replay_us(graph: torch.cuda.CUDAGraph, calls: int, replays: int) -> list[float]:
    """Microseconds per call of each of ``replays`` replays of ``graph`` (holding ``calls``
    calls), timed with CUDA events; a first replay (the graph's upload) is not timed."""
    graph.replay()
    out = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1000.0 / calls)
    return out


def _gpu_us(fn) -> float:
    """Microseconds per call of ``fn`` on the GPU: ``CALLS`` calls captured in one graph, the
    fastest of ``REPLAYS`` replays."""
    fn()  # compile / pick the algorithm before anything is timed
    graph = graph_of(fn, CALLS)
    best = min(replay_us(graph, CALLS, REPLAYS))
    del graph
    return best


def _times(w: torch.Tensor, w_scale: torch.Tensor | None, m: int) -> dict[Tile | None, float]:
    """Microseconds per call at ``m`` rows: the library's GEMM (key None) and each tile."""
    from flashrec.kernels import fp8 as fp8k

    x = torch.randn(m, w.shape[1], device=w.device, dtype=torch.bfloat16)
    if w.dtype == fp8k.FP8_DTYPE:
        xq, xs = fp8k.per_token_quant_fp8(x)
        ws, xs32 = w_scale.float(), xs.float()
        forms = {None: lambda: fp8k.fp8_linear(xq, xs, w, ws, None, torch.bfloat16)}
        for t in TILES:
            forms[t] = functools.partial(triton_linear, xq, w, t, xs32, ws, torch.bfloat16)
    else:
        x = x.to(w.dtype)
        forms = {None: functools.partial(torch.nn.functional.linear, x, w)}
        for t in TILES:
            forms[t] = functools.partial(triton_linear, x, w, t)
    return {key: _gpu_us(fn) for key, fn in forms.items()}


def tune(weights: list[tuple[torch.Tensor, torch.Tensor | None]], m: int) -> None:
    """Time the library's GEMM and the Triton tiles for every distinct weight shape of
    ``weights`` (``(weight [N, K], row scale [N, 1] or None)``; FP8 with a scale) at ``m``
    rows, and keep the fastest (a Triton tile only by ``MARGIN``). Shapes already chosen at
    ``m`` are skipped; CUDA only, ``m`` above ``MAX_ROWS`` left to the library."""
    from flashrec.kernels import fp8 as fp8k

    if m > MAX_ROWS or m <= 0:
        return
    for w, w_scale in weights:
        n, k = w.shape
        fp8 = w.dtype == fp8k.FP8_DTYPE
        key = (m, n, k, w.dtype)
        if key in _table or not w.is_cuda:
            continue
        times = _times(w, w_scale, m)
        best = min(TILES, key=times.__getitem__)
        keep = best if times[best] < times[None] * (1.0 - MARGIN) else None
        with _lock:
            _table[key] = keep
        log.info(
            "decode GEMM %d x %d x %d %s: library %.1f us, Triton %s %.1f us -> %s",
            m, n, k, "fp8" if fp8 else str(w.dtype).removeprefix("torch."), times[None],
            "x".join(map(str, best[:3])), times[best],
            "Triton " + "x".join(map(str, keep[:3])) if keep else "library",
        )  # fmt: skip


def tune_sizes(weights: list[tuple[torch.Tensor, torch.Tensor | None]], sizes: list[int]) -> None:
    """``tune`` at every row count of ``sizes`` (the decode graphs'), then one log line of
    what was chosen."""
    for m in sizes:
        tune(weights, m)
    picks = list(chosen().values())
    log.info(
        "decode GEMMs tuned at %d sizes: Triton for %d of %d (rows, shape) pairs",
        sum(1 for m in sizes if 0 < m <= MAX_ROWS), sum(t is not None for t in picks), len(picks),
    )  # fmt: skip
