"""Attention backends behind one interface, and the per-forward metadata they read.

Prefill: new tokens of several prompts (concatenated, no padding) attend causally to their
cached prefix plus themselves; K/V go to the prompt pool at ``out_loc``.

Decode (beam rows): each request's rows attend to (a) the request's prompt KV, read once for
all of its beams, and (b) each row's own decode KV (at most ``depth`` tokens). The two parts
are merged exactly (one softmax over the concatenated scores in the torch backend; a
log-sum-exp merge in fused backends).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from flashrec.kvcache.pool import KVCache


@dataclass
class PrefillMeta:
    positions: torch.Tensor  # [T]
    out_loc: torch.Tensor  # [T] pool slots of the new tokens
    seq_slots: list[torch.Tensor]  # per sequence: all its prompt slots (prefix + new), in order
    new_lens: list[int]
    prefix_lens: list[int]
    last_index: torch.Tensor  # [B] index in T of each sequence's last token
    input_ids: torch.Tensor | None = None  # [T] the new tokens (same host->device copy)

    mode: str = field(default="prefill", init=False)
    # set by the fused q/k norm + RoPE + KV-write kernel when it wrote the FP8-stored k/v back
    # into the QKV row (dequantized): k/v then equal what the pool holds
    kv_rounded: bool = field(default=False, init=False)


@dataclass
class DecodeGroup:
    """Rows [start, end) of the decode batch belong to one request."""

    start: int
    end: int
    prompt_slots: torch.Tensor  # [L]
    step: int  # decode position written this forward (0-based); keys are positions <= step


@dataclass
class PackedDecode:
    """Device-side metadata for fused decode kernels (int32, CUDA-graph friendly)."""

    slots: torch.Tensor  # [S] every request's prompt slots, concatenated
    row_start: torch.Tensor  # [B] first batch row of each request
    n: torch.Tensor  # [B] beams of each request
    slot_start: torch.Tensor  # [B] offset of each request's slots in ``slots``
    length: torch.Tensor  # [B] prompt length
    step: torch.Tensor  # [B] decode position written this forward
    work: torch.Tensor  # [W, 3] (request, query block, prompt split); request -1 = idle
    ctrl: torch.Tensor  # [2] (prompt splits, work items) of this forward
    splits: int | None = 1  # host copy of ctrl[0]; None = unknown (inside a graph capture)


@dataclass
class DecodeMeta:
    positions: torch.Tensor  # [R]
    rows: torch.Tensor  # [R] decode-buffer row of each batch row
    out_loc: torch.Tensor  # [R] rows * depth + step
    groups: list[DecodeGroup]
    packed: PackedDecode | None = None
    # host copies (numpy) of each request's beam count, prompt length and the prompt slots
    # concatenated: what a backend that plans on the host (FlashInfer) takes
    host: tuple | None = None

    mode: str = field(default="decode", init=False)


class AttentionBackend:
    """Interface: ``forward(q [T,Hq,D], k [T,Hkv,D], v, layer_id, meta, skip_store) -> [T,Hq*D]``."""

    def __init__(self, kv: KVCache, num_q_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.kv = kv
        self.hq, self.hkv, self.d = num_q_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5

    def setup_decode_graph(self, max_rows: int, max_slots: int, dtype: torch.dtype) -> None:
        """Called once before the decode graphs are captured (buckets up to ``max_rows`` rows,
        up to ``max_slots`` prompt slots): a backend that plans on the host sets up here."""

    def decode_graph_fits(self, meta) -> bool:
        """Whether a decode graph may replay ``meta``'s batch (False: the runner runs it
        eagerly); every batch whose rows fit a bucket, unless a backend says otherwise."""
        return True

    def plan_decode_graph(self, meta, size: int) -> None:
        """Called before a decode graph of ``size`` rows is captured or replayed with
        ``meta``'s batch (its ``host`` arrays): a backend that plans on the host plans here."""

    def store(self, k, v, layer_id: int, meta) -> None:
        if meta.mode == "prefill":
            self.kv.k[layer_id][meta.out_loc] = k.to(self.kv.dtype)
            self.kv.v[layer_id][meta.out_loc] = v.to(self.kv.dtype)
        else:
            self.kv.dk[layer_id][meta.out_loc] = k.to(self.kv.dtype)
            self.kv.dv[layer_id][meta.out_loc] = v.to(self.kv.dtype)

    def forward(
        self, q, k, v, layer_id: int, meta, skip_store: bool = False, out=None
    ) -> torch.Tensor:
        """``out`` ([T, Hq*D], prefill only): where the output may go; a backend that can
        write it there does and returns ``out``, the others return a tensor of their own."""
        if not skip_store:
            self.store(k, v, layer_id, meta)
        if meta.mode == "prefill":
            return self.prefill(q, k, v, layer_id, meta, out=out)
        return self.decode(q, layer_id, meta)

    needs_packed = False  # whether decode reads ``DecodeMeta.packed``

    def takes_strided_q(self, meta) -> bool:
        """Whether this forward takes q as the row-strided view into the QKV output (no copy).
        The SDPA prefill does: SDPA reads q head-major through a view of those rows
        (``_sdpa``), so a contiguous copy before it would be a copy for nothing."""
        return meta.mode == "prefill"

    def prefill(self, q, k, v, layer_id, meta: PrefillMeta, out=None):
        """Causal attention of each prompt's new tokens over its cached prefix + itself, no
        padding. Sequences without a cached prefix and of equal length go through one batched
        SDPA call; others one call each. SDPA takes head-major views of the token rows and
        shares each kv head among its q heads itself (``_sdpa``): no copies in or out when
        every sequence is new and of one length."""
        kp, vp = self.kv.k[layer_id], self.kv.v[layer_id]
        if self.kv.dtype != q.dtype and not meta.kv_rounded:
            # quantized KV (fp8): attend to the stored values, exactly what a later request
            # that hits this prompt in the radix cache will read (cold == warm); the fused
            # GPU kernel hands them back in the QKV row instead (``kv_rounded``)
            k, v = kp[meta.out_loc].to(q.dtype), vp[meta.out_loc].to(q.dtype)
        if len(set(meta.new_lens)) == 1 and not any(meta.prefix_lens):
            # every sequence new and of one length (a prefill graph's bucket, one prompt or
            # several): one SDPA call over views of the rows, its output read in place
            b, n_new = len(meta.new_lens), meta.new_lens[0]
            o = self._sdpa(
                q.view(b, n_new, self.hq, self.d),
                k.view(b, n_new, self.hkv, self.d),
                v.view(b, n_new, self.hkv, self.d),
                None,
            )
            return o.transpose(1, 2).reshape(b * n_new, self.hq * self.d)
        out = torch.empty(q.shape[0], self.hq * self.d, dtype=q.dtype, device=q.device)
        offs, off = [], 0
        for n_new in meta.new_lens:
            offs.append(off)
            off += n_new
        plain: dict[int, list[int]] = {}
        for i, (n_new, n_pre) in enumerate(zip(meta.new_lens, meta.prefix_lens)):
            if n_pre == 0:
                plain.setdefault(n_new, []).append(i)
                continue
            o = self._one(q, k, v, offs[i], n_new, meta.seq_slots[i][:n_pre], kp, vp)
            _write_heads(out[offs[i] : offs[i] + n_new], o[0])
        for n_new, idx in plain.items():
            sel = (
                torch.cat([torch.arange(offs[i], offs[i] + n_new, device=q.device) for i in idx])
                if len(idx) > 1
                else None
            )
            qs, ks, vs = (
                x[sel] if sel is not None else x[offs[idx[0]] : offs[idx[0]] + n_new]
                for x in (q, k, v)
            )
            b = len(idx)
            o = self._sdpa(
                qs.view(b, n_new, self.hq, self.d),
                ks.view(b, n_new, self.hkv, self.d),
                vs.view(b, n_new, self.hkv, self.d),
                None,
            )
            if sel is None:  # one copy, straight from SDPA's head-major output
                _write_heads(out[offs[idx[0]] : offs[idx[0]] + n_new], o[0])
            else:
                out[sel] = o.transpose(1, 2).reshape(b * n_new, -1)
        return out

    def _one(self, q, k, v, off, n_new, prefix_slots, kp, vp):
        n_pre = prefix_slots.shape[0]
        ks = torch.cat([kp[prefix_slots].to(q.dtype), k[off : off + n_new]], 0)
        vs = torch.cat([vp[prefix_slots].to(q.dtype), v[off : off + n_new]], 0)
        # causal, aligned to the bottom right (query i sees keys 0..n_pre+i): as a CausalBias
        # SDPA keeps its fused flash / efficient kernels; a boolean mask would force the
        # slower masked kernels
        mask = causal_lower_right(n_new, n_pre + n_new)
        return self._sdpa(q[off : off + n_new][None], ks[None], vs[None], mask)

    def _sdpa(self, q, k, v, mask):
        """q [B, Lq, Hq, D], k/v [B, Lk, Hkv, D] -> [B, Hq, Lq, D]; causal (lower right).

        The inputs go in as head-major views of their token rows (strided, no copies) and the
        kv heads are shared by their q heads inside the kernel (``enable_gqa``), not repeated.
        cuDNN, flash and efficient all take these views and return the output token-major, so
        ``o.transpose(1, 2)`` is contiguous and the caller reads it without a copy: no copy
        kernel per layer for q, k/v or the output."""
        g = self.hq // self.hkv
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        kw = {"is_causal": True} if mask is None else {"attn_mask": mask}
        if g > 1:
            kw["enable_gqa"] = True
        with _sdpa_backends(qh):
            return F.scaled_dot_product_attention(qh, kh, vh, scale=self.scale, **kw)

    def decode(self, q, layer_id: int, meta: DecodeMeta) -> torch.Tensor:
        raise NotImplementedError


