"""One request function per protocol; one :class:`Record` per request.

Times are seconds on one monotonic clock (:func:`now`, zero at import); ``EPOCH_UNIX`` is the
wall-clock time of that zero. Records hold what the request did, never derived statistics.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from harness.load.sids import SidChecker, quality
from harness.load.workload import Prompt

_T0 = time.perf_counter()
EPOCH_UNIX = time.time()


def now() -> float:
    """Seconds since the harness started (monotonic)."""
    return time.perf_counter() - _T0


@dataclass(frozen=True)
class Request:
    """What to send: the prompt (messages, or rendered text for /generate) and sampling."""

    prompt: Prompt
    n: int
    max_tokens: int
    temperature: float
    text: str | None = None
    seed: int | None = None
    model: str = "default"
    catalog: str | None = None  # a named catalog of the server (None: its default)


@dataclass
class Record:
    """One request: when it was sent and finished, how it ended, what came back."""

    cell: str
    round: int
    phase: str  # warmup | prime | measure | trace
    index: int
    prompt: int
    t_send: float
    t_end: float = 0.0
    t_first_byte: float | None = None
    status: str = "ok"  # ok | http_error | timeout | error
    http_status: int | None = None
    beams: int = 0
    invalid: int = 0
    duplicates: int = 0
    # whether ``invalid`` was checked against a catalog (False: the harness had none, so
    # ``invalid`` counts only beams that are no SID at all and invalid_rate is not measured)
    sids_checked: bool = False
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    top1: str = ""
    error: str = ""
    excluded: str = ""
    quality: dict[str, float] = field(default_factory=dict)
    # the server's own phases in ms, from its ``Server-Timing`` header (FlashRec: tokenize,
    # queue, engine); empty when the server sends none
    server_ms: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def latency(self) -> float:
        return self.t_end - self.t_send

    def row(self) -> dict[str, Any]:
        """A flat dict (quality metrics as their own columns) for CSV / parquet."""
        d = asdict(self)
        d.update(d.pop("quality"))
        d.update({f"server_{k}_ms": v for k, v in d.pop("server_ms").items()})
        d["latency_s"] = self.latency
        return d


def chat_body(req: Request) -> dict:
    """The OpenAI chat-completions body (``n`` = beam width)."""
    body = {
        "model": req.model,
        "messages": req.prompt.messages,
        "n": req.n,
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
    }
    if req.seed is not None:
        body["seed"] = req.seed
    if req.catalog is not None:  # ours (FlashRec): which named catalog constrains the beams
        body["catalog"] = req.catalog
    return body


def generate_body(req: Request) -> dict:
    """The SGLang ``/generate`` beam body (the text already has the template and sid_begin):
    only ``sampling_params`` keys upstream SGLang accepts (it rejects unknown ones with a
    400): ``beam_width`` beams searched, all ``n`` of them returned. ``beam_width`` 1 is a
    plain greedy generation upstream (one sequence, no ``beam_results``)."""
    params: dict[str, Any] = {
        "beam_width": req.n,
        "n": req.n,
        "max_new_tokens": req.max_tokens,
        "temperature": req.temperature,
    }
    if req.seed is not None:
        params["sampling_seed"] = req.seed
    if req.catalog is not None:  # ours (FlashRec); upstream SGLang would refuse the key
        params["catalog"] = req.catalog
    return {"text": req.text, "sampling_params": params}


def parse_chat(data: dict) -> tuple[list[str], dict]:
    """Beam texts (best first) and token usage of a chat response."""
    texts = [c["message"]["content"] or "" for c in data["choices"]]
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return texts, {
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": details.get("cached_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
    }


def parse_generate(data: Any) -> tuple[list[str], dict]:
    """Beam texts (best first) and token counts of a ``/generate`` response: SGLang's beam
    answer (``meta_info.beam_results[i].text``, the counts in the top-level ``meta_info``),
    or a plain generation's top-level ``text``."""
    if isinstance(data, list):
        data = data[0]
    meta = data.get("meta_info") or {}
    beams = meta.get("beam_results")
    texts = [b.get("text") or "" for b in beams] if beams is not None else [data.get("text", "")]
    return texts, {
        "prompt_tokens": meta.get("prompt_tokens"),
        "cached_tokens": meta.get("cached_tokens"),
        "completion_tokens": meta.get("completion_tokens"),
    }


PROTOCOLS = {
    "chat": ("/v1/chat/completions", chat_body, parse_chat),
    "generate": ("/generate", generate_body, parse_generate),
}


