"""Graph health (engine/graph_stats.py): which forwards replayed a CUDA graph, which ran
eagerly and why, captures by kind and size, captures after warm-up; in ``/metrics``
(``flashrec_graph_*``) and ``/get_server_info`` (``engine.graphs``). On CPU nothing is
captured and every forward is eager for ``device_cpu``; the replay side of the runner's
bookkeeping is exercised with a stand-in for the decode graphs, and on a CUDA server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from flashrec.engine.graph_stats import (
    ATTENTION_DECLINED,
    DEVICE_CPU,
    DISABLED,
    OVER_MAX_BATCH,
    OVER_MAX_PROMPTS,
    OVER_MAX_TOKENS,
    REASONS,
    SHAPE_NOT_CAPTURED,
    GraphStats,
    decode_path,
    off_reason,
    prefill_path,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

from server_helpers import process_server, real_engine, real_server  # noqa: E402

EAGER = "flashrec_graph_eager_forwards_total"
REPLAYS = "flashrec_graph_replays_total"
LATE = "flashrec_graph_captures_after_warmup_total"


def _eager(m: dict[str, float], phase: str, reason: str) -> float:
    return m[f'{EAGER}{{phase="{phase}",reason="{reason}"}}']


def _sum(m: dict[str, float], family: str, label: str = "") -> float:
    return sum(v for k, v in m.items() if k.startswith(family + "{") and label in k)


# ---- the choice of path, without a GPU ---------------------------------------------------
def test_decode_path_replays_what_fits_and_names_why_not():
    assert off_reason("cpu") == DEVICE_CPU and off_reason("cuda") == DISABLED
    sizes = [16, 32, 64]
    assert decode_path(sizes, 16, True, DISABLED) == ("decode", None)
    assert decode_path(sizes, 40, True, DISABLED) == ("decode", None)  # padded to 64
    assert decode_path(sizes, 65, False, DISABLED) == ("eager", OVER_MAX_BATCH)
    assert decode_path(sizes, 64, False, DISABLED) == ("eager", ATTENTION_DECLINED)
    assert decode_path([], 4, True, DEVICE_CPU) == ("eager", DEVICE_CPU)
    assert decode_path((), 4, True, DISABLED) == ("eager", DISABLED)


def test_prefill_path_prefers_the_graph_that_takes_the_batch():
    def path(one, many, prompts=1, tokens=100, top=2048, seqs=256, captured=True):
        return prefill_path(one, many, prompts, tokens, top, seqs, captured, DISABLED)

    assert path(True, None) == ("prefill", None)
    assert path(False, True) == ("piecewise", None)
    assert path(True, True, captured=False) == ("eager", DISABLED)  # CPU: padded, eagerly
    assert path(None, None) == ("eager", DISABLED)  # neither kind built
    assert path(False, False, prompts=300, tokens=3000, seqs=256) == ("eager", OVER_MAX_PROMPTS)
    assert path(None, False, prompts=2, tokens=9000, top=8192) == ("eager", OVER_MAX_TOKENS)
    # only the one-prompt graph: a long lone prompt is over its tokens, a batch is a shape
    # it never captured
    assert path(False, None, tokens=3000) == ("eager", OVER_MAX_TOKENS)
    assert path(False, None, prompts=2, tokens=200) == ("eager", SHAPE_NOT_CAPTURED)


def test_stats_count_captures_by_kind_and_size_and_those_after_warm_up():
    g = GraphStats()
    for size in (16, 32):
        g.capture("decode", size)
    g.capture("step", 32)
    g.capture("piecewise", 256)
    g.count("decode", ("decode", None))
    g.count("decode", ("eager", OVER_MAX_BATCH))
    g.count("prefill", ("piecewise", None))
    snap = g.snapshot()
    assert ("decode", 16, 1) in snap["captures"] and ("piecewise", 256, 1) in snap["captures"]
    assert snap["captures_after_warmup"] == dict.fromkeys(snap["replays"], 0)
    assert snap["replays"] == {"decode": 1, "step": 0, "prefill": 0, "piecewise": 1}
    assert ("decode", OVER_MAX_BATCH, 1) in snap["eager"]
    # every reason of every phase is there, 0 until it happens
    assert len(snap["eager"]) == sum(len(r) for r in REASONS.values())
    g.end_warmup()
    g.capture("decode", 16)  # a capture while serving
    info = g.info()
    assert info["captured_sizes"]["decode"] == [16, 32] and info["captured_sizes"]["prefill"] == []
    assert info["captures"] == 5 and info["captures_after_warmup"] == 1 and info["warm"]
    assert g.snapshot()["captures_after_warmup"]["decode"] == 1
    assert ("decode", 16, 2) in g.snapshot()["captures"]
    assert info["replays"]["decode"] == {"decode": 1, "step": 0}
    assert info["eager_forwards"]["decode"][OVER_MAX_BATCH] == 1
    with pytest.raises(KeyError):
        g.eager_forward("decode", "no_such_reason")
    with pytest.raises(KeyError):
        g.capture("no_such_kind", 1)


# ---- a real engine on CPU ----------------------------------------------------------------
def test_cpu_engine_runs_every_forward_eagerly_for_device_cpu(tiny_model):
    eng, _ = real_engine(tiny_model, piecewise_prefill_max_tokens=512)
    stats = eng.runner.graph_stats
    prompt = eng.build_prompt(messages=[{"role": "user", "content": "graphs"}])
    eng.generate([eng.new_request(prompt, n=4), eng.new_request(prompt + [5], n=4)])
    info = stats.info()
    assert info["captures"] == 0 and all(v == [] for v in info["captured_sizes"].values())
    decode, prefill = info["eager_forwards"]["decode"], info["eager_forwards"]["prefill"]
    # tiny: 3 SID levels -> at least 2 decode forwards; the piecewise pieces ran, eagerly
    assert decode[DEVICE_CPU] >= 2 and prefill[DEVICE_CPU] >= 1
    assert sum(decode.values()) == decode[DEVICE_CPU] == eng.runner.decode_forwards["eager"]
    assert sum(prefill.values()) == prefill[DEVICE_CPU]
    assert all(n == 0 for p in info["replays"].values() for n in p.values())
    before = decode[DEVICE_CPU]
    eng.generate([eng.new_request(prompt, n=4)])
    assert stats.info()["eager_forwards"]["decode"][DEVICE_CPU] > before  # grows with requests


class _StandIn:
    """The decode graphs' interface over the eager forward: a CPU stand-in for
    ``DecodeGraphRunner`` captured at ``sizes`` rows (each replay runs the model eagerly)."""

    def __init__(self, runner, sizes: list[int]) -> None:
        self.runner, self.sizes, self.step_sizes, self.pool, self.ran = runner, sizes, [], None, []

    def fits(self, rows: int) -> bool:
        return rows <= self.sizes[-1]

    def bucket(self, rows: int) -> int:
        return next(s for s in self.sizes if s >= rows)

    def has_step(self, rows: int) -> bool:
        return False

    def run(self, input_ids, meta):
        self.ran.append(input_ids.shape[0])
        r = self.runner
        return r.model(input_ids, meta.positions, meta, r.ctx)


def test_runner_replays_batches_that_fit_and_counts_the_rest_by_reason(tiny_model, caplog):
    """The runner's dispatch with decode graphs at 4 and 8 rows: a request of 4 beams
    replays, one of 16 (wider than every graph) runs eagerly for ``over_max_batch``, logged
    once per width; the answers equal a plain eager engine's."""
    plain, _ = real_engine(tiny_model)
    eng, _ = real_engine(tiny_model)
    run = eng.runner
    run.graphs = _StandIn(run, [4, 8])
    prompt = eng.build_prompt(messages=[{"role": "user", "content": "stand-in"}])
    reqs = [(prompt, 4), (prompt + [7], 16)]
    with caplog.at_level("WARNING", logger="flashrec"):
        got = [eng.generate([eng.new_request(p, n=n)])[0] for p, n in reqs]
        eng.generate([eng.new_request(prompt + [7], n=16)])
    want = [plain.generate([plain.new_request(p, n=n)])[0] for p, n in reqs]
    for a, b in zip(got, want):
        assert [x.token_ids for x in a.beams] == [y.token_ids for y in b.beams]
    info = run.graph_stats.info()
    replays, eager = info["replays"]["decode"]["decode"], info["eager_forwards"]["decode"]
    assert replays == len(run.graphs.ran) >= 2 and set(run.graphs.ran) <= {4}
    assert eager[OVER_MAX_BATCH] >= 4 and eager[DEVICE_CPU] == 0  # 2 requests of 16 beams
    assert replays + eager[OVER_MAX_BATCH] == sum(run.decode_forwards.values())
    warned = [r for r in caplog.records if "decode batch of 16 rows runs eagerly" in r.message]
    assert len(warned) == 1


