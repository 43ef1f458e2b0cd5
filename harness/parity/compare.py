"""Parity metrics: thresholds per precision, per-case comparison of two ranked beam lists,
aggregation, pass/fail evaluation and the per-prompt diff table. No network, no servers."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from harness.load.sids import SID_TOKEN


@dataclass(frozen=True)
class Beam:
    """One returned beam; ``key`` identifies it across engines."""

    token_ids: tuple[int, ...]
    score: float
    text: str = ""

    @property
    def key(self) -> tuple | str:
        return self.token_ids if self.token_ids else self.text


@dataclass(frozen=True)
class Thresholds:
    """Acceptance for one precision.

    ``exact``: every case must match rank for rank; ``max_score_diff``: on beams both returned;
    ``min_top1``: fraction of cases with the same best beam; ``min_overlap``: mean beam-set
    overlap; ``min_spearman``: lowest rank correlation on shared beams (None = not gated).
    """

    exact: bool
    max_score_diff: float
    min_top1: float
    min_overlap: float
    min_spearman: float | None = None


# float32 is the CI contract (exact). bf16 and fp8 are provisional defaults, to be calibrated
# from recorded GPU runs (docs/baselines.md); a stage's ``thresholds:`` overrides any field.
THRESHOLDS: dict[str, Thresholds] = {
    "float32": Thresholds(exact=True, max_score_diff=1e-4, min_top1=1.0, min_overlap=1.0),
    "bfloat16": Thresholds(
        exact=False, max_score_diff=0.1, min_top1=0.9, min_overlap=0.8, min_spearman=0.5
    ),
    "fp8": Thresholds(exact=False, max_score_diff=0.3, min_top1=0.75, min_overlap=0.6),
}
ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp8_e4m3": "fp8"}


# server flags a launched pair gets for a precision (explicit stage args override them)
PRECISION_ARGS: dict[str, tuple[dict, dict]] = {  # name -> (FlashRec, HF reference)
    "float32": ({"dtype": "float32", "quantization": "none"}, {"dtype": "float32"}),
    "bfloat16": ({"dtype": "bfloat16", "quantization": "none"}, {"dtype": "bfloat16"}),
    "fp8": ({"dtype": "bfloat16", "quantization": "fp8"}, {"dtype": "bfloat16"}),
}


def precision_args(precision: str) -> tuple[dict, dict]:
    """(FlashRec flags, reference flags) that run a launched pair at ``precision``."""
    cand, ref = PRECISION_ARGS[ALIASES.get(precision, precision)]
    return dict(cand), dict(ref)


def thresholds_for(precision: str, overrides: dict | None = None) -> Thresholds:
    """The thresholds of ``precision`` (float32 | bfloat16 | fp8) with ``overrides`` applied."""
    name = ALIASES.get(precision, precision)
    if name not in THRESHOLDS:
        raise ValueError(f"unknown precision {precision!r}; known: {sorted(THRESHOLDS)}")
    return replace(THRESHOLDS[name], **(overrides or {}))


# --------------------------------------------------------------------------- comparison


def spearman(a: list, b: list) -> float | None:
    """Spearman correlation of the ranks of the items both lists hold (None under 2)."""
    shared = set(a) & set(b)
    ra = [x for x in a if x in shared]
    rb = {x: i for i, x in enumerate(x for x in b if x in shared)}
    k = len(ra)
    if k < 2:
        return None
    d2 = sum((i - rb[x]) ** 2 for i, x in enumerate(ra))
    return 1.0 - 6.0 * d2 / (k * (k * k - 1))


def sid_key(text: str) -> tuple | str:
    """A beam's SID level tokens (``<s_a_1><s_b_2>`` -> ``(("a", "1"), ("b", "2"))``), whatever
    wraps them (``<|sid_begin|>``, ``<|sid_end|>``, spaces); the text itself when it holds none."""
    found = SID_TOKEN.findall(text)
    return tuple(found) if found else text


def beam_keys(ref: list[Beam], cand: list[Beam]) -> tuple[list, list]:
    """What identifies each side's beams: their token ids when every beam of both sides has
    them, else the SIDs in their text (a server that returns no ids, e.g. the public
    ``flashrec`` 0.1.2, whose chat text also carries ``<|sid_begin|>`` / ``<|sid_end|>``)."""
    if all(b.token_ids for b in ref) and all(b.token_ids for b in cand):
        return [b.key for b in ref], [b.key for b in cand]
    return [sid_key(b.text) for b in ref], [sid_key(b.text) for b in cand]


def compare_beams(ref: list[Beam], cand: list[Beam]) -> dict[str, Any]:
    """Metrics of one case (reference beams vs candidate beams, both best first)."""
    rk, ck = beam_keys(ref, cand)
    shared = set(rk) & set(ck)
    rs = {k: b.score for k, b in zip(rk, ref)}
    cs = {k: b.score for k, b in zip(ck, cand)}
    diffs = [abs(rs[k] - cs[k]) for k in shared]
    first = next((i for i, (x, y) in enumerate(zip(rk, ck)) if x != y), None)
    if first is None and len(rk) != len(ck):
        first = min(len(rk), len(ck))
    return {
        "ref_beams": len(ref),
        "cand_beams": len(cand),
        "exact": rk == ck,
        "first_diff_rank": first,
        "top1": bool(rk and ck and rk[0] == ck[0]) or (not rk and not ck),
        "overlap": len(shared) / max(len(rk), len(ck)) if (rk or ck) else 1.0,
        "shared": len(shared),
        "spearman": spearman(rk, ck),
        # NaN where any shared score is not finite (max() would keep or drop it by order)
        "max_score_diff": (
            None if not diffs else max(diffs) if all(map(math.isfinite, diffs)) else math.nan
        ),
    }


@dataclass
class Case:
    """One (protocol, prompt, n) comparison."""

    protocol: str
    prompt: int
    n: int
    metrics: dict = field(default_factory=dict)
    ref: list[Beam] = field(default_factory=list)
    cand: list[Beam] = field(default_factory=list)
    error: str = ""

    def row(self) -> dict:
        """The case without its beams (for report.json)."""
        return {
            "protocol": self.protocol,
            "prompt": self.prompt,
            "n": self.n,
            **self.metrics,
            **({"error": self.error} if self.error else {}),
        }


def summarise(cases: list[Case]) -> dict[str, Any]:
    """Aggregates over the cases that returned beams."""
    ok = [c for c in cases if not c.error]
    m = [c.metrics for c in ok]
    diffs = [x["max_score_diff"] for x in m if x["max_score_diff"] is not None]
    sp = [x["spearman"] for x in m if x["spearman"] is not None]
    return {
        "cases": len(cases),
        "errors": len(cases) - len(ok),
        "exact": sum(x["exact"] for x in m),
        "exact_rate": sum(x["exact"] for x in m) / len(m) if m else None,
        "top1_agreement": sum(x["top1"] for x in m) / len(m) if m else None,
        "overlap_mean": sum(x["overlap"] for x in m) / len(m) if m else None,
        "overlap_min": min((x["overlap"] for x in m), default=None),
        "spearman_mean": sum(sp) / len(sp) if sp else None,
        "spearman_min": min(sp, default=None),
        "max_score_diff": max(diffs, default=None),
    }


def unusable(cases: list[Case]) -> list[str]:
    """Answered cases that compare nothing: no beam on a side, or a score that is not a
    finite number (JSON ``NaN`` parses). A failure at any precision, gated or not."""
    out = []
    for c in cases:
        m = c.metrics
        if not m["ref_beams"] or not m["cand_beams"]:
            out.append(
                f"{case_label(c)}: no beams to compare ({m['ref_beams']} reference, "
                f"{m['cand_beams']} candidate)"
            )
        elif m["max_score_diff"] is not None and not math.isfinite(m["max_score_diff"]):
            out.append(f"{case_label(c)}: a beam score is not a finite number")
    return out


def evaluate(cases: list[Case], th: Thresholds) -> list[str]:
    """Failure messages (empty = pass). Nothing compared is a failure, never a pass: no case,
    a case with no beam on a side, a score that is not a finite number."""
    if not cases:
        return ["no case was compared (no prompt or no beam width ran)"]
    out = [f"{case_label(c)}: {c.error}" for c in cases if c.error]
    out += unusable([c for c in cases if not c.error])
    s = summarise(cases)
    if th.exact:
        out += [
            f"{case_label(c)}: ranked beams differ from rank {c.metrics['first_diff_rank']} "
            f"({c.metrics['ref_beams']} reference vs {c.metrics['cand_beams']} candidate beams)"
            for c in cases
            if not c.error and not c.metrics["exact"]
        ]
    if s["max_score_diff"] is not None and s["max_score_diff"] > th.max_score_diff:
        worst = max(
            (c for c in cases if not c.error and c.metrics["max_score_diff"] is not None),
            key=lambda c: c.metrics["max_score_diff"],
        )
        out.append(
            f"max |score diff| {s['max_score_diff']:.3g} > {th.max_score_diff:g} "
            f"(worst: {case_label(worst)})"
        )
    if s["top1_agreement"] is not None and s["top1_agreement"] < th.min_top1:
        out.append(f"top-1 agreement {s['top1_agreement']:.3f} < {th.min_top1:g}")
    if s["overlap_mean"] is not None and s["overlap_mean"] < th.min_overlap:
        out.append(f"mean beam-set overlap {s['overlap_mean']:.3f} < {th.min_overlap:g}")
    if (
        th.min_spearman is not None
        and s["spearman_min"] is not None
        and s["spearman_min"] < th.min_spearman
    ):
        out.append(f"min Spearman {s['spearman_min']:.3f} < {th.min_spearman:g}")
    return out


def case_label(c: Case) -> str:
    return f"prompt {c.prompt} n={c.n} ({c.protocol})"


def _fmt_beam(b: Beam | None, width: int = 34) -> tuple[str, str]:
    if b is None:
        return "-", ""
    ids = ",".join(map(str, b.token_ids)) if b.token_ids else b.text
    return (ids if len(ids) <= width else ids[: width - 1] + "…"), f"{b.score:+.6f}"


def diff_table(case: Case, max_rows: int = 12) -> str:
    """Rank-by-rank reference vs candidate beams; ``!`` marks a different beam, ``~`` a score
    difference above 1e-6 on the same beam. Shows the first differing ranks."""
    head = f"{case_label(case)}: " + ", ".join(
        f"{k}={case.metrics.get(k)}" for k in ("exact", "top1", "overlap", "max_score_diff")
    )
    lines = [
        head,
        f"  {'rank':>4}  {'reference':<34} {'score':>10}   {'candidate':<34} {'score':>10}",
    ]
    rows = max(len(case.ref), len(case.cand))
    start = max(0, (case.metrics.get("first_diff_rank") or 0) - 2)
    rk, ck = beam_keys(case.ref, case.cand)
    for i in range(start, min(rows, start + max_rows)):
        r = case.ref[i] if i < len(case.ref) else None
        c = case.cand[i] if i < len(case.cand) else None
        mark = " "
        if r is None or c is None or rk[i] != ck[i]:
            mark = "!"
        elif abs(r.score - c.score) > 1e-6:
            mark = "~"
        (ri, rsc), (ci, csc) = _fmt_beam(r), _fmt_beam(c)
        lines.append(f"{mark} {i:>4}  {ri:<34} {rsc:>10}   {ci:<34} {csc:>10}")
    if start + max_rows < rows:
        lines.append(f"  ... {rows - start - max_rows} more rank(s)")
    return "\n".join(lines)


def parity_result(
    cases: list[Case], th: Thresholds, precision: str, protocols: list[str], max_tables: int = 8
) -> dict[str, Any]:
    """The result dict (report.json ``parity``): status, summary, failures, per-case rows and
    the diff tables of the first failing cases."""
    failures = evaluate(cases, th)
    bad = [
        c
        for c in cases
        if not c.error
        and (not c.metrics["exact"] or not (c.metrics["max_score_diff"] or 0) <= th.max_score_diff)
    ]
    by_protocol = {p: summarise([c for c in cases if c.protocol == p]) for p in protocols}
    return {
        "status": "fail" if failures else "pass",
        "passed": not failures,
        "precision": precision,
        "thresholds": asdict(th),
        "protocols": protocols,
        "summary": summarise(cases),
        "by_protocol": by_protocol,
        "failures": failures,
        "diff_tables": [diff_table(c) for c in bad[:max_tables]],
        "cases": [c.row() for c in cases],
    }


def failure_text(result: dict) -> str:
    """Failures and diff tables as one readable block."""
    return "\n".join(result["failures"]) + "\n\n" + "\n\n".join(result["diff_tables"])
