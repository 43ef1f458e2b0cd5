"""The application and the serving process.

``create_app`` wires the endpoints (``generation``, ``control``) over a ``ServedEngine``
(``engine_api``): ``EngineLoop`` in this process, or ``RemoteEngine`` over an engine process.
``Server`` owns one serving process; start-up order (``/health`` is 503 until the last step)::

    preflight (the port is free, the checkpoint and catalog are regular files)
      -> EngineLoop(Engine(config)) -> bind HOST:PORT, print the URL line
      -> engine.start() -> engine.warmup() -> ready

Routes (see ``docs/api.md``)::

    GET  /health  /v1/models  /get_server_info  /server_info  /model_info  /get_model_info
         /metrics
    POST /v1/chat/completions  /generate  /start_profile  /stop_profile  /update_catalog
         /rollback_catalog  /update_weights_from_disk
    POST|GET /flush_cache

On SIGTERM or SIGINT: new generation requests get 503 (every answer then closes its
connection), in-flight requests get up to ``--shutdown-timeout-s`` to finish
(``engine.drain``); those still held at the deadline are cancelled and answered 503. Then a
running profile is written, the listener closes, the engine stops, and the process exits 0.

Connections are ``wire.Connection``: header and body read timeouts, JSON parse errors, and
request bodies decoded by the server (aiohttp's decompression is off).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import ipaddress
import logging
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from aiohttp import HttpVersion11, web

from flashrec import boundedread
from flashrec.config import ServerConfig, add_config_args, config_from_args
from flashrec.server import control, generation, handlers
from flashrec.server.backend import Backend
from flashrec.server.engine_api import ServedEngine
from flashrec.server.errors import APIError
from flashrec.server.frontends import ASK_TIMEOUT_S, FrontendGroup, Member, Snapshot
from flashrec.server.gcwatch import GcWatch, freeze_startup_objects
from flashrec.server.handlers import STATE, ServerState
from flashrec.server.site import CLOSE_GRACE_S, Site, check_port, start_site

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from flashrec.server.engine_process import EngineClient
    from flashrec.server.engine_process.messages import Ready

_log = logging.getLogger("flashrec.server")

URL_LINE = "FlashRec serving on http://{host}:{port}"


def create_app(engine: ServedEngine, config: ServerConfig) -> web.Application:
    """The application over a built engine (``EngineLoop`` or ``RemoteEngine``).

    ``/health`` reports ok once ``app[STATE].backend.ready`` is set (``Server`` does it after
    warm-up).
    """
    app = web.Application(
        client_max_size=int(config.max_body_bytes), middlewares=[handlers.error_middleware]
    )
    backend = Backend(
        engine=engine,
        limits=handlers.limits_for(engine, config),
        model_path=config.model_path,
        tokenizer_workers=config.tokenizer_workers,
        respond_workers=config.respond_workers,
    )
    app[STATE] = ServerState(backend=backend, config=config, model_name=handlers.model_name(config))
    gen, ctl = generation, control
    routes = (
        ("GET", "/health", ctl.health),
        ("GET", "/v1/models", ctl.models),
        ("GET", "/get_server_info", ctl.server_info),
        ("GET", "/server_info", ctl.server_info),  # SGLang's newer name (sglang-router's probe)
        ("GET", "/model_info", ctl.model_info),
        ("GET", "/get_model_info", ctl.model_info),
        ("GET", "/metrics", ctl.metrics),
        ("POST", "/v1/chat/completions", gen.chat_completions),
        ("POST", "/generate", gen.generate),
        ("POST", "/flush_cache", ctl.flush_cache),
        ("GET", "/flush_cache", ctl.flush_cache),
        ("POST", "/start_profile", ctl.start_profile),
        ("POST", "/stop_profile", ctl.stop_profile),
        ("POST", "/update_catalog", ctl.update_catalog),
        ("POST", "/rollback_catalog", ctl.rollback_catalog),
        ("POST", "/update_weights_from_disk", ctl.update_weights_from_disk),
    )
    for method, path, handler in routes:
        app.router.add_route(method, path, handler, expect_handler=expect_continue)
    return app


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue`` gets its interim answer (as aiohttp's default handler sends
    it); any other expectation a 417 with the JSON error body (aiohttp's default answers in
    plain text, outside the error middleware)."""
    expect = request.headers.get("Expect", "").strip().lower()
    if expect == "100-continue":
        if request.version == HttpVersion11:
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # the answer proper has not begun
        return None
    request.app[STATE].metrics.count_error(417)
    return APIError(f"Expect {expect!r} is not supported (100-continue is)", 417).response()


