"""Regenerate docs/harness-reference.md, every key of a flashrec-bench matrix, from the spec
models (``MatrixSpec`` and the sections it holds): key path, type, default, meaning.
``--check`` exits 1 when the file is stale or lacks a key a model has."""

from __future__ import annotations

import inspect
import sys
import typing
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import BaseModel  # noqa: E402
from pydantic_core import PydanticUndefined  # noqa: E402

from harness.determinism.check import run_determinism  # noqa: E402
from harness.parity.candidates import CANDIDATE_KEYS  # noqa: E402
from harness.spec.base import model_in  # noqa: E402
from harness.spec.cells import BOTH_KEYS, CLIENT_KEYS  # noqa: E402
from harness.spec.matrix import (  # noqa: E402
    LoadSpec,
    MatrixSpec,
    Scalar,
    StageSpec,
    WorkloadSpec,
)

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "harness-reference.md"

# What a key means, by key path ("engine.url", "gates[].metric"), where the model's field has
# no description of its own. A model key missing here fails the generator; so does an entry
# naming no key.
DESCRIPTIONS: dict[str, str] = {
    "name": "campaign name (report title, run id); unset: the file's stem",
    "description": "free text",
    "engine": "the one server the cells run on; give exactly one of `engine` and `engines`",
    "engines": "several servers side by side, each with the keys of `engine` ([peers](harness/peers.md)); names must be unique",
    "model": "the checkpoint or synthetic preset; required when an engine launches FlashRec",
    "catalog": "the valid SIDs",
    "workload": "the prompts",
    "axes": "parameters to sweep: the cells are their cartesian product ([cell parameters](#cell-parameters))",
    "cells": "instead of `axes`: an explicit list of cells, each a map of its parameters (no `engine` key)",
    "axis_scope": "override a parameter's scope: `server`, `client` or `both`",
    "link": "derived parameters: constants or expressions over the axes, `engine` and earlier links ([matrix](harness/matrix.md))",
    "exclude": "cells to drop: maps (every key must match; a list value means any of) or expressions",
    "load": "how requests are sent",
    "trace": "which cells get a traced round",
    "stats": "statistics settings",
    "quality": "ranking cut-offs, and the dataset each cell is evaluated on",
    "parity": "the parity stage (beams against a reference), run after the cells",
    "determinism": "the determinism stage (fresh processes, bit for bit), run after the cells",
    "gates": "thresholds that fail the run (exit 1), and regression gates for `compare` and `gate`",
    "baseline": "baselines measured in the same run",
    "mfu": "model-FLOP utilisation against a ceiling per precision",
    "targets": "goals reported as met or missed by how much (exit 1 only with `fail_run`)",
    "engine.name": "engine name: the first part of every cell id",
    "engine.kind": "`flashrec` launches `python -m flashrec serve`; `command` launches `command`; `external` is a URL with no lifecycle",
    "engine.command": "argv for `kind: command`; `python` means the harness's interpreter; `{port}`, `{host}`, `{model_path}`, `{catalog}`, `{python}` are substituted",
    "engine.url": "base URL for `kind: external`: `http://` or `https://`, a host, an optional port; anything else fails the matrix at load",
    "engine.protocol": "`chat` (`/v1/chat/completions`, `n` = beam width) or `generate` (SGLang's `/generate` beam protocol)",
    "engine.args": "static server flags: `name: value` becomes `--name value` (underscores to dashes; `true` -> `--name`, `false` -> `--no-name`, `null` omitted)",
    "engine.link": "this engine's own derived server flags, expressions like the top-level `link` (`null` omitted); not part of the cell id",
    "engine.env": "extra environment of the server process",
    "engine.pythonpath": "folders put first on the server's `PYTHONPATH` (a peer installed with `pip install --target`); a `command` server's environment reaches only its command, never the guard around it",
    "engine.health_path": "the path polled for readiness and after failed requests",
    "engine.max_tokens": "this engine's requests' `max_tokens`, over `load.max_tokens` (flashrec 0.1.2 counts SID codes only: give it the catalog's depth)",
    "engine.device": "`--device` of launched servers",
    "engine.host": "where a launched server listens",
    "engine.port": "a launched server's port; unset: a free one",
    "engine.cwd": "working directory of a launched server (e.g. a baseline worktree)",
    "engine.standard_args": "for `kind: command`: append `--model-path`, `--sid-vocab-file`, `--host`, `--port`, `--device` as for FlashRec",
    "engine.model_name": "the chat body's `model` field; unset: `default`",
    "engine.tokenizer": "tokenizer whose chat template builds `/generate` prompts; unset: the model path",
    "engine.startup_timeout_s": "`/health` must answer 200 within this, else the cell fails with the log tail",
    "engine.stop_timeout_s": "SIGTERM grace before the process group is killed",
    "engine.control": "in `engines`: an A/A control repeating the first engine (only name, port "
    "and timeouts its own); its spread from the first bounds the side-by-side verdicts "
    "([peers](harness/peers.md))",
    "model.path": "checkpoint directory; empty (`${MODEL_PATH:-}` unset) means use the preset",
    "model.preset": "synthetic preset (`tiny`, `tiny-llama`, `tiny-qwen2`, `onerec-1.7b`, `qwen2-1.5b`, `llama-1.5b`), built on first use with `flashrec.synth.build_checkpoint` and cached",
    "model.seed": "preset weights' seed",
    "model.dtype": "preset storage dtype: `float32`, `bf16` or `fp8`",
    "model.catalog_size": "preset only: also write a catalog of this many SIDs",
    "model.cache_dir": "where presets are cached; unset: `$FLASHREC_CACHE/models/`, else `~/.cache/flashrec/models/`",
    "model.sid_entropy": "preset only: calibrate the model's mean per-step next-SID entropy to this many nats (`flashrec synth --sid-entropy`); unset: random init",
    "catalog.path": "catalog file (any format `flashrec catalog` reads), passed as `--sid-vocab-file`",
    "catalog.size": "same as `model.catalog_size`",
    "catalog.levels": "SID depth when there is no catalog; unset: the preset's, else 3",
    "workload.kind": "`synthetic` (`flashrec.synth.synth_prompts`), `lorem` (harness filler text; no engine code), `jsonl` or `recif` (parquet)",
    "workload.path": "`jsonl`: one chat a line, a message list or `{messages, ground_truth}`; `recif`: a parquet file or a folder of them",
    "workload.requests": "measured requests per round (closed loop)",
    "workload.warmup_requests": "warm-up requests, never counted; also the radix priming set",
    "workload.median_tokens": "synthetic prompts' median length (log-normal)",
    "workload.spread": "synthetic prompts' length spread",
    "workload.system_prompt_tokens": "length of the shared system prompt",
    "workload.seed": "prompt generation seed",
    "workload.shuffle": "shuffle a dataset's order",
    "load.mode": "`closed` (a fixed number in flight), `burst` (`concurrency` requests at once, the next burst when all are answered), `poisson` or `constant` (open loop)",
    "load.concurrency": "requests in flight (closed loop); requests per burst (`burst`)",
    "load.rate": "open loop: requests per second",
    "load.duration_s": "open loop: duration; unset: `requests / rate`",
    "load.rounds": "measured rounds per cell (`--rounds` overrides)",
    "load.beam_width": "`n` of every request",
    "load.max_tokens": "new tokens per request; unset: SID depth + 1 (the codes and `<|sid_end|>`)",
    "load.temperature": "sampling temperature",
    "load.seed": "sampling seed",
    "load.radix": "before every round: `cold` flushes the prefix cache, `warm` flushes it and sends the warm-up requests",
    "load.request_timeout_s": "per request",
    "load.cell_timeout_s": "the whole cell (its quality eval included); the cell fails past it",
    "load.cooldown_s": "pause after every round",
    "load.interleave_engines": "several engines: every engine's server of a cell up at once, rounds alternating between them (A B, B A, ...)",
    "trace.cells": "`none`, `first`, `all`, or a list of cell filters",
    "trace.num_steps": "sent to `/start_profile`",
    "trace.output_dir": "a launched server writes its traces below it; unset: `OUT/traces`; for external servers a directory both sides reach",
    "trace.requests": "requests of the traced round; unset: the measured requests",
    "trace.settle_s": "trace files must be unchanged this long to count as complete",
    "trace.timeout_s": "give up waiting for the files (trace status `timeout` / `missing`)",
    "trace.profile_args": "extra `/start_profile` fields (`activities`, `with_stack`, `record_shapes`, ...)",
    "trace.spans": "host annotations (e.g. `flashrec.beam`) each traced file's report breaks down: host time per occurrence, direct children, own time, the GPU work launched; a name the trace lacks is said",
    "stats.bootstrap": "bootstrap resamples of the median",
    "stats.confidence": "interval level (the keys stay `ci95_*`)",
    "stats.min_rounds": "fewer rounds: a no-conclusion note",
    "stats.max_cv": "a higher CV of QPS or p50: a too-noisy note",
    "stats.band_k": "noise band = `band_k` x CV",
    "stats.alpha": "significance level of `compare` and `gate`",
    "stats.test": "`welch` or `mannwhitney` (3 rounds a side can never reach p < 0.05)",
    "stats.correction": "multiple-test correction of `compare` / `gate` verdicts over every cell x metric of one comparison",
    "stats.between_run_band_pct": "how far two separate runs of one setup drift apart, in %; unset: `compare` of two runs calls no change",
    "stats.busy_host_cores": "other processes' CPU cores over a cell's rounds that make it a busy-host cell; 0 turns it off",
    "stats.seed": "seed of the bootstrap",
    "quality.ks": "cut-offs of hit / recall / NDCG / MRR and the eval's metrics; `[1, 32]` with `official`",
    "quality.dataset": "RecIF parquet file or folder, or JSONL, evaluated in each cell",
    "quality.sid2pid": "SID -> item mapping for the PID metrics; unset: `sid2pid.json` beside the dataset",
    "quality.generate": "build a planted dataset once per run from the run's model, as `flashrec-bench eval-dataset` does (kept in `OUT/quality/dataset/`, reused by `--resume`)",
    "quality.generate.samples": "samples",
    "quality.generate.fraction": "share of samples whose first answer is the reference's top-1",
    "quality.generate.extra_answers": "unreachable answers added to each sample",
    "quality.generate.seed": "prompt and answer seed",
    "quality.generate.task": "task name (the dataset's folder and file name)",
    "quality.generate.beams": "beams of the reference decode",
    "quality.generate.median_tokens": "prompts' median length",
    "quality.generate.device": "the reference's device; unset: the engine's",
    "quality.generate.reference_url": "a running reference server instead of a launched one",
    "quality.official": "the benchmark's protocol: 32 beams, 3 tokens, ks [1, 32]",
    "quality.beam_width": "beams of every eval request; unset: the cell's",
    "quality.max_tokens": "tokens of every eval request; unset: the cell's",
    "quality.samples": "evaluate the first N samples; unset: all",
    "quality.concurrency": "eval requests in flight",
    "quality.request_timeout_s": "per eval request",
    "quality.cells": "a cell filter; unset: every cell",
    "parity.enabled": "run the stage",
    "determinism.enabled": "run the stage",
    "gates[].name": "display name; unset: built from the metric or path and the condition",
    "gates[].metric": "a cell metric, checked against each selected cell's median; exactly one of `metric` and `path`",
    "gates[].path": "a dotted path to a number in report.json (list indices allowed); with `cells`, read inside each selected report cell",
    "gates[].op": "with `value`: a threshold",
    "gates[].value": "with `op`: the threshold (booleans compare as 0 / 1)",
    "gates[].max_regression_pct": "relative gate: fails when the metric got worse by more than this beyond the noise band, significantly (`compare`, `gate`)",
    "gates[].min_improvement_pct": "relative gate: passes only when the metric improved by at least this beyond the noise band, significantly",
    "gates[].beyond_noise": "`false`: a relative gate is a plain threshold on the relative change",
    "gates[].cells": "a cell filter; unset: every cell",
    "gates[].required": "`no_data` counts as `fail`",
    "baseline.hf": "HF transformers `generate(num_beams=n)`, timed per cell in its own process",
    "baseline.hf.enabled": "run the baseline",
    "baseline.hf.requests": "K: the cell's first K measured prompts are timed; a number or an expression over the cell's parameters (plus `beam_width`, `concurrency`, `prompt_tokens`, `max_tokens`, `requests`), e.g. `\"1 if beam_width * prompt_tokens > 1000000 else 2\"`",
    "baseline.hf.warmup": "untimed `generate` calls on the first prompt before timing",
    "baseline.hf.dtype": "HF's dtype",
    "baseline.hf.device": "unset: the engine's device, else `cuda` when available, else `cpu`",
    "baseline.hf.max_kv_gib": "memory guard: a cell whose per-beam KV estimate exceeds it is skipped",
    "baseline.hf.timeout_s": "the baseline process is killed past it (recorded as an error)",
    "baseline.hf.cells": "a filter or a list of filters; unset: every cell",
    "mfu.ceiling_tflops": "one number, or a map from the `by` parameter's value (case-insensitive; a `default` key catches the rest) to TFLOP/s",
    "mfu.by": "the cell parameter whose value picks the ceiling",
    "mfu.decode_forwards": "decode forwards per request; unset: min(max_tokens, levels) - 1",
    "targets[].name": "display name; unset: built from metric, op and value",
    "targets[].metric": "a cell metric, or a dotted value of the report cell (`baseline.hf.speedup`)",
    "targets[].op": "comparison",
    "targets[].value": "the goal",
    "targets[].cells": "a cell filter; unset: every cell",
    "targets[].relative_to": "`key=value,...`: judge each cell's metric as a ratio to the same run's cell with these parameters changed",
    "targets[].fail_run": "a missed target (or one with no data) exits 1",
}

