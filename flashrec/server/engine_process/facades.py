"""The server's ``ServedEngine`` (``server.engine_api``) and profiler over an engine process's
pipe, so ``create_app`` and the handlers do not know whether the engine runs in a process of
its own."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from concurrent.futures import CancelledError, Future
from typing import TYPE_CHECKING, Any

from flashrec.config.engine import unknown_catalog
from flashrec.engine.request import EngineError, GenRequest, QueueFullError, check_request_limits
from flashrec.prompt import build_prompt_ids, load_tokenizer
from flashrec.server.engine_process.proxy import EngineClient, EngineProcess, EngineProcessError

if TYPE_CHECKING:
    from flashrec.config import ServerConfig
    from flashrec.server.engine_process.messages import Ready
    from flashrec.sid.layout import SidLayout


class RemoteEngine:
    """The server's ``ServedEngine`` over an ``EngineClient``: prompts are built here (this
    process's tokenizers), requests are checked here on the limits the engine reported, then
    sent; everything else is a call over the pipe."""

    def __init__(self, proc: EngineClient) -> None:
        assert proc.info is not None, "connect the client first"
        self.proc = proc
        self.config = proc.config
        self._info: Ready = proc.info  # what the engine process reported at start-up
        self.profiler = RemoteProfiler(proc)
        self._admitting = True
        # a copy made while the engine process built the engine; its own, not the SID text's
        # (a HF fast tokenizer must not serve two threads at once)
        self.tokenizer = proc.take_tokenizer() or load_tokenizer(self.config.model_path)

    # ---- the engine's facts and prompts ---------------------------------------------------
    @property
    def layout(self) -> SidLayout:
        return self._info.layout

    @property
    def vocab_size(self) -> int:
        return self._info.vocab_size

    @property
    def max_beam_rows(self) -> int:
        return self._info.max_beam_rows

    def server_info(self) -> dict[str, Any]:
        """The engine's start-up info; the catalog as it is now (a hot reload changes it)."""
        info = dict(self._info.server_info)
        info["engine_process_pid"] = self._info.pid
        info["catalog"] = self.proc.call("catalog_info")
        info["catalogs"] = self.proc.call("catalogs_info")
        info["weights"] = self.proc.call("weights_info")
        return info

    def sid_text_table(self) -> dict[int, str]:
        """Token id -> text of every SID token (the server process's own table)."""
        return self.proc.text.table

    def prompt_builders(self, count: int) -> list[Callable[..., list[int]]]:
        """``count`` builders: over this process's own tokenizer copy, then ``prompt_builder``'s."""
        own = functools.partial(build_prompt_ids, self.tokenizer, self.layout, self.vocab_size)
        return [own, *(self.prompt_builder() for _ in range(count - 1))]

    def prompt_builder(self) -> Callable[..., list[int]]:
        """``build_prompt`` over a private tokenizer copy (see ``Engine.prompt_builder``): one
        made while the engine was built, else a new one."""
        tok = self.proc.take_tokenizer()
        if tok is not None:
            return functools.partial(build_prompt_ids, tok, self.layout, self.vocab_size)
        from flashrec.engine.engine import private_prompt_builder  # imports torch

        return private_prompt_builder(
            self.tokenizer, self.config.model_path, self.layout, self.vocab_size
        )

    # ---- requests ---------------------------------------------------------------------------
    def check_request(self, req: GenRequest) -> None:
        """The engine's own checks (``Engine.check_request``), on the values it reported."""
        check_request_limits(
            req, self.max_beam_rows, self.config.max_seq_len, self._info.pool_tokens
        )
        if req.catalog is not None and req.catalog not in self.config.catalog_names:
            raise ValueError(unknown_catalog(req.catalog, self.config.catalog_names))

    def submit(self, req: GenRequest) -> Future:
        """``check_request``, then the request to the engine process."""
        self.check_request(req)
        if not self._admitting:
            raise QueueFullError("server is shutting down")
        return self.proc.submit(req)

    def cancel(self, rid: str) -> None:
        self.proc.cancel(rid)

    def in_flight(self) -> int:
        return self.proc.in_flight()

    # ---- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """The child's loop runs from ``EngineProcess.start``."""

    def warmup(self) -> None:
        self.proc.call("warmup", timeout=None)

    def freeze_gc(self) -> int:
        """``--gc-freeze`` in the engine process; returns the objects frozen there."""
        return self.proc.call("gc_freeze", timeout=None)

    def add_step_hook(self, fn: Callable[[int], None]) -> None:
        """Nothing: the engine process runs its own step hooks (its GC watch's)."""

    def drain(self, timeout_s: float) -> bool:
        """Stop admitting; wait until in-flight requests finish (True) or the time is up."""
        from flashrec.engine.loop import wait_idle

        self._admitting = False
        return wait_idle(self.in_flight, timeout_s)

    def stop(self) -> None:
        self.proc.stop()

    # ---- control ----------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        return self.proc.call("stats")

    def metrics_snapshot(self) -> tuple[dict[str, int], str, dict[str, Any]]:
        """What ``/metrics`` reads of the engine process, in ONE call over the pipe (each call
        starts a thread there): ``(stats, profiler state, GC metrics)``."""
        return self.proc.call("metrics")

    def flush_cache(self) -> int:
        return self.proc.call("flush_cache")

    def reload_catalog(
        self, path: str, packed_base: int | None = None, name: str | None = None
    ) -> dict[str, Any]:
        """Catalog hot reload in the engine process: built on a call thread there, swapped
        on its engine thread between steps."""
        return self.proc.call("reload_catalog", path, packed_base, name, timeout=None)

    def rollback_catalog(self, name: str | None = None) -> dict[str, Any]:
        """Catalog rollback in the engine process, swapped on its engine thread."""
        return self.proc.call("rollback_catalog", name, timeout=None)

    def update_weights(self, model_path: str, label: str | None = None) -> dict[str, Any]:
        """New weights in the engine process: staged on a call thread there, swapped on its
        engine thread once no request runs."""
        return self.proc.call("update_weights", model_path, label, timeout=None)


class RemoteProfiler:
    """``ProfileController``'s HTTP-facing API; the profiler itself runs in the engine
    process, on its engine thread."""

    def __init__(self, proc: EngineClient) -> None:
        self.proc = proc

    @property
    def state(self) -> str:
        if self.proc.dead is not None:
            return "idle"
        return self.proc.call("profile_state")

    def start(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.proc.call("profile_start", dict(body))

    def stop(self) -> dict[str, Any]:
        return self.proc.call("profile_stop", timeout=None)

    def shutdown(self) -> None:
        """Write a running profile's trace; nothing to do when the engine process is gone."""
        try:
            self.proc.call("profile_shutdown", timeout=None)
        except (EngineError, EngineProcessError, CancelledError):
            pass


def start_engine_process(config: ServerConfig) -> RemoteEngine:
    """Spawn the engine process, wait until its engine is built, return the facade."""
    proc = EngineProcess(config)
    try:
        proc.start()
        return RemoteEngine(proc)
    except EngineProcessError:
        raise
    except BaseException:
        proc.stop()
        raise
