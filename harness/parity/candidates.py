"""Several candidates against one reference: the ``candidates:`` form of the ``parity:`` section
parsed and checked (:func:`parse_plan`), the per candidate x n table, the ``no_worse_than``
rule (:func:`judge_rules`) and the stage result (:func:`multi_result`). No network."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.parity.compare import (
    ALIASES,
    Case,
    Thresholds,
    case_label,
    diff_table,
    evaluate,
    precision_args,
    summarise,
    thresholds_for,
    unusable,
)

KINDS = ("flashrec", "reference")
REFERENCE_DTYPES = ("float32", "bfloat16", "float16")
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# what no_worse_than compares unless a rule names its own metrics (higher is closer)
RULE_METRICS = ("top1_agreement", "overlap_mean")
CANDIDATE_KEYS = {"name", "kind", "precision", "dtype", "quantization", "kv_cache_dtype",
                  "server_args", "url", "thresholds", "gate", "no_worse_than", "engine",
                  "against"}  # fmt: skip
# top-level keys that belong to the single-candidate form only
SINGLE_ONLY = ("candidate_url", "precision", "thresholds")
TABLE_COLUMNS = ("cases", "errors", "exact_rate", "top1_agreement", "overlap_mean", "overlap_min",
                 "spearman_mean", "spearman_min", "max_score_diff")  # fmt: skip


# the per-case field behind each metric a rule may compare (higher is closer to the reference)
CASE_FIELDS = {"exact_rate": "exact", "top1_agreement": "top1", "overlap_mean": "overlap",
               "spearman_mean": "spearman", "overlap_min": None, "spearman_min": None}  # fmt: skip


@dataclass(frozen=True)
class Rule:
    """``candidate``'s metrics against fp32 must be >= ``than``'s, less ``tolerance`` and less
    the noise band of the paired per-prompt differences at ``confidence`` (one-sided; 0: no
    band), so that one prompt's near-tie flipping on either side is not called a regression."""

    candidate: str
    than: str
    metrics: tuple[str, ...] = RULE_METRICS
    tolerance: float = 0.0
    confidence: float = 0.95


@dataclass(frozen=True)
class Candidate:
    """One engine configuration compared with the reference."""

    name: str
    kind: str  # flashrec | reference (an HF reference server at another dtype)
    precision: str  # float32 | bfloat16 | fp8: the thresholds
    args: dict = field(default_factory=dict)  # the launched server's flags
    url: str | None = None  # a running server instead of a launched one
    thresholds: Thresholds | None = None
    gate: bool = True  # thresholds fail the stage (else reported only)
    engine: Any = None  # a matrix engine (EngineSpec) launched as this candidate (a peer)
    against: str | None = None  # another candidate its answers are also compared with


@dataclass(frozen=True)
class Plan:
    """The checked ``candidates:`` section."""

    reference_dtype: str
    reference_args: dict
    candidates: list[Candidate]
    rules: list[Rule]
    ns: list[int]


def _precision(c: dict) -> str:
    """A candidate's precision: given, else fp8 when quantized, else its dtype (float32)."""
    if c.get("precision"):
        name = str(c["precision"])
    elif str(c.get("quantization") or "none").lower() not in ("none", "bf16", "bfloat16"):
        name = str(c["quantization"])
    else:
        name = str(c.get("dtype") or "float32")
    name = ALIASES.get(name, name)
    thresholds_for(name)  # unknown names raise here, with the known ones
    return name


def reference_dtype(value: Any, default: str = "float32") -> str:
    """The HF reference server's dtype (``reference_dtype``; bf16 / fp32 aliases accepted)."""
    name = str(value or default)
    name = DTYPE_NAMES.get(name, name)
    if name not in REFERENCE_DTYPES:
        raise ValueError(f"parity: reference_dtype {value!r} is not one of {REFERENCE_DTYPES}")
    return name


