"""CUDA-graph prefill of one prompt (``--prefill-graph-max-tokens``).

One request at a time with a ~1,000-token prompt is host-bound: the eager prefill launches
~10 kernels per layer (GEMMs, Triton kernels whose Python launch path is the slowest part,
attention), and the GPU waits for them. Here the whole forward of ONE prompt with no cached
prefix is captured per 128-token bucket (``FLASHREC_PREFILL_BUCKET``) and replayed:

- the prompt is padded to its bucket; padding tokens sit after the real ones (causal
  attention: no real token sees them) and write their K/V to scratch pool slots reserved at
  start-up, so they never touch a request's KV;
- attention runs through the SDPA prefill of the base backend (one causal call over the
  bucket), not FlashInfer's planned wrapper, so nothing is planned per replay;
- the level-0 logprobs of the real last token come out of the graph; everything that varies
  per prompt (ids, positions, KV slots, the last-token index) is copied into static buffers.

On CPU the same padded forward runs eagerly (the tests compare it with the unpadded one).
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from flashrec.config.flags import env_choice
from flashrec.layers.attention import PrefillMeta, create_backend
from flashrec.profiler import trace_range

log = logging.getLogger("flashrec")

# FLASHREC_PREFILL_BUCKET: the one-prompt graphs' token bucket (128 by default): a prompt is
# padded up to a multiple of it; a smaller one pads less and captures more graphs at start
BUCKET = int(env_choice("FLASHREC_PREFILL_BUCKET", "128", ("32", "64", "128")))


class PaddedInputs:
    """The static inputs of a prefill graph padded to token buckets (``sizes``): token ids,
    positions and KV slots of the largest bucket (each bucket replays on views ``[:t]``), and
    the index of each prompt's last token (``max_seqs`` prompts at most). ``load`` puts a
    batch's real tokens first; the padding after them gets token 0, positions that continue the
    count, and the reserved scratch slots ``pad_slots`` as KV slots."""

    def __init__(self, device, sizes: list[int], pad_slots: torch.Tensor, max_seqs: int) -> None:
        self.sizes = sizes
        t = sizes[-1]
        if pad_slots.numel() < t:
            raise ValueError(f"{pad_slots.numel()} padding slots for a {t}-token bucket")
        # scratch pool slots, reserved by the runner for the engine's lifetime and shared by
        # both prefill graph kinds
        self.pad_slots = pad_slots[:t]
        self.ids = torch.zeros(t, dtype=torch.long, device=device)
        self.pos = torch.arange(t, dtype=torch.long, device=device)
        self.loc = self.pad_slots.clone()
        self.last = torch.zeros(max_seqs, dtype=torch.long, device=device)
        self._last_used = 0  # entries of ``last`` the previous batch set
        self.arange = torch.arange(t, dtype=torch.long, device=device)
        self.metas = {s: self._meta(s) for s in sizes}

    def _meta(self, t: int) -> PrefillMeta:
        meta = PrefillMeta(self.pos[:t], self.loc[:t], [self.loc[:t]], [t], [0], self.last)
        meta.input_ids = self.ids[:t]
        return meta

    def load(self, input_ids: torch.Tensor, meta: PrefillMeta) -> tuple[int, int]:
        """Copy a batch into the static inputs; returns (real tokens, bucket)."""
        n, b = int(sum(meta.new_lens)), len(meta.new_lens)
        t = next(s for s in self.sizes if s >= n)
        with trace_range("flashrec.graph_inputs"):
            self.ids[:n].copy_(input_ids)
            self.pos[:n].copy_(meta.positions)
            self.loc[:n].copy_(meta.out_loc)
            if t > n:
                self.ids[n:t].zero_()
                self.pos[n:t].copy_(self.arange[n:t])
                self.loc[n:t].copy_(self.pad_slots[n:t])
            self.last[:b].copy_(meta.last_index)
            if self._last_used > b:  # stale indexes of a larger batch may lie past this bucket
                self.last[b : self._last_used].zero_()
            self._last_used = b
        return n, t


class PrefillGraphRunner(PaddedInputs):
    def __init__(self, runner, max_tokens: int, pad_slots: torch.Tensor, pool=None) -> None:
        self.runner = runner
        dev = runner.device
        top = max_tokens
        sizes = sorted({min(top, k * BUCKET) for k in range(1, -(-top // BUCKET) + 1)})
        super().__init__(dev, sizes, pad_slots, 1)
        mc = runner.model_config
        sdpa = "triton" if dev.type == "cuda" else "torch"  # both prefill through SDPA
        attn = create_backend(
            sdpa, runner.kv, mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim
        )
        self.ctx = dataclasses.replace(runner.ctx, attn=attn)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = pool

    def fits(self, meta: PrefillMeta) -> bool:
        return (
            len(meta.new_lens) == 1
            and meta.prefix_lens[0] == 0
            and meta.new_lens[0] <= self.sizes[-1]
        )

    def _body(self, t: int) -> torch.Tensor:
        run = self.runner
        h = run.model(self.ids[:t], self.pos[:t], self.metas[t], self.ctx, select=self.last)
        return run.lm_head.level_logprobs(h, 0)

    def capture(self) -> None:
        from flashrec.engine.graph import FIX_KNOBS, capture_graph
        from flashrec.layers.attention import fixed_shape_sdpa

        try:
            for t in reversed(self.sizes):
                with fixed_shape_sdpa():  # one shape per bucket: cuDNN's plan is built once
                    g, self.outputs[t] = capture_graph(lambda t=t: self._body(t), self.pool)
                if self.pool is None:
                    self.pool = g.pool()
                self.graphs[t] = g
                self.runner.graph_stats.capture("prefill", t)
            torch.cuda.synchronize()
        except Exception as exc:
            raise RuntimeError(
                f"CUDA graph capture of the prefill failed at {t} tokens: {exc}. Fix with "
                f"--prefill-graph-max-tokens 0 (eager prefill) or {FIX_KNOBS}."
            ) from exc
        log.info("captured %d prefill CUDA graphs for %s tokens", len(self.graphs), self.sizes)

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, meta: PrefillMeta) -> torch.Tensor:
        """[1, K] level-0 logprobs of the prompt's last token (a copy)."""
        _, t = self.load(input_ids, meta)
        if t in self.graphs:
            self.graphs[t].replay()
            return self.outputs[t].clone()
        return self._body(t)  # CPU: the same padded forward, eagerly
