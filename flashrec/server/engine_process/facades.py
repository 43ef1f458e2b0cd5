"""The in-process interfaces of the engine, loop and profiler, over an ``EngineProcess``, so
``create_app`` and the handlers do not know whether the engine runs in a process of its own."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from typing import Any

from flashrec.engine.request import EngineError, GenRequest, QueueFullError, check_request_limits
from flashrec.server.engine_process.proxy import EngineProcess, EngineProcessError


class RemoteEngine:
    """What the HTTP layer reads of the engine, over an ``EngineProcess``: prompts are built
    here (the server process's tokenizers), the request checks use the engine's limits."""

    def __init__(self, proc: EngineProcess) -> None:
        from flashrec.prompt import load_tokenizer

        self.proc = proc
        self.config = proc.config
        info = proc.info
        self.layout = info.layout
        self.vocab_size: int = info.vocab_size
        self.max_beam_rows: int = info.max_beam_rows
        self.pool_tokens: int = info.pool_tokens
        # a copy made while the engine process built the engine; its own, not the SID text's
        # (a HF fast tokenizer must not serve two threads at once)
        self.tokenizer = proc.take_tokenizer() or load_tokenizer(self.config.model_path)

    def sid_text_table(self) -> dict[int, str]:
        """Token id -> text of every SID token (the server process's own table)."""
        return self.proc.text.table

    def build_prompt(self, **kwargs: Any) -> list[int]:
        from flashrec.prompt import build_prompt_ids

        return build_prompt_ids(self.tokenizer, self.layout, self.vocab_size, **kwargs)

    def prompt_builder(self) -> Callable[..., list[int]]:
        """``build_prompt`` over a private tokenizer copy (see ``Engine.prompt_builder``): one
        made while the engine was built, else a new one."""
        import functools

        from flashrec.prompt import build_prompt_ids

        tok = self.proc.take_tokenizer()
        if tok is not None:
            return functools.partial(build_prompt_ids, tok, self.layout, self.vocab_size)
        from flashrec.engine.engine import private_prompt_builder  # imports torch

        return private_prompt_builder(
            self.tokenizer, self.config.model_path, self.layout, self.vocab_size
        )

    def check_request(self, r: GenRequest) -> None:
        """The engine's own checks (``Engine.check_request``), on the values it reported
        (imported with this module, not at the first request: ready means ready)."""
        check_request_limits(r, self.max_beam_rows, self.config.max_seq_len, self.pool_tokens)

    def server_info(self) -> dict[str, Any]:
        """The engine's start-up info; the catalog as it is now (a hot reload changes it)."""
        info = dict(self.proc.info.server_info)
        info["engine_process_pid"] = self.proc.info.pid
        info["catalog"] = self.proc.call("catalog_info")
        return info


class RemoteLoop:
    """``EngineLoop``'s front-end API over an ``EngineProcess``."""

    def __init__(self, proc: EngineProcess, config: Any) -> None:
        self.proc = proc
        self.config = config
        self.profiler = RemoteProfiler(proc)
        self._admitting = True

    def start(self) -> None:
        """The child's loop runs from ``EngineProcess.start``."""

    def submit(self, req: GenRequest) -> Future:
        if not self._admitting:
            raise QueueFullError("server is shutting down")
        return self.proc.submit(req)

    def cancel(self, rid: str) -> None:
        self.proc.cancel(rid)

    def stats(self) -> dict[str, int]:
        return self.proc.call("stats")

    def metrics_snapshot(self) -> tuple[dict[str, int], str, dict[str, Any]]:
        """What ``/metrics`` reads of the engine process, in ONE call over the pipe (each call
        starts a thread there): ``(stats, profiler state, GC metrics)``."""
        return self.proc.call("metrics")

    def gc_metrics(self) -> dict[str, Any]:
        """The engine process's garbage-collector counters (``GcWatch.metrics``)."""
        return self.proc.call("gc_metrics")

    def flush_cache(self) -> int:
        return self.proc.call("flush_cache")

    def reload_catalog(self, path: str, packed_base: int | None = None) -> dict[str, Any]:
        """Catalog hot reload in the engine process: built on a call thread there, swapped
        on its engine thread between steps."""
        return self.proc.call("reload_catalog", path, packed_base, timeout=None)

    def warmup(self) -> None:
        self.proc.call("warmup", timeout=None)

    def freeze_gc(self) -> int:
        """``--gc-freeze`` in the engine process; returns the objects frozen there."""
        return self.proc.call("gc_freeze", timeout=None)

    def in_flight(self) -> int:
        return self.proc.in_flight()

    def drain(self, timeout_s: float) -> bool:
        """Stop admitting; wait until in-flight requests finish (True) or the time is up."""
        from flashrec.engine.loop import wait_idle

        self._admitting = False
        return wait_idle(self.in_flight, timeout_s)

    def stop(self) -> None:
        self.proc.stop()


class RemoteProfiler:
    """``ProfileController``'s HTTP-facing API; the profiler itself runs in the engine
    process, on its engine thread."""

    def __init__(self, proc: EngineProcess) -> None:
        self.proc = proc

    @property
    def state(self) -> str:
        if self.proc.dead is not None:
            return "idle"
        return self.proc.call("profile_state")

    def start(self, body: Any) -> dict[str, Any]:
        return self.proc.call("profile_start", dict(body))

    def stop(self) -> dict[str, Any]:
        return self.proc.call("profile_stop", timeout=None)

    def shutdown(self) -> None:
        """Write a running profile's trace; nothing to do when the engine process is gone."""
        try:
            self.proc.call("profile_shutdown", timeout=None)
        except (EngineError, EngineProcessError, CancelledError):
            pass


def start_engine_process(config: Any) -> tuple[RemoteEngine, RemoteLoop]:
    """Spawn the engine process, wait until its engine is built, return the facades."""
    proc = EngineProcess(config)
    try:
        proc.start()
        engine = RemoteEngine(proc)
    except EngineProcessError:
        raise
    except BaseException:
        proc.stop()
        raise
    return engine, RemoteLoop(proc, config)
