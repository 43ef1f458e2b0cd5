"""Model registry keyed by config.json ``architectures``; lazily imported."""

from __future__ import annotations

import importlib

from flashrec.config import ModelConfig

MODEL_REGISTRY: dict[str, str] = {
    "Qwen3ForCausalLM": "flashrec.models.qwen3:Qwen3ForCausalLM",
    "LlamaForCausalLM": "flashrec.models.qwen3:LlamaForCausalLM",
    "Qwen2ForCausalLM": "flashrec.models.qwen3:Qwen2ForCausalLM",
}


def get_model_class(cfg: ModelConfig):
    target = MODEL_REGISTRY.get(cfg.architecture)
    if target is None:
        raise ValueError(
            f"unsupported architecture {cfg.architecture!r}; supported: {', '.join(sorted(MODEL_REGISTRY))}"
        )
    mod, name = target.split(":")
    return getattr(importlib.import_module(mod), name)