def _candidate(
    c: Any, base: dict, ref_base: dict, i: int, engines: dict | None = None
) -> Candidate:
    if not isinstance(c, dict) or not c.get("name"):
        raise ValueError(f"parity: candidates[{i}] needs a 'name' (got {c!r})")
    name = str(c["name"])
    unknown = sorted(set(c) - CANDIDATE_KEYS)
    if unknown:
        raise ValueError(f"parity: candidate {name!r}: unknown keys {unknown}")
    kind = str(c.get("kind", "flashrec"))
    if kind not in KINDS:
        raise ValueError(f"parity: candidate {name!r}: kind {kind!r} is not one of {KINDS}")
    try:
        precision = _precision(c)
    except ValueError as exc:
        raise ValueError(f"parity: candidate {name!r}: {exc}") from None
    own = {k: c[k] for k in ("dtype", "quantization", "kv_cache_dtype") if c.get(k) is not None}
    if "dtype" in own:  # the servers' --dtype takes full names only
        own["dtype"] = DTYPE_NAMES.get(str(own["dtype"]), str(own["dtype"]))
    if c.get("engine") is not None:
        return _engine_candidate(c, name, precision, engines or {})
    if kind == "reference":
        if precision == "fp8" or set(own) - {"dtype"}:
            raise ValueError(
                f"parity: candidate {name!r}: the HF reference takes only a dtype "
                "(no quantization, no kv_cache_dtype)"
            )
        args = {**precision_args(precision)[1], **ref_base, **own}
    else:
        args = {**precision_args(precision)[0], **base, **own}
    args.update(c.get("server_args") or {})
    th = thresholds_for(precision, c.get("thresholds"))
    gate = bool(c.get("gate", kind == "flashrec"))  # an HF yardstick is reported, not gated
    return Candidate(name, kind, precision, args, c.get("url"), th, gate, against=c.get("against"))


def _engine_candidate(c: dict, name: str, precision: str, engines: dict) -> Candidate:
    """A candidate that is one of the matrix's engines (``engine: NAME``): launched by that
    engine's own command, environment and ``args`` (plus the candidate's ``server_args``; none
    of FlashRec's precision flags), or reached at its URL when external. Reported, not gated,
    unless ``gate: true``."""
    eng = engines.get(str(c["engine"]))
    if eng is None:
        raise ValueError(f"parity: candidate {name!r}: engine {c['engine']!r} is not one of the "
                         f"matrix's engines {sorted(engines)}")  # fmt: skip
    mixed = [k for k in ("kind", "dtype", "quantization", "kv_cache_dtype") if c.get(k) is not None]
    if mixed:
        raise ValueError(f"parity: candidate {name!r}: {mixed} do not go with 'engine' (the "
                         "engine's own args and the candidate's server_args set its flags)")  # fmt: skip
    args = {**eng.args, **(c.get("server_args") or {})}
    th = thresholds_for(precision, c.get("thresholds"))
    url = c.get("url") or (eng.url if not eng.launched else None)
    return Candidate(name, "engine", precision, args, url, th, bool(c.get("gate", False)),
                     eng, c.get("against"))  # fmt: skip


def _rule(name: str, spec: Any) -> Rule:
    if isinstance(spec, str):
        return Rule(name, spec)
    if not isinstance(spec, dict) or not spec.get("than"):
        raise ValueError(f"parity: candidate {name!r}: no_worse_than is a name or {{than: NAME}}")
    metrics = tuple(spec.get("metrics") or RULE_METRICS)
    bad = [m for m in metrics if m not in CASE_FIELDS]
    if bad:
        raise ValueError(
            f"parity: no_worse_than metrics {bad} are not among {tuple(CASE_FIELDS)} "
            "(those where higher is closer to the reference)"
        )
    conf = float(spec.get("confidence", 0.95))
    if not (conf == 0 or 0.5 <= conf < 1):
        raise ValueError(f"parity: no_worse_than confidence {conf} must be 0 (none) or in [0.5, 1)")
    return Rule(name, str(spec["than"]), metrics, float(spec.get("tolerance", 0.0)), conf)


