"""OpenAI-shaped error bodies and the exception that carries them to the HTTP layer.

Every non-2xx answer of the server has the body::

    {"error": {"message": str, "type": str, "param": str | None, "code": int}}

``type`` is ``invalid_request_error`` for 4xx caused by the request (``not_found_error`` for
404), ``server_busy`` for 503 and ``internal_error`` for 500 (a server fault, e.g. an engine
batch failure). ``docs/api.md`` lists the statuses per cause.
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
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.type = type
        self.headers = headers or {}
        self.close = close  # end the connection after this answer (Connection: close)

    def body(self) -> dict[str, Any]:
        """The JSON body of this error."""
        return error_body(self.message, self.status, self.param, self.type)

    def response(self) -> web.Response:
        """The aiohttp response carrying this error."""
        resp = web.json_response(self.body(), status=self.status, headers=self.headers)
        if self.close:
            resp.force_close()
        return resp


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


def too_large(limit: int, what: str = "request body") -> APIError:
    """413: the body (as sent or as decoded) is over ``--max-body-bytes``."""
    return APIError(f"{what} too large (limit {limit} bytes)", 413)


def unsupported_media(message: str) -> APIError:
    """415: a ``Content-Encoding`` the server does not decode."""
    return APIError(message, 415)


def timed_out(message: str) -> APIError:
    """408: the client did not send the whole request in time; the connection is closed."""
    return APIError(message, 408, close=True)
