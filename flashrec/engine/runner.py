"""Model runner: builds the model, KV memory, attention backend and LM head; runs one
prefill forward or one decode forward over a batch and returns level logprobs."""

from __future__ import annotations

import functools
import itertools
import logging
from dataclasses import dataclass

import torch

from flashrec.beam.step import StaticStep, StaticStepOut, reorder_rows
from flashrec.config import EngineConfig, ModelConfig
from flashrec.config.flags import env_choice
from flashrec.engine.attention_choice import (
    pick_backend,
    pick_decode_prompt,
    staging_bytes_per_token,
)
from flashrec.engine.graph_stats import GraphStats, decode_path, off_reason, prefill_path
from flashrec.engine.meta import (  # noqa: F401 - host_to_device, make_prefill_meta: re-exported
    BLOCK_M,
    host_to_device,
    make_decode_meta,
    make_prefill_meta,
)
from flashrec.engine.piecewise import MAX_SEQS, fit_max_tokens
from flashrec.kernels.invariant import CPU_ROWS as INVARIANT_ROWS
from flashrec.kernels.invariant import batch_invariant
from flashrec.kvcache.pool import KVCache
from flashrec.layers.attention import DecodeMeta, PrefillMeta, create_backend
from flashrec.layers.logits import RestrictedLMHead
from flashrec.layers.rotary import build_cos_sin
from flashrec.models.loader import load_weights, read_checkpoint
from flashrec.models.registry import get_model_class
from flashrec.profiler import trace_range
from flashrec.sid.layout import SidLayout

log = logging.getLogger("flashrec")

# the decode step's GEMMs on CUDA: "library" (cuBLAS / cuBLASLt), "triton" (the GEMMs and LM
# head through the Triton GEMM of --deterministic, kernels/tl/matmul.py, at its fixed tiles) or
# "tuned" (per weight shape and decode graph size, whichever of the library and a few Triton
# tiles a timed trial at start finds fastest: kernels/gemm_choice.py); the environment
# variable is for same-run A/Bs on a GPU (--deterministic always takes the Triton one)
DECODE_GEMM = env_choice("FLASHREC_DECODE_GEMM", "library", ("library", "triton", "tuned"))

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ForwardContext:
    """Per-model constants the layers read (passed down, never global)."""

    attn: object
    cos_sin: torch.Tensor
    fused_rms_fp8: bool = False
    fused_silu_fp8: bool = False
    # the same Triton kernels without the quant epilogue, for layers that run in bf16/fp16
    fused_rms: bool = False
    fused_silu: bool = False
    fused_qk_rope_kv: object | None = None
    # prefill with ``select``: the last layer after attention runs on the selected rows only
    last_rows: bool = True


def _kv_dtype(cfg: EngineConfig, act: torch.dtype) -> torch.dtype:
    if cfg.kv_cache_dtype == "fp8_e4m3":
        return torch.float8_e4m3fn
    return act


