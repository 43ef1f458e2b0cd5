"""Matrix spec: YAML -> validated, frozen :class:`MatrixSpec`.

Errors name the file, the line and the field (``matrices/x.yaml:12: load.rounds: ...``).
String values may use ``${VAR}`` or ``${VAR:-default}``; an unset variable without a default is
an error. Cell expansion (axes, link, exclude) lives in :mod:`harness.spec.cells`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.spec.base import NAME as _NAME
from harness.spec.base import SpecModel, close_hint, model_in
from harness.spec.catalogs import CATALOGS_FIELD, LOAD_CATALOG_FIELD, check_catalog_map
from harness.spec.checks import GateSpec, TargetSpec, check_controls, check_parity_engines
from harness.spec.quality import QualitySpec
from harness.spec.router import ReplicaFields
from harness.spec.url import check_url
from harness.spec.users import UserFields

Scalar = Union[bool, int, float, str, None]
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}")


class SpecError(ValueError):
    """A matrix error located in its source: file, line (1-based, 0 = unknown) and field.

    ``more`` holds further ``(line, field, message)`` issues found in the same pass.
    """

    def __init__(
        self,
        file: str,
        line: int,
        field: str,
        message: str,
        more: list[tuple[int, str, str]] | None = None,
    ) -> None:
        self.file, self.line, self.field, self.message = file, line, field, message
        self.more = more or []
        text = "\n".join(_fmt(file, ln, f, m) for ln, f, m in [(line, field, message), *self.more])
        super().__init__(text)


def _fmt(file: str, line: int, field: str, message: str) -> str:
    where = f"{file}:{line}" if line else file
    return f"{where}: {field or '<matrix>'}: {message}"


class EngineSpec(ReplicaFields):
    """One server: launched (``flashrec`` or a custom ``command``) or ``external`` by URL."""

    name: str = Field("flashrec", pattern=_NAME)
    kind: Literal["flashrec", "command", "external"] = "flashrec"
    command: list[str] | None = None
    url: str | None = None
    protocol: Literal["chat", "generate"] = "chat"
    args: dict[str, Scalar] = {}
    # per-engine derived server flags (expressions over the cell's parameters, like ``link``):
    # each engine gets the knobs its own docs recommend for a cell; a None value is omitted
    link: dict[str, Scalar] = {}
    env: dict[str, str] = {}
    # folders put first on the launched server's PYTHONPATH (a peer installed with --target)
    pythonpath: list[str] = []
    health_path: str = Field("/health", pattern=r"^/")
    # this engine's requests' max_tokens over load.max_tokens (the public flashrec 0.1.2 counts
    # SID codes only: give it the catalog's depth, where ours takes depth + 1 for <|sid_end|>)
    max_tokens: int | None = Field(None, ge=1)
    device: str | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    cwd: str | None = None
    standard_args: bool = True
    model_name: str | None = None
    tokenizer: str | None = None
    startup_timeout_s: float = Field(600.0, gt=0)
    stop_timeout_s: float = Field(20.0, gt=0)
    # an A/A control: the first engine's settings again in a server of its own; how far it lands
    # from the first engine bounds what the side-by-side verdicts call a difference
    control: bool = False

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return check_url(v, "url") if v is not None else v

    @model_validator(mode="after")
    def _check_kind(self) -> EngineSpec:
        if self.kind == "command" and not self.command:
            raise ValueError("kind 'command' needs 'command: [program, arg, ...]'")
        if self.kind == "external" and not self.url:
            raise ValueError("kind 'external' needs 'url: http://host:port'")
        if self.kind != "external" and self.url:
            raise ValueError("'url' is only for kind 'external' (launched servers get a port)")
        return self

    @property
    def launched(self) -> bool:
        """Whether the harness owns this server's lifecycle."""
        return self.kind != "external"


class ModelSpec(SpecModel):
    """A checkpoint path, or a synthetic preset built on first use and cached by content hash."""

    path: str | None = None
    preset: str | None = None
    seed: int = 0
    dtype: str | None = None
    catalog_size: int | None = Field(None, gt=0)
    cache_dir: str | None = None
    # preset only: mean per-step next-SID entropy (nats) the synthetic model is calibrated to
    sid_entropy: float | None = Field(None, gt=0)

    @field_validator("path", "preset")
    @classmethod
    def _empty_is_none(cls, v: str | None) -> str | None:
        return v or None

    @model_validator(mode="after")
    def _check_source(self) -> ModelSpec:
        if not self.path and not self.preset:
            raise ValueError("give 'path' (a checkpoint directory) or 'preset' (synthetic)")
        return self


