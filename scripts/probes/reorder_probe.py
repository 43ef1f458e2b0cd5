"""Time the decode-KV beam reorder side by side: every position in the buffer's own dtype (the
older form) against the live positions only, moved as 8-byte words
(``KVCache.reorder``). Both run in one process on the same buffer.

    python scripts/probes/reorder_probe.py [--device cuda] [--repeats 50]

Shapes follow the onerec-1.7b preset: 28 layers, 8 KV heads of 128, 3 decode positions.
Cells: FP8 KV at 4,096 rows (n=512 x 8 requests) and 1,600 rows (n=50 x 32), and BF16 KV at
256 rows (p=1,000, n=256). Each row of the output gives the mean ms per reorder of both forms
and their ratio. Parents are random within each request of n rows.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from flashrec.config import ModelConfig
from flashrec.kvcache.pool import KVCache

CELLS = [  # (label, KV dtype, requests, beams)
    ("n512_c8_fp8", torch.float8_e4m3fn, 8, 512),
    ("n50_c32_fp8", torch.float8_e4m3fn, 32, 50),
    ("p1000_n256_c1_bf16", torch.bfloat16, 1, 256),
]


def _timed(fn, repeats: int, device: str) -> float:
    fn()  # warm-up: kernels, allocator
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000.0 / repeats


def _full(kv: KVCache, rows: torch.Tensor, src: torch.Tensor) -> None:
    """The old form: every position, one element per byte (FP8) or half (BF16)."""
    kv.dkv[:, rows] = kv.dkv[:, src]


def probe(device: str, repeats: int, layers: int, scale: int) -> list[dict]:
    cfg = ModelConfig(
        "Qwen3ForCausalLM", 2048, layers, 16, 8, 128, 6144, 1000, 1e-6, 1e6, 4096, True
    )
    out = []
    for label, dtype, reqs, n in CELLS:
        reqs = max(1, reqs // scale)
        rows_n = reqs * n
        kv = KVCache(cfg, pool_tokens=16, row_slots=rows_n, depth=3, dtype=dtype, device=device)
        kv.reorder_positions = 1  # 3 SID levels, free end token: what the runner sets
        g = torch.Generator(device="cpu").manual_seed(0)
        rows = torch.arange(rows_n, device=device)
        parents = torch.randint(0, n, (reqs, n), generator=g).to(device)
        src = (rows.view(reqs, n).gather(1, parents)).reshape(-1)

        old = _timed(lambda kv=kv, r=rows, s=src: _full(kv, r, s), repeats, device)
        new = _timed(lambda kv=kv, r=rows, s=src: kv.reorder(r, s), repeats, device)
        out.append(
            {
                "cell": label,
                "rows": rows_n,
                "kv_dtype": str(dtype).replace("torch.", ""),
                "buffer_mib": round(kv.dkv.numel() * kv.dkv.element_size() / 2**20, 1),
                "all_positions_ms": round(old, 4),
                "live_words_ms": round(new, 4),
                "speedup": round(old / new, 2) if new > 0 else None,
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument(
        "--scale", type=int, default=1, help="divide the request counts (small CPU smoke runs)"
    )
    args = ap.parse_args()
    for row in probe(args.device, args.repeats, args.layers, args.scale):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
