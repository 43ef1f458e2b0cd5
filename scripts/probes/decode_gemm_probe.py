"""Time the decode step's GEMMs at beam-row counts, in a few forms side by side.

At a few hundred beam rows a GEMM has few output tiles for the GPU's SMs, and the library's
tile choice decides how close it comes to the compute ceiling. This probe measures, in one
process, per OneRec-1.7B projection shape and row count M (``--dtype bf16``):

- ``linear``: ``F.linear(x, W)`` with ``W [N, K]`` (what the engine runs);
- ``mm_t``: ``x @ Wt`` with ``Wt [K, N]`` contiguous (the other operand layout);
- ``lt``: ``F.linear`` with ``torch.backends.cuda.preferred_blas_library("cublaslt")``;
- ``tri BMxBNxBKwWsS``: the engine's Triton GEMM (``kernels/tl/matmul.py``, the kernel of
  ``--deterministic``) at each tile in ``--tiles``;

and with ``--dtype fp8`` (W8A8, row-wise scales) ``scaled_mm`` (``torch._scaled_mm``, what the
engine runs) against the same Triton kernel with its scaled epilogue. Each is the median of
``--iters`` launches timed with CUDA events (CUDA-graph captured launches when ``--graph``, as
the decode graph replays them), with TFLOP/s, the weight read's bandwidth and the ratio to the
first form; every form's output is checked against the first. On CPU it runs tiny shapes once,
to check the script itself.

    python scripts/probes/decode_gemm_probe.py [--rows 256 512 2048] [--dtype bf16 fp8] [--graph]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

from flashrec.kernels import gemm_choice  # noqa: E402

# OneRec-1.7B / Qwen3-1.7B projections: (name, N = out features, K = in features)
SHAPES = (
    ("qkv", 4096, 2048),
    ("o_proj", 2048, 2048),
    ("gate_up", 12288, 2048),
    ("down", 2048, 6144),
)
# Triton tiles tried by default: BLOCK_M x BLOCK_N x BLOCK_K, warps, stages (the first is the
# --deterministic BF16 tile for N >= 4096)
TILES = ("128x128x64w8s3", "64x64x64w4s4", "64x128x64w4s4", "128x64x64w4s4", "64x128x128w4s3")


def parse_tile(spec: str) -> tuple[int, int, int, int, int]:
    """``"BMxBNxBKwWsS"`` -> (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages); ValueError if malformed."""
    try:
        dims, rest = spec.split("w")
        warps, stages = rest.split("s")
        bm, bn, bk = (int(v) for v in dims.split("x"))
        return bm, bn, bk, int(warps), int(stages)
    except ValueError:
        raise ValueError(f"tile {spec!r} is not BMxBNxBKwWsS, e.g. 64x128x64w4s4") from None


def _time(fn, iters: int, graph: bool) -> float:
    """Median microseconds of ``fn`` over ``iters`` launches (CUDA events)."""
    fn()  # warm-up: cuBLAS picks and caches its algorithm, Triton compiles
    torch.cuda.synchronize()
    run = gemm_choice.graph_of(fn).replay if graph else fn
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    return statistics.median(times)


def _triton_form(x, w, tile, x_scale=None, w_scale=None):
    """The engine's Triton GEMM at one tile, into a buffer made once (graph-capturable)."""
    out = torch.empty((x.shape[0], w.shape[0]), dtype=torch.bfloat16, device=x.device)
    sa = x_scale.float() if x_scale is not None else None
    sw = w_scale.float() if w_scale is not None else None
    return lambda: gemm_choice.triton_linear(x, w, tile, sa, sw, torch.bfloat16, out=out)


def _forms(x: torch.Tensor, w: torch.Tensor, tiles: list[str], triton_ok: bool) -> dict:
    """BF16 forms, the engine's first."""
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
    if triton_ok:
        for t in tiles:
            forms[f"tri {t}"] = _triton_form(x, w, parse_tile(t))
    return forms


def _fp8_forms(x: torch.Tensor, w: torch.Tensor, tiles: list[str], triton_ok: bool) -> dict:
    """FP8 W8A8 forms (row-wise scales) of ``x @ w.T``, the engine's ``_scaled_mm`` first."""
    from flashrec.kernels.fp8 import fp8_linear, per_token_quant_fp8, quantize_weight_per_channel

    wq, ws = quantize_weight_per_channel(w)
    xq, xs = per_token_quant_fp8(x)
    forms = {"scaled_mm": lambda: fp8_linear(xq, xs, wq, ws, None, torch.bfloat16)}
    if triton_ok:
        for t in tiles:
            forms[f"tri {t}"] = _triton_form(xq, wq, parse_tile(t), xs, ws)
    return forms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="*", default=[256, 512, 800, 1024, 2048])
    ap.add_argument("--dtype", nargs="*", choices=("bf16", "fp8"), default=["bf16"])
    ap.add_argument("--tiles", nargs="*", default=list(TILES),
                    help="Triton tiles BMxBNxBKwWsS (none: no Triton form)")  # fmt: skip
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays")
    args = ap.parse_args()
    for t in args.tiles:
        try:
            parse_tile(t)
        except ValueError as e:
            ap.error(str(e))
    cuda = torch.cuda.is_available()
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    shapes = SHAPES if cuda else tuple((n, o // 64, k // 64) for n, o, k in SHAPES)
    rows = args.rows if cuda else [4]
    if cuda:
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, graph={args.graph}")
    for kind in args.dtype:
        if kind == "fp8" and not cuda:
            print("fp8: needs a GPU (sm_89+), skipped")
            continue
        for name, n, k in shapes:
            w = torch.randn(n, k, device=dev, dtype=dtype) * 0.02
            for m in rows:
                x = torch.randn(m, k, device=dev, dtype=dtype)
                make = _fp8_forms if kind == "fp8" else _forms
                forms = make(x, w, args.tiles, cuda)
                ref = None
                line = [f"{kind} {name:8s} M={m:5d} N={n:6d} K={k:5d}"]
                base = None
                for form, fn in forms.items():
                    out = fn().float()
                    ref = out if ref is None else ref
                    err = (out - ref).abs().max().item() / max(ref.abs().max().item(), 1e-12)
                    if not cuda:
                        line.append(f"{form} ok (rel diff {err:.1e})")
                        continue
                    us = _time(fn, args.iters, args.graph)
                    base = base or us
                    tflops = 2 * m * n * k / (us * 1e-6) / 1e12
                    tbps = n * k * (1 if kind == "fp8" else 2) / (us * 1e-6) / 1e12
                    line.append(
                        f"\n    {form:18s} {us:8.1f} us {tflops:6.0f} TFLOP/s {tbps:4.2f} TB/s "
                        f"{base / us:4.2f}x rel diff {err:.1e}"
                    )
                print("".join(line) if cuda else "  ".join(line), flush=True)


if __name__ == "__main__":
    main()