def parse_server_timing(header: str) -> dict[str, float]:
    """``Server-Timing`` (W3C) -> ``{name: dur}``: ``"queue;dur=1.5, engine;dur=28"`` ->
    ``{"queue": 1.5, "engine": 28.0}``; metrics without a numeric ``dur`` are left out."""
    out: dict[str, float] = {}
    for metric in header.split(","):
        name, *params = (p.strip() for p in metric.split(";"))
        for p in params:
            key, _, value = p.partition("=")
            if name and key.strip().lower() == "dur":
                try:
                    out[name] = float(value.strip().strip('"'))
                except ValueError:
                    pass
    return out


@dataclass
class Pending:
    """Response bodies read during a load, parsed and checked after it.

    Parsing a wide-beam answer and checking its SIDs takes the client a few ms of JSON and set
    look-ups. Done inline, that time delays every other in-flight
    request's read (its ``t_end``) and the next send of a closed loop: the client, not the
    server, would set the pace at wide beams. ``send`` therefore only reads the body and
    stamps ``t_end``; the load calls :meth:`finish` once it has sent everything. Bodies held
    past ``limit_bytes`` are finished at once (nothing is dropped; memory stays bounded)."""

    protocol: str
    checker: SidChecker
    ks: list[int]
    limit_bytes: int = 64 << 20
    items: list[tuple[Record, Request, bytes]] = field(default_factory=list)
    held_bytes: int = 0

    def add(self, record: Record, req: Request, raw: bytes) -> None:
        self.items.append((record, req, raw))
        self.held_bytes += len(raw)
        if self.held_bytes > self.limit_bytes:
            self.finish()

    def finish(self) -> None:
        """Parse and check every held body into its record."""
        items, self.items, self.held_bytes = self.items, [], 0
        for record, req, raw in items:
            fill_record(record, req, raw, self.protocol, self.checker, self.ks)


def fill_record(
    record: Record, req: Request, raw: bytes, protocol: str, checker: SidChecker, ks: list[int]
) -> Record:
    """Parse a 200 answer's body into ``record``: beams, SID validity, usage, quality."""
    parse = PROTOCOLS[protocol][2]
    try:
        texts, usage = parse(json.loads(raw))
    except (ValueError, KeyError, TypeError) as exc:
        record.status, record.error = "error", f"{type(exc).__name__}: {exc}"[:300]
        return record
    check = checker.check(texts)
    if not check.beams:  # an answer without a beam recommends nothing: never a success
        record.status, record.error = "error", "a 200 answer with no beams"
        return record
    record.beams, record.invalid, record.duplicates = check.beams, check.invalid, check.duplicates
    record.sids_checked = checker.catalog is not None
    record.top1 = check.top1
    record.prompt_tokens = usage["prompt_tokens"]
    record.cached_tokens = usage["cached_tokens"]
    record.completion_tokens = usage["completion_tokens"]
    if req.prompt.truth:
        record.quality = quality(check.ranked, req.prompt.truth, ks)
    return record


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    protocol: str,
    req: Request,
    record: Record,
    checker: SidChecker,
    timeout_s: float,
    ks: list[int],
    pending: Pending | None = None,
) -> Record:
    """Send one request and fill ``record`` (never raises for request failures). With
    ``pending``, a 200 body is parsed later, by ``pending.finish()``."""
    path, make_body, _ = PROTOCOLS[protocol]
    record.t_send = now()
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.post(base_url + path, json=make_body(req), timeout=timeout) as resp:
            record.t_first_byte = now()
            record.http_status = resp.status
            record.server_ms = parse_server_timing(resp.headers.get("Server-Timing", ""))
            raw = await resp.read()
        record.t_end = now()
    except asyncio.TimeoutError:
        record.t_end = now()
        record.status, record.error = "timeout", f"no response within {timeout_s:g} s"
        return record
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        record.t_end = now()
        record.status, record.error = "error", f"{type(exc).__name__}: {exc}"[:300]
        return record
    if resp.status != 200:
        record.status = "http_error"
        record.error = raw[:300].decode(errors="replace")
        return record
    if pending is not None:
        pending.add(record, req, raw)
        return record
    return fill_record(record, req, raw, protocol, checker, ks)


async def post_json(
    session: aiohttp.ClientSession, url: str, body: dict | None = None, timeout_s: float = 30.0
) -> tuple[int, Any]:
    """POST a control request; returns (status, parsed body or text). Status 0: unreachable."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.post(url, json=body or {}, timeout=timeout) as r:
            raw = await r.read()
            try:
                return r.status, json.loads(raw)
            except ValueError:
                return r.status, raw.decode(errors="replace")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        return 0, str(exc)
