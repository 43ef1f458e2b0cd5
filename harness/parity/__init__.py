"""Parity: the beams of a candidate server against a reference, per prompt, n and protocol.

    reference URL ─┐                       ┌─ exact ranked match, top-1 agreement,
                   ├─ same prompts, n ─────┤  beam-set overlap, Spearman on shared beams,
    candidate URL ─┘  (chat | /generate)   └─ max |score diff| on shared beams -> thresholds

Protocol-agnostic: each server's protocols come from ``/get_server_info`` (``protocols``) or a
probe that counts a protocol only when it answers scored beams (upstream SGLang's chat answers
n samples: /generate only); ``SGLANG_BEAM_PROTOCOL=chat|generate`` forces one. Beams are
identified by their token ids (FlashRec's chat ``sglext.token_ids``; SGLang's
``beam_results[i].output_ids``), or by their text when a server returns no ids. Thresholds depend on the precision (:data:`THRESHOLDS`); a failure carries a
per-prompt diff table (:func:`diff_table`). :func:`run_parity_stage` is the matrix stage.

    compare.py     thresholds, per-case metrics, evaluation, diff tables (no network)
    fetch.py       beam requests per protocol, protocol detection, prompts, the case loops
    servers.py     launched or given servers (a pair, or one at a time)
    stage.py       the matrix's ``parity:`` stage (``harness.run.stages``), parity.json
    candidates.py  the ``candidates:`` form: its checks, the candidate x n table, no_worse_than
    multi.py       several candidates against one reference (``reference_dtype``)
"""

from __future__ import annotations

from harness.parity.compare import (
    PRECISION_ARGS,
    THRESHOLDS,
    Beam,
    Case,
    Thresholds,
    compare_beams,
    diff_table,
    evaluate,
    failure_text,
    parity_result,
    precision_args,
    spearman,
    summarise,
    thresholds_for,
)
from harness.parity.fetch import (
    CHAT_NOT_BEAMS,
    FETCH_ERRORS,
    PROTOCOL_ENV,
    PROTOCOLS,
    ParityPrompt,
    body_for,
    builtin_text,
    compare_servers,
    default_max_tokens,
    detect_protocols,
    fetch_beams,
    make_prompts,
    no_shared_protocol,
    parse_beams,
    post,
    request_for,
)
from harness.parity.servers import one_server, serving
from harness.parity.stage import compact, engine_device, run_parity_stage

__all__ = [
    "CHAT_NOT_BEAMS",
    "FETCH_ERRORS",
    "PRECISION_ARGS",
    "PROTOCOLS",
    "PROTOCOL_ENV",
    "THRESHOLDS",
    "Beam",
    "Case",
    "ParityPrompt",
    "Thresholds",
    "body_for",
    "builtin_text",
    "compact",
    "compare_beams",
    "compare_servers",
    "default_max_tokens",
    "detect_protocols",
    "diff_table",
    "engine_device",
    "evaluate",
    "failure_text",
    "fetch_beams",
    "make_prompts",
    "no_shared_protocol",
    "one_server",
    "parity_result",
    "parse_beams",
    "post",
    "precision_args",
    "request_for",
    "run_parity_stage",
    "serving",
    "spearman",
    "summarise",
    "thresholds_for",
]
