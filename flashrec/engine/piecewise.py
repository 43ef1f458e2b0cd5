"""Piecewise CUDA-graph prefill of a batch (``--piecewise-prefill-max-tokens``).

An eager prefill makes ~10 launches per layer, several with tens of microseconds of host
time each (Triton's Python launch path, ``_scaled_mm``), and under load the GPU waits for
that host work. Attention is the only part of a layer whose launch depends on the batch's
composition (how many prompts, their lengths, cached prefixes); everything else is row-wise
over the batch's tokens. So the forward is cut at attention:

- piece 0: embeddings, layer 0 up to attention (norm, QKV GEMM, q/k norm, RoPE, KV write);
- piece i (1..L-1): layer i-1 after attention (``o_proj``, residual add + norm, MLP), then
  layer i up to attention;
- piece L: the last layer after attention, the final norm of each prompt's last token and the
  level-0 logprobs (with ``--enable-prefill-last-rows``, the default, that layer's o_proj and
  MLP already run on the last tokens only: ``MAX_SEQS`` rows, the unused ones padding).

Each piece is captured once per token bucket and replayed; attention runs eagerly between the
pieces on the batch's real tokens (FlashInfer's ragged prefill, planned once per forward, or
the SDPA path), reading q/k/v from and writing its output into static buffers. The batch is
padded to its bucket: padding tokens sit after the real ones, write their K/V into the scratch
slots reserved for the prefill graphs, and are never attended to or read back.

Per layer this is one graph replay and one attention call instead of ~10 launches. The layers
write their state where the next step reads it: the QKV GEMM into the static q/k/v rows (the
fused q/k norm + RoPE kernel then works in place there), each norm its new residual over the
static one. What remains is copied: the embeddings into the residual once per forward, q/k
where the unfused path rotates them into new tensors, and attention's output where the backend
cannot write into its buffer (FlashInfer's kernel does). The price is the padding, and the
copies where they remain; large batches are GPU-bound and gain little, so the largest bucket
is a knob (default 8,192, docs/configuration.md).

On CPU the same padded pieces run eagerly (the tests compare them with the plain forward).
"""

from __future__ import annotations

import logging

import torch

from flashrec.engine.prefill_graph import PaddedInputs
from flashrec.layers.attention import PrefillMeta

log = logging.getLogger("flashrec")

MAX_SEQS = 256  # prompts per prefill batch with a graph; a larger batch runs eagerly


def bucket_sizes(max_tokens: int) -> list[int]:
    """Token buckets up to ``max_tokens``: steps of 256 to 2,048, of 512 to 8,192, then of
    1,024 (padding stays under ~12% on the smallest batches, ~6% above 2,048)."""
    sizes, t = [], 0
    while t < max_tokens:
        t += 256 if t < 2048 else 512 if t < 8192 else 1024
        sizes.append(min(t, max_tokens))
    return sizes


def fit_max_tokens(top: int, whole: int, pool_tokens: int, explicit: bool) -> int:
    """The piecewise prefill's largest bucket, within what the KV pool can spare for its
    padding slots (a quarter of the pool, or the one-prompt graph's ``whole`` tokens, which
    share them): a default shrinks to fit, with a log line; an ``explicit``
    --piecewise-prefill-max-tokens that does not fit is refused."""
    spare = pool_tokens // 4
    if top <= max(spare, whole):
        return top
    if explicit:
        raise ValueError(
            f"--piecewise-prefill-max-tokens {top} reserves {top} KV pool slots for padding; "
            f"the pool has {pool_tokens} (at most a quarter may be reserved). "
            "Lower it, or raise --kv-pool-tokens / --mem-fraction-static."
        )
    fit = max((b for b in bucket_sizes(top) if b <= max(spare, whole)), default=0)
    log.info(
        "piecewise prefill graphs up to %d tokens, not %d: the KV pool (%d tokens) spares "
        "a quarter for padding slots",
        fit,
        top,
        pool_tokens,
    )
    return fit