def parse_plan(spec: dict, engines: dict | None = None) -> Plan:
    """The ``candidates:`` form, checked before anything is launched: a clear ``ValueError``
    for an empty list, no ``ns``, a duplicate name, an unknown kind, key or precision, or a
    rule naming no candidate."""
    raw = spec.get("candidates")
    if not raw:
        raise ValueError("parity: 'candidates' is empty: nothing to compare against the reference")
    mixed = [k for k in SINGLE_ONLY if spec.get(k) is not None]
    if mixed:
        raise ValueError(f"parity: {mixed} belong to the single-candidate form, not 'candidates'")
    ns = spec.get("ns")
    if not ns:
        raise ValueError("parity: 'ns' (the beam widths compared) is missing or empty")
    ns = [int(n) for n in ns]
    if any(n < 1 for n in ns):
        raise ValueError(f"parity: every n must be >= 1 (ns: {ns})")
    ref_dtype = reference_dtype(spec.get("reference_dtype"))
    ref_args = {**(spec.get("reference_args") or {}), "dtype": ref_dtype}
    base, ref_base = dict(spec.get("server_args") or {}), dict(spec.get("reference_args") or {})
    cands = [_candidate(c, base, ref_base, i, engines) for i, c in enumerate(raw)]
    names = [c.name for c in cands]
    if len(set(names)) != len(names):
        raise ValueError(f"parity: candidate names must be unique, got {names}")
    for c in cands:
        if c.against is not None and (c.against not in names or c.against == c.name):
            raise ValueError(f"parity: {c.name!r} against {c.against!r}: name another "
                             f"candidate (candidates: {names})")  # fmt: skip
    rules = [_rule(str(c["name"]), c["no_worse_than"]) for c in raw if c.get("no_worse_than")]
    for r in rules:
        if r.than not in names or r.than == r.candidate:
            raise ValueError(
                f"parity: {r.candidate!r} no_worse_than {r.than!r}: name another candidate "
                f"(candidates: {names})"
            )
    return Plan(ref_dtype, ref_args, cands, rules, ns)


# --------------------------------------------------------------------------- results


def by_n(cases: list[Case], ns: list[int]) -> dict[int, dict]:
    """:func:`summarise` of each n's cases."""
    return {n: summarise([c for c in cases if c.n == n]) for n in ns}


def candidate_result(cand: Candidate, cases: list[Case], ns: list[int]) -> dict[str, Any]:
    """One candidate's verdict: case errors and an n without a single compared case always
    fail; the precision's thresholds fail only a gated candidate (else they are ``notes``)."""
    per_n = by_n(cases, ns)
    failures = [f"n={n}: no case returned beams" for n, s in per_n.items() if not s["cases"]]
    failures += [f"n={n}: every case failed" for n, s in per_n.items()
                 if s["cases"] and s["cases"] == s["errors"]]  # fmt: skip
    th = cand.thresholds or thresholds_for(cand.precision)
    failures += [f"{case_label(c)}: {c.error}" for c in cases if c.error]
    answered = [c for c in cases if not c.error]
    broken = unusable(answered)  # nothing to compare: fails ungated candidates too
    failures += broken
    notes = [m for m in evaluate(answered, th) if m not in broken] if answered else []
    failures += notes if cand.gate else []
    bad = [
        c
        for c in answered
        if not c.metrics["exact"] or not (c.metrics["max_score_diff"] or 0) <= th.max_score_diff
    ]
    return {
        "name": cand.name,
        "kind": cand.kind,
        "precision": cand.precision,
        "args": cand.args,
        "gate": cand.gate,
        "thresholds": asdict(th),
        "status": "fail" if failures else "pass",
        "passed": not failures,
        "failures": failures,
        "notes": [] if cand.gate else notes,
        "summary": summarise(cases),
        "by_n": {str(n): s for n, s in per_n.items()},
        "diff_tables": [diff_table(c) for c in bad[:3]],
    }


def table_rows(results: list[dict], ns: list[int]) -> list[dict]:
    """One row per candidate x n (report.json ``parity.table``)."""
    return [
        {
            "candidate": r["name"],
            "kind": r.get("kind"),
            "precision": r.get("precision"),
            "n": n,
            **{k: (r.get("by_n") or {}).get(str(n), {}).get(k) for k in TABLE_COLUMNS},
        }
        for r in results
        for n in ns
    ]


AGAINST_COLUMNS = ("cases", "errors", "exact_rate", "top1_agreement", "overlap_mean",
                   "overlap_min", "max_score_diff")  # fmt: skip


def against_rows(name: str, other: str, cases: list[Case], ns: list[int]) -> list[dict]:
    """A candidate's answers against another candidate's (``against``; e.g. a peer engine
    against ours), per n: top-1 equal, mean overlap@n, max |score diff| on shared beams."""
    per_n = by_n(cases, ns)
    return [{"candidate": name, "against": other, "n": n,
             **{k: per_n[n].get(k) for k in AGAINST_COLUMNS}} for n in ns]  # fmt: skip


