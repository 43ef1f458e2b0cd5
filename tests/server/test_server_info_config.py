"""``/get_server_info``'s ``config`` shows every flag with the value the server runs with:
flags left unset or ``auto`` (device, dtype, attention backend, KV pool, graphs, engine
process, port 0, ...) as they resolved at start-up, equal to what the engine reports, and
``config_requested`` keeps what was asked for those. Against real started servers, the
engine in the server process and in a process of its own."""

from __future__ import annotations

from pathlib import Path

from server_helpers import ServerThread, process_server, real_server

# flags whose default is unset / auto and that resolve at start-up
RESOLVED = (
    "device",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "attention_backend",
    "decode_prompt_attention",
    "batch_slots",
    "kv_pool_tokens",
    "enable_step_graph",
    "overlap_results",
    "prefill_graph_max_tokens",
    "piecewise_prefill_max_tokens",
    "sid",
    "served_model_name",
    "engine_process",
    "event_loop",
    "packed_base",
)
UNSET = dict(
    device=None,
    dtype=None,
    batch_slots=None,
    kv_pool_tokens=None,
    attention_backend=None,
    event_loop="auto",
)


def _check(srv: ServerThread, engine_process: str) -> None:
    info = srv.get("/get_server_info").json()
    cfg, asked, eng = info["config"], info["config_requested"], info["engine"]
    unresolved = [k for k in RESOLVED if cfg[k] in (None, "auto")]
    assert not unresolved, {k: cfg[k] for k in unresolved}
    # the values the engine decided, as the engine reports them
    assert cfg["device"] == eng["device"] == "cpu"
    assert cfg["dtype"] == "float32" and eng["dtype"] == "torch.float32"
    assert cfg["kv_cache_dtype"] == "float32"
    assert cfg["quantization"] == "none" and eng["fp8"] is False
    assert cfg["attention_backend"] == eng["attention_backend"] == "torch"
    assert cfg["decode_prompt_attention"] == eng["decode_prompt_attention"]
    assert cfg["batch_slots"] == eng["batch_slots"] == info["limits"]["max_beam_rows"]
    assert cfg["kv_pool_tokens"] == eng["kv_pool_tokens"] > 0
    eff = eng["effective"]
    assert cfg["enable_step_graph"] is eff["step_graph"] is False
    assert cfg["overlap_results"] is eff["overlap_results"] is False
    assert cfg["prefill_graph_max_tokens"] == eff["prefill_graph_max_tokens"] == 0
    assert cfg["piecewise_prefill_max_tokens"] == eff["piecewise_prefill_max_tokens"] == 0
    assert cfg["sid"] == info["sid_layout"]["sid"]
    assert cfg["served_model_name"] == info["served_model_name"]
    assert cfg["engine_process"] == engine_process
    # the loop the server runs on, not "auto" (which one depends on how the test started it)
    assert cfg["event_loop"] == info["event_loop"] in ("asyncio", "uvloop")
    assert cfg["port"] == srv.server.port > 0
    assert cfg["packed_base"] == 8192  # RecIF's, the default base of packed catalog keys
    # what was asked stays visible where it differs
    for key, value in {
        **UNSET,
        "port": 0,
        "sid": None,
        "kv_cache_dtype": "auto",
        "packed_base": None,
    }.items():
        assert asked[key] == value, key
    assert set(asked) <= set(cfg)
    assert all(cfg[k] != v for k, v in asked.items())
    assert "model_path" not in asked  # a flag given as it runs is not repeated


def test_unset_flags_show_their_resolved_values(tiny_checkpoint: Path) -> None:
    with real_server(tiny_checkpoint, **UNSET) as srv:
        _check(srv, "off")


def test_unset_flags_show_their_resolved_values_with_an_engine_process(
    tiny_checkpoint: Path,
) -> None:
    with process_server(tiny_checkpoint, **UNSET) as srv:
        _check(srv, "on")