class CatalogSpec(SpecModel):
    """Valid SIDs: a catalog file, or the synthetic model's catalog of ``size`` items."""

    path: str | None = None
    size: int | None = Field(None, gt=0)
    levels: int | None = Field(None, gt=0)

    @field_validator("path")
    @classmethod
    def _empty_is_none(cls, v: str | None) -> str | None:
        return v or None

    @model_validator(mode="after")
    def _check(self) -> CatalogSpec:
        if self.path and self.size:
            raise ValueError("give either 'path' or 'size', not both")
        return self


class WorkloadSpec(UserFields):
    """Prompts: synthetic (flashrec.synth), lorem (harness filler text), jsonl or recif parquet."""

    kind: Literal["synthetic", "lorem", "jsonl", "recif"] = "synthetic"
    path: str | None = None
    requests: int = Field(32, ge=1)
    warmup_requests: int = Field(8, ge=0)
    median_tokens: int = Field(300, ge=1)
    spread: float = Field(0.5, ge=0)
    system_prompt_tokens: int = Field(64, ge=0)
    seed: int = 0
    shuffle: bool = True

    @model_validator(mode="after")
    def _check(self) -> WorkloadSpec:
        if self.kind in ("jsonl", "recif") and not self.path:
            raise ValueError(f"kind '{self.kind}' needs 'path'")
        return self


class LoadSpec(SpecModel):
    """How requests are sent: closed-loop concurrency, bursts of ``concurrency`` requests at
    once, or open-loop rate; rounds; radix state."""

    mode: Literal["closed", "burst", "poisson", "constant"] = "closed"
    concurrency: int = Field(1, ge=1)
    rate: float | None = Field(None, gt=0)
    duration_s: float | None = Field(None, gt=0)
    rounds: int = Field(3, ge=1)
    beam_width: int = Field(50, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0)
    seed: int | None = None
    catalog: str | None = LOAD_CATALOG_FIELD  # every cell's (harness.spec.catalogs)
    radix: Literal["warm", "cold"] = "warm"
    request_timeout_s: float = Field(120.0, gt=0)
    cell_timeout_s: float | None = Field(None, gt=0)
    cooldown_s: float = Field(0.0, ge=0)
    # several engines: every engine's server of a cell up at once, rounds alternating between
    # them (A1 B1 B2 A2 ...), so drift and other load hit all engines alike
    interleave_engines: bool = False


class TraceSpec(SpecModel):
    """Which cells get an extra traced round, and how long to wait for the files."""

    cells: Literal["none", "first", "all"] | list[str] = "none"
    num_steps: int = Field(20, ge=1)
    output_dir: str | None = None
    requests: int | None = Field(None, ge=1)
    settle_s: float = Field(5.0, ge=0)
    timeout_s: float = Field(180.0, gt=0)
    profile_args: dict[str, Any] = {}
    # host annotations (e.g. flashrec.beam) whose inside each traced file's report breaks down:
    # host time per occurrence, its direct children, its self time, the GPU work it launched
    spans: list[str] = []

    @field_validator("spans")
    @classmethod
    def _named_spans(cls, v: list[str]) -> list[str]:
        if any(not str(n).strip() for n in v) or len(set(v)) != len(v):
            raise ValueError(
                "trace.spans: each entry a host annotation's name, no blanks or repeats"
            )
        return v


class StatsSpec(SpecModel):
    """Statistics settings: bootstrap, noise band, significance test."""

    bootstrap: int = Field(2000, ge=100)
    confidence: float = Field(0.95, gt=0.5, lt=1)
    min_rounds: int = Field(3, ge=2)
    max_cv: float = Field(0.10, gt=0)
    band_k: float = Field(2.0, gt=0)
    alpha: float = Field(0.05, gt=0, lt=0.5)
    test: Literal["welch", "mannwhitney"] = "welch"
    # how the verdicts of one comparison (every cell x metric) are corrected for being many
    # tests: holm (family-wise error <= alpha) or none (each metric at alpha on its own)
    correction: Literal["holm", "none"] = "holm"
    # how far two separate runs of one setup drift apart (%, e.g. measured by A/A runs):
    # ``compare`` of two runs calls a change only beyond it; unset, it calls none (inconclusive)
    between_run_band_pct: float | None = Field(None, ge=0)
    # other processes' CPU cores over a cell's measured rounds that make it a "busy host" cell
    # (a note; compare then calls no change in it); 0 turns the judgment off
    busy_host_cores: float = Field(0.5, ge=0)
    seed: int = 0


