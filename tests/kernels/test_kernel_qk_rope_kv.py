"""q/k norm + NeoX RoPE + KV write: ref vs HF Qwen3 (norm, rotary, apply_rotary_pos_emb);
Triton vs ref."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    apply_rotary_pos_emb,
)

from flashrec.kernels.qk_rope_kv import (
    build_cos_sin,
    qk_norm_rope_store,
    qk_norm_rope_store_ref,
    qk_norm_rope_store_triton,
)

EPS = 1e-6
THETA = 1_000_000.0
MAX_POS = 4096
FP8 = torch.float8_e4m3fn


def _hf_rotary(head_dim: int) -> Qwen3RotaryEmbedding:
    cfg = Qwen3Config(
        hidden_size=4 * head_dim, num_attention_heads=4, num_key_value_heads=2,
        head_dim=head_dim, rope_theta=THETA, max_position_embeddings=MAX_POS,
    )  # fmt: skip
    return Qwen3RotaryEmbedding(cfg)


def _hf_norm(weight: torch.Tensor) -> Qwen3RMSNorm:
    norm = Qwen3RMSNorm(weight.numel(), eps=EPS).to(weight.dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm


def _inputs(t: int, hq: int, hkv: int, d: int, dtype: torch.dtype, pad: int = 0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    width = (hq + 2 * hkv) * d
    buf = (torch.randn(t, width + pad, generator=g) * 2).to(dtype)
    positions = torch.randint(0, MAX_POS, (t,), generator=g)
    qw = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype)
    kw = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype)
    return buf, width, positions, qw, kw


def test_build_cos_sin_matches_hf() -> None:
    d = 128
    table = build_cos_sin(MAX_POS, d, THETA)
    assert table.shape == (MAX_POS, d) and table.dtype == torch.float32
    pos = torch.tensor([[0, 1, 17, 1000, MAX_POS - 1]])
    cos, sin = _hf_rotary(d)(torch.zeros(1, 5, 8), pos)
    rows = table[pos[0]]
    torch.testing.assert_close(rows[:, : d // 2], cos[0, :, : d // 2], rtol=0, atol=0)
    torch.testing.assert_close(rows[:, d // 2 :], sin[0, :, : d // 2], rtol=0, atol=0)
    torch.testing.assert_close(cos[0, :, d // 2 :], cos[0, :, : d // 2])  # NeoX halves repeat


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_norm", [True, False])
@pytest.mark.parametrize("hq,hkv,d", [(16, 8, 128), (4, 2, 64)])
def test_ref_matches_hf(dtype: torch.dtype, with_norm: bool, hq: int, hkv: int, d: int) -> None:
    t = 11
    buf, width, positions, qw, kw = _inputs(t, hq, hkv, d, dtype)
    qkv = buf.clone()
    hf_q = buf[:, : hq * d].reshape(t, hq, d)
    hf_k = buf[:, hq * d : (hq + hkv) * d].reshape(t, hkv, d)
    with torch.no_grad():
        if with_norm:
            hf_q, hf_k = _hf_norm(qw)(hf_q), _hf_norm(kw)(hf_k)
        cos, sin = _hf_rotary(d)(buf[None], positions[None])
        # HF layout [batch, heads, seq, D]; cos/sin [batch, seq, D].
        hf_q, hf_k = apply_rotary_pos_emb(hf_q.transpose(0, 1)[None], hf_k.transpose(0, 1)[None],
                                          cos, sin)  # fmt: skip
    table = build_cos_sin(MAX_POS, d, THETA)
    q, k, v = qk_norm_rope_store_ref(
        qkv, hq, hkv, d, positions, table,
        qw if with_norm else None, kw if with_norm else None, EPS, None, None, None,
    )  # fmt: skip
    torch.testing.assert_close(q, hf_q[0].transpose(0, 1), rtol=0, atol=0)
    torch.testing.assert_close(k, hf_k[0].transpose(0, 1), rtol=0, atol=0)
    torch.testing.assert_close(v.reshape(t, -1), buf[:, (hq + hkv) * d :], rtol=0, atol=0)


def test_in_place_views_and_cache_write() -> None:
    hq, hkv, d, t, slots = 4, 2, 64, 6, 32
    buf, width, positions, qw, kw = _inputs(t, hq, hkv, d, torch.bfloat16, pad=24)
    qkv = buf[:, :width]  # row stride exceeds the width
    pad_before = buf[:, width:].clone()
    k_cache = torch.full((slots, hkv, d), 7.0, dtype=torch.bfloat16)
    v_cache = torch.full((slots, hkv, d), 7.0, dtype=torch.bfloat16)
    out_loc = torch.tensor([3, 9, 0, 31, 12, 5])
    table = build_cos_sin(MAX_POS, d, THETA)
    q, k, v = qk_norm_rope_store(
        qkv, hq, hkv, d, positions, table, qw, kw, EPS, k_cache, v_cache, out_loc
    )
    assert q.shape == (t, hq, d) and k.shape == (t, hkv, d) and v.shape == (t, hkv, d)
    assert q.data_ptr() == qkv.data_ptr()
    assert k.data_ptr() == qkv.data_ptr() + hq * d * qkv.element_size()
    torch.testing.assert_close(buf[:, width:], pad_before, rtol=0, atol=0)
    torch.testing.assert_close(k_cache[out_loc], k, rtol=0, atol=0)
    torch.testing.assert_close(v_cache[out_loc], v, rtol=0, atol=0)
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[out_loc] = False
    assert (k_cache[untouched] == 7).all() and (v_cache[untouched] == 7).all()


@pytest.mark.parametrize("how", ["skip_store", "no_out_loc"])
def test_no_store_leaves_cache_untouched(how: str) -> None:
    hq, hkv, d, t = 4, 2, 64, 3
    buf, width, positions, qw, kw = _inputs(t, hq, hkv, d, torch.bfloat16)
    k_cache = torch.zeros(8, hkv, d, dtype=torch.bfloat16)
    v_cache = torch.zeros(8, hkv, d, dtype=torch.bfloat16)
    out_loc = None if how == "no_out_loc" else torch.arange(t)
    qkv = buf.clone()
    qk_norm_rope_store(
        qkv, hq, hkv, d, positions, build_cos_sin(MAX_POS, d, THETA), qw, kw, EPS,
        k_cache, v_cache, out_loc, skip_store=how == "skip_store",
    )  # fmt: skip
    assert (k_cache == 0).all() and (v_cache == 0).all()
    assert not torch.equal(qkv, buf)  # q/k were still normalised and rotated


def test_fp8_cache_store() -> None:
    hq, hkv, d, t = 4, 2, 64, 5
    buf, width, positions, qw, kw = _inputs(t, hq, hkv, d, torch.bfloat16)
    buf[0, (hq + hkv) * d] = 1e4  # a v value beyond 448 * v_scale saturates, no NaN
    k_cache = torch.zeros(8, hkv, d, dtype=FP8)
    v_cache = torch.zeros(8, hkv, d, dtype=FP8)
    out_loc = torch.tensor([7, 1, 2, 3, 0])
    k_scale, v_scale = 0.05, 2.0
    q, k, v = qk_norm_rope_store(
        buf, hq, hkv, d, positions, build_cos_sin(MAX_POS, d, THETA), qw, kw, EPS,
        k_cache, v_cache, out_loc, k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip
    for cache, x, scale in ((k_cache, k, k_scale), (v_cache, v, v_scale)):
        stored = cache[out_loc]
        expected = (x.float() * (1.0 / scale)).clamp(-448, 448).to(FP8)
        torch.testing.assert_close(stored.float(), expected.float(), rtol=0, atol=0)
        assert torch.isfinite(stored.float()).all()
        deq, xf = stored.float() * scale, x.float().clamp(-448 * scale, 448 * scale)
        assert ((deq - xf).abs() <= xf.abs() * 2**-4 + scale * 2**-9).all()
    assert v_cache[7, 0, 0].float().item() == 448.0


SHAPES = [(16, 8, 128), (4, 2, 64), (3, 1, 96)]  # 96: HALF = 48 is not a power of two


@pytest.mark.parametrize("hq,hkv,d", SHAPES)
@pytest.mark.parametrize("t", [1, 7, 33, 300])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_norm", [True, False])
@pytest.mark.parametrize("cache", ["act", "fp8", "none"])
def test_triton_matches_ref(
    triton_backend, assert_act_close, assert_fp8_close, hq, hkv, d, t, dtype, with_norm, cache
) -> None:
    if triton_backend.device == "cpu" and (t > 7 or (t > 1 and hq > 4)):
        pytest.skip("large shape: GPU only")
    if triton_backend.device == "cuda" and dtype == torch.float16:
        pytest.skip("fp16 activations dispatch to the reference on GPU (see qk_norm_rope_store)")
    dev = triton_backend.device
    buf, width, positions, qw, kw = _inputs(t, hq, hkv, d, dtype, pad=8, seed=t + hq + d)
    buf, positions, qw, kw = buf.to(dev), positions.to(dev), qw.to(dev), kw.to(dev)
    if not with_norm:
        qw = kw = None
    slots = 2 * t + 3
    out_loc = torch.randperm(slots)[:t].to(dev)
    if t > 1:
        out_loc = out_loc.to(torch.int32)  # int32 indices work too
    table = build_cos_sin(MAX_POS, d, THETA, device=dev)
    cdt = {"act": dtype, "fp8": FP8, "none": dtype}[cache]
    k_scale, v_scale = (0.02, 0.5) if cache == "fp8" else (1.0, 1.0)
    results = []
    for fn in (qk_norm_rope_store_triton, qk_norm_rope_store_ref):
        b = buf.clone()
        kc = torch.zeros(slots, hkv, d, device=dev).to(cdt)
        vc = torch.zeros(slots, hkv, d, device=dev).to(cdt)
        q, k, v = fn(
            b[:, :width], hq, hkv, d, positions, table, qw, kw, EPS,
            None if cache == "none" else kc, None if cache == "none" else vc,
            out_loc, k_scale, v_scale,
        )  # fmt: skip
        assert q.data_ptr() == b.data_ptr()
        results.append((b, kc, vc))
    (b, kc, vc), (b_ref, kc_ref, vc_ref) = results
    frac = triton_backend.max_frac
    # q and k are rotated in place; v and the row padding must be untouched (exact).
    assert_act_close(b[:, : (hq + hkv) * d], b_ref[:, : (hq + hkv) * d], max_frac=frac)
    assert torch.equal(b[:, (hq + hkv) * d :], buf[:, (hq + hkv) * d :])
    if cache == "fp8":
        ks = torch.full((slots, hkv, 1), k_scale, device=dev)
        vs = torch.full((slots, hkv, 1), v_scale, device=dev)
        assert_fp8_close((kc, ks), (kc_ref, ks), max_frac=frac)
        assert_fp8_close((vc, vs), (vc_ref, vs), exact=True)
    else:
        assert_act_close(kc, kc_ref, max_frac=frac)
        assert_act_close(vc, vc_ref, exact=True)
        if cache == "none":
            assert (kc == 0).all() and (vc == 0).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_replays_in_cuda_graph(assert_act_close) -> None:
    hq, hkv, d, t = 16, 8, 128, 12
    buf, width, positions, qw, kw = _inputs(t, hq, hkv, d, torch.bfloat16)
    buf, positions, qw, kw = buf.cuda(), positions.cuda(), qw.cuda(), kw.cuda()
    table = build_cos_sin(MAX_POS, d, THETA, device="cuda")
    out_loc = torch.arange(t, device="cuda")

    def run(fn, qkv, kc, vc):
        return fn(qkv, hq, hkv, d, positions, table, qw, kw, EPS, kc, vc, out_loc)

    caches = [torch.zeros(t, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    run(qk_norm_rope_store_triton, buf.clone(), caches[0], caches[1])  # compile outside capture
    qkv = buf.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(qk_norm_rope_store_triton, qkv, caches[0], caches[1])
    qkv.copy_(buf)
    graph.replay()
    torch.cuda.synchronize()
    ref = buf.clone()
    run(qk_norm_rope_store_ref, ref, caches[2], caches[3])
    assert_act_close(qkv, ref)
    assert_act_close(caches[0], caches[2])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_round_kv_writes_the_stored_values_back(triton_backend, dtype) -> None:
    """round_kv with an e4m3 cache: k and v in the QKV row become the stored codes x scale
    (what a reader of the cache sees); q and the row padding stay as without it."""
    dev = triton_backend.device
    t, hq, hkv, d = 3, 4, 2, 64
    buf, width, positions, qw, kw = _inputs(t, hq, hkv, d, dtype, pad=8, seed=7)
    buf, positions, qw, kw = buf.to(dev), positions.to(dev), qw.to(dev), kw.to(dev)
    table = build_cos_sin(MAX_POS, d, THETA, device=dev)
    slots = 2 * t + 3
    out_loc = torch.randperm(slots)[:t].to(dev)
    k_scale, v_scale = 0.02, 0.5
    for fn in (qk_norm_rope_store_triton, qk_norm_rope_store_ref):
        plain, rounded = buf.clone(), buf.clone()
        caches = []
        for b, round_kv in ((plain, False), (rounded, True)):
            kc = torch.zeros(slots, hkv, d, device=dev).to(FP8)
            vc = torch.zeros(slots, hkv, d, device=dev).to(FP8)
            q, k, v = fn(
                b[:, :width], hq, hkv, d, positions, table, qw, kw, EPS, kc, vc, out_loc,
                k_scale, v_scale, round_kv=round_kv,
            )  # fmt: skip
            caches.append((kc, vc))
        (kc0, vc0), (kc1, vc1) = caches
        assert torch.equal(kc0.float(), kc1.float()) and torch.equal(vc0.float(), vc1.float())
        assert torch.equal(rounded[:, : hq * d], plain[:, : hq * d])  # q untouched
        assert torch.equal(rounded[:, width:], plain[:, width:])  # padding untouched
        k_want = (kc1[out_loc.long()].float() * k_scale).to(dtype)
        v_want = (vc1[out_loc.long()].float() * v_scale).to(dtype)
        assert torch.equal(k, k_want) and torch.equal(v, v_want)
        assert not torch.equal(rounded[:, hq * d : width], plain[:, hq * d : width])


@pytest.mark.parametrize("block_h,num_warps", [(1, 1), (2, 4), (4, 2), (8, 8), (16, 4), (8, 2)])
def test_launch_settings_compute_the_reference(
    triton_backend, assert_act_close, assert_fp8_close, block_h, num_warps
) -> None:
    """Heads per program and warps are launch settings (the tuning sweep of bench_kernels.py
    times them): at OneRec-1.7B's head shapes every setting matches the reference within the
    kernel's usual rounding tolerance, with an e4m3 cache and the stored values written back.
    Bit equality between settings is not promised: the per-head sums run in another order.
    A non-power-of-two is refused."""
    dev = triton_backend.device
    t, hq, hkv, d = 5, 16, 8, 128
    buf, width, positions, qw, kw = _inputs(t, hq, hkv, d, torch.bfloat16, pad=8, seed=11)
    buf, positions, qw, kw = buf.to(dev), positions.to(dev), qw.to(dev), kw.to(dev)
    table = build_cos_sin(MAX_POS, d, THETA, device=dev)
    slots = 2 * t + 1
    out_loc = torch.randperm(slots)[:t].to(dev)
    outs = []
    for fn, kw_launch in (
        (qk_norm_rope_store_ref, {}),
        (qk_norm_rope_store_triton, {"block_h": block_h, "num_warps": num_warps}),
    ):
        b = buf.clone()
        kc = torch.zeros(slots, hkv, d, device=dev).to(FP8)
        vc = torch.zeros(slots, hkv, d, device=dev).to(FP8)
        fn(
            b[:, :width], hq, hkv, d, positions, table, qw, kw, EPS, kc, vc, out_loc,
            0.05, 0.5, round_kv=True, **kw_launch,
        )  # fmt: skip
        outs.append((b, kc, vc))
    (b_ref, kc_ref, vc_ref), (b, kc, vc) = outs
    frac = triton_backend.max_frac
    assert_act_close(b[:, : hq * d], b_ref[:, : hq * d], max_frac=frac)  # q
    ks = torch.full((slots, hkv, 1), 0.05, device=dev)
    vs = torch.full((slots, hkv, 1), 0.5, device=dev)
    assert_fp8_close((kc, ks), (kc_ref, ks), max_frac=frac)
    assert_fp8_close((vc, vs), (vc_ref, vs), exact=True)  # v is copied, never normed
    assert torch.equal(b[:, width:], b_ref[:, width:])  # padding untouched
    with pytest.raises(ValueError, match="power of two"):
        qk_norm_rope_store_triton(
            buf[:, :width].clone(), hq, hkv, d, positions, table, qw, kw, EPS, None, None,
            None, block_h=3,
        )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("cache", ["bf16", "fp8", "none"])
@pytest.mark.parametrize("with_norm", [True, False])
def test_hardware_rounding_equals_the_emulated_rounding_bit_for_bit(cache, with_norm) -> None:
    """``hw_round`` (--qk-rope-rounding hardware): bf16 through the conversion instruction
    instead of integer emulation (e4m3 codes are rounded in integers either way). Both round to
    nearest even at the same steps, so every output bit must match: q, k (and with an e4m3
    cache the dequantized k / v written back), the cache codes, and the padding left alone. Inputs span ~20 binades, with values
    near bf16 ties and e4m3 saturation."""
    dev = "cuda"
    t, hq, hkv, d = 333, 16, 8, 128
    buf, width, positions, qw, kw = _inputs(t, hq, hkv, d, torch.bfloat16, pad=8, seed=5)
    g = torch.Generator().manual_seed(6)
    scale = torch.exp2(torch.randint(-10, 10, (t, 1), generator=g).float())
    buf = (buf.float() * scale).to(torch.bfloat16)  # rows from ~1e-3 to ~1e3
    buf, positions = buf.to(dev), positions.to(dev)
    qw, kw = (qw.to(dev), kw.to(dev)) if with_norm else (None, None)
    table = build_cos_sin(MAX_POS, d, THETA, device=dev)
    slots = t + 17
    out_loc = torch.randperm(slots)[:t].to(dev)
    outs = []
    for hw in (False, True):
        b = buf.clone()
        if cache == "none":
            kc = vc = loc = None
        else:
            dtype = FP8 if cache == "fp8" else torch.bfloat16
            kc = torch.zeros(slots, hkv, d, device=dev).to(dtype)
            vc = torch.zeros(slots, hkv, d, device=dev).to(dtype)
            loc = out_loc
        qk_norm_rope_store_triton(
            b[:, :width], hq, hkv, d, positions, table, qw, kw, EPS, kc, vc, loc,
            0.05, 0.5, round_kv=cache == "fp8", hw_round=hw,
        )  # fmt: skip
        outs.append(
            [b.view(torch.int16)] + [c.view(torch.uint8) for c in (kc, vc) if c is not None]
        )
    for name, a, b in zip(("qkv row", "k cache", "v cache"), *outs):
        assert torch.equal(a, b), _bits_differ(name, a, b)
    assert not torch.equal(outs[0][0], buf.view(torch.int16))  # the kernel did run


def _bits_differ(name: str, a: torch.Tensor, b: torch.Tensor) -> str:
    """Where two bit patterns differ: how many elements, and the first few (index, bits)."""
    where, mask = (a != b).nonzero(), (1 << (8 * a.element_size())) - 1
    first = [
        (tuple(i.tolist()), hex(int(a[tuple(i)]) & mask), hex(int(b[tuple(i)]) & mask))
        for i in where[:6]
    ]
    return f"{name}: {len(where)} of {a.numel()} differ; first (index, emulated, hardware): {first}"


def test_hardware_rounding_is_refused_by_the_interpreter(triton_backend) -> None:
    """The CPU interpreter runs no inline PTX: asking it for ``hw_round`` is an error, and the
    dispatcher (what the engine calls) falls back to the emulated rounding there."""
    if triton_backend.device == "cuda":
        pytest.skip("the GPU runs the inline PTX")
    t, hq, hkv, d = 3, 4, 2, 64
    buf, width, positions, qw, kw = _inputs(t, hq, hkv, d, torch.bfloat16)
    table = build_cos_sin(MAX_POS, d, THETA)
    with pytest.raises(ValueError, match="hw_round needs a GPU"):
        qk_norm_rope_store_triton(
            buf[:, :width].clone(), hq, hkv, d, positions, table, qw, kw, EPS, None, None, None,
            hw_round=True,
        )  # fmt: skip
    a, b = buf[:, :width].clone(), buf[:, :width].clone()
    qk_norm_rope_store(a, hq, hkv, d, positions, table, qw, kw, EPS, None, None, None)
    qk_norm_rope_store(b, hq, hkv, d, positions, table, qw, kw, EPS, None, None, None,
                       hw_round=True)  # fmt: skip
    assert torch.equal(a, b)
