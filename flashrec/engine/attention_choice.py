"""Which attention kernels an engine runs: ``--attention-backend`` and
``--decode-prompt-attention`` resolved on its device (auto picks, explicit asks checked)."""

from __future__ import annotations

import logging

import torch

from flashrec.config import EngineConfig, ModelConfig

log = logging.getLogger("flashrec")

# --decode-prompt-attention auto over an FP8 pool: from this --beam-width up (the served A/Bs in
# docs/baselines.md: n=256 and 512 win, n=50 loses; staging costs every prompt row per layer)
FP8_DECODE_PROMPT_MIN_BEAMS = 256


def pick_backend(
    config: EngineConfig, device: torch.device, dtype: torch.dtype, head_dim: int
) -> str:
    """``--attention-backend``: flashinfer where it can run (auto falls back to triton with a
    log line); asked for explicitly where it cannot: refused."""
    name = config.resolved_attention_backend
    if name != "flashinfer":
        return name
    from flashrec.layers.attention_flashinfer import unsupported_reason

    why = unsupported_reason(device, dtype, head_dim)
    if why is None:
        return name
    if config.attention_backend == "flashinfer":  # asked for explicitly: refuse
        raise ValueError(
            f"--attention-backend flashinfer cannot run here: {why}. "
            "Use --attention-backend triton (GPU) or torch."
        )
    log.info("attention backend: triton (flashinfer not used: %s)", why)
    return "triton"


def pick_decode_prompt(
    config: EngineConfig, backend: str, kv_dtype: torch.dtype, device: torch.device
) -> str:
    """``--decode-prompt-attention``: auto as :func:`decode_prompt_auto` decides; asked for
    explicitly without the flashinfer backend: refused."""
    mode = config.decode_prompt_attention
    if mode == "auto":
        hopper = device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9
        return decode_prompt_auto(
            backend, kv_dtype, hopper, config.deterministic, config.beam_width
        )
    if mode == "flashinfer" and backend != "flashinfer":
        raise ValueError(
            "--decode-prompt-attention flashinfer needs --attention-backend flashinfer "
            f"(this engine runs {backend})"
        )
    return mode


def decode_prompt_auto(
    backend: str, kv_dtype: torch.dtype, hopper: bool, deterministic: bool, beam_width: int
) -> str:
    """What ``--decode-prompt-attention auto`` runs: FlashInfer's prefill for the decode's
    prompt part where it was measured to win (the flashinfer backend on Hopper, fa3; a BF16
    KV cache, or an FP8 one on a server whose --beam-width, the graphs' capture unit, is at
    least ``FP8_DECODE_PROMPT_MIN_BEAMS``), never under --deterministic; else the Triton
    kernel."""
    if backend != "flashinfer" or not hopper or deterministic:
        return "triton"
    if kv_dtype == torch.bfloat16:
        return "flashinfer"
    fp8 = kv_dtype == torch.float8_e4m3fn
    return "flashinfer" if fp8 and beam_width >= FP8_DECODE_PROMPT_MIN_BEAMS else "triton"


def staging_bytes_per_token(mode: str, kv_dtype: torch.dtype, mc: ModelConfig) -> int:
    """Device bytes per KV-pool token of the buffer the FlashInfer decode path keeps beside an
    FP8 pool (its prompt rows staged as bfloat16, K and V, as many rows as the pool), so that
    an auto-sized pool leaves room for it; 0 where no such buffer is made."""
    from flashrec.layers.attention_flashinfer import stages_prompt_kv

    if mode != "flashinfer" or not stages_prompt_kv(kv_dtype):
        return 0
    return 2 * mc.num_key_value_heads * mc.head_dim * torch.bfloat16.itemsize
