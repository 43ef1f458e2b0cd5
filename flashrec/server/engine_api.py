"""What the server needs of an engine, as one structural interface.

Two classes satisfy ``ServedEngine`` without importing it: ``flashrec.engine.loop.EngineLoop``
(the engine in this process, on its engine thread) and ``engine_process.RemoteEngine`` (the
engine in a process of its own, over a pipe); the test fakes do too. The server (``backend``,
``app``, the handlers) holds the engine as a ``ServedEngine`` and knows no other surface.

Threads: each prompt builder runs on one prompt-building thread of the server at a time;
everything else may be called from any thread and blocks at most for one engine call, except
``warmup``, ``drain``, ``reload_catalog``, ``rollback_catalog`` and ``update_weights``, which
take as long as they take.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from flashrec.engine.request import GenRequest, GenResult
    from flashrec.sid.layout import SidLayout

# prompt token ids from keywords: messages (+ chat_template_kwargs), text or input_ids, and a
# ``prompt.LengthGuard`` (``flashrec.prompt.build_prompt_ids`` over one tokenizer)
PromptBuilder = Callable[..., list[int]]


class Profiler(Protocol):
    """The torch profiler's HTTP-facing controls (``/start_profile``, ``/stop_profile``)."""

    @property
    def state(self) -> str: ...  # idle, pending or active

    def start(self, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def stop(self) -> dict[str, Any]: ...

    def shutdown(self) -> None: ...  # write a running profile's trace (server exit)


class ServedEngine(Protocol):
    """The engine as the server drives it: facts and limits, prompts, requests, lifecycle,
    and the catalog, cache and profile controls."""

    # -- facts the request limits and /get_server_info are made of ----------------------------
    @property
    def layout(self) -> SidLayout: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_beam_rows(self) -> int: ...  # beams in flight at once: the largest n

    def server_info(self) -> dict[str, Any]: ...  # its part of /get_server_info

    # -- prompts -------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any | None: ...  # a HF tokenizer (length guard, word cache); None

    def prompt_builders(self, count: int) -> list[PromptBuilder]:
        """``count`` builders, no two sharing a tokenizer (a HF fast tokenizer must not serve
        two threads at once): the first over the engine's own, the others over copies."""
        ...

    def sid_text_table(self) -> dict[int, str]: ...  # SID token id -> its text ({}: none)

    # -- requests ------------------------------------------------------------------------------
    def submit(self, req: GenRequest) -> Future[GenResult]:
        """Queue ``req`` after the engine's request checks: ValueError for a request it can
        never serve, QueueFullError when its queue is full or it is draining."""
        ...

    def cancel(self, rid: str) -> None: ...  # withdraw ``rid``; its rows free within a step

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None: ...

    def warmup(self) -> None: ...  # a few requests through the whole path, then a cache flush

    def freeze_gc(self) -> int: ...  # --gc-freeze where the engine runs; objects frozen

    def add_step_hook(self, fn: Callable[[int], None]) -> None: ...  # fn(steps) per step

    def drain(self, timeout_s: float) -> bool: ...  # stop admitting; True once all finished

    def stop(self) -> None: ...

    # -- control -------------------------------------------------------------------------------
    @property
    def profiler(self) -> Profiler: ...

    def flush_cache(self) -> int: ...  # tokens freed from the radix cache

    def reload_catalog(
        self, path: str, packed_base: int | None = None, name: str | None = None
    ) -> dict[str, Any]:
        """Catalog ``name`` (None: the default) from ``path`` without a restart
        (``/update_catalog``), its replaced version kept: ValueError for a file that cannot
        serve or an unknown name, ``ReloadBusyError`` while a reload or rollback runs."""
        ...

    def rollback_catalog(self, name: str | None = None) -> dict[str, Any]:
        """Catalog ``name`` back to its previous version (``/rollback_catalog``): ValueError
        when it has none, ``ReloadBusyError`` while a reload or rollback runs."""
        ...

    def update_weights(self, model_path: str, label: str | None = None) -> dict[str, Any]:
        """New weights from ``model_path`` without a restart (``/update_weights_from_disk``):
        ValueError for a checkpoint that cannot serve (the old weights keep serving),
        ``ReloadBusyError`` while another update runs; blocks until swapped in."""
        ...

    def metrics_snapshot(self) -> tuple[dict[str, int], str, dict[str, Any] | None]:
        """What ``/metrics`` reads of the engine in one call: its counters, the profiler's
        state and, for an engine in its own process, that process's GC counters."""
        ...
