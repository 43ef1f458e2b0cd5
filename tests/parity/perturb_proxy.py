"""A deliberately worse candidate for the parity tests: a proxy in front of a FlashRec server
that answers its chat beams with the best beam moved last (``n`` > 1), so top-1 agreement
with any reference drops to 0 while the beam set stays the same. Everything else is
forwarded unchanged. Binds 127.0.0.1 on an ephemeral port; a context manager that always
stops it."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import aiohttp
from aiohttp import web


class PerturbProxy:
    def __init__(self, backend: str) -> None:
        self.backend = backend.rstrip("/")
        self.url = ""
        self.perturbed = 0  # answers changed
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    async def _forward(self, request: web.Request) -> web.Response:
        body = await request.read()
        async with aiohttp.ClientSession() as session:
            async with session.request(
                request.method, self.backend + request.path_qs, data=body or None,
                headers={"Content-Type": "application/json"} if body else None,
            ) as r:  # fmt: skip
                raw, status = await r.read(), r.status
        if request.path == "/v1/chat/completions" and status == 200:
            data = json.loads(raw)
            choices = data.get("choices") or []
            if len(choices) > 1:
                data["choices"] = choices[1:] + choices[:1]
                for i, ch in enumerate(data["choices"]):
                    ch["index"] = i
                self.perturbed += 1
            return web.json_response(data)
        return web.Response(body=raw, status=status, content_type="application/json")

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> PerturbProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()
