"""Continuous batching of beam rows.

Each ``step()``: admit waiting requests under the beam-row slot budget and the KV pool
(longest-prefix-match order with aging, or FCFS), prefill them together, then run ONE decode
forward over the rows of every running request (different requests, different n), expand
each request's beams, and retire finished requests. Requests join and leave between steps.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from flashrec.beam.search import expand, sequence_scores, unconstrained_candidates
from flashrec.config import env_flag
from flashrec.engine.prefill_graph import BUCKET
from flashrec.engine.request import BeamColumns, EngineError, GenRequest, GenResult, SidText
from flashrec.engine.runner import ModelRunner, host_to_device, make_prefill_meta
from flashrec.engine.stephash import StepHasher, hash_tensors
from flashrec.kvcache.radix import Node, RadixCache
from flashrec.profiler import trace_range
from flashrec.sid.layout import SidLayout

log = logging.getLogger("flashrec")

# TEST ONLY: re-creates the historical drift bug (a host-side cache keyed by ``id(state)``,
# whose addresses CPython reuses) so that harness/determinism/ can be shown to catch it.
PLANT_ID_CACHE_ENV = "FLASHREC_TEST_PLANT_ID_CACHE"

_REASONS = {True: "stop", False: "length"}  # a beam that ended on <|sid_end|>, or not


@dataclass(eq=False)
class ReqState:
    req: GenRequest
    target_len: int
    prompt_slots: list[int] = field(default_factory=list)
    private_slots: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    node: Node | None = None
    rows: torch.Tensor | None = None
    tokens: torch.Tensor | None = None  # [n, g] generated token ids
    cum: torch.Tensor | None = None
    nodes: torch.Tensor | None = None
    generator: torch.Generator | None = None
    prompt_slots_t: torch.Tensor | None = None
    prompt_slots_np: np.ndarray | None = None
    rows_np: np.ndarray | None = None
    step_inputs: tuple[str, str] | None = None  # debug step hash: (inputs, raw kv) of this step
    admitted_at: float = 0.0  # time.monotonic() at admission

    @property
    def generated(self) -> int:
        return 0 if self.tokens is None else self.tokens.shape[1]

    @property
    def done(self) -> bool:
        return self.generated >= self.target_len


@dataclass
class SchedulerStats:
    steps_total: int = 0
    prompt_tokens_total: int = 0
    prefix_hit_tokens_total: int = 0
    batch_failures_total: int = 0


class Scheduler:
    def __init__(self, runner: ModelRunner, layout: SidLayout, trie, tokenizer=None) -> None:
        self.runner = runner
        self.cfg = runner.config
        self.layout = layout
        self.trie = trie
        self.tokenizer = tokenizer
        self.depth = runner.depth
        self.kv = runner.kv
        self.device = runner.device
        self.radix = RadixCache() if self.cfg.enable_prefix_cache else None
        self.waiting: list[GenRequest] = []
        self.running: list[ReqState] = []
        self.stats = SchedulerStats()
        self.debug_hash = False
        self._text = SidText(tokenizer, layout)
        self._hasher: StepHasher | None = None
        self._planted: dict[int, torch.Tensor] | None = {} if env_flag(PLANT_ID_CACHE_ENV) else None
        self.step_delay_s = 0.0
        # --overlap-results: a step's finished requests, their results' device-to-host copy
        # started, handed back by the next step once its GPU work is launched
        self.overlap_results = self.cfg.resolved_overlap_results
        self._pending: _PendingResults | None = None
        # shorter radix matches are recomputed (--prefix-cache-min-match); with prefill graphs
        # at least one bucket, since only prompts without a cached prefix replay one
        self.min_match = self.cfg.prefix_cache_min_match
        if runner.prefill_graphs is not None:
            self.min_match = max(self.min_match, BUCKET)

    # ---- public -------------------------------------------------------------------------
    def add(self, req: GenRequest) -> None:
        self.waiting.append(req)

    def cancel(self, rid: str) -> bool:
        for i, r in enumerate(self.waiting):
            if r.rid == rid:
                del self.waiting[i]
                return True
        for st in self.running:
            if st.req.rid == rid:
                self._release(st)
                self.running.remove(st)
                return True
        return False

    @property
    def used_rows(self) -> int:
        return self.kv.rows.num_used

    @property
    def kv_reserved_tokens(self) -> int:
        """Pool slots held for the engine's lifetime (the prefill graphs' padding slots)."""
        pad = self.runner.pad_slots
        return pad.numel() if pad is not None else 0

    @property
    def kv_used_tokens(self) -> int:
        """Prompt KV held by requests (cached-but-unreferenced tokens and the reserved
        padding slots are not counted)."""
        evictable = self.radix.evictable_tokens if self.radix else 0
        return self.kv.tokens.num_used - evictable - self.kv_reserved_tokens

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._pending)

    def flush_pending(self, exc: BaseException | None = None):
        """Results held back by ``--overlap-results`` (finished now), or ``exc`` for each of
        those requests when given; the engine loop calls it when a step fails, so no finished
        request is lost."""
        pending, self._pending = self._pending, None
        if pending is None:
            return []
        if exc is not None:
            return [(st.req, exc) for st in pending.states]
        try:
            return self._results_finish(pending)
        except Exception as err:  # noqa: BLE001 - the copy failed: fail those requests
            return [(st.req, err) for st in pending.states]

    def flush_cache(self) -> int:
        if self.radix is None:
            return 0
        freed = self.radix.flush()
        self.kv.tokens.free(freed)
        return len(freed)

    def step(self) -> list[tuple[GenRequest, GenResult | Exception]]:
        """One engine step. Returns finished (or failed) requests."""
        out: list[tuple[GenRequest, GenResult | Exception]] = []
        with trace_range("flashrec.schedule"):
            admitted = self._admit()
        if admitted:
            out.extend(self._prefill(admitted))
        out.extend(self._decode())
        done = [s for s in self.running if s.done]
        started = None
        if done:
            with trace_range("flashrec.results"):
                started = self._results_start(done)  # device ranking + asynchronous copy
                for st in done:
                    self.running.remove(st)
                    self._release(st)  # stream order: later writes to its KV come after
        hold = started is not None and self.overlap_results and bool(self.waiting or self.running)
        if started is not None and not hold:  # nothing else queued: hand them back now
            with trace_range("flashrec.results"):
                out.extend(self._results_finish(started))
        # the previous step's held-back results: this step's GPU work is already queued, so
        # the GPU keeps running while they are waited for and built (after a wait for a later
        # copy just above, their event has passed: no second wait)
        if self._pending is not None:
            with trace_range("flashrec.results"):
                out.extend(self.flush_pending())
        if hold:
            self._pending = started
        self.stats.steps_total += 1
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        return out

    # ---- admission ----------------------------------------------------------------------
    def _order(self) -> list[GenRequest]:
        if self.cfg.schedule_policy == "fcfs" or self.radix is None:
            return sorted(self.waiting, key=lambda r: r.arrival)
        now = time.monotonic()
        aged = [r for r in self.waiting if (now - r.arrival) * 1000.0 >= self.cfg.lpm_aging_ms]
        fresh = [r for r in self.waiting if (now - r.arrival) * 1000.0 < self.cfg.lpm_aging_ms]
        fresh.sort(key=lambda r: (-len(self.radix.match(r.input_ids[:-1])[0]), r.arrival))
        return sorted(aged, key=lambda r: r.arrival) + fresh

    def _admit(self) -> list[ReqState]:
        admitted: list[ReqState] = []
        budget = self.cfg.max_prefill_tokens
        for req in self._order():
            if req.n > self.kv.rows.num_free:
                break
            slots: list[int] = []
            node = None
            if self.radix is not None:
                slots, node = self.radix.match(req.input_ids[:-1])  # >= 1 token left to compute
                if len(slots) < self.min_match:
                    slots, node = [], None  # too short to be worth the gather: recompute
            need = req.prompt_len - len(slots)
            if admitted and need > budget:
                break
            if self.radix is not None:
                self.radix.lock(node)
            if need > self.kv.tokens.num_free and self.radix is not None:
                self.kv.tokens.free(self.radix.evict(need - self.kv.tokens.num_free))
            if need > self.kv.tokens.num_free:
                if self.radix is not None:
                    self.radix.unlock(node)
                break
            st = ReqState(req, target_len=min(self.depth + 1, req.max_tokens))
            st.admitted_at = time.monotonic()
            st.node = node
            st.cached_tokens = len(slots)
            st.private_slots = self.kv.tokens.alloc(need)
            st.prompt_slots = list(slots) + st.private_slots
            st.rows_np = np.asarray(self.kv.rows.alloc(req.n), dtype=np.int64)
            seed = req.seed if req.seed is not None else random.getrandbits(62)
            st.generator = torch.Generator(device=self.device).manual_seed(seed)
            budget -= need
            admitted.append(st)
            self.waiting.remove(req)
        if admitted:  # every admitted request's beam rows in one pinned asynchronous copy
            for st, rows in zip(
                admitted, host_to_device([s.rows_np for s in admitted], self.device)
            ):
                st.rows = rows
        return admitted

    # ---- prefill ------------------------------------------------------------------------
    def _prefill(self, batch: list[ReqState]) -> list[tuple[GenRequest, GenResult | Exception]]:
        seqs = [(st.cached_tokens, st.private_slots, st.prompt_slots) for st in batch]
        ids = [t for st in batch for t in st.req.input_ids[st.cached_tokens :]]
        try:
            meta = make_prefill_meta(seqs, self.device, ids)
            input_ids = meta.input_ids
            # alone: nothing else runs, so a lone prompt may replay a prefill graph
            logprobs = self.runner.prefill(input_ids, meta, alone=not self.running)
            if self.hasher is not None:
                self.hasher.prefill(meta, input_ids, batch)
            zero = torch.zeros(1, dtype=torch.float32, device=self.device)
            root = torch.zeros(1, dtype=torch.long, device=self.device)
            items = []
            for i, st in enumerate(batch):
                self._publish_prompt(st)
                slots_t = meta.seq_slots[i]  # the prompt's slots, already on the device
                st.prompt_slots_np = np.asarray(st.prompt_slots, dtype=np.int64)
                if self._planted is not None:  # TEST ONLY (PLANT_ID_CACHE_ENV): stale on id reuse
                    slots_t = self._planted.setdefault(id(st), slots_t)
                st.prompt_slots_t = slots_t
                items.append((st, zero, logprobs[i : i + 1], root))
                self.stats.prompt_tokens_total += st.req.prompt_len
                self.stats.prefix_hit_tokens_total += st.cached_tokens
            self._advance(items, "prefill")
        except Exception as exc:  # noqa: BLE001 - one batch fails, the server goes on
            return self._fail(batch, exc)
        self.running.extend(batch)
        return []

    def _publish_prompt(self, st: ReqState) -> None:
        """Insert the prompt into the radix cache; keep only the slots it did not take."""
        if self.radix is None:
            return
        new_node, dup = self.radix.insert(st.req.input_ids, st.prompt_slots)
        self.radix.lock(new_node)
        self.radix.unlock(st.node)
        st.node = new_node
        st.private_slots = dup

    # ---- decode -------------------------------------------------------------------------
    def _decode(self) -> list[tuple[GenRequest, GenResult | Exception]]:
        batch, groups, ending = [], [], []
        for st in self.running:
            g = st.generated
            if st.done:
                continue
            if g >= self.depth and self.runner.lm_head.end_step_is_free:
                ending.append(st)
                continue
            step = g - 1
            slots_np = st.prompt_slots_np
            if self._planted is not None:  # the planted stale tensor must reach the kernels too
                slots_np = st.prompt_slots_t.cpu().numpy()
            groups.append((st.rows_np, slots_np, st.prompt_slots_t, step, st.req.prompt_len + step))
            batch.append(st)
        if ending:
            self._append_end(ending)
        if not batch:
            return []
        # requests at the same level side by side: one LM-head product per level
        order = sorted(range(len(batch)), key=lambda i: batch[i].generated)
        batch, groups = [batch[i] for i in order], [groups[i] for i in order]
        out: list[tuple[GenRequest, GenResult | Exception]] = []
        for a, b in _row_chunks([st.req.n for st in batch], self.runner.decode_rows_limit):
            out.extend(self._decode_batch(batch[a:b], groups[a:b]))
        return out

    def _decode_batch(self, batch: list[ReqState], groups: list) -> list:
        """One decode forward (a graph replay where the rows fit one) over ``batch``, ordered
        by level; a failure fails these requests only."""
        try:
            meta = self.runner.decode_meta(groups)
            input_ids = torch.cat([st.tokens[:, -1] for st in batch])
            levels = [st.generated for st in batch]
            if self.hasher is None and self.runner.step_batch_ok(
                [st.req.n for st in batch], levels, all(st.req.temperature == 0 for st in batch)
            ):
                self._decode_static(batch, input_ids, meta, levels)
                return []
            logprobs = self.runner.decode(input_ids, meta, levels)
            if self.hasher is not None:
                self.hasher.decode(meta, input_ids, batch)
            self._advance([(st, st.cum, lp, st.nodes) for st, lp in zip(batch, logprobs)], "decode")
        except Exception as exc:  # noqa: BLE001
            for st in batch:
                self.running.remove(st)
            return self._fail(batch, exc)
        return []

    def _decode_static(self, batch: list[ReqState], input_ids, meta, levels: list[int]) -> None:
        """The whole step as one static program (``--enable-step-graph``): one graph replay on
        GPU, then the token histories per run of equal length (the batch is ordered by level)."""
        lv = host_to_device([np.asarray(levels)], self.device)[0]
        cum = torch.stack([st.cum for st in batch])
        nodes = torch.stack([st.nodes for st in batch])
        with trace_range("flashrec.beam"):
            out = self.runner.decode_step(input_ids, meta, lv, cum, nodes)
            # the static outputs are overwritten by the next replay: own copies
            parents, tokens, nodes, cum = (
                t.clone() for t in (out.parents, out.tokens, out.nodes, out.cum)
            )
            a = 0
            for level, run in itertools.groupby(levels):  # equal levels: equal history lengths
                b = a + len(list(run))
                hist = _extend_histories(batch[a:b], parents[a:b], tokens[a:b])
                for j, st in enumerate(batch[a:b]):
                    st.tokens, st.cum, st.nodes = hist[j], cum[a + j], nodes[a + j]
                    if self.debug_hash:
                        self._log_hash(st, level, "decode", parents[a + j])
                a = b

    def _candidates(self, level: int, nodes: torch.Tensor):
        m = nodes.shape[0]
        if level >= self.depth:  # the end token: one candidate per beam
            z = torch.zeros(m, 1, dtype=torch.long, device=self.device)
            return z, z, torch.ones(m, 1, dtype=torch.bool, device=self.device)
        if self.trie is None:
            return unconstrained_candidates(m, self.layout.codebook_size, self.device)
        return self.trie.candidates(level, nodes)

    def _advance(self, items, phase: str) -> None:
        """Expand every request's beams; requests with equal (n, level, rows) and temperature
        0 are expanded together in one batched call; decode KV is reordered in one gather."""
        buckets: dict[tuple, list] = {}
        for it in items:
            st, cum = it[0], it[1]
            key = (st.req.n, st.generated, cum.shape[0], st.req.temperature)
            if st.req.temperature > 0:
                key = key + (st.req.rid,)  # own generator
            buckets.setdefault(key, []).append(it)
        dst, src = [], []
        with trace_range("flashrec.beam"):
            for (n, level, m, temp, *_), group in buckets.items():
                nodes = torch.cat([it[3] for it in group])
                codes, child, valid = self._candidates(level, nodes)
                b = len(group)
                res = expand(
                    torch.stack([it[1] for it in group]),
                    torch.stack([it[2] for it in group]),
                    codes.view(b, m, -1),
                    child.view(b, m, -1),
                    valid.view(b, m, -1),
                    n,
                    temp,
                    group[0][0].generator,
                )
                if level >= self.depth:
                    new_tok = torch.full_like(res.codes, self.layout.sid_end)
                else:
                    new_tok = res.codes + self.layout.level_range(level)[0]
                # the whole bucket's token histories and KV rows in a few batched ops (same n,
                # same level: equal shapes), then per-request views
                if group[0][0].tokens is None:
                    tokens = new_tok[:, :, None]
                else:
                    tokens = _extend_histories([it[0] for it in group], res.parents, new_tok)
                    rows = torch.stack([it[0].rows for it in group])  # [b, n]
                    dst.append(rows.reshape(-1))
                    src.append(rows.gather(1, res.parents).reshape(-1))
                for i, it in enumerate(group):
                    st = it[0]
                    st.tokens, st.cum, st.nodes = tokens[i], res.cum[i], res.nodes[i]
                    if self.debug_hash:
                        self._log_hash(st, level, phase, res.parents[i])
            if dst:
                self.kv.reorder(torch.cat(dst), torch.cat(src))
                if self.hasher is not None:
                    self.hasher.reorder(torch.cat(dst), torch.cat(src), self.kv.reorder_positions)

    @property
    def hasher(self) -> StepHasher | None:
        """The step hasher while ``debug_hash`` is on (``FLASHREC_DEBUG_STEP_HASH=1``)."""
        if self.debug_hash and self._hasher is None:
            self._hasher = StepHasher(self.kv.pool_tokens, self.kv.dkv.shape[1], self.kv.depth)
        return self._hasher if self.debug_hash else None

    def _log_hash(self, st: ReqState, level: int, phase: str, parents: torch.Tensor) -> None:
        inputs, kv = st.step_inputs or ("-", "-")
        outputs = hash_tensors(st.tokens[:, -1], parents, st.cum)
        log.info(
            "STEP_HASH rid=%s step=%d phase=%s inputs=%s outputs=%s kv=%s cached=%d",
            st.req.rid,
            level,
            phase,
            inputs,
            outputs,
            kv,
            st.cached_tokens,
        )

    def _append_end(self, states: list[ReqState]) -> None:
        """<|sid_end|> after the last SID level (free under the level scope): one stack and one
        cat per token-history shape, not a fill and a cat per request."""
        for same in _by_shape(states, lambda st: st.tokens.shape):
            toks = torch.stack([st.tokens for st in same])  # [b, n, g]
            toks = torch.cat([toks, toks.new_full((*toks.shape[:2], 1), self.layout.sid_end)], 2)
            for st, t in zip(same, toks):
                st.tokens = t

    # ---- results / cleanup --------------------------------------------------------------
    def _results_start(self, states: list[ReqState]) -> _PendingResults:
        """The ranking of finished requests' beams, on the device, and ONE asynchronous
        device-to-host copy of every request's tokens, cumulative logprobs and scores (one sync
        per step, whatever the number of finished requests), into pinned memory with an event
        behind it; :meth:`_results_finish` waits for that event."""
        blocks, ordered = [], []
        for same in _by_shape(range(len(states)), lambda i: states[i].tokens.shape):
            ordered.extend(same)  # indices into states, batched per token-history shape
            g = states[same[0]].generated
            cum = torch.stack([states[i].cum for i in same])  # [b, n]
            tokens = torch.stack([states[i].tokens for i in same])  # [b, n, g]
            scores = sequence_scores(cum, g, self.cfg.length_penalty)
            alive = torch.isfinite(cum)
            order = torch.sort(
                scores.masked_fill(~alive, float("-inf")), dim=1, descending=True, stable=True
            ).indices
            cols = [tokens.gather(1, order[:, :, None].expand(-1, -1, g)).double()]
            cols += [x.gather(1, order)[:, :, None].double() for x in (cum, scores, alive)]
            blocks.append(torch.cat(cols, dim=2).reshape(-1))  # int64 ids < 2^53: exact
        flat = torch.cat(blocks)
        if flat.device.type != "cuda":
            return _PendingResults(states, ordered, flat, None)
        host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        host.copy_(flat, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return _PendingResults(states, ordered, host, event)

    def _results_finish(self, pending: _PendingResults) -> list[tuple[GenRequest, GenResult]]:
        """Wait for a started copy and build the requests' results (ranked beams)."""
        if pending.event is not None and not pending.event.query():  # query: no sync
            pending.event.synchronize()
        states, ordered = pending.states, pending.ordered
        host = pending.host.numpy()
        done_at = time.monotonic()
        out: list[GenResult] = [None] * len(states)  # type: ignore[list-item]
        off = 0
        for i in ordered:
            st = states[i]
            n, g = st.tokens.shape
            blk = host[off : off + n * (g + 3)].reshape(n, g + 3)
            off += n * (g + 3)
            blk = blk[blk[:, g + 2] > 0]  # alive beams, already ranked
            stop = blk[:, g - 1] == self.layout.sid_end if g else np.zeros(len(blk), bool)
            beams = BeamColumns(  # columns, no object per beam; text built on read
                blk[:, :g].astype(np.int64).tolist(),
                blk[:, g].tolist(),
                blk[:, g + 1].tolist(),
                [_REASONS[s] for s in stop.tolist()],
                self._text,
            )
            out[i] = GenResult(
                st.req.rid,
                beams,
                st.req.prompt_len,
                st.cached_tokens,
                queue_s=st.admitted_at - st.req.arrival,
                engine_s=done_at - st.admitted_at,
                done_at=done_at,
            )
        return [(st.req, res) for st, res in zip(states, out)]

    def _release(self, st: ReqState) -> None:
        if st.rows is not None:
            self.kv.rows.free(st.rows_np.tolist())
            st.rows = st.rows_np = None
        if st.private_slots:
            self.kv.tokens.free(st.private_slots)
            st.private_slots = []
        if self.radix is not None and st.node is not None:
            self.radix.unlock(st.node)
            st.node = None

    def _fail(self, batch: list[ReqState], exc: Exception):
        self.stats.batch_failures_total += 1
        log.exception("batch of %d requests failed", len(batch), exc_info=exc)
        for st in batch:
            self._release(st)
        err = EngineError(f"{type(exc).__name__}: {exc}")
        return [(st.req, err) for st in batch]


