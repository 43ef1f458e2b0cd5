"""Frozen configuration objects: ModelConfig (from config.json), EngineConfig, ServerConfig.

CLI flags are generated from the dataclass fields (name -> ``--name-with-dashes``), so the
defaults and help texts live in exactly one place. Nothing mutates a config after start-up;
derived sizes are properties or are returned by the components that compute them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _opt(default: Any, help: str, choices: tuple | None = None, flag: bool = False) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices, "flag": flag})


def _check_full_attention(cfg: dict) -> None:
    """ValueError for a config whose layers attend through a sliding window (Qwen2 / Qwen3's
    ``use_sliding_window`` from layer ``max_window_layers`` on, or ``layer_types``): every
    FlashRec attention path attends to the whole prompt, so serving it would silently change
    the model. A window at least ``max_position_embeddings`` wide never cuts anything."""
    layers = int(cfg["num_hidden_layers"])
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types:
        sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    elif cfg.get("use_sliding_window") and window is not None:
        first = int(cfg.get("max_window_layers", 0) or 0)
        sliding = list(range(min(first, layers), layers))
    else:
        sliding = []
    longest = int(cfg.get("max_position_embeddings", 32768))
    if sliding and (window is None or int(window) < longest):
        raise ValueError(
            f"sliding-window attention (sliding_window={window}, layers {sliding[0]}.."
            f"{sliding[-1]}) is not supported: FlashRec attends to the whole prompt in every "
            "layer; set use_sliding_window=false if the model was trained without it"
        )


@dataclass(frozen=True)
class ModelConfig:
    """The architecture fields the engine needs, parsed from a HF ``config.json``."""

    architecture: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = True
    hidden_act: str = "silu"
    torch_dtype: str = "bfloat16"
    quantization_config: dict | None = None

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def is_fp8_checkpoint(self) -> bool:
        qc = self.quantization_config or {}
        return str(qc.get("quant_method", "")).lower() == "fp8"

    @property
    def fp8_block_size(self) -> tuple[int, int] | None:
        """An FP8 checkpoint's ``weight_block_size`` (block-wise weight scales), if any."""
        size = (self.quantization_config or {}).get("weight_block_size")
        if not size:
            return None
        if len(size) != 2 or any(int(b) < 1 for b in size):
            raise ValueError(f"quantization_config.weight_block_size {size!r} is not [rows, cols]")
        return int(size[0]), int(size[1])

    def kv_bytes_per_token(self, dtype_size: int) -> int:
        """Bytes of K and V for one token over all layers."""
        return 2 * self.num_key_value_heads * self.head_dim * self.num_hidden_layers * dtype_size

    @classmethod
    def from_dict(cls, cfg: dict) -> ModelConfig:
        archs = cfg.get("architectures") or []
        if not archs:
            raise ValueError("config.json has no 'architectures' field")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        rope_theta = cfg.get("rope_theta")
        if rope_theta is None:
            rp = cfg.get("rope_parameters") or {}
            rope_theta = rp.get("rope_theta", 10000.0)
        if cfg.get("mlp_bias"):
            raise ValueError("mlp_bias=true is not supported (no dense GenRec backbone uses it)")
        if str(cfg.get("hidden_act", "silu")) != "silu":
            raise ValueError(
                f"hidden_act {cfg.get('hidden_act')!r} is not supported (SwiGLU/silu only)"
            )
        scaling = cfg.get("rope_scaling")
        if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            raise ValueError(f"rope_scaling {scaling!r} is not supported")
        _check_full_attention(cfg)
        return cls(
            architecture=archs[0],
            hidden_size=hidden,
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads", heads)),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases and never an o_proj bias; Llama / Qwen3 put one on
            # all four projections when attention_bias is set
            qkv_bias=archs[0] == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
            o_bias=archs[0] != "Qwen2ForCausalLM" and bool(cfg.get("attention_bias", False)),
            qk_norm=archs[0] == "Qwen3ForCausalLM",
            hidden_act=str(cfg.get("hidden_act", "silu")),
            torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
            quantization_config=cfg.get("quantization_config"),
        )

    @classmethod
    def from_path(cls, model_path: str | Path) -> ModelConfig:
        path = Path(model_path) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no config.json in the model directory")
        return cls.from_dict(json.loads(path.read_text()))


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine (model runner, beam search, scheduler) is built from."""

    model_path: str = _opt(
        "", "HF-format checkpoint directory (config.json, tokenizer, safetensors)"
    )
    sid_vocab_file: str | None = _opt(
        None,
        "catalog of valid SIDs (comma-key JSON, RecIF sid2pid.json, list-of-lists JSON or text lines); without it decoding is unconstrained (smoke only)",
    )
    sid: str | None = _opt(
        None,
        "override the SID layout: START:END/SIZE[,begin=ID][,end=ID] (token ids START..END-1 are codebooks of SIZE codes)",
    )
    device: str | None = _opt(None, "cpu or cuda (default: cuda when available)", ("cpu", "cuda"))
    dtype: str | None = _opt(
        None,
        "activation / unquantized weight dtype (default: bfloat16 on cuda, float32 on cpu)",
        ("float32", "bfloat16", "float16"),
    )
    quantization: str | None = _opt(
        None,
        "fp8 = W8A8 per-channel FP8 (BF16 weights quantized at load); any other value = "
        "unquantized weights in --dtype; default: FP8 only for a checkpoint whose "
        "quantization_config says FP8",
    )
    kv_cache_dtype: str = _opt(
        "auto", "KV cache dtype: auto (= --dtype) or fp8_e4m3", ("auto", "fp8_e4m3")
    )
    logprob_scope: str = _opt(
        "level",
        "log_softmax over the current level's codes (level), the whole SID range (sid) or the full vocabulary (full)",
        ("level", "sid", "full"),
    )
    length_penalty: float = _opt(1.0, "sequence_score = cum_logprob / gen_len ** length_penalty")
    beam_width: int = _opt(
        50, "default beam width n (a request's n overrides it); also the CUDA-graph capture unit"
    )
    batch_slots: int | None = _opt(
        None, "beam-row slot budget shared by all running requests (default: --cuda-graph-max-bs)"
    )
    cuda_graph_max_bs: int = _opt(
        800,
        "largest decode batch (beam rows) captured as a CUDA graph; wider batches replay it per "
        "whole request, and a request with n above it decodes eagerly",
    )
    decode_max_splits: int = _opt(
        8,
        "most prompt splits (split-K) of the GPU beam-decode attention on narrow batches (1-8; 1 = never split)",
    )
    disable_cuda_graph: bool = _opt(
        False, "run decode eagerly (never a silent fallback)", flag=True
    )
    enable_step_graph: bool | None = _opt(
        None,
        "capture each decode step whole (forward, LM head, trie mask, top-n, beam expansion, KV "
        "reorder) as one CUDA graph; default: on where decode CUDA graphs are captured",
    )
    overlap_results: bool | None = _opt(
        None,
        "hand a step's finished requests back after the next step's GPU work is launched, so the "
        "GPU does not idle while the host answers; default: on with CUDA",
    )
    prefill_graph_max_tokens: int | None = _opt(
        None,
        "a lone prompt of at most this many tokens with no cached prefix replays a whole-forward "
        "CUDA graph (128-token buckets); 0 = off; default: 2048 where CUDA graphs are captured, "
        "else 0",
    )
    piecewise_prefill_max_tokens: int | None = _opt(
        None,
        "a prefill batch of at most this many new tokens replays per-layer CUDA graphs around "
        "eager attention; 0 = off; capped at --max-prefill-tokens; default: 8192 where CUDA "
        "graphs are captured, else 0",
    )
    attention_backend: str | None = _opt(
        None,
        "attention backend: torch (reference, CPU), triton (GPU: SDPA prefill + Triton beam "
        "decode) or flashinfer (GPU: FlashInfer ragged prefill + Triton beam decode); default: "
        "flashinfer where it supports the model, else triton; torch on CPU",
        ("torch", "triton", "flashinfer"),
    )
    max_seq_len: int = _opt(
        8192, "longest accepted prompt (tokens); longer prompts are rejected with 400"
    )
    max_prefill_tokens: int = _opt(16384, "tokens prefilled together in one forward")
    mem_fraction_static: float = _opt(
        0.85, "fraction of free GPU memory given to weights + KV pool"
    )
    kv_pool_tokens: int | None = _opt(
        None, "prompt KV pool size in tokens (default: from free memory, or 262144 on cpu)"
    )
    enable_prefix_cache: bool = _opt(True, "radix prefix cache over prompt tokens")
    prefix_cache_min_match: int = _opt(
        32,
        "a radix match shorter than this many tokens is not used and the prompt prefills whole "
        "(gathering a short prefix from the pool costs more than recomputing it)",
    )
    schedule_policy: str = _opt(
        "lpm",
        "admission order: longest prefix match (with aging) or first come first served",
        ("lpm", "fcfs"),
    )
    lpm_aging_ms: float = _opt(
        100.0,
        "LPM aging: a request that has waited this long is admitted in arrival order ahead of longest-prefix-match order (no starvation)",
    )
    max_queue_len: int = _opt(4096, "waiting requests accepted before 503")
    enable_fused_rms_fp8: bool = _opt(
        True,
        "fused RMSNorm(+residual) -> per-token FP8 quant kernel (GPU, FP8); bf16/fp16 layers use the same kernel without the quant",
    )
    enable_fused_silu_fp8: bool = _opt(
        True,
        "fused SiLU(gate)*up -> per-token FP8 quant kernel (GPU, FP8); bf16/fp16 layers use the same kernel without the quant",
    )
    enable_fused_qk_rope_kv: bool = _opt(True, "fused q/k RMSNorm + RoPE + KV write kernel (GPU)")
    qk_rope_rounding: str = _opt(
        "hardware",
        "how the fused q/k norm + RoPE + KV write kernel rounds to bf16 (GPU): hardware (an "
        "inline-PTX conversion, faster) or emulated (integer arithmetic); both give HF's bits",
        ("emulated", "hardware"),
    )
    enable_prefill_last_rows: bool = _opt(
        True,
        "prefill runs the last layer's o_proj, post-attention norm and MLP on each prompt's last "
        "token only (the row the level-0 logits read): ~1/L of the GEMM work saved",
    )

    def __post_init__(self) -> None:
        _check_choice(self, "qk_rope_rounding")
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
        if not 1 <= self.decode_max_splits <= 8:
            raise ValueError(f"--decode-max-splits must be in 1..8, got {self.decode_max_splits}")

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
        return 2048 if self.graphs_on else 0

    @property
    def resolved_piecewise_prefill_max_tokens(self) -> int:
        top = self.piecewise_prefill_max_tokens
        if top is None:
            top = 8192 if self.graphs_on else 0
        return min(top, self.max_prefill_tokens)

    @property
    def resolved_batch_slots(self) -> int:
        return self.batch_slots or self.cuda_graph_max_bs


@dataclass(frozen=True)
class ServerConfig(EngineConfig):
    """Engine configuration plus the HTTP front end."""

    host: str = _opt(
        "127.0.0.1", "bind address (the server has no authentication: keep it on loopback)"
    )
    port: int = _opt(8000, "bind port (0 = pick a free one and print it)")
    served_model_name: str | None = _opt(
        None, "model name reported by /v1/models (default: the directory name)"
    )
    max_body_bytes: int = _opt(8 * 1024 * 1024, "largest accepted request body (413 above)")
    shutdown_timeout_s: float = _opt(
        30.0, "on SIGTERM, how long in-flight requests may take to finish"
    )
    # slow clients: a connection may not hold the server longer than these (0 = no limit)
    header_timeout_s: float = _opt(
        10.0,
        "a request's headers must be complete this many seconds after its first byte (after "
        "the connection opens, for its first request); else 408 and the connection is closed",
    )
    body_timeout_s: float = _opt(
        30.0,
        "a request's body must arrive whole this many seconds after its headers; else 408 and "
        "the connection is closed",
    )
    warmup: bool = _opt(True, "run warm-up requests before /health reports ok")
    gc_freeze: bool = _opt(
        True,
        "after warm-up, move every live object to Python's permanent GC generation (gc.freeze): "
        "full collections, which stop the engine thread too, then walk only what requests "
        "allocated",
    )
    tokenizer_workers: int = _opt(
        4,
        "threads that build prompts (chat template + tokenization) in parallel, each with its "
        "own tokenizer copy; 1 = one thread over the engine's tokenizer",
    )
    respond_workers: int = _opt(
        0,
        "processes that build the JSON bodies of wide answers (at least 64 beams, not streamed) "
        "in parallel, off the event loop; 0 = on the event loop",
    )
    gil_switch_interval_ms: float = _opt(
        0.2,
        "sys.setswitchinterval of the server process, in ms: how long the HTTP / tokenizer "
        "threads may hold the GIL while the engine thread waits for it (Python's default is 5)",
    )
    engine_process: str = _opt(
        "auto",
        "run the engine (scheduler, model, profiler) in a process of its own, so that HTTP, "
        "tokenization and response text never hold its GIL: on, off, or auto (on with CUDA)",
        ("auto", "on", "off"),
    )
    event_loop: str = _opt(
        "asyncio",
        "the server's event loop: asyncio (the standard library's), uvloop (less host time for "
        "HTTP and hand-offs; pip install 'flashrec[fast]'), or auto (uvloop where installed)",
        ("auto", "uvloop", "asyncio"),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.tokenizer_workers <= 64:
            raise ValueError(f"--tokenizer-workers must be in 1..64, got {self.tokenizer_workers}")
        if not 0 <= self.respond_workers <= 64:
            raise ValueError(f"--respond-workers must be in 0..64, got {self.respond_workers}")
        for name in ("header_timeout_s", "body_timeout_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
        if not 0.01 <= self.gil_switch_interval_ms <= 100:
            raise ValueError(
                f"--gil-switch-interval-ms must be in 0.01..100, got {self.gil_switch_interval_ms}"
            )

        for name in ("engine_process", "event_loop"):
            _check_choice(self, name)
        if self.event_loop == "uvloop" and not _uvloop_installed():
            raise ValueError(
                "--event-loop uvloop: uvloop is not installed (pip install 'flashrec[fast]'), "
                "or use --event-loop asyncio / auto"
            )

    @property
    def resolved_event_loop(self) -> str:
        """``uvloop`` or ``asyncio`` (``--event-loop``; auto: uvloop where installed)."""
        if self.event_loop == "auto":
            return "uvloop" if _uvloop_installed() else "asyncio"
        return self.event_loop

    @property
    def resolved_engine_process(self) -> bool:
        """Whether the engine runs in a process of its own (``--engine-process``)."""
        if self.engine_process == "auto":
            return self.resolved_device == "cuda"
        return self.engine_process == "on"


def _check_choice(config: Any, name: str) -> None:
    """ValueError unless field ``name`` of ``config`` holds one of its declared ``choices``
    (what argparse checks for a flag, checked here for a config built without it)."""
    choices = next(f for f in dataclasses.fields(config) if f.name == name).metadata["choices"]
    value = getattr(config, name)
    if value not in choices:
        words = ", ".join(choices[:-1]) + " or " + choices[-1]
        flag = "--" + name.replace("_", "-")
        raise ValueError(f"{flag} must be {words}, got {value!r}")


def _uvloop_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("uvloop") is not None


def add_config_args(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one ``--flag`` per dataclass field of ``cls`` (defaults and help from the class)."""
    for f in dataclasses.fields(cls):
        name = "--" + f.name.replace("_", "-")
        meta = dict(f.metadata)
        if meta.get("help"):  # argparse formats help with %: a literal % must be %%
            meta["help"] = meta["help"].replace("%", "%%")
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        if kind in ("bool", "bool | None"):  # None: auto, resolved by the config
            parser.add_argument(
                name,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=f.default,
                help=meta.get("help"),
            )
            continue
        conv: Any = str
        if kind.startswith("int"):
            conv = int
        elif kind.startswith("float"):
            conv = float
        parser.add_argument(
            name,
            dest=f.name,
            type=conv,
            default=f.default,
            choices=meta.get("choices"),
            help=meta.get("help"),
        )


def config_from_args(cls: type, args: argparse.Namespace, **overrides: Any):
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in vars(args).items() if k in names}
    values.update(overrides)
    return cls(**values)


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
