"""``EngineConfig``: everything the engine (model runner, beam search, scheduler) is built from;
defaults left ``None`` resolve per device in the ``resolved_*`` properties."""

from __future__ import annotations

import re
from dataclasses import dataclass

from flashrec.config.flags import check_choice, opt

# a catalog's name in --sid-vocab-file NAME=PATH, in requests and in /update_catalog
CATALOG_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
DEFAULT_CATALOG = "default"


def unknown_catalog(name: str | None, names) -> str:
    """The message of a request or control call naming a catalog the server does not hold."""
    return f"unknown catalog {name!r}; this server holds: {', '.join(names)}"


def parse_catalog_specs(
    value: str | tuple[str, ...] | list[str] | None,
) -> tuple[tuple[str, str], ...]:
    """``--sid-vocab-file`` value(s) as ``(name, path)`` pairs (see ``EngineConfig.catalog_specs``).
    ``NAME=PATH`` is named where the part before the first ``=`` is a catalog name (a path
    holding ``=`` is written ``./a=b.json``)."""
    if not value:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    out: list[tuple[str, str]] = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not CATALOG_NAME.fullmatch(name):
            name, path = DEFAULT_CATALOG, item
        if not path:
            raise ValueError(f"--sid-vocab-file {item!r}: no path after '{name}='")
        if any(n == name for n, _ in out):
            raise ValueError(
                f"--sid-vocab-file: catalog name {name!r} given twice (name each file: NAME=PATH)"
            )
        out.append((name, path))
    return tuple(out)


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine (model runner, beam search, scheduler) is built from."""

    model_path: str = opt(
        "", "HF-format checkpoint directory (config.json, tokenizer, safetensors)"
    )
    sid_vocab_file: str | tuple[str, ...] | None = opt(
        None,
        "catalog of valid SIDs (comma-key JSON, RecIF sid2pid.json or pid2sid parquet, list-of-lists JSON or text lines); repeatable as NAME=PATH for named catalogs a request picks by its 'catalog' field (the first is the default; an unnamed file is 'default'); without it decoding is unconstrained (smoke only)",
        repeat=True,
    )
    packed_base: int | None = opt(
        None,
        "base B the catalog's packed-integer keys were written in (a*B^2 + b*B + c; also the default of /update_catalog's packed_base); default 8192, RecIF's sid2pid.json, never the model's codebook size",
    )
    max_catalog_bytes: int = opt(
        2 << 30,
        "largest catalog file read (--sid-vocab-file, /update_catalog, in bytes; 0 = no cap); "
        "a catalog path must name a regular file (a FIFO or a device is refused with its reason)",
    )
    catalog_read_timeout_s: float = opt(
        60.0,
        "a catalog file must be read whole within this many seconds (0 = no limit); else it is "
        "refused (400 for /update_catalog)",
    )
    sid: str | None = opt(
        None,
        "override the SID layout: START:END/SIZE[,begin=ID][,end=ID] (token ids START..END-1 are codebooks of SIZE codes)",
    )
    device: str | None = opt(None, "cpu or cuda (default: cuda when available)", ("cpu", "cuda"))
    dtype: str | None = opt(
        None,
        "activation / unquantized weight dtype (default: bfloat16 on cuda, float32 on cpu)",
        ("float32", "bfloat16", "float16"),
    )
    quantization: str | None = opt(
        None,
        "fp8 = W8A8 per-channel FP8 (BF16 weights quantized at load); any other value = "
        "unquantized weights in --dtype; default: FP8 only for a checkpoint whose "
        "quantization_config says FP8",
    )
    kv_cache_dtype: str = opt(
        "auto", "KV cache dtype: auto (= --dtype) or fp8_e4m3", ("auto", "fp8_e4m3")
    )
    logprob_scope: str = opt(
        "level",
        "log_softmax over the current level's codes (level), the whole SID range (sid) or the full vocabulary (full)",
        ("level", "sid", "full"),
    )
    length_penalty: float = opt(1.0, "sequence_score = cum_logprob / gen_len ** length_penalty")
    beam_width: int = opt(
        50, "default beam width n (a request's n overrides it); also the CUDA-graph capture unit"
    )
    batch_slots: int | None = opt(
        None, "beam-row slot budget shared by all running requests (default: --cuda-graph-max-bs)"
    )
    cuda_graph_max_bs: int = opt(
        800,
        "largest decode batch (beam rows) captured as a CUDA graph; wider batches replay it per "
        "whole request, and a request with n above it decodes eagerly",
    )
    decode_max_splits: int = opt(
        8,
        "most prompt splits (split-K) of the GPU beam-decode attention on narrow batches (1-8; 1 = never split)",
    )
    decode_prompt_attention: str = opt(
        "auto",
        "the prompt part of the GPU beam-decode attention: triton (one kernel with each beam's own "
        "keys), flashinfer (on batches of >= 512 rows, FlashInfer's prefill: paged over a "
        "bfloat16 pool, or ragged over the prompts staged as bfloat16 from an FP8 pool; then one "
        "kernel for the beams' own keys; needs --attention-backend flashinfer) or auto: "
        "flashinfer on Hopper GPUs with a bfloat16 KV cache, or an FP8 one and --beam-width >= "
        "256 (not under --deterministic), else triton",
        ("auto", "triton", "flashinfer"),
    )
    disable_cuda_graph: bool = opt(False, "run decode eagerly (never a silent fallback)", flag=True)
    enable_step_graph: bool | None = opt(
        None,
        "capture each decode step whole (forward, LM head, trie mask, top-n, beam expansion, KV "
        "reorder) as one CUDA graph; default: on where decode CUDA graphs are captured",
    )
    overlap_results: bool | None = opt(
        None,
        "hand a step's finished requests back after the next step's GPU work is launched, so the "
        "GPU does not idle while the host answers; default: on with CUDA",
    )
    prefill_graph_max_tokens: int | None = opt(
        None,
        "a lone prompt of at most this many tokens with no cached prefix replays a whole-forward "
        "CUDA graph (128-token buckets); 0 = off; default: 2048 where CUDA graphs are captured, "
        "else 0",
    )
    piecewise_prefill_max_tokens: int | None = opt(
        None,
        "a prefill batch of at most this many new tokens replays per-layer CUDA graphs around "
        "eager attention; 0 = off; capped at --max-prefill-tokens; default: 8192 where CUDA "
        "graphs are captured, else 0",
    )
    attention_backend: str | None = opt(
        None,
        "attention backend: torch (reference, CPU), triton (GPU: SDPA prefill + Triton beam "
        "decode) or flashinfer (GPU: FlashInfer ragged prefill + Triton beam decode); default: "
        "flashinfer where it supports the model, else triton; torch on CPU",
        ("torch", "triton", "flashinfer"),
    )
    max_seq_len: int = opt(
        8192, "longest accepted prompt (tokens); longer prompts are rejected with 400"
    )
    max_prefill_tokens: int = opt(16384, "tokens prefilled together in one forward")
    mem_fraction_static: float = opt(0.85, "fraction of free GPU memory given to weights + KV pool")
    kv_pool_tokens: int | None = opt(
        None,
        "prompt KV pool size in tokens (default: from free memory, counting the bfloat16 staging "
        "buffer of as many tokens that --decode-prompt-attention flashinfer keeps beside an FP8 "
        "pool; or 262144 on cpu)",
    )
    enable_prefix_cache: bool = opt(True, "radix prefix cache over prompt tokens")
    prefix_cache_min_match: int = opt(
        32,
        "a radix match shorter than this many tokens is not used and the prompt prefills whole "
        "(gathering a short prefix from the pool costs more than recomputing it)",
    )
    prefix_cache_max_nodes: int = opt(
        8192,
        "most radix prefix-cache nodes kept besides those running requests hold; past it the "
        "least recently used unreferenced prompts are evicted (bounds the host memory of many "
        "short distinct prompts); 0 = bounded only by the KV pool",
    )
    schedule_policy: str = opt(
        "lpm",
        "admission order: longest prefix match (with aging) or first come first served",
        ("lpm", "fcfs"),
    )
    lpm_aging_ms: float = opt(
        100.0,
        "LPM aging: a request that has waited this long is admitted in arrival order ahead of longest-prefix-match order (no starvation)",
    )
    max_queue_len: int = opt(4096, "waiting requests accepted before 503")
    enable_fused_rms_fp8: bool = opt(
        True,
        "fused RMSNorm(+residual) -> per-token FP8 quant kernel (GPU, FP8); bf16/fp16 layers use the same kernel without the quant",
    )
    enable_fused_silu_fp8: bool = opt(
        True,
        "fused SiLU(gate)*up -> per-token FP8 quant kernel (GPU, FP8); bf16/fp16 layers use the same kernel without the quant",
    )
    enable_fused_qk_rope_kv: bool = opt(True, "fused q/k RMSNorm + RoPE + KV write kernel (GPU)")
    qk_rope_rounding: str = opt(
        "hardware",
        "how the fused q/k norm + RoPE + KV write kernel rounds to bf16 (GPU): hardware (an "
        "inline-PTX conversion, faster) or emulated (integer arithmetic); both give HF's bits",
        ("emulated", "hardware"),
    )
    deterministic: bool = opt(
        False,
        "batch-invariant serving: a request's beams, scores and order do not depend on what "
        "else is batched with it (decode GEMMs with a fixed reduction order, one prompt per "
        "prefill forward, no prefix cache, no prompt split in decode attention)",
        flag=True,
    )
    weights_build: str = opt(
        "server",
        "where /update_weights_from_disk hashes and builds the new checkpoint on the CPU: server "
        "(the process holding the engine) or child (a child process at a lower priority, which "
        "keeps that work off the serving process's cores and interpreter lock at the cost of "
        "a slower update and a second copy in host memory)",
        ("server", "child"),
    )
    enable_prefill_last_rows: bool = opt(
        True,
        "prefill runs the last layer's o_proj, post-attention norm and MLP on each prompt's last "
        "token only (the row the level-0 logits read): ~1/L of the GEMM work saved",
    )

    def __post_init__(self) -> None:
        if isinstance(self.sid_vocab_file, list | tuple):  # --sid-vocab-file given repeatedly
            files = tuple(self.sid_vocab_file)
            object.__setattr__(self, "sid_vocab_file", files[0] if len(files) == 1 else files)
        self.catalog_specs  # noqa: B018 - names and paths checked here, at start-up
        check_choice(self, "qk_rope_rounding")
        check_choice(self, "decode_prompt_attention")
        check_choice(self, "weights_build")
        if self.prefix_cache_max_nodes < 0:
            raise ValueError(
                f"--prefix-cache-max-nodes must be >= 0, got {self.prefix_cache_max_nodes}"
            )
        if self.prefix_cache_min_match < 1:
            raise ValueError(
                f"--prefix-cache-min-match must be >= 1, got {self.prefix_cache_min_match}"
            )
        if self.piecewise_prefill_max_tokens is not None and not (
            0 <= self.piecewise_prefill_max_tokens <= 65536
        ):
            raise ValueError(
                "--piecewise-prefill-max-tokens must be in 0..65536, got "
                f"{self.piecewise_prefill_max_tokens}"
            )
        if self.prefill_graph_max_tokens is not None and not (
            0 <= self.prefill_graph_max_tokens <= 65536
        ):
            raise ValueError(
                f"--prefill-graph-max-tokens must be in 0..65536, got {self.prefill_graph_max_tokens}"
            )
        if self.deterministic and self.prefill_graph_max_tokens:
            raise ValueError(
                "--deterministic prefills a prompt the same way whatever else runs; the "
                "one-prompt prefill graph is used only when nothing else runs: leave "
                "--prefill-graph-max-tokens unset or 0"
            )
        if self.packed_base is not None and self.packed_base < 2:
            raise ValueError(f"--packed-base must be at least 2, got {self.packed_base}")
        if self.max_catalog_bytes < 0 or not self.catalog_read_timeout_s >= 0:
            raise ValueError("--max-catalog-bytes and --catalog-read-timeout-s must be >= 0")
        if self.cuda_graph_max_bs < 1:
            raise ValueError(
                f"--cuda-graph-max-bs must be >= 1, got {self.cuda_graph_max_bs} (to decode "
                "without CUDA graphs: --disable-cuda-graph)"
            )
        if not 1 <= self.decode_max_splits <= 8:
            raise ValueError(f"--decode-max-splits must be in 1..8, got {self.decode_max_splits}")
        if self.deterministic and self.decode_prompt_attention == "flashinfer":
            raise ValueError(
                "--deterministic decodes a request the same way whatever else runs; "
                "--decode-prompt-attention flashinfer picks its kernel by the batch's width: "
                "leave it at auto or triton"
            )

    @property
    def catalog_specs(self) -> tuple[tuple[str, str], ...]:
        """``(name, path)`` of each ``--sid-vocab-file`` (``NAME=PATH`` or ``PATH``, named
        ``default``), the default catalog first; empty without one. ValueError for a name
        given twice, an empty path, or several files of which one is unnamed."""
        return parse_catalog_specs(self.sid_vocab_file)

    @property
    def catalog_names(self) -> tuple[str, ...]:
        """The names a request may pick, the default first (``default`` alone without a
        catalog: the unconstrained search)."""
        return tuple(name for name, _ in self.catalog_specs) or (DEFAULT_CATALOG,)

    @property
    def resolved_device(self) -> str:
        if self.device:
            return self.device
        try:
            import torch

            return "cuda" if torch.cuda.is_available() else "cpu"
        except Exception:  # pragma: no cover
            return "cpu"

    @property
    def resolved_dtype(self) -> str:
        if self.dtype:
            return self.dtype
        return "bfloat16" if self.resolved_device == "cuda" else "float32"

    @property
    def resolved_attention_backend(self) -> str:
        if self.attention_backend:
            return self.attention_backend
        if self.resolved_device != "cuda":
            return "torch"
        import importlib.util

        return "flashinfer" if importlib.util.find_spec("flashinfer") else "triton"

    @property
    def graphs_on(self) -> bool:
        """Whether decode CUDA graphs are captured (a GPU, no --disable-cuda-graph)."""
        return self.resolved_device == "cuda" and not self.disable_cuda_graph

    @property
    def resolved_enable_step_graph(self) -> bool:
        """Whether decode steps replay the whole-step graph (``--enable-step-graph``)."""
        if self.enable_step_graph is not None:
            return self.enable_step_graph
        return self.graphs_on

    @property
    def resolved_overlap_results(self) -> bool:
        """Whether finished requests' results are handed back one step later while other work
        is queued (``--overlap-results``)."""
        if self.overlap_results is not None:
            return self.overlap_results
        # on with CUDA, where the GPU runs while the host answers; on CPU the host and the
        # device are the same cores, so there is nothing to overlap
        return self.resolved_device == "cuda"

    @property
    def resolved_prefill_graph_max_tokens(self) -> int:
        if self.prefill_graph_max_tokens is not None:
            return self.prefill_graph_max_tokens
        return 2048 if self.graphs_on and not self.deterministic else 0

    @property
    def resolved_enable_prefix_cache(self) -> bool:
        """Radix prefix cache: off under ``--deterministic`` (a prompt always prefills whole)."""
        return self.enable_prefix_cache and not self.deterministic

    @property
    def resolved_decode_max_splits(self) -> int:
        """Prompt splits of the GPU beam-decode attention: 1 under ``--deterministic`` (how
        many splits a narrow batch gets depends on the batch)."""
        return 1 if self.deterministic else self.decode_max_splits

    @property
    def resolved_piecewise_prefill_max_tokens(self) -> int:
        top = self.piecewise_prefill_max_tokens
        if top is None:
            top = 8192 if self.graphs_on else 0
        return min(top, self.max_prefill_tokens)

    @property
    def resolved_batch_slots(self) -> int:
        return self.batch_slots or self.cuda_graph_max_bs
