"""Model FLOPs, model-FLOP utilisation (MFU) and the HF beam-KV memory estimate.

Counting (documented in docs/harness.md, "mfu"):

* ``linear_params`` = the weights of the decoder's linear layers, from ``config.json``:
  per layer ``q + k + v + o + gate + up + down`` = ``h*(H*d) + 2*h*(K*d) + (H*d)*h + 3*h*I``
  (h hidden size, H attention heads, K KV heads, d head dim, I intermediate size), times the
  layers. Embeddings, the (restricted) LM head, norms and biases are not counted.
* FLOPs of a request = ``2 * linear_params * (prefilled + n * decode_forwards)`` where
  ``prefilled`` = prompt tokens - cached (radix) tokens, as the server reported them, and
  ``decode_forwards`` = ``min(max_tokens, levels) - 1``: the prefill's logits give SID level 0,
  each decode forward over the n beam rows gives one more level, and the ``<|sid_end|>`` step
  needs no forward (its only candidate is fixed). Attention score FLOPs are not counted, so
  MFU is a slight lower bound.
* achieved TFLOP/s of a round = mean FLOPs per successful request x the round's QPS / 1e12;
  MFU = achieved / ceiling.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.load.client import Record
from harness.metrics.rounds import Extra
from harness.spec.matrix import MfuSpec, Scalar

GIB = 1024**3


def load_config(model_path: str | None) -> dict | None:
    """``config.json`` of a checkpoint directory (None without one)."""
    if not model_path:
        return None
    p = Path(model_path) / "config.json"
    if not p.is_file():
        return None
    cfg = json.loads(p.read_text())
    return cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg


def shape(cfg: dict) -> dict[str, int]:
    """The decoder dimensions that the counts use."""
    h = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    return {
        "hidden": h,
        "layers": int(cfg["num_hidden_layers"]),
        "heads": heads,
        "kv_heads": int(cfg.get("num_key_value_heads") or heads),
        "head_dim": int(cfg.get("head_dim") or h // heads),
        "intermediate": int(cfg["intermediate_size"]),
    }


def linear_params(cfg: dict) -> int:
    """Weights of the decoder's linear layers (q, k, v, o, gate, up, down) over all layers."""
    s = shape(cfg)
    h, q, kv, inter = (
        s["hidden"],
        s["heads"] * s["head_dim"],
        s["kv_heads"] * s["head_dim"],
        s["intermediate"],
    )
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * inter
    return per_layer * s["layers"]


def decode_forwards(max_tokens: int, levels: int) -> int:
    """Decode forwards of one request: ``min(max_tokens, levels) - 1`` (end step is free)."""
    return max(0, min(max_tokens, levels) - 1)


def request_flops(params: int, prefilled: int, beam_width: int, forwards: int) -> float:
    """``2 * params * (prefilled + beam_width * forwards)``."""
    return 2.0 * params * (prefilled + beam_width * forwards)


def ceiling_for(mfu: MfuSpec, params: dict[str, Scalar]) -> tuple[float | None, str]:
    """The ceiling (TFLOP/s) for a cell and the key that chose it ("" for a plain number)."""
    if not isinstance(mfu.ceiling_tflops, dict):
        return float(mfu.ceiling_tflops), ""
    key = params.get(mfu.by)
    text = "none" if key is None else str(key).lower()
    for k, v in mfu.ceiling_tflops.items():
        if k.lower() == text:
            return float(v), k
    if "default" in mfu.ceiling_tflops:
        return float(mfu.ceiling_tflops["default"]), "default"
    return None, text


def mfu_info(
    mfu: MfuSpec,
    params: dict[str, Scalar],
    model_path: str | None,
    beam_width: int,
    max_tokens: int,
    levels: int,
) -> dict[str, Any]:
    """What a cell's MFU needs (stored with the cell): parameters, decode rows, ceiling."""
    ceiling, key = ceiling_for(mfu, params)
    info: dict[str, Any] = {"ceiling_tflops": ceiling, "ceiling_key": key, "by": mfu.by}
    cfg = load_config(model_path)
    if cfg is None:
        return {**info, "error": "no config.json to count parameters from"}
    try:
        info["linear_params"] = linear_params(cfg)
    except (KeyError, TypeError, ValueError) as exc:
        return {**info, "error": f"config.json lacks {exc}"}
    forwards = mfu.decode_forwards
    info["decode_forwards"] = decode_forwards(max_tokens, levels) if forwards is None else forwards
    info["beam_width"] = beam_width
    if ceiling is None:
        info["error"] = f"no ceiling for {mfu.by}={key} (keys: {', '.join(mfu.ceiling_tflops)})"
    return info


def derived_metrics(mfu: dict | None, hf: dict | None) -> Extra | None:
    """Per-round extra metrics: FLOPs, achieved TFLOP/s, MFU; ratios against the HF baseline."""
    has_mfu = bool(mfu and "linear_params" in mfu)
    has_hf = bool(hf and hf.get("status") == "ok" and hf.get("hf_ms_per_request"))
    if not (has_mfu or has_hf):
        return None

    def extra(ok: list[Record], out: dict[str, float]) -> dict[str, float]:
        res: dict[str, float] = {}
        qps = out.get("qps")
        if has_mfu and ok and all(r.prompt_tokens is not None for r in ok):
            flops = [
                request_flops(
                    mfu["linear_params"],
                    r.prompt_tokens - (r.cached_tokens or 0),
                    mfu["beam_width"],
                    mfu["decode_forwards"],
                )
                for r in ok
            ]
            per_req = sum(flops) / len(flops)
            res["tflop_per_request"] = per_req / 1e12
            if qps is not None:
                res["achieved_tflops"] = per_req * qps / 1e12
                if mfu.get("ceiling_tflops"):
                    res["mfu"] = res["achieved_tflops"] / mfu["ceiling_tflops"]
        if has_hf:
            if qps:
                res["speedup_vs_hf"] = qps / hf["hf_qps"]
            lat = out.get("latency_mean_ms")
            if lat:
                res["hf_latency_ratio"] = hf["hf_ms_per_request"] / lat
        return res

    return extra


def kv_bytes(cfg: dict, beams: int, prompt_tokens: int, elem_bytes: int) -> int:
    """HF beam search's prompt KV: every beam holds its own copy of the prompt's K and V."""
    s = shape(cfg)
    return beams * prompt_tokens * s["layers"] * 2 * s["kv_heads"] * s["head_dim"] * elem_bytes


def kv_guard(
    cfg: dict, beams: int, prompt_tokens: int, elem_bytes: int, max_gib: float | None
) -> tuple[float, str | None]:
    """(estimate in GiB, skip reason or None) for the HF baseline's memory guard."""
    gib = kv_bytes(cfg, beams, prompt_tokens, elem_bytes) / GIB
    if max_gib is None or gib <= max_gib:
        return gib, None
    s = shape(cfg)
    return gib, (
        f"needs ~{gib:.3g} GiB of per-beam KV ({beams} beams x {prompt_tokens} prompt tokens x "
        f"{s['layers']} layers x 2 x {s['kv_heads']} KV heads x {s['head_dim']} head dim x "
        f"{elem_bytes} bytes) > max_kv_gib {max_gib:g}"
    )
