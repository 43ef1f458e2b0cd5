"""harness.load.users: a workload whose users' histories grow (workload.users)."""

from __future__ import annotations

import json

import pytest

from harness.load.users import new_item, user_order
from harness.load.workload import build_prompts
from harness.spec.cells import expand_cells
from harness.spec.matrix import SpecError, parse_spec


def prompts(**wl):
    spec, _ = parse_spec(
        json.dumps({"engine": {"kind": "external", "url": "http://x"}, "workload": wl})
    )
    return build_prompts(spec.workload, expand_cells(spec)[0].client, 3)


def history(p) -> str:
    return p.messages[-1]["content"]


@pytest.mark.parametrize("kind", ["synthetic", "lorem"])
def test_each_request_is_the_users_previous_history_plus_k_items(kind):
    users, k = 3, 2
    got = prompts(kind=kind, users=users, user_items=k, requests=9, warmup_requests=3,
                  median_tokens=40, system_prompt_tokens=8, seed=5)  # fmt: skip
    measured = got.measured
    assert len(measured) == 9 and len(got.warmup) == 3
    systems = {p.messages[0]["content"] for p in measured + got.warmup}
    assert len(systems) == 1 and measured[0].messages[0]["role"] == "system"
    bases = []
    for u in range(users):
        mine = [history(p) for p in measured[u::users]]  # round-robin: requests u, u+U, ..
        assert len(mine) == 3
        for n, (prev, cur) in enumerate(zip(mine, mine[1:]), start=1):
            grown = "".join(new_item(5, u, j) for j in range(n * k, (n + 1) * k))
            assert cur == prev + grown  # exactly the previous history and k new items
        # the first request: the user's own base history and its first k items
        first = "".join(new_item(5, u, j) for j in range(k))
        assert mine[0].endswith(first)
        bases.append(mine[0][: -len(first)])
        assert all(h.startswith(bases[-1]) for h in mine)
    assert len(set(bases)) == users  # every user its own history
    # the warm-up users are others: priming never holds a measured user's history
    assert not any(history(w).startswith(b) for w in got.warmup for b in bases)


def test_user_prompts_are_deterministic_from_the_seed():
    a = prompts(users=4, requests=8, warmup_requests=2, median_tokens=30, user_order="random")
    b = prompts(users=4, requests=8, warmup_requests=2, median_tokens=30, user_order="random")
    c = prompts(users=4, requests=8, warmup_requests=2, median_tokens=30, user_order="random",
                seed=1)  # fmt: skip
    assert [p.messages for p in a.measured + a.warmup] == [
        p.messages for p in b.measured + b.warmup
    ]
    assert [p.messages for p in a.measured] != [p.messages for p in c.measured]


def test_user_order():
    assert user_order(7, 3, "round_robin", 0) == [0, 1, 2, 0, 1, 2, 0]
    r = user_order(200, 5, "random", 3)
    assert r == user_order(200, 5, "random", 3) and set(r) == set(range(5))
    assert r != user_order(200, 5, "random", 4)


def test_without_users_the_workload_is_unchanged():
    plain = prompts(kind="lorem", requests=4, warmup_requests=1, median_tokens=30)
    assert all(";" not in history(p) for p in plain.measured)


@pytest.mark.parametrize(
    ("workload", "words"),
    [
        ({"kind": "jsonl", "path": "x.jsonl", "users": 3}, "needs kind 'synthetic' or 'lorem'"),
        ({"users": 0}, "greater than or equal to 1"),
        ({"users": 2, "user_items": 0}, "greater than or equal to 1"),
        ({"users": 2, "user_order": "zigzag"}, "round_robin"),
    ],
)
def test_user_workload_errors(workload, words):
    text = json.dumps({"engine": {"kind": "external", "url": "http://x"}, "workload": workload})
    with pytest.raises(SpecError) as err:
        parse_spec(text, "m.yaml")
    assert "workload" in str(err.value) and words in str(err.value)
