"""Compile FlashInfer's JIT modules the engine uses (ragged prefill, bf16, head_dims given)
once, before anything runs under a timeout. A process killed in the middle of a JIT build
leaves the next process to start that build again (minutes on a fresh machine), so
scripts/gpu_bench.sh runs this first, without a time limit.

    python scripts/flashinfer_warmup.py [--head-dims 128 64]
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[128])
    args = ap.parse_args()
    from flashrec.engine.runner import make_prefill_meta
    from flashrec.layers.attention_flashinfer import FlashInferAttention

    for d in args.head_dims:
        t = time.perf_counter()
        kv = SimpleNamespace(
            k=[torch.zeros(64, 2, d, device="cuda", dtype=torch.bfloat16)],
            v=[torch.zeros(64, 2, d, device="cuda", dtype=torch.bfloat16)],
            dtype=torch.bfloat16,
            depth=3,
        )
        backend = FlashInferAttention(kv, 4, 2, d)
        meta = make_prefill_meta([(0, list(range(8)), list(range(8)))], "cuda")
        q = torch.randn(8, 4, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(8, 2, d, device="cuda", dtype=torch.bfloat16)
        backend.forward(q, k, k.clone(), 0, meta)
        torch.cuda.synchronize()
        print(f"flashinfer ragged prefill head_dim {d}: ready in {time.perf_counter() - t:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