class StageSpec(BaseModel):
    """A later stage's section (``parity:``, ``determinism:``); the stage validates the rest."""

    model_config = ConfigDict(extra="allow", frozen=True)
    enabled: bool = True

    @model_validator(mode="after")
    def _urls(self) -> StageSpec:
        """A running server's URL (``reference_url``, ``candidate_url``, a candidate's ``url``)
        is checked here, at load time, not when the stage first sends to it."""
        extra = self.model_extra or {}
        urls = [(k, extra[k]) for k in ("reference_url", "candidate_url") if extra.get(k)]
        candidates = extra.get("candidates")
        for i, c in enumerate(candidates if isinstance(candidates, list) else []):
            if isinstance(c, dict) and c.get("url"):
                urls.append((f"candidates[{i}].url", c["url"]))
        for key, url in urls:
            check_url(str(url), key)
        return self


class HFBaselineSpec(SpecModel):
    """HF transformers ``generate(num_beams=n)`` timed after each cell, in its own process."""

    enabled: bool = True
    requests: Union[int, str] = 2  # or an expression over the cell's parameters
    warmup: int = Field(1, ge=0)
    dtype: Literal["bf16", "bfloat16", "float16", "fp16", "float32"] = "bf16"
    device: str | None = None  # default: the engine's device, else cpu
    max_kv_gib: float | None = Field(None, gt=0)
    timeout_s: float = Field(1800.0, gt=0)
    cells: str | list[str] | None = None  # filters; default every cell

    @field_validator("requests")
    @classmethod
    def _positive(cls, v: Union[int, str]) -> Union[int, str]:
        if isinstance(v, int) and v < 1:
            raise ValueError("requests must be >= 1 (or an expression)")
        return v


class BaselineSpec(SpecModel):
    """Baselines measured in the same run as the cells (``hf``: transformers generate)."""

    hf: HFBaselineSpec | None = None


class MfuSpec(SpecModel):
    """Model-FLOP utilisation: achieved linear-layer FLOP/s over a ceiling per precision."""

    ceiling_tflops: Union[float, dict[str, float]]
    by: str = "quantization"  # the cell parameter whose value picks the ceiling
    decode_forwards: int | None = Field(None, ge=0)  # default min(max_tokens, levels) - 1

    @field_validator("ceiling_tflops")
    @classmethod
    def _positive(cls, v: Union[float, dict[str, float]]) -> Union[float, dict[str, float]]:
        values = v.values() if isinstance(v, dict) else [v]
        if not values or any(x <= 0 for x in values):
            raise ValueError("ceilings must be > 0 TFLOP/s")
        return v


class MatrixSpec(SpecModel):
    """A whole campaign: servers, model, workload, axes and how to measure and judge them."""

    name: str | None = None
    description: str | None = None
    engine: EngineSpec | None = None
    engines: list[EngineSpec] | None = None
    model: ModelSpec | None = None
    catalog: CatalogSpec | None = None
    catalogs: dict[str, str] = CATALOGS_FIELD  # NAME -> PATH (harness.spec.catalogs)
    workload: WorkloadSpec = WorkloadSpec()
    axes: dict[str, list[Scalar]] = {}
    cells: list[dict[str, Scalar]] | None = None
    axis_scope: dict[str, Literal["server", "client", "both"]] = {}
    link: dict[str, Scalar] = {}
    exclude: list[Union[dict[str, Union[Scalar, list[Scalar]]], str]] = []
    load: LoadSpec = LoadSpec()
    trace: TraceSpec = TraceSpec()
    stats: StatsSpec = StatsSpec()
    quality: QualitySpec = QualitySpec()
    parity: StageSpec | None = None
    determinism: StageSpec | None = None
    gates: list[GateSpec] = []
    baseline: BaselineSpec | None = None
    mfu: MfuSpec | None = None
    targets: list[TargetSpec] = []

    @field_validator("catalogs")
    @classmethod
    def _catalogs(cls, v: dict[str, str], info: Any) -> dict[str, str]:
        return check_catalog_map(v, info.data.get("catalog"))

    @model_validator(mode="after")
    def _check(self) -> MatrixSpec:
        if (self.engine is None) == (self.engines is None):
            raise ValueError("give exactly one of 'engine' or 'engines'")
        names = [e.name for e in self.engine_list]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must be unique, got {names}")
        for axis, values in self.axes.items():
            if not values:
                raise ValueError(f"axis '{axis}' has no values")
        if self.cells is not None:
            if self.axes:
                raise ValueError("give 'axes' (a product) or 'cells' (an explicit list), not both")
            if not self.cells:
                raise ValueError("'cells' is empty")
            if any("engine" in c for c in self.cells):
                raise ValueError("'cells' entries cannot set 'engine' (use 'engines')")
        if self.load.interleave_engines and len(names) < 2:
            raise ValueError("load.interleave_engines needs at least two 'engines'")
        check_parity_engines(self.parity, names)
        check_controls(self.engine_list)
        needs_model = [e.name for e in self.engine_list if e.kind == "flashrec"]
        if needs_model and self.model is None:
            raise ValueError(f"engine(s) {needs_model} launch FlashRec and need 'model'")
        return self

    @property
    def engine_list(self) -> list[EngineSpec]:
        """The engines in declaration order (``engine:`` is a list of one)."""
        return [self.engine] if self.engine is not None else list(self.engines or [])