# Stage keys, which the stages validate themselves: (key, type, default, meaning); checked below.
PARITY_KEYS = [
    ("precision", "`float32` / `bfloat16` / `fp8`", "`float32`", "single candidate: the thresholds and both servers' flags"),
    ("reference_dtype", "str", "unset", "the reference's dtype instead of the precision's (`float32` by default with `candidates`)"),
    ("ns", "list of int", "`[1, 4, 16, 64]`", "beam widths; empty is an error; required with `candidates`"),
    ("prompts", "int", "`8`", "synthetic prompts"),
    ("median_tokens", "int", "`96`", "prompts' median length"),
    ("system_prompt_tokens", "int", "`32`", "shared system prompt length"),
    ("seed", "int", "`0`", "prompt seed"),
    ("protocols", "`auto` or list", "`auto`", "`chat` and / or `generate`; auto: what both servers answer with scored beams"),
    ("max_tokens", "int", "unset", "new tokens per request; unset: the server's SID depth + 1"),
    ("server_args", "map", "`{}`", "more FlashRec flags (every FlashRec candidate)"),
    ("reference_args", "map", "`{}`", "more flags of the HF reference server"),
    ("thresholds", "map", "unset", "single candidate: overrides of the precision's thresholds"),
    ("device", "str", "the engine's", "device of launched servers"),
    ("timeout_s", "float", "`300`", "per request"),
    ("startup_timeout_s", "float", "`600`", "server start"),
    ("reference_url", "URL", "unset", "a running reference instead of a launched one"),
    ("candidate_url", "URL", "unset", "single candidate: a running candidate"),
    ("candidates", "list of maps", "unset", "several candidates against one reference (below)"),
]  # fmt: skip
CANDIDATE_DOCS = [
    ("name", "str", "required", "unique name"),
    ("kind", "`flashrec` / `reference`", "`flashrec`", "`reference`: the HF reference server at another dtype"),
    ("precision", "str", "from the flags", "picks thresholds and base flags; unset: fp8 when quantized, else its `dtype`, else float32"),
    ("dtype", "str", "unset", "FlashRec `--dtype`; a reference's dtype"),
    ("quantization", "str", "unset", "FlashRec `--quantization`"),
    ("kv_cache_dtype", "str", "unset", "FlashRec `--kv-cache-dtype`"),
    ("server_args", "map", "`{}`", "more flags of this candidate"),
    ("url", "URL", "unset", "a running server instead of a launched one"),
    ("thresholds", "map", "unset", "overrides of the precision's thresholds"),
    ("gate", "bool", "`true` (flashrec)", "the thresholds fail the stage; `false` for references and engines by default"),
    ("no_worse_than", "name or map", "unset", "`NAME` or `{than, metrics, tolerance, confidence}`: no worse against the reference than another candidate, within noise"),
    ("engine", "str", "unset", "one of the matrix's engines, launched by its own command"),
    ("against", "str", "unset", "also compare answers with this other candidate"),
]  # fmt: skip
DETERMINISM_DOCS = {
    "requests": "distinct requests (>= 120 for an acceptance run)",
    "processes": "fresh server processes (>= 2)",
    "mode": "`sequential`, `concurrent` or `both`",
    "concurrency": "requests in flight in concurrent mode",
    "server_args": "FlashRec server flags",
    "server_env": "server environment variables",
    "protocol": "`chat` or `generate`",
    "ns": "beam widths, cycled over the requests",
    "median_tokens": "prompts' median length",
    "seed": "prompt seed",
    "device": "unset: the engine's",
    "localise_drift": "on drift, replay with step hashes to find the first divergent step",
    "strict_concurrent": "concurrent drift fails too (needs `mode: both`)",
}
# run_determinism's parameters that are not section keys (the stage passes the model)
DETERMINISM_NOT_KEYS = {"model_path", "sid_vocab_file", "out_dir", "log"}

