"""A fake upstream SGLang server (0.5.23) for the parity tests, built from its field names.

It speaks SGLang's wire formats and takes its beams from a FlashRec server behind it:

- ``POST /generate``: ``sampling_params`` keys outside upstream's contract are a 400 (its
  ``{"error": "unknown field ..."}``); ``beam_width`` > 1 is beam search: ``beam_width``
  beams searched (by FlashRec), the best ``n`` (default 1, ``n <= beam_width``) returned as
  upstream does: the best beam's ``text`` / ``output_ids`` / ``meta_info`` at the top level,
  every beam in ``meta_info.beam_results[i] = {output_ids, text, meta_info: {finish_reason,
  sequence_score}}``, finish reasons as objects. Beam search refuses ``return_logprob``.
  Without ``beam_width`` (or 1) it is a plain generation: one sequence (FlashRec's width-1
  beam), ``meta_info.output_token_logprobs`` when ``return_logprob`` (FlashRec reports only
  the sum, spread here evenly over the tokens), ``n`` > 1 a list of ``n`` answers.
- ``POST /v1/chat/completions``: no beam search: ``n`` samples (the width-1 beam, ``n``
  times), no ``sglext.sequence_score``.
- ``GET /health``, ``GET /get_server_info`` (no ``protocols``: upstream declares none).

Run one: ``python tests/parity/fake_sglang.py --backend http://127.0.0.1:8000 --port 30000``.
In tests: ``with FakeSGLang(backend_url) as fake: fake.url``. Binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
import uuid
from typing import Any

import aiohttp
from aiohttp import web

VERSION = "0.5.23"
FAKE = web.AppKey("fake", object)
# sglang.api.v1.SamplingParams: every key upstream's /generate contract admits
SAMPLING_KEYS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p",
    "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
    "min_new_tokens", "n", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stream_interval",
    "logit_bias", "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
)  # fmt: skip
INT_KEYS = {"max_new_tokens", "top_k", "min_new_tokens", "n", "stream_interval",
            "sampling_seed", "beam_width"}  # fmt: skip
FLOAT_KEYS = {"temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
              "repetition_penalty"}  # fmt: skip


class Refused(Exception):
    """A request upstream refuses: 400 with ``body``."""

    def __init__(self, body: Any) -> None:
        super().__init__(str(body))
        self.body = body


def contract_error(sp: Any) -> str | None:
    """Upstream's contract check of one ``sampling_params`` object (its error text)."""
    if not isinstance(sp, dict):
        return "invalid type: expected struct SamplingParams"
    for key, v in sp.items():
        if key not in SAMPLING_KEYS:
            listed = ", ".join(f"`{k}`" for k in SAMPLING_KEYS)
            return f"unknown field `{key}`, expected one of {listed}"
        if v is None:
            continue
        if key in INT_KEYS and (not isinstance(v, int) or isinstance(v, bool)):
            return f"invalid type for `{key}`: expected i64"
        if key in FLOAT_KEYS and (not isinstance(v, int | float) or isinstance(v, bool)):
            return f"invalid type for `{key}`: expected f64"
    return None


def finish_reason(reason: Any, ids: list[int]) -> dict:
    """Upstream's finish-reason object from a FlashRec beam's (object or string)."""
    if isinstance(reason, dict):
        return reason
    if reason == "stop":
        return {"type": "stop", "matched": ids[-1]}
    return {"type": "length", "length": len(ids)}


def backend_beams(answer: dict) -> list[dict]:
    """FlashRec's /generate beams as ``{ids, text, score, cum, finish}``."""
    out = []
    for b in answer["meta_info"]["beam_results"]:
        ids = b["output_ids"] if "output_ids" in b else b["token_ids"]
        meta = b["meta_info"]
        out.append(
            {
                "ids": list(ids),
                "text": b.get("text", ""),
                "score": meta["sequence_score"],
                "cum": meta.get("cum_logprob", meta["sequence_score"] * len(ids)),
                "finish": finish_reason(meta.get("finish_reason"), list(ids)),
            }
        )
    return out


