"""harness.load.workload and harness.spec.model: prompts, ground truth, rendering, model cache."""

from __future__ import annotations

import json

import pytest

from harness.load.workload import PromptRenderer, build_prompts, builtin_template
from harness.spec.cells import expand_cells
from harness.spec.matrix import WorkloadSpec, parse_spec


def client(**wl):
    spec, _ = parse_spec(
        json.dumps({"engine": {"kind": "external", "url": "http://x"}, "workload": wl})
    )
    return spec.workload, expand_cells(spec)[0].client


def test_lorem_is_deterministic_and_measured_first():
    wl, c = client(kind="lorem", requests=5, warmup_requests=2, median_tokens=40)
    a = build_prompts(wl, c, 3)
    b = build_prompts(wl, c, 3)
    assert [p.messages for p in a.measured] == [p.messages for p in b.measured]
    assert len(a.measured) == 5 and len(a.warmup) == 2
    assert a.measured[0].messages[0]["role"] == "system"
    wl2, c2 = client(kind="lorem", requests=5, warmup_requests=6, median_tokens=40)
    assert [p.messages for p in build_prompts(wl2, c2, 3).measured] == [
        p.messages for p in a.measured
    ]


def test_synthetic_uses_flashrec_synth():
    pytest.importorskip("flashrec.synth")
    wl, c = client(
        kind="synthetic", requests=3, warmup_requests=1, median_tokens=50, system_prompt_tokens=16
    )
    ps = build_prompts(wl, c, 3)
    assert len(ps.measured) == 3 and ps.measured[0].messages[0]["role"] == "system"
    assert ps.measured[0].messages[0] == ps.warmup[0].messages[0]  # shared system prompt


def test_jsonl_with_ground_truth(tmp_path):
    path = tmp_path / "w.jsonl"
    lines = [
        [{"role": "user", "content": "a"}],
        {
            "messages": [{"role": "user", "content": "b"}],
            "ground_truth": "<|sid_begin|><s_a_1><s_b_2><s_c_3><|sid_end|>",
        },
        {
            "messages": [
                {"role": "user", "content": "c"},
                {"role": "assistant", "content": "<s_a_4><s_b_5><s_c_6>"},
            ]
        },
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    wl, c = client(kind="jsonl", path=str(path), requests=3, warmup_requests=0, shuffle=False)
    ps = build_prompts(wl, c, 3)
    assert [p.truth for p in ps.measured] == [None, ((1, 2, 3),), ((4, 5, 6),)]
    assert ps.measured[2].messages == [{"role": "user", "content": "c"}]
    assert ps.has_truth
    path.write_text("not json\n")
    from harness.load.workload import _dataset

    _dataset.cache_clear()
    with pytest.raises(ValueError, match="w.jsonl:1"):
        build_prompts(wl, c, 3)


def test_recif_parquet(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    df = pd.DataFrame(
        {
            "messages": [
                json.dumps(
                    [
                        {
                            "role": "user",
                            "content": [
                                {"type": "text", "text": "hello "},
                                {"type": "text", "text": "world"},
                            ],
                        }
                    ]
                )
            ]
            * 2,
            "metadata": [json.dumps({"answer": "<s_a_7><s_b_8><s_c_9>"})] * 2,
        }
    )
    (tmp_path / "video").mkdir()
    df.to_parquet(tmp_path / "video" / "video_test.parquet")
    wl = WorkloadSpec(kind="recif", path=str(tmp_path), requests=3, warmup_requests=1)
    _, c = client(kind="lorem", requests=3, warmup_requests=1)
    ps = build_prompts(wl, c, 3)
    assert ps.measured[0].messages == [{"role": "user", "content": "hello world"}]
    assert ps.measured[0].truth == ((7, 8, 9),)
    assert len(ps.measured) == 3 and len(ps.warmup) == 1  # cycled


def test_renderer_matches_the_model_template(tmp_path, monkeypatch):
    pytest.importorskip("flashrec.synth")
    pytest.importorskip("transformers")
    from harness.load.workload import load_tokenizer
    from harness.spec.model import resolve_model

    monkeypatch.setenv("FLASHREC_CACHE", str(tmp_path / "cache"))
    spec, _ = parse_spec(
        json.dumps(
            {
                "engine": {"kind": "external", "url": "http://x"},
                "model": {"preset": "tiny", "seed": 0, "dtype": "float32", "catalog_size": 50},
            }
        )
    )
    m = resolve_model(spec)
    assert m.source == "preset" and m.catalog.endswith("catalog.json") and m.levels == 3
    info = tmp_path / "cache" / "models" / m.hash / "synth_info.json"
    stamp = info.stat().st_mtime_ns
    assert resolve_model(spec).path == m.path and info.stat().st_mtime_ns == stamp  # cached
    # the catalog's own hash (compare flags two runs on different catalogs)
    import hashlib

    digest = hashlib.sha256(open(m.catalog, "rb").read()).hexdigest()[:20]
    assert m.catalog_hash == digest
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    text = PromptRenderer(load_tokenizer(m.path)).render(msgs)
    assert text == builtin_template(msgs) + "<|sid_begin|>"