# the topic page that explains each section's behaviour (docs/harness/<page>)
TOPICS = {
    **dict.fromkeys(["", "engine", "model", "catalog", "workload", "load"], "matrix.md"),
    **dict.fromkeys(["quality", "quality.generate"], "quality.md"),
    **dict.fromkeys(["parity", "determinism"], "stages.md"),
    **dict.fromkeys(["gates[]", "targets[]"], "gates.md"),
    **dict.fromkeys(["baseline", "baseline.hf", "mfu"], "baseline-mfu.md"),
    "trace": "traces.md",
    "stats": "statistics.md",
}
STAGE_INTRO = {
    "parity": "The parity stage: candidate servers' beams against a reference's, per prompt, n "
    "and protocol. Besides `enabled`, the stage validates these keys itself.",
    "determinism": "The determinism stage: the same requests through fresh server processes, "
    "compared bit for bit (`flashrec-bench determinism` takes the same keys as flags). Besides "
    "`enabled`, the stage validates these keys itself.",
}

INTRO = """# flashrec-bench matrix reference

Generated by `python scripts/gen_harness_docs.py` from the matrix spec models; `--check` fails
when a model has a key this page lacks. The guide is [harness.md](harness.md).

- Strings may use `${VAR}` or `${VAR:-default}`; an unset variable without a default is an error.
- Unknown keys are errors, with the closest known key (`loda: Extra inputs are not permitted (did you mean 'load'?)`).
- Every error names the file, the line and the field: `matrices/x.yaml:14: load.rounds: Input should be greater than or equal to 1`.
- `python -m harness MATRIX --dry-run` validates a matrix and prints its servers and cells.
- Default `unset` means the key may be left out; what that means is in the meaning column.
""".split("\n")


