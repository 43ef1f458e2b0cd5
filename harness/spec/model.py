"""Model and catalog resolution: checkpoint paths, or synthetic presets built once and cached.

A synthetic model lives in ``$FLASHREC_CACHE/models/<key>`` (default
``~/.cache/flashrec/models/<key>``), where ``key`` hashes the preset parameters and the source
of ``flashrec.synth``: same inputs and same generator, same directory. Builds go to a temporary
sibling directory and are renamed into place, so an interrupted build is never reused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.spec.matrix import MatrixSpec, ModelSpec

DEFAULT_LEVELS = 3


class ModelError(RuntimeError):
    """The model or catalog of a matrix cannot be resolved or built."""


@dataclass(frozen=True)
class ResolvedModel:
    """Where the model and its catalog are, and the hash the report records."""

    path: str | None
    catalog: str | None
    hash: str
    source: str  # "path", "preset" or "none"
    levels: int
    # sha256 of the catalog file's bytes (first 20 hex digits); None without a catalog file.
    # Two runs on different catalogs are not comparable even with the same model.
    catalog_hash: str | None = None
    # named catalogs (the matrix's ``catalogs:``), the default first: (name, path, file hash);
    # ``catalog`` is then the default's path
    catalogs: tuple[tuple[str, str, str | None], ...] = ()


def cache_root() -> Path:
    """``$FLASHREC_CACHE`` or ``~/.cache/flashrec``."""
    return Path(os.environ.get("FLASHREC_CACHE") or Path.home() / ".cache" / "flashrec")


def _synth_source_hash() -> str:
    import flashrec.synth as synth

    h = hashlib.sha256()
    for f in sorted(Path(synth.__file__).parent.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def preset_key(model: ModelSpec, catalog_size: int | None) -> str:
    """The cache key of a synthetic model: its parameters and the generator's source."""
    params = {
        "preset": model.preset,
        "seed": model.seed,
        "dtype": model.dtype,
        "catalog_size": catalog_size,
        "synth": _synth_source_hash(),
    }
    if model.sid_entropy is not None:  # absent when unset, so existing keys do not move
        params["sid_entropy"] = model.sid_entropy
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:20]


def path_hash(path: str | Path) -> str:
    """A cheap content hash of a checkpoint dir: config.json bytes + every file's name and size."""
    root = Path(path)
    h = hashlib.sha256()
    cfg = root / "config.json"
    if cfg.is_file():
        h.update(cfg.read_bytes())
    for f in sorted(root.rglob("*")):
        if f.is_file():
            h.update(f"{f.relative_to(root)}:{f.stat().st_size}".encode())
    return h.hexdigest()[:20]


def build_preset(model: ModelSpec, catalog_size: int | None, log=print) -> Path:
    """The directory of a synthetic model, building it on first use."""
    try:
        from flashrec.synth import build_checkpoint
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the checkout
        raise ModelError(f"synthetic model preset needs flashrec.synth ({exc})") from None
    key = preset_key(model, catalog_size)
    root = Path(model.cache_dir) if model.cache_dir else cache_root() / "models"
    final = root / key
    if (final / "synth_info.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    calibrated = "" if model.sid_entropy is None else f", SID entropy {model.sid_entropy:g} nats"
    log(f"building synthetic model {model.preset} (seed {model.seed}{calibrated}) into {final}")
    try:
        kwargs = {"seed": model.seed, "catalog_size": catalog_size}
        if model.dtype:
            kwargs["dtype"] = model.dtype
        if model.sid_entropy is not None:
            kwargs["sid_entropy"] = model.sid_entropy
        build_checkpoint(tmp, model.preset, **kwargs)
        try:
            tmp.rename(final)
        except OSError:  # another process finished first: keep its copy
            if not (final / "synth_info.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _levels(spec: MatrixSpec, model_dir: Path | None) -> int:
    if spec.catalog and spec.catalog.levels:
        return spec.catalog.levels
    if model_dir and (model_dir / "synth_info.json").is_file():
        try:
            from flashrec.synth import resolve_preset

            info = json.loads((model_dir / "synth_info.json").read_text())
            return int(resolve_preset(info["preset"], **info.get("overrides", {})).num_levels)
        except (ModuleNotFoundError, KeyError, ValueError):
            pass
    return DEFAULT_LEVELS


def file_hash(path: str | Path | None) -> str | None:
    """sha256 of a file's bytes (first 20 hex digits); None for no path or no such file."""
    if not path or not Path(path).is_file():
        return None
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:20]


def resolve_model(spec: MatrixSpec, log=print) -> ResolvedModel:
    """Resolve ``model:`` and ``catalog:`` of a matrix (building a synthetic model if needed)."""
    found = _resolve_model(spec, log)
    named = tuple((n, p, file_hash(p)) for n, p in _catalog_paths(spec).items())
    return dataclasses.replace(found, catalog_hash=file_hash(found.catalog), catalogs=named)


def _catalog_paths(spec: MatrixSpec) -> dict[str, str]:
    """The named catalogs' paths (``~`` expanded), the default first."""
    return {name: os.path.expanduser(path) for name, path in spec.catalogs.items()}


def _check_sid_entropy(path: Path, want: float) -> None:
    """A matrix that asks for ``sid_entropy`` and gives a ``path``: the model there must be a
    synthetic one calibrated to that entropy (its synth_info.json says), not any checkpoint."""
    try:
        got = json.loads((path / "synth_info.json").read_text())["sid_entropy"]["target"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ModelError(
            f"model 'sid_entropy' {want} with 'path' {path}: no synth_info.json records a "
            "calibrated sid_entropy there (build it with flashrec synth --sid-entropy)"
        ) from None
    if abs(float(got) - want) > 1e-6:
        raise ModelError(
            f"model 'sid_entropy' {want}, but {path} was calibrated to {got} (synth_info.json)"
        )


def _resolve_model(spec: MatrixSpec, log=print) -> ResolvedModel:
    catalog = spec.catalog.path if spec.catalog else None
    catalog = next(iter(_catalog_paths(spec).values()), catalog)  # named: the default's
    if spec.model is None:
        return ResolvedModel(None, catalog, "none", "none", _levels(spec, None))
    if spec.model.path:  # preset parameters (catalog_size included) only apply to presets
        path = Path(os.path.expanduser(spec.model.path))
        if not path.is_dir():
            raise ModelError(f"model path {path} is not a directory")
        if spec.catalog and spec.catalog.size:
            raise ModelError("catalog 'size' needs a synthetic 'preset' model; give 'path'")
        if spec.model.sid_entropy is not None:
            _check_sid_entropy(path, spec.model.sid_entropy)
        return ResolvedModel(str(path), catalog, path_hash(path), "path", _levels(spec, path))
    catalog_size = (spec.catalog.size if spec.catalog else None) or spec.model.catalog_size
    try:
        path = build_preset(spec.model, catalog_size, log=log)
    except (ValueError, OSError) as exc:  # unknown preset, bad dtype, disk
        raise ModelError(f"cannot build preset {spec.model.preset!r}: {exc}") from None
    if catalog_size and not catalog:
        catalog = str(path / "catalog.json")
    return ResolvedModel(
        str(path), catalog, preset_key(spec.model, catalog_size), "preset", _levels(spec, path)
    )