def paired_noise(rows: list[dict], a: str, b: str, n: int, field: str | None, conf: float):
    """The noise band of ``a``'s mean minus ``b``'s over the prompts both answered at ``n``:
    z(conf) x the standard error of the per-prompt differences. Returns (band, pairs); band
    0 without a per-case field, below 2 pairs or with ``conf`` 0 (then the check is strict)."""
    if field is None:
        return 0.0, 0
    ok = [r for r in rows if r.get("n") == n and not r.get("error") and r.get(field) is not None]
    got = {c: {(r.get("protocol"), r.get("prompt")): float(r[field]) for r in ok
               if r.get("candidate") == c} for c in (a, b)}  # fmt: skip
    keys = sorted(set(got[a]) & set(got[b]), key=str)
    if not conf or len(keys) < 2:
        return 0.0, len(keys)
    d = [got[a][k] - got[b][k] for k in keys]
    se = statistics.stdev(d) / math.sqrt(len(d))
    return statistics.NormalDist().inv_cdf(conf) * se, len(keys)


def judge_rules(
    rules: list[Rule], table: list[dict], ns: list[int], rows: list[dict] | None = None
) -> list[dict]:
    """Each rule at each n and metric: ``value`` (the candidate's), ``other`` (the yardstick's),
    ``margin`` = value - other, ``noise`` the band of the paired per-prompt differences (case
    ``rows``; see :func:`paired_noise`), ``passed`` when margin + tolerance + noise >= 0, and
    ``within_noise`` when only the band made it pass. A side without a value (no case
    compared) fails, never passes on nothing."""
    cell = {(r["candidate"], r["n"]): r for r in table}
    out = []
    for rule in rules:
        for n in ns:
            for m in rule.metrics:
                a = (cell.get((rule.candidate, n)) or {}).get(m)
                b = (cell.get((rule.than, n)) or {}).get(m)
                margin = None if a is None or b is None else a - b
                noise, pairs = paired_noise(
                    rows or [], rule.candidate, rule.than, n, CASE_FIELDS.get(m), rule.confidence
                )
                strict = margin is not None and margin + rule.tolerance >= 0
                passed = margin is not None and margin + rule.tolerance + noise >= 0
                out.append(
                    {
                        "candidate": rule.candidate,
                        "than": rule.than,
                        "n": n,
                        "metric": m,
                        "value": a,
                        "other": b,
                        "margin": margin,
                        "tolerance": rule.tolerance,
                        "noise": noise,
                        "pairs": pairs,
                        "confidence": rule.confidence,
                        "passed": passed,
                        "within_noise": passed and not strict,
                    }
                )
    return out


def rule_failures(checks: list[dict]) -> list[str]:
    """The failed rule checks as sentences."""
    out = []
    for c in checks:
        if c["passed"]:
            continue
        if c["margin"] is None:
            out.append(f"{c['candidate']} no_worse_than {c['than']} n={c['n']} {c['metric']}: "
                       f"no value ({c['value']} vs {c['other']})")  # fmt: skip
        else:
            band = c.get("noise") or 0.0
            out.append(
                f"{c['candidate']} no_worse_than {c['than']} n={c['n']} {c['metric']}: "
                f"{c['value']:.4f} < {c['other']:.4f} (by {-c['margin']:.4f}"
                + (f", beyond the noise band {band:.4f} of {c['pairs']} prompts)" if band else ")")
            )
    return out


def multi_result(
    plan: Plan, results: list[dict], protocols: list[str], cases: list[dict]
) -> dict[str, Any]:
    """The stage result (parity.json): per-candidate verdicts, the candidate x n ``table``,
    the rule checks, every failure prefixed by its candidate, and the case rows."""
    table = table_rows(results, plan.ns)
    checks = judge_rules(plan.rules, table, plan.ns, cases)
    failures = [f"{r['name']}: {f}" for r in results for f in r.get("failures", [])]
    failures += rule_failures(checks)
    return {
        "status": "fail" if failures else "pass",
        "passed": not failures,
        "reference_dtype": plan.reference_dtype,
        "ns": plan.ns,
        "protocols": protocols,
        "candidates": results,
        "table": table,
        "rules": checks,
        "failures": failures,
        "diff_tables": [
            f"{r['name']} vs reference: {t}" for r in results for t in r.get("diff_tables", [])
        ],  # fmt: skip
        "cases": cases,
    }