def is_loopback(host: str) -> bool:
    """True for loopback addresses and ``localhost``."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _freeze_startup(watch: GcWatch | None) -> None:
    """Freeze what start-up built (``--gc-freeze``) and say how much, and how long it took."""
    t0 = time.perf_counter()
    frozen = freeze_startup_objects(watch)
    _log.info("gc: %d start-up objects frozen in %.2f s", frozen, time.perf_counter() - t0)


async def start_engine(st: ServerState, warmup: bool, group: FrontendGroup | None = None) -> None:
    """Start the engine and the other front ends (``group``), run the warm-up
    (``engine.warmup()``), then mark the server (every front end) ready."""
    be = st.backend
    await asyncio.to_thread(st.engine.start)
    if group is not None:
        await asyncio.to_thread(group.start)
    if warmup:
        t0 = time.perf_counter()
        await asyncio.to_thread(st.engine.warmup)
        _log.info("warm-up done in %.2f s", time.perf_counter() - t0)
    if st.config.gc_freeze:
        await asyncio.to_thread(st.engine.freeze_gc)  # an engine process: there too
        _freeze_startup(st.gc)
    be.ready = True
    if group is not None:
        group.set_ready()
    _log.info("ready")


async def start_member(st: ServerState, member: Member) -> None:
    """A spawned front end: wait for front end 0's word that the engine is warm."""
    await asyncio.to_thread(member.ready.wait)
    if not member.gone:
        st.backend.ready = True


async def drain(st: ServerState, timeout_s: float) -> bool:
    """Stop admitting and wait up to ``timeout_s`` for in-flight requests; True if all done."""
    be = st.backend
    be.draining = True
    deadline = time.monotonic() + timeout_s
    done = bool(await asyncio.to_thread(st.engine.drain, timeout_s))
    # The engine is idle; give the handlers a moment to write their answers.
    while be.active_handlers and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return done and not be.active_handlers