class FakeApp:
    """Handlers; every beam comes from ``backend`` (a FlashRec base URL)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend.rstrip("/")
        self.requests: list[dict] = []  # every /generate body received (tests read them)

    async def _beams(self, prompt: dict, width: int, max_new: int | None) -> tuple[list, dict]:
        sp: dict[str, Any] = {"beam_width": width, "n": width, "temperature": 0.0}
        if max_new is not None:
            sp["max_new_tokens"] = max_new
        async with aiohttp.ClientSession() as s:
            async with s.post(
                self.backend + "/generate", json={**prompt, "sampling_params": sp}
            ) as r:
                data = await r.json()
                if r.status != 200:
                    raise Refused({"error": {"message": str(data)}})
        return backend_beams(data), data["meta_info"]

    async def generate(self, request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        body = await request.json()
        self.requests.append(body)
        sp = body.get("sampling_params") or {}
        batched = isinstance(body.get("text"), list) or (
            isinstance(body.get("input_ids"), list)
            and bool(body["input_ids"])
            and isinstance(body["input_ids"][0], list)
        )
        for one in sp if isinstance(sp, list) else [sp]:
            error = contract_error(one)
            if error is not None:
                return web.json_response({"error": error}, status=400)
        if isinstance(sp, list):
            sp = sp[0]
        key = "text" if body.get("text") is not None else "input_ids"
        prompts = body[key] if batched else [body[key]]
        try:
            outs = [await self._one({key: p}, sp, body, t0) for p in prompts]
        except Refused as exc:
            return web.json_response(exc.body, status=400)
        return web.json_response(outs if batched else outs[0])

    async def _one(self, prompt: dict, sp: dict, body: dict, t0: float) -> Any:
        width = sp.get("beam_width") or 1
        n = 1 if sp.get("n") is None else sp["n"]
        max_new = sp.get("max_new_tokens")
        rid = uuid.uuid4().hex
        if width > 1:
            if n > width:
                raise Refused(
                    {"error": {"message": f"n ({n}) cannot exceed beam_width ({width})."}}
                )
            if body.get("return_logprob"):
                raise Refused(
                    {"error": {"message": "Beam search does not support return_logprob."}}
                )
            beams, meta = await self._beams(prompt, width, max_new)
            return self._beam_answer(rid, beams[:n], meta, time.perf_counter() - t0)
        (beam,), meta = await self._beams(prompt, 1, max_new)
        answers = [
            self._plain_answer(rid if i == 0 else uuid.uuid4().hex, beam, meta, body, t0)
            for i in range(n)
        ]
        return answers[0] if n == 1 else answers

    @staticmethod
    def _request_meta(rid: str, meta: dict, completion: int, latency: float) -> dict:
        return {
            "id": rid,
            "finish_reason": None,
            "prompt_tokens": meta.get("prompt_tokens"),
            "weight_version": "default",
            "num_retractions": 0,
            "completion_tokens": completion,
            "cached_tokens": meta.get("cached_tokens", 0),
            "e2e_latency": latency,
        }

    def _beam_answer(self, rid: str, beams: list[dict], meta: dict, latency: float) -> dict:
        completion = sum(len(b["ids"]) for b in beams)
        results = []
        for i, b in enumerate(beams):
            m = self._request_meta(rid, meta, completion, latency) if i == 0 else {}
            m["finish_reason"] = b["finish"]
            m["sequence_score"] = b["score"]
            results.append({"output_ids": b["ids"], "text": b["text"], "meta_info": m})
        best = results[0]
        return {
            "text": best["text"],
            "output_ids": best["output_ids"],
            "meta_info": {**best["meta_info"], "beam_results": results},
        }

    def _plain_answer(self, rid: str, beam: dict, meta: dict, body: dict, t0: float) -> dict:
        m = self._request_meta(rid, meta, len(beam["ids"]), time.perf_counter() - t0)
        m["finish_reason"] = beam["finish"]
        if body.get("return_logprob"):
            each = beam["cum"] / len(beam["ids"])
            m["output_token_logprobs"] = [[each, t, None] for t in beam["ids"]]
        return {"text": beam["text"], "output_ids": beam["ids"], "meta_info": m}

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        n = body.get("n") or 1
        fwd = {
            "messages": body["messages"],
            "n": 1,
            "temperature": 0.0,
            **({"max_tokens": body["max_tokens"]} if body.get("max_tokens") else {}),
        }
        async with aiohttp.ClientSession() as s:
            async with s.post(self.backend + "/v1/chat/completions", json=fwd) as r:
                data = await r.json()
                if r.status != 200:
                    return web.json_response(data, status=r.status)
        (choice,) = data["choices"]
        ids = choice["sglext"]["token_ids"]
        content = choice["message"]["content"]
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": content, "reasoning_content": None},
                "logprobs": None,
                "finish_reason": choice["finish_reason"],
                "matched_stop": ids[-1] if choice["finish_reason"] == "stop" else None,
            }
            for i in range(n)
        ]
        usage = data["usage"]
        completion = n * len(ids)
        return web.json_response(
            {
                "id": uuid.uuid4().hex,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or "default",
                "choices": choices,
                "usage": {
                    "prompt_tokens": usage["prompt_tokens"],
                    "completion_tokens": completion,
                    "total_tokens": usage["prompt_tokens"] + completion,
                },
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION, "model_path": "fake", "tp_size": 1})


def create_app(backend: str) -> web.Application:
    fake = FakeApp(backend)
    app = web.Application()
    app[FAKE] = fake
    app.router.add_post("/generate", fake.generate)
    app.router.add_post("/v1/chat/completions", fake.chat)
    app.router.add_get("/health", fake.health)
    app.router.add_get("/get_server_info", fake.server_info)
    app.router.add_get("/server_info", fake.server_info)
    return app


class ThreadedApp:
    """An aiohttp ``app`` served on a thread of its own, on 127.0.0.1 (port 0: an ephemeral
    one); a context manager that always stops it. ``url`` is set once it serves."""

    def __init__(self, app: web.Application, port: int = 0) -> None:
        self.app = app
        self.port = port
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self):
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()


class FakeSGLang(ThreadedApp):
    """The fake on a thread of its own (:class:`ThreadedApp`)."""

    def __init__(self, backend: str, port: int = 0) -> None:
        super().__init__(create_app(backend), port)

    @property
    def requests(self) -> list[dict]:
        return self.app[FAKE].requests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", required=True, help="FlashRec base URL the beams come from")
    ap.add_argument("--port", type=int, default=30000)
    args = ap.parse_args()
    print(f"fake SGLang serving on http://127.0.0.1:{args.port}", flush=True)
    web.run_app(create_app(args.backend), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
