"""Prefill attention in FP8 against BF16, side by side in one process (GPU, FlashInfer).

FlashInfer's ragged batch prefill on Hopper (``fa3``) takes e4m3 q / k / v with per-tensor
scales and returns bf16. This probe times it against the engine's BF16 ``fa3`` call on the
prefill batches the served cells make (16 q / 8 kv heads of 128, causal), and measures what
the FP8 inputs cost in accuracy against a float64 reference:

- q: RMS-normed per head then scaled by a norm weight, as Qwen3's q_norm leaves it; quantised
  with the static per-layer scale ``sqrt(D) * max|w| / 448`` (a bound no normed head can
  exceed, so nothing clips);
- k / v: the e4m3 codes an FP8 KV cache already holds (scale 1).

    python scripts/probes/fp8_prefill_probe.py [--shapes 6x2465 8x2465 1x1000 8x5000] [--rep 50]

One JSON line per shape: BF16 and FP8 medians (us), their ratio, TFLOP/s, and the max / mean
absolute error of each against the reference (on up to 4,096 query rows).
"""

from __future__ import annotations

import argparse
import json
import math

import torch

HQ, HKV, D = 16, 8, 128
E4M3 = torch.float8_e4m3fn


def _normed(t: int, h: int, w_max: float, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(t, h, D, device="cuda", generator=g)
    x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)
    w = torch.rand(D, device="cuda", generator=g) * w_max
    return (x * w).bfloat16()


def _ref(q, k, v, lens, rows):
    """float64 causal GQA attention for the first ``rows`` query rows of each sequence."""
    outs, start = [], 0
    for n in lens:
        m = min(n, rows)
        qq = q[start : start + m].double()  # the first m queries see keys 0..i
        kk = k[start : start + n].double().repeat_interleave(HQ // HKV, 1)
        vv = v[start : start + n].double().repeat_interleave(HQ // HKV, 1)
        s = torch.einsum("qhd,khd->hqk", qq, kk) / math.sqrt(D)
        mask = torch.arange(n, device="cuda")[None, :] > torch.arange(m, device="cuda")[:, None]
        s = s.masked_fill(mask[None], float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vv))
        start += n
    return outs


def _cut(out, lens, rows):
    parts, start = [], 0
    for n in lens:
        parts.append(out[start : start + min(n, rows)].double())
        start += n
    return parts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["6x2465", "8x2465", "1x1000", "8x5000"])
    ap.add_argument("--rep", type=int, default=50)
    ap.add_argument("--w-max", type=float, default=2.0, help="largest q/k norm weight")
    args = ap.parse_args()
    import flashinfer
    import triton.testing as tt

    g = torch.Generator(device="cuda").manual_seed(0)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for shape in args.shapes:
        b, n = (int(x) for x in shape.split("x"))
        lens = [n] * b
        t = sum(lens)
        q = _normed(t, HQ, args.w_max, g)
        k = _normed(t, HKV, args.w_max, g).to(E4M3)  # the cache's codes
        v = torch.randn(t, HKV, D, device="cuda", generator=g).bfloat16().to(E4M3)
        kb, vb = k.bfloat16(), v.bfloat16()  # what the BF16 path reads (the rounded row)
        s_q = math.sqrt(D) * args.w_max / 448.0
        q8 = (q.float() / s_q).clamp(-448, 448).to(E4M3)
        qo = torch.tensor([0] + [sum(lens[: i + 1]) for i in range(b)], dtype=torch.int32)
        rec = {"shape": shape, "tokens": t}
        flops = sum(4 * HQ * D * x * x / 2 for x in lens)
        outs = {}
        for name, qq, kk, vv, dt in (
            ("bf16", q, kb, vb, torch.bfloat16),
            ("fp8", q8, k, v, E4M3),
        ):
            try:
                w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend="fa3")
                w.plan(qo, qo, HQ, HKV, D, causal=True, sm_scale=D**-0.5, q_data_type=dt,
                       kv_data_type=dt, o_data_type=torch.bfloat16)  # fmt: skip
                if dt == E4M3:  # positional scales (q, k, v): the FP8 kernel's extra args

                    def run(w=w, qq=qq, kk=kk, vv=vv, s_q=s_q):
                        return w.run(qq, kk, vv, s_q, 1.0, 1.0)
                else:

                    def run(w=w, qq=qq, kk=kk, vv=vv):
                        return w.run(qq, kk, vv)

                outs[name] = run()
                torch.cuda.synchronize()
                ms = tt.do_bench(run, warmup=10, rep=args.rep)
                rec[f"{name}_us"] = round(ms * 1e3, 1)
                rec[f"{name}_tflops"] = round(flops / ms / 1e9)
            except Exception as exc:  # noqa: BLE001 - a dtype / backend it does not build
                rec[f"{name}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        if "bf16_us" in rec and "fp8_us" in rec:
            rec["fp8_speedup"] = round(rec["bf16_us"] / rec["fp8_us"], 3)
        rows = 4096 // b
        ref = _ref(q, kb, vb, lens, rows)
        for name, out in outs.items():
            got = _cut(out, lens, rows)
            err = torch.cat([(a - r).abs().flatten() for a, r in zip(got, ref)])
            rec[f"{name}_maxerr"] = float(err.max())
            rec[f"{name}_meanerr"] = float(err.mean())
        print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
