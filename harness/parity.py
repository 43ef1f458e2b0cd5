"""Parity: the beams of a candidate server against a reference, per prompt, n and protocol.

    reference URL ─┐                       ┌─ exact ranked match, top-1 agreement,
                   ├─ same prompts, n ─────┤  beam-set overlap, Spearman on shared beams,
    candidate URL ─┘  (chat | /generate)   └─ max |score diff| on shared beams -> thresholds

Protocol-agnostic: each server's protocols come from ``/get_server_info`` (``protocols``) or a
probe; ``SGLANG_BEAM_PROTOCOL=chat|generate`` forces one. Beams are identified by their token
ids (``sglext.token_ids`` / ``beam_results[i].token_ids``), or by their text when a server
returns no ids. Thresholds depend on the precision (:data:`THRESHOLDS`); a failure carries a
per-prompt diff table (:func:`diff_table`). :func:`run_parity_stage` is the matrix stage.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from harness.client import Request, chat_body, generate_body
from harness.server import fetch_info
from harness.workload import Prompt, PromptRenderer, load_tokenizer

PROTOCOLS = ("chat", "generate")
PROTOCOL_ENV = "SGLANG_BEAM_PROTOCOL"
# what a failed or malformed beam request raises (a case error, never a crash)
FETCH_ERRORS = (
    aiohttp.ClientError,
    asyncio.TimeoutError,
    RuntimeError,
    ValueError,
    KeyError,
    TypeError,
)


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
# from recorded H200 runs (docs/baselines.md); a stage's ``thresholds:`` overrides any field.
THRESHOLDS: dict[str, Thresholds] = {
    "float32": Thresholds(exact=True, max_score_diff=1e-4, min_top1=1.0, min_overlap=1.0),
    "bfloat16": Thresholds(
        exact=False, max_score_diff=0.1, min_top1=0.9, min_overlap=0.8, min_spearman=0.5
    ),
    "fp8": Thresholds(exact=False, max_score_diff=0.3, min_top1=0.75, min_overlap=0.6),
}
_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp8_e4m3": "fp8"}


# server flags a launched pair gets for a precision (explicit stage args override them)
PRECISION_ARGS: dict[str, tuple[dict, dict]] = {  # name -> (FlashRec, HF reference)
    "float32": ({"dtype": "float32", "quantization": "none"}, {"dtype": "float32"}),
    "bfloat16": ({"dtype": "bfloat16", "quantization": "none"}, {"dtype": "bfloat16"}),
    "fp8": ({"dtype": "bfloat16", "quantization": "fp8"}, {"dtype": "bfloat16"}),
}


def precision_args(precision: str) -> tuple[dict, dict]:
    """(FlashRec flags, reference flags) that run a launched pair at ``precision``."""
    cand, ref = PRECISION_ARGS[_ALIASES.get(precision, precision)]
    return dict(cand), dict(ref)


def thresholds_for(precision: str, overrides: dict | None = None) -> Thresholds:
    """The thresholds of ``precision`` (float32 | bfloat16 | fp8) with ``overrides`` applied."""
    name = _ALIASES.get(precision, precision)
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


def compare_beams(ref: list[Beam], cand: list[Beam]) -> dict[str, Any]:
    """Metrics of one case (reference beams vs candidate beams, both best first)."""
    rk, ck = [b.key for b in ref], [b.key for b in cand]
    shared = set(rk) & set(ck)
    rs, cs = {b.key: b.score for b in ref}, {b.key: b.score for b in cand}
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
        "max_score_diff": max(diffs) if diffs else None,
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
        "spearman_min": min(sp, default=None),
        "max_score_diff": max(diffs, default=None),
    }


def evaluate(cases: list[Case], th: Thresholds) -> list[str]:
    """Failure messages (empty = pass)."""
    out = [f"{_label(c)}: {c.error}" for c in cases if c.error]
    s = summarise(cases)
    if th.exact:
        out += [
            f"{_label(c)}: ranked beams differ from rank {c.metrics['first_diff_rank']} "
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
            f"(worst: {_label(worst)})"
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


def _label(c: Case) -> str:
    return f"prompt {c.prompt} n={c.n} ({c.protocol})"


def _fmt_beam(b: Beam | None, width: int = 34) -> tuple[str, str]:
    if b is None:
        return "-", ""
    ids = ",".join(map(str, b.token_ids)) if b.token_ids else b.text
    return (ids if len(ids) <= width else ids[: width - 1] + "…"), f"{b.score:+.6f}"


def diff_table(case: Case, max_rows: int = 12) -> str:
    """Rank-by-rank reference vs candidate beams; ``!`` marks a different beam, ``~`` a score
    difference above 1e-6 on the same beam. Shows the first differing ranks."""
    head = f"{_label(case)}: " + ", ".join(
        f"{k}={case.metrics.get(k)}" for k in ("exact", "top1", "overlap", "max_score_diff")
    )
    lines = [
        head,
        f"  {'rank':>4}  {'reference':<34} {'score':>10}   {'candidate':<34} {'score':>10}",
    ]
    rows = max(len(case.ref), len(case.cand))
    start = max(0, (case.metrics.get("first_diff_rank") or 0) - 2)
    for i in range(start, min(rows, start + max_rows)):
        r = case.ref[i] if i < len(case.ref) else None
        c = case.cand[i] if i < len(case.cand) else None
        mark = " "
        if r is None or c is None or r.key != c.key:
            mark = "!"
        elif abs(r.score - c.score) > 1e-6:
            mark = "~"
        (ri, rsc), (ci, csc) = _fmt_beam(r), _fmt_beam(c)
        lines.append(f"{mark} {i:>4}  {ri:<34} {rsc:>10}   {ci:<34} {csc:>10}")
    if start + max_rows < rows:
        lines.append(f"  ... {rows - start - max_rows} more rank(s)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- fetching


def parse_beams(protocol: str, data: Any) -> list[Beam]:
    """Beams (best first) of a chat or /generate response."""
    if protocol == "chat":
        out = []
        for ch in data["choices"]:
            ext = ch.get("sglext") or {}
            score = ext.get("sequence_score")
            if score is None:
                raise ValueError("chat choice without sglext.sequence_score (not a beam server?)")
            out.append(
                Beam(
                    tuple(ext.get("token_ids") or ()),
                    float(score),
                    (ch.get("message") or {}).get("content") or "",
                )
            )
        return out
    if isinstance(data, list):
        data = data[0]
    beams = (data.get("meta_info") or {}).get("beam_results")
    if beams is None:
        raise ValueError("/generate answer without meta_info.beam_results (not a beam server?)")
    return [
        Beam(
            tuple(b.get("token_ids") or ()),
            float((b.get("meta_info") or {})["sequence_score"]),
            b.get("text") or "",
        )
        for b in beams
    ]


async def post(session: aiohttp.ClientSession, url: str, body: dict, timeout_s: float) -> Any:
    """POST JSON; the parsed answer, or RuntimeError with the status and body head."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with session.post(url, json=body, timeout=timeout) as r:
        raw = await r.read()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status} from {url}: {raw[:300].decode(errors='replace')}")
    return json.loads(raw)


