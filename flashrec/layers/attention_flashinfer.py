"""FlashInfer attention backend (GPU): prefill through FlashInfer's ragged-KV batch prefill
kernel (``BatchPrefillWithRaggedKVCacheWrapper``; the ``fa3`` kernels on Hopper, ``fa2``
elsewhere), decode through FlashRec's shared-prompt Triton beam kernel (inherited from
``TritonAttention``).

Why this split (measured: ``docs/baselines.md``):
- prefill: the ragged kernel takes every prompt of a batch in ONE call without padding,
  handles GQA natively (no repeated K/V copies) and runs at the cuDNN SDPA rate; the SDPA
  path of the base class needs one call per distinct prompt length.
- decode: the prompt part of beam decode is a dense (beams x prompt) product per request;
  FlashInfer's cascade wrapper is several times slower than the dense form there, which the
  Triton kernel implements with the per-beam suffix merged in the same online softmax.

Prompts with a cached prefix (radix hits) attend to the prefix + their new tokens: the K/V of
those sequences are gathered from the pool (the prefix is already there, the new tokens were
just stored), and FlashInfer's causal mask is aligned to the bottom right, so query i of a
sequence with P cached tokens sees keys 0..P+i. With an FP8 KV cache every sequence reads the
stored (quantized) K/V, dequantized to the activation dtype: a warm radix hit and a cold
prefill attend to the same values. A cold prefill gets them without touching the pool: the
fused q/k norm + RoPE + KV-write kernel writes the stored values back into the QKV row
(``PrefillMeta.kv_rounded``), and q, k, v go in as row-strided views of that row.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from flashrec.layers.attention import PrefillMeta
from flashrec.layers.attention_gpu import TritonAttention

log = logging.getLogger("flashrec")

SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
WORKSPACE_BYTES = 256 << 20
PLAN_RING = 3  # wrappers planned in turn, one per prefill forward (see PlanRing)
# --decode-prompt-attention flashinfer: narrower decode batches keep the Triton kernel, which
# is faster there (one request of 256 beams over 1,000 tokens: docs/baselines.md)
PAGED_DECODE_MIN_ROWS = 512


def stages_prompt_kv(kv_dtype: torch.dtype) -> bool:
    """Whether the FlashInfer decode path copies a batch's prompt rows out of the pool as
    bfloat16 before attending (its prefill kernel reads bf16 K/V; an FP8 pool is not that): the
    staging buffer an auto-sized pool leaves room for (``attention_choice``)."""
    return kv_dtype != torch.bfloat16


class PlanRing:
    """Prefill wrappers used in turn, one per forward, each reused only after the GPU has run
    past the plan it holds.

    A FlashInfer wrapper's ``plan()`` writes the schedule into a page-locked host buffer of its
    own and queues an asynchronous copy of it to the device: the copy reads that buffer when
    the stream reaches it, not when it is queued. The engine's host runs ahead of the GPU
    (results are overlapped, nothing syncs per step), so a second ``plan()`` on the same wrapper
    can rewrite the buffer before the first forward's copy has run: that forward then runs with
    the next forward's lengths and offsets, reading and writing out of bounds (the suspected
    cause of the served n=512 FP8 crashes in docs/baselines.md, where requests prefill in
    consecutive steps; the same race is described for other engines that plan FlashInfer
    ahead of the GPU).

    Here each wrapper's ``plan()`` is followed by an event on the stream, and a wrapper is
    planned again only after its event has passed: a host wait that costs nothing unless the
    host is ``size`` forwards ahead of the GPU. ``make`` builds a wrapper, ``event`` an event
    (``torch.cuda.Event``; tests pass fakes)."""

    def __init__(self, make, event, size: int = PLAN_RING) -> None:
        if size < 1:
            raise ValueError(f"PlanRing needs at least one wrapper, got {size}")
        self._wrappers = [make() for _ in range(size)]
        self._events = [event() for _ in range(size)]
        self._planned = [False] * size
        self._i = size - 1
        self.waits = 0  # plans that found their wrapper's previous plan still queued

    @property
    def current(self):
        """The wrapper the last ``plan`` went to (the one the forward's layers run)."""
        return self._wrappers[self._i]

    def plan(self, *args, **kwargs) -> None:
        """Plan the next wrapper, after the GPU has consumed what it held."""
        i = (self._i + 1) % len(self._wrappers)
        ev = self._events[i]
        if self._planned[i] and not ev.query():
            self.waits += 1
            ev.synchronize()
        self._wrappers[i].plan(*args, **kwargs)
        ev.record()  # after plan's copy on the current stream
        self._planned[i] = True
        self._i = i


def unsupported_reason(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why the FlashInfer backend cannot run this model here (None: it can)."""
    if device.type != "cuda":
        return "it needs a CUDA device"
    try:
        import flashinfer  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - ImportError or a broken install
        return f"flashinfer is not importable ({type(exc).__name__}: {exc})"
    if dtype not in SUPPORTED_DTYPES:
        return f"its kernels take bfloat16 / float16 activations, not {dtype}"
    if head_dim not in SUPPORTED_HEAD_DIMS:
        return f"head_dim {head_dim} is not one of {SUPPORTED_HEAD_DIMS}"
    return None


class FlashInferAttention(TritonAttention):
    _dec_graph = None  # (PlanRing of one graph-mode wrapper, its batch size) once set up
    paged_plans = 0  # decode forwards planned for the paged prompt part (tests read it)

    def __init__(
        self, kv, num_q_heads: int, num_kv_heads: int, head_dim: int, decode_prompt: str = "triton"
    ) -> None:
        super().__init__(kv, num_q_heads, num_kv_heads, head_dim)
        import flashinfer

        dev = kv.k[0].device
        major, _ = torch.cuda.get_device_capability(dev)
        self.kernel = "fa3" if major == 9 else "fa2"
        # one float workspace for every wrapper: the kernels that use it run in stream order
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        self._ring = PlanRing(
            lambda: flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
                self._workspace, "NHD", backend=self.kernel
            ),
            torch.cuda.Event,
        )
        self._planned: PrefillMeta | None = None  # the forward the wrapper is planned for
        self._gather: torch.Tensor | None = None
        self.decode_prompt = decode_prompt
        if decode_prompt == "flashinfer":
            self._init_paged_decode()
            how = (
                f"{'staged + ragged' if self.staged else 'paged'} {self.kernel} prompt part "
                f"(batches of >= {PAGED_DECODE_MIN_ROWS} rows) + Triton suffix merge"
            )
        else:
            how = "Triton"
        log.info("flashinfer attention: ragged prefill (%s), %s beam decode", self.kernel, how)

    def _plan(self, meta: PrefillMeta, dtype: torch.dtype) -> None:
        """Once per forward (not per layer): indptr arrays on the host, as the wrapper wants."""
        if self._planned is meta:
            return
        new = np.asarray(meta.new_lens, dtype=np.int64)
        total = new + np.asarray(meta.prefix_lens, dtype=np.int64)
        # pinned: plan() copies the indptr arrays to the device, and a copy from pageable
        # memory would first wait for every kernel already queued on the stream
        qo = torch.from_numpy(np.concatenate([[0], np.cumsum(new)]).astype(np.int32)).pin_memory()
        kvp = torch.from_numpy(np.concatenate([[0], np.cumsum(total)]).astype(np.int32))
        kvp = kvp.pin_memory()
        self._ring.plan(
            qo,
            kvp,
            self.hq,
            self.hkv,
            self.d,
            causal=True,
            sm_scale=self.scale,
            q_data_type=dtype,
            kv_data_type=dtype,
            o_data_type=dtype,
        )
        # sequences with a cached prefix read their K/V from the pool: one gather index for
        # every sequence's slots (prefix + new), in the ragged kv order
        self._gather = torch.cat(meta.seq_slots) if any(meta.prefix_lens) else None
        self._planned = meta

    def takes_strided_q(self, meta) -> bool:
        # prefill: the ragged kernel takes per-token / per-head strides; decode: the beam
        # kernel of the base class
        return True

    def prefill(self, q, k, v, layer_id, meta: PrefillMeta, out=None):
        self._plan(meta, q.dtype)
        kp, vp = self.kv.k[layer_id], self.kv.v[layer_id]
        if self._gather is not None:
            k, v = kp[self._gather], vp[self._gather]
        elif self.kv.dtype != q.dtype and not meta.kv_rounded:
            k, v = kp[meta.out_loc], vp[meta.out_loc]
        if k.dtype != q.dtype:
            k, v = k.to(q.dtype), v.to(q.dtype)
        # row-strided views (q/k/v slices of the fused QKV output) go in as they are: the
        # kernel takes per-token and per-head strides (tests/gpu checks strided inputs)
        q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
        # ``out``: the kernel writes there (the piecewise graphs' static buffer: no copy)
        dst = None if out is None else out.view(q.shape[0], self.hq, self.d)
        o = self._ring.current.run(q, k, v, out=dst)
        return o.view(q.shape[0], self.hq * self.d)

    # --decode-prompt-attention flashinfer: the prompt part of beam decode through FlashInfer's
    # prefill kernels, non-causal, each request's beams as its query rows, returning (o, LSE);
    # then one Triton kernel folds in each beam's own decode keys (beam_suffix_merge_triton).
    # BF16 KV: paged prefill over the pool itself (pages of one token: a request's prompt slots
    # are its page list). FP8 KV (no fa3 kernel takes FP8 KV with BF16 queries): each layer
    # first stages the batch's prompt rows as BF16 in batch order (stage_prompt_kv_triton, one
    # launch), then ragged prefill over that staging buffer.

    def _init_paged_decode(self) -> None:
        import flashinfer

        dev = self._workspace.device
        self._paged = flashinfer
        self.staged = stages_prompt_kv(self.kv.dtype)
        if self.staged:  # as many rows as the pool (more only where prefixes are shared)
            cap = self.kv.k[0].shape[0]
            self._stage = tuple(
                torch.zeros(cap, self.hkv, self.d, dtype=torch.bfloat16, device=dev)
                for _ in range(2)
            )
            self._stage_slots = torch.zeros(cap, dtype=torch.int32, device=dev)
            self._stage_n = torch.zeros(1, dtype=torch.int32, device=dev)
            self._stage_sms = torch.cuda.get_device_properties(dev).multi_processor_count
        self._dec_ring = PlanRing(lambda: self._decode_wrapper(None), torch.cuda.Event)
        self._dec_planned = None  # the DecodeMeta the eager wrapper holds
        self._dec_graph_meta = None  # the one the graph wrapper holds
        self._dec_ok = False  # whether the eager forward planned fits the staging buffer
        if not self.staged:  # the pool as pages of one token: [P, 1, Hkv, D] views, no copy
            self._pages = [(k.unsqueeze(1), v.unsqueeze(1)) for k, v in zip(self.kv.k, self.kv.v)]
        self._dev = dev

    def _decode_wrapper(self, bufs):
        """A prefill wrapper for the prompt part (``bufs``: CUDA-graph mode's fixed buffers)."""
        flashinfer, kw = self._paged, dict(backend=self.kernel)
        if self.staged:
            if bufs is not None:
                kw.update(use_cuda_graph=True, qo_indptr_buf=bufs[0], kv_indptr_buf=bufs[1])
            return flashinfer.BatchPrefillWithRaggedKVCacheWrapper(self._workspace, "NHD", **kw)
        if bufs is not None:
            kw.update(use_cuda_graph=True, qo_indptr_buf=bufs[0], paged_kv_indptr_buf=bufs[1],
                      paged_kv_indices_buf=bufs[2], paged_kv_last_page_len_buf=bufs[3])  # fmt: skip
        return flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD", **kw)

    def _plan_args(self, meta, pad_rows: int = 0, batch: int | None = None):
        """(qo_indptr, kv_indptr, last_page_len, seq_lens) pinned host int32 arrays (the last
        two for the paged wrapper only, None for the staged one) and the device page list of a
        decode batch. ``pad_rows``: rows past the batch's own (a graph
        bucket's padding) go to one extra request over a single slot, so every row of the
        bucket has a prompt state; ``batch``: the fixed request count of a graph-mode wrapper
        (requests past the real ones have no rows)."""
        ns, lens, _ = meta.host
        nreq = len(ns)
        b = batch if batch is not None else nreq + (1 if pad_rows else 0)
        if b < nreq + (1 if pad_rows else 0):
            raise RuntimeError(f"decode batch of {nreq} requests exceeds the planned {b}")
        qo = torch.empty(b + 1, dtype=torch.int32, pin_memory=True)
        kvp = torch.empty(b + 1, dtype=torch.int32, pin_memory=True)
        last = seq = None
        if not self.staged:  # pages of one token: every last page is full
            last = torch.ones(b, dtype=torch.int32, pin_memory=True)
            seq = torch.ones(b, dtype=torch.int32, pin_memory=True)
            seq.numpy()[:nreq] = lens
        qn, kn = qo.numpy(), kvp.numpy()
        qn[0] = kn[0] = 0
        np.cumsum(ns, out=qn[1 : nreq + 1])
        np.cumsum(lens, out=kn[1 : nreq + 1])
        qn[nreq + 1 :] = qn[nreq] + pad_rows
        # the padding request reads the batch's first prompt slot again (one page)
        kn[nreq + 1 :] = kn[nreq] + (1 if pad_rows else 0)
        pages = meta.packed.slots[: int(kn[nreq])]
        if pad_rows:
            pages = torch.cat([pages, pages[:1]])
        return qo, kvp, last, seq, pages

    def decode_graph_fits(self, meta) -> bool:
        """False where a forward's prompts outgrow the FP8 staging buffer (prefixes shared by
        many requests): the runner then decodes it eagerly, through the Triton kernel."""
        if self.decode_prompt != "flashinfer" or not self.staged:
            return True
        # its requests' prompt rows + one for a graph bucket's padding request
        return int(meta.host[1].sum()) + 1 <= self._stage[0].shape[0]

    def _plan_paged(self, ring, meta, dtype, pad_rows=0, batch=None) -> None:
        qo, kvp, last, seq, pages = self._plan_args(meta, pad_rows, batch)
        self.paged_plans += 1
        if not self.staged:
            ring.plan(
                qo, kvp, pages, last, self.hq, self.hkv, self.d, 1,
                causal=False, sm_scale=self.scale, q_data_type=dtype,
                kv_data_type=self.kv.dtype, o_data_type=dtype, seq_lens=seq,
            )  # fmt: skip
            return
        # staged: the page list becomes the staging kernel's row list (device copies, in
        # stream order), and the ragged kernel reads rows kv_indptr[i].. of the staging buffer
        n = pages.shape[0]
        self._stage_slots[:n].copy_(pages)
        count = torch.tensor([n], dtype=torch.int32).pin_memory()
        self._stage_n.copy_(count, non_blocking=True)
        ring.plan(
            qo, kvp, self.hq, self.hkv, self.d, causal=False, sm_scale=self.scale,
            q_data_type=dtype, kv_data_type=torch.bfloat16, o_data_type=dtype,
        )  # fmt: skip

    def setup_decode_graph(self, max_rows: int, max_slots: int, dtype: torch.dtype) -> None:
        """Before the decode graphs are captured: one CUDA-graph-mode wrapper for every bucket
        (FlashInfer fixes its request count and the most rows at the first plan: the largest
        bucket's), static (o, LSE) outputs, and the page list's capacity."""
        if self.decode_prompt != "flashinfer":
            return
        dev, b = self._dev, max_rows + 1  # <= one request per row, + the padding request
        bufs = [torch.zeros(b + 1, dtype=torch.int32, device=dev) for _ in range(2)]
        if not self.staged:  # the paged wrapper's page list and last-page lengths
            bufs += [torch.zeros(max_slots + 1, dtype=torch.int32, device=dev),
                     torch.ones(b, dtype=torch.int32, device=dev)]  # fmt: skip
        # one wrapper: a captured graph holds its workspace
        ring = PlanRing(lambda: self._decode_wrapper(bufs), torch.cuda.Event, size=1)
        self._dec_graph = (ring, b)
        self._po = torch.zeros(max_rows, self.hq, self.d, dtype=dtype, device=dev)
        self._plse = torch.zeros(max_rows, self.hq, dtype=torch.float32, device=dev)

    def plan_decode_graph(self, meta, size: int) -> None:
        """Before a decode graph of ``size`` rows replays (or is captured) with ``meta``."""
        if self._dec_graph is None or size < PAGED_DECODE_MIN_ROWS:
            return
        ring, b = self._dec_graph
        rows = int(meta.host[0].sum())
        self._plan_paged(ring, meta, self._po.dtype, pad_rows=size - rows, batch=b)
        self._dec_graph_meta = meta

    def decode(self, q, layer_id, meta):
        if self.decode_prompt != "flashinfer" or q.shape[0] < PAGED_DECODE_MIN_ROWS:
            return super().decode(q, layer_id, meta)
        from flashrec.kernels.beam_merge import (
            beam_suffix_merge_triton,
            stage_prompt_kv_triton,
        )

        r = q.shape[0]
        if self._dec_graph is not None and meta is self._dec_graph_meta:  # a graph bucket
            ring, out, lse = self._dec_graph[0], self._po[:r], self._plse[:r]
        else:  # eager: planned once per forward, here at its first layer
            if self._dec_planned is not meta:
                self._dec_ok = self.decode_graph_fits(meta)
                if self._dec_ok:
                    self._plan_paged(self._dec_ring, meta, q.dtype)
                self._dec_planned = meta
            if not self._dec_ok:  # prompts outgrow the staging buffer: the Triton kernel
                return super().decode(q, layer_id, meta)
            ring, out, lse = self._dec_ring, None, None
        q = q if q.stride(-1) == 1 else q.contiguous()
        if self.staged:
            kv = self.kv.k[layer_id], self.kv.v[layer_id]
            sk, sv = stage_prompt_kv_triton(
                *kv, self._stage_slots, self._stage_n, *self._stage, sms=self._stage_sms
            )
            o_p, lse_p = ring.current.run(q, sk, sv, out=out, lse=lse, return_lse=True)
        else:
            o_p, lse_p = ring.current.run(
                q, self._pages[layer_id], out=out, lse=lse, return_lse=True
            )
        o = beam_suffix_merge_triton(
            q, o_p, lse_p, self.kv.dk[layer_id], self.kv.dv[layer_id], meta.rows, meta.out_loc,
            self.kv.depth, self.scale,
        )  # fmt: skip
        return o.view(r, self.hq * self.d)
