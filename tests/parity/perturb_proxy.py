"""A deliberately worse candidate for the parity tests: a proxy in front of a FlashRec server
that answers its chat beams with the best beam moved last (``n`` > 1), so top-1 agreement
with any reference drops to 0 while the beam set stays the same. Everything else is
forwarded unchanged. Binds 127.0.0.1 on an ephemeral port; a context manager that always
stops it."""

from __future__ import annotations

import json

import aiohttp
from aiohttp import web
from fake_sglang import ThreadedApp


class PerturbProxy(ThreadedApp):
    def __init__(self, backend: str) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        super().__init__(app)
        self.backend = backend.rstrip("/")
        self.perturbed = 0  # answers changed

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