# --------------------------------------------------------------------------- loading


def _locations(node: yaml.Node, path: tuple = (), out: dict | None = None) -> dict:
    """Map every key path of a composed YAML document to its 1-based line: a key's own line,
    not that of its value (a block below the key starts a line later)."""
    out = {} if out is None else out
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set = set()
        for key, value in node.value:
            k = key.value
            if k in seen:
                raise SpecError(
                    "", key.start_mark.line + 1, ".".join(map(str, path + (k,))), "duplicate key"
                )
            seen.add(k)
            out[path + (k,)] = key.start_mark.line + 1
            _locations(value, path + (k,), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _locations(item, path + (i,), out)
    return out


def _expand_env(value: Any, path: tuple, errors: list) -> Any:
    if isinstance(value, dict):
        return {k: _expand_env(v, path + (k,), errors) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, path + (i,), errors) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value

    def sub(m: re.Match) -> str:
        var, has_default, default = m.group(1), m.group(2), m.group(3)
        if var in os.environ:
            return os.environ[var]
        if has_default is not None:
            return default or ""
        errors.append((path, f"environment variable ${{{var}}} is not set"))
        return ""

    return _ENV.sub(sub, value)


def line_of(locations: dict, loc: tuple) -> int:
    """The line of the longest prefix of ``loc`` present in ``locations`` (0 if none)."""
    loc = tuple(loc)
    while loc and loc not in locations:
        loc = loc[:-1]
    return locations.get(loc, 0)


_TYPE_TAGS = {"int", "float", "str", "bool", "none", "dict", "list"}


def _field(loc: tuple, locations: dict) -> str:
    """A readable field path: the parts of ``loc`` that exist in the YAML, plus a missing key."""
    cur: tuple = ()
    for part in loc:
        if cur + (part,) in locations:
            cur += (part,)
    last = loc[-1] if loc else None
    if (
        isinstance(last, str)
        and last not in cur
        and "[" not in last
        and "-" not in last
        and last not in _TYPE_TAGS
    ):
        cur += (last,)
    return ".".join(str(p) for p in cur)


def _known_keys(loc: tuple) -> list[str]:
    """The keys the section at ``loc`` (a validation error's path) takes."""
    model: type[BaseModel] | None = MatrixSpec
    for part in loc:
        if isinstance(part, int) or model is None:
            continue  # a list item: the list's model
        info = model.model_fields.get(part)
        model = model_in(info.annotation) if info is not None else None
    return list(model.model_fields) if model is not None else []


def parse_spec(text: str, source: str = "<string>") -> tuple[MatrixSpec, dict]:
    """Parse and validate matrix text; returns the spec and its key-path -> line map."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise SpecError(source, (mark.line + 1) if mark else 0, "", str(exc.problem)) from None
    if node is None or not isinstance(data, dict):
        raise SpecError(source, 1, "", "a matrix is a YAML mapping (engine:, model:, axes:, ...)")
    try:
        locations = _locations(node)
    except SpecError as exc:
        raise SpecError(source, exc.line, exc.field, exc.message) from None
    errors: list = []
    data = _expand_env(data, (), errors)
    if errors:
        path, msg = errors[0]
        raise SpecError(source, line_of(locations, path), ".".join(map(str, path)), msg)
    try:
        spec = MatrixSpec.model_validate(data)
    except ValidationError as exc:
        issues = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            msg = err["msg"]
            if err["type"] == "extra_forbidden" and loc and isinstance(loc[-1], str):
                msg = f"{msg} ({close_hint(loc[-1], _known_keys(loc[:-1]))})"
            issues.append((line_of(locations, loc), _field(loc, locations), msg))
        raise SpecError(source, *issues[0], more=issues[1:]) from None
    return spec, locations


def load_spec(path: str | Path) -> tuple[MatrixSpec, dict]:
    """Read and validate a matrix file (see :func:`parse_spec`)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(str(p), 0, "", "no such matrix file")
    return parse_spec(p.read_text(), str(p))


def relocate(exc: SpecError, source: str, locations: dict) -> SpecError:
    """Attach the file and line to an error raised with only a field path."""
    path = tuple(int(p) if p.isdigit() else p for p in exc.field.split(".") if p)
    return SpecError(source, line_of(locations, path), exc.field, exc.message)
