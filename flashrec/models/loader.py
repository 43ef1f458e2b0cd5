"""Checkpoint loading: HF names -> fused parameters through one merge table.

    q_proj, k_proj, v_proj -> qkv_proj (concatenated along the output dim, in that order)
    gate_proj, up_proj     -> gate_up_proj
FP8 checkpoints: ``<name>.weight_scale`` (or ``weight_scale_inv``) per output channel is
concatenated alongside its weight, never requantized. Block-wise scales (``weight_block_size``,
e.g. [128, 128]: one scale per block of the weight, as in Qwen3-*-FP8) are dequantized per
block and requantized per output channel on load (or kept dequantized when FP8 is off), since
the GEMMs take one scale per channel. ``input_scale`` tensors (static activation scales) are
dropped: activations are quantized per token at run time. ``quantize_fp8`` quantizes
unquantized decoder weights per channel on load. Missing, unexpected or mis-shaped tensors fail loudly,
naming the checkpoint tensor.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open

from flashrec.layers.linear import Linear

log = logging.getLogger("flashrec")

# checkpoint projection -> (fused module attribute, part index, number of parts)
PACKED_MODULES: dict[str, tuple[str, int, int]] = {
    "q_proj": ("qkv_proj", 0, 3),
    "k_proj": ("qkv_proj", 1, 3),
    "v_proj": ("qkv_proj", 2, 3),
    "gate_proj": ("gate_up_proj", 0, 2),
    "up_proj": ("gate_up_proj", 1, 2),
}
SCALE_SUFFIXES = (".weight_scale_inv", ".weight_scale")
INPUT_SCALE_SUFFIX = ".input_scale"


class CheckpointError(ValueError):
    pass


def _checkpoint_files(model_path: Path) -> list[Path]:
    index = model_path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_path / n for n in names]
    files = sorted(model_path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{model_path}: no *.safetensors files")
    return files


def checkpoint_files(model_path: str | Path) -> list[Path]:
    """The checkpoint's safetensors files (the index's, else every ``*.safetensors``), in
    order; ``CheckpointError`` when there is none."""
    return _checkpoint_files(Path(model_path))


def checkpoint_signature(model_path: str | Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor of the checkpoint as stored: name -> (shape, safetensors dtype), read from
    the files' headers alone (no tensor is read)."""
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for f in _checkpoint_files(Path(model_path)):
        with open(f, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
        for name, meta in header.items():
            if name != "__metadata__":
                out[name] = (tuple(meta["shape"]), str(meta["dtype"]))
    return out


def build_model(mc, model_path: str | Path, dtype: torch.dtype, use_fp8: bool) -> torch.nn.Module:
    """The model of ``mc`` with ``model_path``'s weights, on the CPU: built on the meta
    device, then loaded (fused parameters; FP8 quantized or dequantized as ``use_fp8`` says,
    as at start-up)."""
    from flashrec.models.registry import get_model_class

    with torch.device("meta"):
        model = get_model_class(mc)(mc)
    model = model.to_empty(device="cpu")
    load_weights(
        model,
        read_checkpoint(model_path),
        dtype,
        quantize_fp8=use_fp8 and not mc.is_fp8_checkpoint,
        dequantize_fp8=mc.is_fp8_checkpoint and not use_fp8,
        block_size=mc.fp8_block_size,
    )
    return model


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor a forward reads from the model, by name: parameters, buffers and each
    FP8 ``Linear``'s ``weight_scale`` (``<module>.weight_scale``). A weight update copies
    into exactly these."""
    out = dict(model.named_parameters())
    out.update(model.named_buffers())
    for name, mod in model.named_modules():
        scale = getattr(mod, "weight_scale", None) if isinstance(mod, Linear) else None
        if scale is not None:
            out[f"{name}.weight_scale"] = scale
    return out


def read_checkpoint(model_path: str | Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in _checkpoint_files(Path(model_path)):
        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():
                out[name] = fh.get_tensor(name)
    return out


def _internal_name(name: str) -> str:
    if name == "lm_head.weight":
        return "lm_head_weight"
    return name[len("model.") :] if name.startswith("model.") else name


def load_weights(
    model: torch.nn.Module,
    tensors: dict[str, torch.Tensor],
    dtype: torch.dtype,
    quantize_fp8: bool = False,
    dequantize_fp8: bool = False,
    block_size: tuple[int, int] | None = None,
) -> None:
    """Load ``tensors`` (HF names) into ``model`` in place. ``block_size``: an FP8
    checkpoint's ``weight_block_size`` (block-wise weight scales)."""
    scales = {}
    for name in list(tensors):
        for suf in SCALE_SUFFIXES:
            if name.endswith(suf):
                scales[name[: -len(suf)] + ".weight"] = tensors.pop(name)
                break
    inputs = [n for n in tensors if n.endswith(INPUT_SCALE_SUFFIX)]
    for name in inputs:
        del tensors[name]
    if inputs:
        log.info(
            "%d static activation scales (%s) ignored: activations are quantized per token at "
            "run time", len(inputs), inputs[0],
        )  # fmt: skip
    _unblock(tensors, scales, dequantize_fp8, block_size)
    params = dict(model.named_parameters())
    linears = {n: m for n, m in model.named_modules() if isinstance(m, Linear)}
    pending: dict[str, dict[int, tuple[str, torch.Tensor, torch.Tensor | None]]] = {}
    seen: set[str] = set()

    for name, t in tensors.items():
        iname = _internal_name(name)
        if iname == "lm_head_weight" and iname not in params:
            continue  # tied embeddings: some checkpoints still store a copy of lm_head
        mod_path, _, leaf = iname.rpartition(".")
        parent, _, proj = mod_path.rpartition(".")
        if proj in PACKED_MODULES:
            fused, part, nparts = PACKED_MODULES[proj]
            key = f"{parent}.{fused}.{leaf}"
            pending.setdefault(key, {})[part] = (name, t, scales.pop(name, None))
            if len(pending[key]) == nparts:
                got = pending.pop(key)
                parts = [got[i] for i in range(nparts)]
                merged = torch.cat([p[1] for p in parts], dim=0)
                sc = [p[2] for p in parts]
                scale = None if all(s is None for s in sc) else _cat_scales(parts, sc)
                _assign(
                    model,
                    params,
                    linears,
                    key,
                    merged,
                    scale,
                    ", ".join(p[0] for p in parts),
                    dtype,
                    quantize_fp8,
                    dequantize_fp8,
                )
                seen.add(key)
            continue
        _assign(
            model,
            params,
            linears,
            iname,
            t,
            scales.pop(name, None),
            name,
            dtype,
            quantize_fp8,
            dequantize_fp8,
        )
        seen.add(iname)

    if pending:
        key, parts = next(iter(pending.items()))
        have = [p[0] for p in parts.values()]
        raise CheckpointError(f"incomplete fused projection {key}: only {have} present")
    if scales:
        raise CheckpointError(f"weight scale without weight: {sorted(scales)[0]}")
    expected = {n for n in params}
    missing = sorted(expected - seen)
    if missing:
        raise CheckpointError(
            f"missing tensor for parameter {missing[0]} ({len(missing)} missing in all)"
        )


def _block_shape(
    rows: int, cols: int, scale: torch.Tensor, name: str, block: tuple[int, int] | None
) -> tuple[int, int] | None:
    """The (rows, cols) block of a block-wise weight scale; None for a per-tensor or
    per-channel one. A block-wise scale is a 2-D grid of ``ceil(rows / b0) x ceil(cols / b1)``
    entries for the checkpoint's ``weight_block_size`` ``block`` = (b0, b1) (the last block
    of each dimension may be partial); the grid alone does not fix the block size."""
    if scale.numel() in (1, rows) and (scale.dim() < 2 or scale.shape[-1] == 1):
        return None
    if scale.dim() != 2:
        raise CheckpointError(
            f"{name}: weight_scale of shape {tuple(scale.shape)} is neither per-channel for "
            f"{rows} rows nor a 2-D block grid"
        )
    if block is None:
        raise CheckpointError(
            f"{name}: block-wise weight_scale {tuple(scale.shape)} but config.json's "
            "quantization_config has no weight_block_size"
        )
    b0, b1 = block
    want = (-(-rows // b0), -(-cols // b1))
    if tuple(scale.shape) != want:
        raise CheckpointError(
            f"{name}: weight_scale grid {tuple(scale.shape)} does not fit weight_block_size "
            f"{list(block)} for a {rows} x {cols} weight (expected {want})"
        )
    return b0, b1


def _unblock(
    tensors: dict, scales: dict, dequantize_fp8: bool, block: tuple[int, int] | None
) -> None:
    """Block-wise scaled FP8 weights -> float32 weights dequantized block by block, then
    (unless ``dequantize_fp8``) FP8 codes with one scale per output channel, in place."""
    from flashrec.kernels.fp8 import FP8_DTYPE, dequantize, quantize_weight_per_channel

    done = 0
    for name, scale in list(scales.items()):
        w = tensors.get(name)
        if w is None or w.dtype != FP8_DTYPE or w.dim() != 2:
            continue
        rows, cols = w.shape
        shape = _block_shape(rows, cols, scale, name, block)
        if shape is None:
            continue
        b0, b1 = shape
        full = scale.repeat_interleave(b0, 0)[:rows].repeat_interleave(b1, 1)[:, :cols]
        w32 = dequantize(w, full)  # the per-channel path's codes * scale, one scale per entry
        if dequantize_fp8:
            tensors[name] = w32
            del scales[name]
        else:
            tensors[name], scales[name] = quantize_weight_per_channel(w32)
        done += 1
    if done:
        log.info(
            "%d FP8 weights with block-wise scales (blocks of %d x %d) %s", done, b0, b1,
            "dequantized" if dequantize_fp8 else "requantized per output channel",
        )  # fmt: skip


def _cat_scales(parts, sc) -> torch.Tensor:
    if any(s is None for s in sc):
        raise CheckpointError(
            f"weight_scale present for some but not all of {[p[0] for p in parts]}"
        )
    return torch.cat([_per_channel(s, p[1].shape[0], p[0]) for s, p in zip(sc, parts)], dim=0)


def _per_channel(scale: torch.Tensor, rows: int, name: str) -> torch.Tensor:
    s = scale.float()
    if s.numel() == 1:
        return s.reshape(1, 1).expand(rows, 1).clone()
    if s.numel() != rows:
        raise CheckpointError(
            f"{name}: weight_scale of shape {tuple(scale.shape)} is not per-channel for {rows} rows"
        )
    return s.reshape(rows, 1)


def _assign(
    model, params, linears, iname, t, scale, ckpt_name, dtype, quantize_fp8, dequantize_fp8
):
    from flashrec.kernels.fp8 import FP8_DTYPE, dequantize

    if iname not in params:
        raise CheckpointError(f"unexpected tensor {ckpt_name} (no parameter {iname} in the model)")
    mod_name, _, leaf = iname.rpartition(".")
    lin = linears.get(mod_name)
    if lin is not None and leaf == "weight":
        want = (lin.out_features, lin.in_features)
        if tuple(t.shape) != want:
            raise CheckpointError(f"{ckpt_name}: shape {tuple(t.shape)}, expected {want}")
        if t.dtype == FP8_DTYPE:
            if scale is None:
                raise CheckpointError(f"{ckpt_name}: FP8 weight without weight_scale")
            scale = _per_channel(scale, t.shape[0], ckpt_name)
            if dequantize_fp8:
                lin.load(dequantize(t, scale).to(dtype), dtype=dtype)
            else:
                lin.load(t, weight_scale=scale)
        else:
            lin.load(
                t.to(torch.float32) if quantize_fp8 else t, quantize_fp8=quantize_fp8, dtype=dtype
            )
        return
    p = params[iname]
    if tuple(t.shape) != tuple(p.shape):
        raise CheckpointError(f"{ckpt_name}: shape {tuple(t.shape)}, expected {tuple(p.shape)}")
    if t.dtype == FP8_DTYPE:
        raise CheckpointError(f"{ckpt_name}: FP8 tensor for a non-linear parameter")
    with torch.no_grad():
        p.data = t.to(dtype).contiguous()


def checkpoint_hash(model_path: str | Path) -> str:
    """sha256 over each safetensors file's name and bytes (a weight update's identity, ``engine.weights.HASH_METHOD``)."""
    h = hashlib.sha256()
    for f in checkpoint_files(model_path):
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()
