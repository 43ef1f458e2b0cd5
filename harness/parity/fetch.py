"""Parity requests: beam requests in either protocol (chat | /generate), answer parsing,
protocol detection, the synthetic prompts, and the case loop over two servers."""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from harness.load.client import Request, chat_body, generate_body
from harness.load.workload import Prompt, PromptRenderer, load_tokenizer
from harness.parity.compare import Beam, Case, compare_beams
from harness.servers.launch import fetch_info

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


# what an upstream SGLang chat answer looks like to parse_beams: n samples, not beams
CHAT_NOT_BEAMS = (
    "chat choice without sglext.sequence_score: n samples, not beams (upstream SGLang's "
    "/v1/chat/completions has no beam search); use /generate (SGLANG_BEAM_PROTOCOL=generate)"
)


def parse_beams(protocol: str, data: Any) -> list[Beam]:
    """Beams (best first) of a chat or /generate response.

    chat: FlashRec's extension, ``choices[i].sglext`` = ``{sequence_score, token_ids}``.
    /generate: SGLang's beam answer, ``meta_info.beam_results[i]`` = ``{output_ids, text,
    meta_info: {sequence_score, ...}}`` (``token_ids``: FlashRec servers before output_ids).
    An answer without ``beam_results`` is SGLang's plain generation (``beam_width`` <= 1):
    one beam from the top-level ``output_ids``, scored by its mean token logprob (SGLang's
    beam score at length penalty 1) from ``meta_info.output_token_logprobs``.
    """
    if protocol == "chat":
        out = []
        for ch in data["choices"]:
            ext = ch.get("sglext") or {}
            score = ext.get("sequence_score")
            if score is None:
                raise ValueError(CHAT_NOT_BEAMS)
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
    meta = data.get("meta_info") or {}
    beams = meta.get("beam_results")
    if beams is None:
        return [_plain_beam(data)]
    return [
        Beam(
            _output_ids(b), float((b.get("meta_info") or {})["sequence_score"]), b.get("text") or ""
        )
        for b in beams
    ]


def _output_ids(beam: dict) -> tuple[int, ...]:
    ids = beam["output_ids"] if "output_ids" in beam else beam.get("token_ids")
    return tuple(ids or ())


def _plain_beam(data: dict) -> Beam:
    """The one sequence of a plain (not beam-search) SGLang /generate answer."""
    meta = data.get("meta_info") or {}
    ids = _output_ids(data)
    logprobs = meta.get("output_token_logprobs")
    if not ids or not logprobs:
        raise ValueError(
            "/generate answer without meta_info.beam_results and without "
            "output_token_logprobs (not a beam answer?)"
        )
    return Beam(ids, sum(float(lp[0]) for lp in logprobs) / len(ids), data.get("text") or "")


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
    """(path, JSON body) of a request in ``protocol`` (the harness client's bodies). At n = 1
    a /generate body also asks for token logprobs: SGLang answers ``beam_width`` 1 as a plain
    generation, scored only through them (it refuses ``return_logprob`` with beam search)."""
    if protocol == "chat":
        return "/v1/chat/completions", chat_body(req)
    body = generate_body(req)
    if req.n == 1:
        body["return_logprob"] = True
    return "/generate", body


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


async def detect_protocols(
    session: aiohttp.ClientSession, base_url: str, why: dict[str, str] | None = None
) -> list[str]:
    """The beam protocols a server speaks: ``SGLANG_BEAM_PROTOCOL`` if set, else its
    ``/get_server_info`` ``protocols``, else FlashRec's (both), else a probe of each: a
    protocol counts only when its answer holds scored beams (upstream SGLang's chat, n
    samples without ``sglext.sequence_score``, does not). ``why`` gets the reason each
    protocol left out was left out."""
    forced = os.environ.get(PROTOCOL_ENV, "").strip().lower()
    if forced:
        if forced not in PROTOCOLS:
            raise ValueError(f"{PROTOCOL_ENV}={forced!r}; expected one of {PROTOCOLS}")
        return [forced]
    info = await fetch_info(session, base_url)
    declared = info.get("protocols")
    if isinstance(declared, list):
        for p in PROTOCOLS:
            if p not in declared and why is not None:
                why[p] = f"{base_url}/get_server_info does not list {p!r} in 'protocols'"
        return [p for p in PROTOCOLS if p in declared]
    if "sid_layout" in info and "limits" in info:  # a FlashRec server
        return list(PROTOCOLS)
    found = []
    msgs = [{"role": "user", "content": "parity probe"}]
    probe = request_for(msgs, builtin_text(msgs), 2, 8)
    for protocol in PROTOCOLS:
        try:
            beams = await fetch_beams(session, base_url, protocol, probe, timeout_s=60)
        except FETCH_ERRORS as exc:
            if why is not None:
                why[protocol] = f"{base_url}: {type(exc).__name__}: {exc}"[:300]
            continue
        if len(beams) == probe.n:
            found.append(protocol)
        elif why is not None:
            why[protocol] = f"{base_url}: {len(beams)} beams for n={probe.n}"
    return found