def _write_heads(dst: torch.Tensor, o: torch.Tensor) -> None:
    """``dst [L, H*D]`` (contiguous rows of the output) <- ``o [H, L, D]``: one copy, where a
    reshape of the transposed view and an assignment would make two."""
    h, n, d = o.shape
    dst.view(n, h, d).copy_(o.transpose(0, 1))


# SDPA without cuDNN: cuDNN builds an execution plan (tens of milliseconds) for every new
# sequence length, which an eager prefill of arbitrary prompt lengths pays per length. Flash /
# efficient have no such cost. The prefill graphs' buckets (one fixed shape each, warmed up
# eagerly and then captured) keep cuDNN, faster than flash there: they run inside
# ``fixed_shape_sdpa()``. Both the warm-up
# and the capture must run inside it: cuDNN cannot build its plan during a capture.
_EAGER_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
_fixed_shape = threading.local()


@contextlib.contextmanager
def fixed_shape_sdpa():
    """SDPA may use cuDNN inside (a prefill-graph bucket: one shape, plan built once)."""
    old = getattr(_fixed_shape, "on", False)
    _fixed_shape.on = True
    try:
        yield
    finally:
        _fixed_shape.on = old


def _sdpa_backends(q: torch.Tensor):
    """SDPA's backend choice for ``q``: on CUDA no cuDNN, except inside ``fixed_shape_sdpa``;
    on CPU, SDPA's own choice."""
    if q.is_cuda and not getattr(_fixed_shape, "on", False):
        return sdpa_kernel(_EAGER_SDPA)
    return contextlib.nullcontext()


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None
) -> torch.Tensor:
    """q [Hkv, G, M, D] (G = q heads per kv head), k/v [Hkv, N, D] -> [M, Hkv*G*D]."""
    s = torch.matmul(q, k.unsqueeze(1).transpose(-1, -2)) * scale  # [Hkv, G, M, N]
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(v.dtype)
    o = torch.matmul(p, v.unsqueeze(1))  # [Hkv, G, M, D]
    m = q.shape[2]
    return o.permute(2, 0, 1, 3).reshape(m, -1)