class PiecewisePrefill(PaddedInputs):
    def __init__(self, runner, max_tokens: int, pad_slots: torch.Tensor, pool=None) -> None:
        self.runner = runner
        dev, dtype = runner.device, runner.dtype
        mc = runner.model_config
        super().__init__(dev, bucket_sizes(max_tokens), pad_slots, MAX_SEQS)
        t = self.sizes[-1]
        self.layers = list(runner.model.layers)
        self.hq, self.hkv, self.d = mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim
        q_w, kv_w = self.hq * self.d, self.hkv * self.d
        # state carried from piece to piece: q/k/v (one row per token, as the fused QKV GEMM
        # lays them out), the residual stream, and attention's output
        self.qkv = torch.zeros(t, q_w + 2 * kv_w, dtype=dtype, device=dev)
        self.q = self.qkv[:, :q_w].view(t, self.hq, self.d)
        self.k = self.qkv[:, q_w : q_w + kv_w].view(t, self.hkv, self.d)
        self.v = self.qkv[:, q_w + kv_w :].view(t, self.hkv, self.d)
        self.residual = torch.zeros(t, mc.hidden_size, dtype=dtype, device=dev)
        self.attn = torch.zeros(t, q_w, dtype=dtype, device=dev)
        self._qkv_ptrs = (self.q.data_ptr(), self.k.data_ptr(), self.v.data_ptr())
        self.copies = 0  # copies into the static buffers by the last forward's pieces (_keep)
        self.graphs: dict[int, list] = {}
        self.output: dict[int, torch.Tensor] = {}
        self.stored: list[bool] = []  # per layer: the piece wrote the KV (fused kernel)
        self.pool = pool

    def fits(self, meta: PrefillMeta) -> bool:
        return len(meta.new_lens) <= MAX_SEQS and sum(meta.new_lens) <= self.sizes[-1]

    # ---- the pieces -----------------------------------------------------------------------
    def _keep(self, t: int, q, k, v, residual) -> None:
        """One layer's q/k/v and residual into the static buffers: nothing to do where the
        layer wrote them there (the QKV GEMM and the fused kernel in ``self.qkv``, the norm's
        residual in ``self.residual``); else a copy, counted in ``self.copies``."""
        if residual.data_ptr() != self.residual.data_ptr():
            self.residual[:t].copy_(residual)
            self.copies += 1
        if (q.data_ptr(), k.data_ptr(), v.data_ptr()) == self._qkv_ptrs:
            return
        for got, static in ((q, self.q), (k, self.k), (v, self.v)):
            if got.data_ptr() != static.data_ptr():
                static[:t].copy_(got)
                self.copies += 1

    def _piece(self, t: int, i: int):
        run, ctx, meta = self.runner, self.runner.ctx, self.metas[t]
        last = i == len(self.layers)
        if i == 0:  # a forward begins (capture runs each bucket's twice: warm-up, capture)
            self.copies = 0
            x, residual = run.model.embed_tokens(self.ids[:t]), None
        elif last and ctx.last_rows:  # the last layer goes on with each prompt's last token
            x, residual = self.layers[i - 1].post(
                self.attn[self.last], self.residual[self.last], ctx
            )
        else:  # the new residual over the old, in place
            x, residual = self.layers[i - 1].post(
                self.attn[:t], self.residual[:t], ctx, residual_out=self.residual[:t]
            )
        if last:
            h = run.model.final(x, residual, ctx, None if ctx.last_rows else self.last)
            return run.lm_head.level_logprobs(h, 0)
        q, k, v, stored, residual = self.layers[i].pre(
            x, residual, self.pos[:t], meta, ctx, self.qkv[:t], self.residual[:t]
        )
        if len(self.stored) == i:
            self.stored.append(stored)
        self._keep(t, q, k, v, residual)
        return None

    def capture(self) -> None:
        from flashrec.engine.graph import FIX_KNOBS, capture_graph

        n = len(self.layers) + 1
        try:
            for t in reversed(self.sizes):
                graphs = []
                for i in range(n):
                    g, out = capture_graph(lambda t=t, i=i: self._piece(t, i), self.pool)
                    if self.pool is None:
                        self.pool = g.pool()
                    graphs.append(g)
                self.graphs[t] = graphs
                self.output[t] = out
                self.runner.graph_stats.capture("piecewise", t)  # its n pieces as one
            torch.cuda.synchronize()
        except Exception as exc:
            raise RuntimeError(
                f"CUDA graph capture of the piecewise prefill failed at {t} tokens: {exc}. "
                f"Fix with --piecewise-prefill-max-tokens 0 (eager prefill under load) or "
                f"{FIX_KNOBS}."
            ) from exc
        log.info(
            "captured %d piecewise prefill CUDA graphs (%d pieces x %d token buckets up to %d; "
            "%d copies into the static buffers per forward)",
            n * len(self.sizes),
            n,
            len(self.sizes),
            self.sizes[-1],
            self.copies,
        )

    # ---- one forward ----------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, meta: PrefillMeta) -> torch.Tensor:
        """[B, K] level-0 logprobs of each prompt's last token (a copy)."""
        n, t = self.load(input_ids, meta)
        graphs = self.graphs.get(t)
        if graphs is None:  # CPU: the same padded pieces, eagerly
            out = self._piece(t, 0)
        else:
            graphs[0].replay()
        # the fused kernel of piece 0 decided (at capture, on the static meta) whether q/k/v
        # carry the stored FP8 k/v; attention reads the real batch's meta
        meta.kv_rounded = bool(self.metas[t].kv_rounded)
        ctx = self.runner.ctx
        attn = self.attn[:n]
        for i, layer in enumerate(self.layers):
            o = layer.self_attn.attend(
                self.q[:n], self.k[:n], self.v[:n], self.stored[i], meta, ctx, out=attn
            )
            if o.data_ptr() != attn.data_ptr():  # a backend that returned its own tensor
                attn.copy_(o)
            if graphs is None:
                out = self._piece(t, i + 1)
            else:
                graphs[i + 1].replay()
        if graphs is not None:
            out = self.output[t]
        return out[: len(meta.new_lens)].clone()