def request_for(
    messages: list[dict], text: str | None, n: int, max_tokens: int, index: int = 0
) -> Request:
    """A temperature-0 harness request."""
    return Request(Prompt(index, messages), n, max_tokens, 0.0, text=text)


def body_for(protocol: str, req: Request) -> tuple[str, dict]:
    """(path, JSON body) of a request in ``protocol`` (the harness client's bodies)."""
    return (
        ("/v1/chat/completions", chat_body(req))
        if protocol == "chat"
        else ("/generate", generate_body(req))
    )


async def fetch_beams(
    session: aiohttp.ClientSession,
    base_url: str,
    protocol: str,
    req: Request,
    timeout_s: float = 300.0,
) -> list[Beam]:
    """Send one request and parse its beams."""
    path, body = body_for(protocol, req)
    return parse_beams(protocol, await post(session, base_url.rstrip("/") + path, body, timeout_s))


async def detect_protocols(session: aiohttp.ClientSession, base_url: str) -> list[str]:
    """The beam protocols a server speaks: ``SGLANG_BEAM_PROTOCOL`` if set, else its
    ``/get_server_info`` ``protocols``, else FlashRec's (both), else a probe of each."""
    forced = os.environ.get(PROTOCOL_ENV, "").strip().lower()
    if forced:
        if forced not in PROTOCOLS:
            raise ValueError(f"{PROTOCOL_ENV}={forced!r}; expected one of {PROTOCOLS}")
        return [forced]
    info = await fetch_info(session, base_url)
    declared = info.get("protocols")
    if isinstance(declared, list):
        return [p for p in PROTOCOLS if p in declared]
    if "sid_layout" in info and "limits" in info:  # a FlashRec server
        return list(PROTOCOLS)
    found = []
    msgs = [{"role": "user", "content": "parity probe"}]
    probe = request_for(msgs, builtin_text(msgs), 2, 8)
    for protocol in PROTOCOLS:
        try:
            if await fetch_beams(session, base_url, protocol, probe, timeout_s=60):
                found.append(protocol)
        except FETCH_ERRORS:
            continue
    return found


def builtin_text(messages: list[dict]) -> str:
    """/generate text without a tokenizer: built-in ChatML + ``<|sid_begin|>``."""
    return PromptRenderer(None).render(messages)


# --------------------------------------------------------------------------- running


