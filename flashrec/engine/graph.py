"""CUDA-graph decode: the model forward over R beam rows, captured once per bucket size
(multiples of ``--beam-width`` up to ``--cuda-graph-max-bs``) and replayed every step.

Everything inside is shape-static and sync-free: the attention metadata (prompt slots,
per-request rows, lengths, steps, work list) is copied into static buffers before replay,
and padding rows write their KV into a scratch decode row that no request owns.
"""

from __future__ import annotations

import gc
import logging

import numpy as np
import torch

from flashrec.beam.step import StaticStepOut, reorder_rows
from flashrec.kernels.beam_attention import MAX_SPLITS, SPLIT_MAX_ROWS
from flashrec.layers.attention import DecodeMeta, PackedDecode
from flashrec.profiler import trace_range

log = logging.getLogger("flashrec")

FIX_KNOBS = (
    "--disable-cuda-graph (run decode eagerly), --no-enable-step-graph (capture the model "
    "forward only), a smaller --cuda-graph-max-bs or "
    "--batch-slots, a different --beam-width, or a lower --mem-fraction-static"
)


def capture_graph(body, pool):
    """Run ``body()`` once (warm-up: kernel compiles, workspaces), then capture it into a CUDA
    graph on memory pool ``pool`` (None: a new one). Returns (graph, the captured output).

    The garbage collector is off during the capture (torch 2.13's ``torch.cuda.graph``
    collects before one only under ``torch.compiler.config.force_cudagraph_gc``): a
    collection triggered mid-capture runs finalizers, and a finalizer that releases CUDA
    objects (a graph or buffers of an engine no longer referenced) can make a CUDA call that
    invalidates the capture."""
    with torch.inference_mode():
        body()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        enabled = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(g, pool=pool):
                out = body()
        finally:
            if enabled:
                gc.enable()
    return g, out


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
        # --enable-step-graph: the whole step (model, LM head, trie, top-n, expansion, KV
        # reorder) at the sizes that hold whole requests of --beam-width rows
        self.bw = bw
        self.step_sizes = [s for s in self.sizes if s % bw == 0] if runner.step is not None else []
        self.step_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.step_outputs: dict = {}
        nb = max(1, self.sizes[-1] // bw)
        self.s_levels = torch.ones(nb, dtype=torch.long, device=dev)
        self.s_cum = torch.full((nb, bw), float("-inf"), dtype=torch.float32, device=dev)
        self.s_nodes = torch.zeros(nb, bw, dtype=torch.long, device=dev)
        # per request: temperature (0 = greedy) and the sampling noise's seed
        self.s_temps = torch.zeros(nb, dtype=torch.float32, device=dev)
        self.s_seeds = torch.zeros(nb, dtype=torch.long, device=dev)
        self._sampled = False  # whether s_temps may hold a non-zero temperature

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
        run.attn.setup_decode_graph(self.sizes[-1], self.slots.numel(), run.dtype)
        try:
            for r in reversed(self.sizes):  # the largest first (a host-planned backend's max)
                meta = self._meta(r)
                meta.host = (np.array([r]), np.array([1]), None)  # one request over one slot
                run.attn.plan_decode_graph(meta, r)
                g, self.outputs[r] = capture_graph(
                    lambda r=r, meta=meta: run.model(
                        self.input_ids[:r], self.positions[:r], meta, run.ctx
                    ),
                    self.pool,
                )
                if self.pool is None:
                    self.pool = g.pool()
                self.graphs[r] = g
                run.graph_stats.capture("decode", r)
                if r in self.step_sizes:
                    self._capture_step(r, meta)
            torch.cuda.synchronize()
        except Exception as exc:
            raise RuntimeError(
                f"CUDA graph capture failed at batch size {r}: {exc}. Fix with {FIX_KNOBS}."
            ) from exc
        log.info(
            "captured %d decode CUDA graphs for batch sizes %s (%d whole-step graphs)",
            len(self.graphs),
            self.sizes,
            len(self.step_graphs),
        )

    def _step_body(self, r: int, meta: DecodeMeta):
        run, b = self.runner, r // self.bw
        h = run.model(self.input_ids[:r], self.positions[:r], meta, run.ctx)
        out = run.step.run(
            h, self.s_levels[:b], self.s_cum[:b], self.s_nodes[:b], self.s_temps[:b],
            self.s_seeds[:b],
        )  # fmt: skip
        reorder_rows(run.kv, self.rows[:r], out.parents)  # padding rows: scratch <- scratch
        return out

    def _capture_step(self, r: int, meta: DecodeMeta) -> None:
        self.step_graphs[r], self.step_outputs[r] = capture_graph(
            lambda: self._step_body(r, meta), self.pool
        )
        self.runner.graph_stats.capture("step", r)

    def fits(self, rows: int) -> bool:
        return rows <= self.sizes[-1]

    def has_step(self, rows: int) -> bool:
        return bool(self.step_graphs) and rows <= self.step_sizes[-1]

    def run_step(self, input_ids, meta: DecodeMeta, levels, cum, nodes, temps, seeds):
        """One replay of the whole decode step (``temps`` / ``seeds [B]``: per request, 0 =
        greedy; None: all greedy); returns views of the static outputs (a ``StaticStepOut``)."""
        r = input_ids.shape[0]
        size = next(s for s in self.step_sizes if s >= r)
        b, nb = cum.shape[0], size // self.bw
        self._fill(input_ids, meta, size)
        with trace_range("flashrec.graph_inputs"):
            self.s_levels[:b].copy_(levels)
            self.s_cum[:b].copy_(cum)
            self.s_nodes[:b].copy_(nodes)
            if temps is not None:
                self.s_temps[:b].copy_(temps)
                self.s_seeds[:b].copy_(seeds)
                self._sampled = True
            elif self._sampled:  # an all-greedy batch after a sampled one
                self.s_temps.zero_()
                self._sampled = False
            if nb > b:  # padding requests: dead rows on the scratch row
                self.s_levels[b:nb].fill_(1)
                self.s_cum[b:nb].fill_(float("-inf"))
                self.s_nodes[b:nb].zero_()
                if self._sampled:
                    self.s_temps[b:nb].zero_()
        self.step_graphs[size].replay()
        out = self.step_outputs[size]
        return StaticStepOut(out.parents[:b], out.tokens[:b], out.nodes[:b], out.cum[:b])

    def run(self, input_ids: torch.Tensor, meta: DecodeMeta) -> torch.Tensor:
        r = input_ids.shape[0]
        size = self.bucket(r)
        self._fill(input_ids, meta, size)
        self.graphs[size].replay()
        return self.outputs[size][:r]

    def _fill(self, input_ids: torch.Tensor, meta: DecodeMeta, size: int) -> None:
        """Copy a batch's model inputs and attention metadata into the static buffers."""
        r = input_ids.shape[0]
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
            self.runner.attn.plan_decode_graph(meta, size)