@dataclass
class _PendingResults:
    """Finished requests whose ranked results are on their way to the host: ``host`` (pinned
    on CUDA) is complete once ``event`` (None on CPU: already complete) has passed."""

    states: list[ReqState]
    ordered: list[int]
    host: torch.Tensor
    event: torch.cuda.Event | None


def _extend_histories(states: list[ReqState], parents, new_tok) -> torch.Tensor:
    """[b, n, g + 1]: each state's token history [n, g] reordered by its ``parents`` [n], then
    its new tokens ``new_tok`` [n] (states of equal history shape, batched)."""
    prev = torch.stack([st.tokens for st in states])  # [b, n, g]
    par = parents[:, :, None].expand(-1, -1, prev.shape[2])
    return torch.cat([prev.gather(1, par), new_tok[:, :, None]], dim=2)


def _row_chunks(widths: list[int], limit: int | None) -> list[tuple[int, int]]:
    """``[a, b)`` runs of consecutive requests whose beam rows (``widths``) add up to at most
    ``limit`` (None: one run of all); a request wider than ``limit`` runs alone. Requests are
    never split: a request's beams expand together."""
    if limit is None:
        return [(0, len(widths))] if widths else []
    runs, a, rows = [], 0, 0
    for i, w in enumerate(widths):
        if i > a and rows + w > limit:
            runs.append((a, i))
            a, rows = i, 0
        rows += w
    if widths:
        runs.append((a, len(widths)))
    return runs


def _by_shape(items, key) -> list[list]:
    """``items`` grouped by ``key(item)`` (first-seen order), for batched tensor ops."""
    groups: dict = {}
    for it in items:
        groups.setdefault(tuple(key(it)), []).append(it)
    return list(groups.values())