@dataclass(frozen=True)
class ParityPrompt:
    """A prompt in both forms: chat messages and /generate text."""

    index: int
    messages: list[dict]
    text: str


def make_prompts(
    num: int = 8,
    median_tokens: int = 96,
    seed: int = 0,
    system_prompt_tokens: int = 32,
    model_path: str | None = None,
) -> list[ParityPrompt]:
    """Synthetic chat prompts (``flashrec.synth``); /generate text rendered with the model's
    tokenizer when ``model_path`` is given (else built-in ChatML)."""
    from flashrec.synth import synth_prompts

    tok = load_tokenizer(model_path) if model_path else None
    chats = synth_prompts(
        num,
        median_tokens=median_tokens,
        spread=0.5,
        seed=seed,
        system_prompt_tokens=system_prompt_tokens,
        tokenizer=tok,
    )
    render = PromptRenderer(tok)
    return [ParityPrompt(i, m, render.render(m)) for i, m in enumerate(chats)]


async def compare_servers(
    session: aiohttp.ClientSession,
    ref_url: str,
    cand_url: str,
    prompts: list[ParityPrompt],
    ns: list[int],
    protocols: list[str],
    max_tokens: int = 4,
    timeout_s: float = 300.0,
    on_case: Any = None,
) -> list[Case]:
    """Every (protocol, prompt, n) case; both servers are asked at the same time."""
    cases = []
    for protocol in protocols:
        for p in prompts:
            for n in ns:
                req = request_for(p.messages, p.text, n, max_tokens, p.index)
                case = Case(protocol, p.index, n)
                try:
                    case.ref, case.cand = await asyncio.gather(
                        fetch_beams(session, ref_url, protocol, req, timeout_s),
                        fetch_beams(session, cand_url, protocol, req, timeout_s),
                    )
                    case.metrics = compare_beams(case.ref, case.cand)
                except FETCH_ERRORS as exc:
                    case.error = f"{type(exc).__name__}: {exc}"[:300]
                cases.append(case)
                if on_case:
                    on_case(case)
    return cases


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
        and (not c.metrics["exact"] or (c.metrics["max_score_diff"] or 0) > th.max_score_diff)
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


# --------------------------------------------------------------------------- servers


def _engines(device: str | None) -> dict[str, Any]:
    from harness.spec import EngineSpec

    return {
        "reference": EngineSpec(
            name="hf-reference",
            kind="command",
            command=["python", "-m", "harness.reference_server"],
            device=device,
            startup_timeout_s=600,
        ),
        "candidate": EngineSpec(
            name="flashrec", kind="flashrec", device=device, startup_timeout_s=600
        ),
    }


async def _wait_all(servers: list) -> None:
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(s.wait_healthy(session) for s in servers))
        for s in servers:
            s.info = await fetch_info(session, s.base_url)


@contextlib.contextmanager
def serving(
    model_path: str | None,
    catalog: str | None,
    log_dir: str | Path,
    reference_url: str | None = None,
    candidate_url: str | None = None,
    device: str | None = None,
    server_args: dict | None = None,
    reference_args: dict | None = None,
) -> Iterator[dict[str, str]]:
    """``{"reference": URL, "candidate": URL}``: the given URLs, else an HF reference server
    and a FlashRec server launched side by side on ``model_path`` (ephemeral ports on
    127.0.0.1, process groups stopped on exit, logs in ``log_dir``)."""
    from harness.model import ResolvedModel
    from harness.server import LaunchedServer

    urls = {"reference": reference_url, "candidate": candidate_url}
    model = ResolvedModel(model_path, catalog, "-", "path", 0) if model_path else None
    args = {"reference": dict(reference_args or {}), "candidate": dict(server_args or {})}
    engines = _engines(device)
    launched: list[LaunchedServer] = []
    try:
        for role in ("reference", "candidate"):
            if urls[role]:
                continue
            if model is None:
                raise ValueError(f"parity: no {role} URL and no model path to launch one on")
            srv = LaunchedServer(engines[role], args[role], model, Path(log_dir) / f"{role}.log")
            launched.append(srv)
            srv.launch()
            urls[role] = srv.base_url
        if launched:
            asyncio.run(_wait_all(launched))
        yield {k: str(v) for k, v in urls.items()}
    finally:
        for srv in launched:
            srv.stop()


# --------------------------------------------------------------------------- matrix stage


