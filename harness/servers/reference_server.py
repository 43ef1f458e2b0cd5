"""HF reference server: :class:`harness.servers.hf_reference.HFReference` behind FlashRec's two wire
protocols, so parity can run where no SGLang server exists.

Routes::

    GET  /health                 200 {"status": "ok"} once the model is loaded
    GET  /get_server_info        {"engine": "hf-reference", "protocols": [...], ...}
    GET  /v1/models
    POST /v1/chat/completions    OpenAI shape; choices best first with sglext.sequence_score
    POST /generate               SGLang beam shape; meta_info.beam_results best first

Only deterministic beam search is served: ``temperature`` must be 0 (or absent). Requests are
answered one at a time on a worker thread (HF ``generate`` is not re-entrant). Its flags and
``flashrec-bench reference-server`` (``python -m harness reference-server``) are
:mod:`harness.cli.reference_server`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import signal
import sys
import time
import uuid
from typing import Any

from aiohttp import web

ENGINE_NAME = "hf-reference"
URL_LINE = "HF reference serving on http://{host}:{port}"
DTYPES = ("float32", "bfloat16", "float16")
_log = logging.getLogger(__name__)


class RequestError(ValueError):
    """A client error: becomes a 400 with an OpenAI-shaped error body."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def error_response(message: str, status: int, param: str | None = None) -> web.Response:
    """An OpenAI-shaped error body."""
    kind = "invalid_request_error" if status < 500 else "internal_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.json_response(body, status=status)


# --------------------------------------------------------------------------- request parsing


def _int(body: dict, keys: tuple[str, ...], default: int, lo: int = 1) -> int:
    for key in keys:
        v = body.get(key)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise RequestError(f"'{key}' must be an integer >= {lo}", key)
        return v
    return default


def _check_temperature(body: dict) -> None:
    t = body.get("temperature")
    if t not in (None, 0, 0.0):
        raise RequestError(
            "the HF reference serves deterministic beam search only: 'temperature' must be 0",
            "temperature",
        )


def beam_dicts(ref: Any, beams: list) -> list[dict]:
    """RefBeams -> plain dicts with the finish reason (best first, as HF ranked them)."""
    end = ref.layout.sid_end
    return [
        {
            "token_ids": list(b.token_ids),
            "sequence_score": float(b.sequence_score),
            "text": b.text,
            "finish_reason": "stop" if b.token_ids and b.token_ids[-1] == end else "length",
        }
        for b in beams
    ]


def chat_response(rid: str, model: str, beams: list[dict], prompt_tokens: int) -> dict:
    """The ``chat.completion`` body: one choice per beam, best first."""
    completion = sum(len(b["token_ids"]) for b in beams)
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": b["text"]},
                "logprobs": None,
                "finish_reason": b["finish_reason"],
                "sglext": {"sequence_score": b["sequence_score"], "token_ids": b["token_ids"]},
            }
            for i, b in enumerate(beams)
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        },
    }


def _finish(b: dict) -> dict:
    """SGLang's finish-reason object of a beam."""
    if b["finish_reason"] == "stop":
        return {"type": "stop", "matched": b["token_ids"][-1]}
    return {"type": "length", "length": len(b["token_ids"])}


def generate_response(rid: str, beams: list[dict], prompt_tokens: int, latency: float) -> dict:
    """SGLang's beam-search ``/generate`` answer for one prompt: the best beam at the top
    level, every beam (``output_ids``, ``text``, ``meta_info``) in ``meta_info.beam_results``;
    the best beam's meta_info also holds the request's keys, as upstream."""
    request_meta = {
        "id": rid,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": sum(len(b["token_ids"]) for b in beams),
        "e2e_latency": latency,
    }
    results = [
        {
            "output_ids": b["token_ids"],
            "text": b["text"],
            "meta_info": {
                **(request_meta if i == 0 else {}),
                "finish_reason": _finish(b),
                "sequence_score": b["sequence_score"],
            },
        }
        for i, b in enumerate(beams)
    ]
    best = results[0] if results else {"output_ids": [], "text": "", "meta_info": request_meta}
    return {
        "text": best["text"],
        "output_ids": best["output_ids"],
        "meta_info": {**best["meta_info"], "beam_results": results},
    }


# --------------------------------------------------------------------------- application


