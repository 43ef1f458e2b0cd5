"""HTTP front end: OpenAI chat completions, SGLang /generate, health, metrics, profiling.

``create_app`` builds the aiohttp application over an engine and its loop; ``run_server``
owns the process (bind, warm-up, SIGTERM drain); ``add_serve_args`` / ``serve_main`` are the
``flashrec serve`` CLI.
"""

from __future__ import annotations

from flashrec.server.app import (
    Server,
    add_serve_args,
    create_app,
    run_server,
    serve,
    serve_main,
)

__all__ = ["Server", "add_serve_args", "create_app", "run_server", "serve", "serve_main"]