def _is_list(annotation: Any) -> bool:
    args = [annotation, *typing.get_args(annotation)]
    return any(typing.get_origin(a) is list for a in args)


def _type(ann: Any) -> str:
    """A readable YAML type: ``int``, ``list of str``, ```a` / `b```, ``map of str to float``."""
    if ann is type(None):
        return "null"
    if ann == Scalar:
        return "scalar"
    if ann is Any:
        return "any"
    if isinstance(ann, type):
        if issubclass(ann, BaseModel):
            return "section"
        return ann.__name__
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is Literal:
        return " / ".join(f"`{a}`" for a in args)
    if origin in (list, tuple):
        return f"list of {_type(args[0])}"
    if origin is dict:
        return f"map of {_type(args[0])} to {_type(args[1])}"
    if args:  # a union: X | None shows as X (the default says unset)
        parts = [_type(a) for a in args if a is not type(None)]
        return " or ".join(parts)
    return str(ann)


def _bounds(info: Any) -> str:
    out = []
    for meta in info.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(meta, attr, None) is not None:
                out.append(f"{sign} {_value(getattr(meta, attr))}")
        pattern = getattr(meta, "pattern", None)
        if pattern and pattern.startswith("^") and pattern.endswith("$"):
            out.append(f"all of it matching `{pattern[1:-1]}`")
        elif pattern:
            out.append(f"matching the regex `{pattern}`")
    return ", ".join(out)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _default(info: Any) -> str:
    if info.default_factory is not None:
        v = info.default_factory()
    elif info.default is PydanticUndefined:
        return "required"
    else:
        v = info.default
    if v is None:
        return "unset"
    if isinstance(v, BaseModel):
        return "defaults"
    if isinstance(v, (list, dict)):
        return f"`{v!r}`".replace("'", "")
    return f"`{_value(v)}`"


