"""FLASHREC_TOP_N: the top-n by torch.topk over order_keys selects what one stable descending
sort selects (same rows, same order, ties to the lower index), in the search, the static step
and the engine; a bad value fails at import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashrec.beam import search
from flashrec.beam.search import expand, order_keys, top_n
from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine

# values with many ties, both zeros, both infinities
VALUES = (float("-inf"), -3.5, -1.0, -0.5, -0.0, 0.0, 0.25, 1.0, float("inf"))


def _tied(b: int, m: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(VALUES), (b, m), generator=g)
    return torch.tensor(VALUES)[picks]


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 4), m=st.integers(1, 300), seed=st.integers(0, 10_000))
def test_order_keys_rank_as_the_stable_descending_sort(b, m, seed):
    x = _tied(b, m, seed)
    x[:, ::7] += torch.randn(b, len(range(0, m, 7)), generator=torch.Generator().manual_seed(seed))
    keys = order_keys(x)
    assert keys.dtype == torch.int64 and keys.shape == x.shape
    assert all(len(set(row.tolist())) == m for row in keys)  # no two keys tie
    want = torch.sort(x, dim=1, descending=True, stable=True).indices
    assert torch.equal(torch.sort(keys, dim=1, descending=True).indices, want)


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 4), m=st.integers(1, 40), f=st.integers(1, 12), n=st.integers(1, 64),
    seed=st.integers(0, 10_000), keyed=st.booleans(),
)  # fmt: skip
def test_topk_selects_what_the_sort_selects(b, m, f, n, seed, keyed):
    total = _tied(b, m * f, seed)
    codes = torch.arange(b * m * f).view(b, m * f) % f
    nodes = torch.arange(b * m * f).view(b, m * f) * 3
    key = _tied(b, m * f, seed + 1) if keyed else None
    a = top_n(total, codes, nodes, n, f, key, method="sort")
    t = top_n(total, codes, nodes, n, f, key, method="topk")
    assert a.parents.shape == (b, min(n, m * f))
    for x, y in zip((a.parents, a.codes, a.nodes, a.cum), (t.parents, t.codes, t.nodes, t.cum)):
        assert torch.equal(x, y)


def test_the_knob_reaches_expand_and_sampling(monkeypatch):
    g = torch.Generator().manual_seed(5)
    cum = torch.randn(2, 6, generator=g).round()  # ties among parents
    lp = torch.log_softmax(torch.randn(2, 6, 10, generator=g).round(), -1)
    codes = torch.arange(10).repeat(2, 6, 1)
    valid = torch.rand(2, 6, 10, generator=g) > 0.3
    seeds = torch.tensor([11, 12])
    runs = {}
    for method in ("sort", "topk"):
        monkeypatch.setattr(search, "TOP_N", method)
        runs[method] = [
            expand(cum, lp, codes, codes, valid, 8),
            expand(cum, lp, codes, codes, valid, 80),  # more than m * F: dead padding
            expand(cum, lp, codes, codes, valid, 8, temperature=0.7, seeds=seeds, level=1),
        ]
    for a, t in zip(runs["sort"], runs["topk"]):
        assert torch.equal(a.parents, t.parents) and torch.equal(a.codes, t.codes)
        assert torch.equal(a.cum, t.cum)


def test_a_bad_value_fails_at_import_with_the_choices():
    out = subprocess.run(
        [sys.executable, "-c", "import flashrec.beam.search"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "FLASHREC_TOP_N": "radix"},
    )  # fmt: skip
    assert out.returncode != 0
    assert "FLASHREC_TOP_N must be sort or topk, got 'radix'" in out.stderr


def _beams(model_dir, device: str, step_graph: bool) -> list:
    extra = {"cuda_graph_max_bs": 256, "attention_backend": "triton"} if device == "cuda" else {}
    eng = Engine(
        EngineConfig(
            model_path=str(model_dir), sid_vocab_file=str(model_dir / "catalog.json"),
            device=device, beam_width=32, batch_slots=256, enable_prefix_cache=False,
            enable_step_graph=step_graph, **extra,
        )
    )  # fmt: skip
    reqs = [
        eng.new_request(eng.build_prompt(messages=[{"role": "user", "content": f"u{i}"}]), n=n)
        for i, n in enumerate((32, 32, 32))
    ]
    return [[(b.token_ids, b.cum_logprob) for b in r.beams] for r in eng.generate(reqs)]


@pytest.fixture(scope="module")
def model_dir(synth_model):
    return synth_model("tiny", catalog_size=3000)


@pytest.mark.parametrize("step_graph", [False, True])
def test_engine_answers_are_the_same_either_way(model_dir, monkeypatch, step_graph):
    monkeypatch.setattr(search, "TOP_N", "sort")
    want = _beams(model_dir, "cpu", step_graph)
    monkeypatch.setattr(search, "TOP_N", "topk")
    assert _beams(model_dir, "cpu", step_graph) == want


@pytest.mark.gpu
def test_gpu_topk_equals_sort_at_the_target_shapes_and_in_the_step_graph(model_dir, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    # (requests, beams x fan-out): p=1,000 (1 x 256 beams), n=50 c=32, n=512 c=8
    for b, m, n in ((1, 256 * 200, 256), (32, 50 * 200, 50), (8, 512 * 200, 512)):
        g = torch.Generator(device="cuda").manual_seed(b)
        total = (torch.randn(b, m, device="cuda", generator=g) * 4).round() / 4  # ties
        total[torch.rand(b, m, device="cuda", generator=g) < 0.3] = float("-inf")
        idx = torch.arange(b * m, device="cuda").view(b, m)
        a = top_n(total, idx, idx, n, 200, method="sort")
        t = top_n(total, idx, idx, n, 200, method="topk")
        assert torch.equal(a.parents, t.parents) and torch.equal(a.cum, t.cum)
    monkeypatch.setattr(search, "TOP_N", "sort")
    want = _beams(model_dir, "cuda", True)
    monkeypatch.setattr(search, "TOP_N", "topk")
    assert _beams(model_dir, "cuda", True) == want


def test_the_probe_runs_on_cpu_and_refuses_a_bad_shape():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = root / "scripts" / "probes" / "topn_probe.py"

    def run(*args):
        return subprocess.run(
            [sys.executable, str(script), *args], cwd=root, capture_output=True, text=True,
            timeout=120, env={**os.environ, "PYTHONPATH": str(root), "CUDA_VISIBLE_DEVICES": ""},
        )  # fmt: skip

    out = run()
    assert out.returncode == 0, out.stderr
    rows = [ln for ln in out.stdout.splitlines() if " candidates): sort " in ln]
    assert len(rows) == 1 and rows[0].endswith("same=True")
    bad = run("--shapes", "1x0")
    assert bad.returncode == 2 and "is not BxN" in bad.stderr
