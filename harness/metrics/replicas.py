"""The prefix cache and the requests each server saw over a measured round, from FlashRec's
``/metrics``: a direct server's, or every replica's behind a router.

Round metrics (summed over the replicas, so a routed cell and a direct one read alike):

```
server_radix_hit_rate              = hit tokens / prompt tokens     (the radix prefix cache)
server_prefill_tokens_per_request  = (prompt tokens - hit tokens) / requests served
```

from ``flashrec_prefix_cache_hit_tokens_total``, ``flashrec_prompt_tokens_total`` and the
successful ``flashrec_requests_total``. Per replica, the same counts summed over the measured
rounds go to the cell's ``server.replicas`` (requests served, radix hit rate, prefill tokens
per request): how the router spread the load and how much of each user's history it found
cached. A server without these families (another engine) gives none.
"""

from __future__ import annotations

import asyncio

import aiohttp

from harness.metrics.server import scrape

HIT = "flashrec_prefix_cache_hit_tokens_total"
PROMPT = "flashrec_prompt_tokens_total"
REQUESTS = "flashrec_requests_total"
SERVED = 'outcome="success"'


async def scrape_all(session: aiohttp.ClientSession, urls: list[str]) -> list[dict | None]:
    """Every URL's ``/metrics`` samples (None for one that has none), at once."""
    return list(await asyncio.gather(*(scrape(session, u) for u in urls)))


def counts(samples: dict[str, float] | None) -> dict[str, float] | None:
    """``{requests, prompt_tokens, hit_tokens}`` of one scrape (None without the families)."""
    if not samples or HIT not in samples or PROMPT not in samples:
        return None
    served = [v for k, v in samples.items() if k.startswith(REQUESTS + "{") and SERVED in k]
    return {"requests": sum(served), "prompt_tokens": samples[PROMPT], "hit_tokens": samples[HIT]}


def deltas(before: list, after: list) -> list[dict[str, float] | None]:
    """Each server's counts over the round (None where a scrape lacks them)."""
    out: list[dict[str, float] | None] = []
    for b, a in zip(before, after):
        cb, ca = counts(b), counts(a)
        out.append(None if cb is None or ca is None else {k: ca[k] - cb[k] for k in ca})
    return out


def derived(c: dict[str, float]) -> dict[str, float]:
    """Radix hit rate and prefill tokens per request of summed counts ({} where undefined)."""
    out = {}
    if c["prompt_tokens"] > 0:
        out["radix_hit_rate"] = c["hit_tokens"] / c["prompt_tokens"]
    if c["requests"] > 0:
        out["prefill_tokens_per_request"] = (c["prompt_tokens"] - c["hit_tokens"]) / c["requests"]
    return out


def cache_metrics(per_server: list[dict[str, float] | None]) -> dict[str, float]:
    """The round's ``server_radix_hit_rate`` and ``server_prefill_tokens_per_request`` over
    every server ({} when one of them has no counts)."""
    if not per_server or any(c is None for c in per_server):
        return {}
    total = {
        k: sum(c[k] for c in per_server if c) for k in ("requests", "prompt_tokens", "hit_tokens")
    }
    return {f"server_{k}": v for k, v in derived(total).items()}


def accumulate(rows: list[dict] | None, urls: list[str], per_server: list) -> list[dict]:
    """``rows`` (one per replica, as returned before) with a round's counts added."""
    rows = (
        [dict(r) for r in rows] if rows else [{"replica": i, "url": u} for i, u in enumerate(urls)]
    )
    for row, c in zip(rows, per_server):
        if c is None or "requests" not in c:
            continue
        for k in ("requests", "prompt_tokens", "hit_tokens"):
            row[k] = int(row.get(k, 0) + c[k])
        row.update(derived({k: row[k] for k in ("requests", "prompt_tokens", "hit_tokens")}))
    return rows
