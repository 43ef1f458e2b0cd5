"""The element-wise kernels of one decoder layer against their memory floor and the layer's GEMMs.

Issue 48's goal 4 asks the norm / activation / quant kernels to take <= 8% of the GPU time.
Each of them is one pass over activations in memory, so its floor is its bytes at the GPU's
copy bandwidth. This probe measures, in one process, at each token count M (OneRec-1.7B
shapes: hidden 2,048, intermediate 6,144, 16 q / 8 kv heads of 128):

- every element-wise kernel of one layer, as the engine runs it (``--dtype fp8``: input and
  post-attention residual + RMSNorm -> e4m3, q/k norm + RoPE + e4m3 KV write, o_proj's input
  quantization, SiLU-and-mul -> e4m3; ``--dtype bf16``: the same without quantization and a
  BF16 cache), with the bytes it must move, its bandwidth and its floor;
- the layer's four GEMMs (``_scaled_mm`` W8A8 or ``F.linear``), the work they sit between;
- a device-to-device copy, whose bandwidth (bytes read + written per second) is the floor.

Each figure: CUDA-graph replays of ``--calls`` back-to-back launches, the median of
``--iters`` replays, per launch. Printed per M: the element-wise share of (element-wise +
GEMM) as measured and with every element-wise kernel at the copy bandwidth; with ``--shares``
(a traced cell's classes, e.g. the n=50 c=32 FP8 cell's ``gemm=55.2 attention=23.5
elementwise=19.8 other=1.5``) the class's share of all GPU time were its kernels at the
floor and the rest unchanged. On CPU it runs the reference kernels at small M once, to check
the script itself.

    python scripts/probes/elementwise_floor.py --tokens 256 4096 16384 --dtype fp8 bf16 \\
        --shares gemm=55.2 attention=23.5 elementwise=19.8 other=1.5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

HIDDEN, INTER, HQ, HKV, D = 2048, 6144, 16, 8, 128
# (name, N = out features, K = in features)
GEMMS = (("qkv", (HQ + 2 * HKV) * D, HIDDEN), ("o_proj", HIDDEN, HQ * D),
         ("gate_up", 2 * INTER, HIDDEN), ("down", HIDDEN, INTER))  # fmt: skip


def kernel_bytes(m: int, dtype: str) -> list[tuple[str, int]]:
    """The element-wise kernels of one layer at ``m`` tokens and the bytes each must read and
    write (BF16 activations of 2 bytes, e4m3 codes of 1, one float32 scale per quantized row).
    ``dtype`` "fp8": W8A8 with an e4m3 KV cache (a prefill's form: the k / v codes also go back
    into the QKV rows, which the prefill attention reads); "bf16": no quantization, BF16 cache."""
    if dtype not in ("fp8", "bf16"):
        raise ValueError(f"dtype must be fp8 or bf16, got {dtype!r}")
    h, qkv_in = HIDDEN, (HQ + 2 * HKV) * D
    if dtype == "fp8":
        norm = m * (h * (2 + 2 + 2 + 1) + 4)  # x, residual in; residual out; codes + scale out
        qk = m * (qkv_in * 2 + qkv_in * 2 + 2 * HKV * D)  # row in; q/k/v back; k/v codes out
        return [
            ("input norm -> e4m3", norm),
            ("q/k norm + RoPE + KV write", qk),
            ("o_proj input -> e4m3", m * (HQ * D * (2 + 1) + 4)),
            ("post-attention norm -> e4m3", norm),
            ("SiLU-and-mul -> e4m3", m * (INTER * (2 * 2 + 1) + 4)),
        ]
    norm = m * h * 2 * 4  # x, residual in; residual, normed out
    # q / k in and back, v in, k / v out
    qk = m * ((HQ + HKV) * D * 2 * 2 + HKV * D * 2 + 2 * HKV * D * 2)
    return [
        ("input norm", norm),
        ("q/k norm + RoPE + KV write", qk),
        ("post-attention norm", norm),
        ("SiLU-and-mul", m * INTER * 2 * 3),
    ]


def floor_share(shares: dict[str, float], factor: float, key: str = "elementwise") -> float:
    """``key``'s share (percent) of all GPU time were its time multiplied by ``factor`` and the
    other classes unchanged. ``shares``: percent of GPU time per class, as a trace summary."""
    if key not in shares:
        raise ValueError(f"--shares has no {key!r} class: {sorted(shares)}")
    if factor < 0 or any(v < 0 for v in shares.values()):
        raise ValueError("shares and factor must be >= 0")
    new = shares[key] * factor
    rest = sum(v for k, v in shares.items() if k != key)
    return 100.0 * new / (rest + new) if rest + new > 0 else 0.0


def parse_shares(items: list[str]) -> dict[str, float]:
    """``["gemm=55.2", "elementwise=19.8", ...]`` -> {class: percent}; ValueError if malformed."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"share {item!r} is not CLASS=PERCENT, e.g. gemm=55.2") from None
    return out


