"""OpenAI-shaped error bodies and the exception that carries them to the HTTP layer.

Every non-2xx answer of the server has the body::

    {"error": {"message": str, "type": str, "param": str | None, "code": int}}

``type`` is ``invalid_request_error`` for 4xx caused by the request, ``server_busy`` for 503
and ``internal_error`` for 500 (an engine batch failure).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
SERVER_BUSY = "server_busy"
INTERNAL_ERROR = "internal_error"
RETRY_AFTER_S = 1


class APIError(Exception):
    """A request that ends with an error response; raised anywhere below a handler."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        type: str = INVALID_REQUEST,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.type = type
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body of this error."""
        return error_body(self.message, self.status, self.param, self.type)

    def response(self) -> web.Response:
        """The aiohttp response carrying this error."""
        return web.json_response(self.body(), status=self.status, headers=self.headers)


def error_body(
    message: str, status: int, param: str | None = None, type: str = INVALID_REQUEST
) -> dict[str, Any]:
    """``{"error": {...}}`` in the OpenAI shape (``code`` is the HTTP status)."""
    return {"error": {"message": message, "type": type, "param": param, "code": status}}


def bad_request(message: str, param: str | None = None) -> APIError:
    """400 ``invalid_request_error``."""
    return APIError(message, 400, param)


def busy(message: str) -> APIError:
    """503 with ``Retry-After``: the queue is full or the server is shutting down."""
    return APIError(message, 503, type=SERVER_BUSY, headers={"Retry-After": str(RETRY_AFTER_S)})


def internal(message: str) -> APIError:
    """500: the engine failed the batch this request ran in."""
    return APIError(message, 500, type=INTERNAL_ERROR)