class ReferenceApp:
    """Handlers over one loaded :class:`HFReference` (``ref``); ``info`` describes it."""

    def __init__(self, ref: Any, info: dict, model_name: str = "hf-reference") -> None:
        self.ref, self.info, self.model_name = ref, info, model_name
        self.lock = asyncio.Lock()

    async def _run(self, ids: list[int], n: int, max_tokens: int) -> list[dict]:
        async with self.lock:
            beams = await asyncio.to_thread(self.ref.generate, ids, n, max_tokens)
        return beam_dicts(self.ref, beams)

    def _prompt(self, **kwargs: Any) -> list[int]:
        try:
            return self.ref.build_prompt(**kwargs)
        except (ValueError, TypeError) as exc:
            raise RequestError(f"cannot build the prompt: {exc}") from None

    async def chat(self, request: web.Request) -> web.Response:
        body = await _json(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("'messages' must be a non-empty array", "messages")
        _check_temperature(body)
        n = _int(body, ("n",), 1)
        max_tokens = _int(body, ("max_completion_tokens", "max_tokens"), self.ref.depth + 1)
        kwargs = body.get("chat_template_kwargs") or None
        ids = self._prompt(messages=messages, chat_template_kwargs=kwargs)
        beams = await self._run(ids, n, max_tokens)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        return web.json_response(
            chat_response(rid, body.get("model") or self.model_name, beams, len(ids))
        )

    async def generate(self, request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        body = await _json(request)
        sp = body.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise RequestError("'sampling_params' must be an object", "sampling_params")
        _check_temperature(sp)
        # SGLang: beam_width beams searched, the best n (default 1) returned; n alone: width n
        n = _int(sp, ("beam_width", "n"), 1)
        keep = _int(sp, ("n",), 1) if sp.get("beam_width") is not None else n
        if keep > n:
            raise RequestError(
                f"'n' ({keep}) cannot exceed 'beam_width' ({n})", "sampling_params.n"
            )
        max_tokens = _int(sp, ("max_new_tokens",), self.ref.depth + 1)
        text, ids = body.get("text"), body.get("input_ids")
        if (text is None) == (ids is None):
            raise RequestError("exactly one of 'text' and 'input_ids' is required", "text")
        batched = isinstance(text, list) or (
            isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        )
        if text is not None:
            prompts = [self._prompt(text=t) for t in (text if batched else [text])]
        else:
            prompts = [self._prompt(input_ids=x) for x in (ids if batched else [ids])]
        outs = []
        for p in prompts:
            beams = (await self._run(p, n, max_tokens))[:keep]
            outs.append(
                generate_response(uuid.uuid4().hex, beams, len(p), time.perf_counter() - t0)
            )
        return web.json_response(outs if batched else outs[0])

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.info)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.model_name, "object": "model", "owned_by": ENGINE_NAME}],
            }
        )


async def _json(request: web.Request) -> dict:
    try:
        body = await request.json(loads=json.loads)
    except ValueError as exc:
        raise RequestError(f"malformed JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as exc:
        return error_response(str(exc), 400, exc.param)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.reason or "error", exc.status)
    except Exception as exc:  # noqa: BLE001 - every error leaves as a JSON body
        _log.exception("error on %s %s", request.method, request.path)
        return error_response(f"internal error: {type(exc).__name__}: {exc}", 500)


def create_app(ref: Any, info: dict, model_name: str = "hf-reference") -> web.Application:
    """The aiohttp application over a loaded reference (tests pass a fake ``ref``)."""
    h = ReferenceApp(ref, info, model_name)
    app = web.Application(middlewares=[_errors])
    app.router.add_get("/health", h.health)
    app.router.add_get("/get_server_info", h.server_info)
    app.router.add_get("/v1/models", h.models)
    app.router.add_post("/v1/chat/completions", h.chat)
    app.router.add_post("/generate", h.generate)
    return app


# --------------------------------------------------------------------------- serving


def server_info(args: argparse.Namespace, ref: Any) -> dict:
    """``/get_server_info``: says this is the HF reference, and how it was configured."""
    import torch
    import transformers

    lay = ref.layout
    return {
        "engine": ENGINE_NAME,
        "reference": True,
        "description": "HF transformers beam search (harness.servers.hf_reference), not FlashRec",
        "protocols": ["chat", "generate"],
        "model_path": args.model_path,
        "sid_vocab_file": args.sid_vocab_file,
        "device": args.device,
        "dtype": args.dtype,
        "logprob_scope": args.logprob_scope,
        "length_penalty": args.length_penalty,
        "prefill_chunk": ref.prefill_chunk,
        "search": ref.search,
        "depth": ref.depth,
        "sid_layout": {
            "code_start": lay.code_start,
            "codebook_size": lay.codebook_size,
            "num_levels": lay.num_levels,
            "sid_begin": lay.sid_begin,
            "sid_end": lay.sid_end,
        },
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
    }


async def _serve(app: web.Application, host: str, port: int) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = port
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            bound = int(addr[1])
            break
    print(URL_LINE.format(host=host, port=bound), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def run_reference_server(args: argparse.Namespace) -> int:
    """Load the reference model and serve until SIGTERM / SIGINT; returns the exit code."""
    import torch

    from harness.servers.hf_reference import HFReference

    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO,
            stream=sys.stderr,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    from flashrec.parentwatch import watch_from_env

    watch_from_env()  # launched by the harness: dies with it (loading included)
    ref = HFReference(
        args.model_path,
        args.sid_vocab_file,
        sid=args.sid,
        logprob_scope=args.logprob_scope,
        length_penalty=args.length_penalty,
        device=args.device,
        dtype=getattr(torch, args.dtype),
        prefill_chunk=args.prefill_chunk,
        search=args.search,
        packed_base=args.packed_base,
    )
    _log.info(
        "HF reference loaded: %s (%s, %s, scope %s, prefill chunk %s, search %s)",
        args.model_path,
        args.device,
        args.dtype,
        args.logprob_scope,
        ref.prefill_chunk or "off",
        ref.search,
    )
    app = create_app(ref, server_info(args, ref), args.served_model_name)
    asyncio.run(_serve(app, args.host, args.port))
    return 0