def _describe(path: str, info: Any) -> str:
    text = info.description or DESCRIPTIONS.get(path)
    if not text:
        raise SystemExit(f"no description for matrix key {path!r}: add it to DESCRIPTIONS")
    return text


def sections(root: type[BaseModel] = MatrixSpec) -> list[tuple[str, type[BaseModel], str | None]]:
    """(key prefix, model, shared-with) of every section, depth first from ``root``; a model
    met again (``engines`` after ``engine``) names the first prefix instead of its keys."""
    out: list[tuple[str, type[BaseModel], str | None]] = [("", root, None)]
    seen: dict[type, str] = {root: ""}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            sub = model_in(info.annotation)
            if sub is None:
                continue
            path = prefix + name + ("[]" if _is_list(info.annotation) else "")
            if sub in seen and sub is not StageSpec:
                out.append((path, sub, seen[sub]))
                continue
            seen.setdefault(sub, path)
            out.append((path, sub, None))
            walk(sub, path + ".")

    walk(root, "")
    return out


def key_paths(root: type[BaseModel] = MatrixSpec) -> list[str]:
    """Every key path the reference must name: the models' fields and the stages' keys."""
    paths = []
    for prefix, model, shared in sections(root):
        if shared is not None:
            continue
        paths += [(f"{prefix}." if prefix else "") + n for n in model.model_fields]
    paths += [f"parity.{k}" for k, *_ in PARITY_KEYS]
    paths += [f"parity.candidates[].{k}" for k, *_ in CANDIDATE_DOCS]
    paths += [f"determinism.{k}" for k in DETERMINISM_DOCS]
    return paths


