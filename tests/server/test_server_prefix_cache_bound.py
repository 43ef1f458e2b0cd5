"""The radix prefix cache under many distinct prompts stays within ``--prefix-cache-max-nodes``.

Distinct short prompts (a counter in the user message) once added a cache node each until the
whole KV pool was cached: the server's memory grew with every new prompt. Both engine modes
(in process, ``--engine-process``) are driven over HTTP; ``/metrics`` reports the node count,
and every pool slot the cache gives back is free again once the server is idle.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from server_helpers import ServerThread, process_server, real_server

CAP = 24
REQUESTS = 4 * CAP


def _chat(content: str) -> dict:
    return {"messages": [{"role": "user", "content": content}], "n": 2}


@pytest.mark.parametrize("make", [real_server, process_server], ids=["in-process", "process"])
def test_distinct_prompts_stay_under_the_node_cap(
    tiny_checkpoint: Path, make: Callable[..., ServerThread]
) -> None:
    with make(tiny_checkpoint, prefix_cache_max_nodes=CAP) as srv:

        def one(i: int) -> int:
            r = srv.post("/v1/chat/completions", _chat(f"soak prompt number {i}"))
            assert r.status_code == 200, r.text
            return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(one, range(REQUESTS)))
        m = srv.wait_engine_idle()
        assert m["flashrec_running_requests"] == 0
        assert 0 < m["flashrec_prefix_cache_nodes"] <= CAP
        # every slot is either cached or free: nothing trimmed was lost from the pool
        assert m["flashrec_kv_tokens_used"] == 0
        assert 0 < m["flashrec_kv_tokens_cached"] < m["flashrec_kv_tokens_total"]
        # the cache still serves: the latest prompt is reused, the template prefix always
        assert one(REQUESTS - 1) > one(10**6)


def test_unbounded_with_zero_cap_is_the_pool(tiny_checkpoint: Path) -> None:
    """``--prefix-cache-max-nodes 0`` leaves the KV pool as the only bound: the distinct
    prompts all stay cached (the behaviour the cap replaces, kept as an explicit choice)."""
    with real_server(tiny_checkpoint, prefix_cache_max_nodes=0) as srv:
        for i in range(CAP + 8):
            assert srv.post("/v1/chat/completions", _chat(f"soak prompt number {i}")).ok
        assert srv.wait_engine_idle()["flashrec_prefix_cache_nodes"] > CAP