def no_shared_protocol(why: dict[str, str]) -> str:
    """The message for two servers that share no beam protocol."""
    reasons = "; ".join(f"{p}: {r}" for p, r in why.items()) or "no reason recorded"
    return f"the reference and the candidate share no beam protocol ({reasons})"


def builtin_text(messages: list[dict]) -> str:
    """/generate text without a tokenizer: built-in ChatML + ``<|sid_begin|>``."""
    return PromptRenderer(None).render(messages)


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


def spec_prompts(spec: dict, model_path: str | None) -> list[ParityPrompt]:
    """:func:`make_prompts` from a ``parity:`` section's prompts, median_tokens, seed and
    system_prompt_tokens (the stage's defaults where absent)."""
    return make_prompts(
        int(spec.get("prompts", 8)),
        int(spec.get("median_tokens", 96)),
        int(spec.get("seed", 0)),
        int(spec.get("system_prompt_tokens", 32)),
        model_path,
    )


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


async def default_max_tokens(session: aiohttp.ClientSession, *base_urls: str) -> int:
    """SID depth + 1 (the end token) from the first server whose info says; else 4."""
    for url in base_urls:
        info = await fetch_info(session, url)
        depth = info.get("depth") or ((info.get("engine") or {}).get("catalog") or {}).get("depth")
        if depth:
            return int(depth) + 1
    return 4


CaseKey = tuple[str, int, int]  # (protocol, prompt index, n)


class CaseProgress:
    """Called once per finished case of one server (any arguments ignored): a line
    ``parity: LABEL: done/total cases ... ~S s left`` at most every ``every_s`` seconds and at
    the last case (an fp32 reference at n=256 takes minutes; the stage would otherwise say
    nothing until it ends)."""

    def __init__(self, label: str, total: int, log: Any, every_s: float = 10.0, clock=None):
        self.label, self.total, self.log, self.every_s = label, total, log, every_s
        self.clock = clock or time.monotonic
        self.t0 = self.last = self.clock()
        self.done = 0

    def __call__(self, *_: Any) -> None:
        self.done += 1
        done, now = self.done, self.clock()
        if done < self.total and now - self.last < self.every_s:
            return
        self.last = now
        per = (now - self.t0) / max(done, 1)
        self.log(
            f"parity: {self.label}: {done}/{self.total} cases, {per:.1f} s per case, "
            f"~{per * (self.total - done):.0f} s left"
        )


async def fetch_all(
    session: aiohttp.ClientSession,
    base_url: str,
    prompts: list[ParityPrompt],
    ns: list[int],
    protocols: list[str],
    max_tokens: int = 4,
    timeout_s: float = 300.0,
    on_done: Any = None,
) -> dict[CaseKey, list[Beam] | str]:
    """One server's beams for every (protocol, prompt, n), one request at a time; a failed
    request's entry is its error text. ``on_done()`` after each (see :class:`CaseProgress`)."""
    out: dict[CaseKey, list[Beam] | str] = {}
    for protocol in protocols:
        for p in prompts:
            for n in ns:
                req = request_for(p.messages, p.text, n, max_tokens, p.index)
                try:
                    out[(protocol, p.index, n)] = await fetch_beams(
                        session, base_url, protocol, req, timeout_s
                    )
                except FETCH_ERRORS as exc:
                    out[(protocol, p.index, n)] = f"{type(exc).__name__}: {exc}"[:300]
                if on_done:
                    on_done()
    return out


def cases_from(
    ref: dict[CaseKey, list[Beam] | str], cand: dict[CaseKey, list[Beam] | str]
) -> list[Case]:
    """Cases of the keys both sides were asked (reference order); a side's error is the case's."""
    cases = []
    for key, r in ref.items():
        if key not in cand:
            continue
        c = cand[key]
        case = Case(*key)
        if isinstance(r, str):
            case.error = f"reference: {r}"
        elif isinstance(c, str):
            case.error = c
        else:
            case.ref, case.cand = r, c
            case.metrics = compare_beams(r, c)
        cases.append(case)
    return cases
