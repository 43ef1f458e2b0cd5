"""Synthetic checkpoints, tokenizers, catalogs and prompt sets, deterministic by seed.

Module map::

    presets     SynthPreset, PRESETS (model shapes) and ARCHS (per-architecture tensor naming)
    tokenizer   byte-level tokenizer + ChatML specials + contiguous SID tokens, HF files
    weights     random init, per-channel FP8, streaming safetensors writer
    checkpoint  build_checkpoint: config.json, tokenizer, weights, catalog, synth_info.json
    confidence  calibrate_sid_entropy: scale model.norm.weight to a target next-SID entropy
    catalog     synth_catalog / write_catalog_json (comma-key JSON)
    prompts     synth_prompts: chat requests with log-normal lengths
    cli         add_synth_args / run_synth (``flashrec synth``)
"""

from __future__ import annotations

from flashrec.synth.catalog import read_catalog_json, synth_catalog, write_catalog_json
from flashrec.synth.checkpoint import build_checkpoint, config_dict, num_parameters, resolve_preset
from flashrec.synth.cli import add_synth_args, run_synth
from flashrec.synth.presets import ARCHS, PRESETS, SynthPreset
from flashrec.synth.prompts import synth_prompts, synth_system_prompt
from flashrec.synth.tokenizer import TokenLayout, format_sid, sid_token
from flashrec.synth.weights import quantize_fp8

__all__ = [
    "ARCHS",
    "PRESETS",
    "SynthPreset",
    "TokenLayout",
    "add_synth_args",
    "build_checkpoint",
    "config_dict",
    "format_sid",
    "num_parameters",
    "quantize_fp8",
    "read_catalog_json",
    "resolve_preset",
    "run_synth",
    "sid_token",
    "synth_catalog",
    "synth_prompts",
    "synth_system_prompt",
    "write_catalog_json",
]
