"""HTTP front end: OpenAI chat completions, SGLang /generate, health, metrics, profiling.

``create_app`` builds the aiohttp application over an engine and its loop; ``run_server``
owns the process (bind, warm-up, SIGTERM drain); ``add_serve_args`` / ``serve_main`` are the
``flashrec serve`` CLI.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Server", "add_serve_args", "create_app", "run_server", "serve", "serve_main"]


def __getattr__(name: str) -> Any:
    """The application's names, imported on first use: a process that needs only a light
    submodule (a ``--respond-workers`` worker: ``responses``) does not import the app, its
    profiler and torch."""
    if name in __all__:
        from flashrec.server import app

        return getattr(app, name)
    raise AttributeError(f"module 'flashrec.server' has no attribute {name!r}")
