"""Time the first and a repeated SDPA prefill call per new sequence length, per backend.

Checks whether a sequence length seen for the first time costs extra (an execution plan built
per shape) on the eager SDPA prefill path (``--attention-backend triton``):

    python scripts/probes/sdpa_length_probe.py [--heads 16] [--head-dim 128] [--lengths 1001 1003 ...]

Prints one line per (backend, length): first-call ms and repeat ms (CUDA-synchronised).
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashrec.layers.attention import causal_lower_right


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--lengths", type=int, nargs="*", default=[1001, 1003, 1005, 2465, 2467])
    ap.add_argument(
        "--kernels", action="store_true", help="print the CUDA kernels each backend launches"
    )
    args = ap.parse_args()
    backends = {
        "default": None,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }
    for name, be in backends.items():
        for n in args.lengths:
            for masked in (False, True):
                try:
                    first, again = _probe(be, n, masked, args.heads, args.head_dim)
                except RuntimeError as exc:
                    print(f"{name:9s} T={n:5d} masked={masked}: unavailable ({str(exc)[:80]})")
                    continue
                print(
                    f"{name:9s} T={n:5d} masked={masked}: "
                    f"first {first:8.2f} ms  repeat {again:6.2f} ms"
                )
        if args.kernels:
            print(f"{name:9s} kernels: {_kernels(be, args.heads, args.head_dim)}")


def _kernels(be, heads: int, head_dim: int) -> list[str]:
    """Names of the CUDA kernels one causal SDPA call launches under backend ``be``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _probe(be, 1009, False, heads, head_dim)
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    return sorted({e.name[:80] for e in prof.events() if e.device_type == cuda})


def _probe(be, n: int, masked: bool, heads: int, head_dim: int) -> tuple[float, float]:
    """First-call and best-of-3 repeat ms of one causal SDPA of ``n`` queries (masked: with 7
    cached prefix keys, through the lower-right causal bias the engine uses)."""
    n_pre = 7 if masked else 0
    q = torch.randn(1, heads, n, head_dim, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(1, heads, n + n_pre, head_dim, device="cuda", dtype=q.dtype)
    mask = causal_lower_right(n, n + n_pre) if masked else None

    def run() -> None:
        with sdpa_kernel([be]) if be is not None else contextlib.nullcontext():
            if masked:
                F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)
            else:
                F.scaled_dot_product_attention(q, kv, kv, is_causal=True)

    first = timed(run)
    return first, min(timed(run) for _ in range(3))


if __name__ == "__main__":
    main()
