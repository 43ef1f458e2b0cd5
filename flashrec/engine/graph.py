"""CUDA-graph decode: the model forward over R beam rows, captured once per bucket size
(multiples of ``--beam-width`` up to ``--cuda-graph-max-bs``) and replayed every step.

Everything inside is shape-static and sync-free: the attention metadata (prompt slots,
per-request rows, lengths, steps, work list) is copied into static buffers before replay,
and padding rows write their KV into a scratch decode row that no request owns.
"""

from __future__ import annotations

import logging

import torch

from flashrec.kernels.beam_attention import MAX_SPLITS, SPLIT_MAX_ROWS
from flashrec.layers.attention import DecodeMeta, PackedDecode
from flashrec.profiler import trace_range

log = logging.getLogger("flashrec")

FIX_KNOBS = (
    "--disable-cuda-graph (run decode eagerly), a smaller --cuda-graph-max-bs or "
    "--batch-slots, a different --beam-width, or a lower --mem-fraction-static"
)


class DecodeGraphRunner:
    def __init__(self, runner, block_m: int) -> None:
        cfg = runner.config
        self.runner = runner
        bw = max(1, cfg.beam_width)
        top = min(cfg.cuda_graph_max_bs, runner.kv.row_slots)
        sizes = {min(top, k * bw) for k in range(1, (top + bw - 1) // bw + 1)}
        self.sizes = sorted(sizes)
        mc = runner.model_config
        self.group = mc.num_attention_heads // mc.num_key_value_heads
        self.block_m = block_m
        r, dev = self.sizes[-1], runner.device
        self.input_ids = torch.zeros(r, dtype=torch.long, device=dev)
        self.positions = torch.zeros(r, dtype=torch.long, device=dev)
        self.rows = torch.full((r,), runner.kv.scratch_row, dtype=torch.long, device=dev)
        self.out_loc = self.rows * runner.kv.depth
        # every running request's prompt slots, concatenated: requests sharing a cached prefix
        # repeat its slots, so the bound is (requests <= rows) x longest prompt, not the pool
        cap = min(r, runner.kv.row_slots) * cfg.max_seq_len
        self.slots = torch.zeros(cap, dtype=torch.int32, device=dev)
        self.head = torch.zeros(5, r, dtype=torch.int32, device=dev)
        self.work = torch.full((self._num_work(r), 3), -1, dtype=torch.int32, device=dev)
        self.ctrl = torch.tensor([1, 0], dtype=torch.int32, device=dev)  # (splits, items)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None

    def _num_work(self, r: int) -> int:
        """Work-list capacity of a bucket of r rows: blocks of r rows (+1 per request for
        rounding, <= r requests), times the prompt splits a bucket of that size may use."""
        blocks = (r * self.group + self.block_m - 1) // self.block_m + r
        return blocks * (MAX_SPLITS if r <= SPLIT_MAX_ROWS else 1)

    def bucket(self, rows: int) -> int:
        """The captured size a batch of ``rows`` rows replays at."""
        return next(s for s in self.sizes if s >= rows)

    def _meta(self, r: int) -> DecodeMeta:
        h = self.head
        splits = None if r <= SPLIT_MAX_ROWS else 1  # 1: no split, no merge kernel captured
        packed = PackedDecode(
            self.slots, h[0], h[1], h[2], h[3], h[4], self.work[: self._num_work(r)],
            self.ctrl, splits,
        )  # fmt: skip
        return DecodeMeta(self.positions[:r], self.rows[:r], self.out_loc[:r], [], packed)

    def capture(self) -> None:
        run = self.runner
        try:
            for r in reversed(self.sizes):
                meta = self._meta(r)
                with torch.inference_mode():
                    run.model(self.input_ids[:r], self.positions[:r], meta, run.ctx)  # warm-up
                    torch.cuda.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=self.pool):
                        self.outputs[r] = run.model(
                            self.input_ids[:r], self.positions[:r], meta, run.ctx
                        )
                if self.pool is None:
                    self.pool = g.pool()
                self.graphs[r] = g
            torch.cuda.synchronize()
        except Exception as exc:
            raise RuntimeError(
                f"CUDA graph capture failed at batch size {r}: {exc}. Fix with {FIX_KNOBS}."
            ) from exc
        log.info("captured %d decode CUDA graphs for batch sizes %s", len(self.graphs), self.sizes)

    def fits(self, rows: int) -> bool:
        return rows <= self.sizes[-1]

    def run(self, input_ids: torch.Tensor, meta: DecodeMeta) -> torch.Tensor:
        r = input_ids.shape[0]
        size = self.bucket(r)
        with trace_range("flashrec.graph_inputs"):
            self.input_ids[:r].copy_(input_ids)
            self.positions[:r].copy_(meta.positions)
            self.rows[:r].copy_(meta.rows)
            self.out_loc[:r].copy_(meta.out_loc)
            if size > r:
                self.input_ids[r:size].zero_()
                self.positions[r:size].zero_()
                self.rows[r:size].fill_(self.runner.kv.scratch_row)
                self.out_loc[r:size].copy_(self.rows[r:size] * self.runner.kv.depth)
            pk = meta.packed
            self.slots[: pk.slots.shape[0]].copy_(pk.slots)
            b = pk.n.shape[0]
            self.head[:, :b].copy_(
                torch.stack([pk.row_start, pk.n, pk.slot_start, pk.length, pk.step])
            )
            w = pk.work.shape[0]
            if w > self._num_work(size) or (pk.splits != 1 and size > SPLIT_MAX_ROWS):
                raise RuntimeError(f"decode work list ({w} items) does not fit bucket {size}")
            self.work[:w].copy_(pk.work)  # the kernel walks ctrl[1] items: no -1 fill
            self.ctrl.copy_(pk.ctrl)
        self.graphs[size].replay()
        return self.outputs[size][:r]