class ModelRunner:
    """Builds, in order: the model (weights loaded), the KV memory, the attention backend and
    forward context, the LM head and the static decode step, then captures the decode graphs
    and the two prefill graph kinds (each step below is one method)."""

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        layout: SidLayout,
        depth: int,
        trie=None,
    ) -> None:
        self.config = config
        self.model_config = model_config
        self.device = torch.device(config.resolved_device)
        self.dtype = DTYPES[config.resolved_dtype]
        self.use_fp8 = self._resolve_fp8(model_config)
        # decode GEMMs through the batch-invariant kernels: --deterministic, or on CUDA
        # FLASHREC_DECODE_GEMM=triton (there the Triton GEMM; elsewhere they are chunked)
        self.invariant_decode = config.deterministic or (
            DECODE_GEMM == "triton" and self.device.type == "cuda"
        )
        self.model = self._load_model()
        self.depth = depth
        self.layout = layout
        # the catalog (CatalogVersion) the static step's trie belongs to; set by the engine
        self.step_catalog = None
        self._other_catalog_logged = False
        kv_dtype = _kv_dtype(config, self.dtype)
        self.attention_backend = pick_backend(
            config, self.device, self.dtype, model_config.head_dim
        )
        self.decode_prompt_attention = pick_decode_prompt(
            config, self.attention_backend, kv_dtype, self.device
        )
        staging = staging_bytes_per_token(self.decode_prompt_attention, kv_dtype, model_config)
        pool = self._pool_tokens(model_config, kv_dtype, staging)
        self.kv = KVCache(
            model_config, pool, config.resolved_batch_slots, max(depth, 1), kv_dtype, self.device
        )
        extra = {}
        if self.decode_prompt_attention != "triton":
            extra["decode_prompt"] = self.decode_prompt_attention
        self.attn = create_backend(
            self.attention_backend,
            self.kv,
            model_config.num_attention_heads,
            model_config.num_key_value_heads,
            model_config.head_dim,
            **extra,
        )
        self.ctx = self._forward_context(kv_dtype)
        self.lm_head = RestrictedLMHead(self.model.lm_head(), layout, config.logprob_scope)
        self.step = self._decode_step(layout, trie)
        # decode forwards by how they ran (graph replays, eager): /metrics and the harness
        # show them, so a decode that left the graphs is never silent
        self.decode_forwards = {"graph": 0, "eager": 0}
        # flashrec_graph_*: captures by kind and size, replays, eager forwards by reason
        self.graph_stats = GraphStats()
        self._off = off_reason(self.device.type)  # why a kind with no graphs has none
        self.graphs = self._capture_decode_graphs()
        self.prefill_graphs = None
        self.piecewise = None
        # scratch pool slots for the padding tokens of both prefill graph kinds, held for the
        # engine's lifetime (the scheduler counts them as reserved)
        self.pad_slots = None
        self._capture_prefill_graphs()
        log.info(
            "model %s on %s: dtype %s, fp8 %s, KV pool %d tokens (%s), %d beam-row slots",
            model_config.architecture,
            self.device,
            self.dtype,
            self.use_fp8,
            pool,
            kv_dtype,
            config.resolved_batch_slots,
        )
        if self.invariant_decode and not config.deterministic:
            log.info("decode GEMMs and LM head in Triton (FLASHREC_DECODE_GEMM=triton)")
        if config.deterministic:
            log.info(
                "deterministic (batch-invariant): decode GEMMs and LM head %s, one prompt per "
                "prefill forward (%s attention), no prefix cache, no one-prompt prefill graph, "
                "decode attention unsplit",
                "in Triton with a fixed tile and K order"
                if self.device.type == "cuda"
                else f"in {INVARIANT_ROWS}-row library GEMMs",
                self.attention_backend,
            )

    def _load_model(self) -> torch.nn.Module:
        """The model built on the meta device, loaded on the CPU (fused parameters, FP8
        quantized or dequantized as ``use_fp8`` says), then moved to the device."""
        mc = self.model_config
        with torch.device("meta"):
            model = get_model_class(mc)(mc)
        model = model.to_empty(device="cpu")
        tensors = read_checkpoint(self.config.model_path)
        load_weights(
            model,
            tensors,
            self.dtype,
            quantize_fp8=self.use_fp8 and not mc.is_fp8_checkpoint,
            dequantize_fp8=mc.is_fp8_checkpoint and not self.use_fp8,
            block_size=mc.fp8_block_size,
        )
        del tensors
        return model.to(self.device).eval()

    def _forward_context(self, kv_dtype: torch.dtype) -> ForwardContext:
        """The layers' per-model constants: RoPE table, attention backend, fused kernels."""
        config, mc = self.config, self.model_config
        cos_sin = build_cos_sin(
            mc.max_position_embeddings, mc.head_dim, mc.rope_theta, device=self.device
        )
        on_gpu = self.device.type == "cuda"
        half = on_gpu and self.dtype in (torch.bfloat16, torch.float16)
        ctx = ForwardContext(
            self.attn,
            cos_sin,
            fused_rms_fp8=on_gpu and self.use_fp8 and config.enable_fused_rms_fp8,
            fused_silu_fp8=on_gpu and self.use_fp8 and config.enable_fused_silu_fp8,
            fused_rms=half and config.enable_fused_rms_fp8,
            fused_silu=half and config.enable_fused_silu_fp8,
            last_rows=config.enable_prefill_last_rows,
        )
        if on_gpu and config.enable_fused_qk_rope_kv:
            ctx.fused_qk_rope_kv = self._fused_qk_rope_kv
        # an FP8 KV cache: prefill attends to the stored values; the fused kernel hands them
        # back in the QKV row, so no backend gathers them from the pool (cold == warm hit)
        self._prefill_reads_qkv = kv_dtype == torch.float8_e4m3fn
        return ctx

    def _decode_step(self, layout: SidLayout, trie) -> StaticStep | None:
        """Sets how many decode positions a beam reorder carries; returns the static decode
        step (``--enable-step-graph``), None when off or unusable (a one-level catalog)."""
        depth = self.depth
        # decode forwards per request: one per SID level after the first, plus the end token's
        # unless its logprob is free; a beam reorder carries what the next forward reads
        forwards = max(depth - 1, 0) + (0 if self.lm_head.end_step_is_free else 1)
        self.kv.reorder_positions = max(forwards - 1, 0)
        if not self.config.resolved_enable_step_graph:
            return None
        step = StaticStep(self.lm_head, trie, layout, depth, self.device)
        return step if step.usable else None

    def _capture_decode_graphs(self):
        """The decode CUDA graphs (``DecodeGraphRunner``), captured; None without graphs."""
        if not self.config.graphs_on:
            return None
        from flashrec.engine.graph import DecodeGraphRunner

        graphs = DecodeGraphRunner(self, BLOCK_M)
        if DECODE_GEMM == "tuned" and not self.invariant_decode:
            self._tune_decode_gemms(graphs.sizes)
        with batch_invariant(self.invariant_decode):  # the kernels the replays run
            graphs.capture()
        top = graphs.sizes[-1]
        if self.kv.row_slots > top:
            log.info(
                "decode batches wider than %d rows (--cuda-graph-max-bs) run as several "
                "graph replays of whole requests (--batch-slots %d); a request with n > %d "
                "decodes eagerly",
                top, self.kv.row_slots, top,
            )  # fmt: skip
        return graphs

    def _tune_decode_gemms(self, sizes: list[int]) -> None:
        """``FLASHREC_DECODE_GEMM=tuned``: the GEMM of every linear layer's shape at each
        decode graph size, timed and chosen before the graphs capture it."""
        from flashrec.kernels import gemm_choice
        from flashrec.layers.linear import Linear

        linears = [m for m in self.model.modules() if isinstance(m, Linear)]
        gemm_choice.tune_sizes([(m.weight, m.weight_scale) for m in linears], sizes)

    def _capture_prefill_graphs(self) -> None:
        """The one-prompt prefill graphs and the piecewise prefill graphs, sharing one memory
        pool with the decode graphs and one set of padding slots (``pad_slots``)."""
        config = self.config
        on_gpu = self.device.type == "cuda"
        max_tokens = config.resolved_prefill_graph_max_tokens
        pw_tokens = config.resolved_piecewise_prefill_max_tokens
        graphs_ok = not (on_gpu and config.disable_cuda_graph)
        max_tokens = max_tokens if graphs_ok else 0
        pw_tokens = self._fit_piecewise(pw_tokens if graphs_ok else 0, max_tokens)
        if max_tokens or pw_tokens:  # each graph kind's largest bucket is its max tokens
            slots = self.kv.tokens.alloc(max(max_tokens, pw_tokens))
            self.pad_slots = torch.tensor(slots, dtype=torch.long, device=self.device)
        graph_pool = self.graphs.pool if self.graphs is not None else None
        if max_tokens:
            from flashrec.engine.prefill_graph import PrefillGraphRunner

            self.prefill_graphs = PrefillGraphRunner(self, max_tokens, self.pad_slots, graph_pool)
            if on_gpu:
                self.prefill_graphs.capture()
                graph_pool = self.prefill_graphs.pool
        if pw_tokens:
            from flashrec.engine.piecewise import PiecewisePrefill

            self.piecewise = PiecewisePrefill(self, pw_tokens, self.pad_slots, graph_pool)
            if on_gpu:
                self.piecewise.capture()

    def _fit_piecewise(self, top: int, whole: int) -> int:
        """``piecewise.fit_max_tokens`` for this runner's KV pool and configuration."""
        explicit = self.config.piecewise_prefill_max_tokens is not None
        return fit_max_tokens(top, whole, self.kv.pool_tokens, explicit)

    def _fused_qk_rope_kv(self, attn, qkv, positions, meta):
        """q/k norm + RoPE + KV write in one kernel; returns (q, k, v, stored=True)."""
        from flashrec.kernels.qk_rope_kv import qk_norm_rope_store

        lid, kv = attn.layer_id, self.kv
        kc, vc = (kv.k[lid], kv.v[lid]) if meta.mode == "prefill" else (kv.dk[lid], kv.dv[lid])
        qn = attn.q_norm.weight if attn.q_norm is not None else None
        kn = attn.k_norm.weight if attn.k_norm is not None else None
        eps = attn.q_norm.eps if attn.q_norm is not None else 0.0
        # FP8 KV prefill: k/v come back rounded as stored, so the prefill attention reads them
        # from the QKV row instead of gathering and converting the pool
        round_kv = meta.mode == "prefill" and self._prefill_reads_qkv
        q, k, v = qk_norm_rope_store(
            qkv, attn.hq, attn.hkv, attn.d, positions, self.ctx.cos_sin, qn, kn, eps, kc, vc,
            meta.out_loc, round_kv=round_kv, hw_round=self.config.qk_rope_rounding == "hardware",
        )  # fmt: skip
        if round_kv:
            meta.kv_rounded = True
        return q, k, v, True

    def decode_meta(self, groups_in) -> DecodeMeta:
        mc = self.model_config
        rows = sum(len(g[0]) for g in groups_in)
        if self.graphs is not None and self.graphs.fits(rows):
            rows = self.graphs.bucket(rows)  # the replayed size decides whether it may split
        return make_decode_meta(
            groups_in,
            self.kv.depth,
            self.device,
            packed=self.attn.needs_packed,
            group_size=mc.num_attention_heads // mc.num_key_value_heads,
            num_kv_heads=mc.num_key_value_heads,
            sms=self.num_sms,
            split_rows=rows,
            max_splits=self.config.resolved_decode_max_splits,
        )

    @functools.cached_property
    def num_sms(self) -> int:
        """Multiprocessors of the device (read once: decode_meta asks every step)."""
        if self.device.type != "cuda":
            return 1
        return torch.cuda.get_device_properties(self.device).multi_processor_count

    def _resolve_fp8(self, mc: ModelConfig) -> bool:
        """FP8 GEMMs only when asked: ``--quantization fp8``, or a checkpoint whose
        ``quantization_config`` says FP8 (then ``--quantization`` of another value dequantizes
        it). A BF16 checkpoint is never quantized at load unless the flag says so: on-load
        quantization moves beam overlap with HF (the design notes' FP8 rule)."""
        q = self.config.quantization
        if q is None:
            return mc.is_fp8_checkpoint
        return q.lower() == "fp8"

    def _pool_tokens(self, mc: ModelConfig, kv_dtype: torch.dtype, staging: int = 0) -> int:
        """--kv-pool-tokens, or as many tokens as the static memory budget holds after the
        decode rows, each with ``staging`` bytes more where the attention backend keeps a
        buffer as long as the pool (the FP8 staging of --decode-prompt-attention)."""
        if self.config.kv_pool_tokens:
            return self.config.kv_pool_tokens
        per_token = mc.kv_bytes_per_token(torch.empty(0, dtype=kv_dtype).element_size())
        if self.device.type != "cuda":
            return max(4096, min(262144, (1 << 30) // per_token))
        free, total = torch.cuda.mem_get_info(self.device)
        budget = free - total * (1.0 - self.config.mem_fraction_static)
        decode = 2 * self.config.resolved_batch_slots * self.depth * per_token
        return max(4096, int((budget - decode) // (per_token + staging)))

    @torch.inference_mode()
    def prefill(
        self, input_ids: torch.Tensor, meta: PrefillMeta, alone: bool = True
    ) -> torch.Tensor:
        """Runs the new tokens of a prefill batch; returns [B, K] level-0 logprobs. ``alone``:
        no other request is running, the only case the whole-forward prefill graph of one
        prompt is replayed (its SDPA attention is padded to the bucket). Other batches up to
        ``--piecewise-prefill-max-tokens`` replay the piecewise graphs (attention eager, on
        the real tokens); larger ones run eagerly."""
        with trace_range("flashrec.prefill"):
            pg, pw = self.prefill_graphs, self.piecewise
            one = alone and pg is not None and pg.fits(meta)
            many = not one and pw is not None and pw.fits(meta)
            self.graph_stats.count("prefill", self._prefill_path(meta, one, many))
            if one:
                return pg.run(input_ids, meta)
            if many:
                return pw.run(input_ids, meta)
            h = self.model(input_ids, meta.positions, meta, self.ctx, select=meta.last_index)
            return self.lm_head.level_logprobs(h, 0)

    def _prefill_path(self, meta: PrefillMeta, one: bool, many: bool) -> tuple[str, str | None]:
        """``graph_stats.prefill_path`` for a batch the one-prompt graph takes (``one``), the
        piecewise graphs take (``many``) or neither."""
        pg, pw = self.prefill_graphs, self.piecewise
        widest = pw if pw is not None else pg
        return prefill_path(
            one if pg is not None else None, many if pw is not None else None,
            len(meta.new_lens), sum(meta.new_lens), widest.sizes[-1] if widest is not None else 0,
            MAX_SEQS if pw is not None else 1, self.device.type == "cuda", self._off,
        )  # fmt: skip

    @torch.inference_mode()
    def decode(
        self, input_ids: torch.Tensor, meta: DecodeMeta, levels: list[int]
    ) -> list[torch.Tensor]:
        """One decode forward over all beam rows; returns per group the logprobs of the level
        it decodes next (``levels[i]``; level == depth means the end token)."""
        with trace_range("flashrec.decode"), batch_invariant(self.invariant_decode):
            return self._head(self._decode_forward(input_ids, meta), meta.groups, levels)

    @property
    def decode_rows_limit(self) -> int | None:
        """The widest decode batch one graph replay holds (None: no decode graphs); the
        scheduler cuts wider batches into batches of whole requests up to it."""
        return self.graphs.sizes[-1] if self.graphs is not None else None

    def _decode_forward(self, input_ids: torch.Tensor, meta: DecodeMeta) -> torch.Tensor:
        """The model forward over the beam rows: a graph replay where one fits, else eager
        (counted in ``decode_forwards`` and ``graph_stats`` by reason; with graphs captured,
        logged once per width)."""
        rows = input_ids.shape[0]
        sizes = self.graphs.sizes if self.graphs is not None else ()
        fits = bool(sizes) and rows <= sizes[-1]
        path = decode_path(sizes, rows, fits and self.attn.decode_graph_fits(meta), self._off)
        self.graph_stats.count("decode", path)
        if path[1] is None:
            self.decode_forwards["graph"] += 1
            return self.graphs.run(input_ids, meta)
        self.decode_forwards["eager"] += 1
        self.graph_stats.warn_eager(path[1], rows, sizes)
        return self.model(input_ids, meta.positions, meta, self.ctx)

    def step_batch_ok(self, widths: list[int], levels: list[int]) -> bool:
        """Whether a decode batch can run as one static step: every request has n = the beam
        width and a SID level before the end token (greedy and sampled requests alike)."""
        if self.step is None:
            return False
        bw = self.config.beam_width
        return all(w == bw for w in widths) and all(1 <= lv < self.depth for lv in levels)

    def step_serves(self, catalogs: list) -> bool:
        """Whether the static step (and its captured graph) may run a batch of requests of
        ``catalogs``: only when all are the step's catalog (same content hash). Otherwise the
        batch decodes through the regular forward and the eager expansion, each request with
        its own trie (logged once per swap, counted in /metrics)."""
        own = self.step_catalog.hash if self.step_catalog is not None else None
        if all((c.hash if c is not None else None) == own for c in catalogs):
            return True
        if not self._other_catalog_logged:
            self._other_catalog_logged = True
            log.info(
                "decode batches holding requests of a catalog other than the step graph's "
                "(%s) expand eagerly (flashrec_decode_other_catalog_steps_total)",
                own,
            )
        return False

    def use_catalog(self, catalog) -> bool:
        """On a catalog swap (engine thread, between steps): rebuild the static step for
        ``catalog`` where no step graph captured the old one (a few small tensors); True when
        rebuilt. A captured step graph keeps its catalog (re-capture is not done here)."""
        self._other_catalog_logged = False
        if self.step is None or (self.graphs is not None and self.graphs.step_sizes):
            return False
        step = StaticStep(self.lm_head, catalog.trie, self.layout, self.depth, self.device)
        if not step.usable:
            return False
        self.step, self.step_catalog = step, catalog
        return True

    @torch.inference_mode()
    def decode_step(
        self,
        input_ids: torch.Tensor,
        meta: DecodeMeta,
        levels: torch.Tensor,
        cum: torch.Tensor,
        nodes: torch.Tensor,
        temps: torch.Tensor | None = None,
        seeds: torch.Tensor | None = None,
    ) -> StaticStepOut:
        """The whole decode step of ``B`` requests of width ``--beam-width`` (``levels``,
        ``temps`` (0 = greedy; None: all greedy), ``seeds [B]``; ``cum`` / ``nodes [B, n]``):
        one graph replay on GPU when a step graph of that size was captured; else the model
        forward (graph or eager) and the same static step eagerly.
        The decode KV is reordered by parent inside. Returns views the next call overwrites."""
        with trace_range("flashrec.decode_step"), batch_invariant(self.invariant_decode):
            rows = input_ids.shape[0]
            if (
                self.graphs is not None
                and self.graphs.has_step(rows)
                and self.attn.decode_graph_fits(meta)
            ):
                self.decode_forwards["graph"] += 1
                self.graph_stats.replay("step")
                return self.graphs.run_step(input_ids, meta, levels, cum, nodes, temps, seeds)
            h = self._decode_forward(input_ids, meta)
            out = self.step.run(h, levels, cum, nodes, temps, seeds)
            reorder_rows(self.kv, meta.rows, out.parents)
            return out

    def _head(self, h: torch.Tensor, groups, levels: list[int]) -> list[torch.Tensor]:
        """Per-group logprobs: ONE restricted LM-head product per run of consecutive groups at
        the same level (the scheduler orders decode batches by level), split into per-group
        views; not one small product per request."""
        out: list[torch.Tensor] = []
        i = 0
        for level, run in itertools.groupby(levels):
            same = groups[i : i + len(list(run))]
            i += len(same)
            a, b = same[0].start, same[-1].end
            if level >= self.depth:
                lp = self.lm_head.end_logprobs(h[a:b])
            else:
                lp = self.lm_head.level_logprobs(h[a:b], level)
            out.extend(lp[g.start - a : g.end - a] for g in same)
        return out
