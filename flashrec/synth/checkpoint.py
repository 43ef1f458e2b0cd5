"""``build_checkpoint``: a complete HF-format model directory from a preset and a seed."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

from flashrec.synth.catalog import synth_catalog, write_catalog_json
from flashrec.synth.confidence import NORM_NAME, calibrate_sid_entropy
from flashrec.synth.presets import PRESETS, SynthPreset
from flashrec.synth.tokenizer import TokenLayout, write_tokenizer
from flashrec.synth.weights import canonical_dtype, tensor_specs, write_safetensors

FP8_QUANT_CONFIG = {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "weight_scheme": "per_channel",
}
PROGRESS_PARAMS = 100_000_000  # print per-layer progress above this many parameters
INFO_FILE = "synth_info.json"


def resolve_preset(preset: str, **overrides: Any) -> SynthPreset:
    """The named preset with ``overrides`` applied; unknown names raise ``ValueError``."""
    if preset not in PRESETS:
        raise ValueError(f"unknown synth preset {preset!r}; known: {sorted(PRESETS)}")
    return PRESETS[preset].replace(**overrides)


def model_vocab_size(p: SynthPreset) -> int:
    """Rows of the embedding: the padded ``vocab_size`` or exactly the tokenizer size."""
    size = TokenLayout(p.codebook_size, p.num_levels).size
    if p.vocab_size is not None and p.vocab_size < size:
        raise ValueError(f"vocab_size={p.vocab_size} is smaller than the tokenizer ({size} tokens)")
    return p.vocab_size or size


def config_dict(p: SynthPreset, dtype: str = "float32") -> dict[str, Any]:
    """The ``config.json`` contents for preset ``p`` stored as ``dtype``."""
    dtype = canonical_dtype(dtype)
    layout = TokenLayout(p.codebook_size, p.num_levels)
    cfg: dict[str, Any] = {
        "architectures": [p.architecture],
        "model_type": p.model_type,
        "hidden_size": p.hidden_size,
        "intermediate_size": p.intermediate_size,
        "num_hidden_layers": p.num_hidden_layers,
        "num_attention_heads": p.num_attention_heads,
        "num_key_value_heads": p.num_key_value_heads,
        "head_dim": p.head_dim,
        "hidden_act": "silu",
        "vocab_size": model_vocab_size(p),
        "max_position_embeddings": p.max_position_embeddings,
        "rms_norm_eps": p.rms_norm_eps,
        "rope_theta": p.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": p.tie_word_embeddings,
        "attention_bias": p.qkv_bias,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": layout.endoftext_id,
        "eos_token_id": layout.eos_id,
        "pad_token_id": layout.endoftext_id,
        "torch_dtype": "float32" if dtype == "float32" else "bfloat16",
        "use_cache": True,
    }
    if p.model_type in ("qwen3", "qwen2"):
        cfg.update(
            use_sliding_window=False, sliding_window=None, max_window_layers=p.num_hidden_layers
        )
    if p.model_type == "llama":
        cfg.update(mlp_bias=False, pretraining_tp=1)
    if dtype == "fp8":
        cfg["quantization_config"] = dict(FP8_QUANT_CONFIG)
    return cfg


def num_parameters(p: SynthPreset) -> int:
    """Parameter count of the checkpoint (fp8 scales not counted)."""
    return sum(math.prod(s.shape) for s in tensor_specs(p, model_vocab_size(p)))


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def content_hash(out_dir: Path, names: list[str]) -> str:
    """sha256 over each named file's name and bytes, in sorted name order."""
    h = hashlib.sha256()
    for name in sorted(names):
        h.update(name.encode() + b"\0")
        with open(out_dir / name, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()


def build_checkpoint(
    out_dir: str | Path,
    preset: str = "tiny",
    *,
    seed: int = 0,
    dtype: str | None = None,
    catalog_size: int | None = None,
    progress: bool | None = None,
    sid_entropy: float | None = None,
    **overrides: Any,
) -> Path:
    """Write a loadable HF checkpoint with random weights into ``out_dir`` and return its path.

    Files: config.json, generation_config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json, special_tokens_map.json, catalog.json (only with ``catalog_size``)
    and synth_info.json (inputs + content hash). ``dtype`` is float32, bf16 (bfloat16) or fp8
    (decoder Linear weights FP8 with a per-row ``<name>_scale``, the rest bf16); None means the
    preset's ``default_dtype`` (float32 for the tiny presets, bf16 for onerec-1.7b). ``overrides``
    replace SynthPreset fields. ``progress`` (default: for models over 100M parameters) prints
    one line per layer to stderr. ``sid_entropy`` (nats; default off) scales ``model.norm.weight``
    so the mean per-step next-SID entropy under the level scope is that value (see
    ``flashrec.synth.confidence``), prints the entropy before and after to stderr and records
    both in synth_info.json under ``sid_entropy``. Same arguments, same bytes.
    """
    p = resolve_preset(preset, **overrides)
    dtype = canonical_dtype(dtype or p.default_dtype)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / INFO_FILE).unlink(missing_ok=True)  # no synth_info.json until the build is complete
    cfg = config_dict(p, dtype)
    _write_json(out / "config.json", cfg)
    gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    _write_json(out / "generation_config.json", gen)
    write_tokenizer(out, p.codebook_size, p.num_levels)
    names = [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "model.safetensors",
    ]
    if catalog_size is not None:
        write_catalog_json(
            synth_catalog(catalog_size, p.codebook_size, p.num_levels, seed), out / "catalog.json"
        )
        names.append("catalog.json")
    elif (out / "catalog.json").exists():
        (out / "catalog.json").unlink()  # a stale catalog from an earlier build would mislead
    specs = tensor_specs(p, cfg["vocab_size"])
    calib = None
    if sid_entropy is not None:
        calib = calibrate_sid_entropy(p, specs, seed, sid_entropy)
        print(
            f"synth: mean per-step SID entropy {calib.before:.3f} nats uncalibrated -> "
            f"{calib.achieved:.3f} nats (target {calib.target:g}, {NORM_NAME} x {calib.scale:g}; "
            f"per level {', '.join(f'{h:.3f}' for h in calib.per_level)})",
            file=sys.stderr,
            flush=True,
        )
        specs = [
            dataclasses.replace(s, scale=calib.scale) if s.name == NORM_NAME else s for s in specs
        ]
    if progress is None:
        progress = sum(math.prod(s.shape) for s in specs) > PROGRESS_PARAMS
    write_safetensors(out / "model.safetensors", specs, seed, dtype, progress=progress)
    info = {
        "preset": preset,
        "seed": seed,
        "dtype": dtype,
        "catalog_size": catalog_size,
        "overrides": dict(sorted(overrides.items())),
        "files": sorted(names),
        "content_hash": content_hash(out, names),
    }
    if calib is not None:
        info["sid_entropy"] = calib.info()
    _write_json(out / INFO_FILE, info)
    return out