class TorchAttention(AttentionBackend):
    """Plain PyTorch decode (CPU path and reference): loops over requests; prefill is the
    base class's SDPA path (checked against ``prefill_reference``)."""

    def _split_q(self, q: torch.Tensor) -> torch.Tensor:
        # [M, Hq, D] -> [Hkv, G, M, D]; q head h uses kv head h // G (HF repeat_kv order)
        m = q.shape[0]
        g = self.hq // self.hkv
        return q.view(m, self.hkv, g, self.d).permute(1, 2, 0, 3)

    def decode(self, q, layer_id, meta: DecodeMeta):
        kp, vp = self.kv.k[layer_id], self.kv.v[layer_id]
        depth = self.kv.depth
        dk = self.kv.dk[layer_id].view(-1, depth, self.hkv, self.d)
        dv = self.kv.dv[layer_id].view(-1, depth, self.hkv, self.d)
        out = torch.empty(q.shape[0], self.hq * self.d, dtype=q.dtype, device=q.device)
        g = self.hq // self.hkv
        for grp in meta.groups:
            n = grp.end - grp.start
            qs = self._split_q(q[grp.start : grp.end])  # [Hkv, G, n, D]
            kpr = (
                kp[grp.prompt_slots].to(q.dtype).transpose(0, 1)
            )  # [Hkv, L, D] shared by all beams
            vpr = vp[grp.prompt_slots].to(q.dtype).transpose(0, 1)
            s_prompt = torch.matmul(qs, kpr.unsqueeze(1).transpose(-1, -2))  # [Hkv, G, n, L]
            rows = meta.rows[grp.start : grp.end]
            ks = dk[rows, : grp.step + 1].to(q.dtype)  # [n, t, Hkv, D]
            vs = dv[rows, : grp.step + 1].to(q.dtype)
            # suffix scores: row i's q against row i's own keys -> [Hkv, G, n, t]
            s_suffix = torch.einsum("hgnd,nthd->hgnt", qs, ks)
            s = torch.cat([s_prompt, s_suffix], dim=-1) * self.scale
            p = torch.softmax(s.float(), dim=-1).to(q.dtype)
            L = kpr.shape[1]
            o = torch.matmul(p[..., :L], vpr.unsqueeze(1)) + torch.einsum(
                "hgnt,nthd->hgnd", p[..., L:], vs
            )
            out[grp.start : grp.end] = o.permute(2, 0, 1, 3).reshape(n, g * self.hkv * self.d)
        return out