# ---- a real server -----------------------------------------------------------------------
@pytest.mark.parametrize("engine_process", [False, True])
def test_cpu_server_exports_graph_health(tiny_model, engine_process):
    """``/metrics``: every eager reason and replay kind has a sample (0 until it happens);
    decode forwards are eager for ``device_cpu`` and grow with requests; no capture at all,
    none after warm-up. ``/get_server_info``: the captured sizes (none) and the counts. The
    engine process's counters cross the pipe the same way."""
    make = process_server if engine_process else real_server
    body = {"messages": [{"role": "user", "content": "graph health"}], "n": 4}
    with make(tiny_model, warmup=True) as srv:
        m0 = srv.metrics()
        for reason in REASONS["decode"]:
            assert f'{EAGER}{{phase="decode",reason="{reason}"}}' in m0
        assert _sum(m0, REPLAYS) == 0 and _sum(m0, LATE) == 0
        assert not [k for k in m0 if k.startswith("flashrec_graph_captures_total{")]
        warm = _eager(m0, "decode", DEVICE_CPU)
        assert warm >= 2  # the warm-up's requests
        for _ in range(3):
            assert srv.post("/v1/chat/completions", body).status_code == 200
        m1 = srv.metrics()
        assert _eager(m1, "decode", DEVICE_CPU) >= warm + 3 * 2
        assert _eager(m1, "prefill", DEVICE_CPU) >= _eager(m0, "prefill", DEVICE_CPU) + 1
        assert _sum(m1, EAGER, 'phase="decode"') == _eager(m1, "decode", DEVICE_CPU)
        assert m1["flashrec_decode_eager_forwards_total"] == _eager(m1, "decode", DEVICE_CPU)
        assert _sum(m1, REPLAYS) == 0 and _sum(m1, LATE) == 0
        graphs = srv.get("/get_server_info").json()["graphs"]
        kinds = {"decode", "step", "prefill", "piecewise"}
        assert set(graphs["captured_sizes"]) == kinds
        assert all(v == [] for v in graphs["captured_sizes"].values())
        assert graphs["warm"] and graphs["captures"] == 0 and graphs["captures_after_warmup"] == 0
        assert graphs["eager_forwards"]["decode"][DEVICE_CPU] >= warm + 6


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_server_replays_and_captures_nothing_after_warm_up(tiny_model):
    """On CUDA: decode forwards replay (no eager one for requests of --beam-width), the
    captured decode sizes are reported, and nothing is captured after the warm-up."""
    body = {"messages": [{"role": "user", "content": "graph health gpu"}], "n": 4}
    with real_server(tiny_model, device="cuda", warmup=True) as srv:
        for _ in range(3):
            assert srv.post("/v1/chat/completions", body).status_code == 200
        m = srv.metrics()
        assert _sum(m, REPLAYS, 'phase="decode"') > 0
        assert _sum(m, EAGER, 'phase="decode"') == 0
        assert _sum(m, LATE) == 0
        assert _sum(m, "flashrec_graph_captures_total", 'kind="decode"') > 0
        graphs = srv.get("/get_server_info").json()["graphs"]
        assert graphs["captured_sizes"]["decode"] and graphs["captures_after_warmup"] == 0


def test_a_decode_graph_size_under_one_is_refused_at_start():
    """``--cuda-graph-max-bs 0`` would leave no decode graph size to capture (an IndexError at
    start on a GPU); refused when the config is built, naming the flag that disables graphs."""
    from flashrec.config import EngineConfig

    for bad in (0, -8):
        with pytest.raises(ValueError, match=r"--cuda-graph-max-bs must be >= 1.*--disable-cuda"):
            EngineConfig(model_path="x", cuda_graph_max_bs=bad)
    assert EngineConfig(model_path="x", cuda_graph_max_bs=1).cuda_graph_max_bs == 1
