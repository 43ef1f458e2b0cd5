"""GPU attention backend.

Prefill: per sequence, SDPA (flash / cuDNN picked by torch) over exactly that sequence's
keys: no padding to the longest prompt. Without a cached prefix the fresh K/V are used
directly; with one, the prefix is gathered from the pool and the mask is causal aligned to
the lower right.

Decode: ``flashrec.kernels.beam_attention`` reads each request's prompt KV once per kv head
for all of its beams and merges each beam's own decode KV in the same online softmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flashrec.kernels.beam_attention import beam_decode_attention_triton
from flashrec.layers.attention import AttentionBackend, DecodeMeta, PrefillMeta


class TritonAttention(AttentionBackend):
    needs_packed = True

    def prefill(self, q, k, v, layer_id, meta: PrefillMeta):
        """Sequences without a cached prefix and of equal length go through one batched SDPA
        call; others one call each. Inputs are made contiguous [B, H, L, D] (SDPA's fast
        cuDNN / flash kernels want that layout) and kv heads are repeated for GQA."""
        kp, vp = self.kv.k[layer_id], self.kv.v[layer_id]
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
            out[offs[i] : offs[i] + n_new] = o
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
            o = o.reshape(b * n_new, -1)
            if sel is None:
                out[offs[idx[0]] : offs[idx[0]] + n_new] = o
            else:
                out[sel] = o
        return out

    def _one(self, q, k, v, off, n_new, prefix_slots, kp, vp):
        n_pre = prefix_slots.shape[0]
        ks = torch.cat([kp[prefix_slots].to(q.dtype), k[off : off + n_new]], 0)
        vs = torch.cat([vp[prefix_slots].to(q.dtype), v[off : off + n_new]], 0)
        total = n_pre + n_new
        qpos = torch.arange(n_pre, total, device=q.device)
        mask = torch.arange(total, device=q.device)[None, :] <= qpos[:, None]
        o = self._sdpa(q[off : off + n_new][None], ks[None], vs[None], mask)
        return o.reshape(n_new, -1)

    def _sdpa(self, q, k, v, mask):
        """q [B, Lq, Hq, D], k/v [B, Lk, Hkv, D] -> [B, Lq, Hq, D]; causal (lower right)."""
        g = self.hq // self.hkv
        qh = q.transpose(1, 2).contiguous()
        kh = k.transpose(1, 2)
        vh = v.transpose(1, 2)
        if g > 1:
            kh = kh.repeat_interleave(g, dim=1)
            vh = vh.repeat_interleave(g, dim=1)
        kh, vh = kh.contiguous(), vh.contiguous()
        if mask is None:
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=self.scale)
        else:
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=self.scale)
        return o.transpose(1, 2)

    def decode(self, q, layer_id, meta: DecodeMeta):
        pk = meta.packed
        out = beam_decode_attention_triton(
            q,
            self.kv.k[layer_id],
            self.kv.v[layer_id],
            pk.slots,
            pk.work,
            pk.row_start,
            pk.n,
            pk.slot_start,
            pk.length,
            pk.step,
            self.kv.dk[layer_id],
            self.kv.dv[layer_id],
            meta.rows,
            self.kv.depth,
            self.scale,
        )
        return out.view(q.shape[0], self.hq * self.d)