class Server:
    """One serving process: bind, warm up, serve until :meth:`request_stop`, drain.

    ``run`` owns an event loop; ``request_stop`` may be called from any thread (or a signal).
    ``process``: the pipe to the engine process when ``engine`` runs in one (its exit stops
    the server; front end 0's also holds the other front ends' pipes).
    """

    def __init__(
        self,
        engine: ServedEngine,
        config: ServerConfig,
        process: EngineClient | None = None,
        member: Member | None = None,
        port: int | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.process = process
        self.app = create_app(engine, config)
        self.state: ServerState = self.app[STATE]
        # a spawned front end (``member``) binds the port front end 0 bound
        self.member = member
        self.group: FrontendGroup | None = None  # front end 0 of several: the others
        self.bind_port = config.port if port is None else port
        if member is not None:
            self.state.frontend_index = member.index
        self.port: int | None = None
        self.bound = threading.Event()
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.exit_code = 0
        if process is not None:
            process.on_death = self._engine_died

    def _engine_died(self, why: str) -> None:
        """The engine process (or another front end) exited under us: not healthy any more;
        stop, exit code 1."""
        self.state.backend.ready = False
        self.exit_code = 1
        _log.error("%s: the server shuts down", why)
        self.request_stop()

    def _member_stop(self, orphaned: bool) -> None:
        """Front end 0 says stop (a drain), or is gone (``orphaned``: exit code 1)."""
        if orphaned:
            self._engine_died("front end 0 is gone")
        else:
            self.request_stop()

    def _snapshot(self) -> Snapshot:
        """This front end's ``/metrics`` part, taken on its event loop from any thread."""

        async def take() -> Snapshot:
            return control.snapshot(self.state)

        assert self._aloop is not None
        return asyncio.run_coroutine_threadsafe(take(), self._aloop).result(ASK_TIMEOUT_S)

    def _join_frontends(self) -> None:
        """Start the other front ends (front end 0 of several) or tell front end 0 this one
        listens (a spawned front end)."""
        st = self.state
        if self.member is not None:
            self.member.local = self._snapshot
            self.member.on_stop = self._member_stop
            st.frontends = self.member
            self.member.bound()
            return
        proc = self.process
        if self.config.api_server_count > 1 and proc is not None and proc.frontend_conns:
            assert self.port is not None
            self.group = FrontendGroup(self.config, proc, self.port, self._snapshot, frontend_main)
            self.group.on_death = self._engine_died
            st.frontends = self.group

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` once bound."""
        return f"http://{_url_host(self.config.host)}:{self.port}"

    def request_stop(self) -> None:
        """Begin the graceful shutdown (thread-safe)."""
        if self._aloop is not None and self._stop is not None:
            self._aloop.call_soon_threadsafe(self._stop.set)

    async def run(self, install_signals: bool = True) -> int:
        """Serve until stopped; returns the exit code (0, or 1 when binding or start-up
        failed)."""
        cfg, st = self.config, self.state
        self._aloop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if not is_loopback(cfg.host):
            _log.warning(
                "binding %s: the FlashRec server has no authentication; anyone who can reach "
                "this address can send requests. Keep it on 127.0.0.1 or behind a trusted proxy.",
                cfg.host,
            )
        if self.member is not None:  # a spawned front end: set up whole before it listens
            st.gc = GcWatch().install(cfg.gc_gen0_threshold)
            if cfg.gc_freeze:
                _freeze_startup(st.gc)
        try:
            site = await start_site(
                self.app, cfg.host, self.bind_port, reuse_port=cfg.api_server_count > 1
            )
        except OSError as exc:
            _log.error("cannot listen on %s:%s: %s", cfg.host, self.bind_port, exc)
            self.state.backend.close()
            return 1
        self.port = site.port
        try:
            code = await self._serve(install_signals)
        finally:  # a failure after the bind still drains, stops the engine and frees the port
            await self._shutdown(site)
        return code or self.exit_code

    async def _serve(self, install_signals: bool) -> int:
        """From the bind to the stop: announce, start the engine (or join front end 0),
        wait; 1 when start-up failed."""
        cfg, st = self.config, self.state
        if self.member is None:
            print(URL_LINE.format(host=_url_host(cfg.host), port=self.port), flush=True)
        self._join_frontends()
        self.bound.set()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    self._aloop.add_signal_handler(sig, self._stop.set)
        if st.gc is None:
            st.gc = GcWatch().install(cfg.gc_gen0_threshold)
        self.engine.add_step_hook(st.gc.report_slow)  # logged outside any collection
        if self.member is not None:
            starting = asyncio.ensure_future(start_member(st, self.member))
        else:
            starting = asyncio.ensure_future(start_engine(st, cfg.warmup, self.group))
        stopping = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if starting.done() and starting.exception() is not None:
                exc = starting.exception()
                _log.error("start-up failed: %s", exc, exc_info=exc)
                return 1
            await stopping
            return 0
        finally:
            if not starting.done():
                starting.cancel()
            stopping.cancel()

    async def _shutdown(self, site: Site) -> None:
        st = self.state
        be = st.backend
        _log.info("shutting down: draining for up to %.1f s", self.config.shutdown_timeout_s)
        try:
            # not closed here: a kept-alive client may be sending on it; it gets 503 and a close
            be.draining = True
            if self.group is not None:  # the other front ends drain at the same time
                self.group.request_stop()
            if not await drain(st, self.config.shutdown_timeout_s):
                held = list(st.held)
                _log.warning(
                    "shutdown timeout: %d request(s) did not finish; cancelling", len(held)
                )
                st.closing = True
                for task in held:
                    task.cancel()  # each answers 503 and withdraws its engine request
                deadline = time.monotonic() + 2.0
                while be.active_handlers and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            if self.group is not None:  # their requests need the engine until they are done
                grace = self.config.shutdown_timeout_s + CLOSE_GRACE_S + 10.0
                await asyncio.to_thread(self.group.join, grace)
            if self.member is None:
                await asyncio.to_thread(st.profiler.shutdown)
        finally:  # whatever failed above, the port is freed and the engine stopped
            try:
                await site.cleanup()
            finally:
                await asyncio.to_thread(self.engine.stop)
                be.close()
                if st.gc is not None:
                    st.gc.uninstall()
                if self.config.gc_freeze:  # an in-process server leaves the process as found
                    gc.unfreeze()
                    if st.gc is not None:
                        st.gc.frozen = 0
        _log.info("stopped")


def serve(
    engine: ServedEngine,
    config: ServerConfig,
    process: EngineClient | None = None,
    member: Member | None = None,
    port: int | None = None,
) -> int:
    """Serve ``engine`` on this (main) thread until SIGTERM / SIGINT, on the event loop
    ``--event-loop`` names (``process``, ``member``, ``port``: see ``Server``)."""
    server = Server(engine, config, process, member, port)
    kind = config.resolved_event_loop
    _log.info("event loop: %s", kind)
    if kind == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(server.run())
    return asyncio.run(server.run())


def run_server(config: ServerConfig) -> int:
    """Build the engine from ``config`` (in a process of its own with ``--engine-process``)
    and serve; returns the exit code."""
    problem = preflight(config)
    if problem is not None:  # before anything loads: a model load may take minutes
        _log.error("%s", problem)
        return 1
    # the engine thread releases the GIL at every blocking CUDA call; a thread building a
    # response or parsing a request may then hold it up to this long before handing it back
    sys.setswitchinterval(config.gil_switch_interval_ms / 1000.0)
    if config.resolved_engine_process:
        from flashrec.server.engine_process import EngineProcessError, start_engine_process

        try:
            remote = start_engine_process(config)
        except EngineProcessError as exc:
            _log.error("%s", exc)
            return 1
        return serve(remote, config, process=remote.proc)
    from flashrec.engine.engine import Engine
    from flashrec.engine.loop import EngineLoop

    return serve(EngineLoop(Engine(config)), config)


def preflight(config: ServerConfig) -> str | None:
    """Why the server cannot start, found before the model loads (None: nothing found): the
    port is in use, or the checkpoint or catalog is not a regular file (a FIFO would hang the
    load, a device flood it) or is over ``--max-catalog-bytes``."""
    try:
        check_port(config.host, config.port, reuse_port=config.api_server_count > 1)
    except OSError as exc:
        return f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}"
    try:
        boundedread.check_checkpoint(config.model_path)
        for _, path in config.catalog_specs:
            boundedread.check_file(path, "catalog", config.max_catalog_bytes)
    except boundedread.FileLimitError as exc:
        return str(exc)
    return None


def frontend_main(
    index: int,
    conn: Connection,
    ctl: Connection,
    config: ServerConfig,
    info: Ready,
    port: int,
    log_level: int,
) -> None:
    """Entry point of front end ``index`` of ``--api-server-count`` (a ``multiprocessing``
    spawn target, see ``frontends``): serve ``port`` over the engine pipe ``conn`` until front
    end 0 (control pipe ``ctl``) or a signal says stop; exits with the server's code."""
    logging.basicConfig(
        level=log_level,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s %(name)s[frontend-{index}]: %(message)s",
    )
    from flashrec.server.engine_process import EngineClient, RemoteEngine

    sys.setswitchinterval(config.gil_switch_interval_ms / 1000.0)
    member = Member(index, ctl).start()
    client = EngineClient(config, conn)
    client.load_tokenizers()
    client.connect(info)
    sys.exit(serve(RemoteEngine(client), config, process=client, member=member, port=port))


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    """Every ``ServerConfig`` field as a flag (``flashrec serve --help``)."""
    add_config_args(parser, ServerConfig)


def serve_main(args: argparse.Namespace) -> int:
    """Entry point of ``flashrec serve`` / ``flashrec --serve``."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO,
            stream=sys.stderr,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    from flashrec.parentwatch import watch_from_env

    watch_from_env()  # a launcher that passed a watch fd: this server dies with it
    config = config_from_args(ServerConfig, args)
    if not config.model_path:
        print("flashrec serve: --model-path is required", file=sys.stderr)
        return 2
    return run_server(config)