def _check_stage_keys() -> None:
    """The stages' own keys documented here are exactly the ones they take."""
    for what, documented, taken in (
        ("parity candidate", {k for k, *_ in CANDIDATE_DOCS}, CANDIDATE_KEYS),
        ("determinism", set(DETERMINISM_DOCS),
         set(inspect.signature(run_determinism).parameters) - DETERMINISM_NOT_KEYS),
    ):  # fmt: skip
        if documented != taken:
            raise SystemExit(f"{what} keys differ from the stage's: {sorted(documented ^ taken)}")


def _stage_rows(stage: str) -> list[str]:
    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |",
            f"| `{stage}.enabled` | bool | `true` | run the stage |"]  # fmt: skip
    if stage == "parity":
        rows += [f"| `parity.{k}` | {t} | {d} | {m} |" for k, t, d, m in PARITY_KEYS]
        rows += ["", "### `parity.candidates[]`", "",
                 "| key | type | default | meaning |", "| --- | --- | --- | --- |"]  # fmt: skip
        rows += [
            f"| `parity.candidates[].{k}` | {t} | {d} | {m} |" for k, t, d, m in CANDIDATE_DOCS
        ]
    else:
        params = inspect.signature(run_determinism).parameters
        hints = typing.get_type_hints(run_determinism)
        for k, meaning in DETERMINISM_DOCS.items():
            d = params[k].default
            shown = "unset" if d is None else f"`{list(d) if isinstance(d, tuple) else _value(d)}`"
            kind = _type(hints[k]).replace("dict", "map")
            rows.append(f"| `determinism.{k}` | {kind} | {shown} | {meaning} |")
    return rows


