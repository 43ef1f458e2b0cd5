"""--enable-prefill-last-rows (default on): a prefill runs its last layer's o_proj, norm and MLP
on each prompt's last token only (the rows the level-0 logits read); every token still gets
its K/V in every layer. Results equal the whole-layer prefill within rounding, through the
eager forward, the piecewise pieces and the whole-forward prefill graph (CPU: padded, eager)."""

from __future__ import annotations

import pytest
from prefill_helpers import make_engine, make_prompts, same_results

from flashrec.engine.piecewise import MAX_SEQS


def _mlp_rows(eng) -> list[tuple[str, int]]:
    """(layer, rows) of every MLP call of the first and the last layer, in order."""
    seen: list[tuple[str, int]] = []
    layers = eng.runner.model.layers
    for name, layer in (("first", layers[0]), ("last", layers[-1])):
        layer.mlp.register_forward_hook(
            lambda _m, args, _out, name=name: seen.append((name, args[0].shape[0]))
        )
    return seen


@pytest.mark.parametrize(
    "path",
    [
        {},  # the plain eager forward
        {"piecewise_prefill_max_tokens": 1024},
        {"prefill_graph_max_tokens": 512},
    ],
    ids=["eager", "piecewise", "prefill-graph"],
)
def test_last_layer_runs_on_the_last_tokens_with_the_same_results(tiny_model, path):
    whole = make_engine(
        tiny_model, enable_prefix_cache=False, enable_prefill_last_rows=False, **path
    )
    rows = make_engine(tiny_model, enable_prefix_cache=False, **path)
    assert rows.config.enable_prefill_last_rows  # the default
    seen_whole, seen_rows = _mlp_rows(whole), _mlp_rows(rows)
    prompts = make_prompts(rows, (3, 20, 40))
    group = prompts if "prefill_graph_max_tokens" not in path else prompts[1:2]  # graph: alone
    n_tok = sum(len(p) for p in group)
    a = whole.generate([whole.new_request(p, n=8) for p in group])
    b = rows.generate([rows.new_request(p, n=8) for p in group])
    same_results(a, b)
    # the prefill is the first forward: its first layer runs every token (padded to the
    # bucket in the graph paths) in both engines; the last layer only the last tokens
    (_, first_w), (_, last_w) = seen_whole[:2]
    (_, first_r), (_, last_r) = seen_rows[:2]
    assert first_w == first_r >= n_tok
    assert last_w == first_w
    expect = {"piecewise_prefill_max_tokens": MAX_SEQS, "prefill_graph_max_tokens": 1}
    assert last_r == next((v for k, v in expect.items() if k in path), len(group))
    # decode forwards are untouched: every beam row through the last layer
    assert [r for name, r in seen_rows[2:] if name == "last"] == [
        r for name, r in seen_rows[2:] if name == "first"
    ]


def test_cached_prefix_prefill_selects_the_new_last_tokens(tiny_model):
    """A warm radix hit prefills only the new tokens; the last layer still takes the one last
    row per prompt and the beams equal the whole-layer engine's."""
    whole = make_engine(tiny_model, enable_prefill_last_rows=False)
    rows = make_engine(tiny_model)
    prompts = make_prompts(rows, (40, 90))
    ext = prompts[1] + prompts[0][5:40]
    for eng in (whole, rows):
        eng.generate([eng.new_request(prompts[1], n=8)])  # warm the cache
    seen = _mlp_rows(rows)
    a = whole.generate([whole.new_request(p, n=8) for p in (ext, prompts[0])])
    b = rows.generate([rows.new_request(p, n=8) for p in (ext, prompts[0])])
    same_results(a, b)
    assert b[0].cached_tokens > 0
    assert seen[1] == ("last", 2)
