"""A server URL checked before any request is sent to it: a URL without a scheme, with another
scheme than http(s) or without a host fails at once, named with what is wrong, instead of as
every request's connection error later."""

from __future__ import annotations

import argparse
import re
from urllib.parse import urlsplit

SCHEMES = ("http", "https")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/")


def url_problem(url: str) -> str | None:
    """What is wrong with ``url`` as a server's base URL (None when nothing is)."""
    text = url.strip()
    if not text:
        return "is empty (give http://HOST:PORT)"
    if "://" not in text:
        if _SCHEME.match(text):
            return "is malformed (expected http://HOST:PORT)"
        return f"has no scheme (did you mean 'http://{text}'?)"
    parts = urlsplit(text)
    if parts.scheme.lower() not in SCHEMES:
        rest = text.split("://", 1)[1]
        return (
            f"has the scheme '{parts.scheme}': only http:// and https:// are supported "
            f"(did you mean 'http://{rest}'?)"
        )
    if not parts.hostname:
        return "has no host (expected http://HOST:PORT, e.g. http://127.0.0.1:8000)"
    try:
        _ = parts.port  # urlsplit checks the port only when asked
    except ValueError as exc:
        return f"has a bad port ({exc})"
    return None


def check_url(url: str, what: str = "URL") -> str:
    """``url`` unchanged, or ValueError naming ``what``, the URL and what is wrong with it."""
    problem = url_problem(url)
    if problem:
        raise ValueError(f"{what} {url!r} {problem}")
    return url


def url_arg(text: str) -> str:
    """An argparse ``type`` for a ``--url`` flag: usage error (exit 2) on a bad URL."""
    problem = url_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}")
    return text