def _cell_parameters() -> list[str]:
    rows = [
        "## Cell parameters",
        "",
        "Names an axis, a `cells:` entry or a `link` may set. Client parameters change the "
        "load or the requests (cells that differ only in them share a server); `both` also "
        "sets launched servers' `--beam-width` (a restart); any other name is a `server` "
        "parameter: a `flashrec serve` flag (checked by its parser at load), passed as "
        "`--flag value`; a change restarts the server.",
        "",
        "| parameter | scope | sets |",
        "| --- | --- | --- |",
    ]
    homes = (("load", LoadSpec), ("workload", WorkloadSpec))
    for scope, table in (("client", CLIENT_KEYS), ("both", BOTH_KEYS)):
        for param, attr in table.items():
            home = next((name for name, m in homes if attr in m.model_fields), None)
            if home is None:
                raise SystemExit(f"cell parameter {param!r} sets neither load nor workload")
            rows.append(f"| `{param}` | {scope} | `{home}.{attr}` |")
    return rows + [""]


def render(root: type[BaseModel] = MatrixSpec) -> str:
    """The reference page for ``root`` (the matrix spec)."""
    _check_stage_keys()
    paths = set(key_paths(root))
    unknown = sorted(set(DESCRIPTIONS) - paths)
    if unknown:
        raise SystemExit(f"DESCRIPTIONS name no matrix key: {unknown}")
    out = list(INTRO)
    for prefix, model, shared in sections(root):
        if shared is not None:
            continue
        title = "Top level" if not prefix else f"`{prefix}`"
        page = TOPICS.get(prefix)
        more = [f"How it behaves: [{page}](harness/{page}).", ""] if page else []
        if model is StageSpec:
            out += [f"## {title}", "", STAGE_INTRO[prefix], ""] + more
            out += _stage_rows(prefix) + [""]
            continue
        doc = " ".join((model.__doc__ or "").replace("``", "`").split())
        out += [f"## {title}", "", doc, ""] + more
        others = [p for p, _, s in sections(root) if s == prefix]
        if others:
            out += [f"The items of {', '.join(f'`{p}`' for p in others)} take the same keys.", ""]
        out += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for name, info in model.model_fields.items():
            path = (f"{prefix}." if prefix else "") + name
            kind = _type(info.annotation)
            bounds = _bounds(info)
            kind = f"{kind}, {bounds}" if bounds else kind
            text = _describe(path, info).replace("|", "\\|")
            out.append(f"| `{path}` | {kind} | {_default(info)} | {text} |")
        out.append("")
        if prefix == "":
            out += _cell_parameters()
    return "\n".join(out).rstrip() + "\n"


def missing_keys(text: str, root: type[BaseModel] = MatrixSpec) -> list[str]:
    """Key paths of the models (and stages) that ``text`` does not name."""
    return [p for p in key_paths(root) if f"`{p}`" not in text]


def check(path: Path = REFERENCE) -> list[str]:
    """Problems of the reference at ``path``: keys it lacks, or text differing from render()."""
    text = path.read_text() if path.is_file() else ""
    problems = [f"lacks key {k}" for k in missing_keys(text)]
    if text != render():
        problems.append(f"stale: run python scripts/gen_harness_docs.py ({path.name})")
    return problems


def main() -> int:
    if "--check" in sys.argv:
        problems = check()
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    REFERENCE.write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
