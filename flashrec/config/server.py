"""``ServerConfig``: the engine configuration plus the HTTP front end."""

from __future__ import annotations

from dataclasses import dataclass

from flashrec.config.engine import EngineConfig
from flashrec.config.flags import check_choice, opt, uvloop_installed

# a prompt of at most this many characters, arriving while no other request is being handled,
# is built on the event loop (FLASHREC_PROMPT_INLINE=idle, the default; off: always a thread)
INLINE_PROMPT_CHARS = 1 << 15


@dataclass(frozen=True)
class ServerConfig(EngineConfig):
    """Engine configuration plus the HTTP front end."""

    host: str = opt(
        "127.0.0.1", "bind address (the server has no authentication: keep it on loopback)"
    )
    port: int = opt(8000, "bind port (0 = pick a free one and print it)")
    served_model_name: str | None = opt(
        None, "model name reported by /v1/models (default: the directory name)"
    )
    max_body_bytes: int = opt(8 * 1024 * 1024, "largest accepted request body (413 above)")
    shutdown_timeout_s: float = opt(
        30.0, "on SIGTERM, how long in-flight requests may take to finish"
    )
    # slow clients: a connection may not hold the server longer than these (0 = no limit)
    header_timeout_s: float = opt(
        10.0,
        "a request's headers must be complete this many seconds after its first byte (after "
        "the connection opens, for its first request); else 408 and the connection is closed",
    )
    body_timeout_s: float = opt(
        30.0,
        "a request's body must arrive whole this many seconds after its headers; else 408 and "
        "the connection is closed",
    )
    max_connections: int = opt(
        0,
        "open client connections each front-end process keeps; one more is answered 503 and "
        "closed. 0 = auto: the open-file limit (ulimit -n) less the descriptors the process "
        "holds at start and a reserve of 64",
    )
    warmup: bool = opt(True, "run warm-up requests before /health reports ok")
    gc_freeze: bool = opt(
        True,
        "after warm-up, move every live object to Python's permanent GC generation (gc.freeze): "
        "full collections, which stop the engine thread too, then walk only what requests "
        "allocated",
    )
    gc_gen0_threshold: int = opt(
        0,
        "allocations between generation-0 garbage collections in every server process "
        "(gc.set_threshold); 0 keeps Python's (700). Higher: fewer collections, each walking "
        "more objects, fewer objects walked in all",
    )
    tokenizer_workers: int = opt(
        4,
        "threads that build prompts (chat template + tokenization) in parallel, each with its "
        "own tokenizer copy; 1 = one thread over the engine's tokenizer; a prompt of at most "
        f"{INLINE_PROMPT_CHARS:,} characters whose request is the only one being handled is "
        "built on the event loop instead (FLASHREC_PROMPT_INLINE=off keeps it on a thread)",
    )
    respond_workers: int = opt(
        0,
        "processes that build the JSON bodies of wide answers (at least 64 beams, not streamed) "
        "in parallel, off the event loop; 0 = on the event loop",
    )
    gil_switch_interval_ms: float = opt(
        0.2,
        "sys.setswitchinterval of the server process, in ms: how long the HTTP / tokenizer "
        "threads may hold the GIL while the engine thread waits for it (Python's default is 5)",
    )
    engine_process: str = opt(
        "auto",
        "run the engine (scheduler, model, profiler) in a process of its own, so that HTTP, "
        "tokenization and response text never hold its GIL: on, off, or auto (on with CUDA or "
        "with --api-server-count > 1)",
        ("auto", "on", "off"),
    )
    api_server_count: int = opt(
        1,
        "HTTP front-end processes sharing the port (SO_REUSEPORT spreads connections over them), "
        "each with its own event loop, GIL and tokenizers, all feeding the one engine process: "
        "for short prompts at high request rates, where one process's GIL is the limit",
    )
    event_loop: str = opt(
        "asyncio",
        "the server's event loop: asyncio (the standard library's), uvloop (pip install "
        "'flashrec[fast]'; measured level with asyncio here), or auto (uvloop where installed)",
        ("auto", "uvloop", "asyncio"),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.tokenizer_workers <= 64:
            raise ValueError(f"--tokenizer-workers must be in 1..64, got {self.tokenizer_workers}")
        if not 0 <= self.respond_workers <= 64:
            raise ValueError(f"--respond-workers must be in 0..64, got {self.respond_workers}")
        if not 0 <= self.gc_gen0_threshold <= 10_000_000:
            raise ValueError(
                f"--gc-gen0-threshold must be in 0..10000000, got {self.gc_gen0_threshold}"
            )
        if self.max_connections < 0:
            raise ValueError(f"--max-connections must be >= 0, got {self.max_connections}")
        for name in ("header_timeout_s", "body_timeout_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
        if not 0.01 <= self.gil_switch_interval_ms <= 100:
            raise ValueError(
                f"--gil-switch-interval-ms must be in 0.01..100, got {self.gil_switch_interval_ms}"
            )

        for name in ("engine_process", "event_loop"):
            check_choice(self, name)
        if not 1 <= self.api_server_count <= 64:
            raise ValueError(f"--api-server-count must be in 1..64, got {self.api_server_count}")
        if self.api_server_count > 1 and self.engine_process == "off":
            raise ValueError(
                "--api-server-count > 1 feeds one engine process from several front ends: it "
                "cannot be combined with --engine-process off"
            )
        if self.event_loop == "uvloop" and not uvloop_installed():
            raise ValueError(
                "--event-loop uvloop: uvloop is not installed (pip install 'flashrec[fast]'), "
                "or use --event-loop asyncio / auto"
            )

    @property
    def resolved_event_loop(self) -> str:
        """``uvloop`` or ``asyncio`` (``--event-loop``; auto: uvloop where installed)."""
        if self.event_loop == "auto":
            return "uvloop" if uvloop_installed() else "asyncio"
        return self.event_loop

    @property
    def resolved_engine_process(self) -> bool:
        """Whether the engine runs in a process of its own (``--engine-process``; auto: with
        CUDA, or with several front ends)."""
        if self.engine_process == "auto":
            return self.resolved_device == "cuda" or self.api_server_count > 1
        return self.engine_process == "on"
