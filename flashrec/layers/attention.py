"""Attention backends behind one interface, and the per-forward metadata they read.

Prefill: new tokens of several prompts (concatenated, no padding) attend causally to their
cached prefix plus themselves; K/V go to the prompt pool at ``out_loc``.

Decode (beam rows): each request's rows attend to (a) the request's prompt KV, read once for
all of its beams, and (b) each row's own decode KV (at most ``depth`` tokens). The two parts
are merged exactly (one softmax over the concatenated scores in the torch backend; a
log-sum-exp merge in fused backends).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from flashrec.engine.kv import KVCache


@dataclass
class PrefillMeta:
    positions: torch.Tensor  # [T]
    out_loc: torch.Tensor  # [T] pool slots of the new tokens
    seq_slots: list[torch.Tensor]  # per sequence: all its prompt slots (prefix + new), in order
    new_lens: list[int]
    prefix_lens: list[int]
    last_index: torch.Tensor  # [B] index in T of each sequence's last token

    mode: str = field(default="prefill", init=False)


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
    work: torch.Tensor  # [W, 2] (request, query block); request -1 = idle


@dataclass
class DecodeMeta:
    positions: torch.Tensor  # [R]
    rows: torch.Tensor  # [R] decode-buffer row of each batch row
    out_loc: torch.Tensor  # [R] rows * depth + step
    groups: list[DecodeGroup]
    packed: PackedDecode | None = None

    mode: str = field(default="decode", init=False)


class AttentionBackend:
    """Interface: ``forward(q [T,Hq,D], k [T,Hkv,D], v, layer_id, meta, skip_store) -> [T,Hq*D]``."""

    def __init__(self, kv: KVCache, num_q_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.kv = kv
        self.hq, self.hkv, self.d = num_q_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5

    def store(self, k, v, layer_id: int, meta) -> None:
        if meta.mode == "prefill":
            self.kv.k[layer_id][meta.out_loc] = k.to(self.kv.dtype)
            self.kv.v[layer_id][meta.out_loc] = v.to(self.kv.dtype)
        else:
            self.kv.dk[layer_id][meta.out_loc] = k.to(self.kv.dtype)
            self.kv.dv[layer_id][meta.out_loc] = v.to(self.kv.dtype)

    def forward(self, q, k, v, layer_id: int, meta, skip_store: bool = False) -> torch.Tensor:
        if not skip_store:
            self.store(k, v, layer_id, meta)
        if meta.mode == "prefill":
            return self.prefill(q, k, v, layer_id, meta)
        return self.decode(q, layer_id, meta)

    needs_packed = False  # whether decode reads ``DecodeMeta.packed``

    def prefill(self, q, k, v, layer_id: int, meta: PrefillMeta) -> torch.Tensor:
        raise NotImplementedError

    def decode(self, q, layer_id: int, meta: DecodeMeta) -> torch.Tensor:
        raise NotImplementedError


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
    """Plain PyTorch reference (CPU path): loops over sequences / requests."""

    def _split_q(self, q: torch.Tensor) -> torch.Tensor:
        # [M, Hq, D] -> [Hkv, G, M, D]; q head h uses kv head h // G (HF repeat_kv order)
        m = q.shape[0]
        g = self.hq // self.hkv
        return q.view(m, self.hkv, g, self.d).permute(1, 2, 0, 3)

    def prefill(self, q, k, v, layer_id, meta: PrefillMeta):
        kp, vp = self.kv.k[layer_id], self.kv.v[layer_id]
        outs, off = [], 0
        for slots, n_new, n_pre in zip(meta.seq_slots, meta.new_lens, meta.prefix_lens):
            qs = self._split_q(q[off : off + n_new])
            k = kp[slots].to(q.dtype).transpose(0, 1)  # [Hkv, L, D]
            v = vp[slots].to(q.dtype).transpose(0, 1)
            total = n_pre + n_new
            qpos = torch.arange(n_pre, total, device=q.device)
            mask = torch.arange(total, device=q.device)[None, :] <= qpos[:, None]
            outs.append(_attend(qs, k, v, self.scale, mask))
            off += n_new
        return torch.cat(outs, dim=0)

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


ATTENTION_BACKENDS: dict[str, str] = {
    "torch": "flashrec.layers.attention:TorchAttention",
    "triton": "flashrec.layers.attention_gpu:TritonAttention",
}


def create_backend(name: str, *args, **kwargs) -> AttentionBackend:
    import importlib

    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; known: {sorted(ATTENTION_BACKENDS)}")
    mod, cls = ATTENTION_BACKENDS[name].split(":")
    return getattr(importlib.import_module(mod), cls)(*args, **kwargs)