async def _compare_stage(spec: dict, urls: dict[str, str], model_path: str | None) -> dict:
    async with aiohttp.ClientSession() as session:
        protocols = spec.get("protocols") or "auto"
        if protocols == "auto":
            a = await detect_protocols(session, urls["reference"])
            b = await detect_protocols(session, urls["candidate"])
            protocols = [p for p in a if p in b]
        if not protocols:
            raise ValueError("the reference and the candidate share no beam protocol")
        max_tokens = spec.get("max_tokens") or await default_max_tokens(
            session, urls["candidate"], urls["reference"]
        )
        prompts = make_prompts(
            int(spec.get("prompts", 8)),
            int(spec.get("median_tokens", 96)),
            int(spec.get("seed", 0)),
            int(spec.get("system_prompt_tokens", 32)),
            model_path,
        )
        cases = await compare_servers(
            session,
            urls["reference"],
            urls["candidate"],
            prompts,
            [int(n) for n in spec.get("ns", [1, 4, 16, 64])],
            list(protocols),
            int(max_tokens),
            float(spec.get("timeout_s", 300.0)),
        )
    precision = str(spec.get("precision", "float32"))
    th = thresholds_for(precision, spec.get("thresholds"))
    return parity_result(cases, th, precision, list(protocols))


async def default_max_tokens(session: aiohttp.ClientSession, *base_urls: str) -> int:
    """SID depth + 1 (the end token) from the first server whose info says; else 4."""
    for url in base_urls:
        info = await fetch_info(session, url)
        depth = info.get("depth") or ((info.get("engine") or {}).get("catalog") or {}).get("depth")
        if depth:
            return int(depth) + 1
    return 4


def run_parity_stage(
    spec: dict,
    model_path: str | None = None,
    sid_vocab_file: str | None = None,
    out_dir: str | Path = "parity",
    log: Any = print,
) -> dict:
    """The ``parity:`` matrix stage.

    ``spec`` keys (all optional): ``reference_url`` / ``candidate_url`` (else an HF reference
    server and a FlashRec server are launched on ``model_path``), ``server_args`` (FlashRec
    flags), ``reference_args`` (reference-server flags: ``dtype``, ``logprob_scope``, ...),
    ``device``, ``ns`` ([1, 4, 16, 64]), ``prompts`` (8), ``median_tokens``,
    ``system_prompt_tokens``, ``seed``, ``protocols`` ("auto" or a list), ``max_tokens``
    (SID depth + 1), ``precision`` (float32 | bfloat16 | fp8: the thresholds, and the
    launched servers' dtype / quantization flags, :data:`PRECISION_ARGS`), ``thresholds``
    (field overrides of :class:`Thresholds`). Returns the :func:`parity_result` dict (``status``
    "error" with ``error`` when the stage could not run), also written to
    ``out_dir/parity.json``.
    """
    out = Path(out_dir)
    t0 = time.monotonic()
    try:
        cand_args, ref_args = precision_args(str(spec.get("precision", "float32")))
        with serving(
            model_path,
            sid_vocab_file,
            out / "servers",
            spec.get("reference_url"),
            spec.get("candidate_url"),
            spec.get("device"),
            {**cand_args, **(spec.get("server_args") or {})},
            {**ref_args, **(spec.get("reference_args") or {})},
        ) as urls:
            result = asyncio.run(_compare_stage(spec, urls, model_path))
            result["servers"] = urls
    except Exception as exc:  # noqa: BLE001 - a stage reports, it does not abort the report
        result = {"status": "error", "passed": False, "error": f"{type(exc).__name__}: {exc}"}
        if getattr(exc, "log_tail", ""):
            result["log_tail"] = exc.log_tail
    result["duration_s"] = round(time.monotonic() - t0, 2)
    out.mkdir(parents=True, exist_ok=True)
    (out / "parity.json").write_text(json.dumps(result, indent=1, default=str))
    if result["status"] == "fail":
        log(failure_text(result))
    return result


def engine_device(ctx: Any) -> str | None:
    """The matrix's first engine's device (the stage's default)."""
    engines = getattr(getattr(ctx, "spec", None), "engine_list", None) or []
    return engines[0].device if engines else None


def compact(result: dict, tables: int = 3) -> dict:
    """The result for report.json: without per-case rows, at most ``tables`` diff tables
    (the full result stays in ``parity.json``)."""
    out = {k: v for k, v in result.items() if k != "cases"}
    if "diff_tables" in out:
        out["diff_tables"] = out["diff_tables"][:tables]
    return out


def run_stage(section: Any, ctx: Any) -> dict:
    """Runner adapter (``harness.runner.STAGES``): the ``parity:`` section + StageContext;
    returns :func:`compact` of the result with ``details`` naming the full ``parity.json``."""
    spec = section.model_dump() if hasattr(section, "model_dump") else dict(section)
    spec.pop("enabled", None)
    spec.setdefault("device", engine_device(ctx))
    model = ctx.model
    out = Path(ctx.out_dir) / "parity"
    result = run_parity_stage(
        spec, model.path if model else None, model.catalog if model else None, out
    )
    return {**compact(result), "details": str(out / "parity.json")}
