"""Synthetic model presets and the per-architecture naming rules their checkpoints follow."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class ArchSpec:
    """How one HF architecture names and shapes its decoder-layer tensors."""

    model_type: str
    qk_norm: bool  # per-head RMSNorm on q and k (``self_attn.q_norm`` / ``k_norm``)
    qkv_bias: bool | None  # None: follows ``attention_bias``; True: always (Qwen2)
    o_bias: bool  # o_proj gets a bias when q/k/v do (Llama, Qwen3), not in Qwen2


ARCHS: dict[str, ArchSpec] = {
    "Qwen3ForCausalLM": ArchSpec("qwen3", qk_norm=True, qkv_bias=None, o_bias=True),
    "LlamaForCausalLM": ArchSpec("llama", qk_norm=False, qkv_bias=None, o_bias=True),
    "Qwen2ForCausalLM": ArchSpec("qwen2", qk_norm=False, qkv_bias=True, o_bias=False),
}


@dataclass(frozen=True)
class SynthPreset:
    """Shape of a synthetic checkpoint; every field can be overridden in ``build_checkpoint``."""

    architecture: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    codebook_size: int
    num_levels: int
    vocab_size: int | None = None  # padded model vocabulary; None = exactly the tokenizer size
    tie_word_embeddings: bool = True
    rope_theta: float = 1e6
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    default_dtype: str = "float32"  # what ``flashrec synth`` writes without --dtype

    def __post_init__(self) -> None:
        if self.architecture not in ARCHS:
            raise ValueError(f"unknown architecture {self.architecture!r}; known: {sorted(ARCHS)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.num_levels < 1 or self.codebook_size < 1:
            raise ValueError("num_levels and codebook_size must be >= 1")

    @property
    def arch(self) -> ArchSpec:
        return ARCHS[self.architecture]

    @property
    def model_type(self) -> str:
        return self.arch.model_type

    @property
    def qkv_bias(self) -> bool:
        return self.attention_bias if self.arch.qkv_bias is None else self.arch.qkv_bias

    @property
    def o_bias(self) -> bool:
        return self.qkv_bias and self.arch.o_bias

    def replace(self, **overrides: object) -> SynthPreset:
        """A copy with some fields changed; unknown field names raise ``TypeError``."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"unknown SynthPreset field(s) {unknown}; known: {sorted(names)}")
        return dataclasses.replace(self, **overrides)


_TINY = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    codebook_size=64,
    num_levels=3,
)

PRESETS: dict[str, SynthPreset] = {
    "tiny": SynthPreset("Qwen3ForCausalLM", **_TINY),
    "tiny-llama": SynthPreset("LlamaForCausalLM", **_TINY, tie_word_embeddings=False),
    "tiny-qwen2": SynthPreset("Qwen2ForCausalLM", **_TINY, attention_bias=True),
    "onerec-1.7b": SynthPreset(
        "Qwen3ForCausalLM",
        hidden_size=2048,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=6144,
        codebook_size=8192,
        num_levels=3,
        vocab_size=176_384,
        max_position_embeddings=40_960,
        default_dtype="bf16",
    ),
    # 1.5B-class dense backbones with the same 3 x 8192 SID codebooks (issue: second backbone)
    "qwen2-1.5b": SynthPreset(
        "Qwen2ForCausalLM",
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        head_dim=128,
        intermediate_size=8960,
        codebook_size=8192,
        num_levels=3,
        vocab_size=176_384,
        max_position_embeddings=32_768,
        attention_bias=True,
        default_dtype="bf16",
    ),
    "llama-1.5b": SynthPreset(
        "LlamaForCausalLM",
        hidden_size=2048,
        num_hidden_layers=20,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=8192,
        codebook_size=8192,
        num_levels=3,
        vocab_size=176_384,
        max_position_embeddings=32_768,
        rope_theta=500_000.0,
        default_dtype="bf16",
    ),
}