def prefill_reference(backend: TorchAttention, q, layer_id: int, meta: PrefillMeta) -> torch.Tensor:
    """Explicit-softmax prefill over the pool (the math every prefill path must equal)."""
    kp, vp = backend.kv.k[layer_id], backend.kv.v[layer_id]
    outs, off = [], 0
    for slots, n_new, n_pre in zip(meta.seq_slots, meta.new_lens, meta.prefix_lens):
        qs = backend._split_q(q[off : off + n_new])  # noqa: SLF001
        k = kp[slots].to(q.dtype).transpose(0, 1)  # [Hkv, L, D]
        v = vp[slots].to(q.dtype).transpose(0, 1)
        total = n_pre + n_new
        qpos = torch.arange(n_pre, total, device=q.device)
        mask = torch.arange(total, device=q.device)[None, :] <= qpos[:, None]
        outs.append(_attend(qs, k, v, backend.scale, mask))
        off += n_new
    return torch.cat(outs, dim=0)


ATTENTION_BACKENDS: dict[str, str] = {
    "torch": "flashrec.layers.attention:TorchAttention",
    "triton": "flashrec.layers.attention_gpu:TritonAttention",
    "flashinfer": "flashrec.layers.attention_flashinfer:FlashInferAttention",
}


def create_backend(name: str, *args, **kwargs) -> AttentionBackend:
    import importlib

    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; known: {sorted(ATTENTION_BACKENDS)}")
    mod, cls = ATTENTION_BACKENDS[name].split(":")
    return getattr(importlib.import_module(mod), cls)(*args, **kwargs)
