"""``ModelConfig``: the architecture fields the engine needs, parsed from a HF ``config.json``;
what the engine cannot serve as written (sliding windows, RoPE scaling, non-SiLU, MLP bias) is
refused here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


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