def _timer(iters: int, calls: int):
    """Microseconds per launch of a function: CUDA-graph replays of ``calls`` launches (the
    median of ``iters``) on CUDA; on CPU the median of ``iters`` plain calls."""
    if not torch.cuda.is_available():

        def cpu(fn) -> float:
            fn()
            ts = []
            for _ in range(iters):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e6)
            return statistics.median(ts)

        return cpu

    from flashrec.kernels.gemm_choice import graph_of, replay_us

    def gpu(fn) -> float:
        fn()
        torch.cuda.synchronize()
        return statistics.median(replay_us(graph_of(fn, calls), calls, iters))

    return gpu


def _kernels(m: int, dtype: str, dev: str) -> list:
    """One callable per entry of :func:`kernel_bytes`, on inputs made once."""
    from flashrec.kernels import fp8, qk_rope_kv, rms_fp8, silu_fp8

    bf = torch.bfloat16
    x = torch.randn(m, HIDDEN, device=dev, dtype=bf)
    res = torch.randn_like(x)
    w = torch.rand(HIDDEN, device=dev, dtype=bf) + 0.5
    qkv = torch.randn(m, (HQ + 2 * HKV) * D, device=dev, dtype=bf)
    pos = torch.randint(0, 8192, (m,), device=dev)
    table = qk_rope_kv.build_cos_sin(8192, D, 1e6, dev)
    nw = torch.rand(D, device=dev, dtype=bf) + 0.5
    cache_dtype = torch.float8_e4m3fn if dtype == "fp8" else bf
    kc = torch.zeros(m + 8, HKV, D, device=dev, dtype=cache_dtype)
    vc = torch.zeros_like(kc)
    loc = torch.randperm(m + 8, device=dev)[:m]
    attn = torch.randn(m, HQ * D, device=dev, dtype=bf)
    gu = torch.randn(m, 2 * INTER, device=dev, dtype=bf)

    def qk():
        return qk_rope_kv.qk_norm_rope_store(
            qkv, HQ, HKV, D, pos, table, nw, nw, 1e-6, kc, vc, loc, round_kv=dtype == "fp8"
        )

    if dtype == "fp8":
        norm = lambda: rms_fp8.rms_norm_quant_fp8(x, w, 1e-6, res)  # noqa: E731
        return [norm, qk, lambda: fp8.per_token_quant_fp8(attn), norm,
                lambda: silu_fp8.silu_mul_quant_fp8(gu)]  # fmt: skip
    norm = lambda: rms_fp8.rms_norm(x, w, 1e-6, res)  # noqa: E731
    return [norm, qk, norm, lambda: silu_fp8.silu_mul(gu)]


