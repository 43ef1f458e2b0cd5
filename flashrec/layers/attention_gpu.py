"""GPU attention backend: prefill as in the base class (SDPA, flash / cuDNN on the GPU);
decode through ``flashrec.kernels.beam_attention``, which reads each request's prompt KV once
per kv head for all of its beams and merges each beam's own decode KV in the same online
softmax.
"""

from __future__ import annotations

import torch

from flashrec.kernels.beam_attention import (
    SPLIT_MAX_ROWS,
    alloc_partials,
    beam_decode_attention_triton,
)
from flashrec.layers.attention import AttentionBackend, DecodeMeta


class TritonAttention(AttentionBackend):
    needs_packed = True
    _partials = None
    _sms = None

    def takes_strided_q(self, meta) -> bool:
        """Decode too: the beam kernel reads q through its row and head strides, so q stays
        the view into the QKV output (a contiguous copy would be a kernel and a graph node per
        layer); prefill as the base class."""
        return meta.mode == "decode" or super().takes_strided_q(meta)

    def decode(self, q, layer_id, meta: DecodeMeta):
        pk = meta.packed
        if self._partials is None:  # split-K scratch, shared by every layer and forward
            self._partials = alloc_partials(SPLIT_MAX_ROWS, self.hq, self.d, q.device)
            self._sms = torch.cuda.get_device_properties(q.device).multi_processor_count
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
            ctrl=pk.ctrl,
            partials=self._partials,
            sms=self._sms,
            splits=pk.splits,
        )
        return out.view(q.shape[0], self.hq * self.d)
