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
        kp, vp = self.kv.k[layer_id], self.kv.v[layer_id]
        g = self.hq // self.hkv
        out = torch.empty(q.shape[0], self.hq * self.d, dtype=q.dtype, device=q.device)
        off = 0
        for slots, n_new, n_pre in zip(meta.seq_slots, meta.new_lens, meta.prefix_lens):
            qs = q[off : off + n_new].transpose(0, 1).unsqueeze(0)
            ks, vs = k[off : off + n_new], v[off : off + n_new]
            if n_pre:
                pre = slots[:n_pre]
                ks = torch.cat([kp[pre].to(q.dtype), ks], 0)
                vs = torch.cat([vp[pre].to(q.dtype), vs], 0)
            ks = ks.transpose(0, 1).unsqueeze(0)
            vs = vs.transpose(0, 1).unsqueeze(0)
            if g > 1:
                ks = ks.repeat_interleave(g, dim=1)
                vs = vs.repeat_interleave(g, dim=1)
            if n_pre:
                total = n_pre + n_new
                qpos = torch.arange(n_pre, total, device=q.device)
                mask = torch.arange(total, device=q.device)[None, :] <= qpos[:, None]
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=self.scale)
            else:
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=self.scale)
            out[off : off + n_new] = o[0].transpose(0, 1).reshape(n_new, -1)
            off += n_new
        return out

    def decode(self, q, layer_id, meta: DecodeMeta):
        pk = meta.packed
        out = beam_decode_attention_triton(
            q, self.kv.k[layer_id], self.kv.v[layer_id], pk.slots, pk.work, pk.row_start, pk.n,
            pk.slot_start, pk.length, pk.step, self.kv.dk[layer_id], self.kv.dv[layer_id],
            meta.rows, self.kv.depth, self.scale)
        return out.view(q.shape[0], self.hq * self.d)