def _gemms(m: int, dtype: str, dev: str) -> list:
    """(name, callable, flops) for the layer's four GEMMs at ``m`` rows."""
    from flashrec.kernels import fp8

    out = []
    for name, n, k in GEMMS:
        w = torch.randn(n, k, device=dev) * 0.02
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        if dtype == "fp8":
            wq, ws = fp8.quantize_weight_per_channel(w)
            xq, xs = fp8.per_token_quant_fp8(x)
            fn = lambda xq=xq, xs=xs, wq=wq, ws=ws: fp8.fp8_linear(xq, xs, wq, ws)  # noqa: E731
        else:
            wb = w.to(torch.bfloat16)
            fn = lambda x=x, wb=wb: F.linear(x, wb)  # noqa: E731
        out.append((name, fn, 2 * m * n * k))
    return out


def copy_bandwidth(dev: str, timer, nbytes: int = 1 << 28) -> float:
    """Bytes read + written per microsecond of one device-to-device copy of ``nbytes``."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    return 2 * nbytes / timer(lambda: dst.copy_(src))


def run(tokens: list[int], dtypes: list[str], iters: int, calls: int,
        shares: dict[str, float] | None) -> None:  # fmt: skip
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    timer = _timer(iters, calls)
    bw = copy_bandwidth(dev, timer, 1 << 28 if dev == "cuda" else 1 << 22)
    print(f"device {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}; "
          f"copy {bw / 1e6:.2f} TB/s (read + write); per launch, us", flush=True)  # fmt: skip
    for dtype in dtypes:
        for m in tokens:
            ew = ew_floor = 0.0
            for (name, nb), fn in zip(kernel_bytes(m, dtype), _kernels(m, dtype, dev)):
                us = timer(fn)
                ew, ew_floor = ew + us, ew_floor + nb / bw
                print(f"{dtype} M={m:<6d} {name:30s} {us:9.1f} us {nb / us / 1e6:6.3f} TB/s "
                      f"floor {nb / bw:8.1f} us ({us / (nb / bw):.2f}x)", flush=True)  # fmt: skip
            gemm = 0.0
            for name, fn, flops in _gemms(m, dtype, dev):
                us = timer(fn)
                gemm += us
                print(f"{dtype} M={m:<6d} GEMM {name:25s} {us:9.1f} us "
                      f"{flops / us / 1e6:7.1f} TFLOP/s", flush=True)  # fmt: skip
            print(f"{dtype} M={m:<6d} layer: element-wise {ew:.1f} us (floor {ew_floor:.1f}), "
                  f"GEMMs {gemm:.1f} us; element-wise share of the two "
                  f"{100 * ew / (ew + gemm):.1f}% as run, {100 * ew_floor / (ew_floor + gemm):.1f}% "
                  f"at the copy bandwidth", flush=True)  # fmt: skip
            if shares:
                f = ew_floor / ew
                print(f"{dtype} M={m:<6d} with --shares: element-wise "
                      f"{shares['elementwise']:.1f}% of GPU time as traced -> "
                      f"{floor_share(shares, f):.1f}% with its kernels at the floor "
                      f"(x{f:.2f})", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[256, 4096, 16384])
    ap.add_argument("--dtype", nargs="+", choices=["fp8", "bf16"], default=["fp8"])
    ap.add_argument("--iters", type=int, default=20, help="graph replays timed (median)")
    ap.add_argument("--calls", type=int, default=10, help="launches per graph replay")
    ap.add_argument("--shares", nargs="*", default=[],
                    help="a traced cell's classes, CLASS=PERCENT, one of them elementwise")  # fmt: skip
    args = ap.parse_args()
    try:
        shares = parse_shares(args.shares) if args.shares else None
        if shares is not None:
            floor_share(shares, 1.0)  # refuse a missing class before any timing
    except ValueError as exc:
        ap.error(str(exc))
    if not torch.cuda.is_available():
        args.tokens, args.iters = [t for t in args.tokens if t <= 64] or [16], 1
        print("no GPU: the reference kernels at small M, once (checks the script, not speed)")
    run(args.tokens, args.dtype, args.iters, args.calls, shares)


if __name__ == "__main__":
    main()
