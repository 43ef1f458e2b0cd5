"""GPU micro-benchmark of the fused kernels against their references (not a pytest module).

Run on the GPU machine from the repo root: ``python tests/kernels/bench_kernels.py``. Sweeps:
- ``--qk-sweep``: qk_norm_rope_store's rounding (emulated / hardware) and launch settings,
  compared with the default launch;
- ``--silu-sweep``: silu_mul -> e4m3's warps and column tiles, compared with the default launch;
- ``--attn-sweep``: the beam-decode attention kernel's tiles and launch settings, next to
  FlashInfer's paged prefill (beams as queries, non-causal) and dense cuDNN SDPA on the same
  prompt-part data.
Prints time per call and effective bandwidth (bytes read + written / time) for Qwen3-1.7B
shapes (hidden 2048, intermediate 6144, 16 q / 8 kv heads of 128); warm-up excluded.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

import torch
import triton.testing as tt

from flashrec.kernels import fp8, qk_rope_kv, rms_fp8, silu_fp8

DEV = "cuda"
BF16 = torch.bfloat16


def _bench(name: str, fn: Callable[[], object], nbytes: int) -> None:
    ms = tt.do_bench(fn, warmup=25, rep=100)
    print(f"{name:48s} {ms * 1e3:9.1f} us {nbytes / ms / 1e6:8.0f} GB/s", flush=True)


def _run(m: int) -> None:
    hidden, inter, hq, hkv, d = 2048, 6144, 16, 8, 128
    x = torch.randn(m, hidden, device=DEV, dtype=BF16)
    res = torch.randn_like(x)
    w = torch.rand(hidden, device=DEV, dtype=BF16) + 0.5
    nb = m * hidden * 7  # x, residual in; residual out (2 B each); codes out (1 B)
    for tag, f in (("triton", rms_fp8.rms_norm_quant_fp8_triton),
                   ("ref", rms_fp8.rms_norm_quant_fp8_ref)):  # fmt: skip
        _bench(f"rms_norm_quant_fp8 {tag} M={m}", lambda f=f: f(x, w, 1e-6, res), nb)
    gu = torch.randn(m, 2 * inter, device=DEV, dtype=BF16)
    for tag, f in (("triton", silu_fp8.silu_mul_quant_fp8_triton),
                   ("ref", silu_fp8.silu_mul_quant_fp8_ref)):  # fmt: skip
        _bench(f"silu_mul_quant_fp8 {tag} M={m}", lambda f=f: f(gu), m * inter * 5)
    _bench(f"per_token_quant_fp8 triton M={m}",
           lambda: fp8.per_token_quant_fp8_triton(x), m * hidden * 3)  # fmt: skip
    qkv = torch.randn(m, (hq + 2 * hkv) * d, device=DEV, dtype=BF16)
    pos = torch.randint(0, 4096, (m,), device=DEV)
    table = qk_rope_kv.build_cos_sin(8192, d, 1e6, DEV)
    nw = torch.rand(d, device=DEV, dtype=BF16) + 0.5
    kc = torch.zeros(m + 8, hkv, d, device=DEV, dtype=BF16)
    vc = torch.zeros_like(kc)
    loc = torch.randperm(m + 8, device=DEV)[:m]
    nb = m * d * ((hq + hkv) * 4 + hkv * 2 + 2 * hkv * 2)
    for tag, f in (("triton", qk_rope_kv.qk_norm_rope_store_triton),
                   ("ref", qk_rope_kv.qk_norm_rope_store_ref)):  # fmt: skip
        _bench(
            f"qk_norm_rope_store {tag} T={m}",
            lambda f=f: f(qkv, hq, hkv, d, pos, table, nw, nw, 1e-6, kc, vc, loc),
            nb,
        )
    wq, ws = fp8.quantize_weight_per_channel(torch.randn(4096, hidden, device=DEV) * 0.02)
    xq, xs = fp8.per_token_quant_fp8(x)
    ms = tt.do_bench(lambda: fp8.fp8_linear(xq, xs, wq, ws), warmup=25, rep=100)
    tflops = 2 * m * 4096 * hidden / ms / 1e9
    print(f"{'fp8_linear M=' + str(m) + ' N=4096 K=2048':48s} {ms * 1e3:9.1f} us "
          f"{tflops:8.0f} TFLOP/s")  # fmt: skip


def _silu_sweep(m: int) -> None:
    """silu_mul -> e4m3 (the FP8 MLP's form) at M tokens of OneRec-1.7B's 6,144-wide
    intermediate, per warp count: time, bandwidth (the row in, codes and scale out) and the
    largest code difference from the default launch. Session 9's n=50 trace has it at ~3.1
    TB/s, under the ~4.2 TB/s rms_norm reaches."""
    inter = 6144
    g = torch.Generator(device=DEV).manual_seed(3)
    gu = torch.randn(m, 2 * inter, device=DEV, dtype=BF16, generator=g)
    ref, ref_s = silu_fp8.silu_mul_quant_fp8_triton(gu)
    nb = m * (inter * 2 * 2 + inter + 4)
    # the default tile pads 6,144 columns to 8,192 lanes; 2,048 x 3 and 1,024 x 6 are exact
    # but walk the row twice (absmax, then codes; the second read should hit L2)
    for block, warps in [(None, w) for w in (4, 8, 16, 32)] + [
        (b, w) for b in (1024, 2048) for w in (2, 4, 8)
    ]:
        y, sc = silu_fp8.silu_mul_quant_fp8_triton(gu, num_warps=warps, block=block)
        codes = (y.view(torch.uint8).int() - ref.view(torch.uint8).int()).abs().max().item()
        same_s = torch.equal(sc, ref_s)
        _bench(
            f"silu_mul_quant_fp8 block={block or 'row'} warps={warps} M={m} "
            f"codes_maxdiff={codes} scale_same={same_s}",
            lambda w=warps, b=block: silu_fp8.silu_mul_quant_fp8_triton(gu, num_warps=w, block=b),
            nb,
        )


def _qk_sweep(m: int) -> None:
    """qk_norm_rope_store's launch settings (heads per program x warps) at M tokens, with an
    FP8 KV cache written back into the row (the n=50 prefill's form): time, bandwidth, and
    whether every output equals the default launch's bit for bit. Session 8's H200 traces
    have this kernel at ~2 TB/s, half of what silu_mul and rms_norm reach."""
    hq, hkv, d = 16, 8, 128
    g = torch.Generator(device=DEV).manual_seed(1)
    qkv0 = torch.randn(m, (hq + 2 * hkv) * d, device=DEV, dtype=BF16, generator=g)
    pos = torch.randint(0, 4096, (m,), device=DEV, generator=g)
    table = qk_rope_kv.build_cos_sin(8192, d, 1e6, DEV)
    nw = torch.rand(d, device=DEV, dtype=BF16, generator=g) + 0.5
    loc = torch.randperm(m + 8, device=DEV, generator=g)[:m]

    def launch(qkv, kc, vc, **kw):
        return qk_rope_kv.qk_norm_rope_store_triton(
            qkv, hq, hkv, d, pos, table, nw, nw, 1e-6, kc, vc, loc, round_kv=True, **kw
        )

    def outputs(**kw):
        qkv = qkv0.clone()
        kc = torch.zeros(m + 8, hkv, d, device=DEV, dtype=torch.float8_e4m3fn)
        vc = torch.zeros_like(kc)
        launch(qkv, kc, vc, **kw)
        return qkv.view(torch.int16), kc.view(torch.uint8), vc.view(torch.uint8)

    ref = outputs()
    # bytes: the row in (q, k, v), q / k / v back into the row, k / v codes into the cache
    nb = m * d * ((hq + 2 * hkv) * 2 * 2 + 2 * hkv)
    # the rounding: integer emulation (the default) against the hardware conversions
    # (--qk-rope-rounding hardware), default launch settings; same = every bit equal
    for hw in (False, True):
        same = all(torch.equal(a, b) for a, b in zip(outputs(hw_round=hw), ref))
        qkv, kc = qkv0.clone(), torch.zeros(m + 8, hkv, d, device=DEV, dtype=torch.float8_e4m3fn)
        vc = torch.zeros_like(kc)
        _bench(
            f"qk_norm_rope_store rounding={'hardware' if hw else 'emulated'} T={m} same={same}",
            lambda q=qkv, k=kc, v=vc, h=hw: launch(q, k, v, hw_round=h),
            nb,
        )
    for block_h in (4, 8, 16):
        for warps in (1, 2, 4, 8):
            same = all(
                torch.equal(a, b) for a, b in zip(outputs(block_h=block_h, num_warps=warps), ref)
            )
            qkv = qkv0.clone()
            kc = torch.zeros(m + 8, hkv, d, device=DEV, dtype=torch.float8_e4m3fn)
            vc = torch.zeros_like(kc)
            _bench(
                f"qk_norm_rope_store BLOCK_H={block_h} warps={warps} T={m} same={same}",
                lambda q=qkv, k=kc, v=vc, b=block_h, w=warps: launch(
                    q, k, v, block_h=b, num_warps=w
                ),
                nb,
            )


ATTN_SHAPES = ((8, 512, 2465), (32, 50, 2465), (1, 256, 1000), (8, 256, 5000))
# (BLOCK_M, BLOCK_N, warps, stages); the first is the engine's launch
ATTN_TILES = (
    (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 1), (64, 32, 4, 2), (64, 128, 4, 2),
    (64, 64, 8, 2), (128, 64, 8, 2), (128, 32, 8, 2), (128, 64, 4, 2), (32, 64, 4, 2),
    (32, 128, 4, 2), (16, 64, 4, 2),
)  # fmt: skip


def _attn_sweep(
    reqs: int,
    n: int,
    length: int,
    kv_dtype: torch.dtype,
    forced_splits: int | None = None,
    dec: str | None = None,
) -> None:
    """One decode step's attention (one layer, 16 q / 8 kv heads of 128, 3 SID levels, at the
    last level) for ``reqs`` requests of ``n`` beams over ``length``-token prompts: every tile
    of the Triton kernel (max |diff| against the engine's tile), then the prompt part alone
    through FlashInfer's paged prefill (page size 1, the pool's own slots), its ragged prefill
    over a dense BF16 copy, and dense cuDNN SDPA (KV repeated to 16 heads, equal lengths): the
    rates a kernel could reach; and the whole layer composed from the ragged prefill, the
    per-beam suffix and a log-sum-exp merge (:func:`_attn_composed`)."""
    from flashrec.kernels import beam_attention as ba
    from flashrec.kernels.beam_merge import attention_state_ref

    hq, hkv, d, depth = 16, 8, 128, 3
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    g = torch.Generator(device=DEV).manual_seed(2)
    rows_n = reqs * n
    pool = reqs * length + 64
    kp = torch.randn(pool, hkv, d, device=DEV, dtype=BF16, generator=g).to(kv_dtype)
    vp = torch.randn(pool, hkv, d, device=DEV, dtype=BF16, generator=g).to(kv_dtype)
    dk = torch.randn(rows_n * depth, hkv, d, device=DEV, dtype=BF16, generator=g).to(kv_dtype)
    dv = torch.randn(rows_n * depth, hkv, d, device=DEV, dtype=BF16, generator=g).to(kv_dtype)
    q = torch.randn(rows_n, hq, d, device=DEV, dtype=BF16, generator=g)
    # each request's prompt in one run of slots, the requests in a shuffled order
    order = torch.randperm(reqs, generator=torch.Generator().manual_seed(3)).tolist()
    slots = torch.cat([torch.arange(o * length, (o + 1) * length) for o in order])
    slots = slots.int().to(DEV)
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=DEV)  # noqa: E731
    row_start = i32([r * n for r in range(reqs)])
    slot_start = i32([r * length for r in range(reqs)])
    meta = (i32([n] * reqs), slot_start, i32([length] * reqs), i32([depth - 1] * reqs))
    rows = torch.randperm(rows_n, device=DEV, generator=g)
    scale = d**-0.5
    tag = f"R={reqs} n={n} L={length} kv={str(kv_dtype).split('.')[-1]}"
    tag += "" if dec is None else f" dec={dec}"
    flops = 4 * rows_n * hq * length * d  # QK and PV of the prompt part
    ref = None
    for tile in ATTN_TILES:
        bm, bn, warps, stages = tile[:4]
        f16 = bool(tile[4]) if len(tile) > 4 else False  # FP8 KV: products in float16
        if f16 and kv_dtype == BF16:
            continue
        blocks = reqs * -(-(hq // hkv) * n // bm)
        splits = ba.choose_splits(blocks, hkv, rows_n, length, sms)
        if forced_splits is not None:  # ATTN_SPLITS: a fixed count instead of the engine's
            if forced_splits > 1 and rows_n > ba.SPLIT_MAX_ROWS:
                continue
            splits = forced_splits
        work = i32(ba.build_work([n] * reqs, hq // hkv, bm, splits))
        ctrl = i32([splits, work.shape[0]])
        parts = ba.alloc_partials(rows_n, hq, d, DEV)

        def run(bm=bm, bn=bn, warps=warps, stages=stages, work=work, ctrl=ctrl, parts=parts,
                splits=splits, f16=f16):  # fmt: skip
            return ba.beam_decode_attention_triton(
                q, kp, vp, slots, work, row_start, *meta, dk, dv, rows, depth, scale,
                block_m=bm, block_n=bn, ctrl=ctrl, partials=parts, sms=sms, splits=splits,
                num_warps=warps, num_stages=stages, f16_dot=f16, decode_split=dec,
            )  # fmt: skip

        try:
            out = run()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a tile that does not compile or fit
            print(f"beam_attn {tag} tile={bm}x{bn}x{warps}w{stages}s f16={f16}: {type(exc).__name__}: "
                  f"{str(exc).splitlines()[0][:120]}", flush=True)  # fmt: skip
            continue
        ref = out if ref is None else ref
        diff = (out.float() - ref.float()).abs().max().item()
        ms = tt.do_bench(run, warmup=10, rep=50)
        print(f"beam_attn {tag} tile={bm}x{bn}x{warps}w{stages}s f16={f16} splits={splits}: "
              f"{ms * 1e3:8.1f} us {flops / ms / 1e9:6.0f} TFLOP/s maxdiff={diff:.2e}",
              flush=True)  # fmt: skip
        if os.environ.get("ATTN_GRAPH", "0") == "1":  # launches replayed from a CUDA graph, as
            # the engine's decode step runs them: steadier for launch-bound shapes (one request)
            ms = tt.do_bench_cudagraph(run, rep=50)
            print(f"beam_attn {tag} tile={bm}x{bn}x{warps}w{stages}s f16={f16} splits={splits} "
                  f"(CUDA graph): {ms * 1e3:8.1f} us {flops / ms / 1e9:6.0f} TFLOP/s", flush=True)  # fmt: skip
        if tile == ATTN_TILES[0] and forced_splits is None:  # engine tile: branched vs masked
            for step in range(depth):  # the engine's 3-level decode runs steps 0 and 1
                st = (meta[0], meta[1], meta[2], i32([step] * reqs))
                res = {}
                for live in (True, False):

                    def run_live(live=live, st=st, bm=bm, bn=bn, warps=warps, stages=stages,
                                 work=work, ctrl=ctrl, parts=parts, splits=splits, f16=f16):  # fmt: skip
                        return ba.beam_decode_attention_triton(
                            q, kp, vp, slots, work, row_start, *st, dk, dv, rows, depth, scale,
                            block_m=bm, block_n=bn, ctrl=ctrl, partials=parts, sms=sms,
                            splits=splits, num_warps=warps, num_stages=stages, f16_dot=f16,
                            live_only=live,
                        )  # fmt: skip

                    res[live] = (run_live(), tt.do_bench(run_live, warmup=10, rep=50))
                same = (res[True][0].float() - res[False][0].float()).abs().max().item()
                print(f"beam_attn {tag} step={step} live-only blocks: "
                      f"{res[True][1] * 1e3:8.1f} us, masked blocks {res[False][1] * 1e3:8.1f} us "
                      f"({res[False][1] / res[True][1]:.2f}x) maxdiff={same:.2e}",
                      flush=True)  # fmt: skip
    if os.environ.get("ATTN_FI", "1") == "0":  # skip FlashInfer (a fresh JIT build is ~70 s)
        return
    try:
        import flashinfer
    except Exception as exc:  # noqa: BLE001
        print(f"flashinfer not importable: {exc}")
        return
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)
    qo = torch.arange(0, rows_n + 1, n, dtype=torch.int32)
    kvp = torch.arange(0, reqs * length + 1, length, dtype=torch.int32)
    last = torch.ones(reqs, dtype=torch.int32)
    cache = (kp.view(pool, 1, hkv, d), vp.view(pool, 1, hkv, d))

    def paged(backend):
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
        kw = dict(causal=False, sm_scale=scale, q_data_type=BF16, kv_data_type=kv_dtype,
                  o_data_type=BF16)  # fmt: skip
        return (lambda: w.plan(qo, kvp, slots, last, hq, hkv, d, 1, **kw),
                lambda: w.run(q, cache, return_lse=True))  # fmt: skip

    for backend in os.environ.get("ATTN_PAGED", "fa2").split():  # fa3: does not build for these
        _time_prompt_part(f"flashinfer paged prefill {backend} {tag}", "prompt part, +lse",
                          lambda b=backend: paged(b), flops,
                          lambda o, lse: f"lse={tuple(lse.shape)}")  # fmt: skip
    # the prompt part through FlashInfer's ragged prefill (the kernels the engine's prefill runs,
    # fa3 on Hopper) over a dense BF16 copy of each request's prompt KV, as a decode path that
    # kept one such copy per request from its prefill would (ATTN_RAGGED="fa3 fa2"; "" skips)
    kd = kp[slots.long()].to(BF16)  # request-major: request r's prompt at [r * length, ...)
    vd = vp[slots.long()].to(BF16)
    check = None
    if reqs * n * length <= 8 * 512 * 2465:  # request 0's prompt part in float32, for maxdiff
        check = attention_state_ref(q[:n].float(), kd[:length], vd[:length], scale)[0]

    def vs_check(o, lse):
        diff = (o[:n].float() - check).abs().max().item() if check is not None else float("nan")
        return f"maxdiff(request 0, fp32)={diff:.2e}"

    def ragged(backend):
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
        kw = dict(causal=False, sm_scale=scale, q_data_type=BF16, kv_data_type=BF16,
                  o_data_type=BF16)  # fmt: skip
        return (lambda: w.plan(qo, kvp, hq, hkv, d, **kw),
                lambda: w.run(q, kd, vd, return_lse=True))  # fmt: skip

    for backend in os.environ.get("ATTN_RAGGED", "fa3").split():
        _time_prompt_part(f"flashinfer ragged prefill {backend} {tag}",
                          "prompt part over a dense bf16 copy, +lse",
                          lambda b=backend: ragged(b), flops, vs_check)  # fmt: skip
    if ref is not None and os.environ.get("ATTN_COMPOSE", "1") != "0":
        _attn_composed(
            flashinfer, ws, q, kp, vp, slots, kd, vd, dk, dv, rows, ref, reqs, n, length, tag
        )
    if kv_dtype == BF16 and reqs * length * n <= 8 * 5000 * 512:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qd = q.view(reqs, n, hq, d).transpose(1, 2)
        kd = kp[: reqs * length].view(reqs, length, hkv, d).transpose(1, 2)
        kd = kd.repeat_interleave(hq // hkv, 1)
        vd = vp[: reqs * length].view(reqs, length, hkv, d).transpose(1, 2)
        vd = vd.repeat_interleave(hq // hkv, 1)
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                f = lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, vd)  # noqa: E731
                f()
                ms = tt.do_bench(f, warmup=10, rep=50)
            print(f"dense cudnn sdpa {tag} (prompt part, KV repeated): {ms * 1e3:8.1f} us "
                  f"{flops / ms / 1e9:6.0f} TFLOP/s", flush=True)  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            print(f"dense cudnn sdpa {tag}: {type(exc).__name__}: {exc}")


def _time_prompt_part(name, what, make, flops, describe) -> None:
    """One FlashInfer launch of the prompt part (``make()`` -> its plan and run callables):
    prints its time, its host plan() time and ``describe(o, lse)``; a backend / dtype pair it
    does not take prints why."""
    try:
        plan, run = make()
        plan()
        o, lse = run()
        torch.cuda.synchronize()
        ms = tt.do_bench(run, warmup=10, rep=50)
        t0 = time.perf_counter()
        for _ in range(20):
            plan()
        plan_us = (time.perf_counter() - t0) / 20 * 1e6
        print(f"{name} ({what}): {ms * 1e3:8.1f} us {flops / ms / 1e9:6.0f} TFLOP/s "
              f"plan {plan_us:.0f} us {describe(o, lse)}", flush=True)  # fmt: skip
    except Exception as exc:  # noqa: BLE001
        print(f"{name}: {type(exc).__name__}: "
              f"{str(exc).splitlines()[0][:160] if str(exc) else ''}", flush=True)  # fmt: skip


def _attn_composed(fi, ws, q, kp, vp, slots, kd, vd, dk, dv, rows, ref, reqs, n, length, tag):
    """A decode layer's attention composed the way a path over FlashInfer would run it, against
    the engine kernel's output ``ref`` (every beam at its last decode step): the prompt part
    through FlashInfer, each beam's own decode keys in torch, and the two merged by their
    log-sum-exps (``flashinfer.merge_state``). Two prompt parts: fa3 ragged prefill over an
    arena that holds each request's prompt KV at its own offset with free gaps between them (a
    gap is a segment with no query rows), and fa3 paged prefill (page size 1) over a BF16 pool
    in the pool's own slots (the pool itself where the KV is BF16, else a BF16 twin of it).
    Prints the max |diff| to the engine kernel, which base the returned LSE is in, and the time
    of each part. Then the engine's own path (``FlashInferAttention`` with
    ``--decode-prompt-attention flashinfer``: paged over a BF16 pool, staged + ragged over an
    FP8 one, + the suffix merge kernel) on the decode metadata the engine builds."""
    hq, hkv, d = q.shape[1], kd.shape[1], q.shape[2]
    depth = dk.shape[0] // q.shape[0]
    scale = d**-0.5
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    gaps = [64 * (1 + r % 3) for r in range(reqs)]  # free space after each request
    arena_k = torch.zeros(reqs * length + sum(gaps), hkv, d, dtype=BF16, device=DEV)
    arena_v = torch.zeros_like(arena_k)
    qo, kvp, off = [0], [0], 0
    for r in range(reqs):
        arena_k[off : off + length] = kd[r * length : (r + 1) * length]
        arena_v[off : off + length] = vd[r * length : (r + 1) * length]
        off += length + gaps[r]
        qo += [qo[-1] + n, qo[-1] + n]  # the request's rows, then its gap's none
        kvp += [kvp[-1] + length, kvp[-1] + length + gaps[r]]
    pool_kv = (kp.to(BF16).unsqueeze(1), vp.to(BF16).unsqueeze(1))  # [slots, page 1, hkv, d]
    plain = dict(causal=False, sm_scale=scale, q_data_type=BF16, kv_data_type=BF16,
                 o_data_type=BF16)  # fmt: skip

    def ragged():
        w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend="fa3")
        w.plan(i32(qo), i32(kvp), hq, hkv, d, **plain)
        return lambda: w.run(q, arena_k, arena_v, return_lse=True)

    def paged():
        w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa3")
        w.plan(i32([r * n for r in range(reqs + 1)]), i32([r * length for r in range(reqs + 1)]),
               slots, i32([1] * reqs), hq, hkv, d, 1, **plain)  # fmt: skip
        return lambda: w.run(q, pool_kv, return_lse=True)

    from flashrec.kernels.beam_merge import attention_state_ref, beam_suffix_state

    # request 0's first rows in float32: which base the returned LSE is in (e or 2)
    lse0 = attention_state_ref(q[:4].float(), kd[:length], vd[:length], scale, base2=False)[1]

    last = torch.full((q.shape[0],), depth - 1, dtype=torch.int32, device=q.device)
    for name, make in (("fa3 ragged over an arena with gaps", ragged),
                       ("fa3 paged over a bf16 pool, page size 1", paged)):  # fmt: skip
        try:
            prompt = make()
            o_p, lse_p = prompt()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a layout or dtype it does not take
            print(f"composed {tag}: {name}: {type(exc).__name__}: "
                  f"{str(exc).splitlines()[0][:160] if str(exc) else ''}", flush=True)  # fmt: skip
            continue
        base2 = (lse_p[:4].float() - lse0 / math.log(2)).abs().max().item()
        natural = (lse_p[:4].float() - lse0).abs().max().item()
        in_base2 = base2 < natural

        def suffix(in_base2=in_base2):  # every beam at the last step, as ``ref``
            return beam_suffix_state(q, dk, dv, rows, last, depth, scale, in_base2)

        o_s, lse_s = suffix()
        o, _ = fi.merge_state(o_p, lse_p, o_s, lse_s)
        diff = (o.float() - ref.float()).abs().max().item()
        t_p = tt.do_bench(prompt, warmup=10, rep=50)
        t_s = tt.do_bench(suffix, warmup=10, rep=50)
        t_m = tt.do_bench(lambda o_p=o_p, lse_p=lse_p, o_s=o_s, lse_s=lse_s: fi.merge_state(
            o_p, lse_p, o_s, lse_s), warmup=10, rep=50)  # fmt: skip
        print(f"composed {tag}: {name} {t_p * 1e3:8.1f} us + suffix (torch) {t_s * 1e3:6.1f} us "
              f"+ merge_state {t_m * 1e3:6.1f} us; LSE base {'2' if in_base2 else 'e'} "
              f"(|diff| {min(base2, natural):.1e}); max |diff| to the engine kernel {diff:.2e}",
              flush=True)  # fmt: skip
    # --decode-prompt-attention flashinfer as the engine runs it: the backend's own decode
    # (BF16 KV: paged fa3 over the pool; FP8 KV: the prompts staged as BF16, then ragged) + the
    # suffix merge kernel, on the decode metadata the engine builds
    from types import SimpleNamespace

    from flashrec.engine.meta import make_decode_meta
    from flashrec.kernels.beam_merge import beam_suffix_merge_triton, stage_prompt_kv_triton
    from flashrec.layers.attention_flashinfer import FlashInferAttention

    try:
        kv = SimpleNamespace(k=[kp], v=[vp], dk=[dk], dv=[dv], dtype=kp.dtype, depth=depth)
        att = FlashInferAttention(kv, hq, hkv, d, decode_prompt="flashinfer")
        rows_np, slots_np = rows.cpu().numpy(), slots.cpu().numpy()
        groups = [(rows_np[r * n : (r + 1) * n], slots_np[r * length : (r + 1) * length], None,
                   depth - 1, length + depth - 1) for r in range(reqs)]  # fmt: skip
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        meta = make_decode_meta(groups, depth, DEV, packed=True, group_size=hq // hkv,
                                num_kv_heads=hkv, sms=sms)  # fmt: skip

        def layer():
            return att.decode(q, 0, meta)

        diff = (layer().float().view(ref.shape) - ref.float()).abs().max().item()
        t_l = tt.do_bench(layer, warmup=10, rep=50)
        t_g = tt.do_bench_cudagraph(layer, rep=50)
        extra = ""
        if att.staged:
            t_s = tt.do_bench(lambda: stage_prompt_kv_triton(
                kp, vp, att._stage_slots, att._stage_n, *att._stage, sms=sms), warmup=10, rep=50)  # fmt: skip
            extra = f"; the staging kernel alone {t_s * 1e3:6.1f} us"
        o_p, lse_p = att._dec_ring.current.run(
            q, *(att._stage if att.staged else (att._pages[0],)), return_lse=True
        )
        out_loc = meta.out_loc
        t_m = [tt.do_bench(lambda every=every: beam_suffix_merge_triton(
            q, o_p, lse_p, dk, dv, meta.rows, out_loc, depth, scale, all_heads=every),
            warmup=10, rep=50) for every in (False, True)]  # fmt: skip
        how = "staged + ragged" if att.staged else "paged"
        print(f"engine path {tag}: {how} {att.kernel} + suffix merge kernel {t_l * 1e3:8.1f} us "
              f"(CUDA graph {t_g * 1e3:8.1f} us; the merge kernel alone {t_m[0] * 1e3:6.1f} us, "
              f"one program per row {t_m[1] * 1e3:6.1f} us{extra}); "
              f"max |diff| to the engine kernel {diff:.2e}", flush=True)  # fmt: skip
    except Exception as exc:  # noqa: BLE001
        print(f"engine path {tag}: {type(exc).__name__}: "
              f"{str(exc).splitlines()[0][:160] if str(exc) else ''}", flush=True)  # fmt: skip


def main() -> None:
    import sys

    torch.manual_seed(0)
    if "--qk-sweep" in sys.argv:  # only the qk_norm_rope_store launch-settings sweep
        for m in (15000, 35000):
            _qk_sweep(m)
        return
    if "--silu-sweep" in sys.argv:  # only silu_mul -> e4m3's launch settings
        for m in (4096, 15000, 35000):
            _silu_sweep(m)
        return
    if "--attn-sweep" in sys.argv:  # only the beam-decode attention tiles (+ FlashInfer, cuDNN)
        # ATTN_TILES="64x128x4x2 64x128x4x2x1 ..." (BLOCK_M x BLOCK_N x warps x stages [x f16
        # products, FP8 KV only]), ATTN_KV="bf16 fp8"
        global ATTN_TILES
        if os.environ.get("ATTN_TILES"):
            ATTN_TILES = tuple(
                tuple(int(v) for v in t.split("x")) for t in os.environ["ATTN_TILES"].split()
            )
        # ATTN_SHAPES="1x256x1000 ..." (requests x beams x prompt tokens); ATTN_SPLITS="1 2 4"
        # times each tile at those fixed prompt-split counts instead of the engine's choice
        shapes = ATTN_SHAPES
        if os.environ.get("ATTN_SHAPES"):
            shapes = tuple(
                tuple(int(v) for v in s.split("x")) for s in os.environ["ATTN_SHAPES"].split()
            )
        forced = [int(x) for x in os.environ.get("ATTN_SPLITS", "").split()] or [None]
        # ATTN_DEC="first last": the split that folds in the decode keys (decode_split; unset:
        # the engine's, from FLASHREC_DECODE_SPLITS)
        decs = os.environ.get("ATTN_DEC", "").split() or [None]
        kvs = {"fp8": torch.float8_e4m3fn, "bf16": BF16}
        for kv in (kvs[k] for k in os.environ.get("ATTN_KV", "fp8 bf16").split()):
            for shape in shapes:
                for sp in forced:
                    for dec in decs:
                        _attn_sweep(*shape, kv, sp, dec)
        return
    for m in (64, 1600, 16384):
        _run(m)


if __name__ == "__main__":
    main()
